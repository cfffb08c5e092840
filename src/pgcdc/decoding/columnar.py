"""Many pgoutput TupleData at once: framing walked column by column with numpy, values built
as Arrow arrays without a Python object per value.

Per-row Python cannot decode as fast as a walsender streams; this module moves the per-row,
per-column work into numpy and Arrow compute. ``frame_tuples`` walks the framing of many
TupleData in one buffer (for column k of every row at once: kind byte, big-endian length,
next position), giving per column the kind, start and length of each value. ``fast_column``
turns one column into its typed Arrow array (text format through Arrow casts, binary format
through numpy views), marking the values it leaves to the per-value codecs (infinities, NaN,
BC dates, anything unusual) so the caller converts just those the careful way.

Nothing here decides alone. ``frame_tuples`` and ``frame_rows`` implement
``pgcdc.tupledata.read_tuple_reference`` for many rows: they accept exactly the rows it reads
(``frame_rows`` with text checked as strict UTF-8) and refuse the rest by returning None, so the
caller reads those rows one by one, and the reference says what is wrong. Whatever does not match
what the per-value codecs would produce exactly is either marked for them or makes
``fast_column`` return None (the whole column goes per value).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.decoding.textforms import GEOMETRIC
from pgcdc.errors import DecodeError
from pgcdc.tupledata import (
    KIND_BINARY,
    KIND_NULL,
    KIND_TEXT,
    KIND_UNCHANGED,
    UNCHANGED_TOAST,
    RawValue,
    TextErrors,
    decode_tuple_data,
)

__all__ = [
    "ColumnView",
    "Framing",
    "WireBuffer",
    "fast_column",
    "fast_kind",
    "first_unreadable_row",
    "frame_rows",
    "frame_tuples",
    "text_columns",
    "text_strings",
]

Int64s = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]

_PAD = b"\0" * 16
# Arrow's string/binary arrays have int32 offsets; bigger columns go per value.
_MAX_COLUMN_BYTES = 2**31 - 1


class WireBuffer:
    """One bytes object holding many TupleData, padded so every fixed-width read at a valid
    position stays inside it, with big-endian views at every byte offset."""

    __slots__ = ("_views", "buffer", "data", "size", "u8")

    def __init__(self, data: bytes) -> None:
        self._hold(data + _PAD, len(data))

    @classmethod
    def joined(cls, parts: Iterable[bytes | pa.Buffer]) -> WireBuffer:
        """The ``parts`` (bytes, or Arrow buffers) one after the other: copied once, with the
        padding, where ``WireBuffer(b"".join(parts))`` copies every byte twice."""
        buffer = cls.__new__(cls)
        padded = b"".join([*parts, _PAD])
        buffer._hold(padded, len(padded) - len(_PAD))
        return buffer

    def _hold(self, padded: bytes, size: int) -> None:
        self.size = size
        self.data = padded
        self.u8: npt.NDArray[np.uint8] = np.frombuffer(self.data, np.uint8)
        self.buffer = pa.py_buffer(self.data)
        self._views: dict[str, np.ndarray] = {}

    def view(self, dtype: str) -> np.ndarray:
        """The buffer read as ``dtype`` (e.g. ``>u4``) starting at every byte: ``view[i]`` is
        the value whose first byte is at ``i`` (an unaligned, strided view; no copy)."""
        found = self._views.get(dtype)
        if found is None:
            itemsize = np.dtype(dtype).itemsize
            found = np.ndarray((len(self.data) - itemsize + 1,), dtype, self.data, 0, (1,))
            self._views[dtype] = found
        return found

    def slices(self, starts: Int64s, lengths: Int64s, present: Bools) -> pa.Array | None:
        """The ``present`` values (``lengths`` bytes from ``starts``) as an Arrow binary array.

        The buffer is wrapped (no copy) as a large_binary array whose even elements are the
        values and odd ones the bytes between them, and Arrow's ``take`` copies the even ones
        out: one memcpy per value. The values must lie in buffer order, as column k of
        consecutive TupleData (or messages) does."""
        count = len(present)
        every = bool(present.all())
        if every:
            first, last = starts, starts + lengths
        else:  # an absent value is an empty one where the value before it ended
            ends = np.where(present, starts + lengths, 0)
            before = np.zeros(count, np.int64)
            if count > 1:
                np.maximum.accumulate(ends[:-1], out=before[1:])
            first = np.where(present, starts, before)
            last = np.where(present, ends, before)
        if int(np.sum(last - first)) > _MAX_COLUMN_BYTES:
            return None
        offsets = np.empty(2 * count + 1, np.int64)
        offsets[0 : 2 * count : 2] = first
        offsets[1 : 2 * count : 2] = last
        offsets[2 * count] = last[-1] if count else 0
        small = len(self.data) <= _MAX_COLUMN_BYTES  # int32 offsets reach every byte
        whole = pa.Array.from_buffers(
            pa.binary() if small else pa.large_binary(),
            2 * count,
            [None, pa.py_buffer(offsets.astype(np.int32) if small else offsets), self.buffer],
        )
        mask = None if every else ~present
        picked = whole.take(pa.array(np.arange(0, 2 * count, 2, dtype=np.int64), mask=mask))
        return picked if small else picked.cast(pa.binary())


class ColumnView:
    """One column of many rows: each value's kind, first byte and length in ``buffer``.

    ``present`` (rows with a text or binary value, not NULL or unchanged TOAST), ``unchanged``
    and ``format`` are computed once, on first use."""

    __slots__ = ("_format", "_present", "buffer", "kinds", "lengths", "starts")

    def __init__(
        self, buffer: WireBuffer, kinds: npt.NDArray[np.uint8], starts: Int64s, lengths: Int64s
    ) -> None:
        self.buffer = buffer
        self.kinds = kinds
        self.starts = starts
        self.lengths = lengths
        self._present: Bools | None = None
        self._format: str | None = "?"  # not known yet

    def __len__(self) -> int:
        return len(self.kinds)

    @property
    def present(self) -> Bools:
        present = self._present
        if present is None:
            present = self._present = (self.kinds == KIND_TEXT) | (self.kinds == KIND_BINARY)
        return present

    @property
    def unchanged(self) -> Bools:
        unchanged: Bools = self.kinds == KIND_UNCHANGED
        return unchanged

    def format(self) -> str | None:
        """'t' when every value is text, 'b' when every value is binary, None when there are
        no values, 'mixed' otherwise."""
        found = self._format
        if found == "?":
            text = bool((self.kinds == KIND_TEXT).any())
            binary = bool((self.kinds == KIND_BINARY).any())
            found = "mixed" if text and binary else "t" if text else "b" if binary else None
            self._format = found
        return found

    def binary_array(self, skip: int = 0) -> pa.Array | None:
        """The values (without their first ``skip`` bytes) as one Arrow binary array, null
        where there is none; None when a value is shorter than ``skip`` or the column does
        not fit one array."""
        present = self.present
        if skip and bool((self.lengths[present] < skip).any()):
            return None
        return self.buffer.slices(self.starts + skip, self.lengths - skip, present)

    def raw_values(self, rows: Int64s) -> list[RawValue]:
        """The raw values of ``rows`` as the per-value path takes them (``str`` decoded with
        ``surrogatepass`` as ``decode_tuple_data`` does, ``bytes``, None, UNCHANGED_TOAST)."""
        data = self.buffer.data
        out: list[RawValue] = []
        append = out.append
        for kind, start, length in zip(
            self.kinds[rows].tolist(),
            self.starts[rows].tolist(),
            self.lengths[rows].tolist(),
            strict=True,
        ):
            if kind == KIND_TEXT:
                append(data[start : start + length].decode("utf-8", "surrogatepass"))
            elif kind == KIND_BINARY:
                append(data[start : start + length])
            elif kind == KIND_UNCHANGED:
                append(UNCHANGED_TOAST)
            else:
                append(None)
        return out


def _binary_from(values: npt.NDArray[np.uint8], offsets: Int64s, present: Bools) -> pa.Array:
    count = len(present)
    validity = None
    nulls = count - int(np.count_nonzero(present))
    if nulls:
        validity = pa.py_buffer(np.packbits(present, bitorder="little"))
    return pa.Array.from_buffers(
        pa.binary(),
        count,
        [validity, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(values)],
        null_count=nulls,
    )


@dataclass(frozen=True, slots=True)
class Framing:
    """The columns of many TupleData, and where each TupleData ends."""

    columns: tuple[ColumnView, ...]
    ends: Int64s


def frame_tuples(buffer: WireBuffer, starts: Int64s, limits: Int64s, width: int) -> Framing | None:
    """Walks the TupleData starting at ``starts`` (each must end by its ``limits``), all rows
    at once, one column at a time: ``read_tuple_reference``'s framing, text not looked at
    (``text_columns`` checks it). None when any of them is malformed (a column count other
    than ``width``, an unknown kind, a value past its limit): the caller then reads them one by
    one, which says what is wrong."""
    u8 = buffer.u8
    u32 = buffer.view(">u4")
    if len(starts) and bool((starts + 2 > limits).any()):
        return None
    if bool((buffer.view(">u2")[starts] != width).any()):
        return None
    pos = starts + 2
    if width and bool((pos >= limits).any()):
        return None
    columns = []
    for index in range(width):
        kinds = u8[pos]
        has_value = (kinds == KIND_TEXT) | (kinds == KIND_BINARY)
        every = bool(has_value.all())
        if not every:
            known = has_value | (kinds == KIND_NULL) | (kinds == KIND_UNCHANGED)
            if not bool(known.all()):
                return None
        lengths = u32[pos + 1].astype(np.int64)
        value_starts = pos + 5
        if every:  # no NULL or unchanged value in this column: no masking
            pos = value_starts + lengths
        else:
            lengths = np.where(has_value, lengths, 0)
            pos = np.where(has_value, value_starts + lengths, pos + 1)
        # Another column's kind byte must follow inside the limit; the last may end there.
        beyond = pos > limits if index == width - 1 else pos >= limits
        if bool(beyond.any()):
            return None
        columns.append(ColumnView(buffer, kinds, value_starts, lengths))
    return Framing(tuple(columns), pos)


def frame_rows(
    buffer: WireBuffer, starts: Int64s, ends: Int64s, width: int
) -> tuple[Framing, list[pa.Array | None]] | None:
    """The rows of ``width`` columns that fill ``starts`` to ``ends`` exactly, framed, with
    their text columns as checked string arrays (``text_columns``); None when any row is one
    ``read_tuple_reference`` (strict UTF-8, nothing after the row) would refuse, or a column
    is too big for one Arrow array."""
    framing = frame_tuples(buffer, starts, ends, width)
    if framing is None or not np.array_equal(framing.ends, ends):
        return None
    strings = text_columns(framing)
    return None if strings is None else (framing, strings)


def first_unreadable_row(
    rows: pa.Array, text: TextErrors = "surrogatepass"
) -> tuple[int, str] | None:
    """The index of the first of ``rows`` (a binary array of TupleData, nulls skipped) that
    ``decode_tuple_data`` cannot read with ``text`` (``"strict"``: as a server sends it), and
    why; None when every row is readable.

    The change log writer's check before it persists rows the pgoutput decoder did not
    walk. All rows are checked at once with numpy (framing, nothing
    after the row, UTF-8 text), grouped by column count; only a group that fails is read row
    by row, to find the culprit and its reason."""
    count = len(rows)
    if rows.null_count == count:
        return None
    _, offset_buffer, data_buffer = rows.buffers()
    bounds = np.frombuffer(offset_buffer, np.int32, count + 1, rows.offset * 4).astype(np.int64)
    base = int(bounds[0])
    bounds -= base
    size = int(bounds[-1])
    buffer = WireBuffer.joined([data_buffer.slice(base, size)] if size else [])
    data = buffer.data
    valid = np.asarray(rows.is_valid(), dtype=bool)
    starts, limits = bounds[:-1], bounds[1:]
    sized = valid & (limits - starts >= 2)
    suspects = [np.flatnonzero(valid & ~sized)]
    widths = np.where(sized, buffer.view(">u2")[np.minimum(starts, size)], -1)
    # Text holding only ASCII bytes is UTF-8: only rows with a byte >= 0x80 inside a text
    # value (not in a length or a binary value) need their text checked.
    high = np.flatnonzero(buffer.u8[:size] >= 0x80)
    for width in np.unique(widths[sized]).tolist():
        group = np.flatnonzero(widths == width)
        framing = frame_tuples(buffer, starts[group], limits[group], width)
        if (
            framing is None
            or not np.array_equal(framing.ends, limits[group])
            or (_in_text(framing, high) and text_columns(framing) is None)
        ):
            suspects.append(group)  # Arrow's UTF-8 is stricter (no surrogates): ask per row
    for index in np.sort(np.concatenate(suspects)).tolist():
        try:
            decode_tuple_data(data[starts[index] : limits[index]], text)
        except DecodeError as exc:
            return index, str(exc)
    return None


# --- typed columns -----------------------------------------------------------------------------
#
# ``fast_column`` returns (array, leftover) where ``array`` has the column's Arrow type and
# ``leftover`` marks the rows (with a value) that the per-value path must convert instead (the
# array holds null there), or None when the whole column must go per value.

FastResult = tuple[pa.Array, Bools | None] | None

# Types whose text codec keeps the text as it is (types pgcdc has no codec for included).
_IDENTITY_TEXT = frozenset(
    {"text", "varchar", "bpchar", "name", "json", "jsonb", "xml", "enum", "bit", "varbit"}
    | {"composite", "range", "multirange", "unknown"}
    | GEOMETRIC.keys()
)
_CAST_TEXT = frozenset({"int2", "int4", "int8", "oid", "xid", "cid", "float8", "numeric"})
_TEMPORAL_TEXT = frozenset({"date", "timestamp", "timestamptz"})
_BINARY_STRINGS = frozenset({"text", "varchar", "bpchar", "name", "json", "xml", "enum"})
_BINARY_NUMBERS = {
    "int2": ">i2",
    "int4": ">i4",
    "int8": ">i8",
    "oid": ">u4",
    "xid": ">u4",
    "cid": ">u4",
    "xid8": ">u8",
    "float4": ">f4",
    "float8": ">f8",
}
_PG_TO_UNIX_DAYS = 10_957
_PG_TO_UNIX_US = 946_684_800_000_000
_DATE_INFINITIES = (2**31 - 1, -(2**31))
_TIMESTAMP_INFINITIES = (2**63 - 1, -(2**63))


def fast_kind(
    name: str,
    data_type: pa.DataType,
    fmt: str,
    *,
    utf8: bool,
    temporal: str,
    element: str = "",
) -> str:
    """How a column of type ``name`` in format ``fmt`` ('t' or 'b') is built vectorised, or ''
    (per value only). ``utf8``: the client encoding is UTF-8 (binary text types are then the
    bytes of the string); ``element``: an array's element type name (comma-delimited)."""
    if fmt == "t":
        if name in _IDENTITY_TEXT and pa.types.is_string(data_type):
            return "identity"
        if name == "uuid" and pa.types.is_string(data_type):
            return "uuid"
        if name == "bool":
            return "bool"
        if name == "bytea":
            return "bytea_hex"
        if name in _CAST_TEXT and (name != "numeric" or pa.types.is_decimal(data_type)):
            return "cast"
        if name in _TEMPORAL_TEXT and temporal == "precise":
            return "cast"
        if name == "array" and element and pa.types.is_list(data_type):
            inner = fast_kind(element, data_type.value_type, "t", utf8=utf8, temporal=temporal)
            if inner in ("identity", "uuid", "bool", "cast"):
                return "array:" + inner
        return ""
    if name in _BINARY_STRINGS and utf8 and pa.types.is_string(data_type):
        return "identity"
    if name == "jsonb" and utf8 and pa.types.is_string(data_type):
        return "jsonb"
    if name in _BINARY_NUMBERS and not pa.types.is_string(data_type):
        return "number"
    if name == "numeric" and pa.types.is_decimal128(data_type) and data_type.precision <= 18:
        return "decimal"
    if name == "bool":
        return "bool"
    if name == "bytea":
        return "bytes"
    if name == "uuid" and pa.types.is_string(data_type):
        return "uuid"
    if name in ("date", "timestamp", "timestamptz") and temporal == "precise":
        return name
    return ""


