"""The Delta changelog against test_decoding's changes, one for one.

A test_decoding slot created before the workload sees every committed change; its output,
parsed by ``pgcdc.decoding.test_decoding``, is the expected changelog of each table in commit
order: the operation, the new values (unchanged TOAST marked as such), and the old key or old
row. The lake's changelog, ordered by (``_commit_lsn``, ``_seq``), must match it entry by entry,
value for value in PostgreSQL's text form (test_decoding prints values with the output
functions of the session that reads the slot, so that session uses the oracle's settings).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.decoding.test_decoding import TestDecodingDecoder
from pgcdc.events import UNCHANGED_TOAST, Delete, Event, Insert, Truncate, Update
from pgcdc.lsn import LSN
from pgcdc.sinks import SinkKind, read_table

from .compare import PgColumn, Report, lake_path, lake_texts, table_columns, text_maps
from .specs import KEY_COLUMNS, TableSpec

UNCHANGED = "<unchanged toast>"
Values = dict[str, str | None]


@dataclass
class Entry:
    op: str
    new: Values  # column -> text (None: NULL, UNCHANGED: not sent); empty for delete/truncate
    old: Values  # the old key or old row's columns, as sent; empty when none was sent


def _values(columns: Any, row: Any) -> Values:
    out: Values = {}
    for column, value in zip(columns, row, strict=True):
        if value is UNCHANGED_TOAST:
            out[column.name] = UNCHANGED
        elif isinstance(value, bytes):
            out[column.name] = value.decode()
        else:
            out[column.name] = value
    return out


def decoded_changes(
    conn: psycopg.Connection[Any], slot: str
) -> tuple[dict[tuple[str, str], list[Entry]], dict[tuple[str, str], dict[str, str]]]:
    """test_decoding's changes per table, and each table's column types (type name as printed,
    the latest definition of each column name)."""
    decoder = TestDecodingDecoder()
    entries: dict[tuple[str, str], list[Entry]] = {}
    types: dict[tuple[str, str], dict[str, str]] = {}
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_changes(%s, NULL, NULL)", (slot,)
    ).fetchall()
    for lsn, data in rows:
        add_entries(decoder.decode(data.encode(), LSN.parse(lsn)), entries, types)
    return entries, types


def add_entries(
    events: Iterable[Event],
    entries: dict[tuple[str, str], list[Entry]],
    types: dict[tuple[str, str], dict[str, str]] | None = None,
) -> None:
    """Append each row change (and TRUNCATE) of ``events`` to its table's entries; note the
    column types seen in ``types``. Takes test_decoding's events and the change log's alike."""
    for event in events:
        if isinstance(event, Truncate):
            for table in event.tables:
                entries.setdefault((table.namespace, table.name), []).append(
                    Entry("truncate", {}, {})
                )
            continue
        if not isinstance(event, Insert | Update | Delete):
            continue
        table = event.table
        key = (table.namespace, table.name)
        if types is not None:
            known = types.setdefault(key, {})
            for column in table.columns:
                if column.type_name is not None:
                    known[column.name] = column.type_name
        columns = table.columns
        if isinstance(event, Insert):
            entry = Entry("insert", _values(columns, event.new), {})
        elif isinstance(event, Update):
            old = _values(columns, event.old) if event.old is not None else {}
            entry = Entry("update", _values(columns, event.new), old)
        else:
            entry = Entry("delete", {}, _values(columns, event.old))
        entries.setdefault(key, []).append(entry)


def _old_columns(table: TableSpec, names: list[str]) -> list[str]:
    """The columns an old key carries: the replica identity's."""
    if table.kind == "full":
        return names
    if table.kind == "keys":
        return [n for n in names if n in KEY_COLUMNS]
    return ["id"]


def lake_changes(
    conn: psycopg.Connection[Any], lake: str, table: TableSpec, columns: list[PgColumn]
) -> list[Entry]:
    data = read_table(lake_path(lake, table.schema, table.name, SinkKind.CHANGELOG))
    order = pc.sort_indices(data, sort_keys=[("_commit_lsn", "ascending"), ("_seq", "ascending")])
    data = data.take(order)
    new = lake_texts(conn, columns, data)
    old_rows: list[tuple[str | None, ...]] = [()] * data.num_rows
    old_valid = [False] * data.num_rows
    if "_old" in data.column_names:
        old_struct = data.column("_old").combine_chunks()
        old_valid = old_struct.is_valid().to_pylist()
        fields = {f.name: old_struct.field(f.name) for f in old_struct.type}
        old_table = pa.table(fields) if fields else pa.table({"_": pa.nulls(data.num_rows)})
        # The old row's text-only values (infinity, NaN, 24:00, BC...) are in ``_old_text``,
        # as the new row's are in ``_text``: read it as ``coalesce(_old_text[col], _old.col)``.
        old_rows = lake_texts(conn, columns, old_table, text_maps(data, "_old_text"))
    names = [c.name for c in columns]
    ops = data.column("_op").to_pylist()
    unchanged = data.column("_unchanged").to_pylist()
    entries = []
    for i, op in enumerate(ops):
        values: Values = {}
        if op in ("insert", "update"):
            values = dict(zip(names, new[i], strict=True))
            for name in unchanged[i] or []:
                values[name] = UNCHANGED
        old = dict(zip(names, old_rows[i], strict=True)) if old_valid[i] else {}
        entries.append(Entry(op, values, old))
    return entries


def compare_changelogs(
    report: Report,
    publisher: psycopg.Connection[Any],
    scratch: psycopg.Connection[Any],
    *,
    lake: str,
    tables: list[TableSpec],
    slot: str,
) -> None:
    expected_by_table, types = decoded_changes(publisher, slot)
    for table in tables:
        where = f"changelog {table.label}"
        expected = expected_by_table.get((table.schema, table.name), [])
        table_types = types.get((table.schema, table.name), {})
        # test_decoding prints type names without their modifiers (character, not
        # character(5)): the subscriber's definition wins for the columns it still has.
        current = {c.name: c for c in table_columns(scratch, table.schema, table.name)}
        columns = [
            current.get(name, PgColumn(name, type_sql, ""))
            for name, type_sql in table_types.items()
        ]
        path = lake_path(lake, table.schema, table.name, SinkKind.CHANGELOG)
        if not Path(path).exists():
            report.problem(where, f"no Delta table at {path}")
            continue
        got = lake_changes(scratch, lake, table, columns)
        if len(got) != len(expected):
            report.problem(
                where, f"{len(got)} changes in the lake, test_decoding has {len(expected)}"
            )
        for i, (e, g) in enumerate(zip(expected, got, strict=False)):
            if e.op != g.op:
                report.problem(
                    where, f"change {i}: op {g.op}, test_decoding has {e.op}; stopped here"
                )
                break
            label = f"{where} [change {i} {e.op} id={(e.new or e.old).get('id')}]"
            for name, value in e.new.items():
                if g.new.get(name) != value:
                    report.add(
                        where,
                        name,
                        f"{label} {name}: expected {value!r:.120} got {g.new.get(name)!r:.120}",
                    )
            old_names = _old_columns(table, list(e.old))
            for name in old_names:
                if e.old.get(name) != g.old.get(name):
                    want, found = e.old.get(name), g.old.get(name)
                    message = f"{label} _old.{name}: expected {want!r:.120} got {found!r:.120}"
                    report.add(where, f"_old.{name}", message)
