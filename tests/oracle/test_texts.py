"""The oracle's lake-side converters against PostgreSQL itself (PG15 and PG18): Arrow values,
as the Delta tables hold them, go through ``compare.lake_texts`` and must print exactly what
PostgreSQL computes from the same integers or literals, at the edges of each type's range."""

from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import psycopg
import pyarrow as pa

from pgcdc.sinks.schema import INTERVAL_STRUCT
from tests.conftest import Database

from .compare import PgColumn, fix_settings, lake_texts

# Days since 1970-01-01: PostgreSQL's first and last date, around year 1, 9999/10000, epoch.
EDGE_DAYS = [-2440550, -719893, -719528, -719162, -1, 0, 1, 2932896, 2932897, 2145042905]
MICROS_PER_DAY = 86_400_000_000


def _texts(conn: psycopg.Connection[Any], type_sql: str, array: pa.Array) -> list[str | None]:
    column = PgColumn("v", type_sql, "")
    return [row[0] for row in lake_texts(conn, [column], pa.table({"v": array}))]


def _pg(conn: psycopg.Connection[Any], query: str, params: Any) -> list[str]:
    """PostgreSQL's own output for each row of ``query`` (as text, via the output function)."""
    cursor = conn.execute(query, params)
    result = cursor.pgresult
    assert result is not None
    return [bytes(result.get_value(i, 0) or b"").decode() for i in range(result.ntuples)]


def test_dates_and_timestamps_at_every_range_edge(db: Database) -> None:
    rng = random.Random(5)
    days = EDGE_DAYS + [rng.randint(-2440550, 2145042905) for _ in range(300)]
    with db.connect() as conn:
        fix_settings(conn)
        expected = _pg(
            conn, "SELECT '1970-01-01'::date + d FROM unnest(%s::int[]) WITH ORDINALITY u(d, n) "
            "ORDER BY n", (days,),
        )  # fmt: skip
        assert _texts(conn, "date", pa.array(days, pa.int32()).cast(pa.date32())) == expected

        # int64 microseconds since 1970 end ~30 years before PostgreSQL's last timestamp
        # (later ones are text-only in the lake).
        last = (2**63 - 1) // MICROS_PER_DAY - 1
        stamp_days = [d for d in days if d <= last] + [last]
        micros = [rng.randrange(MICROS_PER_DAY) for _ in stamp_days]
        values = [d * MICROS_PER_DAY + m for d, m in zip(stamp_days, micros, strict=True)]
        query = (
            "SELECT '1970-01-01 00:00'::{} + d * interval '1 day' + m * interval '1 microsecond' "
            "FROM unnest(%s::int8[], %s::int8[]) WITH ORDINALITY u(d, m, n) ORDER BY n"
        )
        for type_sql, arrow in (
            ("timestamp", pa.timestamp("us")),
            ("timestamptz", pa.timestamp("us", tz="UTC")),
        ):
            expected = _pg(conn, query.format(type_sql), (stamp_days, micros))
            got = _texts(conn, type_sql, pa.array(values, pa.int64()).cast(arrow))
            assert got == expected, type_sql


def test_times_intervals_floats_decimals_and_the_rest(db: Database) -> None:
    with db.connect() as conn:
        fix_settings(conn)
        micros = [0, 1, 43_200_500_000, MICROS_PER_DAY - 1, MICROS_PER_DAY]
        assert _texts(conn, "time", pa.array(micros, pa.int64())) == [
            "00:00:00", "00:00:00.000001", "12:00:00.5", "23:59:59.999999", "24:00:00",
        ]  # fmt: skip

        intervals = pa.array(
            [
                {"months": 1, "days": 2, "nanoseconds": 11_045_678_901_000},
                {"months": -2136000000, "days": 0, "nanoseconds": 0},
                {"months": 0, "days": -1, "nanoseconds": 3_600_000_000_000},
                {"months": 0, "days": 0, "nanoseconds": 9_223_372_036_854_775_000},
                {"months": -1, "days": 0, "nanoseconds": -1000},
            ],
            INTERVAL_STRUCT,
        )
        assert _texts(conn, "interval", intervals) == _pg(
            conn,
            "SELECT unnest(ARRAY['1 mon 2 days 03:04:05.678901', '-178000000 years', "
            "'-1 day +01:00', '2562047:47:16.854775', "
            "'-1 mon -0.000001 seconds']::interval[])",
            None,
        )

        floats = [
            float("nan"),
            float("inf"),
            float("-inf"),
            -0.0,
            5e-324,
            1.7976931348623157e308,
            0.1,
        ]
        assert _texts(conn, "float8", pa.array(floats, pa.float64())) == [
            "NaN", "Infinity", "-Infinity", "-0", "5e-324", "1.7976931348623157e+308", "0.1",
        ]  # fmt: skip
        float4s = pa.array([0.1, 3.4028234663852886e38, 1e-45, -0.0], pa.float32())
        assert _texts(conn, "float4", float4s) == ["0.1", "3.4028235e+38", "1e-45", "-0"]

        decimals = [Decimal("1E+3"), Decimal("-0.01"), Decimal("123456789012345678.90")]
        assert _texts(conn, "numeric(20, 2)", pa.array(decimals, pa.decimal128(20, 2))) == [
            "1000.00", "-0.01", "123456789012345678.90",
        ]  # fmt: skip
        assert _texts(conn, "money", pa.array([Decimal("-92233720368547758.08")])) == [
            "-$92,233,720,368,547,758.08"
        ]
        assert _texts(conn, '"char"', pa.array(["\xff", "a", ""])) == ["\\377", "a", ""]
        assert _texts(conn, "bytea", pa.array([b"", b"\x00\\'"])) == ["\\x", "\\x005c27"]
        lists = pa.array([[1, None, 3], [], None], pa.list_(pa.int32()))
        assert _texts(conn, "int4[]", lists) == ["{1,NULL,3}", "{}", None]
        strings = pa.array([['a "b"', "back\\slash", "NULL", None, ""]], pa.list_(pa.string()))
        assert _texts(conn, "text[]", strings) == ['{"a \\"b\\"","back\\\\slash","NULL",NULL,""}']
        dates = pa.array([[-719528, 0]], pa.list_(pa.date32()))
        assert _texts(conn, "date[]", dates) == ['{"0001-01-01 BC",1970-01-01}']
