"""The receiver end to end on PostgreSQL 15 and 18: a workload goes through a real slot into the
change log and comes back as the source committed it (pgoutput and test_decoding)."""

from __future__ import annotations

import gc
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from pgcdc.changelog import ChangeLog, ChangeLogWriter
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.errors import (
    ConnectionLost,
    InvalidOption,
    PublicationNotFound,
    ReplicationStreamError,
    SlotInUse,
    SlotNotFound,
)
from pgcdc.events import Delete, Insert, Update
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from pgcdc.receiver import (
    GC_THRESHOLDS,
    READ_COALESCE_SECONDS,
    Receiver,
    ReceiverOptions,
    ReceiverProgress,
    read_coalesce,
    session_options,
)
from pgcdc.transactions import AssemblyOptions, CommittedTransaction
from tests.changelog.helpers import log_rows
from tests.conftest import Database

from .helpers import (
    Conn,
    Fact,
    WrappedWriter,
    current_lsn,
    key_only,
    logged_facts,
    slot_position,
)

XID = "SELECT (txid_current() % 4294967296)::bigint"


def _xid(conn: Conn) -> int:
    row = conn.execute(XID).fetchone()
    assert row is not None
    return int(row[0])


def workload(db: Database) -> list[tuple[int, list[Fact]]]:
    """Run transactions; return (xid, changes) of each, in commit order, as the server saw them."""
    expected: list[tuple[int, list[Fact]]] = []
    with db.connect() as conn:
        with conn.transaction():
            xid = _xid(conn)
            rows = conn.execute(
                "INSERT INTO items SELECT g, 'name ' || g FROM generate_series(1, 5) g "
                "RETURNING id::text, name"
            ).fetchall()
        expected.append((xid, [("I", "items", tuple(r)) for r in rows]))
        with conn.transaction():
            xid = _xid(conn)
            rows = conn.execute(
                "UPDATE items SET name = name || '!' WHERE id <= 2 RETURNING id::text, name"
            ).fetchall()
            deleted = conn.execute("DELETE FROM items WHERE id = 5 RETURNING id::text").fetchall()
        changes: list[Fact] = [("U", "items", tuple(r)) for r in rows]
        changes += [("D", "items", (r[0], None)) for r in deleted]
        expected.append((xid, changes))
        # Interleaved: the later begin commits first, so it must come first.
        with db.connect() as other:
            conn.execute("BEGIN")
            first_xid = _xid(conn)
            conn.execute("INSERT INTO items VALUES (100, 'first begun')")
            with other.transaction():
                second_xid = _xid(other)
                other.execute("INSERT INTO items VALUES (200, 'first committed')")
            conn.execute("COMMIT")
        expected.append((second_xid, [("I", "items", ("200", "first committed"))]))
        expected.append((first_xid, [("I", "items", ("100", "first begun"))]))
        # Rolled back: must not appear.
        conn.execute("BEGIN")
        conn.execute("INSERT INTO items VALUES (300, 'rolled back')")
        conn.execute("ROLLBACK")
    return expected


def setup(db: Database, plugin: str, slots: tuple[str, ...] = ("s",)) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        for slot in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))


def options(db: Database, plugin: str, end_lsn: LSN, **extra: Any) -> ReceiverOptions:
    pubs = ("pub",) if plugin == "pgoutput" else ()
    values: dict[str, Any] = {"slot": "s", "plugin": plugin, "publications": pubs}
    values.update(extra)
    return ReceiverOptions(db.conninfo(), end_lsn=end_lsn, **values)


def compare(root: Path, expected: list[tuple[int, list[Fact]]]) -> None:
    got = logged_facts(root)
    assert [xid for xid, _ in got] == [xid for xid, _ in expected]
    for (_, got_changes), (_, want) in zip(got, expected, strict=True):
        assert key_only(got_changes) == key_only(want)
        inserts_updates = [c for c in got_changes if c[0] != "D"]
        assert inserts_updates == [c for c in want if c[0] != "D"]


