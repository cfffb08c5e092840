"""Shared pieces of the pipeline tests: filling a change log from a real slot, a randomized
workload over five tables, and reading the source back for comparison."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.compute as pc

from pgcdc.changelog import ChangeLog
from pgcdc.connection.sql import get_binary_changes
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions
from pgcdc.events import UNCHANGED_TOAST, Delete, Insert, Truncate, Update
from pgcdc.sinks import SinkKind, read_table, table_path
from pgcdc.transactions import CommittedTransaction, TransactionAssembler

SLOT = "s"
PUBLICATION = "pub"

# Table -> (key columns, or () for none). Created after the slot, as the issue asks.
TABLES: dict[str, tuple[str, ...]] = {
    "public.accounts": ("id",),
    "public.orders": ("region", "id"),
    "public.docs": ("id",),
    "public.audit": ("id", "note"),  # REPLICA IDENTITY FULL, no primary key
    "public.events": (),  # no key at all: changelog only
}


def prepare_source(conn: psycopg.Connection[Any], slots: tuple[str, ...] = (SLOT,)) -> None:
    conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR ALL TABLES")
    for slot in slots:
        conn.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")
    conn.execute(
        "CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12, 2), "
        "opened timestamptz, active bool)"
    )
    conn.execute("CREATE TABLE orders (region text, id bigint, qty int, PRIMARY KEY (region, id))")
    conn.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, body text, blob bytea)")
    # Out of line, uncompressed: an UPDATE of another column leaves body as unchanged TOAST.
    conn.execute("ALTER TABLE docs ALTER body SET STORAGE EXTERNAL")
    conn.execute("CREATE TABLE audit (id int, note text)")
    conn.execute("ALTER TABLE audit REPLICA IDENTITY FULL")
    conn.execute("CREATE TABLE events (kind text, payload text)")


def drain(
    conn: psycopg.Connection[Any], log: ChangeLog, **writer_options: Any
) -> list[CommittedTransaction]:
    """Move everything the slot has into the change log; return the transactions."""
    options = PgOutputOptions([PUBLICATION], proto_version=1, messages=True)
    server = conn.pgconn.server_version
    rows = get_binary_changes(conn, SLOT, options=options.for_server(server))
    decoder = PgOutputDecoder.for_options(options)
    logged = []
    with TransactionAssembler() as assembler, log.writer(**writer_options) as writer:
        for row in rows:
            for txn in assembler.feed_all(decoder.decode(row.data, row.lsn)):
                writer.append(txn)
                logged.append(txn)
        writer.flush()
    return logged


def slot_streamed(conn: psycopg.Connection[Any], slot: str) -> bool:
    """Whether the slot's walsender streamed a transaction (over logical_decoding_work_mem);
    its statistics reach the view when it exits, so wait a little for them."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        if row is not None and row[0]:
            return True
        time.sleep(0.3)
    return False


