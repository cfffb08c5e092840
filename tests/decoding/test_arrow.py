"""The PostgreSQL -> Arrow mapping: schemas, values from real servers (text and binary), the
lossless defaults, and each option."""

from __future__ import annotations

import ipaddress
import struct
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa
import pytest

from pgcdc.decoding.arrow import (
    TEXT_TYPE,
    UNCHANGED_TYPE,
    ArrowOptions,
    arrow_schema,
    arrow_type,
    numeric_precision_scale,
    rows_to_arrow,
    rows_to_table,
)
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.errors import DecodeError
from pgcdc.events import UNCHANGED_TOAST, Column, RawValue, Table


def _numeric_typmod(precision: int, scale: int) -> int:
    return ((precision << 16) | (scale & 0x7FF)) + 4


PRECISE = ArrowOptions()
DOUBLE = ArrowOptions(decimal="double")
STRING = ArrowOptions(decimal="string", temporal="string")

TYPE_CASES: list[tuple[int, int, ArrowOptions, Any]] = [
    (16, -1, PRECISE, pa.bool_()),
    (21, -1, PRECISE, pa.int16()),
    (23, -1, PRECISE, pa.int32()),
    (20, -1, PRECISE, pa.int64()),
    (26, -1, PRECISE, pa.int64()),
    (5069, -1, PRECISE, pa.decimal128(20, 0)),
    (700, -1, PRECISE, pa.float32()),
    (701, -1, PRECISE, pa.float64()),
    (1700, _numeric_typmod(10, 2), PRECISE, pa.decimal128(10, 2)),
    (1700, _numeric_typmod(38, 38), PRECISE, pa.decimal128(38, 38)),
    (1700, _numeric_typmod(39, 2), PRECISE, pa.decimal256(39, 2)),
    (1700, _numeric_typmod(1000, 0), PRECISE, pa.string()),
    (1700, _numeric_typmod(3, -2), PRECISE, pa.decimal128(5, 0)),
    (1700, _numeric_typmod(2, 5), PRECISE, pa.decimal128(5, 5)),
    (1700, -1, PRECISE, pa.string()),
    (1700, _numeric_typmod(10, 2), DOUBLE, pa.float64()),
    (1700, _numeric_typmod(10, 2), STRING, pa.string()),
    (790, -1, PRECISE, pa.decimal128(19, 2)),
    (790, -1, DOUBLE, pa.float64()),
    (25, -1, PRECISE, pa.string()),
    (1043, 9, PRECISE, pa.string()),
    (1042, 9, PRECISE, pa.string()),
    (18, -1, PRECISE, pa.string()),
    (17, -1, PRECISE, pa.binary()),
    (1082, -1, PRECISE, pa.date32()),
    (1083, -1, PRECISE, pa.time64("us")),
    (1266, -1, PRECISE, pa.string()),
    (1114, 3, PRECISE, pa.timestamp("us")),
    (1184, -1, PRECISE, pa.timestamp("us", tz="UTC")),
    (1186, -1, PRECISE, pa.month_day_nano_interval()),
    (1082, -1, STRING, pa.string()),
    (1184, -1, STRING, pa.string()),
    (1186, -1, STRING, pa.string()),
    (2950, -1, PRECISE, pa.string()),
    (114, -1, PRECISE, pa.string()),
    (3802, -1, PRECISE, pa.string()),
    (869, -1, PRECISE, pa.string()),
    (650, -1, PRECISE, pa.string()),
    (829, -1, PRECISE, pa.string()),
    (1562, -1, PRECISE, pa.string()),
    (3220, -1, PRECISE, pa.string()),
    (1007, -1, PRECISE, pa.list_(pa.int32())),
    (1231, _numeric_typmod(5, 1), PRECISE, pa.list_(pa.decimal128(5, 1))),
    (1185, -1, PRECISE, pa.list_(pa.timestamp("us", tz="UTC"))),
    (1009, -1, PRECISE, pa.list_(pa.string())),
    (22, -1, PRECISE, pa.list_(pa.int16())),
    (3904, -1, PRECISE, pa.string()),
    (99999, -1, PRECISE, pa.string()),
]


