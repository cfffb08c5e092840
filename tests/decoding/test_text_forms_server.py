"""Types pgcdc keeps as text (geometric, ranges, multiranges, composites): their binary form,
decoded, must be exactly the text the server prints, under the settings the receiver forces.
Otherwise a binary-format stream would land other text than a text-format one."""

from __future__ import annotations

import struct
from typing import Any

import psycopg
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pgcdc.connection.catalog import type_closure, type_info
from pgcdc.decoding.textforms import float_text
from pgcdc.decoding.values import TypeRegistry, row_to_python
from pgcdc.errors import DecodeError
from pgcdc.events import Column, Table
from tests.conftest import examples

# The receiver's forced output settings (pgcdc.receiver), which text values arrive under.
FORCED = ("SET TimeZone = 'UTC'", "SET extra_float_digits = 3", "SET DateStyle = 'ISO'")

# (SQL type, SQL literals): each literal is read back as text and as binary.
CASES: list[tuple[str, list[str]]] = [
    ("point", ["'(1,2)'", "'(1.5,-0)'", "'(NaN,Infinity)'", "'(1e300,-1e-300)'", "'(0.1,1e15)'"]),
    ("line", ["'{1,-1,0}'", "'{0.5,2,-3.25}'"]),
    ("lseg", ["'[(0,0),(1,1)]'", "'[(-1.5,2),(3,1e20)]'"]),
    ("box", ["'((0,0),(1,1))'", "'((3,4),(-1,-2))'"]),
    ("path", ["'[(0,0),(1,1),(2,0)]'", "'((0,0),(1,1),(2,0))'", "'[(5,5)]'"]),
    ("polygon", ["'((0,0),(1,1),(2,0))'", "'((1.25,0))'"]),
    ("circle", ["'<(1,2),3>'", "'<(-0.5,1e-5),0>'"]),
    ("int4range", ["'[1,10)'", "'empty'", "'(,3]'", "'[5,)'", "'(,)'"]),
    ("int8range", ["'[-9223372036854775808,9223372036854775807)'"]),
    ("numrange", ["'[1.5,2.25]'", "'(-1,)'", "'[0.000,1e30]'"]),
    ("daterange", ["'[2000-01-01,infinity)'", "'[4713-01-01 BC,2000-01-01)'"]),
    ("tsrange", ["'[2020-01-01 00:00,2020-01-02 12:30:00.5)'", "'(-infinity,infinity)'"]),
    ("tstzrange", ["'[2020-01-01 00:00+05,infinity)'", "'(,)'"]),
    ("int4multirange", ["'{[1,2),[5,7)}'", "'{}'", "'{(,3),[10,)}'"]),
    ("tstzmultirange", ["'{[2020-01-01 00:00+00,2020-02-01 00:00+00)}'"]),
    ("int4range[]", ["ARRAY['[1,2)'::int4range, 'empty', NULL]"]),
    ("point[]", ["ARRAY[point '(1,2)', point '(3.5,-0)']"]),
    (
        "pair",
        [
            "ROW(1, 'a b', 'NaN', 1.1, '{1,2}', '\\x00ff', NULL)",
            "ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
            "ROW(2, '\"q\",(x)\\\\', '-Infinity', -3.4e38, '{}', '', 'empty')",
            "ROW(-2147483648, '', '1e100', 1e-7, '{NULL,-1}', '\\x5c22', '[1,)')",
        ],
    ),
    ("nest", ["ROW(ROW(1, 'x', 0.5, 1, '{}', '', '(,)')::pair, 'sad', '[1.5,2)')"]),
    (
        "priced",
        [
            "ROW(1234567.89, '{0.05,-1000,NULL}')",
            "ROW(0, '{}')",
            "ROW(-0.01, '{999.99,1000}')",
            "ROW('-92233720368547758.08'::money, ARRAY['92233720368547758.07'::money])",
            "ROW(NULL, NULL)",
        ],
    ),
    (
        "reals",
        [
            "ROW('{0.1,1e20,-0,NaN,3.4e38,1.5e-45}', 0.1)",
            "ROW('{{1,2},{3,4}}', NULL)",
            # float4out's notation thresholds, not float8out's: 1e+06, not 1000000.
            "ROW('{1e6,1234567,123456.7,1e-5,99999}', 1e6)",
            "ROW('[0:1]={1e7,2}', 1e14)",
        ],
    ),
    ("floatrange", ["'[1.5,2.5)'", "'(-1e300,0.1]'", "'[-0,Infinity]'"]),
    ("floatmultirange", ["'{[1.5,2.5),(3,1e20]}'", "'{}'"]),
    (
        "floats",
        ["ROW('{1,2.5e20,-0,1e15}', '2024-01-02 03:04:05.5+02')", "ROW('{{1,2},{3,NaN}}', NULL)"],
    ),
]

