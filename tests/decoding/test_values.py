"""Codecs on literal text and binary fixtures: every type, its edge values, and bad input."""

from __future__ import annotations

import ipaddress
import math
import struct
import uuid
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.decoding.values import (
    BoundedList,
    Interval,
    PgDate,
    PgTime,
    PgTimestamp,
    TypeRegistry,
    pg_text,
    row_to_python,
    to_python,
)
from pgcdc.errors import DecodeError, PgcdcError
from pgcdc.events import UNCHANGED_TOAST, Column, Table
from pgcdc.lsn import LSN

BOOL, BYTEA, CHAR, NAME, INT8, INT2, INT4, TEXT, OID, XID = 16, 17, 18, 19, 20, 21, 23, 25, 26, 28
JSON, CIDR, FLOAT4, FLOAT8, MACADDR8, MONEY, MACADDR, INET = 114, 650, 700, 701, 774, 790, 829, 869
BPCHAR, VARCHAR, DATE, TIME, TIMESTAMP, TIMESTAMPTZ = 1042, 1043, 1082, 1083, 1114, 1184
INTERVAL, TIMETZ, BIT, VARBIT, NUMERIC, UUID, PG_LSN, JSONB = (
    1186,
    1266,
    1560,
    1562,
    1700,
    2950,
    3220,
    3802,
)
XID8, INT4_ARRAY, TEXT_ARRAY, INT2VECTOR, BOX_ARRAY = 5069, 1007, 1009, 22, 1020


def _numeric(weight: int, sign: int, dscale: int, *digits: int) -> bytes:
    return struct.pack(f">hhHh{len(digits)}H", len(digits), weight, sign, dscale, *digits)


def _array(element_oid: int, dims: list[tuple[int, int]], items: list[bytes | None]) -> bytes:
    """array_send, written out by hand."""
    out = struct.pack(">iiI", len(dims), int(any(i is None for i in items)), element_oid)
    for size, lower in dims:
        out += struct.pack(">ii", size, lower)
    for item in items:
        out += struct.pack(">i", -1) if item is None else struct.pack(">i", len(item)) + item
    return out


DAY = 86_400_000_000


def _days(day: date) -> int:
    """Days since 2000-01-01, PostgreSQL's date epoch."""
    return day.toordinal() - date(2000, 1, 1).toordinal()