def text_strings(column: ColumnView) -> pa.Array | None:
    """A text column's values as one Arrow string array; None when one is not UTF-8 (or the
    column is too big for one array)."""
    binary = column.binary_array()
    if binary is None:
        return None
    return _utf8(binary)


def _utf8(binary: pa.Array) -> pa.Array | None:
    """``binary`` as a string array, or None when a value is not UTF-8. ASCII data (the usual
    case) is checked with numpy and reinterpreted without a copy; the rest by Arrow's cast."""
    data = _data_bytes(binary)
    if not len(data) or int(data.max()) < 0x80:
        return pa.Array.from_buffers(
            pa.string(), len(binary), binary.buffers(), binary.null_count, binary.offset
        )
    try:
        return binary.cast(pa.string())
    except pa.ArrowInvalid:
        return None


def _data_bytes(array: pa.Array) -> npt.NDArray[np.uint8]:
    """The value bytes of a binary/string array (from its first to its last value)."""
    _, offset_buffer, data_buffer = array.buffers()
    if offset_buffer is None or data_buffer is None or not len(array):
        return np.zeros(0, np.uint8)
    offsets = np.frombuffer(offset_buffer, np.int32, len(array) + 1, array.offset * 4)
    first, last = int(offsets[0]), int(offsets[-1])
    return np.frombuffer(data_buffer, np.uint8, last - first, first)


