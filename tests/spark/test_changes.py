"""Executor-side typing (``pgcdc.spark.changes``) and the driver's ordering of runs, without
Spark: a column added mid-batch splits a table into two runs written as two versions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

from deltalake import DeltaTable

from pgcdc.changelog import encode
from pgcdc.decoding.state import table_to_dict
from pgcdc.events import Column, Delete, Insert, Table, Update
from pgcdc.lsn import LSN
from pgcdc.sinks import DeltaSink, SinkKind, read_table
from pgcdc.spark.changes import change_tables
from pgcdc.spark.pipeline import RUNS_PER_BATCH, Chunk, rounds, write_chunks
from pgcdc.transactions import CommittedTransaction

V1 = Table("public", "t", (Column("id", 23, is_key=True), Column("name", 25)), oid=7)
V2 = Table("public", "t", (*V1.columns, Column("added", 20)), oid=7)
NOW = datetime(2025, 1, 1, tzinfo=UTC)


def _txn(n: int, *events: object) -> CommittedTransaction:
    lsn = LSN(0x1000 * n)
    return CommittedTransaction(n, lsn, lsn + 8, NOW, tuple(events))  # type: ignore[arg-type]


def test_an_added_column_mid_batch_gives_two_runs_written_in_order(tmp_path: Path) -> None:
    batch = encode(
        [
            _txn(1, Insert(LSN(0x0F00), V1, ("1", "a")), Insert(LSN(0x0F10), V1, ("2", "b"))),
            _txn(2, Update(LSN(0x1F00), V2, ("1", "a2", "10"))),
            _txn(3, Delete(LSN(0x2F00), V2, ("2", None, None))),
        ]
    )
    runs = list(change_tables([batch], from_lsn=0x1000))
    assert [r.table for r in runs] == [V1, V2]
    assert runs[0].changes.column("_op").to_pylist() == ["insert", "insert"]
    assert runs[1].changes.column("added").to_pylist() == [10, None]
    assert runs[1].changes.column("_old").to_pylist()[1]["id"] == 2
    # Rows below from_lsn are skipped.
    assert [r.first for r in change_tables([batch], from_lsn=0x2000)] == [(0x2000, 0)]

    chunks = [
        Chunk(r.table.qualified_name, json.dumps(table_to_dict(r.table)), r.first, r.changes)
        for r in reversed(runs)  # the driver gets them in any order
    ]
    ordered = rounds(chunks)
    assert [[spec.schema.names for spec, _ in r] for r in ordered] == [
        [["id", "name"]],
        [["id", "name", "added"]],
    ]
    sink = DeltaSink(tmp_path, app_id="a", kinds=(SinkKind.CHANGELOG, SinkKind.MIRROR))
    results = write_chunks(sink, 5, chunks)
    assert all(r.applied for r in results)
    mirror = read_table(tmp_path / "public" / "t" / "mirror").to_pylist()
    assert [(r["id"], r["name"], r["added"]) for r in mirror] == [(1, "a2", 10)]
    # A replay of batch 5 (after a crash) writes nothing; batch 6 is new.
    assert not any(r.applied for r in write_chunks(sink, 5, chunks))
    changelog = read_table(tmp_path / "public" / "t" / "changelog")
    assert changelog.num_rows == 4
    version = 5 * RUNS_PER_BATCH + 1
    assert DeltaTable(str(tmp_path / "public" / "t" / "changelog")).transaction_version("a") == (
        version
    )
