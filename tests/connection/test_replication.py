"""The replication stream against real walsenders (PG15 and PG18): feedback, restart, errors,
authentication, and the asyncio twin."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import struct
import time
from typing import Any

import pytest

from pgcdc.connection.protocol import PrimaryKeepalive, XLogData
from pgcdc.connection.replication import (
    AsyncReplicationConnection,
    ReplicationConnection,
    ReplicationStream,
)
from pgcdc.errors import (
    AuthenticationFailed,
    ConnectionLost,
    InvalidArgument,
    MissingReplicationPrivilege,
    ProtocolError,
    ReplicationStreamError,
    SlotInUse,
    SlotNotFound,
    UnsupportedFeature,
)
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from pgcdc.receiver import retryable

_numbers = itertools.count()
# Bounds on waiting for the server, so a broken stream fails the test instead of hanging it.
PATIENCE = 30.0


def unique(prefix: str) -> str:
    return f"{prefix}_{os.getpid()}_{next(_numbers)}"


def logical_slot(db, plugin: str = "test_decoding") -> str:
    name = unique("slot")
    db.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (name, plugin))
    return name


def confirmed_flush(db, slot: str) -> LSN:
    return LSN(
        db.scalar(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        )
    )


def read_changes(stream: ReplicationStream, commits: int) -> list[tuple[LSN, str]]:
    """test_decoding lines with their XLogData start, up to the ``commits``-th COMMIT."""
    lines: list[tuple[LSN, str]] = []
    deadline = time.monotonic() + PATIENCE
    while sum(text.startswith("COMMIT") for _, text in lines) < commits:
        assert time.monotonic() < deadline, f"only got {lines}"
        message = stream.read(timeout=1.0)
        if isinstance(message, XLogData):
            lines.append((message.data_start, bytes(message.payload).decode()))
    return lines


@pytest.fixture
def table(db):
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    return "t"


def test_keepalive_reply_keeps_an_idle_stream_alive(db, table):
    slot = logical_slot(db)
    with ReplicationConnection.connect(db.conninfo(), options="-c wal_sender_timeout=2s") as repl:
        assert repl.show("wal_sender_timeout") == "2s"
        # Status updates every 60 s would be far too late: only the replies can keep it alive.
        stream = repl.start_replication(slot, status_interval=60.0)
        requested = 0
        idle_until = time.monotonic() + 6.0  # three times wal_sender_timeout
        while time.monotonic() < idle_until:
            message = stream.read(timeout=0.5)
            # No changes; an empty transaction (autovacuum's ANALYZE) may come by.
            assert not isinstance(message, XLogData) or bytes(message.payload).startswith(
                (b"BEGIN", b"COMMIT")
            )
            if isinstance(message, PrimaryKeepalive) and message.reply_requested:
                requested += 1
        assert requested >= 2, "the server never asked for a reply; is the timeout in effect?"
        db.execute("INSERT INTO t VALUES (1, 'still here')")
        lines = read_changes(stream, commits=1)
        assert any("'still here'" in text for _, text in lines)
        stream.stop()
    assert "replication timeout" not in db.cluster.server_log()


def test_confirmed_flush_follows_only_the_consumer(db, table):
    slot = logical_slot(db)
    start = confirmed_flush(db, slot)
    for i in (1, 2, 3):
        db.execute("INSERT INTO t VALUES (%s, %s)", (i, f"row {i}"))
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, status_interval=0.1)
        lines = read_changes(stream, commits=3)
        commits = [lsn for lsn, text in lines if text.startswith("COMMIT")]
        assert commits == sorted(commits)
        assert commits[0] > start
        # Many status intervals go by with everything received but nothing confirmed.
        for _ in range(10):
            stream.read(timeout=0.1)
            assert confirmed_flush(db, slot) == start
        stream.confirm(commits[0])
        assert stream.confirmed_lsn == commits[0]
        wait_until(lambda: confirmed_flush(db, slot) == commits[0], timeout=PATIENCE)
        for _ in range(10):
            stream.read(timeout=0.1)
            assert confirmed_flush(db, slot) == commits[0]
        stream.confirm(start)  # going back is ignored, never reported
        assert stream.confirmed_lsn == commits[0]
        stream.stop()
    assert confirmed_flush(db, slot) == commits[0]

    # A new stream from the slot's position starts with the first unconfirmed transaction.
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot)
        lines = read_changes(stream, commits=1)
        changes = [text for _, text in lines if text.startswith("table ")]
        assert lines[0][1].startswith("BEGIN")
        assert len(changes) == 1
        assert "id[integer]:2 " in changes[0]
        stream.stop()


def test_restart_from_an_explicit_lsn(db, table):
    slot = logical_slot(db)
    for i in (1, 2):
        db.execute("INSERT INTO t VALUES (%s, 'x')", (i,))
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, options={"include-xids": False})
        first_commit = next(
            lsn for lsn, text in read_changes(stream, commits=1) if text == "COMMIT"
        )
        stream.stop()
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, first_commit, {"include-xids": "0"})
        changes = [text for _, text in read_changes(stream, commits=1) if "INSERT" in text]
        assert changes == ["table public.t: INSERT: id[integer]:2 v[text]:'x'"]
        stream.stop()


def test_iteration_yields_data_and_keepalives_are_visible(db, table):
    slot = logical_slot(db)
    db.execute("INSERT INTO t VALUES (1, 'a')")
    with ReplicationConnection.connect(db.conninfo()) as repl:
        with repl.start_replication(slot) as stream:
            payloads = []
            for message in stream:
                assert isinstance(message, XLogData)
                payloads.append(bytes(message.payload))
                if payloads[-1].startswith(b"COMMIT"):
                    break
            assert [p.split()[0] for p in payloads] == [b"BEGIN", b"table", b"COMMIT"]
            # A keepalive after the data says everything up to its wal_end has been sent.
            deadline = time.monotonic() + PATIENCE
            while stream.server_wal_end is None or stream.server_wal_end < message.data_start:
                assert time.monotonic() < deadline, "no keepalive after the data"
                stream.read(timeout=1.0)
            assert stream.last_keepalive is not None
            assert stream.server_wal_end == stream.last_keepalive.wal_end
            assert stream.server_wal_end >= message.data_start
            # Idle and caught up: read() comes back empty-handed when the timeout expires.
            assert any(stream.read(timeout=0.2) is None for _ in range(50))
        assert stream.ended
        with pytest.raises(InvalidArgument, match="has ended"):
            stream.read(timeout=0)
        with pytest.raises(InvalidArgument, match="has ended"):
            next(stream)
        assert repl.identify_system().dbname == db.name  # usable after the clean stop
        with pytest.raises(UnsupportedFeature, match="new connection"):
            repl.start_replication(slot).read(timeout=PATIENCE)
        assert repl.identify_system().dbname == db.name


def test_zero_timeout_reads_what_has_arrived(db, table):
    slot = logical_slot(db)
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot)
        db.execute("INSERT INTO t VALUES (1, 'polled')")
        received: list[bytes] = []
        deadline = time.monotonic() + PATIENCE
        while not any(b"'polled'" in payload for payload in received):
            assert time.monotonic() < deadline, "read(timeout=0) never took in the change"
            message = stream.read(timeout=0)
            if message is None:
                time.sleep(0.01)  # the consumer's own work, between polls
            elif isinstance(message, XLogData):
                received.append(bytes(message.payload))
        stream.stop()


def test_pgoutput_with_quoted_publication_name(db, table):
    publication = "it's a \\pub"
    db.execute(f'CREATE PUBLICATION "{publication}" FOR TABLE t')
    slot = logical_slot(db, "pgoutput")
    db.execute("INSERT INTO t VALUES (7, 'o''brien')")
    options = {"proto_version": "1", "publication_names": f'"{publication}"'}
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, options=options)
        kinds: list[int] = []
        while not kinds or kinds[-1] != ord("C"):
            message = stream.read(timeout=PATIENCE)
            assert message is not None
            if isinstance(message, XLogData):
                payload = bytes(message.payload)
                kinds.append(payload[0])
                if payload[0] == ord("I"):
                    insert = payload
        assert bytes(kinds) == b"BRIC"
        # Insert: 'I', relation OID, 'N', column count, then ('t', length, text) per column.
        assert insert[5:6] == b"N"
        assert struct.unpack_from(">h", insert, 6)[0] == 2
        assert insert[8:9] == b"t"
        assert insert[13 : 13 + struct.unpack_from(">i", insert, 9)[0]] == b"7"
        assert insert.endswith(b"t\x00\x00\x00\x07o'brien")
        stream.stop()


def test_terminated_walsender_raises_stream_error(db):
    slot = logical_slot(db)
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, status_interval=60.0)
        pid = db.scalar("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,))
        assert pid == repl.pgconn.backend_pid
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(ReplicationStreamError) as terminated:
            for _ in range(100):
                stream.read(timeout=1.0)
        assert terminated.value.sqlstate == "57P01"
        assert "terminating connection" in terminated.value.server_message


def test_a_write_after_the_walsenders_fatal_reports_the_fatal(db):
    """The server said why it closed (its FATAL is on our socket): a status update written
    after that fails, and the error is the server's, not a bare lost connection."""
    slot = logical_slot(db)
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, status_interval=60.0)
        pid = repl.pgconn.backend_pid
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        wait_until(
            lambda: not db.scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
        )
        with pytest.raises(ReplicationStreamError) as terminated:
            for lsn in range(1, 100):  # the first writes may still reach the kernel
                stream.confirm(LSN(lsn))
        assert terminated.value.sqlstate == "57P01"
        assert "terminating connection" in terminated.value.server_message
        assert stream.ended
        assert retryable(terminated.value)


