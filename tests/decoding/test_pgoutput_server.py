"""The pgoutput decoder against real PostgreSQL 15 and 18 servers (the ``db`` fixture).

Streams are read with ``pg_logical_slot_peek_binary_changes``, which returns exactly the pgoutput
message bytes per row, so these tests do not depend on the replication connection.
"""

from __future__ import annotations

import select
import struct
import time
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions, max_proto_version
from pgcdc.errors import UnsupportedFeature
from pgcdc.events import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Insert,
    Message,
    Prepare,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from pgcdc.lsn import LSN
from tests.conftest import Database

Conn = psycopg.Connection[Any]


def peek(conn: Conn, slot: str, options: PgOutputOptions) -> list[Event]:
    """Decode everything in ``slot`` (without consuming it) through pgoutput with ``options``."""
    pairs = options.for_server(conn.info.server_version)
    flat = [item for pair in pairs.items() for item in pair]
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
        "%s, NULL, NULL, VARIADIC %s::text[])",
        (slot, flat),
    ).fetchall()
    decoder = PgOutputDecoder.for_options(options)
    return [event for lsn, data in rows for event in decoder.decode(bytes(data), LSN.parse(lsn))]


def create_slot(conn: Conn, slot: str, *, two_phase: bool = False) -> None:
    conn.execute(
        "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, %s)", (slot, two_phase)
    )


def run(conn: Conn, *statements: str) -> None:
    for sql in statements:
        conn.execute(sql)


def flush_wal(conn: Conn) -> None:
    """Flush the WAL (aborts are written without a flush, and the SQL interface only decodes up
    to the flush position) with a commit that pgoutput does not send (messages are off)."""
    conn.execute("SELECT pg_logical_emit_message(true, 'flush', '')")


def of(events: Sequence[Event], kind: type[Any], table: str | None = None) -> list[Any]:
    return [e for e in events if isinstance(e, kind) and (table is None or e.table.name == table)]


def i4(value: int) -> bytes:
    return struct.pack("!i", value)


