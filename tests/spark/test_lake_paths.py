"""Schema and table names that are awkward as paths (``..``, ``/``, ``%20``, spaces, quotes,
non-ASCII, names differing only in case) through ``pgcdc pipeline run --once`` on PG15 and PG18:
the mirrors equal the source value by value, a restart carries on, and nothing lands outside the
lake."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from psycopg import sql

from pgcdc.cli.main import main
from pgcdc.sinks import SinkKind, read_table, table_path
from tests.conftest import Database

from .helpers import sort_rows

TABLES = [
    ("..", ".."),
    ("..", "."),
    ("public", "Upper Case"),
    ("public", "upper case"),
    ("public", "%20"),
    ("public", '"q"'),
    ("public", "é"),
    ("public", "Items"),
    ("public", "items"),
    ("public", "a/b"),
    ("public", "-55pper"),  # what "Upper" escapes to, as a name of its own
    ("Mixed Schema", ".hidden"),
]


def _name(schema: str, table: str) -> sql.Composed:
    return sql.SQL("{}.{}").format(sql.Identifier(schema), sql.Identifier(table))


def _source_rows(db: Database, schema: str, table: str) -> list[dict[str, Any]]:
    with db.connect() as conn:
        cursor = conn.execute(
            sql.SQL("SELECT id, label, amount FROM {}").format(_name(schema, table))
        )
        return sort_rows([dict(zip(["id", "label", "amount"], r, strict=True)) for r in cursor])


def _lake_rows(lake: Path, schema: str, table: str, kind: SinkKind) -> list[dict[str, Any]]:
    data = read_table(table_path(lake, schema, table, kind))
    if kind is SinkKind.HISTORY:
        data = data.filter(data.column("_is_current"))
    return sort_rows(data.select(["id", "label", "amount"]).to_pylist())


def _files(root: Path) -> set[Path]:
    return {p.relative_to(root) for p in root.rglob("*")}


def test_awkward_names_reach_the_lake_and_survive_a_restart(db: Database, tmp_path: Path) -> None:
    with db.connect() as conn:
        for schema in {s for s, _ in TABLES} - {"public"}:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
        for number, (schema, table) in enumerate(TABLES):
            name = _name(schema, table)
            conn.execute(
                sql.SQL(
                    "CREATE TABLE {} (id int PRIMARY KEY, label text, amount numeric(10, 2))"
                ).format(name)
            )
            conn.execute(
                sql.SQL(
                    "INSERT INTO {} SELECT g, {} || g, g * 1.25 FROM generate_series(1, 20) g"
                ).format(name, sql.Literal(f"{schema}.{table} #{number} "))
            )
        conn.execute(
            sql.SQL("CREATE PUBLICATION cdc FOR TABLE {}").format(
                sql.SQL(", ").join(_name(s, t) for s, t in TABLES)
            )
        )
    # The lake sits two levels down: a ".." that escaped it would land in tmp_path/outer.
    outer = tmp_path / "outer"
    lake = outer / "inner" / "lake"
    argv = [
        "pipeline", "run", "-d", db.conninfo(), "--slot", "paths", "--publication", "cdc",
        "--changelog", str(tmp_path / "log"), "--lake", str(lake),
        "--checkpoint", str(tmp_path / "checkpoint"), "--kinds", "changelog,mirror,history",
        "--master", "local[2]", "--snapshot-workers", "2", "--once",
    ]  # fmt: skip

    def check() -> None:
        for schema, table in TABLES:
            expected = _source_rows(db, schema, table)
            assert expected, (schema, table)
            for kind in (SinkKind.MIRROR, SinkKind.HISTORY):
                assert _lake_rows(lake, schema, table, kind) == expected, (schema, table, kind)
        assert {p.parts[0] for p in _files(tmp_path)} == {"log", "checkpoint", "outer"}
        outside = {p for p in _files(outer) if p.parts[:2] != ("inner", "lake")}
        assert outside == {Path("inner")}
        # One directory per schema, one per table: no name wandered off or merged with another.
        schemas = {s for s, _ in TABLES}
        assert len({p.name for p in lake.iterdir()}) == len(schemas)
        assert sum(len(list((lake / d).iterdir())) for d in {p.name for p in lake.iterdir()}) == (
            len(TABLES)
        )

    assert main(argv) == 0
    check()
    with db.connect() as conn:
        for schema, table in TABLES:
            name = _name(schema, table)
            conn.execute(sql.SQL("UPDATE {} SET amount = amount * 2 WHERE id % 3 = 0").format(name))
            conn.execute(sql.SQL("DELETE FROM {} WHERE id % 7 = 0").format(name))
            conn.execute(
                sql.SQL("INSERT INTO {} VALUES (100, {}, 0.5)").format(
                    name, sql.Literal(f"late {schema}/{table}")
                )
            )
    # The restart opens the tables the first run made: the old mapping failed here.
    assert main(argv) == 0
    check()
    assert main(argv) == 0
    check()
