"""Executor-side typing (``pgcdc.spark.changes``) and the driver's ordering of runs, without
Spark: a column added mid-batch splits a table into two runs written as two versions."""

from __future__ import annotations

import io
import itertools
import json
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pgcdc.changelog import ChangeLog, encode
from pgcdc.changelog import segments as fmt
from pgcdc.changelog.reader import read_segment, segment_frames
from pgcdc.decoding.state import table_to_dict
from pgcdc.events import Column, Delete, Insert, Table, Type, Update
from pgcdc.lsn import LSN
from pgcdc.sinks import DeltaSink, SinkKind, read_table
from pgcdc.spark import source
from pgcdc.spark.changes import change_tables
from pgcdc.spark.pipeline import RUNS_PER_BATCH, Chunk, rounds, write_chunks
from pgcdc.spark.source import PgcdcBatchReader, Settings, read_ipc
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


def _txns_with_a_type_and_a_new_column() -> list[CommittedTransaction]:
    """20 transactions of inserts (and a delete every third); from the 11th, a Type and a
    column of that type."""
    mood = Table("public", "t", (*V1.columns, Column("mood", 90001)), oid=7)
    txns = []
    for n in range(1, 21):
        table = V1 if n <= 10 else mood
        events: list[object] = []
        if n == 11:
            events.append(Type(LSN(0x1000 * n - 0x200), 90001, "public", "mood"))
        for k in range(5):
            key = str(n * 10 + k)
            values = (key, f"v{key}") if n <= 10 else (key, f"v{key}", "happy")
            events.append(Insert(LSN(0x1000 * n - 0x100 + k), table, values))
        if n % 3 == 0:
            old = (str(n * 10),) + (None,) * (len(table.columns) - 1)
            events.append(Delete(LSN(0x1000 * n - 0x10), table, old))
        txns.append(_txn(n, *events))
    return txns


Found = list[tuple[str, tuple[int, int], list[dict[str, Any]]]]


def _small_frames_log(root: Path) -> ChangeLog:
    """``_txns_with_a_type_and_a_new_column`` in a log of many small frames."""
    log = ChangeLog(root)
    with log.writer(frame_bytes=600) as writer:
        for txn in _txns_with_a_type_and_a_new_column():
            writer.append(txn)
        writer.flush()
    return log


def _reader(root: Path, rows_per_partition: int, low: str) -> PgcdcBatchReader:
    options = {
        "path": str(root),
        "format": "chunks",
        "startingLsn": low,
        "rowsPerPartition": str(rows_per_partition),
    }
    return PgcdcBatchReader(Settings.parse(options), None)


def _read_parts(root: Path, rows_per_partition: int, low: str) -> tuple[int, Found]:
    reader = _reader(root, rows_per_partition, low)
    parts = reader.partitions()
    found: Found = []
    for part in parts:
        for batch in reader.read(part):
            for row in batch.to_pylist():
                changes = read_ipc(row["chunk"]).drop_columns(["_commit_time"])
                first = (row["first_commit_lsn"], row["first_seq"])
                found.append((row["definition"], first, changes.to_pylist()))
    return len(parts), found


def _in_order(found: Found) -> list[tuple[str, dict[str, Any]]]:
    return [(d, r) for d, _, rows in sorted(found, key=lambda f: f[1]) for r in rows]


def test_a_segment_split_into_row_ranges_reads_as_the_whole(tmp_path: Path) -> None:
    log = _small_frames_log(tmp_path / "log")
    assert len(log.segments()) == 1
    for low in ("0/0", "0/5000", "0/C000"):
        whole_parts, whole = _read_parts(tmp_path / "log", 100_000, low)
        split_parts, split = _read_parts(tmp_path / "log", 7, low)
        assert whole_parts == 1 and split_parts > 5
        # The same rows typed the same way (the Type before a part's range counts), in order.
        assert _in_order(split) == _in_order(whole)
        expected = [
            e
            for t in _txns_with_a_type_and_a_new_column()
            if t.commit_lsn >= LSN.parse(low)
            for e in t.events
            if isinstance(e, Insert | Delete)
        ]
        moods = [r.get("mood") for _, r in _in_order(whole)]
        happy = sum(isinstance(e, Insert) and len(e.new) == 3 for e in expected)
        assert len(moods) == len(expected) and moods.count("happy") == happy > 0