@pytest.mark.parametrize(("oid", "typmod", "options", "expected"), TYPE_CASES)
def test_arrow_type(oid: int, typmod: int, options: ArrowOptions, expected: Any) -> None:
    assert arrow_type(oid, typmod, options=options) == expected


def test_numeric_typmod_decoding() -> None:
    assert numeric_precision_scale(-1) is None
    assert numeric_precision_scale(_numeric_typmod(12, 3)) == (12, 3)
    assert numeric_precision_scale(_numeric_typmod(3, -2)) == (3, -2)


def test_enum_and_domain_types_through_typeinfo() -> None:
    types = {
        1: TypeInfo(1, "public", "mood", "e"),
        2: TypeInfo(2, "public", "price", "d", base_oid=1700),
        3: TypeInfo(3, "public", "_mood", "b", element_oid=1),
    }
    assert arrow_type(1, types=types) == pa.string()
    assert arrow_type(2, _numeric_typmod(8, 2), types=types) == pa.decimal128(8, 2)
    assert arrow_type(3, types=types) == pa.list_(pa.string())


def test_schema_has_side_columns_and_type_metadata() -> None:
    table = Table("s", "t", (Column("id", 23, is_key=True), Column("n", 1700)))
    schema = arrow_schema(table)
    assert schema.names == ["id", "n", "_pgcdc_unchanged_toast", "_pgcdc_text"]
    assert schema.field("_pgcdc_unchanged_toast").type == UNCHANGED_TYPE
    assert schema.field("_pgcdc_text").type == TEXT_TYPE
    assert schema.field("n").metadata[b"pgcdc.type"] == b"numeric"
    assert schema.field("id").metadata[b"pgcdc.type_oid"] == b"23"
    renamed = arrow_schema(table, options=ArrowOptions(text_column="_as_text"))
    assert renamed.names[-1] == "_as_text"


def test_a_column_named_like_a_side_column_is_refused() -> None:
    table = Table("s", "t", (Column("_pgcdc_text", 25),))
    with pytest.raises(DecodeError, match="text_column"):
        arrow_schema(table)


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="precise"):
        ArrowOptions(decimal="exact")  # type: ignore[arg-type]


# --- values, from real servers ----------------------------------------------------------------

COLUMNS = [
    ("b", "boolean"),
    ("i2", "smallint"),
    ("i8", "bigint"),
    ("o", "oid"),
    ("f4", "real"),
    ("f8", "double precision"),
    ("n", "numeric(10,2)"),
    ("nu", "numeric"),
    ("nb", "numeric(50,5)"),
    ("m", "money"),
    ("t", "text"),
    ("bp", "char(4)"),
    ("by", "bytea"),
    ("d", "date"),
    ("tm", "time"),
    ("ttz", "time with time zone"),
    ("ts", "timestamp"),
    ("tstz", "timestamp with time zone"),
    ("iv", "interval"),
    ("u", "uuid"),
    ("j", "json"),
    ("jb", "jsonb"),
    ("ip", "inet"),
    ("c", "cidr"),
    ("mac", "macaddr"),
    ("bits", "bit varying"),
    ("l", "pg_lsn"),
    ("x8", "xid8"),
    ("ai", "integer[]"),
    ("at", "text[]"),
    ("an", "numeric(5,1)[]"),
    ("ats", "timestamptz[]"),
    ("e", "mood"),
    ("ea", "mood[]"),
    ("dom", "posint"),
]

ORDINARY = [
    "true", "-32768", "9223372036854775807", "4294967295", "1.1", "-0.1", "12345678.91",
    "'1.50'", "'123456789012345678901234567890123456789012.12345'", "'-1234.56'", "'ü ✓'",
    "'ab'", "'\\x00ff'", "'2024-02-29'", "'23:59:59.999999'", "'12:00:00+05:30'",
    "'2024-01-02 03:04:05.123456'", "'2024-01-02 03:04:05+05:45'",
    "'1 year 2 mons -3 days 04:05:06.000007'", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
    "'{\"a\": 1}'", "'{\"a\": 1}'", "'192.168.1.5'", "'10.0.0.0/8'", "'08:00:2b:01:02:03'",
    "B'101'", "'16/B374D848'", "'18446744073709551615'", "'{1,NULL,3}'",
    "ARRAY['a b', NULL, 'x\"y']", "'{1.5,NULL}'", "ARRAY['2024-01-01 00:00:00+00']::timestamptz[]",
    "'happy'", "'{sad,happy}'", "7",
]  # fmt: skip

