"""The change log on the local filesystem and on other pyarrow filesystems."""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from pgcdc.changelog import ChangeLog, read_segment
from pgcdc.changelog.codec import SCHEMA, decode
from pgcdc.errors import (
    ChangeLogLocked,
    CorruptChangeLog,
    DecodeError,
    UnknownConsumer,
    UnloggableInput,
)
from pgcdc.events import Delete, EncodedRow, Event, Insert, Relation, Row, RowRun, Type, Update
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction
from tests.transactions.builders import with_runs

from .helpers import TABLE, log_rows, transaction, transactions

SMALL = {"segment_bytes": 6000, "frame_bytes": 1500}


def write(log: ChangeLog, txns: list[CommittedTransaction], **options) -> LSN:
    with log.writer(**(SMALL | options)) as writer:
        for txn in txns:
            assert writer.append(txn)
        return writer.flush()


def test_segments_roll_and_read_back_in_order(tmp_path):
    log = ChangeLog(tmp_path / "log")
    txns = list(transactions(1, 60))
    assert write(log, txns) == txns[-1].end_lsn
    infos = log.segments()
    assert len(infos) > 3
    assert all(i.complete for i in infos[:-1])
    assert [i.path for i in infos] == sorted(i.path for i in infos)
    for before, after in itertools.pairwise(infos):
        assert before.last_commit_lsn < after.first_commit_lsn  # type: ignore[operator]
    assert infos[0].first_commit_lsn == txns[0].commit_lsn
    assert infos[-1].last_commit_lsn == txns[-1].commit_lsn
    assert infos[-1].end_lsn == txns[-1].end_lsn
    assert sum(i.size for i in infos) == sum(
        os.path.getsize(p) for p in (tmp_path / "log").glob("*.pgcdcseg")
    )
    assert list(log.read_transactions()) == txns
    # Segment by segment, each holds exactly the transactions of its range.
    pieces = []
    for info in infos:
        got = list(decode(log.read_segment(info.path)))
        assert all(
            info.first_commit_lsn <= t.commit_lsn <= info.last_commit_lsn  # type: ignore[operator]
            for t in got
        )
        pieces.extend(got)
    assert pieces == txns


def test_lsn_ranges_are_inclusive(tmp_path):
    log = ChangeLog(tmp_path)
    txns = list(transactions(1, 40))
    write(log, txns)
    low, high = txns[5].commit_lsn, txns[30].commit_lsn
    assert list(log.read_transactions(low, high)) == txns[5:31]
    assert list(log.read_transactions(LSN(low + 1))) == txns[6:]
    assert list(log.read_transactions(to_lsn=LSN(low - 1))) == txns[:5]
    batches = [b for i in log.segments() for b in log.read_segment(i.path, low, high)]
    commits = {c for b in batches for c in b.column("commit_lsn").to_pylist()}
    assert commits == {t.commit_lsn for t in txns[5:31]}
    assert all(b.schema.equals(SCHEMA) for b in batches)


def _read_in_child(path: str, queue) -> None:
    table = pa.Table.from_batches(list(read_segment(path)), schema=SCHEMA)
    queue.put(table.num_rows)


def test_a_segment_reads_in_another_process(tmp_path):
    log = ChangeLog(tmp_path)
    txns = list(transactions(1, 30))
    write(log, txns)
    first = log.segments()[0]
    expected = sum(1 for _ in log.read_transactions(to_lsn=first.last_commit_lsn) for _ in _.events)
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_read_in_child, args=(first.path, queue))
    child.start()
    rows = queue.get(timeout=120)
    child.join()
    assert child.exitcode == 0
    assert rows == expected > 0


def test_replayed_transactions_are_dropped(tmp_path):
    log = ChangeLog(tmp_path)
    txns = list(transactions(1, 21))
    with log.writer(**SMALL) as writer:
        for txn in txns[:10]:
            assert writer.append(txn)
        assert writer.last_commit_lsn == txns[9].commit_lsn
        assert not writer.append(txns[9])
        assert not writer.append(txns[3])
        writer.flush()
    with log.writer(**SMALL) as writer:
        assert writer.last_commit_lsn == txns[9].commit_lsn
        assert writer.durable_lsn == txns[9].end_lsn
        # A server replaying after its crash sends everything from an older position again.
        appended = [writer.append(t) for t in txns]
        assert appended == [False] * 10 + [True] * 10
    assert list(log.read_transactions()) == txns


def test_empty_log(tmp_path):
    log = ChangeLog(tmp_path / "nothing")
    assert log.segments() == []
    assert list(log.read_transactions()) == []
    with log.writer() as writer:
        assert writer.last_commit_lsn == 0
        assert writer.flush() == 0
    assert log.segments() == []