@pytest.mark.parametrize("plugin", ["pgoutput", "test_decoding"])
def test_workload_reaches_the_change_log_as_committed(db: Database, tmp_path: Path, plugin: str):
    setup(db, plugin)
    expected = workload(db)
    with db.connect() as conn:
        end = current_lsn(conn)
    seen: list[ReceiverProgress] = []
    with ChangeLog(tmp_path).writer() as sink:
        receiver = Receiver(options(db, plugin, end), sink, on_progress=seen.append)
        progress = receiver.run()
        durable = sink.durable_lsn
    compare(tmp_path, expected)
    assert progress.stopped_by == "end_lsn"
    assert progress.transactions >= len(expected)
    assert progress.changes == sum(len(changes) for _, changes in expected)
    assert progress.durable_lsn == durable
    assert seen and seen[-1] == progress
    confirmed, _, active = slot_position(db, "s")
    assert not active
    assert confirmed is not None and confirmed <= max(durable, progress.confirmed_lsn)
    assert progress.confirmed_lsn == confirmed

    # A second run from the slot's position stores nothing new.
    with db.connect() as conn:
        end = current_lsn(conn)
    with ChangeLog(tmp_path).writer() as sink:
        again = Receiver(options(db, plugin, end), sink).run()
    assert again.transactions == 0
    compare(tmp_path, expected)


class ListSink:
    """A destination that stores whatever it is given, as a naive CLI output would: the
    receiver alone must keep re-sent transactions out of it."""

    def __init__(self) -> None:
        self.transactions: list[CommittedTransaction] = []
        self._last = LSN(0)

    @property
    def last_commit_lsn(self) -> LSN:
        return self._last

    def append(self, txn: CommittedTransaction) -> bool:
        self.transactions.append(txn)
        self._last = max(self._last, txn.commit_lsn)
        return True

    def flush(self) -> LSN:
        return self.transactions[-1].end_lsn if self.transactions else LSN(0)


def test_resent_transactions_are_dropped_by_the_receiver(db: Database):
    setup(db, "pgoutput", slots=("s", "behind"))
    expected = workload(db)
    with db.connect() as conn:
        end = current_lsn(conn)
    sink = ListSink()
    first = Receiver(options(db, "pgoutput", end), sink).run()
    stored = list(sink.transactions)
    assert [t.xid for t in stored if t.xid is not None][-len(expected) :] == [
        x for x, _ in expected
    ]
    # A slot still at the start re-sends all of it: the receiver drops every one.
    behind = options(db, "pgoutput", end, slot="behind")
    second = Receiver(behind, sink).run()
    assert sink.transactions == stored
    assert second.duplicates == first.transactions > 0
    assert second.transactions == 0


def test_session_settings_make_text_output_iso_and_utc(db: Database, tmp_path: Path):
    with db.connect() as conn:
        conn.execute("CREATE TABLE times (id int PRIMARY KEY, t timestamptz, d date, i interval)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute(
            "INSERT INTO times VALUES (1, '2024-02-29 23:30:00+05', '2024-02-29', "
            "'1 year 2 mons 3 days 04:05:06')"
        )
        conn.execute("SET DateStyle = ISO; SET TimeZone = UTC; SET IntervalStyle = postgres")
        row = conn.execute("SELECT id::text, t::text, d::text, i::text FROM times").fetchone()
        end = current_lsn(conn)
    assert row is not None
    # The user's own session options point the other way; pgcdc's must win.
    user = "-c DateStyle=German -c TimeZone=Asia/Tokyo -c IntervalStyle=sql_standard"
    conninfo = db.conninfo(options=user)
    assert session_options(conninfo).startswith(user)
    opts = ReceiverOptions(conninfo, "s", publications=("pub",), end_lsn=end)
    with ChangeLog(tmp_path).writer() as sink:
        Receiver(opts, sink).run()
    [(_, changes)] = logged_facts(tmp_path)
    assert changes == [("I", "times", tuple(row))]


def test_stop_event_flushes_confirms_and_returns(db: Database, tmp_path: Path):
    setup(db, "pgoutput")
    expected = workload(db)
    stop = threading.Event()
    results: list[ReceiverProgress] = []
    with ChangeLog(tmp_path).writer() as sink:
        receiver = Receiver(
            ReceiverOptions(db.conninfo(), "s", publications=("pub",), fsync_interval=3600),
            sink,
            on_progress=lambda p: stop.set() if p.transactions >= len(expected) else None,
        )
        thread = threading.Thread(target=lambda: results.append(receiver.run(stop)))
        thread.start()
        # The long fsync interval never fires: only a keepalive-time progress or stop ends it.
        thread.join(120)
        if thread.is_alive():
            stop.set()
            thread.join(30)
        assert not thread.is_alive()
        durable = sink.durable_lsn
    compare(tmp_path, expected)
    [progress] = results
    assert progress.stopped_by == "stop"
    assert progress.durable_lsn == durable
    confirmed, _, _ = slot_position(db, "s")
    assert confirmed == progress.confirmed_lsn


