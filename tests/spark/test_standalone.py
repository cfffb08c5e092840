"""``pgcdc pipeline run --once --master spark://...`` against a real Spark standalone cluster
(a master and two workers, ``tests/spark/cluster.py``) on PostgreSQL 18: the change log's
partitions are read and the Delta tables written in executors' Python workers, started by the
worker JVMs, and the initial snapshot is copied by Spark tasks straight into the Delta tables;
the lake still equals the source. The driver may receive at most 1 MiB of task results
(``spark.driver.maxResultSize``), well below the snapshot's size: collecting it, or a batch, to
the driver fails the run."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from pgcdc.sinks import SinkKind, read_table
from tests.cli.helpers import pgcdc
from tests.conftest import Database

from .cluster import StandaloneCluster, spark_cluster
from .helpers import sort_rows, table_rows

__all__ = ["spark_cluster"]  # the fixture, imported to be used here

TABLES = ("public.accounts", "public.orders", "public.notes")
NOTES = (
    30_000  # rows of 128 random hex digits: MiBs of changes in the snapshot's batch, zstd or not
)


def _source_rows(db: Database, table: str) -> tuple[list[str], list[dict[str, Any]]]:
    with db.connect() as conn:
        return table_rows(conn, table)


def _lake_table(lake: str, table: str, kind: SinkKind, options: dict[str, str] | None) -> Any:
    schema, name = table.split(".")
    return read_table(f"{lake}/{schema}/{name}/{kind.value}", storage_options=options)


def cluster_config(
    db: Database,
    cluster: StandaloneCluster,
    tmp_path: Path,
    events: Path,
    paths: tuple[str, str],
    *,
    storage_options: dict[str, str] | None,
) -> Path:
    """The pipeline's TOML file for ``cluster``: slot ``standalone``, publication ``cdc``,
    changelog and mirror, the driver held to 1 MiB of task results, Spark's event logs in
    ``events``."""
    changelog, lake = paths
    options = ""
    if storage_options:
        inline = ", ".join(f'{key} = "{value}"' for key, value in storage_options.items())
        options = f"storage_options = {{ {inline} }}"
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f"""
[source]
conninfo = "{db.conninfo()}"
slot = "standalone"
publications = ["cdc"]
snapshot_workers = 2

[paths]
changelog = "{changelog}"
lake = "{lake}"
checkpoint = "{tmp_path / "checkpoint"}"
{options}

[tables]
kinds = ["changelog", "mirror"]

[spark]
master = "{cluster.url}"

[spark.conf]
"spark.driver.host" = "127.0.0.1"
"spark.driver.bindAddress" = "127.0.0.1"
"spark.executor.memory" = "512m"
"spark.driver.maxResultSize" = "1m"
"spark.eventLog.enabled" = "true"
"spark.eventLog.dir" = "{events}"
"spark.eventLog.compress" = "false"
"spark.eventLog.rolling.enabled" = "false"
"""
    )
    return config


def _scan_records_by_executor(events: Path) -> Counter[str]:
    """Records the pgcdc scan (``MicroBatchScan`` over a ``DataSourceRDD``) returned, per
    executor id, from Spark's own event logs (one per application: per ``pipeline run``)."""
    records: Counter[str] = Counter()
    for log in sorted(p for p in events.rglob("*") if p.is_file()):
        scan_stages: set[int] = set()
        tasks: list[tuple[int, str, int]] = []
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] == "SparkListenerStageCompleted":
                stage = event["Stage Info"]
                if any(
                    rdd["Name"] == "DataSourceRDD" and "MicroBatchScan" in rdd.get("Scope", "")
                    for rdd in stage["RDD Info"]
                ):
                    scan_stages.add(stage["Stage ID"])
            elif event["Event"] == "SparkListenerTaskEnd":
                read = event["Task Metrics"]["Input Metrics"]["Records Read"]
                tasks.append((event["Stage ID"], event["Task Info"]["Executor ID"], read))
        for stage_id, executor, read in tasks:
            if stage_id in scan_stages:
                records[executor] += read
    return records