WORKLOAD_SCHEMA = (
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN posint AS int CHECK (VALUE > 0)",
    "CREATE TABLE items (id int PRIMARY KEY, name text, m mood, p posint)",
    "CREATE TABLE full_rows (id int PRIMARY KEY, v text)",
    "ALTER TABLE full_rows REPLICA IDENTITY FULL",
    "CREATE TABLE by_index (a int NOT NULL, b text, c int)",
    "CREATE UNIQUE INDEX by_index_a ON by_index (a)",
    "ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_a",
    "CREATE TABLE toasty (id int PRIMARY KEY, big text, n int)",
    "ALTER TABLE toasty ALTER big SET STORAGE EXTERNAL",
    "CREATE TABLE parent (id serial PRIMARY KEY)",
    "CREATE TABLE child (id int PRIMARY KEY, parent_id int REFERENCES parent)",
    "CREATE PUBLICATION pub FOR ALL TABLES",
)
BIG = "0123456789abcdef" * 300  # 4800 bytes, stored out of line uncompressed (EXTERNAL)
WORKLOAD = (
    "INSERT INTO items VALUES (1, 'one', 'sad', 1), (2, 'Zoë', 'happy', 2)",
    "UPDATE items SET name = 'uno' WHERE id = 1",
    "UPDATE items SET id = 10 WHERE id = 1",
    "DELETE FROM items WHERE id = 2",
    "INSERT INTO full_rows VALUES (1, 'a')",
    "UPDATE full_rows SET v = 'b'",
    "DELETE FROM full_rows",
    "INSERT INTO by_index VALUES (1, 'x', 1)",
    "UPDATE by_index SET c = 2",
    "UPDATE by_index SET a = 5",
    "DELETE FROM by_index",
    f"INSERT INTO toasty VALUES (1, '{BIG}', 0)",
    "UPDATE toasty SET n = 1",
    "ALTER TABLE items ADD COLUMN note text",
    "INSERT INTO items VALUES (3, 'three', NULL, 3, 'noted')",
    "BEGIN",
    "INSERT INTO parent DEFAULT VALUES",
    "INSERT INTO child VALUES (1, 1)",
    "SELECT pg_logical_emit_message(true, 'txn', 'in a transaction')",
    "COMMIT",
    "SELECT pg_logical_emit_message(false, 'alone', '\\x00ff'::bytea)",
    "TRUNCATE parent RESTART IDENTITY CASCADE",
    "TRUNCATE items",
)


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_workload(db: Database, binary: bool) -> None:
    with db.connect() as conn:
        run(conn, *WORKLOAD_SCHEMA)
        create_slot(conn, "s")
        run(conn, *WORKLOAD)
        events = peek(conn, "s", PgOutputOptions(["pub"], binary=binary, messages=True))

    def v(text: str, binary_value: bytes | None = None) -> str | bytes:
        """A column value as the server sends it in this mode."""
        if not binary:
            return text
        return text.encode() if binary_value is None else binary_value

    # Types: the enum by its name, the domain by its base type's name.
    types = {(e.namespace, e.name) for e in of(events, Type)}
    assert ("public", "mood") in types
    assert ("pg_catalog", "int4") in types

    # Relation cache and ALTER TABLE ADD COLUMN mid-stream: a second Relation, wider.
    item_relations = [e.table for e in of(events, Relation) if e.table.name == "items"]
    assert [[c.name for c in t.columns] for t in item_relations[:2]] == [
        ["id", "name", "m", "p"],
        ["id", "name", "m", "p", "note"],
    ]
    # pgoutput re-sends unchanged definitions (after TRUNCATE): the decoder keeps the object.
    assert all(t is item_relations[1] for t in item_relations[2:])
    assert [c.is_key for c in item_relations[0].columns] == [True, False, False, False]
    inserts = of(events, Insert, "items")
    assert [e.new for e in inserts] == [
        (v("1", i4(1)), v("one"), v("sad"), v("1", i4(1))),
        (v("2", i4(2)), v("Zoë"), v("happy"), v("2", i4(2))),
        (v("3", i4(3)), v("three"), None, v("3", i4(3)), v("noted")),
    ]
    assert inserts[0].table is item_relations[0]
    assert inserts[2].table is item_relations[1]

    # REPLICA IDENTITY DEFAULT: old key only when the key changes.
    updates = of(events, Update, "items")
    assert [(e.old, e.old_is_key) for e in updates] == [
        (None, False),
        ((v("1", i4(1)), None, None, None), True),
    ]
    assert updates[1].new[0] == v("10", i4(10))
    (deleted,) = of(events, Delete, "items")
    assert (deleted.old, deleted.old_is_key) == ((v("2", i4(2)), None, None, None), True)

    # REPLICA IDENTITY FULL: the whole old row.
    (full_update,) = of(events, Update, "full_rows")
    assert full_update.table.replica_identity is ReplicaIdentity.FULL
    assert (full_update.old, full_update.old_is_key) == ((v("1", i4(1)), v("a")), False)
    (full_delete,) = of(events, Delete, "full_rows")
    assert (full_delete.old, full_delete.old_is_key) == ((v("1", i4(1)), v("b")), False)

    # REPLICA IDENTITY USING INDEX: the index columns are the key.
    (index_relation,) = [e.table for e in of(events, Relation) if e.table.name == "by_index"]
    assert index_relation.replica_identity is ReplicaIdentity.INDEX
    assert [c.name for c in index_relation.key_columns] == ["a"]
    index_updates = of(events, Update, "by_index")
    assert [(e.old, e.old_is_key) for e in index_updates] == [
        (None, False),
        ((v("1", i4(1)), None, None), True),
    ]
    (index_delete,) = of(events, Delete, "by_index")
    assert index_delete.old == (v("5", i4(5)), None, None)

    # An unchanged TOASTed value is not sent.
    (toast_insert,) = of(events, Insert, "toasty")
    assert toast_insert.new[1] == v(BIG)
    (toast_update,) = of(events, Update, "toasty")
    assert toast_update.new == (v("1", i4(1)), UNCHANGED_TOAST, v("1", i4(1)))

    # Messages, transactional (inside its transaction) and not.
    messages = of(events, Message)
    assert [(m.transactional, m.prefix, m.content) for m in messages] == [
        (True, "txn", b"in a transaction"),
        (False, "alone", b"\x00\xff"),
    ]
    position = events.index(messages[0])
    assert isinstance(
        next(e for e in reversed(events[:position]) if isinstance(e, (Begin, Commit))), Begin
    )

    # TRUNCATE ... RESTART IDENTITY CASCADE names both tables; a plain one neither flag.
    truncates = of(events, Truncate)
    assert [
        (sorted(t.name for t in e.tables), e.cascade, e.restart_identity) for e in truncates
    ] == [(["child", "parent"], True, True), (["items"], False, False)]

    # Every change sits between a Begin and a Commit whose LSNs agree.
    begins, commits = of(events, Begin), of(events, Commit)
    assert len(begins) == len(commits) > 10
    assert [b.final_lsn for b in begins] == [c.commit_lsn for c in commits]
    assert all(
        c.end_lsn is not None and c.commit_lsn is not None and c.end_lsn > c.commit_lsn
        for c in commits
    )


