"""The assembler over real decoded streams from PostgreSQL 15 and 18.

Streamed and two-phase transactions are read live over a replication connection (pgoutput,
``logical_decoding_work_mem`` = 64kB), so changes are decoded while their transaction is still
open: PostgreSQL 18 no longer streams a transaction it already knows to have aborted, which is
what reading afterwards through the SQL interface would find. Expected results come from the
server (table contents, each transaction's xid), never from constants.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg

from pgcdc.connection.protocol import XLogData
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions
from pgcdc.decoding.test_decoding import TestDecodingDecoder
from pgcdc.events import Commit, Event, Insert, Origin, StreamAbort, StreamCommit, StreamStart
from pgcdc.lsn import LSN
from pgcdc.transactions import (
    AssemblyOptions,
    CommittedTransaction,
    SpilledEvents,
    TransactionAssembler,
    TransactionOutcome,
)
from pgcdc.transactions.options import MB
from tests.conftest import Database

Conn = psycopg.Connection[Any]
BULK = "INSERT INTO bulk SELECT g, repeat('x', 100) FROM generate_series(%s::int, %s::int) g"
STALL_GUARD_SECONDS = 120.0


class LiveStream:
    """pgoutput through pgcdc's replication connection, decoded as it arrives."""

    def __init__(self, db: Database, options: PgOutputOptions) -> None:
        self.connection = ReplicationConnection.connect(
            db.conninfo(options="-c logical_decoding_work_mem=64kB")
        )
        pairs = options.for_server(self.connection.server_version)
        self.stream = self.connection.start_replication("s", options=pairs)
        self.decoder = PgOutputDecoder.for_options(options)
        self.events: list[Event] = []

    def read_until(self, done: Callable[[list[Event]], bool]) -> list[Event]:
        import time

        deadline = time.monotonic() + STALL_GUARD_SECONDS
        while not done(self.events):
            assert time.monotonic() < deadline, f"stream stalled after {len(self.events)} events"
            message = self.stream.read(timeout=1.0)
            if isinstance(message, XLogData):
                self.events.extend(self.decoder.decode(bytes(message.payload), message.data_start))
        return self.events

    def close(self) -> None:
        self.connection.close()


def setup(conn: Conn, *, two_phase: bool = False, plugin: str = "pgoutput") -> None:
    conn.execute("CREATE TABLE bulk (id int PRIMARY KEY, pad text)")
    conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    conn.execute(
        "SELECT pg_create_logical_replication_slot('s', %s, false, %s)", (plugin, two_phase)
    )


def xid_of(conn: Conn) -> int:
    """The current transaction's 32-bit xid, as the replication protocol reports it."""
    value = conn.execute("SELECT pg_current_xact_id()::text::bigint % 4294967296").fetchone()
    assert value is not None
    return int(value[0])


def rows_by_xid(conn: Conn) -> dict[int, list[int]]:
    """Committed rows of ``bulk`` by the xid that inserted them (subtransactions' own xids)."""
    result: dict[int, list[int]] = {}
    for row_id, xmin in conn.execute("SELECT id, xmin::text::bigint FROM bulk ORDER BY id"):
        result.setdefault(xmin, []).append(row_id)
    return result


def count(kind: type[Any]) -> Callable[[list[Event]], int]:
    return lambda events: sum(isinstance(e, kind) for e in events)


def assemble(events: Iterable[Event], **options: Any) -> tuple[list[CommittedTransaction], int]:
    """Whole transactions (events read into tuples) and how many were spilled."""
    with TransactionAssembler(AssemblyOptions(**options)) as assembler:
        out = []
        for txn in assembler.feed_all(events):
            events_read = tuple(txn.events)
            if isinstance(txn.events, SpilledEvents):
                txn.events.close()
            out.append(replace(txn, events=events_read))
        assert assembler.pending_transactions == 0
        return out, assembler.spilled_transactions


def inserted(txn: CommittedTransaction) -> list[int]:
    return [int(str(e.new[0])) for e in txn.events if isinstance(e, Insert)]