def _offsets(array: pa.Array) -> npt.NDArray[np.int64]:
    """A binary/string array's value offsets, relative to its first value."""
    offset_buffer = array.buffers()[1]
    if offset_buffer is None or not len(array):
        return np.zeros(len(array) + 1, np.int64)
    offsets = np.frombuffer(offset_buffer, np.int32, len(array) + 1, array.offset * 4)
    return offsets.astype(np.int64) - int(offsets[0])


def _in_text(framing: Framing, positions: Int64s) -> bool:
    """Whether any of ``positions`` (sorted byte offsets in the framing's buffer) lies inside
    a text value of the framed rows."""
    if not len(positions):
        return False
    firsts, lasts = [], []
    for view in framing.columns:
        text = view.kinds == KIND_TEXT
        if bool(text.any()):
            firsts.append(view.starts[text])
            lasts.append(view.starts[text] + view.lengths[text])
    if not firsts:
        return False
    first, last = np.concatenate(firsts), np.concatenate(lasts)
    order = np.argsort(first, kind="stable")
    first, last = first[order], last[order]
    # Values never overlap: a position is inside the value starting last at or before it.
    index = np.searchsorted(first, positions, side="right") - 1
    inside = (index >= 0) & (positions < last[np.maximum(index, 0)])
    return bool(inside.any())