class LiveStream:
    """A raw replication connection streaming ``slot`` through pgoutput, so changes are decoded
    while their transaction is still open (needed for streamed aborts: PostgreSQL 18 no longer
    streams a transaction it already knows aborted, as the SQL interface would find it)."""

    def __init__(self, db: Database, slot: str, options: PgOutputOptions) -> None:
        self.conn = psycopg.Connection.connect(
            db.conninfo(replication="database", options="-c logical_decoding_work_mem=64kB"),
            autocommit=True,
        )
        pairs = options.for_server(self.conn.info.server_version)
        text = ", ".join(
            f"{name} '{value.replace(chr(39), chr(39) * 2)}'" for name, value in pairs.items()
        )
        pgconn = self.conn.pgconn
        pgconn.send_query(f"START_REPLICATION SLOT {slot} LOGICAL 0/0 ({text})".encode())
        result = pgconn.get_result()
        assert result is not None
        assert result.status == psycopg.pq.ExecStatus.COPY_BOTH, pgconn.get_error_message()
        self.decoder = PgOutputDecoder.for_options(options)
        self.events: list[Event] = []

    def read_until(self, done: Any, timeout: float = 120.0) -> list[Event]:
        """Decode XLogData until ``done(events)``; answer keepalives that ask for a reply."""
        pgconn = self.conn.pgconn
        deadline = time.monotonic() + timeout
        while not done(self.events):
            assert time.monotonic() < deadline, f"stream stalled after {len(self.events)} events"
            size, view = pgconn.get_copy_data(1)
            if size == 0:
                select.select([pgconn.socket], [], [], 1.0)
                pgconn.consume_input()
                continue
            assert size > 0, pgconn.get_error_message()
            data = bytes(view)
            if data[:1] == b"w":  # XLogData: start, end, send time, then the payload
                (start,) = struct.unpack_from("!Q", data, 1)
                self.events.extend(self.decoder.decode(data[25:], LSN(start)))
            elif data[:1] == b"k" and data[17]:  # keepalive asking for a reply
                (end,) = struct.unpack_from("!Q", data, 1)
                pgconn.put_copy_data(b"r" + struct.pack("!QQQqB", end, end, end, 0, 0))
                pgconn.flush()
        return self.events

    def close(self) -> None:
        self.conn.close()


def assert_stream_blocks_well_formed(events: Sequence[Event]) -> None:
    """Stream Start/Stop alternate; every change inside a block carries an xid (the block's, or
    one of its subtransactions'), and none outside."""
    open_xid: int | None = None
    for event in events:
        if isinstance(event, StreamStart):
            assert open_xid is None
            open_xid = event.xid
        elif isinstance(event, StreamStop):
            assert open_xid is not None
            open_xid = None
        elif isinstance(event, (Insert, Update, Delete, Truncate, Relation, Type, Message)):
            assert (event.xid is None) == (open_xid is None)
            if event.xid is not None and open_xid is not None:
                assert event.xid >= open_xid  # subtransactions get later xids
    assert open_xid is None


BULK = "INSERT INTO bulk SELECT g, repeat('x', 100) FROM generate_series(%d, %d) g"


