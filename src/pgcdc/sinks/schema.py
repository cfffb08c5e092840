"""Arrow types as Delta Lake stores them, and schema evolution of an existing Delta table.

Delta has no unsigned integers, times of day, durations or intervals, and decimals stop at 38
digits. delta-rs would silently reinterpret a uint64 as int64, so the sinks convert first,
losslessly and always the same way:

- uint8/16/32 -> the next wider signed integer; uint64 -> decimal(20, 0)
- time32/time64 -> int64 microseconds since midnight; duration -> int64 microseconds
- month_day_nano interval -> struct<months: int32, days: int32, nanoseconds: int64>
- decimal256 -> decimal128 when its precision is at most 38, otherwise its exact text (string)
- large/view strings and binaries -> string/binary; fixed-size binary -> binary; date64 -> date32
- timestamps -> microseconds, with time zone "UTC" when they had any time zone
- lists, structs and maps convert element by element; dictionaries become their values

Evolution (``evolve``) compares the Delta table with the columns a batch needs: new columns are
added, columns the batch no longer has stay in the table, and a column whose type changed may
widen (int2 -> int4 -> int8, float4 -> float8, integer -> decimal, decimal to more integer
and/or fraction digits, element- and field-wise in lists and structs). A batch whose type fits
inside the table's (a narrowing at the source) is written cast up. Anything else is a
``SchemaChangeError``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.decoding.values import PgDate, pg_text
from pgcdc.errors import SchemaChangeError, SinkError
from pgcdc.lsn import LSN

INTERVAL_STRUCT = pa.struct(
    [("months", pa.int32()), ("days", pa.int32()), ("nanoseconds", pa.int64())]
)
_UNSIGNED = {
    pa.uint8(): pa.int16(),
    pa.uint16(): pa.int32(),
    pa.uint32(): pa.int64(),
    pa.uint64(): pa.decimal128(20, 0),
}
_INT_DIGITS = {pa.int8(): 3, pa.int16(): 5, pa.int32(): 10, pa.int64(): 19}
_INT_ORDER = [pa.int8(), pa.int16(), pa.int32(), pa.int64()]


class UnsupportedType(SinkError):
    """An Arrow type with no lossless Delta Lake representation."""


def delta_type(t: pa.DataType) -> pa.DataType:
    """The type a column of Arrow type ``t`` has in a Delta table written by the sinks."""
    if t in _UNSIGNED:
        return _UNSIGNED[t]
    if pa.types.is_time(t) or pa.types.is_duration(t):
        return pa.int64()
    if t == pa.month_day_nano_interval():
        return INTERVAL_STRUCT
    if pa.types.is_decimal256(t):
        return pa.decimal128(t.precision, t.scale) if t.precision <= 38 else pa.string()
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if (
        pa.types.is_large_binary(t)
        or pa.types.is_binary_view(t)
        or pa.types.is_fixed_size_binary(t)
    ):
        return pa.binary()
    if pa.types.is_date64(t):
        return pa.date32()
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz else None)
    if pa.types.is_dictionary(t):
        return delta_type(t.value_type)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return pa.list_(delta_type(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, delta_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(delta_type(t.key_type), delta_type(t.item_type))
    if (
        pa.types.is_boolean(t)
        or pa.types.is_signed_integer(t)
        or pa.types.is_floating(t)
        or pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_date32(t)
        or pa.types.is_decimal128(t)
    ):
        return pa.float32() if pa.types.is_float16(t) else t
    raise UnsupportedType(
        f"Arrow type {t} has no lossless Delta Lake representation; convert the column to a "
        "supported type (e.g. its text form) before writing"
    )


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with Delta types; every field nullable (a NOT NULL may be dropped later)."""
    return pa.schema([pa.field(f.name, delta_type(f.type)) for f in schema])


def to_delta(array: pa.Array) -> pa.Array:
    """Convert an array to its ``delta_type``, without losing a value."""
    t = array.type
    target = delta_type(t)
    if t == target:
        return array
    if pa.types.is_dictionary(t):
        return to_delta(array.dictionary_decode())
    if pa.types.is_struct(t):
        children = [to_delta(child) for child in array.flatten()]
        return pa.StructArray.from_arrays(children, fields=list(target), mask=array.is_null())
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        if pa.types.is_fixed_size_list(t):
            array = array.cast(pa.list_(t.value_type))
        offsets = array.offsets.cast(pa.int32())
        values = to_delta(array.values)
        return pa.ListArray.from_arrays(offsets, values, mask=array.is_null())
    if pa.types.is_map(t):
        return array.cast(target)
    if pa.types.is_time(t):
        return array.cast(pa.time64("us")).cast(pa.int64())
    if pa.types.is_duration(t):
        return array.cast(pa.duration("us")).cast(pa.int64())
    if t == pa.month_day_nano_interval():
        rows = [
            None
            if v is None
            else {"months": v.months, "days": v.days, "nanoseconds": v.nanoseconds}
            for v in array.to_pylist()
        ]
        return pa.array(rows, INTERVAL_STRUCT)
    return array.cast(target, safe=True)