def text_columns(framing: Framing) -> list[pa.Array | None] | None:
    """Each column's text values as a string array (None for columns without text), or None
    when any text value is not UTF-8. Checked for every column before any is converted, as
    decoding whole rows first does, so a bad byte is reported the same wherever it is."""
    strings: list[pa.Array | None] = []
    for view in framing.columns:
        fmt = view.format()
        if fmt == "t":
            found = text_strings(view)
        elif fmt == "mixed":  # (a change log may hold a binary snapshot and a text stream)
            values = view.buffer.slices(view.starts, view.lengths, view.kinds == KIND_TEXT)
            found = None if values is None else _utf8(values)  # its binary values null
        else:
            strings.append(None)
            continue
        if found is None:
            return None
        strings.append(found)
    return strings


def fast_column(
    kind: str, name: str, column: ColumnView, data_type: pa.DataType, strings: pa.Array | None
) -> FastResult:
    """Column ``column`` as an Arrow array of ``data_type`` (see ``fast_kind``); ``strings``
    are its values from ``text_strings`` when it is a text column."""
    if column.format() == "t":
        if strings is None:
            return None
        if kind in ("identity", "uuid", "bool", "cast"):
            return _text_column(kind, strings, data_type)
        if kind.startswith("array:"):
            return _text_array(kind[6:], strings, data_type)
    if kind == "bytea_hex":
        return None if strings is None else _bytea_hex(strings)
    if kind in {"identity", "jsonb"}:
        return _binary_text(column, jsonb=kind == "jsonb")
    if kind == "number":
        return _binary_number(name, column, data_type)
    if kind == "decimal":
        return _binary_decimal(column, data_type)
    if kind == "bool":
        return _binary_bool(column)
    if kind == "bytes":
        array = column.binary_array()
        return None if array is None else (array, None)
    if kind == "uuid":
        return _binary_uuid(column)
    if kind == "date":
        return _binary_date(column)
    if kind in ("timestamp", "timestamptz"):
        return _binary_timestamp(column, data_type)
    return None