def streamed_workload(db: Database, options: PgOutputOptions) -> list[Event]:
    """A committed transaction with a savepoint rolled back after part of it was streamed, then
    a transaction rolled back after part of it was streamed, decoded live."""
    with db.connect() as conn:
        run(
            conn,
            "CREATE TABLE bulk (id int PRIMARY KEY, pad text)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        )
        create_slot(conn, "s")
        live = LiveStream(db, "s", options)
        try:
            run(conn, "BEGIN", BULK % (1, 1000), "SAVEPOINT sp", BULK % (1001, 2000))
            live.read_until(lambda events: len(of(events, Insert)) > 1001)
            run(conn, "ROLLBACK TO SAVEPOINT sp", BULK % (3000, 3000), "COMMIT")
            live.read_until(lambda events: of(events, StreamCommit))
            run(conn, "BEGIN", BULK % (5001, 6000))
            live.read_until(lambda events: len(of(events, Insert)) > 2100)
            run(conn, "ROLLBACK")
            flush_wal(conn)
            return live.read_until(lambda events: len(of(events, StreamAbort)) == 2)
        finally:
            live.close()


def test_streaming_commit_abort_and_rolled_back_subtransaction(db: Database) -> None:
    events = streamed_workload(db, PgOutputOptions(["pub"], proto_version=2, streaming="on"))

    assert_stream_blocks_well_formed(events)
    assert not of(events, Begin)  # both transactions were too big to stay in memory
    starts = of(events, StreamStart)
    committed_xid, aborted_xid = starts[0].xid, starts[-1].xid
    assert committed_xid != aborted_xid
    assert starts[0].first_segment
    assert [s.first_segment for s in starts if s.xid == committed_xid].count(True) == 1

    (stream_commit,) = of(events, StreamCommit)
    assert stream_commit.xid == committed_xid
    assert stream_commit.end_lsn > stream_commit.commit_lsn
    aborts = of(events, StreamAbort)
    # The savepoint's rollback names the subtransaction; the whole abort names the top xid.
    assert [(a.xid, a.subxid == a.xid) for a in aborts] == [
        (committed_xid, False),
        (aborted_xid, True),
    ]
    assert all(a.abort_lsn is None and a.abort_time is None for a in aborts)

    # Streamed changes carry their subtransaction's xid, so the rows the Stream Abort discards
    # are exactly those of the rolled-back savepoint.
    def ids(xid: int) -> set[int]:
        return {int(e.new[0]) for e in of(events, Insert) if e.xid == xid}

    # Only what was streamed before an abort arrives (a prefix); the server drops the rest.
    rolled_back = ids(aborts[0].subxid)
    assert rolled_back == set(range(1001, 1001 + len(rolled_back)))
    assert rolled_back
    assert ids(committed_xid) == set(range(1, 1001))
    # ROLLBACK TO SAVEPOINT re-opens the savepoint: row 3000 lives in a new subtransaction.
    kept = {
        int(e.new[0])
        for e in of(events, Insert)
        if e.xid not in (committed_xid, aborted_xid, aborts[0].subxid)
    }
    assert kept == {3000}
    aborted = ids(aborted_xid)
    assert aborted == set(range(5001, 5001 + len(aborted)))
    assert aborted
    assert events.index(stream_commit) > events.index(aborts[0])


def test_two_phase(db: Database) -> None:
    with db.connect() as conn:
        run(
            conn,
            "CREATE TABLE t (id int PRIMARY KEY)",
            "CREATE TABLE bulk (id int PRIMARY KEY, pad text)",
            "CREATE PUBLICATION pub FOR ALL TABLES",
        )
        create_slot(conn, "s", two_phase=True)
        run(conn, "BEGIN", "INSERT INTO t VALUES (1)", "PREPARE TRANSACTION 'g1'")
        run(conn, "COMMIT PREPARED 'g1'")
        run(conn, "BEGIN", "INSERT INTO t VALUES (2)", "PREPARE TRANSACTION 'g2'")
        run(conn, "ROLLBACK PREPARED 'g2'")
        run(conn, "BEGIN", BULK % (1, 1500), "PREPARE TRANSACTION 'big'")
        run(conn, "COMMIT PREPARED 'big'")
        run(conn, "SET logical_decoding_work_mem = '64kB'")
        options = PgOutputOptions(["pub"], proto_version=3, two_phase=True, streaming="on")
        events = peek(conn, "s", options)

    assert_stream_blocks_well_formed(events)
    begin_prepares = of(events, BeginPrepare)
    prepares = of(events, Prepare)
    assert [(b.gid, b.xid) for b in begin_prepares] == [(p.gid, p.xid) for p in prepares]
    assert [p.gid for p in prepares] == ["g1", "g2"]
    assert all(
        b.prepare_lsn == p.prepare_lsn for b, p in zip(begin_prepares, prepares, strict=True)
    )
    (g1_insert, g2_insert) = of(events, Insert, "t")
    assert (g1_insert.new, g2_insert.new) == (("1",), ("2",))

    commits = of(events, CommitPrepared)
    assert [c.gid for c in commits] == ["g1", "big"]
    assert commits[0].xid == prepares[0].xid
    (rollback,) = of(events, RollbackPrepared)
    assert (rollback.gid, rollback.xid) == ("g2", prepares[1].xid)
    assert rollback.prepare_end_lsn == prepares[1].end_lsn
    assert rollback.rollback_time >= rollback.prepare_time

    # The big prepared transaction was streamed, then prepared with Stream Prepare.
    (stream_prepare,) = of(events, StreamPrepare)
    assert stream_prepare.gid == "big"
    assert {s.xid for s in of(events, StreamStart)} == {stream_prepare.xid}
    assert commits[1].xid == stream_prepare.xid
    assert len(of(events, Insert, "bulk")) == 1500


def test_parallel_streaming_abort_carries_lsn_and_time(db: Database) -> None:
    options = PgOutputOptions(["pub"], proto_version=4, streaming="parallel")
    if db.major < 16:
        # Protocol 4 does not exist there: the builder says so, and so does the server.
        with db.connect() as conn:
            run(conn, "CREATE PUBLICATION pub FOR ALL TABLES")
            create_slot(conn, "s")
            with pytest.raises(UnsupportedFeature, match="protocol 3 at most"):
                options.for_server(conn.info.server_version)
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="proto_version=4"):
                conn.execute(
                    "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, "
                    "'proto_version', '4', 'publication_names', 'pub')"
                )
        return
    (before,) = db.execute("SELECT clock_timestamp()")[0]
    events = streamed_workload(db, options)
    (after,) = db.execute("SELECT clock_timestamp()")[0]

    assert_stream_blocks_well_formed(events)
    aborts = of(events, StreamAbort)
    assert [a.subxid == a.xid for a in aborts] == [False, True]
    for abort in aborts:
        assert abort.abort_lsn is not None
        assert abort.abort_time is not None
        assert before <= abort.abort_time <= after
        # The abort record comes after the changes it aborts.
        aborted = [e for e in of(events, Insert) if e.xid == abort.subxid]
        assert aborted
        assert abort.abort_lsn > max(e.lsn for e in aborted)