def test_flush_makes_appended_transactions_visible_and_durable(tmp_path):
    log = ChangeLog(tmp_path)
    txns = list(transactions(1, 6))
    with log.writer() as writer:
        writer.append(txns[0])
        assert writer.durable_lsn == 0
        assert writer.flush() == txns[0].end_lsn == writer.durable_lsn
        writer.append(txns[1])
        assert writer.durable_lsn == txns[0].end_lsn
        assert list(log.read_transactions()) == txns[:1]
        assert writer.flush() == txns[1].end_lsn
        assert list(log.read_transactions()) == txns[:2]


def test_one_writer_at_a_time(tmp_path):
    log = ChangeLog(tmp_path)
    with log.writer(), pytest.raises(ChangeLogLocked, match="only one writer"):
        log.writer()
    with log.writer() as writer:
        assert writer.last_commit_lsn == 0


def _failing(events: list[Event]) -> Iterator[Event]:
    yield from events
    raise OSError("spill file vanished")


@pytest.mark.parametrize("rows", [2, 400])
@pytest.mark.parametrize("local", [True, False])
def test_a_failed_append_leaves_no_trace(tmp_path, rows, local):
    filesystem = None if local else pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    log = ChangeLog("log" if not local else tmp_path / "log", filesystem=filesystem)
    txns = list(transactions(1, 5))
    big = transaction(3, rows)
    broken = CommittedTransaction(
        big.xid, big.commit_lsn, big.end_lsn, big.commit_time, _failing(list(big.events))
    )
    with log.writer(frame_bytes=2000) as writer:
        writer.append(txns[0])
        writer.append(txns[1])
        with pytest.raises(OSError, match="spill file vanished"):
            writer.append(broken)
        assert writer.last_commit_lsn == txns[1].commit_lsn
        assert writer.append(txns[2])
        writer.append(txns[3])
    assert list(log.read_transactions()) == txns[:4]


def test_unloggable_event_is_rejected_without_trace(tmp_path):
    log = ChangeLog(tmp_path)
    wrong = Insert(LSN(1), TABLE, (3,))  # type: ignore[arg-type]
    bad = CommittedTransaction(1, LSN(1 << 40), LSN((1 << 40) + 5), None, (wrong,))
    with log.writer() as writer:
        writer.append(transaction(0))
        with pytest.raises(UnloggableInput):
            writer.append(bad)
    assert list(log.read_transactions()) == [transaction(0)]


def test_segments_carry_the_relation_state_at_their_start(tmp_path):
    log = ChangeLog(tmp_path)
    other = TABLE.__class__("public", "other", TABLE.columns, oid=20000)
    txns = []
    for number in range(1, 40):
        events: list[Event] = [Insert(LSN(number * 100), TABLE, ("1", "a", b"b"))] * 20
        if number == 3:
            events.insert(0, Relation(LSN(number * 100 - 1), other))
            events.insert(0, Type(LSN(number * 100 - 2), 70000, "public", "mood"))
        txns.append(
            CommittedTransaction(
                number, LSN(number * 100), LSN(number * 100 + 5), None, tuple(events)
            )
        )
    write(log, txns)
    infos = log.segments()
    assert len(infos) > 2
    assert log.state_at(infos[0]).relations == {}
    later = log.state_at(infos[-1])
    assert later.relations == {20000: other}
    assert later.types[70000].name == "mood"
    # A reopened writer recovers the state, and new segments keep carrying it.
    write(log, [transaction(5000, 50)])
    assert log.state_at(log.segments()[-1]).relations == {20000: other}


def test_consumers_release_segments_only_when_all_are_past(tmp_path):
    log = ChangeLog(tmp_path)
    txns = list(transactions(1, 60))
    write(log, txns)
    infos = log.segments()
    assert log.release() == []  # nobody registered: nothing is known to be safe
    log.register_consumer("spark")
    log.register_consumer("audit")
    assert log.release() == []
    log.acknowledge("spark", infos[2].last_commit_lsn)
    assert log.release() == []
    log.acknowledge("audit", infos[1].last_commit_lsn)
    assert log.release() == [infos[0].path, infos[1].path]
    # Acknowledgements are durable and only move forward.
    reopened = ChangeLog(tmp_path)
    assert reopened.consumers.all() == {
        "spark": infos[2].last_commit_lsn,
        "audit": infos[1].last_commit_lsn,
    }
    assert reopened.acknowledge("spark", 5) == infos[2].last_commit_lsn
    # Past everything: every segment but the newest goes.
    reopened.acknowledge("spark", txns[-1].commit_lsn)
    reopened.acknowledge("audit", LSN(infos[3].last_commit_lsn - 1))
    assert reopened.release() == [infos[2].path]
    reopened.consumers.unregister("audit")
    assert reopened.release() == [i.path for i in infos[3:-1]]
    assert [i.path for i in reopened.segments()] == [infos[-1].path]
    assert list(reopened.read_transactions()) == [
        t
        for t in txns
        if t.commit_lsn >= infos[-1].first_commit_lsn  # type: ignore[operator]
    ]
    # The newest segment keeps the position: replays are still dropped.
    with reopened.writer() as writer:
        assert not writer.append(txns[-1])