def test_dropped_socket_raises_connection_lost(db):
    slot = logical_slot(db)
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot)
        # Cut the TCP connection under libpq, as a failing network would.
        with socket.socket(fileno=os.dup(repl.pgconn.socket)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
        with pytest.raises(ConnectionLost, match="last confirmed LSN"):
            for _ in range(100):
                stream.read(timeout=1.0)


def test_missing_and_busy_slots(db):
    slot = logical_slot(db)
    with ReplicationConnection.connect(db.conninfo()) as repl:
        with pytest.raises(SlotNotFound, match="no_such_slot"):
            repl.start_replication("no_such_slot")
        with pytest.raises(SlotNotFound):
            repl.drop_replication_slot("no_such_slot")
        stream = repl.start_replication(slot)
        with ReplicationConnection.connect(db.conninfo()) as second:
            with pytest.raises(SlotInUse) as in_use:
                second.start_replication(slot)
            assert in_use.value.active_pid == repl.pgconn.backend_pid
            assert in_use.value.slot == slot
            assert str(repl.pgconn.backend_pid) in str(in_use.value)
            assert second.identify_system().dbname == db.name  # still usable
        stream.stop()


@pytest.fixture
def replication_role(db, table):
    """A LOGIN REPLICATION role with SELECT on the table and nothing else."""
    role, password = unique("replicator"), "s3cret'pw"
    db.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD 's3cret''pw'")
    db.execute(f"GRANT SELECT ON t TO {role}")
    yield role, password
    db.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
        "WHERE slot_name LIKE %s AND NOT active",
        (f"{role}%",),
    )
    db.execute(f"DROP OWNED BY {role}")
    db.execute(f"DROP ROLE {role}")


