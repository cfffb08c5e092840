"""pgoutput's TupleData, the one form a row takes on the wire and in the change log.

Layout (PostgreSQL's ``proto.c``, ``logicalrep_write_tuple``): an unsigned 16-bit column
count, then per column a kind byte: ``n`` (NULL), ``u`` (unchanged TOAST, value not sent),
``t`` (text format) or ``b`` (binary format), the last two followed by an unsigned 32-bit
length and that many bytes.

``read_tuple_reference`` defines what a valid TupleData is and says, with the one set of
``DecodeError`` messages, what is wrong with one that is not. Every other reader (the fast
``read_tuple`` and ``tuple_end`` here, the decoder's lazy rows, ``columnar.frame_tuples`` for
many rows at once) is an implementation of it: it gives the same values, and on anything it
does not take in its stride it asks the reference, which raises the error. One equivalence
test (``tests/decoding/test_tupledata_equivalence.py``) holds them all to it.

This module sits below ``pgcdc.events`` (whose ``EncodedRow`` keeps rows in this form) and
imports nothing else of pgcdc but its errors.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Sequence
from typing import Any, Literal, TypeAlias

from pgcdc.errors import DecodeError, InvalidRowValue

__all__ = [
    "KIND_BINARY",
    "KIND_NULL",
    "KIND_TEXT",
    "KIND_UNCHANGED",
    "UNCHANGED_TOAST",
    "RawValue",
    "TextErrors",
    "Unchanged",
    "decode_tuple_data",
    "encode_tuple_data",
    "read_tuple",
    "read_tuple_reference",
    "trailing_bytes_error",
    "tuple_end",
]


class Unchanged(enum.Enum):
    """Marks a TOASTed column the server left out because the UPDATE did not change it."""

    TOAST = "unchanged-toast"

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = Unchanged.TOAST

RawValue: TypeAlias = str | bytes | Unchanged | None

KIND_NULL, KIND_UNCHANGED, KIND_TEXT, KIND_BINARY = (ord(kind) for kind in "nutb")

TextErrors = Literal["strict", "surrogatepass"]
"""How text values are decoded from UTF-8. ``"strict"`` for what a server sent (a UTF8
server never sends an encoded surrogate); ``"surrogatepass"`` for rows pgcdc encoded itself
(``encode_tuple_data`` keeps lone surrogates of a Python ``str``, so such rows round-trip)."""

_U16 = struct.Struct("!H")
_COUNT = _U16.unpack_from
_U32 = struct.Struct("!I")
_KIND_LENGTH = struct.Struct("!BI").unpack_from  # a column's kind and (for t/b) length at once
# Appended before a fast read so a NULL or unchanged last column reads as kind and length like
# the others; no value reaches into it (checked once, at the end).
_PAD = b"\0\0\0\0"


# --- the reference -----------------------------------------------------------------------------


def read_tuple_reference(
    buf: bytes, pos: int = 0, text: TextErrors = "strict"
) -> tuple[tuple[RawValue, ...], int]:
    """The TupleData at ``pos`` in ``buf``: its values and the position after it.

    The reference: one field at a time, every bound checked, each failure a ``DecodeError``
    that names the column. Bytes after the TupleData are the caller's (see
    ``trailing_bytes_error``)."""
    size = len(buf)
    if pos + 2 > size:
        raise DecodeError(f"TupleData of {max(size - pos, 0)} bytes has no column count")
    (natts,) = _COUNT(buf, pos)
    pos += 2
    values: list[RawValue] = []
    for number in range(1, natts + 1):
        if pos >= size:
            raise DecodeError(f"TupleData ends before column {number} of {natts}")
        kind = buf[pos]
        pos += 1
        if kind == KIND_NULL:
            values.append(None)
        elif kind == KIND_UNCHANGED:
            values.append(UNCHANGED_TOAST)
        elif kind in (KIND_TEXT, KIND_BINARY):
            if pos + 4 > size:
                raise DecodeError(f"TupleData ends inside the length of column {number} of {natts}")
            (length,) = _U32.unpack_from(buf, pos)
            pos += 4
            end = pos + length
            if end > size:
                raise DecodeError(
                    f"the value of column {number} of {natts} ({length} bytes) runs past the "
                    f"end of the data ({size - pos} bytes left)"
                )
            if kind == KIND_BINARY:
                values.append(buf[pos:end])
            else:
                try:
                    values.append(buf[pos:end].decode("utf-8", text))
                except UnicodeDecodeError as exc:
                    raise DecodeError(
                        f"the text value of column {number} of {natts} is not UTF-8: {exc}"
                    ) from None
            pos = end
        else:
            raise DecodeError(
                f"unknown column kind {chr(kind)!r} (0x{kind:02x}) in column {number} of "
                f"{natts} (expected n, u, t or b)"
            )
    return tuple(values), pos


def trailing_bytes_error(count: int) -> DecodeError:
    """What is wrong with ``count`` bytes after the last thing a message or row should hold."""
    return DecodeError(f"{count} unexpected trailing bytes")


# --- implementations ---------------------------------------------------------------------------


def read_tuple(
    buf: bytes, pos: int = 0, text: TextErrors = "strict", kind_length: Any = _KIND_LENGTH
) -> tuple[tuple[RawValue, ...], int]:
    """``read_tuple_reference``, fast: the hot loop of decoding rows to values.

    One ``struct`` call per column reads kind and length together (on a padded copy); text
    values are slices of one latin-1 decode of ``buf`` (one object per value), and only values
    that are not ASCII are decoded again as UTF-8, where latin-1 would differ. Anything
    unusual (unknown kind, a value past the end, bad UTF-8) goes to the reference, which says
    what is wrong."""
    try:
        (natts,) = _COUNT(buf, pos)
    except struct.error:
        return read_tuple_reference(buf, pos, text)
    start = pos
    pos += 2
    size = len(buf)
    padded = buf + _PAD
    latin1 = str(padded, "latin-1")
    ascii = latin1.isascii()
    values: list[RawValue] = [None] * natts
    try:
        for index in range(natts):
            kind, length = kind_length(padded, pos)
            if kind == KIND_TEXT:
                first = pos + 5
                pos = first + length
                value = latin1[first:pos]
                if not (ascii or value.isascii()):
                    value = padded[first:pos].decode("utf-8", text)
                values[index] = value
            elif kind == KIND_NULL:
                pos += 1
            elif kind == KIND_UNCHANGED:
                values[index] = UNCHANGED_TOAST
                pos += 1
            elif kind == KIND_BINARY:
                first = pos + 5
                pos = first + length
                values[index] = padded[first:pos]
            else:
                return read_tuple_reference(buf, start, text)
    except (struct.error, UnicodeDecodeError):  # a length past the pad, or bad UTF-8
        return read_tuple_reference(buf, start, text)
    if pos > size:
        return read_tuple_reference(buf, start, text)
    return tuple(values), pos


def tuple_end(buf: bytes, pos: int = 0, kind_length: Any = _KIND_LENGTH) -> int:
    """Where the TupleData at ``pos`` ends, as ``read_tuple_reference`` finds it, walking only
    the framing: text is not looked at, so a caller that keeps the bytes checks it (all ASCII,
    or ``read_tuple``). Malformed framing goes to the reference, which says what is wrong."""
    start = pos
    padded = buf + _PAD
    try:
        (natts,) = _COUNT(buf, pos)
        pos += 2
        for _ in range(natts):
            kind, length = kind_length(padded, pos)
            if kind == KIND_TEXT:
                pos += 5 + length
            elif kind == KIND_NULL:
                pos += 1
            elif kind == KIND_BINARY:
                pos += 5 + length
            elif kind == KIND_UNCHANGED:
                pos += 1
            else:
                return read_tuple_reference(buf, start)[1]
    except struct.error:
        return read_tuple_reference(buf, start)[1]
    if pos > len(buf):
        return read_tuple_reference(buf, start)[1]
    return pos


def decode_tuple_data(data: bytes, text: TextErrors = "surrogatepass") -> tuple[RawValue, ...]:
    """The values of ``data``, which must be one whole TupleData (what ``EncodedRow`` holds):
    ``read_tuple``, then nothing after it."""
    values, end = read_tuple(data, 0, text)
    if end != len(data):
        raise trailing_bytes_error(len(data) - end)
    return values


# --- the encoder -------------------------------------------------------------------------------


def encode_tuple_data(row: Sequence[RawValue]) -> bytes:
    """``row`` in TupleData wire form: ``str`` as 't' (UTF-8, ``surrogatepass``), ``bytes`` as
    'b', ``None`` as 'n', ``UNCHANGED_TOAST`` as 'u'. What ``decode_tuple_data`` reads back."""
    if len(row) > 0xFFFF:
        raise InvalidRowValue(f"a row of {len(row)} columns does not fit TupleData (at most 65535)")
    parts = [_U16.pack(len(row))]
    append = parts.append
    length = _U32.pack
    for value in row:
        if type(value) is str:
            data = value.encode("utf-8", "surrogatepass")
            append(b"t" + length(len(data)))
            append(data)
        elif value is None:
            append(b"n")
        elif type(value) is bytes:
            append(b"b" + length(len(value)))
            append(value)
        elif value is UNCHANGED_TOAST:
            append(b"u")
        elif isinstance(value, str | bytes):  # subclasses: store the plain value
            plain = str(value) if isinstance(value, str) else bytes(value)
            append(encode_tuple_data((plain,))[2:])
        else:
            raise InvalidRowValue(
                f"row value {value!r} of type {type(value).__name__} cannot be encoded: rows "
                "hold str, bytes, None or UNCHANGED_TOAST as the server sent them"
            )
    return b"".join(parts)
