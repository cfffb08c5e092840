"""PostgreSQL values to Arrow: the type mapping and fast conversion of many rows at once.

The schema depends only on the column types and the options, never on the data, so every
batch of a table has the same schema (what a Delta table needs). Two columns are added to
every batch, after the table's own:

* ``_pgcdc_unchanged_toast`` (``list<string>``): the names of the columns whose value the server
  did not send because it was an unchanged TOASTed value. Their typed columns hold null; a
  mirror must keep the previous value. An empty list when there are none.
* ``_pgcdc_text`` (``map<string, string>``): for columns whose value the typed column cannot
  hold exactly (numeric NaN/Infinity in a decimal column, +/-infinity dates and timestamps,
  ``24:00:00``, intervals beyond month_day_nano, multi-dimensional arrays or arrays with lower
  bounds other than 1), the value's PostgreSQL text form. The typed column then holds null. So
  ``coalesce(_pgcdc_text[col], col)`` never loses a value. Null when there are none.

Options in the spirit of Debezium's ``decimal.handling.mode``: ``decimal`` is ``precise``
(default: decimal128/decimal256 when the typmod fixes precision and scale, else the exact
string), ``double`` (float64, lossy by choice) or ``string``; ``temporal`` is ``precise``
(default: Arrow date/time types) or ``string`` (PostgreSQL's ISO text, UTC for timestamptz).
See docs/types.md.
"""

from __future__ import annotations

import codecs
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.decoding import columnar
from pgcdc.decoding.values import (
    BoundedList,
    Codec,
    Interval,
    PgDate,
    PgTime,
    PgTimestamp,
    ResolvedType,
    TypeRegistry,
    Types,
    decode_value,
    pg_text,
    registry_for,
)
from pgcdc.errors import DecodeError, InvalidRowValue
from pgcdc.events import (
    UNCHANGED_TOAST,
    Column,
    EncodedRow,
    RawValue,
    Row,
    Table,
    decode_tuple_data,
    encode_tuple_data,
)

DecimalMode = Literal["precise", "double", "string"]
TemporalMode = Literal["precise", "string"]


@dataclass(frozen=True, slots=True)
class ArrowOptions:
    """How values without an exact, convenient Arrow type are written (see docs/types.md)."""

    decimal: DecimalMode = "precise"
    temporal: TemporalMode = "precise"
    unchanged_column: str = "_pgcdc_unchanged_toast"
    text_column: str = "_pgcdc_text"

    def __post_init__(self) -> None:
        if self.decimal not in ("precise", "double", "string"):
            raise ValueError(f"decimal={self.decimal!r}: use 'precise', 'double' or 'string'")
        if self.temporal not in ("precise", "string"):
            raise ValueError(f"temporal={self.temporal!r}: use 'precise' or 'string'")


DEFAULT_OPTIONS = ArrowOptions()
UNCHANGED_TYPE = pa.list_(pa.string())
TEXT_TYPE = pa.map_(pa.string(), pa.string())


class _Unrepresentable(Exception):
    """Raised by a converter for a value its Arrow type cannot hold exactly."""


# --- the type mapping --------------------------------------------------------------------------

_SIMPLE: dict[str, pa.DataType] = {
    "bool": pa.bool_(),
    "int2": pa.int16(),
    "int4": pa.int32(),
    "int8": pa.int64(),
    "oid": pa.int64(),
    "xid": pa.int64(),
    "cid": pa.int64(),
    "xid8": pa.decimal128(20, 0),
    "float4": pa.float32(),
    "float8": pa.float64(),
    "bytea": pa.binary(),
}
_DECIMAL_TYPES = ("numeric", "money")
_TEMPORAL: dict[str, pa.DataType] = {
    "date": pa.date32(),
    "time": pa.time64("us"),
    "timestamp": pa.timestamp("us"),
    "timestamptz": pa.timestamp("us", tz="UTC"),
    "interval": pa.month_day_nano_interval(),
}