def test_scram_replication_role_streams(db, replication_role):
    role, password = replication_role
    stored = db.scalar("SELECT rolpassword FROM pg_authid WHERE rolname = %s", (role,))
    assert stored.startswith("SCRAM-SHA-256$")
    assert db.scalar("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)) is False
    # require_auth makes libpq refuse any method but SCRAM.
    conninfo = db.conninfo(user=role, password=password, require_auth="scram-sha-256")
    with ReplicationConnection.connect(conninfo) as repl:
        slot = f"{role}_slot"
        repl.create_replication_slot(slot, "test_decoding", snapshot="nothing")
        db.execute("INSERT INTO t VALUES (1, 'for the replicator')")
        stream = repl.start_replication(slot)
        lines = read_changes(stream, commits=1)
        assert any("'for the replicator'" in text for _, text in lines)
        stream.confirm(lines[-1][0])
        stream.stop()
    assert confirmed_flush(db, slot) == lines[-1][0]


def test_wrong_password_and_missing_privilege(db, replication_role):
    role, _ = replication_role
    with pytest.raises(AuthenticationFailed, match="password authentication failed") as failed:
        ReplicationConnection.connect(db.conninfo(user=role, password="wrong"))
    assert ".pgpass" in str(failed.value)
    plain = unique("plain")
    db.execute(f"CREATE ROLE {plain} LOGIN PASSWORD 'pw'")
    try:
        with pytest.raises(MissingReplicationPrivilege, match="REPLICATION"):
            ReplicationConnection.connect(db.conninfo(user=plain, password="pw"))
    finally:
        db.execute(f"DROP ROLE {plain}")


# --- asyncio ---------------------------------------------------------------------------------


async def _async_round_trip(db: Any) -> None:
    repl = await AsyncReplicationConnection.connect(
        db.conninfo(), options="-c wal_sender_timeout=2s"
    )
    try:
        identity = await repl.identify_system()
        assert identity.dbname == db.name
        assert await repl.show("wal_sender_timeout") == "2s"
        slot = unique("aslot")
        created = await repl.create_replication_slot(slot, "test_decoding", snapshot="nothing")
        assert created.consistent_point > LSN(0)
        with pytest.raises(SlotNotFound):
            await repl.drop_replication_slot("no_such_slot")
        stream = await repl.start_replication(slot, status_interval=60.0)
        # Reads cancelled while waiting leave the stream usable (the generator just stops).
        for _ in range(3):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stream.read(), timeout=0.01)
        db.execute("INSERT INTO t VALUES (1, 'async')")
        texts = []
        async for message in stream:
            texts.append(bytes(message.payload).decode())
            if texts[-1].startswith("COMMIT"):
                commit = message.data_start
                break
        assert any("'async'" in text for text in texts)
        stream.confirm(commit)
        # Idle past wal_sender_timeout: the asyncio loop must answer the keepalives too.
        requested = 0
        idle_until = time.monotonic() + 5.0
        while time.monotonic() < idle_until:
            received = await stream.read(timeout=0.5)
            if isinstance(received, PrimaryKeepalive) and received.reply_requested:
                requested += 1
        assert requested >= 1
        assert stream.server_wal_end is not None
        await stream.stop()
        assert confirmed_flush(db, slot) == commit
        assert (await repl.execute("SELECT 1")).text(0, 0) == "1"
    finally:
        await repl.close()