def test_newest_protocol_with_all_options_is_accepted(db: Database) -> None:
    """What the builder produces for this server is what the server accepts; one version more
    is refused by both."""
    with db.connect() as conn:
        run(conn, "CREATE TABLE t (id int)", "CREATE PUBLICATION pub FOR ALL TABLES")
        create_slot(conn, "s", two_phase=True)
        run(conn, "INSERT INTO t VALUES (1)")
        server = conn.info.server_version
        newest = max_proto_version(server)
        options = PgOutputOptions(
            ["pub"],
            proto_version=newest,
            binary=True,
            messages=True,
            streaming="parallel" if newest >= 4 else "on",
            two_phase=True,
            origin="any" if newest >= 4 else None,
        )
        events = peek(conn, "s", options)
        assert [e.new for e in of(events, Insert)] == [(i4(1),)]
        with pytest.raises(psycopg.errors.FeatureNotSupported, match="or lower"):
            conn.execute(
                "SELECT count(*) FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, "
                "'proto_version', %s, 'publication_names', 'pub')",
                (str(newest + 1),),
            )
        with pytest.raises(UnsupportedFeature):
            PgOutputOptions(["pub"], proto_version=min(newest + 1, 4)).for_server(
                server if newest < 4 else 150000
            )


def test_publication_names_are_quoted_as_the_server_reads_them(db: Database) -> None:
    with db.connect() as conn:
        run(
            conn,
            "CREATE TABLE a (id int)",
            "CREATE TABLE b (id int)",
            "CREATE TABLE c (id int)",
            'CREATE PUBLICATION "Mixed,Case" FOR TABLE a',
            'CREATE PUBLICATION "say ""hi""" FOR TABLE b',
            "CREATE PUBLICATION plain FOR TABLE c",
        )
        create_slot(conn, "s")
        run(
            conn, "INSERT INTO a VALUES (1)", "INSERT INTO b VALUES (2)", "INSERT INTO c VALUES (3)"
        )
        events = peek(conn, "s", PgOutputOptions(["Mixed,Case", 'say "hi"']))
        assert [(e.table.name, e.new) for e in of(events, Insert)] == [("a", ("1",)), ("b", ("2",))]
        events = peek(conn, "s", PgOutputOptions(["plain"]))
        assert [(e.table.name, e.new) for e in of(events, Insert)] == [("c", ("3",))]
