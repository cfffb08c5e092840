"""``pipeline run`` rides out network faults, on PostgreSQL 15 and 18: its connection to the
server goes through a TCP proxy on loopback (``tests.faults.proxy``) that first resets every
connection mid-stream, then black-holes them (open, silent) for longer than the receiver's
``receive_timeout``. The receiver must notice the silence itself, reconnect once the network
is back, and in the end the change log holds every change exactly once and the Delta mirror
equals the source.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc import pipeline
from pgcdc.changelog import ChangeLog, ChangeLogWriter
from pgcdc.connection.catalog import TypeDescriber
from pgcdc.connection.protocol import XLogData
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.errors import ConnectionLost
from pgcdc.events import Insert, Table
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions, RetryPolicy, retryable
from pgcdc.transactions import TransactionSink
from tests.conftest import Database
from tests.faults.ha import pipeline_running
from tests.faults.proxy import TcpProxy
from tests.faults.test_reconnect import (
    Workload,
    _check_logged_exactly_once,
    _current_lsn,
    _mirror,
    _new_walsender,
    _reconnections,
    _settings,
    _slot,
    _source,
    _source_rows,
    _wait_caught_up,
)
from tests.receiver.helpers import WrappedWriter

# Small, so the test does not idle: the receiver gives a silent connection up after this many
# seconds, the server its side (the walsender holding the slot) after wal_sender_timeout.
RECEIVE_TIMEOUT = 2.0
SERVER_TIMEOUT = "3s"


# One server version (suite time): what this exercises is the client on a cut or silent
# network, the same against either; the shorter tests below run on both.
@pytest.mark.parametrize("cluster", ["pg15"], indirect=True)
def test_pipeline_run_rides_out_a_cut_and_a_black_holed_network(
    db: Database,
    tmp_path: Path,
    spark: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO")
    conninfo = db.conninfo()
    _source(conninfo)
    with TcpProxy("127.0.0.1", db.cluster.port) as proxy:
        proxied = db.conninfo(
            port=proxy.port,
            connect_timeout=2,
            options=f"-c wal_sender_timeout={SERVER_TIMEOUT}",
        )
        settings = _settings(proxied, tmp_path, receive_timeout=RECEIVE_TIMEOUT)
        with pipeline_running(settings, spark) as (runner, failure):
            with Workload(conninfo) as workload:
                workload.wait_for(20)
                old = _new_walsender(conninfo, None)
                assert proxy.cut() >= 1
                workload.wait_for(workload.transactions + 20)
                old = _new_walsender(conninfo, old)
                workload.wait_for(workload.transactions + 10)
                # The new session streams (and has looked its table up in the catalog) before
                # the partition.
                streamed_to = _current_lsn(conninfo)
                wait_until(lambda: _slot(conninfo)[1] >= streamed_to or failure, timeout=120)
                proxy.black_hole()
                # The receiver hears nothing, not even an error: only its own deadlines end
                # the session (without them this waits in vain). Usually the stream's
                # receive_timeout; a catalog lookup under way has its own, as long.
                wait_until(
                    lambda: any(map(_timed_out, _reconnections(caplog))) or failure,
                    timeout=60,
                )
                workload.wait_for(workload.transactions + 20)
                proxy.restore()
                _new_walsender(conninfo, old)
                workload.wait_for(workload.transactions + 20)
            _wait_caught_up(conninfo, tmp_path / "lake", runner, failure)
    assert not failure, failure
    attempts = _reconnections(caplog)
    # The cut ends a session at once (its connection reset, while streaming or connecting).
    assert any(not _timed_out(line) for line in attempts), attempts
    assert any(map(_timed_out, attempts)), attempts
    assert _mirror(tmp_path / "lake") == _source_rows(conninfo)
    _check_logged_exactly_once(conninfo, tmp_path / "log")


def _timed_out(reconnection: str) -> bool:
    """Whether a session ended by one of the receiver's own deadlines on a silent network."""
    return "receive_timeout" in reconnection or "got no answer within" in reconnection


def test_a_catalog_lookup_on_a_black_holed_network_ends_within_its_timeout(db: Database) -> None:
    """The receiver looks a table's columns up in the catalog when a Relation message arrives,
    on an ordinary connection: on a silent network that query must end with ConnectionLost
    (which the receiver retries) within the receive_timeout, never block the stream for ever.
    Without the deadline this test hangs until pytest's own timeout."""
    db.execute("CREATE TABLE looked_up (id int PRIMARY KEY, v text DEFAULT 'x')")
    oid = db.scalar("SELECT 'looked_up'::regclass::oid")
    with TcpProxy("127.0.0.1", db.cluster.port) as proxy:
        types = TypeDescriber(db.conninfo(port=proxy.port), timeout=RECEIVE_TIMEOUT)
        table = Table("public", "looked_up", (), oid=oid)
        try:
            types.describe_relation(table)  # answered: the connection is open and works
            proxy.black_hole()
            started = time.monotonic()
            with pytest.raises(ConnectionLost, match="no answer within 2 s") as raised:
                types.describe_relation(table)
            assert time.monotonic() - started < RECEIVE_TIMEOUT + 10
            assert retryable(raised.value)
            proxy.restore()
            types.describe_relation(table)  # a new connection answers again
        finally:
            types.close()


