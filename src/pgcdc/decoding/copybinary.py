"""COPY ... TO STDOUT (FORMAT binary) output as pgoutput's binary rows, and which column types
can travel that way.

A COPY binary tuple is an int16 field count, then per field an int32 length (-1 for NULL) and
the type's send-function bytes: the bytes pgoutput's binary mode sends for the same value. Its
TupleData form differs only by a kind byte before each field ('b' before the length, 'n'
instead of a -1 length), so a tuple becomes an ``EncodedRow``'s bytes by splicing, with no value
decoded: the change log stores it as it stores a streamed binary row, and readers decode both
alike. The server sends each tuple in a CopyData message of its own; ``CopyBinaryReader.
read_messages`` splices many such messages at once with numpy (one pass per column over every
row), since a Python loop over each field of each row costs more than the text format's split.

Where the rows are typed at once (the executors' snapshot), they need not be spliced at all:
``frame_copy`` frames a whole stream's tuples where COPY sent them, as
``pgcdc.decoding.columnar.frame_tuples`` frames the TupleData the reader makes of them (same
kinds, lengths and value bytes), and ``pgcdc.decoding.arrow.framed_to_arrow`` types that.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from pgcdc.decoding.columnar import ColumnView, Framing, WireBuffer
from pgcdc.decoding.values import ResolvedType, TypeRegistry
from pgcdc.errors import DecodeError

__all__ = [
    "COPY_BINARY_SIGNATURE",
    "Buffer",
    "CopyBinaryReader",
    "binary_decodable",
    "frame_copy",
    "splice_tuples",
]

COPY_BINARY_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_HEADER_BYTES = len(COPY_BINARY_SIGNATURE) + 8  # then the flags and the extension length
_OIDS_FLAG = 1 << 16
_CRITICAL_FLAGS = 0xFFFF0000  # bits 16-31: a reader must refuse what it does not know
_INT16 = struct.Struct("!h").unpack_from
_INT32 = struct.Struct("!i").unpack_from
_TWO_INT32 = struct.Struct("!ii").unpack_from
_NULL_KIND = b"n"
_BINARY_KIND = b"b"
_TRAILER = b"\xff\xff"
_KIND_NULL = ord(_NULL_KIND)
_KIND_BINARY = ord(_BINARY_KIND)
_BIG_ENDIAN_INT32 = np.array([1 << 24, 1 << 16, 1 << 8, 1], dtype=np.int64)
Buffer = bytes | bytearray | memoryview


def splice_tuples(
    data: bytes, ends: Sequence[int] | npt.NDArray[np.int64], width: int
) -> list[bytes] | None:
    """The TupleData of each tuple of ``data``, tuple i ending at ``ends[i]`` (the CopyData
    message boundaries); None when the messages are not one whole tuple of ``width`` fields
    each, for the general reader to take them (and name what is wrong)."""
    count = len(ends)
    if count == 0:
        return []
    buffer = np.frombuffer(data, dtype=np.uint8)
    row_ends = np.asarray(ends, dtype=np.int64)
    row_starts = np.empty_like(row_ends)
    row_starts[0] = 0
    row_starts[1:] = row_ends[:-1]
    if int(row_ends[-1]) != len(data) or bool((row_ends - row_starts < 2).any()):
        return None
    field_counts = buffer[row_starts].astype(np.int64) << 8 | buffer[row_starts + 1]
    if bool((field_counts != width).any()):
        return None
    # Each column's field offsets and lengths over every row, column by column.
    offsets = np.empty((count, width), dtype=np.int64)
    lengths = np.empty((count, width), dtype=np.int64)
    position = row_starts + 2
    four = np.arange(4, dtype=np.int64)
    for column in range(width):
        if bool((position + 4 > row_ends).any()):
            return None
        raw = buffer[position[:, None] + four].astype(np.int64) @ _BIG_ENDIAN_INT32
        length = np.where(raw >= 1 << 31, raw - (1 << 32), raw)  # int32, signed
        if bool((length < -1).any()):
            return None
        offsets[:, column] = position
        lengths[:, column] = length
        position = position + 4 + np.maximum(length, 0)
    if bool((position != row_ends).any()):
        return None
    # TupleData: a kind byte before each field ('b' before its length, 'n' instead of a -1
    # length). Each byte moves right by the kinds inserted up to it and left by the NULL
    # lengths dropped before it; the dropped bytes go to a spare last byte, cut off after.
    size = len(buffer)
    field_offsets = offsets.ravel()
    nulls = lengths.ravel() == -1
    null_offsets = field_offsets[nulls]
    spliced_size = size + len(field_offsets) - 4 * len(null_offsets)
    steps = np.ones(size + 1, dtype=np.int32)
    steps[field_offsets] += 1
    steps[null_offsets + 4] -= 4
    targets = np.cumsum(steps[:size], dtype=np.int32)
    targets -= 1
    kind_targets = targets[field_offsets] - 1
    row_targets = targets[row_starts].tolist()
    if len(null_offsets):
        targets[(null_offsets[:, None] + four).ravel()] = spliced_size
    spliced = np.empty(spliced_size + 1, dtype=np.uint8)
    spliced[targets] = buffer
    spliced[kind_targets] = np.where(nulls, ord(_NULL_KIND), ord(_BINARY_KIND))
    out = spliced[:spliced_size].tobytes()
    bounds = [*row_targets, spliced_size]
    return [out[a:b] for a, b in itertools.pairwise(bounds)]


def frame_copy(data: bytes, ends: Sequence[int], width: int) -> Framing | None:
    """The tuples of a whole binary COPY stream as the server sends it (the header with the
    first tuple, one tuple per message, the trailer alone; message i ending at ``ends[i]``),
    framed as ``columnar.frame_tuples`` frames the TupleData ``CopyBinaryReader`` makes of
    them: per column the same kinds ('b', or 'n' for NULL), lengths and value bytes, read where
    COPY sent them. None for anything else (no tuple, another layout, a malformed stream):
    the reader then takes the stream, and says what is wrong."""
    count = len(ends) - 1  # the last message is the trailer
    signature = len(COPY_BINARY_SIGNATURE)
    if count < 1 or ends[-1] != len(data) or data[ends[-2] : ends[-1]] != _TRAILER:
        return None
    if len(data) < _HEADER_BYTES or not data.startswith(COPY_BINARY_SIGNATURE):
        return None
    flags, extension = _TWO_INT32(data, signature)
    first = _HEADER_BYTES + extension
    if flags & _CRITICAL_FLAGS or extension < 0 or first >= ends[0]:
        return None
    limits = np.asarray(ends[:-1], dtype=np.int64)
    starts = np.empty_like(limits)
    starts[0] = first
    starts[1:] = limits[:-1]
    buffer = WireBuffer(data)
    if bool((starts + 2 > limits).any()) or bool((buffer.view(">i2")[starts] != width).any()):
        return None
    int32 = buffer.view(">i4")
    position = starts + 2
    columns = []
    for _ in range(width):
        if bool((position + 4 > limits).any()):
            return None
        lengths = int32[position].astype(np.int64)
        value_starts = position + 4
        nulls = lengths == -1
        if bool(nulls.any()):
            if bool((lengths < -1).any()):
                return None
            kinds = np.where(nulls, _KIND_NULL, _KIND_BINARY).astype(np.uint8)
            lengths[nulls] = 0
        else:
            if bool((lengths < 0).any()):
                return None
            kinds = np.full(count, _KIND_BINARY, dtype=np.uint8)
        position = value_starts + lengths
        if bool((position > limits).any()):
            return None
        columns.append(ColumnView(buffer, kinds, value_starts, lengths))
    if not np.array_equal(position, limits):
        return None
    return Framing(tuple(columns), position)


class CopyBinaryReader:
    """Turns the CopyData chunks of one binary COPY into the TupleData (``EncodedRow`` bytes)
    of its tuples of ``width`` columns.

    Chunks may split tuples anywhere (the server sends one per tuple, but nothing here relies
    on it): an incomplete tuple waits for the next chunk. ``finish`` checks the stream ended
    with its trailer.
    """

    def __init__(self, width: int) -> None:
        if not 0 <= width <= 0x7FFF:
            raise DecodeError(f"a COPY binary tuple cannot have {width} fields")
        self.width = width
        self._pending = b""
        self._header_read = False
        self._ended = False

    def feed(self, chunk: Buffer) -> list[bytes]:
        """The whole tuples completed by ``chunk``."""
        data = self._pending + chunk if self._pending else bytes(chunk)
        pos = 0
        if not self._header_read:
            pos = self._header(data)
            if pos < 0:
                self._pending = data
                return []
        rows: list[bytes] = []
        append = rows.append
        width = self.width
        size = len(data)
        int16, int32 = _INT16, _INT32
        null, binary = _NULL_KIND, _BINARY_KIND
        while pos < size:
            if self._ended:
                raise DecodeError(f"{size - pos} bytes after the COPY binary trailer")
            if pos + 2 > size:
                break
            (count,) = int16(data, pos)
            if count != width:
                if count == -1:
                    self._ended = True
                    pos += 2
                    continue
                raise DecodeError(
                    f"COPY binary tuple has {count} fields, expected {width} (the table's "
                    "published columns)"
                )
            parts = [data[pos : pos + 2]]
            field = pos + 2
            for _ in range(width):
                if field + 4 > size:
                    break
                (length,) = int32(data, field)
                if length == -1:
                    parts.append(null)
                    field += 4
                    continue
                if length < 0:
                    raise DecodeError(f"COPY binary field has length {length}")
                end = field + 4 + length
                if end > size:
                    break
                parts.append(binary)
                parts.append(data[field:end])
                field = end
            else:
                append(b"".join(parts))
                pos = field
                continue
            break  # the tuple goes on in the next chunk
        self._pending = data[pos:]
        return rows

    def read_messages(self, messages: Sequence[Buffer]) -> list[bytes]:
        """The tuples of consecutive CopyData ``messages``: the same rows ``feed`` gives for
        each in turn, at numpy's pace when each message holds one whole tuple."""
        ends = list(itertools.accumulate(len(m) for m in messages))
        return self.read_joined(b"".join(messages), ends)

    def read_joined(self, data: bytes, ends: Sequence[int]) -> list[bytes]:
        """``read_messages`` of messages already joined into ``data``, message i ending at
        ``ends[i]``: a copy loop appends each to one buffer rather than keep them apart."""
        rows: list[bytes] = []
        start = index = 0
        while index < len(ends) and (not self._header_read or self._pending):
            rows.extend(self.feed(data[start : ends[index]]))
            start = ends[index]
            index += 1
        body_ends = np.asarray(ends[index:], dtype=np.int64) - start
        trailer_start = None
        if len(body_ends):
            last_start = start + (int(body_ends[-2]) if len(body_ends) > 1 else 0)
            if data[last_start : start + int(body_ends[-1])] == _TRAILER:
                trailer_start = last_start
                body_ends = body_ends[:-1]
        if len(body_ends):
            body = data[start : start + int(body_ends[-1])]
            spliced = None if self._ended else splice_tuples(body, body_ends, self.width)
            rows.extend(self.feed(body) if spliced is None else spliced)
        if trailer_start is not None:
            rows.extend(self.feed(data[trailer_start : trailer_start + 2]))
        return rows

    def _header(self, data: bytes) -> int:
        """Where the first tuple starts, or -1 while the header is incomplete."""
        if len(data) < _HEADER_BYTES:
            if not COPY_BINARY_SIGNATURE.startswith(data[: len(COPY_BINARY_SIGNATURE)]):
                raise DecodeError(f"not a COPY binary stream: it starts with {data[:11]!r}")
            return -1
        if not data.startswith(COPY_BINARY_SIGNATURE):
            raise DecodeError(f"not a COPY binary stream: it starts with {data[:11]!r}")
        flags, extension = _TWO_INT32(data, len(COPY_BINARY_SIGNATURE))
        if flags & _CRITICAL_FLAGS:
            what = "carries OIDs" if flags & _OIDS_FLAG else f"has unknown flags {flags:#x}"
            raise DecodeError(f"the COPY binary stream {what}; pgcdc reads only plain tuples")
        if extension < 0:
            raise DecodeError(f"COPY binary header extension of length {extension}")
        start = _HEADER_BYTES + int(extension)
        if len(data) < start:
            return -1
        self._header_read = True
        return start

    def finish(self) -> None:
        """Raise unless the stream was whole: header, complete tuples, trailer."""
        if not self._header_read:
            raise DecodeError("the COPY binary stream ended inside its header")
        if self._pending:
            raise DecodeError(
                f"the COPY binary stream ended inside a tuple ({len(self._pending)} bytes left)"
            )
        if not self._ended:
            raise DecodeError("the COPY binary stream ended without its trailer")