def check_pipeline_on_cluster(
    db: Database,
    cluster: StandaloneCluster,
    tmp_path: Path,
    paths: tuple[str, str],
    storage_options: dict[str, str] | None = None,
) -> None:
    """Two ``pipeline run --once`` on ``cluster`` (the initial snapshot, then a workload of
    inserts, updates and deletes on two tables) with the change log and lake at ``paths``;
    the mirrors equal the source, the changelogs hold every change once, and executors (not
    the driver) read the change log. Shared with the S3 variant (tests/storage)."""
    db.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12, 2))")
    db.execute("CREATE TABLE orders (region text, id bigint, qty int, PRIMARY KEY (region, id))")
    db.execute(
        "INSERT INTO accounts SELECT g, 'owner ' || g, g * 10 FROM generate_series(1, 200) g"
    )
    db.execute("INSERT INTO orders SELECT 'N', g, g % 7 FROM generate_series(1, 100) g")
    db.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
    db.execute(
        "INSERT INTO notes SELECT g, md5(random()::text) || md5(random()::text) "
        "|| md5(random()::text) || md5(random()::text) "
        f"FROM generate_series(1, {NOTES}) g"
    )
    db.execute("CREATE PUBLICATION cdc FOR TABLE accounts, orders, notes")
    events = tmp_path / "events"
    events.mkdir()
    config = cluster_config(db, cluster, tmp_path, events, paths, storage_options=storage_options)
    # The command in a process of its own, as users run it (and the S3 variant needs it: moto's
    # server runs in this process, and the Delta writes to it must not share its GIL).
    argv = ["pipeline", "run", "--config", str(config), "--once"]

    # First run: the initial snapshot (300 rows of two tables and the notes), copied by tasks.
    first = pgcdc(*argv, timeout=180)
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    # Second run: inserts, updates (a key update too) and deletes through the slot.
    with db.connect() as conn:
        for i in range(20):
            with conn.transaction():
                conn.execute("INSERT INTO accounts VALUES (%s, %s, %s)", (1000 + i, f"new {i}", i))
                conn.execute("UPDATE accounts SET balance = balance + 1 WHERE id %% 20 = %s", (i,))
                conn.execute("INSERT INTO orders VALUES ('S', %s, %s)", (1000 + i, i))
                conn.execute("DELETE FROM orders WHERE region = 'N' AND id = %s", (i * 3 + 1,))
        conn.execute("UPDATE orders SET region = 'E' WHERE region = 'S' AND id < 1005")
        conn.execute("DELETE FROM accounts WHERE id BETWEEN 50 AND 59")
    second = pgcdc(*argv, timeout=180)
    assert second.returncode == 0, second.stderr.decode()[-3000:]

    lake = paths[1]
    for table in TABLES:
        columns, expected = _source_rows(db, table)
        assert expected, table
        mirror = sort_rows(
            _lake_table(lake, table, SinkKind.MIRROR, storage_options).select(columns).to_pylist()
        )
        assert mirror == expected, table

    # Every change once: (commit, seq) unique, and the counts per operation are the workload's.
    ops: dict[str, Counter[str]] = {}
    for table in TABLES:
        changelog = _lake_table(lake, table, SinkKind.CHANGELOG, storage_options)
        positions = list(
            zip(
                changelog.column("_commit_lsn").to_pylist(),
                changelog.column("_seq").to_pylist(),
                strict=True,
            )
        )
        assert len(positions) == len(set(positions)), table
        ops[table] = Counter(changelog.column("_op").to_pylist())
    # accounts: 200 snapshot rows + 20 inserts; update i hits ids 1..200 with id % 20 = i
    # (10) and the new row 1000 + i (1): 220 updates; 10 deletes.
    assert ops["public.accounts"] == Counter({"insert": 220, "update": 220, "delete": 10})
    # orders: 100 snapshot + 20 inserts, 20 deletes, 5 key updates.
    assert ops["public.orders"] == Counter({"insert": 120, "delete": 20, "update": 5})
    assert ops["public.notes"] == Counter({"insert": NOTES})

    # The change log's chunks were read by the workers' executors (ids "0"/"1"; a local master
    # reads them in "driver"), per Spark's event logs of both runs.
    records = _scan_records_by_executor(events)
    assert sum(records.values()) > 0, records
    assert set(records) <= {"0", "1"}, records


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_pipeline_on_a_standalone_cluster_reads_in_executors(
    db: Database, tmp_path: Path, spark_cluster: StandaloneCluster
) -> None:
    paths = (str(tmp_path / "log"), str(tmp_path / "lake"))
    check_pipeline_on_cluster(db, spark_cluster, tmp_path, paths)