_LETTER = np.zeros(256, np.bool_)
_LETTER[np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", np.uint8)] = True


def _special_forms(strings: pa.Array) -> Bools | None:
    """The values the Arrow casts do not read as the codecs do, left to the codecs: words
    (NaN, Infinity, -infinity) and BC dates and timestamps; None when there are none."""
    data = _data_bytes(strings)
    if not len(data):
        return None
    offsets = _offsets(strings)
    starts, ends = offsets[:-1], offsets[1:]
    present = ends > starts
    padded = np.concatenate([data, np.zeros(2, np.uint8)])
    first = padded[starts]
    word = _LETTER[first] | ((first == ord("-")) & _LETTER[padded[starts + 1]])
    tail = np.maximum(ends - 3, 0)
    bc = (ends - starts >= 3) & (padded[tail] == ord(" "))
    bc &= (padded[tail + 1] == ord("B")) & (padded[tail + 2] == ord("C"))
    special = present & (word | bc)
    return special if bool(special.any()) else None


def _text_column(kind: str, strings: pa.Array, data_type: pa.DataType) -> FastResult:
    if strings.null_count == len(strings):
        return pa.nulls(len(strings), type=data_type), None
    if kind == "identity":
        return strings, None
    if kind == "uuid":
        return (strings, None) if _canonical_uuids(strings) else None
    if kind == "bool":
        present = strings.is_valid().to_numpy(zero_copy_only=False)
        if bool((np.diff(_offsets(strings))[present] != 1).any()):
            return None
        letters = _data_bytes(strings)
        if bool(((letters != ord("t")) & (letters != ord("f"))).any()):
            return None
        truth = np.zeros(len(strings), np.bool_)
        truth[present] = letters == ord("t")
        return _from_numpy(truth, present, pa.bool_()), None
    # Arrow's casts read PostgreSQL's output of these types exactly; its special forms are
    # left to the codecs.
    leftover = _special_forms(strings)
    if leftover is not None:
        strings = pc.if_else(pa.array(leftover), pa.scalar(None, pa.string()), strings)
    try:
        return pc.cast(strings, data_type), leftover
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


# One-dimensional arrays with bare elements: no quotes, escapes, nesting or white space (as
# array_in's array_isspace has it: RE2's \s lacks the vertical tab).
_BARE = r'[^{}"\\ \t\n\r\x0b\f,]+'
_SIMPLE_ARRAY = rf"^\{{({_BARE}(,{_BARE})*)?\}}$"


def _text_array(element_kind: str, strings: pa.Array, data_type: pa.DataType) -> FastResult:
    """array_out's ``{a,b,NULL}`` split and its elements converted with Arrow compute; arrays
    with quoted elements, bounds or more dimensions are left to the codecs."""
    count = len(strings)
    simple = pc.match_substring_regex(strings, _SIMPLE_ARRAY)
    leftover = pc.invert(simple).fill_null(False).to_numpy(zero_copy_only=False)
    usable = pc.if_else(simple, strings, pa.scalar(None, pa.string()))
    inner = pc.utf8_slice_codeunits(usable, 1, -1)
    parts = pc.split_pattern(inner, ",")
    # '{}' splits into one empty element: drop it, the array is empty.
    empty = pc.equal(inner, "").fill_null(False).to_numpy(zero_copy_only=False)
    lengths = pc.list_value_length(parts).fill_null(0).to_numpy(zero_copy_only=False)
    flat = parts.flatten()
    if bool(empty.any()):
        parents = pc.list_parent_indices(parts).to_numpy(zero_copy_only=False)
        flat = flat.filter(pa.array(~empty[parents]))
        lengths = np.where(empty, 0, lengths)
    is_null = pc.equal(pc.ascii_upper(flat), "NULL")
    flat = pc.if_else(is_null, pa.scalar(None, pa.string()), flat)
    converted = _text_column(element_kind, flat, data_type.value_type)
    if converted is None:
        return None
    elements, element_leftover = converted
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    if element_leftover is not None:  # e.g. an infinity: that whole array per value
        owners = np.repeat(np.arange(count), lengths)[element_leftover]
        leftover[owners] = True
    valid = np.asarray(pc.is_valid(usable).to_numpy(zero_copy_only=False)) & ~leftover
    array = pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)),
        elements,
        type=data_type,
        mask=pa.array(~valid),
    )
    return array, (leftover if bool(leftover.any()) else None)