def _big(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghij") for _ in range(10)) * rng.randint(250, 400)


@dataclass
class Workload:
    """Random changes over the five tables; ``samples`` holds (wal lsn, source state)."""

    rng: random.Random
    next_id: int = 1
    samples: list[tuple[int, dict[str, list[dict[str, Any]]]]] = field(default_factory=list)
    added_column: bool = False

    def step(self, conn: psycopg.Connection[Any]) -> None:
        rng = self.rng
        with conn.transaction():
            for _ in range(rng.randint(1, 6)):
                self._one(conn)

    def _one(self, conn: psycopg.Connection[Any]) -> None:
        rng = self.rng
        choice = rng.random()
        i = self.next_id
        self.next_id += 1
        if choice < 0.35:
            conn.execute(
                "INSERT INTO accounts (id, owner, balance, opened, active) VALUES "
                "(%s, %s, %s, now() - %s * interval '1 hour', %s)",
                (i, f"owner {i}", Decimal(rng.randint(0, 10**6)) / 100, i, rng.random() < 0.5),
            )
            conn.execute(
                "INSERT INTO orders VALUES (%s, %s, %s)", (rng.choice("NSEW"), i, rng.randint(1, 9))
            )
            conn.execute(
                "INSERT INTO docs (id, title, body, blob) VALUES (%s, %s, %s, %s)",
                (i, f"doc {i}", _big(rng), bytes([i % 256, 0, 255])),
            )
            conn.execute("INSERT INTO audit VALUES (%s, %s)", (i, rng.choice(["a", "b", None])))
            conn.execute("INSERT INTO events VALUES ('insert', %s)", (str(i),))
        elif choice < 0.55:
            conn.execute(
                "UPDATE accounts SET balance = balance + 1, active = NOT active "
                "WHERE id IN (SELECT id FROM accounts ORDER BY random() LIMIT 3)"
            )
            conn.execute(
                "UPDATE orders SET qty = qty + 1 WHERE id IN "
                "(SELECT id FROM orders ORDER BY random() LIMIT 2)"
            )
            # Leaves body unchanged (TOAST not sent).
            conn.execute(
                "UPDATE docs SET title = title || '+' WHERE id IN "
                "(SELECT id FROM docs ORDER BY random() LIMIT 2)"
            )
            conn.execute("UPDATE audit SET note = 'u' WHERE id IN (SELECT id FROM audit LIMIT 1)")
        elif choice < 0.65:
            # Key updates: the row moves, its TOASTed body stays unchanged.
            conn.execute(
                "UPDATE docs SET id = id + 100000 WHERE id IN "
                "(SELECT id FROM docs WHERE id < 100000 ORDER BY random() LIMIT 1)"
            )
            conn.execute(
                "UPDATE orders SET region = region || 'x' WHERE id IN "
                "(SELECT id FROM orders ORDER BY random() LIMIT 1)"
            )
            conn.execute(
                "UPDATE accounts SET id = -id WHERE id IN "
                "(SELECT id FROM accounts WHERE id > 0 ORDER BY random() LIMIT 1)"
            )
        elif choice < 0.8:
            conn.execute(
                "DELETE FROM accounts WHERE id IN (SELECT id FROM accounts ORDER BY random() "
                "LIMIT 2)"
            )
            conn.execute(
                "DELETE FROM docs WHERE id IN (SELECT id FROM docs ORDER BY random() LIMIT 1)"
            )
            conn.execute(
                "DELETE FROM audit WHERE id IN (SELECT id FROM audit ORDER BY random() LIMIT 1)"
            )
            conn.execute("DELETE FROM orders WHERE id IN (SELECT id FROM orders LIMIT 1)")
        elif choice < 0.84:
            conn.execute("TRUNCATE orders")
        elif choice < 0.87 and not self.added_column:
            conn.execute("ALTER TABLE accounts ADD COLUMN note text")
            self.added_column = True
        elif self.added_column:
            conn.execute(
                "UPDATE accounts SET note = %s WHERE id IN (SELECT id FROM accounts LIMIT 2)",
                (f"n{i}",),
            )

    def sample(self, conn: psycopg.Connection[Any]) -> None:
        lsn = int(str(conn.execute("SELECT pg_current_wal_lsn() - '0/0'").fetchone()[0]))  # type: ignore[index]
        self.samples.append((lsn, source_state(conn)))


def table_rows(conn: psycopg.Connection[Any], name: str) -> tuple[list[str], list[dict[str, Any]]]:
    """A source table's column names and its rows (as dicts, sorted by ``sort_rows``)."""
    cursor = conn.execute(f"SELECT * FROM {name}")
    assert cursor.description is not None
    columns = [d.name for d in cursor.description]
    return columns, sort_rows([dict(zip(columns, row, strict=True)) for row in cursor])


def source_state(conn: psycopg.Connection[Any]) -> dict[str, list[dict[str, Any]]]:
    return {name: table_rows(conn, name)[1] for name in TABLES}


def sort_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: tuple((v is None, str(v)) for v in r.values()))