@pytest.mark.timeout(120)  # without the deadline stop() waits for ever
def test_stopping_a_stream_on_a_black_holed_network_ends_within_its_timeout(
    db: Database,
) -> None:
    """stop() sends CopyDone and waits for the server's answer: on a silent network that wait
    is held to receive_timeout too, and ends with a retryable ConnectionLost."""
    db.execute("CREATE TABLE stopped (id int PRIMARY KEY)")
    db.execute("SELECT pg_create_logical_replication_slot('stopped', 'test_decoding')")
    db.execute("INSERT INTO stopped VALUES (1)")
    with (
        TcpProxy("127.0.0.1", db.cluster.port) as proxy,
        ReplicationConnection.connect(db.conninfo(port=proxy.port)) as conn,
    ):
        stream = conn.start_replication("stopped", receive_timeout=RECEIVE_TIMEOUT)
        deadline = time.monotonic() + 30
        while not isinstance(stream.read(timeout=1.0), XLogData):
            assert time.monotonic() < deadline, "nothing streamed"
        proxy.black_hole()
        started = time.monotonic()
        with pytest.raises(ConnectionLost, match="stopping the stream got no answer") as lost:
            stream.stop()
        assert time.monotonic() - started < RECEIVE_TIMEOUT + 10
        assert retryable(lost.value)
        assert stream.ended


def _receive_restoring(
    proxy: TcpProxy, db: Database, name: str, end: LSN, writer: TransactionSink
) -> list[BaseException]:
    """Run a receiver through ``proxy`` from slot ``name`` (publication ``name``_pub) up to
    ``end``, retrying at once after each failure with the network restored; the failures."""
    failures: list[BaseException] = []
    options = ReceiverOptions(
        db.conninfo(port=proxy.port),
        name,
        publications=(f"{name}_pub",),
        receive_timeout=RECEIVE_TIMEOUT,
        end_lsn=end,
    )

    def on_retry(error: BaseException, delay: float, attempt: int) -> None:
        failures.append(error)
        proxy.restore()

    retry = RetryPolicy(initial=0.1, maximum=0.1, jitter=0.0)
    Receiver(options, writer).run(retry=retry, on_retry=on_retry)
    return failures


class _SilencedAtLookup(TypeDescriber):
    """A catalog that black-holes the network as it looks up its second table, after its
    connection is open: the lookup times out while the replication stream is alive."""

    proxy: TcpProxy | None = None
    lookups = 0

    def describe_relation(self, table: Table) -> Table:
        type(self).lookups += 1
        if type(self).lookups == 2 and self.proxy is not None:
            self.proxy.black_hole()
        return super().describe_relation(table)