# --- evolution -------------------------------------------------------------------------------


def _int_fits(src: pa.DataType, dst: pa.DataType) -> bool:
    return bool(_INT_ORDER.index(src) <= _INT_ORDER.index(dst))


def _decimal_fits(src: pa.DataType, dst: pa.DataType) -> bool:
    if pa.types.is_integer(src):
        return bool(dst.precision - dst.scale >= _INT_DIGITS[src])
    return bool(dst.scale >= src.scale and dst.precision - dst.scale >= src.precision - src.scale)


def fits(src: pa.DataType, dst: pa.DataType) -> bool:
    """Whether every value of Delta type ``src`` is exactly representable in Delta type ``dst``."""
    if src == dst:
        return True
    if pa.types.is_signed_integer(src) and pa.types.is_signed_integer(dst):
        return _int_fits(src, dst)
    if pa.types.is_floating(src) and pa.types.is_floating(dst):
        return bool(src.bit_width <= dst.bit_width)
    if pa.types.is_decimal128(dst) and (
        pa.types.is_decimal128(src) or (pa.types.is_signed_integer(src) and src in _INT_DIGITS)
    ):
        return _decimal_fits(src, dst)
    if pa.types.is_list(src) and pa.types.is_list(dst):
        return fits(src.value_type, dst.value_type)
    if pa.types.is_struct(src) and pa.types.is_struct(dst):
        dst_fields = {f.name: f.type for f in dst}
        return all(f.name in dst_fields and fits(f.type, dst_fields[f.name]) for f in src)
    return False


def _merge_type(
    existing: pa.DataType, wanted: pa.DataType, table: str, column: str, lsn: LSN
) -> pa.DataType:
    """The type a Delta column must have to hold both its current values and ``wanted`` ones."""
    if fits(wanted, existing):
        return existing
    if pa.types.is_struct(existing) and pa.types.is_struct(wanted):
        wanted_fields = {f.name: f.type for f in wanted}
        fields = [
            pa.field(
                f.name,
                _merge_type(f.type, wanted_fields[f.name], table, f"{column}.{f.name}", lsn)
                if f.name in wanted_fields
                else f.type,
            )
            for f in existing
        ]
        known = {f.name for f in existing}
        fields += [pa.field(f.name, f.type) for f in wanted if f.name not in known]
        return pa.struct(fields)
    if pa.types.is_list(existing) and pa.types.is_list(wanted):
        return pa.list_(_merge_type(existing.value_type, wanted.value_type, table, column, lsn))
    if fits(existing, wanted):
        return wanted
    raise SchemaChangeError(
        f"{table}: column {column!r} changed type from {existing} to {wanted} at LSN {lsn}, "
        "which the Delta table cannot follow without losing or altering data; add a new "
        "column instead of changing the type, or drop and rebuild the Delta table (re-snapshot)",
        table=table,
        column=column,
        lsn=lsn,
    )


def evolve(existing: pa.Schema, wanted: pa.Schema, table: str, lsn: LSN) -> pa.Schema:
    """The schema a Delta table needs so that a batch with ``wanted`` columns can be written.

    Keeps every existing column (dropped columns stay, unfilled), in order, then appends the new.
    """
    wanted_types = {f.name: f.type for f in wanted}
    fields = [
        pa.field(
            f.name,
            _merge_type(f.type, wanted_types[f.name], table, f.name, lsn)
            if f.name in wanted_types
            else f.type,
        )
        for f in existing
    ]
    known = set(existing.names)
    fields += [pa.field(f.name, f.type) for f in wanted if f.name not in known]
    return pa.schema(fields)