EDGE = [
    "NULL", "NULL", "NULL", "NULL", "'NaN'", "'-Infinity'", "'NaN'", "'Infinity'", "'NaN'",
    "NULL", "NULL", "NULL", "NULL", "'-infinity'", "'24:00:00'", "'24:00:00-08'",
    "'infinity'", "'4713-01-01 00:00:00+00 BC'", "'-2562047788:00:00'", "NULL", "NULL", "NULL",
    "NULL", "NULL", "NULL", "NULL", "NULL", "NULL", "'{{1,2},{3,4}}'", "'[0:1]={a,b}'",
    "'{NaN}'", "ARRAY['infinity']::timestamptz[]", "NULL", "NULL", "NULL",
]  # fmt: skip


def _setup(conn: psycopg.Connection[Any]) -> tuple[Table, dict[int, TypeInfo]]:
    conn.execute("SET TimeZone = 'America/St_Johns'")
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
    conn.execute("CREATE DOMAIN posint AS integer CHECK (VALUE > 0)")
    columns_sql = ", ".join(f"{name} {sql_type}" for name, sql_type in COLUMNS)
    conn.execute(f"CREATE TABLE a (id serial PRIMARY KEY, {columns_sql})")
    names = ", ".join(name for name, _ in COLUMNS)
    for values in (ORDINARY, EDGE, ["NULL"] * len(COLUMNS)):
        conn.execute(f"INSERT INTO a ({names}) VALUES ({', '.join(values)})")
    rows = conn.execute(
        "SELECT a.attname, a.atttypid, a.atttypmod FROM pg_attribute a "
        "WHERE a.attrelid = 'a'::regclass AND a.attnum > 1 ORDER BY a.attnum"
    ).fetchall()
    table = Table("public", "a", tuple(Column(name, oid, typmod) for name, oid, typmod in rows))
    infos = conn.execute(
        "SELECT t.oid, t.typname, t.typtype, t.typbasetype, t.typelem FROM pg_type t "
        "WHERE t.typname IN ('mood', '_mood', 'posint')"
    ).fetchall()
    types = {
        oid: TypeInfo(oid, "public", name, kind, base_oid=base, element_oid=elem)
        for oid, name, kind, base, elem in infos
    }
    return table, types


def _raw_rows(conn: psycopg.Connection[Any], binary: bool) -> list[tuple[RawValue, ...]]:
    """The rows as the server sends them: text output or binary send, undecoded."""
    cursor = conn.cursor(binary=binary)
    cursor.execute(f"SELECT {', '.join(n for n, _ in COLUMNS)} FROM a ORDER BY id")
    result = cursor.pgresult
    assert result is not None
    rows: list[tuple[RawValue, ...]] = []
    for i in range(result.ntuples):
        row: list[RawValue] = []
        for j in range(result.nfields):
            value = result.get_value(i, j)
            row.append(None if value is None else (bytes(value) if binary else value.decode()))
        rows.append(tuple(row))
    return rows


def _batches(db: Any, options: ArrowOptions) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    with db.connect() as conn:
        table, types = _setup(conn)
        text_rows = _raw_rows(conn, binary=False)
        binary_rows = _raw_rows(conn, binary=True)
    return (
        rows_to_arrow(table, text_rows, options, types),
        rows_to_arrow(table, binary_rows, options, types),
    )


def _assert_same(left: pa.RecordBatch, right: pa.RecordBatch) -> None:
    """Equal schemas and values, NaN equal to NaN (which Arrow's equals does not allow)."""
    assert left.schema == right.schema
    for name in left.schema.names:
        assert repr(_py(left.column(name))) == repr(_py(right.column(name))), name


def _py(column: pa.Array) -> list[Any]:
    """Python values; timestamps as integers, since Arrow holds BC ones and Python cannot."""
    if pa.types.is_timestamp(column.type):
        column = column.cast(pa.int64())
    return list(column.to_pylist())