def test_parts_start_at_the_batch_with_the_types_in_force_there(tmp_path: Path) -> None:
    log = _small_frames_log(tmp_path / "log")
    root = tmp_path / "log"
    # One reader planning successive batches (as a stream does) reads each Type row once and
    # gives every batch the parts a fresh reader gives it.
    streaming = _reader(root, 7, "0/0")
    bounds = [LSN(0x1000 * n) for n in range(0, 21, 3)]
    for low, high in itertools.pairwise(bounds):
        parts = streaming.plan(low + 1, high)
        fresh = _reader(root, 7, "0/0").plan(low + 1, high)
        assert [(p.rows, p.types) for p in parts] == [(p.rows, p.types) for p in fresh]
        assert parts and all(p.rows is not None for p in parts)
        # No part reads the frames before the batch: the first starts where its frame does.
        frames = segment_frames(log.segments()[0].path)
        starts = [sum(f.rows for f in frames[:i]) for i in range(len(frames))]
        first = next(s for s, f in zip(starts, frames, strict=True) if f.last_commit_lsn > low)
        assert parts[0].rows is not None and parts[0].rows[0] == first
        # Parts after the Type row (in transaction 11) get its definition from the driver.
        assert any("mood" in p.types for p in parts) == (high > 0xB000)


def _forget_notes(segment: str) -> None:
    """Rewrite every frame header as a pgcdc without frame notes wrote it (notes 0)."""
    with open(segment, "r+b") as f:
        data = f.read()
        for ref in fmt.scan(io.BytesIO(data), len(data), segment, verify=False).frames:
            header = ref.header
            start = ref.offset + fmt.FRAME_HEADER_SIZE
            payload = data[start : start + header.length]
            old = fmt.encode_frame(
                header.flags,
                header.first_commit_lsn,
                header.last_commit_lsn,
                header.end_lsn,
                rows=header.rows,
                payload=payload,
                holds_type_rows=False,
            )
            fields = bytearray(old[: fmt.FRAME_HEADER_SIZE - 4])
            fields[6:8] = b"\0\0"
            f.seek(ref.offset)
            f.write(bytes(fields) + zlib.crc32(payload, zlib.crc32(fields)).to_bytes(4, "little"))


def test_planning_reads_only_the_frames_noted_to_hold_type_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "log"
    log = _small_frames_log(root)
    frames = segment_frames(log.segments()[0].path)
    starts = list(itertools.accumulate((f.rows for f in frames), initial=0))
    typed = {
        (start, start + f.rows)
        for start, f in zip(starts, frames, strict=False)
        if f.holds_type_rows
    }
    # The writer notes exactly the frame with the Type row, and says so of every frame.
    assert len(typed) == 1 and all(f.holds_type_rows is not None for f in frames)
    ranges: list[tuple[int, int | None]] = []

    def recording(*args: Any, rows: tuple[int, int | None], **kwargs: Any) -> Any:
        ranges.append(rows)
        return read_segment(*args, rows=rows, **kwargs)

    monkeypatch.setattr(source, "read_segment", recording)
    parts = _reader(root, 7, "0/0").plan(LSN(1), LSN(0x14000))
    assert ranges and all(
        any(low <= a and b is not None and b <= high for low, high in typed) for a, b in ranges
    )
    # A log written before frames had notes: every frame is read, with the same outcome.
    _forget_notes(log.segments()[0].path)
    assert all(f.holds_type_rows is None for f in segment_frames(log.segments()[0].path))
    ranges.clear()
    again = _reader(root, 7, "0/0").plan(LSN(1), LSN(0x14000))
    assert [(p.rows, p.types) for p in again] == [(p.rows, p.types) for p in parts]
    assert sum(b - a for a, b in ranges if b is not None) > sum(b - a for a, b in typed)
