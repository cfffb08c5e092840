"""The pipeline rides out server faults, on PostgreSQL 15 and 18: the walsender terminated, the
server stopped (immediate) and started again, both while a workload runs. The receiver process
reconnects on its own, resumes from the slot and the change log's end, and in the end the log
holds every change exactly once and replays to the source's rows, value by value. Errors a
retry cannot fix (a dropped publication or slot) end the run with their typed error. A server
stopped while the initial snapshot copies makes the next session take the snapshot again.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc import _native, pipeline
from pgcdc.changelog import ChangeLog
from pgcdc.decoding.values import pg_text, row_to_python
from pgcdc.errors import PublicationNotFound, SlotNotFound, SlotReplaced
from pgcdc.events import Delete, Insert, Table, Update
from pgcdc.localpg import LocalCluster, wait_until
from pgcdc.lsn import LSN
from pgcdc.pipeline.process import ReceiverProcess
from pgcdc.receiver import RetryPolicy
from pgcdc.sinks import SinkKind, read_table
from pgcdc.storage import StorageOptions
from tests.conftest import _INSTALLATIONS, TEST_SETTINGS, Database
from tests.faults.ha import pipeline_running

# Short waits so the tests do not idle; the policy itself is tested in tests/receiver.
FAST_RETRY = RetryPolicy(initial=0.2, maximum=1.0, jitter=0.5)
SLOT = "rc"
Row = tuple[Any, ...]


def _settings(conninfo: str, tmp_path: Path, **changes: Any) -> pipeline.Settings:
    settings = pipeline.Settings(
        conninfo=conninfo,
        slot=SLOT,
        publications=("pub",),
        snapshot="never",
        changelog=str(tmp_path / "log"),
        lake=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"),
        kinds=(SinkKind.MIRROR,),
        master="local[2]",
        trigger_interval=0.5,
        retry=FAST_RETRY,
    )
    return pipeline.with_overrides(settings, **changes)


# The table the workload writes.
ITEMS = "CREATE TABLE items (id int PRIMARY KEY, v text, n int NOT NULL)"


def _source(conninfo: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(ITEMS)
        conn.execute("CREATE PUBLICATION pub FOR TABLE items")
        conn.execute(f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")


class Workload:
    """Transactions of inserts, updates and deletes in a thread until stopped. It rides out
    the faults itself (a failed transaction is given up, a new connection opened): what the
    source holds afterwards is the truth the change log is compared with.

    ``recent``: only rows with ids this close below the newest are updated (transactions then
    stay small however long the workload runs); ``pause``: seconds between transactions."""

    def __init__(self, conninfo: str, *, recent: int | None = None, pause: float = 0.0) -> None:
        self.conninfo = conninfo
        self.recent = recent
        self.pause = pause
        self.transactions = 0  # committed, as far as the client knows
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="workload", daemon=True)

    def __enter__(self) -> Workload:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.thread.join(60)
        assert self.error is None, self.error

    def wait_for(self, transactions: int) -> None:
        wait_until(lambda: self.transactions >= transactions or self.error, timeout=120)
        assert self.error is None, self.error

    def _run(self) -> None:
        batch = 0
        while not self.stopping.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=5) as conn:
                    while not self.stopping.is_set():
                        batch += 1
                        self._transaction(conn, batch)
                        self.transactions += 1
            except psycopg.OperationalError:
                time.sleep(0.1)
            except BaseException as error:
                self.error = error
                raise

    def _transaction(self, conn: psycopg.Connection[Any], batch: int) -> None:
        first = batch * 10
        # Earlier rows change and go: every change is distinct (n counts the updates).
        update = "UPDATE items SET n = n + 1, v = md5(v) WHERE id %% 7 = %s AND id < %s"
        arguments: tuple[int, ...] = (batch % 7, first)
        if self.recent is not None:
            update += " AND id >= %s"
            arguments += (first - self.recent,)
        with conn.transaction():
            conn.execute(
                "INSERT INTO items SELECT g, md5(g::text), 0 "
                "FROM generate_series(%s::int, %s::int) g",
                (first, first + 9),
            )
            conn.execute(update, arguments)
            conn.execute("DELETE FROM items WHERE id = %s", (first - 53,))
        if self.pause:
            time.sleep(self.pause)


def _texts(table: Table, row: Sequence[Any]) -> Row:
    """A row's values in PostgreSQL's text form, typed first: the snapshot's binary copy logs
    bytes where the stream logs text."""
    return tuple(None if v is None else pg_text(v) for v in row_to_python(table, row))


def _replayed(
    log: Path | str, storage: StorageOptions | None = None
) -> tuple[dict[str, Row], list[tuple[str, Row]], list[int | None]]:
    """The change log replayed into rows by key; every row change logged; every xid logged."""
    rows: dict[str, Row] = {}
    changes: list[tuple[str, Row]] = []
    xids: list[int | None] = []
    for txn in ChangeLog(log, storage=storage).read_transactions():
        xids.append(txn.xid)
        for event in txn.events:
            if isinstance(event, Insert | Update):
                row = _texts(event.table, event.new)
                rows[str(row[0])] = row
                changes.append((type(event).__name__, row))
            elif isinstance(event, Delete):
                row = _texts(event.table, event.old)
                del rows[str(row[0])]
                changes.append(("Delete", row))
    return rows, changes, xids


def _source_rows(conninfo: str) -> dict[str, Row]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        found = conn.execute("SELECT id::text, v, n::text FROM items").fetchall()
    return {row[0]: tuple(row) for row in found}


def _current_lsn(conninfo: str) -> LSN:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return LSN.parse(row[0])


def _slot(conninfo: str) -> tuple[int | None, LSN]:
    """The slot's walsender PID (None when inactive) and confirmed position (0/0 while the
    slot is missing or being created: an interrupted snapshot's slot is dropped and made
    again)."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT active_pid, confirmed_flush_lsn::text FROM pg_replication_slots "
            "WHERE slot_name = %s",
            (SLOT,),
        ).fetchone()
    if row is None or row[1] is None:
        return None, LSN(0)
    return row[0], LSN.parse(row[1])