def numeric_precision_scale(type_modifier: int) -> tuple[int, int] | None:
    """numeric's (precision, scale) from its typmod; None when unconstrained.

    PostgreSQL 15+ allows a negative scale and a scale above the precision (11-bit signed).
    """
    if type_modifier < 4:
        return None
    packed = type_modifier - 4
    scale = ((packed & 0x7FF) ^ 1024) - 1024
    return (packed >> 16) & 0xFFFF, scale


def _decimal_type(type_modifier: int) -> pa.DataType | None:
    """The decimal type holding every value of numeric(p, s), or None when none does."""
    found = numeric_precision_scale(type_modifier)
    if found is None:
        return None
    precision, scale = found
    if scale < 0:  # numeric(3, -2) holds 99900: integers of p - s digits
        precision, scale = precision - scale, 0
    elif scale > precision:  # numeric(2, 5) holds 0.00099: s digits, all after the point
        precision = scale
    if precision <= 38:
        return pa.decimal128(precision, scale)
    if precision <= 76:
        return pa.decimal256(precision, scale)
    return None


def _arrow_type(
    resolved: ResolvedType, type_modifier: int, registry: TypeRegistry, options: ArrowOptions
) -> pa.DataType:
    if type_modifier == -1:  # a domain's column: the domain's own modifier, if any
        type_modifier = resolved.type_modifier
    name = resolved.name
    if name in ("array", "vector") and resolved.element is not None:
        return pa.list_(_arrow_type(resolved.element, type_modifier, registry, options))
    if name in _SIMPLE:
        return _SIMPLE[name]
    if name in _DECIMAL_TYPES:
        if options.decimal == "double":
            return pa.float64()
        if options.decimal == "string":
            return pa.string()
        if name == "money":
            return pa.decimal128(19, registry.money_fraction_digits)
        return _decimal_type(type_modifier) or pa.string()
    if name in _TEMPORAL and options.temporal == "precise":
        return _TEMPORAL[name]
    return pa.string()


def arrow_type(
    type_oid: int,
    type_modifier: int = -1,
    types: Types = None,
    options: ArrowOptions = DEFAULT_OPTIONS,
) -> pa.DataType:
    """The Arrow type of a PostgreSQL type (domains as their base, arrays as lists)."""
    registry = registry_for(types)
    return _arrow_type(registry.resolve(type_oid), type_modifier, registry, options)


def _field(column: Column, registry: TypeRegistry, options: ArrowOptions) -> pa.Field:
    resolved = registry.resolve(column.type_oid)
    metadata = {
        "pgcdc.type_oid": str(column.type_oid),
        "pgcdc.type_modifier": str(column.type_modifier),
        "pgcdc.type": resolved.display_name or resolved.name,
    }
    data_type = _arrow_type(resolved, column.type_modifier, registry, options)
    return pa.field(column.name, data_type, nullable=True, metadata=metadata)


def arrow_schema(
    table: Table, types: Types = None, options: ArrowOptions = DEFAULT_OPTIONS
) -> pa.Schema:
    """The table's columns in order, then the unchanged-TOAST and text-form columns."""
    registry = registry_for(types)
    names = {c.name for c in table.columns}
    for extra in (options.unchanged_column, options.text_column):
        if extra in names:
            raise DecodeError(
                f"{table.qualified_name} has a column named {extra!r}, which pgcdc adds to every "
                f"batch; choose another name with ArrowOptions(unchanged_column=..., "
                f"text_column=...)"
            )
    fields = [_field(c, registry, options) for c in table.columns]
    fields.append(pa.field(options.unchanged_column, UNCHANGED_TYPE, nullable=False))
    fields.append(pa.field(options.text_column, TEXT_TYPE, nullable=True))
    return pa.schema(fields, metadata={"pgcdc.table": table.qualified_name})