def test_misconfiguration_fails_early_with_typed_errors(db: Database, tmp_path: Path):
    with db.connect() as conn:
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    with ChangeLog(tmp_path).writer() as sink:
        with pytest.raises(SlotNotFound, match="create_slot=True"):
            Receiver(ReceiverOptions(db.conninfo(), "missing", publications=("pub",)), sink).run()
        with pytest.raises(PublicationNotFound, match="CREATE PUBLICATION"):
            Receiver(
                ReceiverOptions(db.conninfo(), "s", publications=("nope",), create_slot=True),
                sink,
            ).run()
    with pytest.raises(InvalidOption, match="publication"):
        ReceiverOptions(db.conninfo(), "s")
    with pytest.raises(InvalidOption, match="test_decoding"):
        ReceiverOptions(db.conninfo(), "s", plugin="test_decoding", streaming="on")


def test_create_slot_then_stream(db: Database, tmp_path: Path):
    with db.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    opts = ReceiverOptions(
        db.conninfo(), "made", publications=("pub",), create_slot=True, end_lsn=LSN(1)
    )
    with ChangeLog(tmp_path).writer() as sink:
        Receiver(opts, sink).run()
    confirmed, _, _ = slot_position(db, "made")
    assert confirmed is not None


def test_terminated_walsender_surfaces_typed_error_after_keeping_what_arrived(
    db: Database, tmp_path: Path
):
    setup(db, "pgoutput")
    expected = workload(db)
    errors: list[BaseException] = []
    progress: list[ReceiverProgress] = []
    opts = ReceiverOptions(
        db.conninfo(), "s", publications=("pub",), application_name="pgcdc_doomed"
    )
    with ChangeLog(tmp_path).writer() as sink:
        receiver = Receiver(opts, sink, on_progress=progress.append)

        def run() -> None:
            try:
                receiver.run()
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        wait_until(lambda: any(p.transactions >= len(expected) for p in progress) or errors)
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_replication "
            "WHERE application_name = 'pgcdc_doomed'"
        )
        thread.join(60)
        assert not thread.is_alive()
    [error] = errors
    assert isinstance(error, ReplicationStreamError | ConnectionLost), error
    compare(tmp_path, expected)  # what arrived before the error is kept


def test_a_slot_held_by_another_client_is_waited_for(db: Database, tmp_path: Path) -> None:
    """As after a crash, when the dead receiver's walsender still holds the slot: with
    ``slot_busy_wait`` the receiver retries until the slot is free; with 0 it fails at once."""
    setup(db, "test_decoding")
    expected = workload(db)
    with db.connect() as conn:
        end = current_lsn(conn)
    holder = ReplicationConnection.connect(db.conninfo())
    stream = holder.start_replication("s")
    with ChangeLog(tmp_path).writer() as sink:
        with pytest.raises(SlotInUse, match="active for PID"):
            Receiver(options(db, "test_decoding", end, slot_busy_wait=0), sink).run()
        result: list[ReceiverProgress | BaseException] = []

        def receive() -> None:
            try:
                result.append(Receiver(options(db, "test_decoding", end), sink).run())
            except BaseException as error:
                result.append(error)

        waiting = threading.Thread(target=receive)
        waiting.start()
        try:
            time.sleep(1.0)  # the receiver is retrying now
            assert not result, result
        finally:
            stream.stop()
            holder.close()
        waiting.join(60)
    assert not waiting.is_alive()
    [progress] = result
    assert isinstance(progress, ReceiverProgress), progress
    assert progress.stopped_by == "end_lsn"
    compare(tmp_path, expected)


def test_slot_busy_wait_must_not_be_negative(db: Database) -> None:
    with pytest.raises(InvalidOption, match="slot_busy_wait"):
        options(db, "test_decoding", LSN(1), slot_busy_wait=-1)


def test_the_collector_runs_less_often_while_receiving_and_as_before_after(db: Database):
    setup(db, "pgoutput")
    workload(db)
    with db.connect() as conn:
        end = current_lsn(conn)
    during: list[tuple[int, int, int]] = []

    class ThresholdSink(ListSink):
        def append(self, txn: CommittedTransaction) -> bool:
            during.append(gc.get_threshold())
            return super().append(txn)

    original = gc.get_threshold()
    gc.set_threshold(900, 11, 12)
    try:
        Receiver(options(db, "pgoutput", end), ThresholdSink()).run()
        after = gc.get_threshold()
    finally:
        gc.set_threshold(*original)
    assert during and set(during) == {tuple(map(max, GC_THRESHOLDS, (900, 11, 12)))}
    assert after == (900, 11, 12)


