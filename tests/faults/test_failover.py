"""The pipeline follows a failover on PostgreSQL 18: a primary with a physical standby made by
pg_basebackup (slot synchronization on, the standby's slot in the primary's
synchronized_standby_slots), ``pipeline run`` with a conninfo naming every host and
``target_session_attrs=primary``, a workload that goes on through the failovers. The primary is
stopped (immediate), with part of an open transaction streamed to pgcdc, and the standby
promoted; then each new primary gets a standby of its own, which takes over in turn: once
after the primary is stopped (immediate) with an ordinary transaction of several statements
open, then in a planned switchover (fast stop, promote). The pipeline creates its
slot as a failover slot, finds each new primary on its own and resumes from the synchronized
copy of its slot: the lake's mirror equals the source and the change log holds every change
once. Where the slot cannot follow (not a failover slot, or a standby behind the log when
promoted) the receiver stops with a typed error that says why, never a new slot and never a
silent gap.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc.errors import ServerIsStandby, SlotNotSynced, TimelineDiverged
from pgcdc.localpg import LocalCluster, embedded_installation, free_port, wait_until
from pgcdc.pipeline.origin import load_origin
from pgcdc.pipeline.process import ReceiverProcess
from pgcdc.receiver import RetryPolicy
from tests.conftest import TEST_SETTINGS
from tests.faults.ha import multi_host, pipeline_running
from tests.faults.test_reconnect import (
    ITEMS,
    SLOT,
    Workload,
    _check_logged_exactly_once,
    _current_lsn,
    _mirror,
    _settings,
    _slot,
    _source_rows,
    _wait_caught_up,
)

STANDBY_SLOT = "standby"


@pytest.fixture
def standbys() -> Iterator[list[LocalCluster]]:
    """The standbys a test makes, destroyed after it."""
    made: list[LocalCluster] = []
    yield made
    for standby in made:
        standby.destroy()


@pytest.fixture
def primary() -> Iterator[LocalCluster]:
    # A transaction of more than 64 kB of changes is streamed before it commits.
    settings = {**TEST_SETTINGS, "logical_decoding_work_mem": "64kB"}
    with LocalCluster(embedded_installation(), settings=settings) as cluster:
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            conn.execute(ITEMS)
            conn.execute("CREATE PUBLICATION pub FOR TABLE items")
        yield cluster


def _standby(primary: LocalCluster, port: int, *, synchronized: bool = True) -> LocalCluster:
    """A standby of ``primary``; with ``synchronized`` the primary sends logical changes only
    once the standby has them (synchronized_standby_slots)."""
    standby = primary.make_standby(STANDBY_SLOT, port=port)
    if synchronized:
        with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET synchronized_standby_slots = '{STANDBY_SLOT}'")
        primary.reload()
    return standby


def _synced(primary: LocalCluster, standby: LocalCluster) -> bool:
    """The standby holds a usable (persistent) copy of the pipeline's slot. The primary logs
    its running transactions meanwhile: the slot's restart position moves on such a record,
    and the standby keeps a copy only once that position is past where the standby began."""
    with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_log_standby_snapshot()")
    with psycopg.connect(standby.conninfo(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = %s",
            (SLOT,),
        ).fetchone()
    return bool(row and row[0])


def _streaming(server: LocalCluster) -> bool:
    with psycopg.connect(server.conninfo(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT active FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
        ).fetchone()
    return bool(row and row[0])


def _fail_over(old: LocalCluster, new: LocalCluster, stop: str) -> None:
    """Promote ``new`` once it has a copy of the slot, after stopping ``old``: "immediate"
    (a crash: an unplanned failover) or "fast" (a planned switchover)."""
    wait_until(lambda: _synced(old, new), timeout=120, interval=0.2)
    old.stop(stop)
    new.promote()


def _streamed_transactions(server: LocalCluster) -> int:
    with psycopg.connect(server.conninfo(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT stream_txns FROM pg_stat_replication_slots WHERE slot_name = %s", (SLOT,)
        ).fetchone()
    return int(row[0]) if row else 0


@contextlib.contextmanager
def _open_transaction(primary: LocalCluster) -> Iterator[None]:
    """An ordinary transaction of several statements (far below logical_decoding_work_mem, so
    never streamed) left open on ``primary``: the server then dies with it, so it never
    commits (rows with negative ids, which must never reach the change log)."""
    conn = psycopg.connect(primary.conninfo())
    try:
        conn.execute("INSERT INTO items SELECT -g, md5(g::text), 0 FROM generate_series(1, 5) g")
        conn.execute("UPDATE items SET n = n + 1 WHERE id = -1")
        conn.execute("DELETE FROM items WHERE id = -2")
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.close()


@contextlib.contextmanager
def _streamed_open_transaction(primary: LocalCluster) -> Iterator[None]:
    """A transaction left open on ``primary`` once the walsender has streamed part of it to
    pgcdc: the server then dies with it, so it never commits (rows with negative ids, which
    must never reach the change log)."""
    before = _streamed_transactions(primary)
    conn = psycopg.connect(primary.conninfo())
    try:
        conn.execute("INSERT INTO items SELECT -g, md5(g::text), 0 FROM generate_series(1, 5000) g")
        wait_until(lambda: _streamed_transactions(primary) > before, timeout=60)
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.close()


def test_pipeline_run_follows_a_failover_and_a_switchover_without_a_gap_or_a_duplicate(
    primary: LocalCluster,
    standbys: list[LocalCluster],
    tmp_path: Path,
    spark: Any,
) -> None:
    ports = (primary.port, free_port(), free_port(), free_port())
    conninfo = multi_host(*ports)
    clusters = [primary]
    standbys.append(_standby(primary, ports[1]))
    clusters.append(standbys[-1])
    settings = _settings(conninfo, tmp_path)  # the pipeline creates its slot: failover
    with pipeline_running(settings, spark) as (runner, failure):
        wait_until(lambda: _streaming(primary) or failure, timeout=120)  # the slot is there
        with Workload(conninfo) as workload:
            workload.wait_for(30)
            # The primary dies while pgcdc holds the first part of a streamed transaction
            # (opened once the standby has the slot: an open transaction holds the slot back).
            wait_until(lambda: _synced(clusters[0], clusters[1]), timeout=120, interval=0.2)
            with _streamed_open_transaction(clusters[0]):
                _fail_over(clusters[0], clusters[1], "immediate")
            workload.wait_for(workload.transactions + 30)
            # Each new primary gets a standby of its own, which is promoted in turn: the
            # primary dies while an ordinary transaction is open, then a planned switchover.
            for stop_mode in ("immediate", "fast"):
                old, new = clusters[-1], _standby(clusters[-1], ports[len(clusters)])
                standbys.append(new)
                clusters.append(new)
                workload.wait_for(workload.transactions + 30)
                # Synchronized first: an open transaction holds the slot back.
                wait_until(functools.partial(_synced, old, new), timeout=120, interval=0.2)
                crash = stop_mode == "immediate"
                with _open_transaction(old) if crash else contextlib.nullcontext():
                    _fail_over(old, new, stop_mode)
                workload.wait_for(workload.transactions + 30)
        _wait_caught_up(conninfo, tmp_path / "lake", runner, failure)
    assert not failure, failure
    assert _mirror(tmp_path / "lake") == _source_rows(conninfo)
    _check_logged_exactly_once(conninfo, tmp_path / "log")
    origin = load_origin(str(tmp_path / "log"))
    assert origin is not None and origin.timeline == 4


def _receiver_through_a_failover(
    primary: LocalCluster, tmp_path: Path, *, failover: bool, synchronized: bool
) -> BaseException | None:
    """A receiver process streams from ``primary`` while the workload runs; the standby is
    stopped (so it falls behind) unless ``synchronized``; then the primary stops (immediate),
    the standby starts again if needed and is promoted. Returns how the receiver ended."""
    standby = _standby(primary, free_port(), synchronized=synchronized)
    conninfo = multi_host(primary.port, standby.port)
    process = ReceiverProcess(_settings(conninfo, tmp_path, failover=failover), None)
    process.start()
    try:
        wait_until(lambda: _streaming(primary), timeout=120)  # the log records the slot
        with Workload(conninfo) as workload:
            workload.wait_for(20)
            if failover:
                wait_until(lambda: _synced(primary, standby), timeout=120, interval=0.2)
            if not synchronized:
                standby.stop()  # the changes committed from now on reach pgcdc only
                workload.wait_for(workload.transactions + 20)
                end = _current_lsn(primary.conninfo())
                wait_until(lambda: _slot(primary.conninfo())[1] >= end, timeout=60)
            primary.stop("immediate")
            if not synchronized:
                standby.start()
            standby.promote()
            workload.wait_for(workload.transactions + 5)
        process.join(120)
        assert not process.is_alive()
        with psycopg.connect(standby.conninfo(), autocommit=True) as conn:
            slots = conn.execute(
                "SELECT slot_name FROM pg_replication_slots WHERE slot_type = 'logical'"
            ).fetchall()
        # Never a new slot that would start after the changes made meanwhile.
        assert slots == ([(SLOT,)] if failover else [])
    finally:
        process.stop()
        process.join(60)
        standby.destroy()
    return process.error


def test_a_slot_that_is_not_synchronized_is_refused_after_a_failover(
    primary: LocalCluster, tmp_path: Path
) -> None:
    error = _receiver_through_a_failover(primary, tmp_path, failover=False, synchronized=True)
    assert isinstance(error, SlotNotSynced), error
    assert str(error).count("\n") == 0
    assert "promoted from a standby" in str(error)
    assert "not a failover slot" in str(error)


def test_a_standby_promoted_behind_the_change_log_is_refused(
    primary: LocalCluster, tmp_path: Path
) -> None:
    error = _receiver_through_a_failover(primary, tmp_path, failover=True, synchronized=False)
    assert isinstance(error, TimelineDiverged), error
    assert str(error).count("\n") == 0
    assert "the standby had not received the changes in between" in str(error)
    assert "synchronized_standby_slots" in str(error)


def test_a_standby_reached_instead_of_the_primary_is_a_retried_typed_error(
    primary: LocalCluster, standbys: list[LocalCluster], tmp_path: Path
) -> None:
    """A conninfo that reaches a standby (no target_session_attrs) gets a ConnectionFailed
    that says how to reach the primary; the receiver retries it (a promotion may follow)."""
    standbys.append(_standby(primary, free_port()))
    conninfo = standbys[0].conninfo()
    retry_once = RetryPolicy(initial=0.1, maximum=0.1, attempts=1)
    process = ReceiverProcess(_settings(conninfo, tmp_path, retry=retry_once), None)
    process.start()
    process.join(120)
    assert not process.is_alive()
    error = process.error
    assert isinstance(error, ServerIsStandby), error
    assert "target_session_attrs=primary" in str(error)
    assert "gave up after 1 reconnection attempts" in "\n".join(error.__notes__)