def test_async_connection_and_stream(db, table):
    asyncio.run(_async_round_trip(db))


async def _async_terminate(db: Any) -> None:
    slot = logical_slot(db)
    async with await AsyncReplicationConnection.connect(db.conninfo()) as repl:
        stream = await repl.start_replication(slot, status_interval=60.0)
        db.execute("SELECT pg_terminate_backend(%s)", (repl.pgconn.backend_pid,))
        with pytest.raises(ReplicationStreamError) as terminated:
            for _ in range(100):
                await stream.read(timeout=1.0)
        assert terminated.value.sqlstate == "57P01"


def test_async_terminated_walsender(db):
    asyncio.run(_async_terminate(db))


# --- batches ---------------------------------------------------------------------------------


def _lines(batch: list[XLogData | PrimaryKeepalive]) -> list[tuple[LSN, str]]:
    return [(m.data_start, bytes(m.payload).decode()) for m in batch if isinstance(m, XLogData)]


def test_read_many_hands_out_the_stream_in_batches(db, table):
    slot = logical_slot(db)
    for first in (1, 101, 201):
        db.execute(
            "INSERT INTO t SELECT g, 'row ' || g FROM generate_series(%s::int, %s::int) g",
            (first, first + 99),
        )
    with ReplicationConnection.connect(db.conninfo(), options="-c wal_sender_timeout=2s") as repl:
        stream = repl.start_replication(slot, options={"include-xids": "0"}, status_interval=60.0)
        with pytest.raises(InvalidArgument, match="positive"):
            stream.read_many(limit=0)
        lines: list[tuple[LSN, str]] = []
        sizes = []
        deadline = time.monotonic() + PATIENCE
        while sum(text == "COMMIT" for _, text in lines) < 3:
            assert time.monotonic() < deadline, f"only got {len(lines)} lines"
            batch = stream.read_many(timeout=1.0, limit=7)
            sizes.append(len(batch))
            lines += _lines(batch)
        # What libpq had buffered came in batches, never above the limit. (How much it had
        # buffered at once depends on the machine's load: CI once saw 6 at most, not 7.)
        assert 1 < max(sizes) <= 7
        inserts = [text for _, text in lines if text.startswith("table ")]
        assert inserts == [
            f"table public.t: INSERT: id[integer]:{i} v[text]:'row {i}'" for i in range(1, 301)
        ]
        assert [lsn for lsn, _ in lines] == sorted(lsn for lsn, _ in lines)
        # Idle past wal_sender_timeout with status updates due only every 60 s: the batches
        # must answer the server's keepalive requests themselves.
        requested = 0
        idle_until = time.monotonic() + 6.0
        while time.monotonic() < idle_until:
            batch = stream.read_many(timeout=0.5)
            # No changes; an empty transaction (autovacuum's ANALYZE of t) may come by.
            assert not [text for _, text in _lines(batch) if text not in ("BEGIN", "COMMIT")]
            requested += sum(isinstance(m, PrimaryKeepalive) and m.reply_requested for m in batch)
        assert requested >= 2
        stream.stop()
    assert "replication timeout" not in db.cluster.server_log()