# Each byte's class (1 a dash, 2 a lower-case hex digit, 0 anything else), and the classes of
# uuid_out's 36 characters.
_UUID_CLASS = np.zeros(256, np.uint8)
_UUID_CLASS[ord("-")] = 1
_UUID_CLASS[np.frombuffer(b"0123456789abcdef", np.uint8)] = 2
_UUID_LAYOUT = np.where(np.isin(np.arange(36), [8, 13, 18, 23]), 1, 2).astype(np.uint8)


def _canonical_uuids(strings: pa.Array) -> bool:
    """Whether every value is a uuid as uuid_out prints it (lower-case 8-4-4-4-12), as
    ``str(uuid.UUID(text))`` would give it back."""
    present = strings.is_valid().to_numpy(zero_copy_only=False)
    if bool((np.diff(_offsets(strings))[present] != 36).any()):
        return False
    text = _data_bytes(strings)
    if len(text) != 36 * int(np.count_nonzero(present)):
        return False
    return bool((_UUID_CLASS[text].reshape(-1, 36) == _UUID_LAYOUT).all())


def _fixed_width(column: ColumnView, width: int) -> Bools | None:
    """The rows with a value, when every value is ``width`` bytes (else None)."""
    present = column.present
    if bool((column.lengths[present] != width).any()):
        return None
    return present


def _validity(present: Bools) -> pa.Buffer | None:
    if bool(present.all()):
        return None
    return pa.py_buffer(np.packbits(present, bitorder="little"))