def test_streamed_transaction_with_rolled_back_subtransaction(db: Database, tmp_path: Path) -> None:
    with db.connect() as conn, db.connect() as other:
        setup(conn)
        live = LiveStream(db, PgOutputOptions(["pub"], proto_version=2, streaming="on"))
        try:
            conn.execute("BEGIN")
            big_xid = xid_of(conn)
            conn.execute(BULK, (1, 1000))
            conn.execute("SAVEPOINT sp")
            conn.execute(BULK, (1001, 2000))
            # Part of the subtransaction is streamed before it is rolled back.
            live.read_until(lambda ev: count(Insert)(ev) > 1001)
            other.execute("BEGIN")
            small_xid = xid_of(other)
            other.execute(BULK, (9000, 9000))
            other.execute("COMMIT")
            conn.execute("ROLLBACK TO SAVEPOINT sp")
            conn.execute(BULK, (3000, 3000))
            conn.execute("COMMIT")
            events = live.read_until(lambda ev: count(StreamCommit)(ev) == 1)
        finally:
            live.close()
        truth = rows_by_xid(conn)

    # The stream really is what the test is about: streamed, with a subtransaction abort.
    assert {e.xid for e in events if isinstance(e, StreamStart)} == {big_xid}
    assert [(e.xid, e.subxid != e.xid) for e in events if isinstance(e, StreamAbort)] == [
        (big_xid, True)
    ]

    out, spilled = assemble(events)
    assert spilled == 0
    assert [t.xid for t in out] == [small_xid, big_xid]  # commit order
    assert inserted(out[0]) == truth.pop(small_xid)
    assert inserted(out[1]) == sorted(r for rows in truth.values() for r in rows)

    # Spilled to disk (a tiny per-transaction limit), it comes out identical.
    spilled_out, spilled = assemble(
        events, spill_dir=str(tmp_path), max_txn_in_memory=64 * 1024 / MB
    )
    assert spilled == 1
    assert spilled_out == out
    assert list(tmp_path.glob("assembler-*")) == []


def test_aborted_streamed_transaction_is_dropped(db: Database) -> None:
    with db.connect() as conn, db.connect() as other:
        setup(conn)
        live = LiveStream(db, PgOutputOptions(["pub"], proto_version=2, streaming="on"))
        try:
            conn.execute("BEGIN")
            aborted_xid = xid_of(conn)
            conn.execute(BULK, (5001, 6000))
            live.read_until(lambda ev: count(Insert)(ev) > 0)
            conn.execute("ROLLBACK")
            other.execute("BEGIN")
            kept_xid = xid_of(other)
            other.execute(BULK, (7000, 7001))
            other.execute("COMMIT")  # also flushes the abort record to WAL
            events = live.read_until(
                lambda ev: count(StreamAbort)(ev) == 1 and count(Commit)(ev) == 1
            )
        finally:
            live.close()
        truth = rows_by_xid(conn)

    assert [(e.xid, e.subxid) for e in events if isinstance(e, StreamAbort)] == [
        (aborted_xid, aborted_xid)
    ]
    out, _ = assemble(events)
    assert [(t.xid, inserted(t)) for t in out] == [(kept_xid, truth[kept_xid])]
    assert set(truth) == {kept_xid}


def test_two_phase_commit_and_rollback(db: Database) -> None:
    with db.connect() as conn:
        setup(conn, two_phase=True)
        options = PgOutputOptions(["pub"], proto_version=3, two_phase=True)
        live = LiveStream(db, options)
        xids: dict[str, int] = {}
        try:
            for gid, first, last in (("g1", 1, 2), ("g2", 3, 3)):
                conn.execute("BEGIN")
                xids[gid] = xid_of(conn)
                conn.execute(BULK, (first, last))
                conn.execute(f"PREPARE TRANSACTION '{gid}'")
            conn.execute("BEGIN")
            xids["plain1"] = xid_of(conn)
            conn.execute(BULK, (4, 4))
            conn.execute("COMMIT")
            conn.execute("COMMIT PREPARED 'g1'")
            conn.execute("ROLLBACK PREPARED 'g2'")
            conn.execute("BEGIN")
            xids["plain2"] = xid_of(conn)
            conn.execute(BULK, (5, 5))
            conn.execute("COMMIT")
            events = live.read_until(lambda ev: count(Commit)(ev) == 2)
        finally:
            live.close()
        truth = rows_by_xid(conn)

    held, _ = assemble(events)
    assert [(t.xid, inserted(t), t.outcome) for t in held] == [
        (xids["plain1"], truth[xids["plain1"]], TransactionOutcome.COMMIT),
        (xids["g1"], truth[xids["g1"]], TransactionOutcome.COMMIT),
        (xids["plain2"], truth[xids["plain2"]], TransactionOutcome.COMMIT),
    ]
    assert xids["g2"] not in truth

    at_prepare, _ = assemble(events, emit_at_prepare=True)
    assert [(t.outcome, t.gid, t.xid, inserted(t)) for t in at_prepare] == [
        (TransactionOutcome.PREPARE, "g1", xids["g1"], truth[xids["g1"]]),
        (TransactionOutcome.PREPARE, "g2", xids["g2"], [3]),
        (TransactionOutcome.COMMIT, None, xids["plain1"], truth[xids["plain1"]]),
        (TransactionOutcome.COMMIT_PREPARED, "g1", xids["g1"], []),
        (TransactionOutcome.ROLLBACK_PREPARED, "g2", xids["g2"], []),
        (TransactionOutcome.COMMIT, None, xids["plain2"], truth[xids["plain2"]]),
    ]