def _read_until_commit(read: Any, deadline: float) -> list[tuple[LSN, str]]:
    lines: list[tuple[LSN, str]] = []
    while not any(text.startswith("COMMIT") for _, text in lines):
        assert time.monotonic() < deadline, f"only got {lines}"
        lines += _lines(read())
    return lines


def test_read_many_gathers_messages_once_the_stream_has_caught_up(db, table):
    """After a batch below its limit (the stream has caught up with the server), read_many
    waits ``coalesce`` seconds before it reads again, so the server's next messages come
    together; a full batch is followed at once."""
    slot = logical_slot(db)
    db.execute("INSERT INTO t VALUES (1, 'first')")
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, coalesce=1.0)
        deadline = time.monotonic() + PATIENCE
        _read_until_commit(lambda: stream.read_many(timeout=1.0, limit=1000), deadline)
        # The batch with the COMMIT was not full: the next transaction, sent at once, is not
        # read before the pause is over.
        db.execute("INSERT INTO t VALUES (2, 'second')")
        started = time.monotonic()
        lines = _read_until_commit(lambda: stream.read_many(timeout=5.0, limit=1000), deadline)
        assert time.monotonic() - started >= 0.8
        assert "'second'" in lines[1][1]
        # Batches of one are always full: never a pause between them.
        db.execute("INSERT INTO t VALUES (3, 'third'), (4, 'fourth')")
        started = time.monotonic()
        lines = _read_until_commit(lambda: stream.read_many(timeout=5.0, limit=1), deadline)
        assert len(lines) == 4
        assert time.monotonic() - started < 1.0
        stream.stop()
    with ReplicationConnection.connect(db.conninfo()) as repl:
        with pytest.raises(InvalidArgument, match="coalesce"):
            repl.start_replication(slot, coalesce=-1)
        # Refused before START_REPLICATION: the connection still runs commands.
        assert repl.identify_system().dbname == db.name


