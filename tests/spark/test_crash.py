"""Kill the Spark driver (SIGKILL, the whole process group: Python and its JVM) at random
instants while the pipeline writes, restart it on the same checkpoint each time: the mirrors
and histories still equal the source and no changelog row is duplicated. The restarts alternate
where the Delta writes run (on the driver, in executors' Python workers: ``[spark] writes``),
on the same lake and checkpoint.

Ten kills per server, as the issue asks. Measured on the shared 2-core machine: 159 s (PG15)
and 174 s (PG18) when it was quiet; 6.5-7 minutes per server while other heavy work ran
(each kill waits for a new driver's Spark start-up). If CI gets close to its 20 minutes, lower
KILLS_PER_SERVER (five per server still make the issue's ten kills in all).

The second test kills the whole ``pgcdc pipeline run`` command (driver, receiver process and
JVM) while a workload writes, from the initial snapshot on, and restarts it each time."""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.localpg import wait_until
from pgcdc.sinks import read_table
from tests.cli.helpers import CLI
from tests.conftest import Database
from tests.faults import test_reconnect as faults
from tests.processes import kill_everything

from .helpers import (
    Workload,
    assert_lake_matches,
    column_names,
    drain,
    prepare_source,
    source_state,
)

KILLS_PER_SERVER = 10  # per server (x2 servers); see the docstring for the time it takes
ROOT = Path(__file__).resolve().parents[2]


def _delta_commits(lake: Path) -> int:
    return sum(1 for _ in lake.glob("*/*/*/_delta_log/*.json"))


def _child(output: Path, *args: str) -> subprocess.Popen[bytes]:
    with output.open("ab") as sink:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.spark.crash_child", *args],
            cwd=ROOT,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _tail(output: Path) -> str:
    return output.read_text(errors="replace")[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(1200)  # 10 kills take ~3 min per server when quiet, ~7 under load
# One server version (suite time): the kills hit pgcdc's processes, not the server; the
# command-level kill test below runs on both (PG15 streams protocol 3, PG18 protocol 4).
@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_killed_driver_restarts_without_loss_or_duplicates(db: Database, tmp_path: Path) -> None:
    rng = random.Random(db.major * 7919)
    log = ChangeLog(tmp_path / "log")
    lake = tmp_path / "lake"
    args = (str(tmp_path / "log"), str(lake), str(tmp_path / "checkpoint"))
    workload = Workload(random.Random(db.major + 1))
    transactions = []
    with db.connect() as conn:
        prepare_source(conn)
        for _ in range(3):
            for _ in range(40):
                workload.step(conn)
            workload.sample(conn)
        transactions += drain(conn, log, segment_bytes=64_000, frame_bytes=16_000)
        final = source_state(conn)
        names = column_names(conn)

    output = tmp_path / "children.log"
    kills = 0
    written: list[int] = []
    while kills < KILLS_PER_SERVER:
        before = _delta_commits(lake)
        child = _child(output, *args, "stream", "executors" if kills % 2 else "driver")
        try:
            # Wait for the driver to write (Spark takes seconds to start), then kill it at a
            # random instant among its next writes (or idle, once it has caught up).
            deadline = time.monotonic() + 60
            while _delta_commits(lake) <= before and time.monotonic() < deadline:
                assert child.poll() is None, f"the pipeline child exited:\n{_tail(output)}"
                time.sleep(0.1)
            time.sleep(rng.uniform(0.0, 2.0))
        finally:
            kill_everything(child)
        kills += 1
        written.append(_delta_commits(lake) - before)

    # Most kills hit a driver in the middle of its work, not an idle one.
    assert sum(n > 0 for n in written) >= KILLS_PER_SERVER - 1, written
    finisher = _child(output, *args, "once", "executors")
    assert finisher.wait(timeout=300) == 0, _tail(output)
    assert_lake_matches(lake, names, final, workload.samples, transactions)


PIPELINE_KILLS = 2  # per server: each restart waits for a new Spark start-up
SNAPSHOT_ROWS = 20_000


def _pipeline_command(db: Database, tmp_path: Path, output: Path, *extra: str) -> Any:
    """``pgcdc pipeline run`` as users run it, in a process group of its own (it and its
    receiver process and JVM die together)."""
    argv = [
        *CLI, "pipeline", "run", "-d", db.conninfo(), "--slot", faults.SLOT,
        "--publication", "pub",
        "--master", "local[1]", "--kinds", "changelog,mirror", "--trigger-interval", "0.5",
        "--changelog", str(tmp_path / "log"), "--lake", str(tmp_path / "lake"),
        "--checkpoint", str(tmp_path / "checkpoint"), *extra,
    ]  # fmt: skip
    with output.open("ab") as sink:
        return subprocess.Popen(
            argv, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )


def _slot_pid(db: Database) -> int | None:
    """The PID of the backend holding the pipeline's slot (a walsender, or a resumed snapshot's
    peek); None while none does (or there is no slot yet)."""
    return db.scalar(  # type: ignore[no-any-return]
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (faults.SLOT,)
    )


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_killed_pipeline_run_restarts_without_loss_or_duplicates(
    db: Database, tmp_path: Path
) -> None:
    """SIGKILL of the whole ``pipeline run`` (driver, receiver process, JVM) at seeded instants
    while a workload of inserts, updates and deletes runs, from the initial snapshot on: after
    a final ``--once`` the mirror equals the source and the change log holds each change once."""
    rng = random.Random(db.major * 104729)
    conninfo = db.conninfo()
    with db.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, v text, n int NOT NULL)")
        # Negative ids for the snapshot's rows: the workload's inserts are positive.
        conn.execute(
            "INSERT INTO items SELECT -g, md5(g::text), 0 FROM generate_series(1, %s) g",
            (SNAPSHOT_ROWS,),
        )
        conn.execute("CREATE PUBLICATION pub FOR TABLE items")
    output = tmp_path / "children.log"
    with faults.Workload(conninfo) as workload:
        for _ in range(PIPELINE_KILLS):
            child = _pipeline_command(db, tmp_path, output)
            try:
                # Killed once it streams (or copies), at a random instant after.
                wait_until(
                    lambda c=child: (
                        faults.walsender_pid(conninfo) is not None or c.poll() is not None
                    ),
                    timeout=120,
                )
                assert child.poll() is None, _tail(output)
                time.sleep(rng.uniform(0.0, 6.0))
                assert child.poll() is None, _tail(output)
            finally:
                kill_everything(child)
            wait_until(lambda: _slot_pid(db) is None, timeout=120)  # its walsender gone
        workload.wait_for(workload.transactions + 10)
    finisher = _pipeline_command(db, tmp_path, output, "--once")
    assert finisher.wait(timeout=600) == 0, _tail(output)
    assert faults._mirror(tmp_path / "lake") == faults._source_rows(conninfo)
    # The initial snapshot (copied by Spark tasks) is in the lake, not the change log: the
    # lake's changelog replays to the source, each change once.
    changelog = read_table(f"{tmp_path / 'lake'}/public/items/changelog").to_pylist()
    replayed = faults.replay_lake_changelog(changelog, SNAPSHOT_ROWS)
    assert replayed == faults._source_rows(conninfo)