def _from_numpy(values: np.ndarray, present: Bools, data_type: pa.DataType) -> pa.Array:
    mask = None if bool(present.all()) else ~present
    return pa.array(values, type=data_type, mask=mask)


def _binary_number(name: str, column: ColumnView, data_type: pa.DataType) -> FastResult:
    dtype = _BINARY_NUMBERS[name]
    present = _fixed_width(column, np.dtype(dtype).itemsize)
    if present is None:
        return None
    values = column.buffer.view(dtype)[np.where(present, column.starts, 0)]
    native = values.astype(np.dtype(dtype).newbyteorder("="))
    if name == "xid8":
        return _from_numpy(native, present, pa.uint64()).cast(data_type), None
    if name in ("oid", "xid", "cid"):
        native = native.astype(np.int64)
    try:
        return _from_numpy(native, present, data_type), None
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        return None


_POWERS_OF_TEN = 10 ** np.arange(19, dtype=np.int64)
_NUMERIC_NEGATIVE = 0x4000
_NUMERIC_HEADER = 8  # ndigits, weight, sign, dscale: int16 each


def _binary_decimal(column: ColumnView, data_type: pa.DataType) -> FastResult:
    """numeric_send's form (base-10000 digits from ``weight`` down) as decimal128 of at most
    18 digits, so the unscaled values add up in int64; NaN and infinities are left over."""
    present = column.present
    lengths = column.lengths
    if bool((lengths[present] < _NUMERIC_HEADER).any()):
        return None
    starts = np.where(present, column.starts, 0)
    int16 = column.buffer.view(">i2")
    ndigits = np.where(present, int16[starts], 0).astype(np.int64)
    weights = int16[starts + 2].astype(np.int64)
    signs = column.buffer.view(">u2")[starts + 4].astype(np.int64)
    if bool((lengths[present] != _NUMERIC_HEADER + 2 * ndigits[present]).any()):
        return None
    special = present & (signs != 0) & (signs != _NUMERIC_NEGATIVE)
    typed = present & ~special
    ndigits = np.where(typed, ndigits, 0)
    scale = data_type.scale
    unscaled = np.zeros(len(column), dtype=np.int64)
    for index in range(int(ndigits.max()) if len(ndigits) else 0):
        has = ndigits > index
        digits = np.where(has, int16[np.where(has, starts + 8 + 2 * index, 0)], 0).astype(np.int64)
        exponents = 4 * (weights - index) + scale
        # Below the scale only zeros (padding of the last base-10000 digit) may remain; a
        # digit that would take a term past 18 decimal digits is for the per-value path.
        divisors = _POWERS_OF_TEN[np.clip(-exponents, 0, 4)]
        limits = _POWERS_OF_TEN[np.clip(18 - exponents, 0, 18)]
        if bool((has & ((digits % divisors != 0) | ((exponents > 18) & (digits != 0)))).any()):
            return None
        if bool((has & (exponents >= 0) & (digits >= limits)).any()):
            return None
        unscaled += (digits // divisors) * _POWERS_OF_TEN[np.clip(exponents, 0, 18)]
    if bool((np.abs(unscaled) >= _POWERS_OF_TEN[data_type.precision]).any()):
        return None
    unscaled = np.where(signs == _NUMERIC_NEGATIVE, -unscaled, unscaled)
    unscaled[~typed] = 0
    # decimal128: 16 bytes per value, little-endian two's complement.
    words = np.empty((len(column), 2), dtype="<i8")
    words[:, 0] = unscaled
    words[:, 1] = unscaled >> 63
    array = pa.Array.from_buffers(
        data_type, len(column), [_validity(typed), pa.py_buffer(words.tobytes())]
    )
    return array, (special if bool(special.any()) else None)


def _binary_bool(column: ColumnView) -> FastResult:
    present = _fixed_width(column, 1)
    if present is None:
        return None
    values = column.buffer.u8[np.where(present, column.starts, 0)]
    if bool((values[present] > 1).any()):
        return None
    return _from_numpy(values == 1, present, pa.bool_()), None


def _binary_date(column: ColumnView) -> FastResult:
    present = _fixed_width(column, 4)
    if present is None:
        return None
    days = column.buffer.view(">i4")[np.where(present, column.starts, 0)].astype(np.int64)
    infinite = present & np.isin(days, _DATE_INFINITIES)
    shifted = days + _PG_TO_UNIX_DAYS
    typed = present & ~infinite
    if bool((shifted[typed] > 2**31 - 1).any()):
        return None  # does not fit date32: the per-value path says so
    array = _from_numpy(np.where(typed, shifted, 0).astype(np.int32), typed, pa.date32())
    return array, (infinite if bool(infinite.any()) else None)


def _binary_timestamp(column: ColumnView, data_type: pa.DataType) -> FastResult:
    present = _fixed_width(column, 8)
    if present is None:
        return None
    micros = column.buffer.view(">i8")[np.where(present, column.starts, 0)].astype(np.int64)
    # Infinities and times too late to shift to the Unix epoch in int64: kept as text.
    leftover = present & (micros > 2**63 - 1 - _PG_TO_UNIX_US)
    leftover |= present & (micros == -(2**63))
    typed = present & ~leftover
    shifted = np.where(typed, micros, 0) + _PG_TO_UNIX_US
    array = _from_numpy(shifted, typed, data_type)
    return array, (leftover if bool(leftover.any()) else None)


def _binary_text(column: ColumnView, *, jsonb: bool) -> FastResult:
    present = column.present
    if jsonb:
        versions = column.buffer.u8[column.starts[present]]
        if bool((column.lengths[present] < 1).any()) or bool((versions != 1).any()):
            return None
    binary = column.binary_array(skip=1 if jsonb else 0)
    if binary is None:
        return None
    try:
        return binary.cast(pa.string()), None
    except pa.ArrowInvalid:
        return None


_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)
# Two hex digits read as one little-endian uint16 -> the byte they spell (-1 if not hex), and
# the marker the pair ``\x`` gets.
_HEX_VALUE = np.full(256, -1, np.int16)
for _digit, _char in enumerate(b"0123456789abcdef"):
    _HEX_VALUE[_char] = _digit
