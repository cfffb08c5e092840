"""The columnar TupleData path of ``rows_to_arrow`` (EncodedRows decoded column by column with
numpy and Arrow compute) builds exactly the batch the per-value path builds, or raises the same
DecodeError: for every type of issue 3 in text and binary format, NULLs, unchanged TOAST,
empty strings, unicode, infinities, NaN, BC dates, arrays, and malformed bytes.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Sequence
from datetime import date
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.decoding import arrow, columnar
from pgcdc.decoding.arrow import ArrowOptions, rows_to_arrow
from pgcdc.decoding.values import registry_for
from pgcdc.errors import DecodeError
from pgcdc.events import UNCHANGED_TOAST, Column, EncodedRow, RawValue, Table
from tests.conftest import examples

from .test_arrow import DOUBLE, PRECISE, STRING, _raw_rows, _setup
from .test_fast_paths import NUMERIC_10_2, TEXT_FORMS

Rows = list[tuple[RawValue, ...]]


@pytest.fixture(autouse=True)
def always_columnar(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every batch of EncodedRows here takes the columnar path, however few rows it has."""
    monkeypatch.setattr(arrow, "COLUMNAR_MIN_ROWS", 1)


def fresh(rows: Rows) -> list[EncodedRow]:
    """EncodedRows holding only bytes, as the change log hands them out (nothing cached)."""
    return [EncodedRow(EncodedRow.from_values(row).data) for row in rows]


def outcome(build: Any) -> Any:
    try:
        batch = build()
    except DecodeError as exc:
        return ("DecodeError", str(exc))
    return comparable(batch)


def comparable(batch: pa.RecordBatch) -> Any:
    """Schema and values; NaN as text (it is unequal to itself), timestamps as integers (Arrow
    holds BC ones, Python cannot), dates likewise."""
    columns = []
    for column in batch.columns:
        plain = column
        if pa.types.is_timestamp(column.type):
            plain = column.cast(pa.int64())
        elif pa.types.is_date32(column.type):
            plain = column.cast(pa.int32())
        elif pa.types.is_list(column.type) and pa.types.is_timestamp(column.type.value_type):
            plain = column.cast(pa.list_(pa.int64()))
        elif pa.types.is_list(column.type) and pa.types.is_date32(column.type.value_type):
            plain = column.cast(pa.list_(pa.int32()))
        columns.append(repr(plain.to_pylist()))
    return str(batch.schema), columns


def columnar_and_per_value(
    table: Table, rows: Rows, options: ArrowOptions = PRECISE, types: Any = None
) -> tuple[Any, Any]:
    """The batch from fresh EncodedRows (columnar), and from tuples value by value."""
    used: list[bool] = []
    original = columnar.frame_tuples

    def recording(*args: Any) -> Any:
        used.append(True)
        return original(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columnar, "frame_tuples", recording)
        fast = outcome(lambda: rows_to_arrow(table, fresh(rows), options, types))
    assert used
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arrow, "_fast_column", lambda *args: None)
        slow = outcome(lambda: rows_to_arrow(table, rows, options, types))
    return fast, slow


def one_column(type_oid: int, type_modifier: int = -1) -> Table:
    return Table("public", "t", (Column("c", type_oid, type_modifier),))


# --- text format -------------------------------------------------------------------------------

specials = st.one_of(st.none(), st.just(UNCHANGED_TOAST))


@pytest.mark.parametrize("name", sorted(TEXT_FORMS))
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_text_columns_equal_the_per_value_path(name: str, data: st.DataObject) -> None:
    type_oid, type_modifier, forms = TEXT_FORMS[name]
    texts = data.draw(st.lists(st.one_of(specials, forms), min_size=8, max_size=30))
    fast, slow = columnar_and_per_value(one_column(type_oid, type_modifier), [(t,) for t in texts])
    assert fast == slow


ELEMENT = st.one_of(
    st.none(),
    st.text(max_size=6),
    st.sampled_from(["NULL", "null", "a b", 'x"y', "back\\slash", "{}", ",", "ü", ""]),
)
ARRAY_TYPES = {  # array type oid: element strategy giving element text forms
    1009: ELEMENT,  # text[]
    1007: st.integers(-(2**31), 2**31 - 1).map(str),  # int4[]
    1016: st.integers(-(2**63), 2**63 - 1).map(str),  # int8[]
    1000: st.sampled_from(["t", "f"]),  # bool[]
    1182: st.sampled_from(["2024-02-29", "infinity", "0044-03-15 BC", "1999-01-01"]),  # date[]
    1185: st.sampled_from(["2024-01-01 00:00:00+02", "infinity", "2024-06-30 23:59:59.5-07"]),
    2951: st.uuids().map(str),  # uuid[]
}