def test_consumer_errors(tmp_path):
    log = ChangeLog(tmp_path)
    with pytest.raises(UnknownConsumer):
        log.acknowledge("ghost", 1)
    with pytest.raises(UnloggableInput, match="not allowed"):
        log.register_consumer("../escape")


def test_a_damaged_sealed_segment_is_an_error_not_a_gap(tmp_path):
    log = ChangeLog(tmp_path)
    write(log, list(transactions(1, 40)))
    first = log.segments()[0]
    with open(first.path, "r+b") as f:
        f.seek(first.size // 2)
        byte = f.read(1)
        f.seek(first.size // 2)
        f.write(bytes([byte[0] ^ 0x40]))
    with pytest.raises(CorruptChangeLog, match="restore"):
        list(log.read_transactions())


@pytest.mark.parametrize(
    "make",
    [
        lambda root: (pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem()), "log"),
        lambda root: (pafs._MockFileSystem(), "bucket/log"),
    ],
    ids=["subtree", "mock"],
)
def test_write_once_filesystems(tmp_path, make):
    filesystem, root = make(tmp_path)
    log = ChangeLog(root, filesystem=filesystem)
    txns = list(transactions(1, 30))
    with log.writer(**SMALL) as writer:
        for txn in txns[:10]:
            writer.append(txn)
        before = len(log.segments())
        assert writer.flush() == txns[9].end_lsn
        # Each flush completes one immutable segment.
        assert len(log.segments()) == before + 1
        assert all(i.complete for i in log.segments())
        for txn in txns[10:20]:
            writer.append(txn)
    # An unfinished temporary object of a crashed writer is ignored, then removed.
    with filesystem.open_output_stream(f"{root}/00000000DEADBEEF.pgcdcseg.1.tmp") as out:
        out.write(b"PGCDCSEG torn")
    assert list(log.read_transactions()) == txns[:20]
    with log.writer(**SMALL) as writer:
        assert writer.last_commit_lsn == txns[19].commit_lsn
        assert [writer.append(t) for t in txns[15:]] == [False] * 5 + [True] * 9
    names = [i.base_name for i in filesystem.get_file_info(pafs.FileSelector(root))]
    assert not [n for n in names if n.endswith(".tmp")]
    assert list(log.read_transactions()) == txns
    log.register_consumer("c", acknowledged_lsn=txns[-1].commit_lsn)
    count = len(log.segments())
    assert len(log.release()) == count - 1 > 0
    (last,) = log.segments()
    kept = [t for t in txns if t.commit_lsn >= last.first_commit_lsn]  # type: ignore[operator]
    assert kept and kept[-1] == txns[-1]
    assert list(log.read_transactions()) == kept


def _frames(root) -> list[tuple[int, int, int, int]]:
    """(flags, first commit, last commit, rows) of every frame, in log order."""
    from pgcdc.changelog import segments as fmt

    found: list[tuple[int, int, int, int]] = []
    for path in sorted(root.glob("*.pgcdcseg")):
        with open(path, "rb") as f:
            scan = fmt.scan(f, os.path.getsize(path), str(path), verify=True)
        found += [
            (
                r.header.flags,
                int(r.header.first_commit_lsn),
                int(r.header.last_commit_lsn),
                r.header.rows,
            )
            for r in scan.frames
        ]
    return found


def _encoded(row: Any) -> Any:
    return None if row is None else EncodedRow.from_values(row)


def _decoder_rows(txn: CommittedTransaction) -> CommittedTransaction:
    """``txn`` with its changes' rows as the decoder hands them out (EncodedRow)."""

    def encoded(e: Event) -> Event:
        if isinstance(e, Insert):
            return replace(e, new=_encoded(e.new))
        if isinstance(e, Update):
            return replace(e, new=_encoded(e.new), old=_encoded(e.old))
        if isinstance(e, Delete):
            return replace(e, old=_encoded(e.old))
        return e

    return replace(txn, events=tuple(map(encoded, txn.events)))


def _changes(
    number: int,
    rows: int,
    xids: Callable[[int], int | None],
    change: Callable[[LSN, Row, int | None, int], Event] = lambda lsn, row, xid, i: Insert(
        lsn, TABLE, row, xid
    ),
) -> CommittedTransaction:
    commit = LSN(0x1000000 + number * 0x10000)
    events = tuple(
        change(
            LSN(commit - 0x8000 + i), (str(i), f"row {i}" * (i % 5), b"\x01" * (i % 9)), xids(i), i
        )
        for i in range(rows)
    )
    return CommittedTransaction(number, commit, commit + 8, None, events)


def _inserts(number: int, rows: int, xids: Callable[[int], int | None]) -> CommittedTransaction:
    return _changes(number, rows, xids)


@pytest.mark.parametrize("frame_bytes", [1500, 20_000, 4 << 20])
def test_decoder_rows_are_logged_in_runs_with_the_same_frames(tmp_path, frame_bytes):
    """Runs of decoder rows take the bulk path; the log reads back the same and is cut into
    the same frames as when every event is added on its own (tuple rows)."""
    txns = [
        _inserts(1, 2, lambda i: None),
        _inserts(2, 3000, lambda i: None),  # longer than one run
        transaction(0x35, 40),  # updates and a relation between inserts: event by event
        _inserts(4, 700, lambda i: 100 + i % 3),  # subtransaction xids
        _inserts(5, 1, lambda i: 7),
        _inserts(6, 2500, lambda i: 9),
        # Runs of updates and of deletes too; the ones with old rows, or with both kinds of
        # old row in one run, go event by event.
        _changes(7, 1500, lambda i: None, lambda lsn, row, xid, i: Update(lsn, TABLE, row)),
        _changes(
            8, 900, lambda i: 5, lambda lsn, row, xid, i: Delete(lsn, TABLE, row[:1], xid=xid)
        ),
        _changes(9, 40, lambda i: None, lambda lsn, row, xid, i: Delete(lsn, TABLE, row, False)),
        _changes(10, 30, lambda i: None, lambda lsn, row, xid, i: Delete(lsn, TABLE, row, i > 9)),
        _changes(11, 30, lambda i: 3, lambda lsn, row, xid, i: Update(lsn, TABLE, row, row, True)),
        _changes(
            12, 30, lambda i: None, lambda lsn, row, xid, i: Update(lsn, TABLE, row, None, True)
        ),
    ]
    options = {"frame_bytes": frame_bytes, "segment_bytes": 64 << 20}
    write(ChangeLog(tmp_path / "tuples"), txns, **options)
    decoded = [_decoder_rows(t) for t in txns]
    log = ChangeLog(tmp_path / "encoded")
    write(log, decoded, **options)
    assert list(log.read_transactions()) == txns
    frames = _frames(tmp_path / "encoded")
    assert frames == _frames(tmp_path / "tuples")
    if frame_bytes < 1 << 20:
        assert len(frames) > len(txns)  # large transactions were cut into several frames


@pytest.mark.parametrize(
    "bad",
    [
        lambda e: replace(e, xid=-1),
        lambda e: replace(e, lsn=-5),
        lambda e: replace(e, table=replace(TABLE, name="bad\udcff")),
    ],
)
def test_a_bad_event_in_a_run_of_decoder_rows_leaves_no_trace(tmp_path, bad):
    log = ChangeLog(tmp_path)
    good = _decoder_rows(_inserts(1, 50, lambda i: None))
    broken = _decoder_rows(_inserts(2, 50, lambda i: None))
    events = list(broken.events)
    events[17] = bad(events[17])
    with log.writer(frame_bytes=1500) as writer:
        writer.append(good)
        with pytest.raises(UnloggableInput):
            writer.append(replace(broken, events=tuple(events)))
        assert writer.append(_decoder_rows(_inserts(3, 5, lambda i: None)))
    assert [t.commit_lsn for t in log.read_transactions()] == [good.commit_lsn, LSN(0x1030000)]


@pytest.mark.parametrize("frame_bytes", [1500, 4 << 20])
def test_row_runs_are_logged_as_the_changes_they_stand_for(tmp_path, frame_bytes):
    """A transaction whose row changes come as RowRuns (the receiver's fast path) reads back
    exactly as the same transaction logged change by change."""
    txns = [
        _inserts(1, 3000, lambda i: None),
        transaction(0x35, 40),  # updates and a relation between inserts
        _changes(7, 1500, lambda i: None, lambda lsn, row, xid, i: Update(lsn, TABLE, row)),
        _changes(8, 900, lambda i: None, lambda lsn, row, xid, i: Delete(lsn, TABLE, row[:1])),
        _changes(9, 40, lambda i: None, lambda lsn, row, xid, i: Delete(lsn, TABLE, row, False)),
        _changes(10, 30, lambda i: None, lambda lsn, row, xid, i: Delete(lsn, TABLE, row, i > 9)),
    ]
    with_rows_as_runs = [replace(t, events=tuple(with_runs(t.events))) for t in txns]
    assert sum(isinstance(e, RowRun) for t in with_rows_as_runs for e in t.events) >= 6
    options = {"frame_bytes": frame_bytes, "segment_bytes": 64 << 20}
    log = ChangeLog(tmp_path / "runs")
    write(log, with_rows_as_runs, **options)
    assert list(log.read_transactions()) == txns
    write(ChangeLog(tmp_path / "single"), [_decoder_rows(t) for t in txns], **options)
    assert log_rows(tmp_path / "runs").equals(log_rows(tmp_path / "single"))


@pytest.mark.parametrize("changes", [2, 4, 9, 10])
def test_short_row_runs_are_logged_as_the_changes_they_stand_for(tmp_path, changes):
    """Short RowRuns (a few changes of one table, as small OLTP transactions give) are appended
    row by row, longer ones column by column: both read back, and are laid out, as the same
    changes logged one by one."""
    txns = [
        _inserts(1, changes, lambda i: None),
        _changes(2, changes, lambda i: None, lambda lsn, row, xid, i: Update(lsn, TABLE, row)),
        _changes(3, changes, lambda i: None, lambda lsn, row, xid, i: Delete(lsn, TABLE, row[:1])),
        _changes(
            4, changes, lambda i: None, lambda lsn, row, xid, i: Delete(lsn, TABLE, row, False)
        ),
    ]
    with_rows_as_runs = [replace(t, events=tuple(with_runs(t.events))) for t in txns]
    assert all(isinstance(e, RowRun) for t in with_rows_as_runs for e in t.events)
    log = ChangeLog(tmp_path / "runs")
    write(log, with_rows_as_runs)
    assert list(log.read_transactions()) == txns
    write(ChangeLog(tmp_path / "single"), [_decoder_rows(t) for t in txns])
    assert log_rows(tmp_path / "runs").equals(log_rows(tmp_path / "single"))


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        (lambda run: replace(run, lsns=run.lsns[:-1]), UnloggableInput),
        (lambda run: replace(run, lsns=[*run.lsns[:5], -1, *run.lsns[6:]]), UnloggableInput),
        (
            lambda run: replace(run, first=replace(run.first, old=("1",), new=("1", "x", None))),
            UnloggableInput,
        ),
    ],
    ids=["an LSN short", "negative LSN", "update with old row"],
)
@pytest.mark.parametrize("changes", [50, 8])
def test_a_bad_row_run_is_rejected_without_trace(tmp_path, bad, error, changes):
    """A RowRun the writer cannot log as the changes it stands for is refused at append, and
    nothing of its transaction is logged: a long run (added column by column) or a short one
    (row by row)."""
    log = ChangeLog(tmp_path)
    good = _inserts(1, 50, lambda i: None)
    updates = _changes(2, changes, lambda i: None, lambda lsn, row, xid, i: Update(lsn, TABLE, row))
    [run] = with_runs(updates.events)
    assert isinstance(run, RowRun)
    with log.writer(frame_bytes=1500) as writer:
        writer.append(replace(good, events=tuple(with_runs(good.events))))
        with pytest.raises(error):
            writer.append(replace(updates, events=(bad(run),)))
        assert writer.append(_inserts(3, 5, lambda i: None))
    assert [t.commit_lsn for t in log.read_transactions()] == [good.commit_lsn, LSN(0x1030000)]


def test_an_unreadable_row_in_a_row_run_is_refused_with_its_lsn(tmp_path):
    """RowRun rows are unchecked bytes from the stream: the writer checks them as it checks
    unchecked decoder rows, and logs nothing of the batch holding a bad one."""
    txn = _inserts(1, 50, lambda i: None)
    [run] = with_runs(txn.events)
    assert isinstance(run, RowRun)
    rows = list(run.rows)
    rows[9] = rows[9][:-1]  # truncated TupleData
    log = ChangeLog(tmp_path)
    with log.writer() as writer:
        assert writer.append(replace(txn, events=(replace(run, rows=rows),)))
        with pytest.raises(DecodeError, match=f"row at LSN {run.lsns[9]} in public.accounts"):
            writer.flush()
        with pytest.raises(DecodeError):
            writer.close()
    assert list(log.read_transactions()) == []
