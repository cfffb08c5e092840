"""The oracle's seeded random workload, run on the publisher with two sessions.

Everything random comes from one ``random.Random(seed)``; rows are chosen by reading ids back
from the server, never with SQL ``random()``, so a seed replays the same statements. The two
sessions only ever touch rows of their own id parity (and only session 0 touches the "keys"
table), so overlapping transactions never wait on each other's locks in this one thread.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from .specs import (
    USER_TYPES,
    ColumnSpec,
    TableSpec,
    ToastSpec,
    columns_for,
    quote_ident,
    toast_for,
)

Conn = psycopg.Connection[Any]

# Columns the workload adds and drops on "wide" tables (the subscriber gets the same DDL).
ADDED_COLUMNS = [("added_def", "int4 DEFAULT 7"), ("added_nodef", "text")]
DROPPED_COLUMNS = ["added_nodef", "dropme"]


def q(name: str) -> str:
    return quote_ident(name)


def create_schema(conn: Conn, tables: list[TableSpec], major: int) -> None:
    """The user types and tables, identical on publisher and subscriber."""
    for statement in USER_TYPES:
        conn.execute(statement)
    for table in tables:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q(table.schema)}")
        specs = columns_for(table, major)
        toasts = toast_for(table)
        parts = ["id int4 NOT NULL" if table.kind != "full" else "id int4"]
        for spec in specs:
            parts.append(f"{q(spec.name)} {spec.sql_type}")
        for toast in toasts:
            parts.append(f"{q(toast.name)} {toast.sql_type}")
        if table.kind == "wide":
            parts.append("dropme text")
            parts.append("PRIMARY KEY (id)")
        elif table.kind == "keys":
            parts.append("PRIMARY KEY (" + ", ".join(q(s.name) for s in specs) + ")")
        conn.execute(f"CREATE TABLE {table.qualified} ({', '.join(parts)})")
        for toast in toasts:
            conn.execute(
                f"ALTER TABLE {table.qualified} ALTER {q(toast.name)} SET STORAGE EXTERNAL"
            )
        if table.kind == "full":
            conn.execute(f"ALTER TABLE {table.qualified} REPLICA IDENTITY FULL")


def toast_literal(rng: random.Random, toast: ToastSpec) -> str:
    """A value big enough (> 2 kB) to be stored out of line."""
    n = rng.randint(600, 900)
    if toast.kind == "text":
        word = "".join(rng.choice("abcdefgü☃'\\\"") for _ in range(7))
        return "'" + (word * n).replace("'", "''") + "'"
    if toast.kind == "bytea":
        return "'\\x" + bytes(rng.randrange(256) for _ in range(n * 4)).hex() + "'"
    if toast.kind == "jsonb":
        doc = {f"k{i}": [i, rng.random(), "ü" * (i % 3), None] for i in range(n // 6)}
        return "'" + json.dumps(doc).replace("'", "''") + "'::jsonb"
    if toast.kind == "numeric":
        digits = "".join(rng.choice("0123456789") for _ in range(n * 4))
        return f"'-{digits}.{digits[:50]}'"
    if toast.kind == "grid":
        rows = [",".join(str(rng.randint(-9, 10**6)) for _ in range(n // 4)) for _ in range(3)]
        return "'{" + ",".join("{" + r + "}" for r in rows) + "}'"
    if toast.kind == "dates":
        days = ["infinity"] + [
            f"{rng.randint(1000, 2999)}-01-{rng.randint(10, 28)}" for _ in range(n // 3)
        ]
        return "'{" + ",".join(days) + "}'"
    raise ValueError(toast.kind)


@dataclass
class Counts:
    """What the workload did, to check that it exercised every case."""

    changes: int = 0
    by_case: dict[str, int] = field(default_factory=dict)

    def add(self, case: str, changes: int = 0) -> None:
        self.by_case[case] = self.by_case.get(case, 0) + 1
        self.changes += changes


@dataclass
class Workload:
    """Random transactions over ``tables`` through two publisher sessions."""

    rng: random.Random
    sessions: tuple[Conn, Conn]
    tables: list[TableSpec]
    major: int
    # DDL hooks: the subscriber must add columns before the publisher, drop them after it.
    on_add_column: Callable[[str], None]
    on_drop_column: Callable[[str], None]
    next_id: list[int] = field(default_factory=lambda: [2, 3])
    added: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    counts: Counts = field(default_factory=Counts)
    keys_rows: list[dict[str, str]] = field(default_factory=list)
    gid: int = 0

    # --- values -------------------------------------------------------------------------------

    def _value(self, spec: ColumnSpec, nullable: bool = True) -> str:
        if nullable and self.rng.random() < 0.12:
            return "NULL"
        return "(" + self.rng.choice(spec.values) + ")::" + spec.sql_type

    def _specs(self, table: TableSpec) -> list[ColumnSpec]:
        return columns_for(table, self.major)

    def _new_id(self, session: int) -> int:
        value = self.next_id[session]
        self.next_id[session] += 2
        return value

    def _added_value(self, name: str) -> str:
        if self.rng.random() < 0.3:
            return "NULL"
        number = self.rng.randint(-9, 9)
        return f"'v{number}'" if name == "added_nodef" else str(number)

    def _ids(self, conn: Conn, table: TableSpec, session: int) -> list[int]:
        rows = conn.execute(
            f"SELECT DISTINCT id FROM {table.qualified} WHERE id %% 2 = %s ORDER BY id",
            (session,),
        ).fetchall()
        return [r[0] for r in rows]

    def _where_one(self, table: TableSpec, row_id: int) -> str:
        if table.kind == "full":
            # One of possibly several identical rows.
            return (
                f"ctid = (SELECT ctid FROM {table.qualified} WHERE id = {row_id} "
                "ORDER BY ctid LIMIT 1)"
            )
        return f"id = {row_id}"

    # --- one change -----------------------------------------------------------------------------

    def insert(self, conn: Conn, table: TableSpec, session: int) -> None:
        rng = self.rng
        if table.kind == "full" and rng.random() < 0.3:
            ids = self._ids(conn, table, session)
            if ids:  # an exact duplicate of an existing row
                row_id = rng.choice(ids)
                conn.execute(
                    f"INSERT INTO {table.qualified} SELECT * FROM {table.qualified} "
                    f"WHERE {self._where_one(table, row_id)}"
                )
                self.counts.add("duplicate row", 1)
                return
        columns = ["id"]
        values = [str(self._new_id(session))]
        if table.kind == "keys":
            specs = self._specs(table)
            if self.keys_rows and rng.random() < 0.6:
                # A near-duplicate: an existing key with one value changed.
                base = dict(rng.choice(self.keys_rows))
                spec = rng.choice(specs)
                base[spec.name] = self._value(spec, nullable=False)
                self.counts.add("near-duplicate key")
            else:
                base = {s.name: self._value(s, nullable=False) for s in specs}
            self.keys_rows.append(base)
            columns += list(base)
            values += list(base.values())
        else:
            for spec in self._specs(table):
                columns.append(spec.name)
                values.append(self._value(spec))
        for toast in toast_for(table):
            if rng.random() < 0.7:
                columns.append(toast.name)
                values.append(toast_literal(rng, toast))
        if table.kind == "wide":
            for name in self.added:
                if name not in self.dropped and rng.random() < 0.5:
                    columns.append(name)
                    values.append(self._added_value(name))
            if "dropme" not in self.dropped:
                columns.append("dropme")
                values.append(f"'drop {values[0]}'")
        sql = (
            f"INSERT INTO {table.qualified} ({', '.join(q(c) for c in columns)}) "
            f"VALUES ({', '.join(values)})"
        )
        if table.kind == "keys":
            sql += " ON CONFLICT DO NOTHING"
        conn.execute(sql)
        self.counts.add("insert", 1)

    def update(self, conn: Conn, table: TableSpec, session: int) -> None:
        rng = self.rng
        ids = self._ids(conn, table, session)
        if not ids:
            self.insert(conn, table, session)
            return
        row_id = rng.choice(ids)
        specs = self._specs(table)
        choice = rng.random()
        sets: list[str] = []
        case = "update leaving TOAST unchanged"
        if table.kind == "keys":
            if choice < 0.5:
                spec = rng.choice(specs)
                sets.append(f"{q(spec.name)} = {self._value(spec, nullable=False)}")
                case = "key change"
            else:
                sets.append(f"id = {self._new_id(session)}")
        elif choice < 0.15 and table.kind == "wide":
            sets.append(f"id = {self._new_id(session)}")
            case = "key change"
        elif choice < 0.3:
            toast = rng.choice(toast_for(table))
            sets.append(f"{q(toast.name)} = {toast_literal(rng, toast)}")
            case = "update of a TOASTed column"
        else:
            for spec in rng.sample(specs, k=min(len(specs), rng.randint(1, 4))):
                sets.append(f"{q(spec.name)} = {self._value(spec)}")
            live = [n for n in self.added if n not in self.dropped]
            if table.kind == "wide" and live and rng.random() < 0.5:
                name = rng.choice(live)
                sets.append(f"{q(name)} = {self._added_value(name)}")
        statement = (
            f"UPDATE {table.qualified} SET {', '.join(sets)} WHERE {self._where_one(table, row_id)}"
        )
        if table.kind == "keys":
            # A changed key may collide with an existing one: try it in a savepoint.
            conn.execute("SAVEPOINT try_key")
            try:
                conn.execute(statement)
                conn.execute("RELEASE SAVEPOINT try_key")
            except psycopg.errors.UniqueViolation:
                conn.execute("ROLLBACK TO SAVEPOINT try_key")
                self.counts.add("savepoint rollback (key collision)")
                return
        else:
            conn.execute(statement)
        self.counts.add(case, 1)

    def delete(self, conn: Conn, table: TableSpec, session: int) -> None:
        ids = self._ids(conn, table, session)
        if ids:
            row_id = self.rng.choice(ids)
            conn.execute(f"DELETE FROM {table.qualified} WHERE {self._where_one(table, row_id)}")
            self.counts.add("delete", 1)

    def change(self, conn: Conn, session: int) -> None:
        tables = [t for t in self.tables if session == 0 or t.kind != "keys"]
        if not tables:  # only a "keys" table: the second session has nothing of its own
            return
        table = self.rng.choice(tables)
        r = self.rng.random()
        if r < 0.45:
            self.insert(conn, table, session)
        elif r < 0.85:
            self.update(conn, table, session)
        else:
            self.delete(conn, table, session)

    # --- transactions ---------------------------------------------------------------------------

    def transaction(self) -> None:
        rng = self.rng
        a, b = self.sessions
        r = rng.random()
        a.execute("BEGIN")
        if r < 0.2:  # interleaved with a second session, commits in either order
            b.execute("BEGIN")
            for _ in range(rng.randint(2, 8)):
                s = rng.randrange(2)
                self.change(self.sessions[s], s)
            first, second = (a, b) if rng.random() < 0.5 else (b, a)
            first.execute("COMMIT")
            second.execute("ROLLBACK" if rng.random() < 0.15 else "COMMIT")
            self.counts.add("interleaved sessions")
            return
        for _ in range(rng.randint(1, 5)):
            self.change(a, 0)
        if r < 0.3:
            a.execute("SAVEPOINT sp")
            for _ in range(rng.randint(1, 3)):
                self.change(a, 0)
            a.execute("ROLLBACK TO SAVEPOINT sp")
            self.change(a, 0)
            self.counts.add("savepoint rollback")
        if r < 0.36:
            a.execute("ROLLBACK")
            self.counts.add("aborted transaction")
        elif r < 0.44:
            self.gid += 1
            gid = f"oracle-{self.gid}"
            a.execute(f"PREPARE TRANSACTION '{gid}'")
            # Another session commits while this one is prepared (different rows).
            b.execute("BEGIN")
            self.change(b, 1)
            b.execute("COMMIT")
            if rng.random() < 0.2:
                a.execute(f"ROLLBACK PREPARED '{gid}'")
                self.counts.add("rolled back prepared transaction")
            else:
                a.execute(f"COMMIT PREPARED '{gid}'")
                self.counts.add("two-phase commit")
        else:
            a.execute("COMMIT")

    def streamed(self, rows: int) -> None:
        """One transaction well over logical_decoding_work_mem (64kB): streamed, with a
        subtransaction that aborts in the middle of it."""
        a = self.sessions[0]
        wide = [t for t in self.tables if t.kind == "wide"] or self.tables
        a.execute("BEGIN")
        for i in range(rows):
            self.insert(a, wide[i % len(wide)], 0)
            if i == rows // 2:
                a.execute("SAVEPOINT big")
                for _ in range(20):
                    self.insert(a, wide[0], 0)
                a.execute("ROLLBACK TO SAVEPOINT big")
        for _ in range(rows // 4):
            self.update(a, wide[0], 0)
        a.execute("COMMIT")
        self.counts.add("streamed transaction")

    def truncate(self) -> None:
        a = self.sessions[0]
        names = [t for t in self.tables if t.kind != "keys"]
        chosen = self.rng.sample(names, k=min(2, len(names)))
        if not chosen:
            return
        a.execute("BEGIN")
        a.execute("TRUNCATE " + ", ".join(t.qualified for t in chosen))
        for table in chosen:
            self.insert(a, table, 0)
        a.execute("COMMIT")
        self.counts.add("truncate", len(chosen))

    def add_columns(self) -> None:
        a = self.sessions[0]
        for table in self.tables:
            if table.kind != "wide":
                continue
            for name, definition in ADDED_COLUMNS:
                ddl = f"ALTER TABLE {table.qualified} ADD COLUMN {q(name)} {definition}"
                self.on_add_column(ddl)
                a.execute(ddl)
        self.added = [name for name, _ in ADDED_COLUMNS]
        self.counts.add("add column")

    def drop_columns(self) -> None:
        a = self.sessions[0]
        for table in self.tables:
            if table.kind != "wide":
                continue
            for name in DROPPED_COLUMNS:
                ddl = f"ALTER TABLE {table.qualified} DROP COLUMN {q(name)}"
                a.execute(ddl)
                self.on_drop_column(ddl)
        self.dropped = list(DROPPED_COLUMNS)
        self.counts.add("drop column")

    def run(self, transactions: int, streamed_rows: int) -> None:
        # No TRUNCATE after ADD COLUMN: rows from before it must reach the end untouched.
        plan = {
            transactions // 5: self.truncate,
            (2 * transactions) // 5: self.truncate,
            transactions // 2: self.add_columns,
            (3 * transactions) // 5: lambda: self.streamed(streamed_rows),
            (4 * transactions) // 5: self.drop_columns,
        }
        for step in range(transactions):
            if step in plan:
                plan[step]()
            self.transaction()