State = dict[str, list[dict[str, Any]]]


def column_names(conn: psycopg.Connection[Any]) -> dict[str, list[str]]:
    names = {}
    for name in TABLES:
        description = conn.execute(f"SELECT * FROM {name} LIMIT 0").description or []
        names[name] = [d.name for d in description]
    return names


def lake_path(lake: Path, name: str, kind: SinkKind) -> str:
    schema, table = name.split(".")
    return table_path(lake, schema, table, kind)


def mirror_rows(lake: Path, name: str, columns: list[str]) -> list[dict[str, Any]]:
    table = read_table(lake_path(lake, name, SinkKind.MIRROR))
    return sort_rows(table.select(columns).to_pylist())


def history_at(lake: Path, name: str, columns: list[str], lsn: int) -> list[dict[str, Any]]:
    table = read_table(lake_path(lake, name, SinkKind.HISTORY))
    mask = pc.and_(
        pc.less_equal(table.column("_valid_from_lsn"), lsn),
        pc.greater(table.column("_valid_to_lsn"), lsn),
    )
    return sort_rows(table.filter(mask).select(columns).to_pylist())


def assert_lake_matches(
    lake: Path,
    names: dict[str, list[str]],
    final: State,
    samples: list[tuple[int, State]],
    transactions: list[CommittedTransaction],
) -> None:
    """Mirrors equal the source, histories equal it at each sampled LSN, and every logged
    change is in its changelog exactly once; the workload did exercise the hard cases."""
    for name, keys in TABLES.items():
        columns = names[name]
        if not keys:
            assert not Path(lake_path(lake, name, SinkKind.MIRROR)).exists()
            continue
        assert mirror_rows(lake, name, columns) == final[name], name
        for lsn, state in samples:
            sampled_columns = list(state[name][0]) if state[name] else columns
            assert history_at(lake, name, sampled_columns, lsn) == state[name], (name, lsn)

    events = [e for t in transactions for e in t.events]
    assert any(isinstance(e, Truncate) for e in events)
    assert any(isinstance(e, Update) and UNCHANGED_TOAST in e.new for e in events)
    assert any(isinstance(e, Update) and e.old_is_key and e.table.name == "docs" for e in events)
    assert any(isinstance(e, Update) and e.old is not None and not e.old_is_key for e in events)
    assert_logged_once(lake, TABLES, transactions)


def assert_logged_once(
    lake: Path, names: Iterable[str], transactions: list[CommittedTransaction]
) -> None:
    """Every change of ``transactions`` (the change log) is in its table's changelog Delta
    table exactly once, and nothing else is."""
    # Per transaction, its changes in order (``_seq`` also counts Relation messages and the
    # like, which differ between two sessions or two protocol versions).
    logged: Counter[tuple[str, int, int, str]] = Counter()
    for txn in transactions:
        changes = [e for e in txn.events if isinstance(e, Insert | Update | Delete | Truncate)]
        for rank, event in enumerate(changes):
            tables = event.tables if isinstance(event, Truncate) else (event.table,)
            op = type(event).__name__.lower()
            for table in tables:
                logged[(table.qualified_name, int(txn.commit_lsn), rank, op)] += 1
    by_commit: dict[int, list[tuple[int, str, str]]] = {}
    for name in names:
        changelog = read_table(lake_path(lake, name, SinkKind.CHANGELOG))
        for commit_lsn, seq, op in zip(
            changelog.column("_commit_lsn").to_pylist(),
            changelog.column("_seq").to_pylist(),
            changelog.column("_op").to_pylist(),
            strict=True,
        ):
            by_commit.setdefault(commit_lsn, []).append((seq, name, op))
    written: Counter[tuple[str, int, int, str]] = Counter()
    for commit_lsn, rows in by_commit.items():
        seqs = sorted({seq for seq, _, _ in rows})
        for seq, name, op in rows:
            written[(name, commit_lsn, seqs.index(seq), op)] += 1
    assert written == logged
    assert max(written.values()) == 1