def test_a_restart_never_confirms_past_a_prepare_not_yet_received_again(
    db: Database, tmp_path: Path
) -> None:
    """A transaction prepared before the log's last commit and committed after it is replayed
    after a restart only while the slot is confirmed before its PREPARE, so a new receiver may
    not confirm its log's durable end before its stream has passed that end again."""
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    db.execute("CREATE PUBLICATION pub FOR TABLE items")
    db.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, true)")
    with db.connect() as conn:
        conn.execute("BEGIN")
        conn.execute("INSERT INTO items VALUES (1, 'prepared')")
        conn.execute("PREPARE TRANSACTION 'p'")
        conn.execute("INSERT INTO items VALUES (2, 'plain')")
        end = current_lsn(conn)
    options = ReceiverOptions(
        db.conninfo(), "s", publications=("pub",), proto_version=3, two_phase=True
    )
    root = tmp_path / "log"

    def receive(end_lsn: LSN | None, stop: threading.Event | None = None) -> None:
        with ChangeLog(root).writer() as writer:
            Receiver(replace(options, end_lsn=end_lsn), writer).run(stop)

    receive(end)  # logs the plain transaction and holds the prepared one
    held = slot_position(db, "s")[0]
    stop = threading.Event()
    stop.set()
    receive(None, stop)  # stops before it reads anything
    assert slot_position(db, "s")[0] == held
    db.execute("COMMIT PREPARED 'p'")
    with db.connect() as conn:
        end = current_lsn(conn)
    receive(end)  # the server replays the prepared transaction: its PREPARE was not confirmed
    rows = sorted(
        (int(key), name) for _, changes in logged_facts(root) for _, _, (key, name) in changes
    )
    assert rows == [(1, "prepared"), (2, "plain")]


class _WithoutRuns(WrappedWriter):
    """The change log's writer as a sink that takes no RowRuns."""

    accepts_row_runs = False


@pytest.mark.parametrize(
    "assembly",
    [
        AssemblyOptions(),
        # Runs a filter drops or a spilled transaction holds go in change by change.
        AssemblyOptions(white_table_list="public.items", max_txn_in_memory=0.02),
    ],
    ids=["defaults", "filter and spill"],
)
def test_row_runs_log_exactly_what_single_events_log(
    db: Database, tmp_path: Path, assembly: AssemblyOptions
) -> None:
    """The receiver's RowRuns (same kind, table, marker and width in a row) leave a change log
    identical, row for row and column for column, to the one logged event by event."""
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text, qty int)")
    db.execute("CREATE TABLE other (id int PRIMARY KEY, note text)")
    db.execute("ALTER TABLE other REPLICA IDENTITY FULL")
    db.execute("CREATE PUBLICATION pub FOR TABLE items, other")
    for slot in ("runs", "single"):
        db.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    with db.connect() as conn:
        conn.execute("INSERT INTO items SELECT g, 'n' || g, g FROM generate_series(1, 3000) g")
        conn.execute("INSERT INTO items VALUES (3001, NULL, NULL)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO other SELECT g, repeat('x', g) FROM generate_series(1, 50) g")
        conn.execute("UPDATE items SET qty = qty + 1 WHERE id <= 1500")
        conn.execute("UPDATE items SET id = id + 10000 WHERE id BETWEEN 10 AND 20")  # key
        conn.execute("UPDATE other SET note = 'y' WHERE id <= 10")  # old rows (FULL)
        conn.execute("COMMIT")
        conn.execute("DELETE FROM items WHERE id > 2000")
        conn.execute("ALTER TABLE items ADD COLUMN extra text")
        conn.execute("INSERT INTO items SELECT g, 'm', 1, 'e' FROM generate_series(5001, 5100) g")
        conn.execute("DELETE FROM other")
        end = current_lsn(conn)
    counted: dict[str, int] = {}
    for slot, writer_type in (("runs", ChangeLogWriter), ("single", _WithoutRuns)):
        options = ReceiverOptions(
            db.conninfo(),
            slot,
            publications=("pub",),
            end_lsn=end,
            assembly=replace(assembly, spill_dir=str(tmp_path / f"spill-{slot}")),
        )
        with writer_type(tmp_path / slot) as writer:
            counted[slot] = Receiver(options, writer).run().changes
    runs, single = log_rows(tmp_path / "runs"), log_rows(tmp_path / "single")
    assert runs.num_rows == single.num_rows > 5000
    assert runs.equals(single)
    # The progress counts every change logged, those of a spilled transaction too.
    kinds = runs.column("kind").cast(pa.string()).to_pylist()
    logged = sum(kind in ("insert", "update", "delete") for kind in kinds)
    assert counted == {"runs": logged, "single": logged}