def peek_pgoutput(conn: Conn) -> list[Event]:
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, "
        "'proto_version', '1', 'publication_names', 'pub')"
    ).fetchall()
    decoder = PgOutputDecoder(proto_version=1)
    return [e for lsn, data in rows for e in decoder.decode(bytes(data), LSN.parse(lsn))]


def test_large_plain_transaction_spills_and_reads_back_identical(
    db: Database, tmp_path: Path
) -> None:
    with db.connect() as conn:
        setup(conn)
        conn.execute("BEGIN")
        xid = xid_of(conn)
        conn.execute(BULK, (1, 3000))
        conn.execute("UPDATE bulk SET pad = 'y' WHERE id % 7 = 0")
        conn.execute("DELETE FROM bulk WHERE id % 11 = 0")
        conn.execute("COMMIT")
        events = peek_pgoutput(conn)
        truth = rows_by_xid(conn)

    in_memory, spilled = assemble(events)
    assert spilled == 0
    on_disk, spilled = assemble(
        events, spill_dir=str(tmp_path), max_reorderbuffer_in_memory=100 * 1024 / MB
    )
    assert spilled == 1
    assert on_disk == in_memory
    [txn] = on_disk
    assert txn.xid == xid
    assert inserted(txn) == sorted(truth[xid] + [r for r in range(1, 3001) if r % 11 == 0])


def test_origin_reported_and_filtered(db: Database) -> None:
    with db.connect() as conn:
        setup(conn)
        conn.execute("SELECT pg_replication_origin_create('node_b')")
        conn.execute("SELECT pg_replication_origin_session_setup('node_b')")
        conn.execute("BEGIN")
        replayed_xid = xid_of(conn)
        conn.execute("SELECT pg_replication_origin_xact_setup('0/AB', now())")
        conn.execute(BULK, (1, 2))
        conn.execute("COMMIT")
        conn.execute("SELECT pg_replication_origin_session_reset()")
        conn.execute("BEGIN")
        local_xid = xid_of(conn)
        conn.execute(BULK, (3, 3))
        conn.execute("COMMIT")
        events = peek_pgoutput(conn)

    assert [e.name for e in events if isinstance(e, Origin)] == ["node_b"]
    out, _ = assemble(events)
    assert [(t.xid, t.origin, t.origin_lsn) for t in out] == [
        (replayed_xid, "node_b", LSN("0/AB")),
        (local_xid, None, None),
    ]
    out, _ = assemble(events, origin_filter="none")
    assert [t.xid for t in out] == [local_xid]
    # The dropped transaction's Relation is carried to the next one.
    assert type(next(iter(out[0].events))).__name__ == "Relation"


def test_test_decoding_two_phase_through_sql(db: Database) -> None:
    with db.connect() as conn:
        setup(conn, two_phase=True, plugin="test_decoding")
        conn.execute("BEGIN")
        g1 = xid_of(conn)
        conn.execute(BULK, (1, 3))
        conn.execute("PREPARE TRANSACTION 'g1'")
        conn.execute("BEGIN")
        conn.execute(BULK, (4, 4))
        conn.execute("PREPARE TRANSACTION 'g2'")
        conn.execute("COMMIT PREPARED 'g1'")
        conn.execute("ROLLBACK PREPARED 'g2'")
        rows = conn.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_get_changes('s', NULL, NULL, "
            "'include-xids', '1', 'include-timestamp', '1', 'skip-empty-xacts', '1')"
        ).fetchall()
        truth = rows_by_xid(conn)

    decoder = TestDecodingDecoder()
    events = [e for lsn, data in rows for e in decoder.decode(data.encode(), LSN.parse(lsn))]
    out, _ = assemble(events)
    assert [(t.xid, inserted(t)) for t in out] == [(g1, truth[g1])]
    assert set(truth) == {g1}