def test_precise_values_from_text_and_binary(db: Any) -> None:
    from_text, from_binary = _batches(db, PRECISE)
    _assert_same(from_text, from_binary)
    assert from_text.schema.field("n").type == pa.decimal128(10, 2)
    assert from_text.schema.field("nb").type == pa.decimal256(50, 5)
    bc_tstz = from_text.column("tstz").cast(pa.int64())[1].as_py()
    # 4713 BC fits Arrow's int64 microseconds, so it stays typed. 400 Gregorian years are
    # 146097 days, and 4713 BC (astronomical year -4712) is 88 AD less 12 such cycles.
    days = date(88, 1, 1).toordinal() - 12 * 146097 - date(1970, 1, 1).toordinal()
    assert bc_tstz == days * 86_400_000_000
    ordinary, edge, nulls = (
        from_text.set_column(
            from_text.schema.get_field_index("tstz"),
            "tstz",
            pa.array([from_text.column("tstz")[0].as_py(), None, None], pa.timestamp("us", "UTC")),
        )
    ).to_pylist()
    expected = {
        "b": True,
        "i2": -32768,
        "i8": 2**63 - 1,
        "o": 4294967295,
        "f4": pytest.approx(1.1, rel=1e-7),
        "f8": -0.1,
        "n": Decimal("12345678.91"),
        "nu": "1.50",
        "nb": Decimal("123456789012345678901234567890123456789012.12345"),
        "m": Decimal("-1234.56"),
        "t": "ü ✓",
        "bp": "ab  ",
        "by": b"\x00\xff",
        "d": date(2024, 2, 29),
        "tm": time(23, 59, 59, 999999),
        "ttz": "12:00:00+05:30",
        "ts": datetime(2024, 1, 2, 3, 4, 5, 123456),
        "tstz": datetime(2024, 1, 1, 21, 19, 5, tzinfo=UTC),
        "iv": pa.MonthDayNano([14, -3, (4 * 3600 + 5 * 60 + 6) * 10**9 + 7000]),
        "u": str(uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11")),
        "j": '{"a": 1}',
        "jb": '{"a": 1}',
        "ip": str(ipaddress.ip_address("192.168.1.5")),
        "c": "10.0.0.0/8",
        "mac": "08:00:2b:01:02:03",
        "bits": "101",
        "l": "16/B374D848",
        "x8": Decimal(2**64 - 1),
        "ai": [1, None, 3],
        "at": ["a b", None, 'x"y'],
        "an": [Decimal("1.5"), None],
        "ats": [datetime(2024, 1, 1, tzinfo=UTC)],
        "e": "happy",
        "ea": ["sad", "happy"],
        "dom": 7,
        "_pgcdc_unchanged_toast": [],
        "_pgcdc_text": None,
    }
    assert ordinary == expected
    # Values the typed columns cannot hold: null there, their text in _pgcdc_text.
    specials = dict(edge.pop("_pgcdc_text"))
    assert specials == {
        "n": "NaN",
        "nb": "NaN",
        "d": "-infinity",
        "tm": "24:00:00",
        "ts": "infinity",
        "iv": "-2562047788:00:00",  # beyond int64 nanoseconds
        "ai": "{{1,2},{3,4}}",
        "at": "[0:1]={a,b}",
        "an": "{NaN}",
        "ats": "{infinity}",
    }
    for name in specials:
        assert edge[name] is None
    assert edge["nu"] == "Infinity"  # unconstrained numeric is a string: kept as is
    assert edge["ttz"] == "24:00:00-08"
    assert edge["f4"] != edge["f4"] and edge["f8"] == float("-inf")
    assert all(v is None for k, v in nulls.items() if k != "_pgcdc_unchanged_toast")
    # BC timestamps fit Arrow's range: they stay typed, exactly.
    bc = rows_to_arrow(
        Table("s", "t", (Column("ts", 1114),)), [("0044-03-15 12:00:00 BC",)]
    ).column(0)
    # 400 Gregorian years are 146097 days, so 44 BC (year -43) is 357 AD less one cycle.
    days_since_1970 = date(357, 3, 15).toordinal() - 146097 - date(1970, 1, 1).toordinal()
    assert bc.cast(pa.int64())[0].as_py() == days_since_1970 * 86_400_000_000 + 43_200_000_000


def test_string_options_keep_everything_typed_as_text(db: Any) -> None:
    from_text, from_binary = _batches(db, STRING)
    _assert_same(from_text, from_binary)
    ordinary, edge, _ = from_text.to_pylist()
    assert ordinary["n"] == "12345678.91"
    assert ordinary["m"] == "-1234.56"
    assert ordinary["tstz"] == "2024-01-01 21:19:05+00"
    assert ordinary["ts"] == "2024-01-02 03:04:05.123456"
    assert ordinary["iv"] == "1 year 2 mons -3 days +04:05:06.000007"
    assert ordinary["an"] == ["1.5", None]
    assert edge["n"] == "NaN" and edge["d"] == "-infinity" and edge["tm"] == "24:00:00"
    assert edge["iv"] == "-2562047788:00:00"
    assert dict(edge["_pgcdc_text"]) == {"ai": "{{1,2},{3,4}}", "at": "[0:1]={a,b}"}


def test_double_option(db: Any) -> None:
    from_text, from_binary = _batches(db, DOUBLE)
    _assert_same(from_text, from_binary)
    ordinary, edge, _ = from_text.drop_columns(["tstz"]).to_pylist()
    assert from_text.schema.field("n").type == pa.float64()
    assert ordinary["n"] == 12345678.91 and ordinary["m"] == -1234.56
    assert edge["n"] != edge["n"] and edge["nu"] == float("inf")  # NaN and Infinity as floats
    assert "n" not in dict(edge["_pgcdc_text"])


def test_unchanged_toast_is_distinct_from_null() -> None:
    table = Table("s", "t", (Column("id", 23), Column("doc", 25), Column("note", 25)))
    batch = rows_to_arrow(
        table,
        [("1", UNCHANGED_TOAST, None), ("2", "x", UNCHANGED_TOAST), ("3", None, None)],
    )
    rows = batch.to_pylist()
    assert [r["_pgcdc_unchanged_toast"] for r in rows] == [["doc"], ["note"], []]
    assert rows[0]["doc"] is None and rows[0]["note"] is None
    assert rows[1]["doc"] == "x"
    assert rows_to_table(table, []).num_rows == 0


def test_rows_with_the_wrong_width_or_bad_values_raise() -> None:
    table = Table("s", "t", (Column("id", 23), Column("at", 1184)))
    with pytest.raises(DecodeError, match="2 columns"):
        rows_to_arrow(table, [("1",)])
    with pytest.raises(DecodeError, match=r"timestamptz.*'at' of s\.t"):
        rows_to_arrow(table, [("1", "soon")])
    with pytest.raises(DecodeError, match="text format"):  # tsvector: no binary decoder
        rows_to_arrow(Table("s", "v", (Column("v", 3614),)), [(b"\x00\x00\x00\x00",)])
    empty = rows_to_arrow(Table("s", "r", (Column("r", 3904),)), [(b"\x01",)])
    assert empty.column(0).to_pylist() == ["empty"]  # int4range's binary form, printed


def test_binary_timestamps_near_arrow_limits() -> None:
    table = Table("s", "t", (Column("ts", 1184),))
    last_pg = struct.pack(">q", 9223371331200000000 - 1)  # 294276-12-31 23:59:59.999999 UTC
    near_epoch = struct.pack(">q", -946_684_800_000_000)  # 1970-01-01
    batch = rows_to_arrow(table, [(last_pg,), (near_epoch,)])
    assert batch.column(0)[1].as_py() == datetime(1970, 1, 1, tzinfo=UTC)
    # Beyond int64 microseconds since 1970: kept as text.
    assert batch.column(0)[0].as_py() is None
    assert dict(batch.column(2)[0].as_py()) == {"ts": "294276-12-31 23:59:59.999999+00"}


def test_bytes_like_input_is_accepted() -> None:
    table = Table("s", "t", (Column("id", 23), Column("name", 25)))
    batch = rows_to_arrow(table, [(memoryview(b"\x00\x00\x00\x03"), bytearray(b"x"))])  # type: ignore[list-item]
    assert batch.to_pylist()[0]["id"] == 3 and batch.to_pylist()[0]["name"] == "x"
