"""Synchronous replication: with pgcdc's application_name in synchronous_standby_names, a commit
returns only once the change log holds it durably; with pgcdc stopped, commits wait."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from pgcdc.changelog import ChangeLog
from pgcdc.localpg import wait_until
from pgcdc.receiver import Receiver, ReceiverOptions, ReceiverProgress
from tests.conftest import Database

from .helpers import logged_facts

APP = "pgcdc_sync"


@contextlib.contextmanager
def synchronous(db: Database) -> Iterator[None]:
    """synchronous_standby_names = 'pgcdc_sync' on the test cluster, restored afterwards."""
    admin = db.cluster.conninfo()
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{APP}'")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            conn.execute("SELECT pg_reload_conf()")
            # Release anything still waiting for a standby that is gone.
            conn.execute(
                "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
            )


def test_commit_returns_once_logged_and_waits_without_pgcdc(db: Database, tmp_path: Path):
    with db.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    with synchronous(db):
        _scenario(db, tmp_path)


def _scenario(db: Database, tmp_path: Path) -> None:
    stop = threading.Event()
    results: list[ReceiverProgress] = []
    errors: list[BaseException] = []
    opts = ReceiverOptions(
        db.conninfo(),
        "s",
        publications=("pub",),
        application_name=APP,
        fsync_interval=0,
        status_interval=1.0,
    )
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
            wait_until(
                lambda: (
                    db.scalar(
                        "SELECT sync_state FROM pg_stat_replication WHERE application_name = %s",
                        (APP,),
                    )
                    == "sync"
                    or errors
                ),
                timeout=60,
            )
            assert not errors, errors
            with db.connect(options="-c statement_timeout=60s") as conn:
                for number in range(1, 6):
                    conn.execute("INSERT INTO items VALUES (%s, %s)", (number, f"row {number}"))
                    # The commit returned: the log already holds the row, durably.
                    ids = [row[0] for _, changes in logged_facts(tmp_path) for *_, row in changes]
                    assert str(number) in ids
        finally:
            stop.set()
            thread.join(60)
    assert not errors, errors
    assert results[0].transactions == 5

    # pgcdc is gone: the next commit waits for it.
    with db.connect() as conn:
        pid = conn.info.backend_pid
        outcome: list[Any] = []

        def commit() -> None:
            try:
                conn.execute("INSERT INTO items VALUES (6, 'waits')")
                outcome.append("returned")
            except psycopg.Error as error:
                outcome.append(error)

        waiter = threading.Thread(target=commit)
        waiter.start()
        try:
            waited = wait_until(
                lambda: (
                    db.scalar("SELECT wait_event FROM pg_stat_activity WHERE pid = %s", (pid,))
                    == "SyncRep"
                ),
                timeout=60,
            )
            assert waited
            assert not outcome  # still waiting
        finally:
            db.execute("SELECT pg_cancel_backend(%s)", (pid,))
            waiter.join(60)
        assert outcome == ["returned"]  # cancelled wait: committed locally, with a warning