@pytest.mark.timeout(180)  # without a deadline on stopping the stream this waits for ever
# One server version (suite time): what this exercises is the client on a cut or silent
# network, the same against either.
@pytest.mark.parametrize("cluster", ["pg15"], indirect=True)
def test_a_session_failing_on_a_black_holed_network_ends_and_is_retried(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session that fails for a reason other than the stream's silence (here the catalog
    lookup a Relation message needs) stops its stream on the way out, on the same silent
    network: that stop is held to receive_timeout, so the receiver's next session follows and
    logs every change once. (Seen in CI: the pipeline hung in that stop after a black hole.)"""
    db.execute("CREATE TABLE first (id int PRIMARY KEY, v text)")
    db.execute("CREATE TABLE second (id int PRIMARY KEY, v text)")
    db.execute("CREATE PUBLICATION both_pub FOR TABLE first, second")
    db.execute("SELECT pg_create_logical_replication_slot('both', 'pgoutput')")
    db.execute("INSERT INTO first SELECT g, md5(g::text) FROM generate_series(1, 20) g")
    db.execute("INSERT INTO second SELECT g, md5(g::text) FROM generate_series(1, 20) g")
    end = LSN.parse(db.scalar("SELECT pg_current_wal_lsn()::text"))
    with TcpProxy("127.0.0.1", db.cluster.port) as proxy:
        monkeypatch.setattr(_SilencedAtLookup, "proxy", proxy)
        monkeypatch.setattr(_SilencedAtLookup, "lookups", 0)
        monkeypatch.setattr("pgcdc.receiver.TypeDescriber", _SilencedAtLookup)
        with ChangeLogWriter(tmp_path / "log") as writer:
            failures = _receive_restoring(proxy, db, "both", end, writer)
    assert _SilencedAtLookup.lookups >= 3  # the second table was looked up again, answered
    assert [type(error) for error in failures] == [ConnectionLost], failures
    assert "second's columns got no answer within 2 s" in str(failures[0]), failures
    logged = sorted(
        (event.table.name, int(str(event.new[0])), str(event.new[1]))
        for txn in ChangeLog(tmp_path / "log").read_transactions()
        for event in txn.events
        if isinstance(event, Insert)
    )
    assert logged == sorted(
        (name, i, v)
        for name in ("first", "second")
        for i, v in db.execute(f"SELECT id, v FROM {name}")
    )


@pytest.mark.timeout(180)  # without the deadlines the pipeline's session start waits for ever
@pytest.mark.parametrize(
    ("command", "said"),
    [
        (b"IDENTIFY_SYSTEM", "IDENTIFY_SYSTEM got no answer within 2 s"),
        (b"pg_is_in_recovery", "looking the server and slot up got no answer within 2 s"),
    ],
)
def test_the_pipelines_slot_check_on_a_black_holed_network_ends_and_is_retried(
    db: Database,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    command: bytes,
    said: str,
) -> None:
    """Before each session the pipeline checks the server and its slot on connections of its
    own; a network that goes silent while one of them waits for an answer ends that session
    within receive_timeout, and the next session logs every change once."""
    _source(db.conninfo())
    db.execute("INSERT INTO items SELECT g, md5(g::text), g FROM generate_series(1, 30) g")
    end = _current_lsn(db.conninfo())
    with TcpProxy("127.0.0.1", db.cluster.port) as proxy:
        proxied = db.conninfo(port=proxy.port, connect_timeout=2)
        settings = _settings(proxied, tmp_path, receive_timeout=RECEIVE_TIMEOUT)
        proxy.black_hole_on(command)

        def restore_once_silent() -> None:
            wait_until(lambda: proxy.silent, timeout=60)
            time.sleep(RECEIVE_TIMEOUT + 1)
            proxy.restore()

        restorer = threading.Thread(target=restore_once_silent, daemon=True)
        restorer.start()
        progress = pipeline.receive(settings, end, None)
        restorer.join(10)
    assert progress.stopped_by == "end_lsn"
    assert any(said in line for line in _reconnections(caplog)), _reconnections(caplog)
    _check_logged_exactly_once(db.conninfo(), tmp_path / "log")


class _SilencedAtSessionStart(WrappedWriter):
    """A change log that black-holes the network at its first flush, which the receiver
    makes as a session starts: after its connection is open and authenticated, before
    START_REPLICATION."""

    def __init__(self, root: Path, proxy: TcpProxy) -> None:
        super().__init__(root)
        self._proxy: TcpProxy | None = proxy

    def flush(self) -> LSN:
        if self._proxy is not None:
            self._proxy.black_hole()
            self._proxy = None
        return self._writer.flush()


@pytest.mark.timeout(180)  # without the deadline START_REPLICATION waits for ever
def test_a_session_start_on_a_black_holed_network_ends_and_is_retried(
    db: Database, tmp_path: Path
) -> None:
    """A network that goes silent as a session starts ends that session with ConnectionLost
    (held to receive_timeout, as the stream is), and the receiver's next session streams."""
    db.execute("CREATE TABLE started (id int PRIMARY KEY, v text)")
    db.execute("CREATE PUBLICATION started_pub FOR TABLE started")
    db.execute("SELECT pg_create_logical_replication_slot('started', 'pgoutput')")
    db.execute("INSERT INTO started SELECT g, md5(g::text) FROM generate_series(1, 50) g")
    end = LSN.parse(db.scalar("SELECT pg_current_wal_lsn()::text"))
    with (
        TcpProxy("127.0.0.1", db.cluster.port) as proxy,
        _SilencedAtSessionStart(tmp_path / "log", proxy) as writer,
    ):
        failures = _receive_restoring(proxy, db, "started", end, writer)
    assert [type(error) for error in failures] == [ConnectionLost], failures
    assert "START_REPLICATION got no answer within 2 s" in str(failures[0])
    logged = [
        (int(str(event.new[0])), str(event.new[1]))
        for txn in ChangeLog(tmp_path / "log").read_transactions()
        for event in txn.events
        if isinstance(event, Insert)
    ]
    assert logged == [(i, v) for i, v in db.execute("SELECT id, v FROM started ORDER BY id")]
