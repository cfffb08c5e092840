"""A stop (Ctrl-C, SIGTERM, ``stop`` set) while a batch is being written: ``pipeline.run`` lets
that batch finish and returns cleanly, so what it had read is in the lake when the run ends
(interrupted, the batch's writes failed half way and Spark's own stop check could overflow its
stack on the error's text)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import StreamingQueryException

from pgcdc import pipeline
from pgcdc.spark.pipeline import BatchGate, StopRequested, start, stop
from tests.conftest import Database

from .helpers import mirror_rows, table_rows

ROWS = 200_000


def _logged(db: Database, tmp_path: Path, spark: Any, rows: int) -> pipeline.Settings:
    """A pipeline whose change log holds ``rows`` inserts its query has not read: the first
    batch of the next query holds them all."""
    db.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
    db.execute("CREATE PUBLICATION pub FOR TABLE notes")
    settings = pipeline.Settings(
        conninfo=db.conninfo(),
        slot="stop",
        publications=("pub",),
        snapshot="never",
        changelog=str(tmp_path / "log"),
        lake=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"),
        master="local[2]",
        trigger_interval=0.2,
        writes="executors",
    )
    pipeline.run(settings, once=True, spark=spark)  # creates the slot
    db.execute(f"INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, {rows}) g")
    pipeline.receive(settings, pipeline.current_wal_lsn(settings.conninfo), None)
    return settings


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_a_stop_lets_the_batch_being_written_finish(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    settings = _logged(db, tmp_path, spark, ROWS)
    lake = tmp_path / "lake"
    stop = threading.Event()
    failures: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run(settings, stop=stop, spark=spark)
        except BaseException as exc:
            failures.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    table = lake / "public" / "notes"
    deadline = time.monotonic() + 240
    # The first data file of the batch: the batch is being written.
    while not any(table.rglob("*.parquet")):
        assert runner.is_alive() and time.monotonic() < deadline, failures
        time.sleep(0.02)
    writing = _latest(tmp_path / "checkpoint" / "offsets")
    stop.set()
    runner.join(300)
    assert not runner.is_alive()
    assert failures == []
    # Finished and recorded as done: the next start does not replay it.
    assert (tmp_path / "checkpoint" / "commits" / str(writing)).exists()
    columns, expected = table_rows_of(db)
    assert len(expected) == ROWS
    assert mirror_rows(lake, "public.notes", columns) == expected


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_a_batch_refused_after_a_stop_is_written_by_the_next_start(
    db: Database, tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The batch the gate refuses (its trigger came after the stop's wait) ends the query,
    is not recorded as done, and the next start writes it. Quietly: py4j logs an exception
    raised in foreachBatch with its traceback, which a stop's refusal is not."""
    settings = _logged(db, tmp_path, spark, 1000)
    gate = BatchGate()
    assert gate.close(0)
    query = start(spark, settings.pipeline(), gate=gate)
    with pytest.raises(StreamingQueryException, match="StopRequested"):
        query.awaitTermination(240)
    assert gate.refused and "StopRequested" in str(query.exception())
    logged = [r for r in caplog.records if r.exc_info or "Traceback" in r.getMessage()]
    assert not logged, [(r.name, r.getMessage()) for r in logged]
    refused = _latest(tmp_path / "checkpoint" / "offsets")
    assert not (tmp_path / "checkpoint" / "commits" / str(refused)).exists()
    pipeline.run(settings, once=True, spark=spark)
    columns, expected = table_rows_of(db)
    assert len(expected) == 1000
    assert mirror_rows(tmp_path / "lake", "public.notes", columns) == expected


class _HeldGate(BatchGate):
    """A gate whose batches wait for ``release`` before they write: a batch held in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    @contextlib.contextmanager
    def batch(self, batch_id: int) -> Iterator[None]:
        with super().batch(batch_id):
            self.entered.set()
            self.release.wait(240)
            yield


class _StopSeen:
    """The query, noting when it is told to stop."""

    def __init__(self, query: Any) -> None:
        self.query = query
        self.stopping = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.query, name)

    def stop(self) -> None:
        self.stopping.set()
        self.query.stop()


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_stop_now_does_not_wait_for_the_batch_being_written(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    """``now`` (a second Ctrl-C) stops the query while its batch is still in flight, well
    within ``stop_timeout``; the next start writes what that batch held."""
    settings = _logged(db, tmp_path, spark, 1000)
    gate = _HeldGate()
    query = _StopSeen(start(spark, settings.pipeline(), gate=gate))
    assert gate.entered.wait(240)
    now = threading.Event()
    now.set()
    failures: list[BaseException] = []

    def stopping() -> None:
        try:
            stop(query, gate, 600.0, now)
        except BaseException as exc:
            failures.append(exc)

    stopper = threading.Thread(target=stopping)
    stopper.start()
    try:
        assert query.stopping.wait(60), "the stop waited for the batch being written"
    finally:
        gate.release.set()
        stopper.join(240)
    assert not stopper.is_alive()
    assert failures == []
    pipeline.run(settings, once=True, spark=spark)
    columns, expected = table_rows_of(db)
    assert len(expected) == 1000
    assert mirror_rows(tmp_path / "lake", "public.notes", columns) == expected


def _latest(batches: Path) -> int:
    return max(int(p.name) for p in batches.iterdir() if p.name.isdigit())


def table_rows_of(db: Database) -> tuple[list[str], list[dict[str, Any]]]:
    with db.connect() as conn:
        return table_rows(conn, "public.notes")


def test_the_gate_waits_for_the_batch_being_written_and_refuses_the_next() -> None:
    gate = BatchGate()
    entered, release = threading.Event(), threading.Event()

    def write() -> None:
        with gate.batch(7):
            entered.set()
            release.wait(60)

    writer = threading.Thread(target=write)
    writer.start()
    assert entered.wait(60)
    assert gate.close(0.05) is False  # still writing after the timeout
    release.set()
    assert gate.close(60) is True
    writer.join(60)
    assert not gate.refused
    refusal = "batch 8 not written: the pipeline is stopping"
    with pytest.raises(StopRequested, match=refusal), gate.batch(8):
        pytest.fail("a batch started after the stop")
    assert gate.refused