def array_text(items: list[str | None]) -> str:
    """array_out's form: elements quoted when they need it, NULL bare."""

    def quote(item: str | None) -> str:
        if item is None:
            return "NULL"
        if item == "" or item.upper() == "NULL" or any(c in item for c in '{},"\\ \t\n\r\v\f'):
            return '"' + item.replace("\\", "\\\\").replace('"', '\\"') + '"'
        return item

    return "{" + ",".join(quote(item) for item in items) + "}"


@pytest.mark.parametrize("type_oid", sorted(ARRAY_TYPES))
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_text_arrays_equal_the_per_value_path(type_oid: int, data: st.DataObject) -> None:
    element = ARRAY_TYPES[type_oid]
    arrays = st.lists(st.one_of(st.none(), element), max_size=5).map(array_text)
    odd = st.sampled_from(["{{1,2},{3,4}}", "[0:1]={5,6}", "{}", "{a,,b}", "{ a }", "junk"])
    texts = data.draw(st.lists(st.one_of(specials, arrays, odd), min_size=8, max_size=20))
    fast, slow = columnar_and_per_value(one_column(type_oid), [(t,) for t in texts])
    assert fast == slow


def test_white_space_in_text_arrays() -> None:
    """array_in skips white space around bare elements, the vertical tab too (found by
    hypothesis: the vectorised split kept a bare vertical tab as an element)."""
    texts: list[RawValue] = ["{\v}", "{a\tb}", "{ a ,b}", '{"\v"}', "{\fx}", "{a}"] * 2
    fast, slow = columnar_and_per_value(one_column(1009), [(t,) for t in texts])
    assert fast == slow
    assert rows_to_arrow(one_column(1009), [(t,) for t in texts]).column(0)[0].as_py() == []


def test_bytea_hex_and_escape_forms() -> None:
    texts: list[RawValue] = ["\\x", "\\x00ff", "\\xDEADbeef", None, UNCHANGED_TOAST, "\\x0"] * 3
    fast, slow = columnar_and_per_value(one_column(17), [(t,) for t in texts])
    assert fast == slow
    assert fast[0] == "DecodeError"  # an odd number of hex digits
    texts = ["\\x00ff", "ab\\\\c\\001", None] * 4
    fast, slow = columnar_and_per_value(one_column(17), [(t,) for t in texts])
    assert fast == slow and fast[0] != "DecodeError"


# --- binary format -----------------------------------------------------------------------------

PG_EPOCH_DAYS = date(2000, 1, 1).toordinal()


def pack(fmt: str) -> Any:
    return lambda value: struct.pack(fmt, value)


int64s = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.sampled_from([2**63 - 1, -(2**63), 2**63 - 10**15])
)
BINARY_FORMS: dict[str, tuple[int, int, st.SearchStrategy[bytes]]] = {
    "bool": (16, -1, st.sampled_from([b"\x00", b"\x01"])),
    "int2": (21, -1, st.integers(-(2**15), 2**15 - 1).map(pack(">h"))),
    "int4": (23, -1, st.integers(-(2**31), 2**31 - 1).map(pack(">i"))),
    "int8": (20, -1, st.integers(-(2**63), 2**63 - 1).map(pack(">q"))),
    "oid": (26, -1, st.integers(0, 2**32 - 1).map(pack(">I"))),
    "xid8": (5069, -1, st.integers(0, 2**64 - 1).map(pack(">Q"))),
    "float4": (700, -1, st.floats(width=32).map(pack(">f"))),
    "float8": (701, -1, st.floats().map(pack(">d"))),
    "date": (
        1082,
        -1,
        st.one_of(
            st.integers(-(2**31), 2**31 - 1),
            st.sampled_from([2**31 - 1, -(2**31), 0, -PG_EPOCH_DAYS - 1000]),
        ).map(pack(">i")),
    ),
    "timestamp": (1114, -1, int64s.map(pack(">q"))),
    "timestamptz": (1184, -1, int64s.map(pack(">q"))),
    "uuid": (2950, -1, st.uuids().map(lambda u: u.bytes)),
    "bytea": (17, -1, st.binary(max_size=20)),
    "text": (25, -1, st.text(max_size=20).map(lambda t: t.encode("utf-8", "surrogatepass"))),
    "jsonb": (3802, -1, st.sampled_from([b'\x01{"a": 1}', b"\x01[]", b'\x01"\xc3\xbc"'])),
    "numeric(10,2)": (1700, NUMERIC_10_2, st.sampled_from([b"\0\0\0\0\0\0\0\2", b"\xc0"])),
}