def walsender_pid(conninfo: str, slot: str = SLOT) -> int | None:
    """The PID of the walsender streaming ``slot``, None while none does. A backend peeking the
    slot through SQL holds it too (a resumed snapshot reads what changed since), but streams
    nothing."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT s.active_pid FROM pg_replication_slots s JOIN pg_stat_activity a "
            "ON a.pid = s.active_pid AND a.backend_type = 'walsender' WHERE s.slot_name = %s",
            (slot,),
        ).fetchone()
    return None if row is None else int(row[0])


def _new_walsender(conninfo: str, old: int | None) -> int:
    return int(
        wait_until(lambda: (pid := walsender_pid(conninfo)) not in (None, old) and pid, timeout=120)
    )


def _terminate_walsender(conninfo: str) -> int:
    pid = _new_walsender(conninfo, None)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
    return pid


def _check_logged_exactly_once(
    conninfo: str, log: Path | str, storage: StorageOptions | None = None
) -> None:
    """Everything the source committed reached the log once, and it replays to the source."""
    source = _source_rows(conninfo)
    mirror, changes, xids = _replayed(log, storage)
    assert len(changes) == len(set(changes)), "a change was logged twice"
    assert len(xids) == len(set(xids)), "a transaction was logged twice"
    assert mirror == source
    inserted = [row[0] for kind, row in changes if kind == "Insert"]
    assert len(inserted) == len(set(inserted))
    # Nothing skipped: every id the workload ever inserted is in the log (deleted ones too).
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT max(id) FROM items").fetchone()
    assert row is not None and row[0] is not None
    assert set(map(int, inserted)) >= set(map(int, source))
    assert max(map(int, inserted)) == row[0]


def replay_lake_changelog(changes: list[dict[str, Any]], snapshot_rows: int) -> dict[str, Row]:
    """The items table's Delta changelog applied in commit order (the workload's after a
    snapshot of ids -``snapshot_rows`` to -1), into rows by id: each change once (its
    (commit, seq) and its transaction id unique), every insert a new id, every update and
    delete of a row it holds, and no id the workload inserted missing."""
    changes.sort(key=lambda c: (c["_commit_lsn"], c["_seq"]))
    positions = Counter((c["_commit_lsn"], c["_seq"]) for c in changes)
    assert max(positions.values()) == 1, [p for p, n in positions.items() if n > 1][:5]
    commits = {(c["_xid"], c["_commit_lsn"]) for c in changes}
    assert len(commits) == len({xid for xid, _ in commits}), "a transaction landed twice"
    rows: dict[str, Row] = {}
    inserted: list[tuple[int, int]] = []  # (commit LSN, id)
    for change in changes:
        op = change["_op"]
        if op == "delete":
            key = str(change["_old"]["id"])
            assert key in rows, f"delete of id {key}, which the changelog never inserted"
            del rows[key]
            continue
        key = str(change["id"])
        if op == "insert":
            assert key not in rows, f"id {key} inserted twice"
            inserted.append((change["_commit_lsn"], change["id"]))
        else:
            assert op == "update" and key in rows, (op, key)
        rows[key] = (key, change["v"], str(change["n"]))
    # The snapshot is one transaction holding the seeded rows (but those the workload's first
    # five transactions delete, -43 to -3, when they ran before it), and the workload's rows
    # of its time; each workload transaction after it inserts the next ten ids: none missing.
    snapshot = {lsn for lsn, id_ in inserted if id_ < 0}
    assert len(snapshot) == 1
    seeded = {id_ for _, id_ in inserted if id_ < 0}
    assert set(range(-snapshot_rows, 0)) - {-43, -33, -23, -13, -3} <= seeded
    streamed = sorted(id_ for lsn, id_ in inserted if lsn > min(snapshot))
    assert streamed == list(range(streamed[0], streamed[-1] + 1)), "an insert is missing"
    return rows


def _drain(process: ReceiverProcess, conninfo: str) -> None:
    """Wait until the running receiver has logged everything committed so far, then stop it."""
    end = _current_lsn(conninfo)
    wait_until(lambda: _slot(conninfo)[1] >= end or process.error is not None, timeout=120)
    process.stop()
    process.join(60)
    assert not process.is_alive()
    if process.error is not None:
        raise process.error


@contextlib.contextmanager
def _running(settings: pipeline.Settings) -> Iterator[ReceiverProcess]:
    """A receiver process for the block's length; stopped (flush, confirm, exit) after it."""
    process = ReceiverProcess(settings, None)
    process.start()
    try:
        yield process
    finally:
        process.stop()
        process.join(60)