# --- value converters: Python value -> what pa.array takes for the column's type ---------------

_EPOCH_1970 = datetime(1970, 1, 1)
_EPOCH_1970_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_US = timedelta(microseconds=1)
_PG_TO_UNIX_US = 946_684_800_000_000
_PG_TO_UNIX_DAYS = 10_957
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

Converter = Callable[[Any], Any]


def _identity(value: Any) -> Any:
    return value


def _decimal_precise(value: Decimal) -> Decimal:
    if not value.is_finite():
        raise _Unrepresentable
    return value


def _decimal_string(value: Decimal) -> str:
    return format(value, "f")


def _decimal_double(value: Decimal) -> float:
    return float(value)


def _date_precise(value: date | PgDate) -> Any:
    if isinstance(value, PgDate):
        if value.is_infinite:
            raise _Unrepresentable
        return value.days + _PG_TO_UNIX_DAYS
    return value


def _time_precise(value: time | PgTime) -> Any:
    if isinstance(value, PgTime):  # 24:00:00: time64 stops just before it
        raise _Unrepresentable
    return value


def _timestamp_precise(value: datetime | PgTimestamp) -> int:
    if isinstance(value, PgTimestamp):
        if value.is_infinite:
            raise _Unrepresentable
        micros = value.micros + _PG_TO_UNIX_US
        if not _INT64_MIN <= micros <= _INT64_MAX:
            raise _Unrepresentable
        return micros
    if value.tzinfo is None:
        return (value - _EPOCH_1970) // _US
    return (value - _EPOCH_1970_UTC) // _US


def _interval_precise(value: Interval) -> tuple[int, int, int]:
    nanos = value.microseconds * 1000
    if value.is_infinite or not _INT64_MIN <= nanos <= _INT64_MAX:
        raise _Unrepresentable
    return (value.months, value.days, nanos)


def _text_form(value: Any) -> str:
    return pg_text(value)


def _uuid_string(value: Any) -> str:
    return str(value)