@pytest.mark.parametrize("name", sorted(BINARY_FORMS))
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_binary_columns_equal_the_per_value_path(name: str, data: st.DataObject) -> None:
    type_oid, type_modifier, forms = BINARY_FORMS[name]
    garbled = st.binary(max_size=17)  # wrong lengths, bad bytes: the same DecodeError
    values = st.one_of(specials, forms, forms, garbled) if data.draw(st.booleans()) else forms
    raws = data.draw(st.lists(values, min_size=8, max_size=30))
    fast, slow = columnar_and_per_value(one_column(type_oid, type_modifier), [(r,) for r in raws])
    assert fast == slow


def test_binary_edge_values() -> None:
    uuid_bytes = uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11").bytes
    rows: Rows = [
        (b"\x01", struct.pack(">i", 2**31 - 1), struct.pack(">q", -(2**63)), uuid_bytes, b"")
    ] * 4 + [
        (b"\x00", struct.pack(">i", -(2**31)), struct.pack(">q", 2**63 - 1), None, b"\x00"),
        (None, struct.pack(">i", -800_000), struct.pack(">q", -(10**17)), uuid_bytes, None),
        (UNCHANGED_TOAST, None, UNCHANGED_TOAST, UNCHANGED_TOAST, UNCHANGED_TOAST),
        (b"\x01", struct.pack(">i", 0), struct.pack(">q", 2**63 - 100), uuid_bytes, b"x"),
    ]
    table = Table(
        "public",
        "t",
        tuple(Column(f"c{i}", oid) for i, oid in enumerate((16, 1082, 1184, 2950, 17))),
    )
    fast, slow = columnar_and_per_value(table, rows)
    assert fast == slow
    batch = rows_to_arrow(table, fresh(rows))
    assert batch.column("_pgcdc_unchanged_toast").to_pylist()[6] == ["c0", "c2", "c3", "c4"]
    texts = batch.column("_pgcdc_text").to_pylist()
    assert dict(texts[0]) == {"c1": "infinity", "c2": "-infinity"}
    assert dict(texts[7])["c2"].endswith("+00")  # too late for int64 micros since 1970: text


# --- real servers, every type ------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("options", [PRECISE, DOUBLE, STRING], ids=["precise", "double", "string"])
def test_every_type_from_the_server(db: Any, binary: bool, options: ArrowOptions) -> None:
    with db.connect() as conn:
        table, types = _setup(conn)
        rows = _raw_rows(conn, binary=binary)
    # Ordinary, edge and NULL rows interleaved, some values unchanged TOAST, enough rows for
    # the columnar path.
    many: Rows = []
    for number in range(32):
        row = rows[number % len(rows)]
        if number % 5 == 4:
            row = tuple(UNCHANGED_TOAST if i % 3 == 0 else v for i, v in enumerate(row))
        many.append(row)
    fast, slow = columnar_and_per_value(table, many, options, types)
    assert fast == slow


# --- mixed rows, relations and malformed bytes -------------------------------------------------

MIXED = Table(
    "public",
    "m",
    (
        Column("id", 20, is_key=True),
        Column("name", 25),
        Column("price", 1700, NUMERIC_10_2),
        Column("at", 1184),
        Column("tags", 1009),
    ),
)
MIXED_ROW: tuple[RawValue, ...] = ("1", "grüße ✓ 𝄞", "12.50", "2024-01-01 00:00:00+00", "{a,b}")


def test_encoded_rows_and_null_tuples_mix() -> None:
    """What the Spark executors pass for old rows: EncodedRows and all-NULL tuples."""
    nulls: tuple[RawValue, ...] = (None,) * 5
    rows = [
        EncodedRow.from_values(MIXED_ROW),
        nulls,
        EncodedRow.from_values(("2", "", "NaN", "-infinity", "{}")),
    ] * 4
    batch = rows_to_arrow(MIXED, rows)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arrow, "_fast_column", lambda *args: None)
        expected = rows_to_arrow(MIXED, [tuple(row) for row in rows])
    assert comparable(batch) == comparable(expected)
    assert batch.column("name").to_pylist()[:3] == ["grüße ✓ 𝄞", None, ""]


def test_rows_of_two_relations_keep_their_own_plans() -> None:
    other = Table("public", "o", (Column("id", 23), Column("flag", 16)))
    first = rows_to_arrow(MIXED, fresh([MIXED_ROW] * 10))
    second = rows_to_arrow(other, fresh([("7", "t")] * 10))
    assert first.schema.names[:5] == ["id", "name", "price", "at", "tags"]
    assert second.column("flag").to_pylist() == [True] * 10


