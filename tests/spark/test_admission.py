"""The stream reader's admission control, without Spark: where ``latestOffset`` ends a batch
under the read limits, and ``holdUntil`` (what ``pipeline run --once`` gives it): no partial
batch until that file is there, so a backlog lands in as few batches as the limits allow."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql.streaming.datasource import ReadAllAvailable

from pgcdc.changelog import ChangeLog
from pgcdc.events import Column, Insert, Table
from pgcdc.lsn import LSN
from pgcdc.spark.source import PgcdcStreamReader, Settings, offset
from pgcdc.transactions import CommittedTransaction

T = Table("public", "t", (Column("id", 23, is_key=True), Column("v", 25)), oid=7)
NOW = datetime(2025, 1, 1, tzinfo=UTC)
TRANSACTIONS = 10
ROWS = 5  # per transaction


def _log(root: Path) -> list[LSN]:
    """A log of TRANSACTIONS transactions of ROWS inserts each; their commit LSNs."""
    commits = []
    with ChangeLog(root).writer() as writer:
        for n in range(1, TRANSACTIONS + 1):
            lsn = LSN(0x1000 * n)
            events = tuple(Insert(lsn - 0x100 + k, T, (str(n * 10 + k), "x")) for k in range(ROWS))
            writer.append(CommittedTransaction(n, lsn, lsn + 8, NOW, events))
            commits.append(lsn)
        writer.flush()
    return commits


def _reader(root: Path, **options: str) -> PgcdcStreamReader:
    settings = Settings.parse({"path": str(root), "format": "chunks", **options})
    return PgcdcStreamReader(settings, None)


def test_a_held_stream_takes_no_partial_batch_until_its_file_is_there(tmp_path: Path) -> None:
    commits = _log(tmp_path / "log")
    released = tmp_path / "logged"
    reader = _reader(tmp_path / "log", holdUntil=str(released))
    start = reader.initialOffset()
    assert reader.latestOffset(start, ReadAllAvailable()) == start
    released.touch()
    assert reader.latestOffset(start, ReadAllAvailable()) == offset(commits[-1])
    released.unlink()  # released once: the stream does not go back to holding
    assert reader.latestOffset(start, ReadAllAvailable()) == offset(commits[-1])


def test_a_held_stream_takes_the_batches_its_limits_fill(tmp_path: Path) -> None:
    commits = _log(tmp_path / "log")
    released = tmp_path / "logged"
    # Three transactions' rows fit in a batch, four do not.
    limit = str(3 * ROWS + 2)
    reader = _reader(tmp_path / "log", holdUntil=str(released), maxChangesPerBatch=limit)
    unheld = _reader(tmp_path / "log", maxChangesPerBatch=limit)
    start = offset(0)
    batches = []
    while (end := reader.latestOffset(start, reader.getDefaultReadLimit())) != start:
        assert end == unheld.latestOffset(start, unheld.getDefaultReadLimit())
        batches.append(end)
        start = end
    # Held, the last transaction waits: alone it does not fill a batch.
    assert batches == [offset(commits[2]), offset(commits[5]), offset(commits[8])]
    assert unheld.latestOffset(start, unheld.getDefaultReadLimit()) == offset(commits[9])
    released.touch()
    assert reader.latestOffset(start, reader.getDefaultReadLimit()) == offset(commits[9])
