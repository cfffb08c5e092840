"""An idle captured database must not make the server keep WAL: while another database on the
same cluster writes, the receiver follows the keepalives' wal_end and the slot moves on."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions, ReceiverProgress
from tests.conftest import Database

from .helpers import current_lsn, slot_position

ROUNDS = 8
ROUND_ROWS = 20_000  # a few MB of WAL per round
MB = 1 << 20


@pytest.fixture
def busy(db: Database) -> Iterator[str]:
    """Another database on the same cluster, for the writes the slot does not capture."""
    name = f"{db.name}_busy"
    admin = db.cluster.conninfo()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield db.cluster.conninfo(name)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_idle_database_does_not_hold_wal(db: Database, busy: str, tmp_path: Path):
    with db.connect() as conn:
        conn.execute("CREATE TABLE quiet (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    start, _, _ = slot_position(db, "s")
    assert start is not None
    stop = threading.Event()
    results: list[ReceiverProgress] = []
    errors: list[BaseException] = []
    opts = ReceiverOptions(db.conninfo(), "s", publications=("pub",), status_interval=1.0)
    retained: list[int] = []
    generated = 0
    with ChangeLog(tmp_path).writer() as sink:
        receiver = Receiver(opts, sink)

        def run() -> None:
            try:
                results.append(receiver.run(stop))
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            with psycopg.connect(busy, autocommit=True) as other:
                other.execute("CREATE TABLE noise (id int, pad text)")
                for _ in range(ROUNDS):
                    before = current_lsn(other)
                    other.execute(
                        "INSERT INTO noise SELECT g, repeat('n', 100) "
                        "FROM generate_series(1, %s) g",
                        (ROUND_ROWS,),
                    )
                    # A checkpoint logs the running transactions: what lets restart_lsn move.
                    other.execute("CHECKPOINT")
                    target = current_lsn(other)
                    generated += target - before
                    wait_until(
                        lambda t=target: (slot_position(db, "s")[0] or LSN(0)) >= t or errors,
                        timeout=60,
                    )
                    assert not errors, errors
                    # The keepalive that let the slot move is in the published progress too
                    # (publishes on keepalives are held back, never dropped).
                    wait_until(
                        lambda t=target: (receiver.progress.server_wal_end or LSN(0)) >= t,
                        timeout=10,
                    )
                    retained.append(
                        db.scalar(
                            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)::bigint "
                            "FROM pg_replication_slots WHERE slot_name = 's'"
                        )
                    )
        finally:
            stop.set()
            thread.join(60)
    assert not errors, errors
    [progress] = results
    assert progress.transactions == 0  # nothing was captured, yet the slot moved
    confirmed, _, _ = slot_position(db, "s")
    assert confirmed is not None and confirmed > start
    assert progress.confirmed_lsn == confirmed
    # Without the receiver the slot would retain all `generated` bytes by now.
    assert generated > 4 * 4 * MB
    assert max(retained[2:]) < 4 * MB, (retained, generated)


def test_a_quiet_healthy_server_is_not_taken_for_a_dead_one(db: Database, tmp_path: Path):
    """receive_timeout gives up on a silent connection; a healthy server with nothing to send
    is asked for a reply after half of it and answers, so the session goes on."""
    with db.connect() as conn:
        conn.execute("CREATE TABLE quiet (id int PRIMARY KEY)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    # Status updates rarer than the timeout: only the ping can make the server speak in time.
    opts = ReceiverOptions(
        db.conninfo(), "s", publications=("pub",), status_interval=30.0, receive_timeout=1.0
    )
    stop = threading.Event()
    errors: list[BaseException] = []
    with ChangeLog(tmp_path).writer() as sink:
        receiver = Receiver(opts, sink)

        def run() -> None:
            try:
                receiver.run(stop)  # no retry: a timeout would end it with ConnectionLost
            except BaseException as error:
                errors.append(error)

        thread = threading.Thread(target=run)
        thread.start()
        try:
            # Several timeouts' worth of silence, without a write.
            assert not stop.wait(5.0)
        finally:
            stop.set()
            thread.join(60)
    assert not errors, errors
