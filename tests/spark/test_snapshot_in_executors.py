"""The initial snapshot copied by Spark tasks (``snapshot_in = "executors"``) against the same
snapshot copied by the receiver into the change log and landed by the query (``"receiver"``), on
PG15 and PG18 with a real local SparkSession: every type and edge value, a keyless REPLICA
IDENTITY FULL table holding identical rows, a table split into many chunks and an empty one land
the same values in all three kinds; then the stream goes on from the snapshot's consistent
point with nothing lost or repeated."""

from __future__ import annotations

import logging
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from pgcdc import pipeline
from pgcdc.changelog import ChangeLog
from pgcdc.decoding.arrow import DEFAULT_OPTIONS
from pgcdc.events import Column, Table, encode_tuple_data
from pgcdc.sinks import SinkKind, read_table
from pgcdc.sinks.delta import ensure_table, initial_rows, prepare, table_schema
from pgcdc.sinks.staged import commit, stage
from pgcdc.spark import snapshot as spark_snapshot
from pgcdc.spark.changes import insert_changes, tuples_to_arrow
from pgcdc.spark.snapshot import (
    SNAPSHOT_APP_SUFFIX,
    _CopyJob,
    _may_hold,
    _remaining,
    _staged_rows_hold,
    _Target,
    _unusable,
)
from pgcdc.spark.source import spec_for
from pgcdc.storage import StorageOptions
from tests.conftest import Database
from tests.parquet import dictionary_columns
from tests.snapshot.test_copy_binary import EVERY_TYPE

from .helpers import lake_path, mirror_rows, table_rows

MORE_TABLES = """
CREATE TABLE dupes (a int, b text);
ALTER TABLE dupes REPLICA IDENTITY FULL;
INSERT INTO dupes SELECT g % 7, 'same' || repeat('y', 40) FROM generate_series(1, 30000) g;
CREATE TABLE big (id bigint PRIMARY KEY, note text, at timestamptz);
INSERT INTO big SELECT g, repeat('x', g % 50), '2024-01-01'::timestamptz + g * interval '1 s'
FROM generate_series(1, 60000) g;
CREATE TABLE nothing_yet (id int PRIMARY KEY);
"""
# What differs between two snapshots of the same rows: where and when each was taken.
WHERE_AND_WHEN = {
    "_commit_lsn",
    "_lsn",
    "_seq",
    "_commit_time",
    "_valid_from_lsn",
    "_valid_from_time",
}
TABLES = ("every", "with_tsvector", "with_hidden_tsvector", "dupes", "big", "nothing_yet")


def _settings(db: Database, root: Path, slot: str, snapshot_in: str) -> pipeline.Settings:
    return pipeline.load(
        None,
        {
            "conninfo": db.conninfo(),
            "slot": slot,
            "publications": ["pub"],
            "snapshot_in": snapshot_in,
            "changelog": str(root / "changelog"),
            "lake": str(root / "lake"),
            "checkpoint": str(root / "checkpoint"),
            "master": "local[2]",
        },
    )


def _landed(lake: Path, name: str, kind: SinkKind) -> list[str]:
    """A Delta table's rows without where and when they were taken, in a fixed order, each as
    its repr (NaN equals NaN, -0.0 differs from 0.0, types shown)."""
    table = read_table(lake_path(lake, f"public.{name}", kind))
    table = table.select([n for n in table.column_names if n not in WHERE_AND_WHEN])
    return sorted(repr(row) for row in table.to_pylist())


def _big_chunks(lake: Path) -> int:
    """How many data files the snapshot's one commit gave the big table's mirror."""
    from deltalake import DeltaTable

    table = DeltaTable(lake_path(lake, "public.big", SinkKind.MIRROR))
    return len(table.file_uris())


