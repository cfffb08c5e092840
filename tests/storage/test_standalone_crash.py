"""SIGKILL of ``pgcdc pipeline run`` (driver, receiver process, JVM) on a Spark standalone
cluster with the change log and the lake on S3: once during the initial snapshot, then at
seeded instants while executors write the lake under a live workload. The executors outlive
the killed driver for a while, so a batch's Delta writes may still commit after it died and
the restarted driver runs that batch again: the application transaction ids must make that a
no-op. After a final ``--once`` the mirror equals the source, the change log replays to it
with every change once, and the Delta changelog holds no change twice."""

from __future__ import annotations

import random
import subprocess
import time
from pathlib import Path

import pytest

from pgcdc.localpg import wait_until
from pgcdc.sinks import read_table
from tests.cli.helpers import CLI
from tests.conftest import Database
from tests.faults import test_reconnect as faults
from tests.processes import kill_everything
from tests.spark.cluster import StandaloneCluster, spark_cluster
from tests.spark.test_standalone import cluster_config

from .conftest import Bucket

__all__ = ["spark_cluster"]  # the fixture, imported to be used here

SLOT = "standalone"  # cluster_config's
SNAPSHOT_ROWS = 20_000
STREAM_KILLS = 2
# A restart waits out the killed writer's lease (60 s), starts Spark and lands the backlog the
# workload wrote meanwhile; CI machines have been three times slower than a quiet one.
WRITE_TIMEOUT = 420


def _slot_pid(db: Database) -> int | None:
    return db.scalar(  # type: ignore[no-any-return]
        "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
    )


def _delta_commits(bucket: Bucket) -> int:
    client = bucket.client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket.name, Prefix="lake/")
    return sum(
        1
        for page in pages
        for item in page.get("Contents", [])
        if "/_delta_log/" in item["Key"] and item["Key"].endswith(".json")
    )


def _start(config: Path, output: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``pgcdc pipeline run`` as users run it, in a process group of its own."""
    with output.open("ab") as sink:
        return subprocess.Popen(
            [*CLI, "pipeline", "run", "--verbose", "--config", str(config), *extra],
            cwd=config.parent,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _kill(child: subprocess.Popen[bytes], db: Database) -> None:
    kill_everything(child)
    wait_until(lambda: _slot_pid(db) is None, timeout=120)  # its walsender gone


def _tail(output: Path) -> str:
    return output.read_text(errors="replace")[-3000:]


def _wait_for_a_write(
    child: subprocess.Popen[bytes],
    bucket: Bucket,
    before: int,
    output: Path,
    cluster: StandaloneCluster,
) -> None:
    """Until the restarted run commits to the lake (or exits); a timeout says what the run
    and the master were doing."""
    try:
        wait_until(
            lambda: _delta_commits(bucket) > before or child.poll() is not None,
            timeout=WRITE_TIMEOUT,
            interval=0.5,
        )
    except TimeoutError:
        applications = [
            (app.get("name"), app.get("state"), app.get("cores"))
            for app in cluster.status().get("activeapps", [])
        ]
        raise AssertionError(
            f"no Delta commit within {WRITE_TIMEOUT} s of a restart; the master's applications "
            f"{applications}; the runs printed:\n{_tail(output)}"
        ) from None


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_killed_pipeline_on_a_cluster_with_s3_restarts_without_loss_or_duplicates(
    db: Database, bucket: Bucket, tmp_path: Path, spark_cluster: StandaloneCluster
) -> None:
    rng = random.Random(20261127)
    conninfo = db.conninfo()
    with db.connect() as conn:
        conn.execute(faults.ITEMS)
        # Negative ids for the snapshot's rows: the workload's inserts are positive.
        conn.execute(
            "INSERT INTO items SELECT -g, md5(g::text), 0 FROM generate_series(1, %s) g",
            (SNAPSHOT_ROWS,),
        )
        conn.execute("CREATE PUBLICATION cdc FOR TABLE items")
    paths = (bucket.uri("changelog"), bucket.uri("lake"))
    events = tmp_path / "events"
    events.mkdir()
    config = cluster_config(
        db, spark_cluster, tmp_path, events, paths, storage_options=bucket.options()
    )
    output = tmp_path / "children.log"
    written: list[int] = []
    # Updates of the newest rows only: transactions stay small while restarts wait out the
    # killed writer's lease.
    with faults.Workload(conninfo, recent=700, pause=0.02) as workload:
        # Mid-snapshot: the slot exists from the snapshot's start; the copy takes seconds.
        child = _start(config, output)
        try:
            wait_until(
                lambda: (
                    faults.walsender_pid(db.conninfo(), SLOT) is not None
                    or child.poll() is not None
                ),
                timeout=180,
            )
            assert child.poll() is None, _tail(output)
            time.sleep(rng.uniform(0.0, 1.0))
        finally:
            _kill(child, db)
        # Mid-stream: once the executors write, at a random instant among their writes.
        for _ in range(STREAM_KILLS):
            before = _delta_commits(bucket)
            child = _start(config, output)
            try:
                _wait_for_a_write(child, bucket, before, output, spark_cluster)
                assert child.poll() is None, _tail(output)
                time.sleep(rng.uniform(0.0, 3.0))
            finally:
                _kill(child, db)
            written.append(_delta_commits(bucket) - before)
        workload.wait_for(workload.transactions + 10)
    assert all(written), written  # each stream kill hit a driver that had written
    finisher = _start(config, output, "--once")
    assert finisher.wait(timeout=600) == 0, _tail(output)

    options = bucket.options()
    assert faults._mirror(paths[1], options) == faults._source_rows(conninfo)
    # The change log releases the segments Spark acknowledged (each flush on S3 is a segment):
    # the lake's changelog is what holds every change, so it is replayed instead.
    changelog = read_table(f"{paths[1]}/public/items/changelog", storage_options=options)
    replayed = faults.replay_lake_changelog(changelog.to_pylist(), SNAPSHOT_ROWS)
    assert replayed == faults._source_rows(conninfo)
    assert _written_by_executors(output)


def _written_by_executors(output: Path) -> bool:
    """The Delta writes ran in executors (``[spark] writes`` is "auto": executors on a
    cluster master), as the driver's log says."""
    return "written by executors" in output.read_text(errors="replace")