def test_wrong_width_raises_like_the_row_path() -> None:
    rows = fresh([MIXED_ROW] * 9 + [MIXED_ROW[:4]])
    with pytest.raises(DecodeError, match="has 4 values but the table has 5 columns"):
        rows_to_arrow(MIXED, rows)


@settings(max_examples=examples(300), deadline=None)
@given(st.data())
def test_mutated_tuple_data_raises_only_decode_errors(data: st.DataObject) -> None:
    rows = [bytearray(EncodedRow.from_values(MIXED_ROW).data) for _ in range(8)]
    target = rows[data.draw(st.integers(0, len(rows) - 1))]
    if data.draw(st.booleans()):
        del target[data.draw(st.integers(0, len(target) - 1)) :]
    for _ in range(data.draw(st.integers(1, 4))):
        if target:
            target[data.draw(st.integers(0, len(target) - 1))] = data.draw(st.integers(0, 255))
    encoded = [EncodedRow(bytes(row)) for row in rows]
    try:
        fast = comparable(rows_to_arrow(MIXED, encoded))
    except DecodeError as exc:
        fast = ("DecodeError", str(exc))
    as_rows: list[Sequence[RawValue]] = list(encoded)
    try:
        slow = comparable(
            arrow._row_batch(MIXED, as_rows, arrow._plan(MIXED, registry_for(None), PRECISE))
        )
    except DecodeError as exc:
        slow = ("DecodeError", str(exc))
    assert fast == slow


# --- binary numeric into decimal128 ----------------------------------------------------------


def numeric_send(text: str) -> bytes:
    """numeric_send's form of ``text``: base-10000 digits from the weight down, dscale kept."""
    special = {"NaN": 0xC000, "Infinity": 0xD000, "-Infinity": 0xF000}
    if text in special:
        return struct.pack(">hhHh", 0, 0, special[text], 0)
    value = Decimal(text)
    dscale = max(0, -int(value.as_tuple().exponent))
    whole, _, fraction = format(abs(value), "f").partition(".")
    whole = whole.lstrip("0")
    whole = whole.rjust(-(-len(whole) // 4) * 4, "0")
    fraction = fraction.ljust(-(-len(fraction) // 4) * 4, "0")
    digits = [int((whole + fraction)[i : i + 4]) for i in range(0, len(whole + fraction), 4)]
    weight = len(whole) // 4 - 1
    while digits and digits[0] == 0:
        digits.pop(0)
        weight -= 1
    while digits and digits[-1] == 0:
        digits.pop()
    sign = 0x4000 if value < 0 else 0
    return struct.pack(f">hhHh{len(digits)}H", len(digits), weight if digits else 0, sign,
                       dscale, *digits)  # fmt: skip


@pytest.mark.parametrize(("precision", "scale"), [(10, 2), (18, 4), (5, 0), (3, 3), (18, 0)])
@settings(max_examples=examples(40), deadline=None)
@given(data=st.data())
def test_binary_numerics_into_decimals_equal_the_per_value_path(
    precision: int, scale: int, data: st.DataObject
) -> None:
    bound = Decimal(10) ** (precision - scale) - Decimal(10) ** -scale
    values = st.decimals(min_value=-bound, max_value=bound, places=scale, allow_nan=False)
    forms = st.one_of(
        values.map(lambda d: format(d, "f")),
        st.sampled_from(["NaN", "Infinity", "-Infinity", "0", "-0"]),
    )
    texts = data.draw(st.lists(st.one_of(specials, forms), min_size=8, max_size=30))
    rows: list[tuple[RawValue, ...]] = [
        (t if t is None or t is UNCHANGED_TOAST else numeric_send(t),) for t in texts
    ]
    type_modifier = ((precision << 16) | scale) + 4
    kernels: list[object] = []
    original = columnar._binary_decimal

    def recording(*args: Any) -> Any:
        kernels.append(result := original(*args))
        return result

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(columnar, "_binary_decimal", recording)
        fast, slow = columnar_and_per_value(one_column(1700, type_modifier), rows)
    assert fast == slow
    if any(isinstance(r[0], bytes) for r in rows):
        assert kernels and kernels[0] is not None  # the kernel built the column


@pytest.mark.parametrize(
    "text",
    [
        "0.005",  # a digit below the column's scale: not this column's value, per value
        "123456789012.00",  # more digits than the precision
    ],
)
def test_binary_numerics_a_decimal_column_cannot_hold_go_per_value(text: str) -> None:
    rows: list[tuple[RawValue, ...]] = [(numeric_send(text),), (numeric_send("1.5"),)] * 8
    fast, slow = columnar_and_per_value(one_column(1700, NUMERIC_10_2), rows)
    assert fast == slow