def test_executors_land_what_the_change_log_path_lands(
    db: Database,
    tmp_path: Path,
    spark: Any,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(spark_snapshot, "PROGRESS_SECONDS", 0.1)
    db.execute(EVERY_TYPE.replace("CREATE PUBLICATION pub FOR ALL TABLES;", "") + MORE_TABLES)
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    receiver = _settings(db, tmp_path / "receiver", "by_receiver", "receiver")
    executors = _settings(db, tmp_path / "executors", "by_executors", "executors")
    pipeline.run(receiver, once=True, spark=spark)
    with caplog.at_level(logging.INFO, logger="pgcdc.spark.snapshot"):
        pipeline.run(executors, once=True, spark=spark)
    progress = [r.getMessage() for r in caplog.records if "chunks copied" in r.getMessage()]
    assert progress, "no progress was reported while the tasks copied"
    # Rows, bytes and the share of pages as the tasks finish, up to all of them.
    counted = [
        re.search(r"\(([\d,]+) rows, ([\d.]+) MB, (\d+)% of the pages\)", m) for m in progress
    ]
    assert all(counted), progress[:3]
    rows = [int(m.group(1).replace(",", "")) for m in counted if m]
    assert rows == sorted(rows) and rows[-1] > 0, progress
    # The executors' rows never passed through the change log.
    assert list(ChangeLog(tmp_path / "executors" / "changelog").read_transactions()) == []
    assert _big_chunks(tmp_path / "executors" / "lake") > 4
    for name in TABLES:
        for kind in SinkKind:
            by_executors = _landed(tmp_path / "executors" / "lake", name, kind)
            if name == "nothing_yet":  # created empty, where the query waits for a change
                assert by_executors == []
                continue
            by_receiver = _landed(tmp_path / "receiver" / "lake", name, kind)
            assert by_executors == by_receiver, (name, kind)
            assert len(by_executors) > 0, name
    # The stream goes on from the consistent point: each change once, after the snapshot.
    db.execute("UPDATE big SET note = 'changed' WHERE id % 1000 = 0")
    db.execute("DELETE FROM big WHERE id % 999 = 0")
    db.execute("INSERT INTO dupes SELECT 1, 'same' || repeat('y', 40)")
    db.execute("INSERT INTO nothing_yet VALUES (1)")
    pipeline.run(executors, once=True, spark=spark)
    lake = tmp_path / "executors" / "lake"
    with db.connect() as conn:
        for name in ("big", "nothing_yet"):
            columns, expected = table_rows(conn, f"public.{name}")
            assert mirror_rows(lake, f"public.{name}", columns) == expected, name
        dupes = conn.execute("SELECT count(*) FROM dupes WHERE a = 1").fetchone()
    assert dupes is not None
    mirror = read_table(lake_path(lake, "public.dupes", SinkKind.MIRROR))
    ones = mirror.filter(pa.compute.equal(mirror.column("a"), 1))
    assert sorted(ones.column("_pgcdc_copy").to_pylist()) == list(range(1, dupes[0] + 1))
    changelog = read_table(lake_path(lake, "public.big", SinkKind.CHANGELOG))
    # Each change has its own place in the log, the snapshot's rows of every chunk too.
    places = list(zip(*changelog.select(["_commit_lsn", "_seq"]).to_pydict().values(), strict=True))
    assert len(places) == len(set(places)) == 60000 + 60 + 60
    ops = changelog.group_by("_op").aggregate([("_op", "count")]).to_pylist()
    assert {row["_op"]: row["_op_count"] for row in ops} == {
        "insert": 60000,
        "update": 60,
        "delete": 60,
    }


def test_a_lake_table_holding_rows_is_refused_not_added_to(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    """A new change log's snapshot lands in empty tables: rows some other pipeline wrote there
    are a typed error naming the way out, and the slot created for it is dropped again."""
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("INSERT INTO t VALUES (1, 'a'), (2, 'b')")
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    first = _settings(db, tmp_path / "first", "first", "executors")
    pipeline.run(first, once=True, spark=spark)
    second = pipeline.with_overrides(
        _settings(db, tmp_path / "second", "second", "executors"), lake=first.lake
    )
    with pytest.raises(Exception, match="already holds rows") as caught:
        pipeline.run(second, once=True, spark=spark)
    assert "snapshot_in" in str(caught.value)
    with db.connect() as conn:
        slots = conn.execute("SELECT slot_name FROM pg_replication_slots").fetchall()
    assert ("second",) not in slots
    from deltalake import DeltaTable

    mirror = DeltaTable(lake_path(Path(first.lake), "public.t", SinkKind.MIRROR))
    assert mirror.transaction_version(first.pipeline().app_id + SNAPSHOT_APP_SUFFIX) is not None


def test_a_resume_copies_the_pages_outside_the_kept_chunks_in_chunks_ending_open() -> None:
    assert _remaining([(0, 128), (256, 384)], 500, 100) == [
        (128, 228),
        (228, 256),
        (384, 484),
        (484, None),
    ]
    assert _remaining([(128, 256), (384, None)], 500, 100) == [
        (0, 100),
        (100, 128),
        (256, 356),
        (356, 384),
    ]
    assert _remaining([(None, None)], 500, 100) == []  # a whole table kept
    assert _remaining([], 50, 100) == [(0, None)]
    assert _remaining([(0, 128)], 100, 100) == [(128, None)]  # no page added since


def test_a_chunk_numbered_past_what_a_uint32_counts_lands_its_seq(tmp_path: Path) -> None:
    """A table of more than 2**32 / 291 pages (about 115 GiB) numbers its last chunks' rows past
    a uint32: ``_seq`` is an int64 from the change table to the Delta tables."""
    table = Table("public", "big", (Column("id", 20, -1, True), Column("v", 25)), 1)
    rows = pa.array([encode_tuple_data((str(i), "v")) for i in (1, 2)], pa.binary())
    typed = tuples_to_arrow(table, rows, DEFAULT_OPTIONS, {})
    first = 2**40
    changes = insert_changes(
        table,
        typed,
        commit_lsn=99,
        lsn=100,
        commit_time=datetime.now(UTC),
        types={},
        first_seq=first,
    )
    dspec, prepared = prepare(spec_for(table, changes.schema), changes)
    kinds = [SinkKind.CHANGELOG, SinkKind.MIRROR, SinkKind.HISTORY]
    built = initial_rows(kinds, dspec, prepared)
    for kind in kinds:
        path = str(tmp_path / kind.value)
        delta = ensure_table(path, kind, dspec, None)
        partition_by = delta.metadata().partition_columns
        adds = stage(
            path, built[kind], table_schema(delta), StorageOptions(), partition_by=partition_by
        )
        commit(path, adds, replace=False, app_id="a", version=1, storage=StorageOptions())
    landed = read_table(tmp_path / "changelog").sort_by("id")
    assert landed["_seq"].to_pylist() == [first, first + 1]


def test_a_recorded_chunk_may_hold_the_keys_between_its_least_and_greatest() -> None:
    record = {"key_range": [b"V2:10".hex(), b"V2:20".hex()]}
    assert _may_hold(record, [b"V2:10"]) and _may_hold(record, [b"V2:20"])
    assert _may_hold(record, [b"V1:5", b"V2:15", b"V3:100"])
    assert not _may_hold(record, [b"V1:5", b"V2:21", b"V3:100"])
    assert not _may_hold(record, [])
    assert not _may_hold({"key_range": None}, [b"V2:15"])  # a chunk without rows


def _job(*targets: _Target) -> _CopyJob:
    """A snapshot job landing table public.t in ``targets``, for what a resume asks of it."""
    return _CopyJob(
        conninfo="",
        snapshot_name="",
        session_settings=None,
        consistent_point=0,
        commit_time=datetime.now(UTC),
        types={},
        targets={"public.t": targets},
        storage=StorageOptions(),
    )


def test_a_chunk_holds_a_changed_key_when_its_staged_rows_do(tmp_path: Path) -> None:
    """Asked when a chunk's key range holds a changed key: its staged ``_pgcdc_key``s decide;
    without a mirror or history file (no ``_pgcdc_key``) or with an unreadable one, it may."""
    keys = [f"V{len(str(i))}:{i}".encode() for i in range(1000)]
    rows = pa.table({"id": pa.array(range(1000), pa.int64()), "_pgcdc_key": keys})
    path = str(tmp_path / "mirror")
    write_deltalake(path, rows.slice(0, 0))
    mirror = _Target(SinkKind.MIRROR, path, rows.schema, ())
    record = {"adds": {"mirror": stage(path, rows, rows.schema, StorageOptions(), partition_by=())}}
    job = _job(mirror)

    def holds(*changed: bytes, job: _CopyJob = job) -> bool:
        return _staged_rows_hold(job, "public.t", record, pa.array(changed, pa.binary()))

    assert holds(b"V3:500") and holds(b"V1:7", b"V4:5000")
    assert not holds(b"V4:5000") and not holds(b"V3:5000", b"V2:5")
    changelog = _Target(SinkKind.CHANGELOG, str(tmp_path / "changelog"), rows.schema, ())
    assert holds(b"V4:5000", job=_job(changelog))  # no key column to read: the range decides
    [add] = record["adds"]["mirror"]
    staged = Path(path, add["path"])
    staged.write_bytes(b"\0" * staged.stat().st_size)  # unreadable, of the size written
    assert holds(b"V4:5000")


def test_a_recorded_chunk_is_unusable_without_its_files_as_staged_or_a_kind_now_wanted(
    tmp_path: Path,
) -> None:
    """A resume keeps a chunk's staged files only if every one is there as written, and it
    staged rows for every kind the table lands in now: else its pages are copied again."""
    rows = pa.table({"id": pa.array(range(1000), pa.int64())})
    targets = {}
    for kind in (SinkKind.MIRROR, SinkKind.HISTORY):
        path = str(tmp_path / kind.value)
        write_deltalake(path, rows.slice(0, 0))
        targets[kind] = _Target(kind, path, rows.schema, ())
    adds = {
        kind.value: stage(t.path, rows, t.schema, StorageOptions(), partition_by=t.partition_by)
        for kind, t in targets.items()
    }
    job = _job(*targets.values())
    record = {"adds": adds, "first_page": 0, "end_page": 10}
    assert _unusable(job, "public.t", record) is None
    assert _unusable(job, "public.t", {**record, "adds": {"mirror": [], "history": []}}) is None
    only_mirror = {**record, "adds": {"mirror": adds["mirror"]}}
    assert "staged no history rows" in str(_unusable(job, "public.t", only_mirror))
    [history_file] = adds["history"]
    staged = Path(targets[SinkKind.HISTORY].path, history_file["path"])
    staged.write_bytes(staged.read_bytes()[:-1])  # not as written
    assert "is gone or changed" in str(_unusable(job, "public.t", record))
    staged.unlink()  # gone: a VACUUM removed it
    assert "is gone or changed" in str(_unusable(job, "public.t", record))


def test_staged_files_take_a_dictionary_where_values_repeat(tmp_path: Path) -> None:
    """A column of few values is dictionary-encoded (several times smaller), as is one of
    thousands; a column of distinct values is not, a key or not (a dictionary there only costs,
    and then falls back)."""
    count = 10_000
    rows = pa.table(
        {
            "id": pa.array(range(count), pa.int64()),
            "status": pa.array(["new", "paid", "shipped"] * 3333 + ["new"]),
            "amount": pa.array([i * 7.25 for i in range(count)], pa.float64()),
            "balance": pa.array([(i * 7919) % 3000 for i in range(count)], pa.int32()),
            "note": pa.array([None] * count, pa.string()),
            "tags": pa.array([["a"]] * count, pa.list_(pa.string())),
        }
    )
    path = str(tmp_path / "t")
    write_deltalake(path, rows.slice(0, 0))
    [add] = stage(path, rows, rows.schema, StorageOptions(), partition_by=())
    dictionary = dictionary_columns(f"{path}/{add['path']}")
    assert dictionary == {"status", "balance", "note", "tags.list.item"}, dictionary
    assert pq.read_table(f"{path}/{add['path']}").equals(rows)
