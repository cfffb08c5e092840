"""A stop (Ctrl-C, SIGTERM, ``stop`` set) while a batch is being written: ``pipeline.run`` lets
that batch finish and returns cleanly, so what it had read is in the lake when the run ends
(interrupted, the batch's writes failed half way and Spark's own stop check could overflow its
stack on the error's text)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgcdc import pipeline
from pgcdc.spark.pipeline import BatchGate, StopRequested, spark_session
from tests.conftest import Database

from .helpers import mirror_rows, table_rows

ROWS = 200_000


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[2]", "pgcdc-tests")
    yield session
    session.stop()


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_a_stop_lets_the_batch_being_written_finish(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    db.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
    db.execute("CREATE PUBLICATION pub FOR TABLE notes")
    lake = tmp_path / "lake"
    settings = pipeline.Settings(
        conninfo=db.conninfo(),
        slot="stop",
        publications=("pub",),
        snapshot="never",
        changelog=str(tmp_path / "log"),
        lake=str(lake),
        checkpoint=str(tmp_path / "checkpoint"),
        master="local[2]",
        trigger_interval=0.2,
        writes="executors",
    )
    pipeline.run(settings, once=True, spark=spark)  # creates the slot
    db.execute(f"INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, {ROWS}) g")
    # Logged before the query starts, so its first batch holds every row.
    pipeline.receive(settings, pipeline.current_wal_lsn(settings.conninfo), None)

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