def test_read_many_does_not_pause_in_a_backlog_of_wide_rows(db, table):
    """A read takes what libpq's buffer holds: with wide rows, fewer messages than a batch
    while the socket holds more. Such a batch is no sign of a caught-up stream, so no pause
    follows it (one pause a read drained 36 s where pg_recvlogical took 1 s, bench/oltp.py's
    mix shape); the pause comes once the socket is empty."""
    slot = logical_slot(db)
    db.execute("INSERT INTO t SELECT g, repeat(md5(g::text), 256) FROM generate_series(1, 400) g")
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, coalesce=1.0)
        started = time.monotonic()
        rows = 0
        committed = False
        # 3.3 MB in reads of libpq's buffer: hundreds of short batches, each a second's pause
        # before the fix (30 rows in 30 s); read at once after it (the bound is far from both).
        while not committed:
            assert time.monotonic() - started < PATIENCE / 2, f"only {rows} of 400 rows read"
            for _, text in _lines(stream.read_many(timeout=5.0, limit=1000)):
                rows += text.startswith("table ")
                committed = committed or text.startswith("COMMIT")
        assert rows == 400
        stream.stop()


def test_read_many_gives_what_came_before_a_bad_message_first(db, table):
    slot = logical_slot(db)
    db.execute("INSERT INTO t VALUES (1, 'small')")
    db.execute("INSERT INTO t VALUES (2, repeat('x', 5000))")
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, max_message_size=1000)
        lines: list[tuple[LSN, str]] = []
        deadline = time.monotonic() + PATIENCE
        with pytest.raises(ProtocolError, match="exceeds the 1000-byte limit"):
            while True:
                assert time.monotonic() < deadline
                lines += _lines(stream.read_many(timeout=1.0))
        # The whole first transaction, and the second's BEGIN, reached the consumer first.
        assert [text.split()[0] for _, text in lines] == ["BEGIN", "table", "COMMIT", "BEGIN"]
        assert "'small'" in lines[1][1]


async def _async_read_many(db: Any) -> None:
    slot = logical_slot(db)
    db.execute("INSERT INTO t SELECT g, 'async' FROM generate_series(1, 50) g")
    async with await AsyncReplicationConnection.connect(db.conninfo()) as repl:
        stream = await repl.start_replication(slot, coalesce=1.0)
        lines: list[tuple[LSN, str]] = []
        deadline = time.monotonic() + PATIENCE
        while not any(text.startswith("COMMIT") for _, text in lines):
            assert time.monotonic() < deadline
            lines += _lines(await stream.read_many(timeout=1.0, limit=5))
        assert sum(text.startswith("table ") for _, text in lines) == 50
        # A batch below its limit (here, surely: the one with this COMMIT) makes the next
        # transaction wait out the pause, as in sync. (The batch with the COMMIT above may
        # have been full, when reading outpaced the server and left a short batch earlier.)
        db.execute("INSERT INTO t VALUES (51, 'short batch')")
        armed: list[tuple[LSN, str]] = []
        while not any(text.startswith("COMMIT") for _, text in armed):
            assert time.monotonic() < deadline
            armed += _lines(await stream.read_many(timeout=5.0, limit=1000))
        db.execute("INSERT INTO t VALUES (52, 'later')")
        started = time.monotonic()
        later: list[tuple[LSN, str]] = []
        while not any(text.startswith("COMMIT") for _, text in later):
            assert time.monotonic() < deadline
            later += _lines(await stream.read_many(timeout=5.0, limit=5))
        assert time.monotonic() - started >= 0.8
        db.execute("SELECT pg_terminate_backend(%s)", (repl.pgconn.backend_pid,))
        with pytest.raises(ReplicationStreamError):
            for _ in range(100):
                await stream.read_many(timeout=1.0)


def test_async_read_many(db, table):
    asyncio.run(_async_read_many(db))