def test_small_transactions_are_logged_as_postgresql_committed_them(
    db: Database, tmp_path: Path
) -> None:
    """OLTP transactions (one UPDATE; TPC-B's three UPDATEs and an INSERT; an UPDATE with the
    old row; a DELETE), which take the receiver's per-transaction fast paths, reach the log as
    the server committed them: its xids in commit order, commit times within each
    transaction's span on the server's clock, and the rows the tables hold afterwards."""
    db.execute("CREATE TABLE acct (id int PRIMARY KEY, bal int NOT NULL)")
    db.execute("CREATE TABLE branch (id int PRIMARY KEY, bal int NOT NULL, note text)")
    db.execute("ALTER TABLE branch REPLICA IDENTITY FULL")
    db.execute("CREATE TABLE hist (id int PRIMARY KEY, aid int, delta int)")
    db.execute("INSERT INTO acct SELECT g, 0 FROM generate_series(1, 20) g")
    db.execute("INSERT INTO branch SELECT g, 0, 'b' || g FROM generate_series(1, 3) g")
    db.execute("CREATE PUBLICATION pub FOR TABLE acct, branch, hist")
    db.execute("SELECT pg_create_logical_replication_slot('oltp', 'pgoutput')")
    committed: list[tuple[int, Any, Any]] = []  # xid, transaction start, after its commit
    with db.connect() as conn:
        for n in range(60):
            aid, delta = n % 20 + 1, n - 30
            with conn.transaction():
                xid, started = conn.execute(
                    "SELECT pg_current_xact_id()::text::bigint, now()"
                ).fetchone()  # type: ignore[misc]
                conn.execute("UPDATE acct SET bal = bal + %s WHERE id = %s", (delta, aid))
                if n % 3 == 0:
                    conn.execute(
                        "UPDATE branch SET bal = bal + %s WHERE id = %s", (delta, n // 3 % 3 + 1)
                    )
                    conn.execute("UPDATE acct SET bal = bal - 1 WHERE id = %s", (21 - aid,))
                    conn.execute("INSERT INTO hist VALUES (%s, %s, %s)", (n, aid, delta))
                if n % 10 == 9:
                    conn.execute("DELETE FROM hist WHERE id = %s", (n - 9,))
            (after,) = conn.execute("SELECT clock_timestamp()").fetchone()  # type: ignore[misc]
            committed.append((xid, started, after))
        end = current_lsn(conn)
    options = ReceiverOptions(db.conninfo(), "oltp", publications=("pub",), end_lsn=end)
    with ChangeLogWriter(tmp_path / "log") as writer:
        Receiver(options, writer).run()

    transactions = [t for t in ChangeLog(tmp_path / "log").read_transactions() if t.events]
    assert [t.xid for t in transactions] == [xid for xid, _, _ in committed]
    for txn, (_, started, after) in zip(transactions, committed, strict=True):
        assert txn.commit_time is not None and started <= txn.commit_time <= after
    commits = [t.commit_lsn for t in transactions]
    assert commits == sorted(set(commits)) and commits[-1] <= end
    # Replayed in log order, the logged rows are what the tables hold.
    replayed: dict[str, dict[str, tuple[Any, ...]]] = {"acct": {}, "branch": {}, "hist": {}}
    for txn in transactions:
        for event in txn.events:
            if isinstance(event, Insert | Update):
                replayed[event.table.name][str(event.new[0])] = tuple(event.new)
            elif isinstance(event, Delete):
                del replayed[event.table.name][str(event.old[0])]
    for table, rows in replayed.items():
        source = {
            str(row[0]): tuple(None if v is None else str(v) for v in row)
            for row in db.execute(f"SELECT * FROM {table}")
        }
        if table != "hist":  # the log holds the rows that changed
            source = {key: source[key] for key in rows}
        assert rows == source, table


def test_reads_gather_messages_only_as_long_as_a_tenth_of_the_flush_interval():
    """A caught-up receiver waits a little for the next messages (one wakeup for several),
    never long against how often it flushes, and not at all when every commit waits for it."""
    assert read_coalesce(0.0) == 0.0  # fsync_interval=0: synchronous replication
    assert read_coalesce(0.01) == pytest.approx(0.001)
    assert read_coalesce(0.25) == READ_COALESCE_SECONDS  # the pipeline's receiver
    assert read_coalesce(10.0) == READ_COALESCE_SECONDS  # the pgcdc command's default
    assert 0 < READ_COALESCE_SECONDS <= 0.01
