"""Both sides of the oracle in PostgreSQL's text form, and mismatch reports that name the
table, the row and each differing value.

Subscriber values: ``SELECT col`` as the output functions print them, under fixed session
settings (``TEXT_SETTINGS``). Lake values: converted to input text (``texts``),
``coalesce(_text[col], col)``, loaded into a scratch table with the same column types, and
read back the same way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import psycopg
import pyarrow as pa
from psycopg import sql

from pgcdc.sinks import SinkKind
from pgcdc.sinks.delta import DeltaSink

from .texts import texts

Conn = psycopg.Connection[Any]
TextRow = tuple[str | None, ...]

TEXT_SETTINGS = {
    "DateStyle": "ISO, YMD",
    "IntervalStyle": "postgres",
    "extra_float_digits": "3",
    "bytea_output": "hex",
    "TimeZone": "UTC",
}


def fix_settings(conn: Conn) -> None:
    """The oracle's text settings, and no prepared statements: the scratch table's queries
    repeat with other column types."""
    conn.prepare_threshold = None
    for name, value in TEXT_SETTINGS.items():
        conn.execute(sql.SQL("SELECT set_config({}, {}, false)").format(name, value))


def ident(*names: str) -> sql.Composable:
    return sql.Identifier(*names)


@dataclass(frozen=True)
class PgColumn:
    name: str
    type_sql: str  # format_type(), e.g. numeric(12,2), mood[]
    scalar: str  # the base type's name below domains and arrays, e.g. "time"


_COLUMNS_SQL = """
WITH RECURSIVE base(attnum, attname, type_sql, oid, depth) AS (
    SELECT a.attnum, a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid, 0
    FROM pg_attribute a
    WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
  UNION ALL
    SELECT b.attnum, b.attname, b.type_sql,
           CASE WHEN t.typtype = 'd' THEN t.typbasetype ELSE t.typelem END, b.depth + 1
    FROM base b JOIN pg_type t ON t.oid = b.oid
    WHERE t.typtype = 'd' OR (t.typelem <> 0 AND t.typcategory = 'A')
)
SELECT DISTINCT ON (attnum) attname, type_sql, t.typname
FROM base b JOIN pg_type t ON t.oid = b.oid
ORDER BY attnum, depth DESC
"""


def relation_columns(conn: Conn, relation_oid: int) -> list[PgColumn]:
    rows = conn.execute(_COLUMNS_SQL, (relation_oid,)).fetchall()
    return [PgColumn(name, type_sql, scalar) for name, type_sql, scalar in rows]


def table_columns(conn: Conn, schema: str, table: str) -> list[PgColumn]:
    row = conn.execute(
        "SELECT c.oid FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = %s",
        (schema, table),
    ).fetchone()
    assert row is not None, f"no table {schema}.{table}"
    return relation_columns(conn, row[0])


def output_texts(conn: Conn, query: sql.Composed) -> list[TextRow]:
    """The rows of ``query`` exactly as the types' output functions print them (what
    test_decoding and COPY show; ``::text`` differs for bool, bpchar, inet, ...)."""
    cursor = conn.execute(query)
    result = cursor.pgresult
    assert result is not None
    rows = []
    for i in range(result.ntuples):
        row = []
        for j in range(result.nfields):
            value = result.get_value(i, j)
            row.append(None if value is None else bytes(value).decode())
        rows.append(tuple(row))
    return rows


def subscriber_rows(conn: Conn, schema: str, table: str, columns: list[PgColumn]) -> list[TextRow]:
    query = sql.SQL("SELECT {} FROM {}").format(
        sql.SQL(", ").join(ident(c.name) for c in columns), ident(schema, table)
    )
    return output_texts(conn, query)


def lake_path(lake: str, schema: str, table: str, kind: SinkKind) -> str:
    """Where the sinks put that table: asked of the sink itself, so a change of the path
    scheme (quoting of odd names) is followed."""
    sink = DeltaSink(lake, app_id="oracle")
    spec = SimpleNamespace(namespace=schema, name=table)
    return sink.path(cast(Any, spec), kind)


def text_maps(data: pa.Table, column: str = "_text") -> list[dict[str, str | None]]:
    if column not in data.column_names:
        return [{} for _ in range(data.num_rows)]
    return [dict(m) if m else {} for m in data.column(column).to_pylist()]


def lake_texts(
    conn: Conn,
    columns: Sequence[PgColumn],
    data: pa.Table,
    maps: Sequence[dict[str, str | None]] | None = None,
) -> list[TextRow]:
    """The rows of ``data`` (lake columns named as the source's) in PostgreSQL text form, in
    order: ``coalesce(maps[i][col], col)`` (``maps``: the rows' ``_text``, read from ``data``
    when not given); a column the lake lacks reads as null. The values go through a scratch
    table with the columns' PostgreSQL types, so PostgreSQL itself prints them."""
    if maps is None:
        maps = text_maps(data)
    conn.execute("DROP TABLE IF EXISTS pg_temp.oracle_scratch")
    conn.execute(
        sql.SQL("CREATE TEMP TABLE oracle_scratch (oracle_ord int8{})").format(
            sql.SQL("").join(
                sql.SQL(", {} {}").format(ident(c.name), sql.SQL(c.type_sql)) for c in columns
            )
        )
    )
    oid = conn.execute("SELECT 'pg_temp.oracle_scratch'::regclass::oid").fetchone()
    assert oid is not None
    scalars = {c.name: c.scalar for c in relation_columns(conn, oid[0])}
    per_column: list[list[str | None]] = []
    for column in columns:
        if column.name in data.column_names:
            typed = texts(data.column(column.name).combine_chunks(), scalars[column.name])
        else:
            typed = [None] * data.num_rows
        per_column.append([m.get(column.name, v) for m, v in zip(maps, typed, strict=True)])
    copy_sql = sql.SQL("COPY pg_temp.oracle_scratch FROM STDIN")
    try:
        with conn.cursor() as cursor, cursor.copy(copy_sql) as copy:
            for i in range(data.num_rows):
                copy.write_row([str(i), *(values[i] for values in per_column)])
    except psycopg.Error as exc:
        raise AssertionError(
            f"a lake value is not valid input for its PostgreSQL type: {exc}"
        ) from None
    query = sql.SQL("SELECT {} FROM pg_temp.oracle_scratch ORDER BY oracle_ord").format(
        sql.SQL(", ").join(ident(c.name) for c in columns)
    )
    return output_texts(conn, query)


@dataclass
class Report:
    """Mismatches found, grouped by check and table, each naming the row and values."""

    lines: list[str] = field(default_factory=list)
    by_column: Counter[tuple[str, str]] = field(default_factory=Counter)
    examples: dict[tuple[str, str], str] = field(default_factory=dict)
    limit: int = 40

    def add(self, where: str, column: str, message: str) -> None:
        self.by_column[(where, column)] += 1
        self.examples.setdefault((where, column), message)
        if len(self.lines) < self.limit:
            self.lines.append(message)

    def compare(
        self,
        where: str,
        columns: list[PgColumn],
        expected: Sequence[TextRow],
        got: Sequence[TextRow],
        pair_by: Sequence[str] = ("id",),
    ) -> None:
        """``expected`` and ``got`` as multisets of rows; rows that differ are paired by the
        ``pair_by`` columns so each differing value is named."""
        names = [c.name for c in columns]
        missing = Counter(expected) - Counter(got)
        extra = Counter(got) - Counter(expected)
        if not missing and not extra:
            return
        positions = [names.index(p) for p in pair_by if p in names]

        def pair_key(row: TextRow) -> TextRow:
            return tuple(row[i] for i in positions)

        extra_by_key: dict[TextRow, list[TextRow]] = {}
        for row in extra.elements():
            extra_by_key.setdefault(pair_key(row), []).append(row)
        for row in missing.elements():
            key = pair_key(row)
            label = ", ".join(f"{names[i]}={row[i]}" for i in positions)
            candidates = extra_by_key.get(key)
            if not candidates:
                self.add(
                    where,
                    "(row)",
                    f"{where} [{label}]: row missing from the lake: {_show(names, row)}",
                )
                continue
            other = candidates.pop(0)
            for name, e, g in zip(names, row, other, strict=True):
                if e != g:
                    self.add(
                        where, name, f"{where} [{label}] {name}: expected {_cut(e)} got {_cut(g)}"
                    )
        for rows in extra_by_key.values():
            for row in rows:
                label = ", ".join(f"{names[i]}={row[i]}" for i in positions)
                self.add(
                    where, "(row)", f"{where} [{label}]: extra row in the lake: {_show(names, row)}"
                )

    def problem(self, where: str, message: str) -> None:
        self.add(where, "(check)", f"{where}: {message}")

    def text(self) -> str:
        summary = [
            f"  {where} {column}: {count} mismatches, e.g. {self.examples[(where, column)]}"
            for (where, column), count in sorted(self.by_column.items())
        ]
        return "\n".join(
            ["mismatches by table and column:", *summary, "first mismatches:", *self.lines]
        )

    def __bool__(self) -> bool:
        return bool(self.by_column)


def _cut(value: str | None, width: int = 120) -> str:
    if value is None:
        return "NULL"
    text = repr(value)
    return text if len(text) <= width else text[:width] + f"...({len(value)} chars)"


def _show(names: list[str], row: TextRow) -> str:
    return "{" + ", ".join(f"{n}: {_cut(v, 40)}" for n, v in zip(names, row, strict=True)) + "}"