_SCHEMA = (
    "CREATE TYPE mood AS ENUM ('sad', 'with space')",
    "CREATE TYPE floatrange AS RANGE (subtype = float8)",
    "CREATE TYPE pair AS (i int, t text, f float8, r real, a int[], b bytea, ir int4range)",
    "CREATE TYPE nest AS (p pair, m mood, fr floatrange)",
    "CREATE TYPE floats AS (a float8[], t timestamptz)",
    "CREATE TYPE priced AS (m money, ms money[])",
    "CREATE TYPE reals AS (a real[], r real)",
)


def _forced(conn: psycopg.Connection[Any]) -> None:
    for statement in FORCED:
        conn.execute(statement)


def _read(conn: psycopg.Connection[Any], query: str) -> tuple[list[int], list[Any], list[Any]]:
    """Column OIDs, text forms and binary forms of the query's one row."""
    cursor = conn.cursor()
    cursor.execute(query)
    assert cursor.pgresult is not None and cursor.description is not None
    width = len(cursor.description)
    texts = [cursor.pgresult.get_value(0, i) for i in range(width)]
    binary = conn.cursor(binary=True)
    binary.execute(query)
    assert binary.pgresult is not None and binary.description is not None
    oids = [d.type_code for d in binary.description]
    raws = [binary.pgresult.get_value(0, i) for i in range(width)]
    assert None not in texts and None not in raws
    return oids, [bytes(t or b"").decode() for t in texts], [bytes(r or b"") for r in raws]


@pytest.mark.parametrize(
    ("sql_type", "literals"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_binary_gives_the_servers_text(db: Any, sql_type: str, literals: list[str]) -> None:
    with db.connect() as conn:
        _forced(conn)
        for statement in _SCHEMA:
            conn.execute(statement)
        select = ", ".join(f"({literal})::{sql_type}" for literal in literals)
        oids, texts, raws = _read(conn, f"SELECT {select}")
        types = type_closure(conn, oids)
    registry = TypeRegistry(types)
    columns = tuple(Column(f"c{i}", oid) for i, oid in enumerate(oids))
    table = Table("public", "t", columns)
    from_text = row_to_python(table, texts, registry)
    from_binary = row_to_python(table, raws, registry)
    assert from_binary == from_text
    for value, text in zip(from_text, texts, strict=True):
        if not isinstance(value, list):  # (arrays are lists of such texts)
            assert value == text


def test_unknown_field_type_is_a_typed_error(db: Any) -> None:
    """A composite field of a type the registry was not told about cannot be printed from
    binary: a DecodeError naming the type, never the bytes as if they were text."""
    with db.connect() as conn:
        _forced(conn)
        for statement in _SCHEMA:
            conn.execute(statement)
        oids, _texts, raws = _read(
            conn, "SELECT ROW(ROW(1,'x',0,0,'{}','','empty')::pair, 'sad', 'empty')::nest"
        )
        only_nest = type_info(conn, oids)
    table = Table("public", "t", (Column("c", oids[0]),))
    with pytest.raises(DecodeError, match="cannot print binary values of type"):
        row_to_python(table, raws, TypeRegistry(only_nest))


def test_float8_text_is_float8out(db: Any) -> None:
    with db.connect() as conn:
        _forced(conn)

        @settings(max_examples=examples(300), deadline=None)
        @given(st.floats())
        @example(1e15)
        @example(999999999999999.9)
        @example(1e-5)
        @example(0.0001)
        @example(-0.0)
        @example(5e-324)
        @example(1.23e22)  # a midpoint between two doubles: Python's repr takes it, PG does not
        @example(2.292085380884825e16)  # found by hypothesis: an upper midpoint
        @example(5.223463977536022e16)  # found by hypothesis: a lower midpoint
        def check(value: float) -> None:
            row = conn.execute("SELECT %s::float8::text", (value,)).fetchone()
            assert row is not None and float_text(value) == row[0]

        check()


def test_float4_text_is_float4out(db: Any) -> None:
    """Through the binary decoder, which gives a float4's shortest digits."""
    registry = TypeRegistry()
    with db.connect() as conn:
        _forced(conn)

        @settings(max_examples=examples(300), deadline=None)
        @given(st.floats(width=32))
        @example(1234567.0)
        @example(123456.0)
        @example(1.1)
        @example(-3.4028234663852886e38)
        @example(1e-45)
        def check(value: float) -> None:
            row = conn.execute("SELECT %s::float4::text", (value,)).fetchone()
            decoded = registry.to_python(struct.pack(">f", value), 700)
            assert row is not None and float_text(decoded, 6) == row[0]

        check()