def _str_or_raise(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise DecodeError(
        "a value of a type pgcdc has no binary decoder for arrived in binary format and cannot "
        "be written as Arrow text; decode this stream in text format (pgoutput binary=false)"
    )


def _scalar_converter(
    resolved: ResolvedType, data_type: pa.DataType, options: ArrowOptions
) -> Converter:
    name = resolved.name
    if name in _DECIMAL_TYPES:
        if pa.types.is_string(data_type):
            return _decimal_string
        if pa.types.is_floating(data_type):
            return _decimal_double
        return _decimal_precise
    if name in _TEMPORAL:
        if options.temporal == "string":
            return _text_form
        precise: dict[str, Converter] = {
            "date": _date_precise,
            "time": _time_precise,
            "timestamp": _timestamp_precise,
            "timestamptz": _timestamp_precise,
            "interval": _interval_precise,
        }
        return precise[name]
    if name == "xid8":
        return Decimal
    if name in _SIMPLE or name in ("text", "varchar", "bpchar", "name", "char", "json", "jsonb"):
        return _identity
    if name in ("xml", "enum", "macaddr", "macaddr8", "bit", "varbit"):
        return _identity
    if name in ("timetz", "pg_lsn", "cidr", "inet"):
        return _text_form
    if name == "uuid":
        return _uuid_string
    return _str_or_raise  # composite, range, unknown: the text form


def _array_converter(element: Converter) -> Converter:
    def convert(value: list[Any]) -> list[Any]:
        if isinstance(value, BoundedList):
            raise _Unrepresentable
        out: list[Any] = []
        for item in value:
            if item is None:
                out.append(None)
            elif isinstance(item, list):  # a second dimension: the list type has one
                raise _Unrepresentable
            else:
                out.append(element(item))
        return out

    return convert


def _converter(resolved: ResolvedType, data_type: pa.DataType, options: ArrowOptions) -> Converter:
    """Python value -> what ``pa.array`` takes for ``data_type`` (the column's Arrow type)."""
    if resolved.name in ("array", "vector") and resolved.element is not None:
        return _array_converter(_converter(resolved.element, data_type.value_type, options))
    return _scalar_converter(resolved, data_type, options)


# --- rows to a record batch --------------------------------------------------------------------


# --- vectorised text columns ---------------------------------------------------------------------
#
# A column whose values all arrived as text is built as one Arrow string array and cast with
# Arrow compute, where that cast reads PostgreSQL's output exactly as the per-value codecs do.
# Whatever the cast rejects (NaN, infinity, BC, offsets with seconds, values too large, binary
# input, unchanged TOAST values) sends the whole column down the per-value path, which keeps
# the text form or raises the DecodeError that explains it; the fast path never decides alone.

_UUID_TEXT = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_TEXT_ONLY = frozenset({str, type(None)})
# The text kinds the tuples path builds with Arrow compute (columnar.fast_kind decides).
_TUPLE_KINDS = frozenset({"identity", "uuid", "bool", "cast"})


def _bool_column(strings: pa.Array) -> pa.Array | None:
    is_true = pc.equal(strings, "t")
    known = pc.or_(is_true, pc.equal(strings, "f"))
    return is_true if pc.all(known).as_py() is not False else None


def _uuid_column(strings: pa.Array) -> pa.Array | None:
    canonical = pc.match_substring_regex(strings, _UUID_TEXT)
    return strings if pc.all(canonical).as_py() is not False else None


def _fast_kind(resolved: ResolvedType, data_type: pa.DataType, options: ArrowOptions) -> str | None:
    """How a text column of this type is built vectorised from tuples, or None (per value)."""
    kind = columnar.fast_kind(resolved.name, data_type, "t", utf8=True, temporal=options.temporal)
    return kind if kind in _TUPLE_KINDS else None


def _fast_column(kind: str, values: Sequence[RawValue], data_type: pa.DataType) -> pa.Array | None:
    """The column built with Arrow compute, or None when the per-value path must decide."""
    if not set(map(type, values)) <= _TEXT_ONLY:
        return None
    strings = pa.array(values, type=pa.string())
    if strings.null_count == len(strings):
        return pa.nulls(len(strings), type=data_type)
    if kind == "identity":
        return strings
    if kind == "uuid":
        return _uuid_column(strings)
    if kind == "bool":
        return _bool_column(strings)
    try:
        return pc.cast(strings, data_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


@dataclass(frozen=True, slots=True)
class _Plan:
    schema: pa.Schema
    columns: tuple[tuple[Codec, Converter], ...]
    fast: tuple[str | None, ...]
    # Resolved type name of each column, and its vectorised kind per format ('t', 'b').
    names: tuple[str, ...]
    columnar: tuple[dict[str, str], ...]


def _array_element(resolved: ResolvedType) -> str:
    """The element type name of a one-dimensional, comma-delimited array type, else ''."""
    element = resolved.element
    if resolved.name != "array" or element is None or resolved.delimiter != ",":
        return ""
    return element.name


_plans: dict[tuple[int, int, ArrowOptions], tuple[Table, TypeRegistry, _Plan]] = {}


def _plan(table: Table, registry: TypeRegistry, options: ArrowOptions) -> _Plan:
    key = (id(table), id(registry), options)
    entry = _plans.get(key)
    if entry is not None and entry[0] is table and entry[1] is registry:
        return entry[2]
    schema = arrow_schema(table, registry, options)
    columns = []
    fast = []
    names = []
    kinds = []
    utf8 = codecs.lookup(registry.encoding).name == "utf-8"
    for column, field in zip(table.columns, schema, strict=False):
        codec = registry.codec(column.type_oid)
        resolved = registry.resolve(column.type_oid)
        convert = _converter(resolved, field.type, options)
        columns.append((codec, convert))
        fast.append(_fast_kind(resolved, field.type, options))
        names.append(resolved.name)
        kinds.append(
            {
                fmt: columnar.fast_kind(
                    resolved.name,
                    field.type,
                    fmt,
                    utf8=utf8,
                    temporal=options.temporal,
                    element=_array_element(resolved),
                )
                for fmt in ("t", "b")
            }
        )
    plan = _Plan(schema, tuple(columns), tuple(fast), tuple(names), tuple(kinds))
    if len(_plans) >= 4096:
        _plans.clear()
    # The entry holds the table and registry, so their ids cannot be reused while cached.
    _plans[key] = (table, registry, plan)
    return plan


def rows_to_arrow(
    table: Table,
    rows: Iterable[Sequence[RawValue]],
    options: ArrowOptions = DEFAULT_OPTIONS,
    types: Types = None,
) -> pa.RecordBatch:
    """Many raw rows of ``table`` to one record batch with ``arrow_schema(table)``.

    Rows kept as TupleData (``EncodedRow``, what the change log hands the Spark executors) are
    decoded column by column with numpy and Arrow compute (``pgcdc.decoding.columnar``);
    tuples of values row by row. Both give the same batch, or the same DecodeError.
    """
    registry = registry_for(types)
    plan = _plan(table, registry, options)
    rows = rows if isinstance(rows, list) else list(rows)
    if len(rows) >= COLUMNAR_MIN_ROWS and any(type(row) is EncodedRow for row in rows):
        batch = _columnar_batch(table, rows, plan)
        if batch is not None:
            return batch
    return _row_batch(table, rows, plan)


COLUMNAR_MIN_ROWS = 100
"""Fewer EncodedRows than this are decoded row by row: below about this many (for a table of
ten columns) numpy's per-call cost outweighs what it saves."""


def _convert_values(
    raws: Sequence[RawValue],
    rows: Sequence[int],
    *,
    index: int,
    table: Table,
    plan: _Plan,
    texts: list[tuple[int, int, str]],
) -> list[Any]:
    """Values (never None or unchanged) of column ``index`` through its codec and converter;
    those its Arrow type cannot hold become null plus a (row, column, text form) entry."""
    column = table.columns[index]
    codec, convert = plan.columns[index]
    text, binary = codec.text, codec.binary
    values: list[Any] = []
    append = values.append
    for number, raw in zip(rows, raws, strict=True):
        try:
            value = text(raw) if isinstance(raw, str) else binary(raw)  # type: ignore[arg-type]
        except Exception:
            # Again through decode_value: it names type, value and column in a DecodeError.
            value = decode_value(codec, raw, column, table)  # type: ignore[arg-type]
        try:
            append(convert(value))
        except _Unrepresentable:
            append(None)
            # From the decoded value, so text and binary input give the same text (UTC).
            texts.append((number, index, pg_text(value)))
    return values


def _typed_array(values: list[Any], index: int, table: Table, plan: _Plan) -> pa.Array:
    field = plan.schema.field(index)
    try:
        return pa.array(values, type=field.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
        raise DecodeError(
            f"column {field.name!r} of {table.qualified_name} does not fit Arrow type "
            f"{field.type}: {exc}"
        ) from exc


def _text_map(count: int, texts: list[tuple[int, int, str]], table: Table) -> pa.Array:
    if not texts:
        return pa.nulls(count, type=TEXT_TYPE)
    by_row: list[list[tuple[str, str]] | None] = [None] * count
    for number, index, text in sorted(texts, key=lambda entry: entry[:2]):
        found = by_row[number]
        if found is None:
            found = by_row[number] = []
        found.append((table.columns[index].name, text))
    return pa.array(by_row, type=TEXT_TYPE)


def _row_batch(table: Table, rows: list[Sequence[RawValue]], plan: _Plan) -> pa.RecordBatch:
    """The batch built row by row (tuples; EncodedRows decoded one at a time)."""
    width = len(table.columns)
    for row in rows:
        if _width(row) != width:
            raise DecodeError(
                f"row of {table.qualified_name} has {len(row)} values but the table has "
                f"{width} columns; the Relation message and the row disagree"
            )
    unchanged: list[list[str]] = [[] for _ in rows]
    texts: list[tuple[int, int, str]] = []
    arrays: list[pa.Array] = []
    try:
        by_column = list(zip(*rows, strict=True)) if rows else [()] * width
    except DecodeError as exc:
        raise _unreadable_row(table, rows) from exc
    for index, column in enumerate(table.columns):
        kind = plan.fast[index]
        if kind is not None:
            fast = _fast_column(kind, by_column[index], plan.schema.field(index).type)
            if fast is not None:
                arrays.append(fast)
                continue
        numbers: list[int] = []
        raws: list[RawValue] = []
        for number, raw in enumerate(by_column[index]):
            if raw is None:
                continue
            if raw is UNCHANGED_TOAST:
                unchanged[number].append(column.name)
                continue
            numbers.append(number)
            raws.append(raw)
        converted = _convert_values(raws, numbers, index=index, table=table, plan=plan, texts=texts)
        values: list[Any] = [None] * len(rows)
        for number, value in zip(numbers, converted, strict=True):
            values[number] = value
        arrays.append(_typed_array(values, index, table, plan))
    arrays.append(pa.array(unchanged, type=UNCHANGED_TYPE))
    arrays.append(_text_map(len(rows), texts, table))
    return pa.RecordBatch.from_arrays(arrays, schema=plan.schema)


def _unreadable_row(table: Table, rows: list[Sequence[RawValue]]) -> DecodeError:
    """The error that names the first of ``rows`` (EncodedRows are read on first use) that
    cannot be read, and why."""
    for number, row in enumerate(rows):
        try:
            tuple(row)
        except DecodeError as exc:
            return DecodeError(
                f"row {number} of {len(rows)} of {table.qualified_name} is malformed: {exc}"
            )
    return DecodeError(f"a row of {table.qualified_name} could not be read")  # pragma: no cover


def _width(row: Sequence[RawValue]) -> int:
    """How many values ``row`` has; an EncodedRow too short to hold its column count raises
    the DecodeError that says so."""
    try:
        return len(row)
    except struct.error:
        decode_tuple_data(row.data)  # type: ignore[attr-defined]  # raises: no column count
        raise


def _columnar_batch(table: Table, rows: list[Row], plan: _Plan) -> pa.RecordBatch | None:
    """The batch built column by column from the rows' TupleData; None when a row does not
    encode or its framing is malformed (the row-by-row path then says what is wrong)."""
    try:
        datas = [row.data if type(row) is EncodedRow else encode_tuple_data(row) for row in rows]
    except InvalidRowValue:
        return None
    lengths = np.fromiter(map(len, datas), np.int64, len(datas))
    ends = np.cumsum(lengths)
    buffer = columnar.WireBuffer.joined(datas)
    framed = columnar.frame_rows(buffer, ends - lengths, ends, len(table.columns))
    if framed is None:
        return None
    framing, strings = framed
    return _framed_batch(table, framing, plan, strings)


def framed_to_arrow(
    table: Table,
    framing: columnar.Framing,
    strings: Sequence[pa.Array | None],
    options: ArrowOptions = DEFAULT_OPTIONS,
    types: Types = None,
) -> pa.RecordBatch:
    """Framed TupleData of ``table`` (``columnar.frame_tuples``), its text columns checked to
    be UTF-8 (``columnar.text_columns``), to the record batch ``rows_to_arrow`` builds from
    the same rows (or the same DecodeError)."""
    return _framed_batch(table, framing, _plan(table, registry_for(types), options), strings)


def _framed_batch(
    table: Table, framing: columnar.Framing, plan: _Plan, strings: Sequence[pa.Array | None]
) -> pa.RecordBatch:
    views = framing.columns
    count = len(framing.ends)
    texts: list[tuple[int, int, str]] = []
    arrays: list[pa.Array] = []
    for index, view in enumerate(views):
        data_type = plan.schema.field(index).type
        fmt = view.format()
        if fmt is None:
            arrays.append(pa.nulls(count, type=data_type))
            continue
        kind = plan.columnar[index].get(fmt, "")
        result = (
            columnar.fast_column(kind, plan.names[index], view, data_type, strings[index])
            if kind
            else None
        )
        leftover: npt.NDArray[np.bool_] | None
        if result is None:
            leftover = view.present
            array = pa.nulls(count, type=data_type)
        else:
            array, leftover = result
        if leftover is not None and bool(leftover.any()):
            array = _merge_values(
                array, leftover, view, index=index, table=table, plan=plan, texts=texts
            )
        arrays.append(array)
    arrays.append(_unchanged_lists(table, views, count))
    arrays.append(_text_map(count, texts, table))
    return pa.RecordBatch.from_arrays(arrays, schema=plan.schema)


def _merge_values(
    array: pa.Array,
    leftover: npt.NDArray[np.bool_],
    view: columnar.ColumnView,
    *,
    index: int,
    table: Table,
    plan: _Plan,
    texts: list[tuple[int, int, str]],
) -> pa.Array:
    """``array`` with the ``leftover`` rows converted value by value."""
    rows = np.flatnonzero(leftover)
    numbers = rows.tolist()
    values = _convert_values(
        view.raw_values(rows), numbers, index=index, table=table, plan=plan, texts=texts
    )
    if len(rows) == len(array):
        return _typed_array(values, index, table, plan)
    if array.null_count == len(array):  # the whole column went per value
        full: list[Any] = [None] * len(array)
        for number, value in zip(numbers, values, strict=True):
            full[number] = value
        return _typed_array(full, index, table, plan)
    converted = _typed_array(values, index, table, plan)
    take = np.arange(len(array), dtype=np.int64)
    take[rows] = len(array) + np.arange(len(rows), dtype=np.int64)
    return pa.concat_arrays([array, converted]).take(pa.array(take))


def _unchanged_lists(table: Table, views: Sequence[columnar.ColumnView], count: int) -> pa.Array:
    """Per row, the names of its unchanged-TOAST columns in column order (no per-row Python)."""
    masks = [view.unchanged for view in views]
    if not any(bool(mask.any()) for mask in masks):
        empty = pa.array([], pa.string())
        return pa.ListArray.from_arrays(pa.array(np.zeros(count + 1, np.int32)), empty)
    matrix = np.stack(masks, axis=1)
    offsets = np.zeros(count + 1, np.int32)
    np.cumsum(matrix.sum(axis=1), out=offsets[1:])
    _, columns = np.nonzero(matrix)
    names = pa.array([column.name for column in table.columns], pa.string()).take(
        pa.array(columns.astype(np.int64))
    )
    return pa.ListArray.from_arrays(pa.array(offsets), names, type=UNCHANGED_TYPE)


def rows_to_table(
    table: Table,
    rows: Iterable[Sequence[RawValue]],
    options: ArrowOptions = DEFAULT_OPTIONS,
    types: Types = None,
) -> pa.Table:
    """Like ``rows_to_arrow``, as a ``pa.Table``."""
    return pa.Table.from_batches([rows_to_arrow(table, rows, options, types)])


__all__ = [
    "DEFAULT_OPTIONS",
    "TEXT_TYPE",
    "UNCHANGED_TYPE",
    "ArrowOptions",
    "arrow_schema",
    "arrow_type",
    "framed_to_arrow",
    "numeric_precision_scale",
    "rows_to_arrow",
    "rows_to_table",
]
