"""Exact keys end to end: a real server's changes, through the change log and the Spark
pipeline, into Delta mirrors and histories compared value by value with what PostgreSQL holds
(``::text`` of every column, so infinities, NaN, BC and far-future dates compare exactly).

The cases the typed-value keys got wrong: keys that differ only in a value kept as text
(date ``infinity``), REPLICA IDENTITY FULL rows holding NaN, identical rows of a keyless FULL
table, an unchanged TOASTed value held only as text, and dates Python or delta-rs cannot hold.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.decoding.values import PgDate, pg_text
from pgcdc.sinks import SinkKind, read_table
from pgcdc.spark.pipeline import PipelineConfig, run_once, spark_session
from tests.conftest import Database
from tests.spark.helpers import PUBLICATION, SLOT, drain, lake_path

_EPOCH_2000 = 10_957

# Table -> (columns, its DDL after CREATE TABLE).
TABLES = {
    "public.dates": ["d", "v", "ds"],
    "public.floats": ["f", "n", "d", "note"],
    "public.arrays": ["id", "a", "v"],
}


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[1]", "pgcdc-keys-tests")
    yield session
    session.stop()


def _text(value: Any, type_: pa.DataType) -> str | None:
    """An Arrow value as PostgreSQL prints it (the types these tests use)."""
    if value is None:
        return None
    if pa.types.is_date32(type_):
        return str(PgDate(value - _EPOCH_2000))
    if pa.types.is_list(type_) and pa.types.is_date32(type_.value_type):
        return pg_text([None if v is None else PgDate(v - _EPOCH_2000) for v in value])
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return ("-" if math.copysign(1.0, value) < 0 else "") + str(abs(int(value)))
    return pg_text(value)


def lake_text_rows(
    path: str, columns: list[str], current_only: bool = False
) -> list[tuple[Any, ...]]:
    """Each row's columns as text: its ``_text`` entry, else its typed value printed."""
    table = read_table(path)
    if current_only:
        table = table.filter(pc.field("_is_current"))
    rows = []
    texts = table.column("_text").to_pylist()
    values = []
    for name in columns:
        column = table.column(name)
        if pa.types.is_date32(column.type):
            column = column.cast(pa.int32())  # no Python date: BC and far-future dates
        elif pa.types.is_list(column.type) and pa.types.is_date32(column.type.value_type):
            column = column.cast(pa.list_(pa.int32()))
        values.append([_text(v, table.column(name).type) for v in column.to_pylist()])
    for index, entries in enumerate(texts):
        kept = dict(entries or [])
        rows.append(tuple(kept.get(name, values[i][index]) for i, name in enumerate(columns)))
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r))


def source_text_rows(conn: psycopg.Connection[Any], name: str, columns: list[str]) -> Any:
    selected = ", ".join(f"{c}::text" for c in columns)
    rows = [tuple(r) for r in conn.execute(f"SELECT {selected} FROM {name}").fetchall()]
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r))


def _assert_matches(conn: psycopg.Connection[Any], lake: Path) -> None:
    for name, columns in TABLES.items():
        source = source_text_rows(conn, name, columns)
        mirror = lake_text_rows(lake_path(lake, name, SinkKind.MIRROR), columns)
        assert mirror == source, name
        history = lake_path(lake, name, SinkKind.HISTORY)
        assert lake_text_rows(history, columns, current_only=True) == source, name


def test_exact_keys_through_the_pipeline(db: Database, tmp_path: Path, spark: Any) -> None:
    log = ChangeLog(tmp_path / "log")
    lake = tmp_path / "lake"
    config = PipelineConfig(
        changelog=str(tmp_path / "log"), lake=str(lake), checkpoint=str(tmp_path / "checkpoint")
    )
    with db.connect() as conn:
        conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
        conn.execute(f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
        conn.execute("CREATE TABLE dates (d date PRIMARY KEY, v int, ds date[])")
        conn.execute("CREATE TABLE floats (f float8, n numeric, d date, note text)")
        conn.execute("ALTER TABLE floats REPLICA IDENTITY FULL")
        conn.execute("CREATE TABLE arrays (id int PRIMARY KEY, a int[], v int)")
        conn.execute("ALTER TABLE arrays ALTER a SET STORAGE EXTERNAL")
        conn.execute(
            "INSERT INTO dates VALUES ('infinity', 1), ('-infinity', 2), ('2020-01-01', 3), "
            "('0044-03-15 BC', 4), ('5874897-12-31', 5), ('12345-06-07', 6)"
        )
        conn.execute(
            "UPDATE dates SET ds = ARRAY['5874897-12-31', '0044-03-15 BC', NULL]::date[] "
            "WHERE v IN (1, 4)"
        )
        conn.execute(
            "INSERT INTO floats VALUES ('NaN', 'NaN', '0044-03-15 BC', 'nan'), "
            "(1.5, 2, '5874897-12-31', 'far'), (-0.0, 'Infinity', 'infinity', 'inf'), "
            "(3, 3, '2020-01-01', 'dup'), (3, 3, '2020-01-01', 'dup'), "
            "(3, 3, '2020-01-01', 'dup')"
        )
        # Two-dimensional: kept as text; big and EXTERNAL: TOASTed, so later UPDATEs of v
        # leave it unchanged and unsent.
        conn.execute("INSERT INTO arrays VALUES (1, array_fill(7, ARRAY[2, 2000]), 1)")
        conn.execute("INSERT INTO arrays VALUES (2, ARRAY[1, 2, 3], 1)")
        drain(conn, log)
        run_once(spark, config)
        _assert_matches(conn, lake)

        conn.execute("UPDATE dates SET v = 10 WHERE d = 'infinity'")
        conn.execute("DELETE FROM dates WHERE d = '-infinity'")
        conn.execute("UPDATE dates SET v = 40 WHERE d = '0044-03-15 BC'")
        conn.execute("UPDATE dates SET d = '-infinity' WHERE d = '2020-01-01'")
        conn.execute("UPDATE dates SET v = 50 WHERE d = '5874897-12-31'")
        conn.execute("DELETE FROM dates WHERE d = '12345-06-07'")
        conn.execute("UPDATE floats SET note = 'nan2' WHERE note = 'nan'")
        conn.execute("UPDATE floats SET note = 'far2' WHERE note = 'far'")
        conn.execute("DELETE FROM floats WHERE note = 'inf'")
        # One copy of three identical rows goes, another changes.
        one_dup = "(SELECT ctid FROM floats WHERE note = 'dup' LIMIT 1)"
        conn.execute(f"DELETE FROM floats WHERE ctid = {one_dup}")
        conn.execute(f"UPDATE floats SET f = 4 WHERE ctid = {one_dup}")
        conn.execute("INSERT INTO floats VALUES (3, 3, '2020-01-01', 'dup')")
        conn.execute("UPDATE arrays SET v = v + 1")
        drain(conn, log)
        run_once(spark, config)
        _assert_matches(conn, lake)

        # And again within one batch, across the copies.
        conn.execute("INSERT INTO floats VALUES ('NaN', 'NaN', '0044-03-15 BC', 'nan2')")
        conn.execute(f"DELETE FROM floats WHERE ctid = {one_dup}")
        conn.execute("UPDATE floats SET note = 'nan3' WHERE note = 'nan2'")
        conn.execute("UPDATE arrays SET v = v + 1")
        conn.execute("UPDATE dates SET v = 11 WHERE d = 'infinity'")
        drain(conn, log)
        run_once(spark, config)
        _assert_matches(conn, lake)
        assert conn.execute("SELECT count(*) FROM floats WHERE note = 'dup'").fetchone() == (2,)