TEXT_CASES: list[tuple[int, str, Any]] = [
    (BOOL, "t", True),
    (BOOL, "f", False),
    (INT2, "-32768", -32768),
    (INT4, "2147483647", 2147483647),
    (INT8, "-9223372036854775808", -(2**63)),
    (OID, "4294967295", 4294967295),
    (XID, "12345", 12345),
    (XID8, "18446744073709551615", 2**64 - 1),
    (FLOAT8, "Infinity", math.inf),
    (FLOAT8, "-Infinity", -math.inf),
    (FLOAT8, "1.7976931348623157e+308", 1.7976931348623157e308),
    (FLOAT4, "1.1", 1.1),
    (NUMERIC, "1.50", Decimal("1.50")),
    (NUMERIC, "Infinity", Decimal("Infinity")),
    (NUMERIC, "-Infinity", Decimal("-Infinity")),
    (NUMERIC, "-0.000000000000000000000000000000000000000001", Decimal("-1e-42")),
    (NUMERIC, "1" + "0" * 60 + ".5", Decimal("1" + "0" * 60 + ".5")),
    (MONEY, "$1,234.56", Decimal("1234.56")),
    (MONEY, "-$0.01", Decimal("-0.01")),
    (MONEY, "-$92,233,720,368,547,758.08", Decimal("-92233720368547758.08")),
    (TEXT, "ünï ✓ 😀", "ünï ✓ 😀"),
    (VARCHAR, "", ""),
    (BPCHAR, "ab   ", "ab   "),
    (NAME, "pg_class", "pg_class"),
    (CHAR, "a", "a"),
    (CHAR, "\\200", "\x80"),
    (BYTEA, "\\x00ff5c", b"\x00\xff\\"),
    (BYTEA, "\\x", b""),
    (BYTEA, "abc\\\\\\000\\377", b"abc\\\x00\xff"),  # escape format
    (DATE, "2024-02-29", date(2024, 2, 29)),
    (DATE, "0001-01-01", date(1, 1, 1)),
    (DATE, "0001-12-31 BC", PgDate(_days(date(1, 1, 1)) - 1)),
    (DATE, "infinity", PgDate(2**31 - 1)),
    (DATE, "-infinity", PgDate(-(2**31))),
    (TIME, "23:59:59.999999", time(23, 59, 59, 999999)),
    (TIME, "24:00:00", PgTime(86_400_000_000)),
    (TIMETZ, "12:34:56.5+05:30", time(12, 34, 56, 500000, timezone(timedelta(hours=5.5)))),
    (TIMETZ, "24:00:00-08", PgTime(86_400_000_000, -8 * 3600)),
    (TIMESTAMP, "2024-01-02 03:04:05.123456", datetime(2024, 1, 2, 3, 4, 5, 123456)),
    (TIMESTAMP, "9999-12-31 23:59:59.999999", datetime(9999, 12, 31, 23, 59, 59, 999999)),
    (TIMESTAMP, "infinity", PgTimestamp(2**63 - 1)),
    # 400 Gregorian years are exactly 146097 days: 44 BC (year -43) is 357 AD less one cycle.
    (
        TIMESTAMP,
        "0044-03-15 12:00:00 BC",
        PgTimestamp((_days(date(357, 3, 15)) - 146097) * DAY + DAY // 2),
    ),
    (TIMESTAMP, "10000-01-01 00:00:00", PgTimestamp((_days(date(9999, 12, 31)) + 1) * DAY)),
    (TIMESTAMPTZ, "2024-01-02 03:04:05+05:45", datetime(2024, 1, 1, 21, 19, 5, tzinfo=UTC)),
    (TIMESTAMPTZ, "1800-01-01 00:00:00+00:19:32", datetime(1799, 12, 31, 23, 40, 28, tzinfo=UTC)),
    (
        TIMESTAMPTZ,
        "0001-01-01 04:00:00+05",
        PgTimestamp(_days(date(1, 1, 1)) * DAY - DAY // 24, True),
    ),
    (TIMESTAMPTZ, "-infinity", PgTimestamp(-(2**63), True)),
    (INTERVAL, "00:00:00", Interval(0, 0, 0)),
    (INTERVAL, "1 year 2 mons 3 days 04:05:06.789", Interval(14, 3, 14_706_789_000)),
    (INTERVAL, "-1 years -2 mons +3 days -04:05:06", Interval(-14, 3, -14_706_000_000)),
    (INTERVAL, "-00:00:00.000001", Interval(0, 0, -1)),
    (INTERVAL, "-178000000 years", Interval(-2_136_000_000, 0, 0)),
    (INTERVAL, "2562047788:00:54.775807", Interval(0, 0, 2**63 - 1)),
    (INTERVAL, "P1Y2M3DT4H5M6.5S", Interval(14, 3, 14_706_500_000)),
    (INTERVAL, "P-1Y-2M3DT-4H-5M-6.5S", Interval(-14, 3, -14_706_500_000)),
    (INTERVAL, "infinity", Interval(2**31 - 1, 2**31 - 1, 2**63 - 1)),
    (
        UUID,
        "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11",
        uuid.UUID("a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
    ),
    (JSON, '{"b": 1, "a": 1.0000000000000000001}', '{"b": 1, "a": 1.0000000000000000001}'),
    (JSONB, '{"a": [1, null]}', '{"a": [1, null]}'),
    (INET, "192.168.1.5", ipaddress.ip_interface("192.168.1.5/32")),
    (INET, "2001:db8::1/64", ipaddress.ip_interface("2001:db8::1/64")),
    (CIDR, "2001:db8::/32", ipaddress.ip_network("2001:db8::/32")),
    (MACADDR, "08:00:2b:01:02:03", "08:00:2b:01:02:03"),
    (MACADDR8, "08:00:2b:ff:fe:01:02:03", "08:00:2b:ff:fe:01:02:03"),
    (BIT, "10101", "10101"),
    (VARBIT, "", ""),
    (PG_LSN, "16/B374D848", LSN(0x16B374D848)),
    (INT4_ARRAY, "{}", []),
    (INT4_ARRAY, "{1,NULL,-3}", [1, None, -3]),
    (INT4_ARRAY, "{{1,2},{3,4}}", [[1, 2], [3, 4]]),
    (INT4_ARRAY, "[0:1]={5,6}", BoundedList([5, 6], (0,))),
    (INT4_ARRAY, "[-1:0][1:1]={{5},{6}}", BoundedList([[5], [6]], (-1, 1))),
    (
        TEXT_ARRAY,
        '{"a b","",NULL,"NULL","x\\"y","back\\\\slash","{}",",",ü}',
        ["a b", "", None, "NULL", 'x"y', "back\\slash", "{}", ",", "ü"],
    ),
    (TEXT_ARRAY, "{ a , b c }", ["a", "b c"]),
    (BOX_ARRAY, "{(1,1),(0,0);(3,3),(2,2)}", ["(1,1),(0,0)", "(3,3),(2,2)"]),
    (INT2VECTOR, "1 2 3", [1, 2, 3]),
    (1009 + 100000, "whatever (unknown)", "whatever (unknown)"),
    (3904, "[1,10)", "[1,10)"),  # int4range: text
]


@pytest.mark.parametrize(("oid", "text", "expected"), TEXT_CASES)
def test_text(oid: int, text: str, expected: Any) -> None:
    value = to_python(text, oid)
    assert value == expected
    assert type(value) is type(expected)
    if isinstance(expected, list):
        assert value == expected and repr(value) == repr(expected)


def test_text_nan() -> None:
    assert math.isnan(to_python("NaN", FLOAT8))
    assert math.isnan(to_python("NaN", FLOAT4))
    assert to_python("NaN", NUMERIC).is_nan()


BINARY_CASES: list[tuple[int, bytes, Any]] = [
    (BOOL, b"\x01", True),
    (INT2, struct.pack(">h", -32768), -32768),
    (INT4, struct.pack(">i", -5), -5),
    (INT8, struct.pack(">q", 2**63 - 1), 2**63 - 1),
    (OID, struct.pack(">I", 4294967295), 4294967295),
    (XID8, struct.pack(">Q", 2**64 - 1), 2**64 - 1),
    (FLOAT4, struct.pack(">f", 1.1), 1.1),  # the float4out digits, as text gives
    (FLOAT4, struct.pack(">f", 3.4028234663852886e38), 3.4028235e38),
    (FLOAT8, struct.pack(">d", -math.inf), -math.inf),
    (NUMERIC, _numeric(0, 0, 2, 1, 5000), Decimal("1.50")),
    (NUMERIC, _numeric(1, 0x4000, 3, 1, 2345, 6780), Decimal("-12345.678")),
    (NUMERIC, _numeric(0, 0, 0), Decimal("0")),
    (NUMERIC, _numeric(0, 0, 4), Decimal("0.0000")),
    (NUMERIC, _numeric(25, 0, 0, 1), Decimal("1" + "0" * 100)),
    (NUMERIC, _numeric(-11, 0, 42, 1000), Decimal("1.0E-41")),  # dscale 42
    (NUMERIC, _numeric(0, 0xD000, 0), Decimal("Infinity")),
    (NUMERIC, _numeric(0, 0xF000, 0), Decimal("-Infinity")),
    (MONEY, struct.pack(">q", -(2**63)), Decimal("-92233720368547758.08")),
    (TEXT, "ünï ✓".encode(), "ünï ✓"),
    (CHAR, b"\x80", "\x80"),
    (CHAR, b"\x00", ""),
    (BYTEA, b"\x00\\\xff", b"\x00\\\xff"),
    (DATE, struct.pack(">i", 0), date(2000, 1, 1)),
    (DATE, struct.pack(">i", -730486), PgDate(-730486)),
    (DATE, struct.pack(">i", 2**31 - 1), PgDate(2**31 - 1)),
    (TIME, struct.pack(">q", 86_400_000_000), PgTime(86_400_000_000)),
    (TIME, struct.pack(">q", 1), time(0, 0, 0, 1)),
    (TIMETZ, struct.pack(">qi", 0, -19800), time(0, 0, tzinfo=timezone(timedelta(hours=5.5)))),
    (TIMESTAMP, struct.pack(">q", 1), datetime(2000, 1, 1, 0, 0, 0, 1)),
    (TIMESTAMP, struct.pack(">q", -(2**63)), PgTimestamp(-(2**63))),
    (TIMESTAMPTZ, struct.pack(">q", 0), datetime(2000, 1, 1, tzinfo=UTC)),
    (TIMESTAMPTZ, struct.pack(">q", 2**63 - 1), PgTimestamp(2**63 - 1, True)),
    (INTERVAL, struct.pack(">qii", -1, -2, -3), Interval(-3, -2, -1)),
    (UUID, bytes(range(16)), uuid.UUID(bytes=bytes(range(16)))),
    (JSON, b'{"a": 1}', '{"a": 1}'),
    (JSONB, b'\x01{"a": 1}', '{"a": 1}'),
    (INET, bytes([2, 24, 0, 4, 192, 168, 1, 5]), ipaddress.ip_interface("192.168.1.5/24")),
    (
        INET,
        bytes([3, 64, 0, 16]) + ipaddress.ip_address("2001:db8::1").packed,
        ipaddress.ip_interface("2001:db8::1/64"),
    ),
    (CIDR, bytes([2, 8, 1, 4, 10, 0, 0, 0]), ipaddress.ip_network("10.0.0.0/8")),
    (MACADDR, bytes([8, 0, 0x2B, 1, 2, 3]), "08:00:2b:01:02:03"),
    (MACADDR8, bytes(range(8)), "00:01:02:03:04:05:06:07"),
    (BIT, struct.pack(">i", 9) + bytes([0b10101010, 0b10000000]), "101010101"),
    (VARBIT, struct.pack(">i", 0), ""),
    (PG_LSN, struct.pack(">Q", 0x16B374D848), LSN(0x16B374D848)),
    (INT4_ARRAY, _array(INT4, [], []), []),
    (
        INT4_ARRAY,
        _array(INT4, [(3, 1)], [struct.pack(">i", 1), None, struct.pack(">i", -3)]),
        [1, None, -3],
    ),
    (
        INT4_ARRAY,
        _array(INT4, [(2, 1), (2, 1)], [struct.pack(">i", i) for i in (1, 2, 3, 4)]),
        [[1, 2], [3, 4]],
    ),
    (
        INT4_ARRAY,
        _array(INT4, [(2, 0)], [struct.pack(">i", 5), struct.pack(">i", 6)]),
        BoundedList([5, 6], (0,)),
    ),
    (TEXT_ARRAY, _array(TEXT, [(2, 1)], [b'x"y\\', None]), ['x"y\\', None]),
    # int4range [1,10): range_send's flags (lower inclusive), then each bound length-prefixed
    (3904, b"\x02\x00\x00\x00\x04\x00\x00\x00\x01\x00\x00\x00\x04\x00\x00\x00\x0a", "[1,10)"),
    (123456, b"\xde\xad", b"\xde\xad"),  # unknown type: the bytes, untouched
]


@pytest.mark.parametrize(("oid", "data", "expected"), BINARY_CASES)
def test_binary(oid: int, data: bytes, expected: Any) -> None:
    value = to_python(data, oid)
    assert value == expected
    assert type(value) is type(expected)
    if isinstance(expected, Decimal):
        assert str(value) == str(expected)  # the same scale, not only the same number


def test_binary_nan() -> None:
    assert to_python(_numeric(0, 0xC000, 0), NUMERIC).is_nan()
    assert math.isnan(to_python(struct.pack(">f", math.nan), FLOAT4))


def test_null_and_unchanged_toast_pass_through() -> None:
    assert to_python(None, INT4) is None
    assert to_python(UNCHANGED_TOAST, INT4) is UNCHANGED_TOAST


BAD: list[tuple[int, str | bytes, str]] = [
    (INT4, "12x", "int4"),
    (BOOL, "maybe", "bool"),
    (BOOL, b"\x02", "bool"),
    (INT4, b"\x00\x01", "int4"),
    (NUMERIC, "1.2.3", "numeric"),
    (NUMERIC, b"\x00\x01", "numeric"),
    (NUMERIC, _numeric(0, 0, 0, 10000), "numeric"),
    (DATE, "2024-02-30", "date"),
    (DATE, "01/02/2024", "date"),
    (TIMESTAMP, "2024-01-02T03:04:05 junk", "timestamp"),
    (TIME, "25:61:00", "time"),
    (INTERVAL, "3 fortnights", "interval"),
    (UUID, "not-a-uuid", "uuid"),
    (JSONB, b"\x02{}", "jsonb"),
    (INET, "300.1.1.1", "inet"),
    (INET, bytes([9, 0, 0, 4, 1, 2, 3, 4]), "inet"),
    (MACADDR, "08:00:2b", "macaddr"),
    (BIT, "102", "bit"),
    (BIT, struct.pack(">i", 20) + b"\x00", "bit"),
    (PG_LSN, "nope", "pg_lsn"),
    (TEXT, b"\xff\xfe", "text"),
    (BYTEA, "\\xzz", "bytea"),
    (INT4_ARRAY, "{1,2", "_int4"),
    (INT4_ARRAY, "{1,,2}", "_int4"),
    (INT4_ARRAY, "{1,x}", "_int4"),
    (INT4_ARRAY, _array(INT4, [(3, 1)], [struct.pack(">i", 1)]), "_int4"),
    (MONEY, "$12.3", "money"),
]


@pytest.mark.parametrize(("oid", "raw", "type_name"), BAD)
def test_malformed_input_raises_decode_error(oid: int, raw: str | bytes, type_name: str) -> None:
    with pytest.raises(DecodeError) as caught:
        to_python(raw, oid)
    message = str(caught.value)
    assert type_name in message
    assert repr(raw)[:20] in message
    assert isinstance(caught.value, PgcdcError)


def test_long_values_are_truncated_in_errors() -> None:
    with pytest.raises(DecodeError) as caught:
        to_python("9" * 10_000 + "x", INT8)
    assert len(str(caught.value)) < 300
    assert "..." in str(caught.value)


# --- rows and the registry ---------------------------------------------------------------------

TABLE = Table(
    "public",
    "t",
    (Column("id", INT4, is_key=True), Column("body", TEXT), Column("at", TIMESTAMPTZ)),
)


def test_row_to_python_mixes_formats_and_markers() -> None:
    row = ("1", UNCHANGED_TOAST, struct.pack(">q", 0))
    assert row_to_python(TABLE, row) == (1, UNCHANGED_TOAST, datetime(2000, 1, 1, tzinfo=UTC))
    assert row_to_python(TABLE, (b"\x00\x00\x00\x02", None, "infinity")) == (
        2,
        None,
        PgTimestamp(2**63 - 1, True),
    )


def test_row_errors_name_the_column() -> None:
    with pytest.raises(DecodeError, match=r"column 'at' of public\.t"):
        row_to_python(TABLE, ("1", "x", "yesterday"))
    with pytest.raises(DecodeError, match="3 columns"):
        row_to_python(TABLE, ("1", "x"))


MOOD = TypeInfo(70001, "public", "mood", "e")
MOOD_ARRAY = TypeInfo(70002, "public", "_mood", "b", element_oid=70001)
POSINT = TypeInfo(70003, "public", "posint", "d", base_oid=INT4)
POSINT_DOMAIN = TypeInfo(70004, "public", "posint2", "d", base_oid=70003)
PAIR = TypeInfo(70005, "public", "pair", "c")


def test_typeinfo_enum_domain_array_composite() -> None:
    types = {t.oid: t for t in (MOOD, MOOD_ARRAY, POSINT, POSINT_DOMAIN, PAIR)}
    assert to_python("happy", 70001, types=types) == "happy"
    assert to_python(b"happy", 70001, types=types) == "happy"
    assert to_python('{sad,"o k"}', 70002, types=types) == ["sad", "o k"]
    assert to_python(_array(70001, [(1, 1)], [b"sad"]), 70002, types=types) == ["sad"]
    assert to_python("7", 70004, types=types) == 7  # a domain over a domain over int4
    assert to_python(struct.pack(">i", 7), 70003, types=types) == 7
    assert to_python('(1,"x y")', 70005, types=types) == '(1,"x y")'
    # Without the TypeInfo the enum is an unknown type: text stays text, nothing crashes.
    assert to_python(b"happy", 70001) == b"happy"


def test_registry_sees_types_added_later() -> None:
    types: dict[int, TypeInfo] = {}
    registry = TypeRegistry(types)
    table = Table("public", "m", (Column("p", 70003),))
    assert registry.row_to_python(table, ("5",)) == ("5",)  # unknown so far: text
    types[POSINT.oid] = POSINT
    assert registry.row_to_python(table, ("5",)) == (5,)


def test_money_fraction_digits_setting() -> None:
    yen = TypeRegistry(money_fraction_digits=0)
    assert yen.to_python("￥1,235", MONEY) == Decimal(1235)
    assert yen.to_python(struct.pack(">q", 1235), MONEY) == Decimal(1235)


# --- back to text ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("oid", "text"),
    [
        (DATE, "0044-03-15 BC"),
        (DATE, "infinity"),
        (TIMESTAMP, "0044-03-15 12:00:00.5 BC"),
        (TIMESTAMP, "294276-12-31 23:59:59.999999"),
        (TIMESTAMPTZ, "2024-01-02 03:04:05.25+00"),
        (TIMESTAMPTZ, "4713-01-01 00:00:00+00 BC"),
        (TIME, "24:00:00"),
        (TIMETZ, "12:00:00+05:30"),
        (INTERVAL, "1 year 2 mons -3 days +04:05:06.5"),
        (INTERVAL, "-00:00:00.000001"),
        (INTERVAL, "-infinity"),
        (NUMERIC, "0.0000001"),
        (NUMERIC, "NaN"),
        (INET, "192.168.1.5"),
        (INT4_ARRAY, "[0:1]={5,6}"),
        (TEXT_ARRAY, '{"a b",NULL,"NULL","x\\"y","back\\\\slash",""}'),
        (BYTEA, "\\x00ff"),
    ],
)
def test_pg_text_gives_the_server_text_back(oid: int, text: str) -> None:
    assert pg_text(to_python(text, oid)) == text


def test_interval_as_timedelta_matches_psycopg_convention() -> None:
    assert Interval(14, 3, 1).as_timedelta() == timedelta(days=365 + 60 + 3, microseconds=1)
    assert Interval(-14, 0, 0).as_timedelta() == timedelta(days=-(365 + 60))


def test_bytes_like_input_is_accepted() -> None:
    table = Table("public", "b", (Column("id", INT4), Column("name", TEXT)))
    row = (memoryview(struct.pack(">i", 3)), bytearray(b"x"))
    assert row_to_python(table, row) == (3, "x")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("interval", "server_text"),
    [  # interval_out's text under IntervalStyle=postgres (PostgreSQL 15)
        (Interval(0, -1, 7_200_000_000), "-1 days +02:00:00"),
        (Interval(-1, -1, 0), "-1 mons -1 days"),
        (Interval(-1, 2, 10_800_000_000), "-1 mons +2 days 03:00:00"),
        (Interval(-1, 2, -10_800_000_000), "-1 mons +2 days -03:00:00"),
        (Interval(1, -1, 1), "1 mon -1 days +00:00:00.000001"),
        (Interval(-24, -1, 0), "-2 years -1 days"),
        (Interval(-13, -1, -1_000_000), "-1 years -1 mons -1 days -00:00:01"),
        (Interval(13, 1, 1), "1 year 1 mon 1 day 00:00:00.000001"),
        (Interval(0, 1, -7_200_000_000), "1 day -02:00:00"),
    ],
)
def test_interval_text_is_what_the_server_prints(interval: Interval, server_text: str) -> None:
    """A composite's or range's binary interval is printed by pgcdc: it must be the server's
    text, or a binary-mode row would differ from the text-mode one."""
    assert str(interval) == server_text
    assert TypeRegistry().codec(1186).text(server_text) == interval