def binary_decodable(
    registry: TypeRegistry,
    type_oids: Iterable[int],
    composite_fields: Mapping[int, Iterable[int]],
    *,
    prints_as_text: bool = True,
    money: bool = True,
) -> bool:
    """Whether every type of ``type_oids`` has a binary decoder giving what its text gives.

    Types the registry does not know (extensions, or built-ins it has no codec for) have none.
    A composite needs all of its fields (``composite_fields``: composite OID -> field type
    OIDs) decodable. Composites, ranges and multiranges are decoded to their output function's
    text, which matches the server's only under pgcdc's session settings: ``prints_as_text``
    False rules them out. ``money`` False rules out money, whose binary form is a count of
    units the registry scales and prints as under lc_monetary C.
    """
    seen: set[int] = set()

    def decodable(resolved: ResolvedType) -> bool:
        name = resolved.name
        if name == "unknown":
            return False
        if name == "money" and not money:
            return False
        if name in ("array", "vector", "range", "multirange"):
            if name in ("range", "multirange") and not prints_as_text:
                return False
            return resolved.element is not None and decodable(resolved.element)
        if name == "composite":
            if not prints_as_text or resolved.oid not in composite_fields:
                return False
            if resolved.oid in seen:
                return True
            seen.add(resolved.oid)
            return all(decodable(registry.resolve(f)) for f in composite_fields[resolved.oid])
        return True

    return all(decodable(registry.resolve(oid)) for oid in type_oids)