for _digit, _char in enumerate(b"ABCDEF", 10):
    _HEX_VALUE[_char] = _digit
_HIGH, _LOW = np.divmod(np.arange(65536), 256)  # second and first character of a pair
_HEX_PAIR = np.where(
    (_HEX_VALUE[_LOW] >= 0) & (_HEX_VALUE[_HIGH] >= 0),
    _HEX_VALUE[_LOW] * 16 + _HEX_VALUE[_HIGH],
    -1,
).astype(np.int16)
_HEX_HEAD = -2
_HEX_PAIR[ord("\\") | ord("x") << 8] = _HEX_HEAD


def _bytea_hex(strings: pa.Array) -> FastResult:
    r"""bytea in hex output (``\x0a1b...``), the default bytea_output; else per value.

    Every value is an even number of characters, so the text reads as pairs: each value's
    first pair is ``\x``, the others are its bytes."""
    present = strings.is_valid().to_numpy(zero_copy_only=False)
    offsets = _offsets(strings)
    lengths = np.diff(offsets)
    if bool((lengths[present] < 2).any()) or bool((lengths % 2).any()):
        return None
    text = _data_bytes(strings)
    pairs = _HEX_PAIR[text.view("<u2")]  # each pair's byte, -1 if not hex, or _HEX_HEAD
    heads = offsets[:-1][present] // 2
    if bool((pairs[heads] != _HEX_HEAD).any()):
        return None
    body = np.ones(len(pairs), np.bool_)
    body[heads] = False
    values = pairs[body]
    if bool((values < 0).any()):
        return None
    heads_before = np.zeros(len(present) + 1, np.int64)
    np.cumsum(present, out=heads_before[1:])
    return _binary_from(values.astype(np.uint8), offsets // 2 - heads_before, present), None


# Hex digit positions in the 36-character text form (dashes after 8, 12, 16, 20 digits).
_UUID_DIGIT_AT = np.array([i for i in range(36) if i not in (8, 13, 18, 23)], np.int64)


def _binary_uuid(column: ColumnView) -> FastResult:
    present = _fixed_width(column, 16)
    if present is None:
        return None
    rows = int(np.count_nonzero(present))
    index = column.starts[present][:, None] + np.arange(16, dtype=np.int64)
    raw = column.buffer.u8[index]
    text = np.full((rows, 36), ord("-"), np.uint8)
    hexed = np.empty((rows, 32), np.uint8)
    hexed[:, 0::2] = _HEX_DIGITS[raw >> 4]
    hexed[:, 1::2] = _HEX_DIGITS[raw & 15]
    text[:, _UUID_DIGIT_AT] = hexed
    offsets = np.zeros(len(present) + 1, np.int64)
    np.cumsum(np.where(present, 36, 0), out=offsets[1:])
    strings = _binary_from(text.reshape(-1), offsets, present).cast(pa.string())
    return strings, None