def _mirror(lake: Path | str, storage_options: dict[str, str] | None = None) -> dict[str, Row]:
    """The items table's mirror in the lake, by id (empty before its first local write)."""
    path = f"{lake}/public/items/mirror"
    if storage_options is None and not Path(path, "_delta_log").exists():
        return {}
    table = read_table(path, storage_options=storage_options).select(["id", "v", "n"]).to_pylist()
    return {str(r["id"]): (str(r["id"]), r["v"], str(r["n"])) for r in table}


def _wait_caught_up(
    conninfo: str, lake: Path, runner: threading.Thread, failure: list[BaseException]
) -> None:
    """Wait for the running pipeline to confirm the server's current position and its mirror
    to equal the source; it must still run, with no error."""
    end = _current_lsn(conninfo)
    wait_until(lambda: _slot(conninfo)[1] >= end or failure, timeout=120)
    source = _source_rows(conninfo)
    wait_until(lambda: _mirror(lake) == source or failure, timeout=240, interval=0.5)
    assert runner.is_alive() and not failure, failure


def _reconnections(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "reconnection attempt" in r.getMessage()]


def test_terminated_walsenders_are_reconnected_without_a_gap_or_a_duplicate(
    db: Database, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conninfo = db.conninfo()
    _source(conninfo)
    with _running(_settings(conninfo, tmp_path)) as process:
        with Workload(conninfo) as workload:
            old = None
            for round in range(3):
                workload.wait_for(20 * (round + 1))
                _new_walsender(conninfo, old)
                old = _terminate_walsender(conninfo)
            workload.wait_for(workload.transactions + 20)
        _new_walsender(conninfo, old)  # the same process streams again, started by no one
        assert process.is_alive()
        _drain(process, conninfo)
    reconnections = _reconnections(caplog)
    assert len(reconnections) >= 3
    # Each session ends with the walsender's FATAL where libpq received it, even when the
    # receiver was writing a status update as the server closed the socket (proved alone in
    # tests/connection/test_replication.py); under load the socket may close before the FATAL
    # arrives, which is a lost connection. Either is retried, and nothing else may end one.
    for line in reconnections:
        fatal = "ReplicationStreamError" in line and "terminating connection" in line
        assert fatal or "ConnectionLost" in line, line
    _check_logged_exactly_once(conninfo, tmp_path / "log")


def test_a_receiver_process_prints_its_threads_stacks_on_request(
    db: Database, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """SIGUSR1 (``dump_stacks``) shows where a running receiver waits, and it keeps running.
    (Compiled functions have no Python frames: the compiled build's dump shows the receiving
    call and the wait on the server's socket, without the receiver's frames between them.)"""
    conninfo = db.conninfo()
    _source(conninfo)
    with _running(_settings(conninfo, tmp_path)) as process:
        _new_walsender(conninfo, None)
        # faulthandler writes thread by thread: look at the captured stderr until the receiver's
        # frame shows. Peek with pread: reading the capture (readouterr) truncates the file the
        # child is still writing to, which loses what it writes between the read and the truncate.
        # A dump may find the receiver between two waits (starting its session, or pausing for
        # messages to gather, in compiled code with no frame of its own): ask again until one
        # finds it waiting.
        frame = "in _wait" if _native.compiled() else "receiver.py"

        def dumped() -> bool:
            captured = os.pread(2, os.fstat(2).st_size, 0)
            return frame in captured.decode(errors="replace")

        deadline = time.monotonic() + 30
        while True:
            process.dump_stacks()
            try:
                wait_until(dumped, timeout=1)
                break
            except TimeoutError:
                assert time.monotonic() < deadline, "no dump showed the receiver waiting"
        err = capfd.readouterr().err
        assert "most recent call first" in err and "in receive" in err and frame in err, err
        assert process.is_alive()
    assert process.error is None


@pytest.fixture(params=sorted(_INSTALLATIONS))
def own_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A cluster of this test's own, as it is stopped and started under the receiver."""
    with LocalCluster(_INSTALLATIONS[request.param](), settings=TEST_SETTINGS) as cluster:
        yield cluster


def test_a_server_restart_mid_stream_is_ridden_out(
    own_cluster: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    conninfo = own_cluster.conninfo()
    _source(conninfo)
    with _running(_settings(conninfo, tmp_path)) as process:
        with Workload(conninfo) as workload:
            workload.wait_for(30)
            old = _new_walsender(conninfo, None)
            own_cluster.stop("immediate")
            time.sleep(1.5)  # down long enough for several refused reconnections
            own_cluster.start()
            workload.wait_for(workload.transactions + 30)
        _new_walsender(conninfo, old)
        assert process.is_alive()
        _drain(process, conninfo)
    attempts = _reconnections(caplog)
    assert len(attempts) >= 2, attempts
    assert any("ConnectionFailed" in line for line in attempts), attempts
    _check_logged_exactly_once(conninfo, tmp_path / "log")


def _until_dropped(conninfo: str, statement: str) -> None:
    """Terminate the slot's walsender and run ``statement`` (a drop) before the receiver
    reconnects: retried while the slot is still (or again) active."""

    def attempt() -> bool:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
                "WHERE slot_name = %s AND active_pid IS NOT NULL",
                (SLOT,),
            )
            try:
                conn.execute(statement)
            except psycopg.errors.ObjectInUse:
                return False
        return True

    wait_until(attempt, timeout=60, interval=0.01)


@pytest.mark.parametrize("create_slot", [True, False], ids=["create-slot", "no-create-slot"])
def test_a_dropped_slot_ends_the_run_with_a_typed_error(
    db: Database, tmp_path: Path, create_slot: bool
) -> None:
    conninfo = db.conninfo()
    _source(conninfo)
    with _running(_settings(conninfo, tmp_path, create_slot=create_slot)) as process:
        _new_walsender(conninfo, None)
        db.execute("INSERT INTO items VALUES (1, 'a', 0)")
        _until_dropped(conninfo, f"SELECT pg_drop_replication_slot('{SLOT}')")
        process.join(120)
        assert not process.is_alive()
    # Never a new slot that would start after the changes made meanwhile.
    assert not db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
    assert isinstance(process.error, SlotNotFound), process.error
    assert str(process.error).count("\n") == 0
    assert f"slot '{SLOT}' was dropped while pgcdc streamed from it" in str(process.error)
    assert "new change log, lake and checkpoint" in str(process.error)


def test_a_slot_recreated_while_the_receiver_reconnects_ends_the_run_with_a_typed_error(
    db: Database, tmp_path: Path
) -> None:
    conninfo = db.conninfo()
    _source(conninfo)
    with _running(_settings(conninfo, tmp_path)) as process:
        _new_walsender(conninfo, None)
        db.execute("INSERT INTO items VALUES (1, 'a', 0)")
        _until_dropped(conninfo, f"SELECT pg_drop_replication_slot('{SLOT}')")
        db.execute("INSERT INTO items VALUES (2, 'in the gap', 0)")
        db.execute(f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
        process.join(120)
        assert not process.is_alive()
    assert isinstance(process.error, SlotReplaced), process.error
    assert "dropped and created again" in str(process.error)
    assert str(process.error).count("\n") == 0
    logged = [row[0] for _, row in _replayed(tmp_path / "log")[1]]
    assert "2" not in logged


def test_a_dropped_publication_ends_the_run_with_a_typed_error(
    db: Database, tmp_path: Path
) -> None:
    conninfo = db.conninfo()
    _source(conninfo)
    with _running(_settings(conninfo, tmp_path)) as process:
        _new_walsender(conninfo, None)
        _until_dropped(conninfo, "DROP PUBLICATION pub")
        db.execute("INSERT INTO items VALUES (1, 'a', 0)")
        process.join(120)
        assert not process.is_alive()
    assert isinstance(process.error, PublicationNotFound), process.error
    assert str(process.error).count("\n") == 0
    assert '"pub"' in str(process.error)


def test_pipeline_run_rides_out_a_terminated_walsender(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    conninfo = db.conninfo()
    _source(conninfo)
    settings = _settings(conninfo, tmp_path)
    with pipeline_running(settings, spark) as (runner, failure):
        with Workload(conninfo) as workload:
            workload.wait_for(20)
            old = _terminate_walsender(conninfo)
            workload.wait_for(workload.transactions + 20)
            _new_walsender(conninfo, old)
            old = _terminate_walsender(conninfo)
            workload.wait_for(workload.transactions + 20)
        _new_walsender(conninfo, old)
        _wait_caught_up(conninfo, tmp_path / "lake", runner, failure)
    assert not failure, failure
    assert _mirror(tmp_path / "lake") == _source_rows(conninfo)
    _check_logged_exactly_once(conninfo, tmp_path / "log")


SNAPSHOT_ROWS = 100_000


def _copying(conninfo: str) -> bool:
    """Whether the initial snapshot's workers are copying rows now."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = 'pgcdc snapshot' AND query LIKE 'COPY%%'"
        ).fetchone()
    return bool(row and row[0])


def test_a_server_crash_mid_snapshot_never_leaves_a_partial_snapshot(
    own_cluster: LocalCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An immediate stop while the initial snapshot copies: the receiver (or the next start)
    takes the snapshot again, so the log holds every row once, never a partial copy."""
    conninfo = own_cluster.conninfo()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(ITEMS)
        # Negative ids: the workload's inserts (positive) never collide with them.
        conn.execute(
            "INSERT INTO items SELECT -g, md5(g::text), 0 FROM generate_series(1, %s) g",
            (SNAPSHOT_ROWS,),
        )
        conn.execute("CREATE PUBLICATION pub FOR TABLE items")
    settings = _settings(conninfo, tmp_path, snapshot="initial", snapshot_workers=2)
    process = ReceiverProcess(settings, None)
    process.start()
    try:
        wait_until(lambda: _copying(conninfo) or not process.is_alive(), timeout=60, interval=0.01)
        own_cluster.stop("immediate")
        own_cluster.start()
        restarts = 0

        def streaming() -> bool:
            # The run may give up on the crash, now or a little later (it is still unwinding
            # the snapshot): start it again once, as a user or a supervisor would.
            nonlocal process, restarts
            if not process.is_alive():
                assert restarts == 0, f"the receiver gave up twice: {process.error!r}"
                print(f"the receiver gave up on the crash: {process.error!r}")
                restarts += 1
                process = ReceiverProcess(settings, None)
                process.start()
            return _slot(conninfo)[0] is not None

        with Workload(conninfo) as workload:
            workload.wait_for(20)
            try:
                wait_until(streaming, timeout=120)
            except TimeoutError:
                process.dump_stacks()  # where it waits, in the captured stderr
                time.sleep(2)
                raise
        _drain(process, conninfo)
    finally:
        process.stop()
        process.join(60)
    _check_logged_exactly_once(conninfo, tmp_path / "log")
    assert any("interrupted before it completed" in r.getMessage() for r in caplog.records)


def test_a_server_crash_while_executors_copy_takes_the_snapshot_again(
    own_cluster: LocalCluster, tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """An immediate stop while Spark tasks copy the initial snapshot (``snapshot_in =
    "executors"``) under a live workload: the run drops the slot it created and takes the
    snapshot again, so the mirror equals the source and the lake's changelog holds each
    snapshot row once."""
    conninfo = own_cluster.conninfo()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(ITEMS)
        conn.execute(
            "INSERT INTO items SELECT -g, md5(g::text), 0 FROM generate_series(1, %s) g",
            (SNAPSHOT_ROWS * 3,),
        )
        conn.execute("CREATE PUBLICATION pub FOR TABLE items")
    settings = _settings(
        conninfo,
        tmp_path,
        snapshot="initial",
        snapshot_in="executors",
        kinds=(SinkKind.CHANGELOG, SinkKind.MIRROR),
    )
    with pipeline_running(settings, spark) as (runner, failure):
        wait_until(lambda: _copying(conninfo) or not runner.is_alive(), timeout=120, interval=0.01)
        own_cluster.stop("immediate")
        own_cluster.start()
        with Workload(conninfo) as workload:
            workload.wait_for(20)
        _wait_caught_up(conninfo, tmp_path / "lake", runner, failure)
    assert not failure, failure
    messages = [r.getMessage() for r in caplog.records]
    assert any("initial snapshot:" in m and "taking it again" in m for m in messages), messages
    changelog = read_table(f"{tmp_path / 'lake'}/public/items/changelog")
    ids = [
        i
        for i, op in zip(*changelog.select(["id", "_op"]).to_pydict().values(), strict=True)
        if op == "insert" and i < 0
    ]
    # Each once; the workload may have deleted a few before the snapshot was taken again.
    assert len(ids) == len(set(ids)) > SNAPSHOT_ROWS * 3 - 100
    assert {int(i) for i in _source_rows(conninfo) if int(i) < 0} <= set(ids)
