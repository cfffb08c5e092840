"""The Spark pipeline end to end on real servers (PG15, PG18) and a real local SparkSession:
a randomized workload over five tables, received by ``pipeline.run`` (the receiver process on
a walsender), streamed through ``format("pgcdc")`` into Delta, and compared with the source
(mirrors row for row, histories at sampled LSNs, changelogs exactly once, op for op); the
data source's batch and streaming reads; and a ``--once`` run's backlog landed in one batch."""

from __future__ import annotations

import random
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

from pgcdc import pipeline
from pgcdc.changelog import ChangeLog
from tests.conftest import Database

from .helpers import (
    PUBLICATION,
    SLOT,
    Workload,
    assert_lake_matches,
    column_names,
    drain,
    lake_path,
    mirror_rows,
    prepare_source,
    source_state,
    table_rows,
)

PIPELINE_SLOT = "pipeline"


def _settings(db: Database, tmp_path: Path, **changes: Any) -> pipeline.Settings:
    """``pipeline.run``'s settings for a slot the test created, without a snapshot."""
    return pipeline.Settings(
        conninfo=db.conninfo(),
        slot=PIPELINE_SLOT,
        publications=(PUBLICATION,),
        create_slot=False,
        snapshot="never",
        changelog=str(tmp_path / "log"),
        lake=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"),
        master="local[2]",
        **changes,
    )


def test_random_workload_mirrors_histories_and_changelogs_match_the_source(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    """Through the path users run: ``pipeline.run(once=True)`` after each of three rounds. A
    second slot, read through the SQL interface, says which changes each commit made."""
    reference = ChangeLog(tmp_path / "reference")
    lake = tmp_path / "lake"
    settings = _settings(db, tmp_path, trigger_interval=0.5, max_changes_per_batch=400)
    workload = Workload(random.Random(db.major))
    transactions = []
    with db.connect() as conn:
        prepare_source(conn, slots=(SLOT, PIPELINE_SLOT))
        for round_number in range(3):
            for _ in range(40):
                workload.step(conn)
            workload.sample(conn)
            transactions += drain(conn, reference)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                pipeline.run(settings, once=True, spark=spark)
            if round_number == 0:
                assert any("public.events" in str(w.message) for w in caught)
        final = source_state(conn)
        names = column_names(conn)
        assert workload.added_column

    assert_lake_matches(lake, names, final, workload.samples, transactions)
    assert ChangeLog(settings.changelog).consumers.acknowledged("pipeline") > 0


def test_batch_and_streaming_reads_of_the_data_source(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    root = tmp_path / "log"
    log = ChangeLog(root)
    with db.connect() as conn:
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, at timestamptz)")
        for start in range(0, 300, 30):  # 10 transactions of 30 inserts
            conn.execute(
                "INSERT INTO items SELECT g, 'n' || g, 'infinity' "
                "FROM generate_series(%s::int, %s::int) g",
                (start, start + 29),
            )
        conn.execute("UPDATE items SET name = NULL WHERE id < 5")
        transactions = drain(conn, log, segment_bytes=20_000, frame_bytes=4_000)
    assert len(log.segments()) > 1
    commits = [int(t.commit_lsn) for t in transactions]

    typed = spark.read.format("pgcdc").option("path", str(root)).option("table", "public.items")
    rows = typed.load().collect()
    assert len(rows) == 305
    inserts = {r["id"]: r for r in rows if r["_op"] == "insert"}
    assert sorted(inserts) == list(range(300))
    # 'infinity' has no Arrow timestamp: null typed value, exact text alongside.
    assert inserts[7]["at"] is None and inserts[7]["_text"] == {"at": "infinity"}
    updates = [r for r in rows if r["_op"] == "update"]
    assert {r["id"] for r in updates} == set(range(5)) and all(r["name"] is None for r in updates)

    ranged = (
        spark.read.format("pgcdc")
        .option("path", str(root))
        .option("startingLsn", str(transactions[2].commit_lsn))
        .option("endingLsn", str(transactions[4].commit_lsn))
        .load()
        .collect()
    )
    assert {r["commit_lsn"] for r in ranged} == set(commits[2:5])
    assert len(ranged) == 90
    assert all(r["values"]["name"] == "n" + r["values"]["id"] for r in ranged)
    # Nothing to read (a range past the log's end, a log with no segments): no rows, no error
    # (pyspark reads one partition of its own when the reader plans none).
    past_the_end = spark.read.format("pgcdc").option("path", str(root))
    assert past_the_end.option("startingLsn", str(commits[-1] + 1)).load().count() == 0
    (tmp_path / "empty").mkdir()
    assert spark.read.format("pgcdc").option("path", str(tmp_path / "empty")).load().count() == 0

    seen: list[list[int]] = []

    def record(frame: Any, batch_id: int) -> None:
        seen.append([r["commit_lsn"] for r in frame.select("commit_lsn").collect()])

    query = (
        spark.readStream.format("pgcdc")
        .option("path", str(root))
        .option("consumer", "limited")
        .option("maxChangesPerBatch", "70")
        .load()
        .writeStream.option("checkpointLocation", str(tmp_path / "cp"))
        .foreachBatch(record)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = [b for b in seen if b]
    streamed = Counter(c for b in batches for c in b)
    assert sum(streamed.values()) == 305 and set(streamed) == set(commits)
    # Whole transactions only, at most 70 rows unless one transaction alone is bigger.
    for batch in batches:
        assert len(batch) <= 70
        for commit in set(batch):
            assert batch.count(commit) == streamed[commit]
    assert len(batches) >= 5
    # The consumer acknowledged what it read, and the log let go of segments.
    assert log.consumers.acknowledged("limited") > commits[0]
    oldest = log.segments()[0].first_commit_lsn
    assert oldest is not None and oldest > commits[0]


def test_a_once_run_lands_a_backlog_in_one_batch(db: Database, tmp_path: Path, spark: Any) -> None:
    """``pipeline.run(once=True)`` with no batch limit takes no batch while its receiver logs
    the backlog (the source's ``holdUntil``), so every table is written once: one Delta version
    after its creation, holding every change. Without the hold the query, which looks every
    0.25 s, takes part of the backlog while the receiver is still logging it."""
    from deltalake import DeltaTable

    from pgcdc.sinks import SinkKind

    settings = _settings(db, tmp_path, kinds=(SinkKind.CHANGELOG, SinkKind.MIRROR))
    with db.connect() as conn:
        prepare_source(conn, slots=(PIPELINE_SLOT,))
        for n in range(300):  # some 1.5 s of receiving: more than the query needs to start
            conn.execute(
                "INSERT INTO orders SELECT 'r', g, %s "
                "FROM generate_series(%s::bigint, %s::bigint) g",
                (n, n * 1000, n * 1000 + 999),
            )
            conn.commit()
        columns, source = table_rows(conn, "public.orders")
    pipeline.run(settings, once=True, spark=spark)
    for kind in (SinkKind.CHANGELOG, SinkKind.MIRROR):
        table = DeltaTable(lake_path(tmp_path / "lake", "public.orders", kind))
        writes = [h for h in table.history() if h["operation"] != "CREATE TABLE"]
        assert len(writes) == 1, (kind, [h["operation"] for h in table.history()])
        assert table.to_pyarrow_table().num_rows == 300_000
    assert mirror_rows(tmp_path / "lake", "public.orders", columns) == source