def normalize_read_type(t: pa.DataType) -> pa.DataType:
    """Map the types a Delta reader may hand back (views, large) to the ones the sinks write."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, normalize_read_type(f.type)) for f in t])
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(normalize_read_type(t.value_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    return t


def contiguous(column: pa.ChunkedArray) -> pa.Array:
    """``column``'s values as one Array: its only chunk as it is, or its chunks joined
    (``ChunkedArray.combine_chunks`` copies even a single chunk, which every batch and
    snapshot chunk paid for each column of each kind it wrote)."""
    if column.num_chunks == 1:
        return column.chunk(0)
    return column.combine_chunks()


def align(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``: missing columns (and struct fields) null, types cast up.

    Only casts that ``fits`` allows happen here, so no value changes.
    """
    arrays = [
        _align_array(
            contiguous(table.column(f.name))
            if f.name in table.column_names
            else pa.nulls(table.num_rows, f.type),
            f.type,
        )
        for f in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def _align_array(array: pa.Array, to: pa.DataType) -> pa.Array:
    if array.type == to:
        return array
    if pa.types.is_struct(to) and pa.types.is_struct(array.type):
        present = {array.type.field(i).name: i for i in range(array.type.num_fields)}
        flat = array.flatten()
        children = [
            _align_array(flat[present[f.name]], f.type)
            if f.name in present
            else pa.nulls(len(array), f.type)
            for f in to
        ]
        return pa.StructArray.from_arrays(children, fields=list(to), mask=array.is_null())
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), to)
    return pc.cast(array, to, safe=True)


# --- values delta-rs cannot hold typed -------------------------------------------------------

# delta-rs computes file statistics with chrono, whose dates end at year +/-262142: a date32
# beyond (PostgreSQL's dates reach 5874897 AD) makes it panic. Such dates go to the text map.
DATE_DAYS_MIN = -96_465_292
DATE_DAYS_MAX = 95_026_236
_EPOCH_2000 = 10_957  # days from 1970-01-01 to 2000-01-01
TEXT_TYPE = pa.map_(pa.string(), pa.string())


def _days_type(t: pa.DataType) -> pa.DataType:
    return pa.list_(pa.int32()) if pa.types.is_list(t) else pa.int32()


def _pg_dates(value: Any) -> Any:
    """Day numbers since 1970 (or lists of them) as ``PgDate`` values ``pg_text`` prints."""
    if isinstance(value, list):
        return [_pg_dates(v) for v in value]
    return None if value is None else PgDate(value - _EPOCH_2000)


def park_unstorable(
    columns: dict[str, pa.Array], text: pa.Array
) -> tuple[dict[str, pa.Array], pa.Array]:
    """Date values delta-rs cannot write (in a date column or a date array), moved to ``text``
    (a ``_text`` map) as PostgreSQL prints them, their typed value null, as the decoder does
    with ``infinity``."""
    extra: dict[int, list[tuple[str, str]]] = {}
    out = dict(columns)
    for name, array in columns.items():
        listed = pa.types.is_list(array.type) and pa.types.is_date32(array.type.value_type)
        if not (pa.types.is_date32(array.type) or listed) or array.null_count == len(array):
            continue
        days = (array.flatten() if listed else array).cast(pa.int32())
        beyond = pc.fill_null(
            pc.or_(pc.less(days, DATE_DAYS_MIN), pc.greater(days, DATE_DAYS_MAX)), False
        )
        if not pc.any(beyond).as_py():
            continue
        outside = beyond
        if listed:  # the whole array value goes to text
            parents = pc.list_parent_indices(array).filter(beyond).to_numpy()
            mask = np.zeros(len(array), dtype=bool)
            mask[parents] = True
            outside = pa.array(mask)
        rows = pc.indices_nonzero(outside).to_pylist()
        taken = array.take(pa.array(rows, pa.int64()))
        for row, value in zip(rows, taken.cast(_days_type(array.type)).to_pylist(), strict=True):
            extra.setdefault(row, []).append((name, pg_text(_pg_dates(value))))
        out[name] = pc.if_else(outside, pa.scalar(None, array.type), array)
    if not extra:
        return out, text
    changed = sorted(extra)
    merged = []
    before = text.take(pa.array(changed, pa.int64())).to_pylist()
    for row, entries in zip(changed, before, strict=True):
        kept = [(k, v) for k, v in entries or [] if k not in {n for n, _ in extra[row]}]
        merged.append(kept + extra[row])
    index = list(range(len(text)))
    for position, row in enumerate(changed):
        index[row] = len(text) + position
    both = pa.concat_arrays([text.cast(TEXT_TYPE), pa.array(merged, TEXT_TYPE)])
    return out, both.take(pa.array(index, pa.int64()))
