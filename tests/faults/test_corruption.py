"""Damage to confirmed change log data is never taken for a torn tail (issue 11, defect 1).

A real receiver logs a workload from a real slot and confirms it; then bytes of the log are
garbled where no crash could have torn them (the middle of the active segment, its last durable
frame, a sealed segment). Restarting the receiver through the CLI must refuse with
``CorruptChangeLog`` naming the file and offset, cut nothing and leave the slot where it was;
``read_transactions()`` and Spark's ``format("pgcdc")`` must raise. A genuine torn tail (a frame
cut short, or garbage after the last frame, past what was made durable and confirmed) is still
recovered, and the log then holds exactly what the source committed.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgcdc.changelog import ChangeLog, ChangeLogWriter
from pgcdc.changelog.segments import FRAME_HEADER_SIZE, MARK_NAME, parse_frame_header, read_header
from pgcdc.errors import CorruptChangeLog
from pgcdc.events import Insert
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions
from pgcdc.spark.pipeline import spark_session
from tests.cli.helpers import current_lsn, pgcdc
from tests.conftest import Database


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    session = spark_session("local[1]", "pgcdc-fault-tests")
    yield session
    session.stop()


def setup(db: Database, *slots: str) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, v text)")
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    for slot in slots:
        db.execute(f"SELECT pg_create_logical_replication_slot('{slot}', 'pgoutput')")


def commit_rows(db: Database, first: int, transactions: int, rows: int = 20) -> None:
    with db.connect() as conn:
        for n in range(transactions):
            start = first + n * rows
            conn.execute(
                "INSERT INTO t SELECT g, repeat(md5(g::text), 8) "
                "FROM generate_series(%s::int, %s::int) g",
                (start, start + rows - 1),
            )


def receive(db: Database, root: Path, slot: str, **writer: Any) -> None:
    """Drain ``slot`` into the log with the real receiver, one fsync (and frame) per commit."""
    options = ReceiverOptions(
        db.conninfo(), slot, publications=("pub",), fsync_interval=0, end_lsn=_end(db)
    )
    with ChangeLogWriter(root, **writer) as sink:
        Receiver(options, sink).run()


def _end(db: Database) -> LSN:
    return LSN.parse(current_lsn(db))


def confirmed(db: Database, slot: str) -> LSN:
    value = db.scalar(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)
    )
    return LSN.parse(value)


def cli_start(db: Database, root: Path, slot: str) -> Any:
    return pgcdc(
        "--start", "-S", slot, "-P", "pgoutput", "--publication", "pub",
        "--format", "changelog", "--log", str(root), "-E", current_lsn(db), "-d", db.conninfo(),
    )  # fmt: skip


def frames(path: Path) -> list[tuple[int, int]]:
    """(offset, end) of every frame in a segment file."""
    data = path.read_bytes()
    with open(path, "rb") as f:
        _, offset = read_header(f, str(path))
    spans = []
    while offset < len(data):
        header = parse_frame_header(data[offset : offset + FRAME_HEADER_SIZE])
        assert header is not None
        end = offset + FRAME_HEADER_SIZE + header.length
        spans.append((offset, end))
        offset = end
    return spans


def garble(path: Path, at: int, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    for i in range(at, at + count):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def logged_rows(root: Path) -> list[tuple[int, str]]:
    return [
        (int(str(e.new[0])), str(e.new[1]))
        for txn in ChangeLog(root).read_transactions()
        for e in txn.events
        if isinstance(e, Insert)
    ]


def source_rows(db: Database) -> list[tuple[int, str]]:
    return [(int(i), str(v)) for i, v in db.execute("SELECT id, v FROM t ORDER BY id")]


def snapshot(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in root.iterdir() if ".pgcdcseg" in p.name}


def assert_refused(db: Database, root: Path, slot: str, path: Path, spark: Any) -> None:
    """Starting, reading and Spark all fail naming the file and an offset; nothing moves."""
    before = snapshot(root)
    position = confirmed(db, slot)
    commit_rows(db, 100_000, 3)  # more work waits on the server
    result = cli_start(db, root, slot)
    assert result.returncode == 1, result.stderr
    stderr = result.stderr.decode()
    assert str(path) in stderr and "damaged at offset" in stderr, stderr
    assert "Traceback" not in stderr
    assert snapshot(root) == before  # nothing cut, nothing set aside
    assert confirmed(db, slot) == position
    with pytest.raises(CorruptChangeLog, match=rf"{path}.*offset \d+"):
        list(ChangeLog(root).read_transactions())
    with pytest.raises(Exception, match=r"CorruptChangeLog.*offset \d+"):
        spark.read.format("pgcdc").option("path", str(root)).load().collect()


def test_garbled_middle_of_the_active_segment_is_refused(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    setup(db, "c")
    commit_rows(db, 0, 40)
    root = tmp_path / "log"
    receive(db, root, "c")
    (path,) = root.glob("*.pgcdcseg")
    assert len(frames(path)) >= 40 and len(logged_rows(root)) == 800
    garble(path, path.stat().st_size // 2)
    assert_refused(db, root, "c", path, spark)


def test_garbled_last_durable_frame_is_refused(db: Database, tmp_path: Path, spark: Any) -> None:
    """No valid frame follows it: only the writer's durable mark tells it from a torn tail."""
    setup(db, "c")
    commit_rows(db, 0, 5)
    root = tmp_path / "log"
    receive(db, root, "c")
    (path,) = root.glob("*.pgcdcseg")
    last_start, last_end = frames(path)[-1]
    assert last_end == path.stat().st_size
    garble(path, (last_start + last_end) // 2)
    assert_refused(db, root, "c", path, spark)


def test_garbled_sealed_segment_is_refused(db: Database, tmp_path: Path, spark: Any) -> None:
    setup(db, "c")
    commit_rows(db, 0, 40)
    root = tmp_path / "log"
    receive(db, root, "c", segment_bytes=20_000)
    paths = sorted(root.glob("*.pgcdcseg"))
    assert len(paths) >= 3
    sealed = paths[1]
    spans = frames(sealed)
    garble(sealed, spans[len(spans) // 2][0] + 60)
    assert_refused(db, root, "c", sealed, spark)


@pytest.mark.parametrize("tear", ["cut-frame", "garbage"])
def test_torn_tail_past_the_confirmed_end_is_recovered(
    db: Database, tmp_path: Path, tear: str
) -> None:
    """The log as a crash before an fsync leaves it: the durable part (confirmed on slot ``c``,
    whose copy ``c2`` stays there), then part of the next frame or garbage."""
    setup(db, "c")
    commit_rows(db, 0, 10)
    root = tmp_path / "log"
    receive(db, root, "c")
    db.execute("SELECT pg_copy_logical_replication_slot('c', 'c2')")
    durable = tmp_path / "durable"
    shutil.copytree(root, durable)
    (path,) = root.glob("*.pgcdcseg")
    size = path.stat().st_size
    commit_rows(db, 10_000, 10)
    receive(db, root, "c")  # the frames the crash will tear
    (next_start, next_end), *_ = [s for s in frames(path) if s[0] >= size]
    assert next_start == size
    torn = durable / path.name
    with open(torn, "ab") as f:
        if tear == "cut-frame":
            f.write(path.read_bytes()[next_start : (next_start + next_end) // 2])
        else:
            f.write(bytes(range(256)) * 40)
    assert (durable / MARK_NAME).exists()

    result = cli_start(db, durable, "c2")
    assert result.returncode == 0, result.stderr
    aside = list(durable.glob("*.torn-*"))
    assert [p.name for p in aside] == [f"{path.name}.torn-{size}"]
    assert logged_rows(durable) == source_rows(db)
    assert confirmed(db, "c2") >= max(t.end_lsn for t in ChangeLog(durable).read_transactions())
