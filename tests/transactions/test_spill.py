"""Memory bounds: spilling to disk, reading back identically, eviction, and cleanup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.errors import SpillError
from pgcdc.events import (
    UNCHANGED_TOAST,
    Delete,
    Event,
    Insert,
    Message,
    Relation,
    Truncate,
    Type,
    Update,
)
from pgcdc.lsn import LSN
from pgcdc.transactions import AssemblyOptions, SpilledEvents, TransactionAssembler
from pgcdc.transactions.options import MB
from pgcdc.transactions.spill import SpillDirectory, clean_stale

from .builders import (
    begin,
    commit,
    ins,
    materialised,
    row_ids,
    sabort,
    scommit,
    sstart,
    sstop,
    table,
)

TINY = 1000 / MB  # about 1000 bytes, in MB


def _options(tmp_path: Path, **kw: object) -> AssemblyOptions:
    return AssemblyOptions(spill_dir=str(tmp_path), **kw)  # type: ignore[arg-type]


def _spill_files(tmp_path: Path) -> list[Path]:
    return sorted(tmp_path.glob("assembler-*/*.spill"))


def _every_kind(xid: int | None) -> list[Event]:
    t, u = table("t"), table("u", schema="other", oid=2)
    return [
        Relation(LSN(101), t, xid),
        Type(LSN(102), 90000, "public", "mood", xid),
        Insert(LSN(103), t, ("1", "a" * 300), xid),
        Update(LSN(104), t, ("1", UNCHANGED_TOAST), ("1", None), False, xid),
        Update(LSN(105), u, (b"\x00\x01", "x" * 300), None, True, xid),
        Delete(LSN(106), t, ("1", None), True, xid),
        Truncate(LSN(107), (t, u), True, False, xid),
        Message(LSN(108), True, "pfx", b"\xff" * 300, xid),
        *[Insert(LSN(110 + i), u, (str(i), "y" * 100), xid) for i in range(20)],
    ]


def test_large_transaction_spills_and_reads_back_identical(tmp_path: Path) -> None:
    body = _every_kind(None)
    with TransactionAssembler(_options(tmp_path, max_txn_in_memory=TINY)) as assembler:
        for event in [begin(100, 700), *body]:
            assert assembler.feed(event) == []
        assert assembler.spilled_transactions == 1
        assert assembler.memory_bytes == 0
        assert len(_spill_files(tmp_path)) == 1
        [txn] = assembler.feed(commit(200))
        # The file is unlinked at emission and read through its descriptor.
        assert _spill_files(tmp_path) == []
        assert isinstance(txn.events, SpilledEvents)
        assert list(txn.events) == body
        assert list(txn.events) == body  # iterable more than once
        # Tables are shared again after read-back, not one copy per event.
        tables = {id(e.table) for e in txn.events if isinstance(e, Insert | Update | Delete)}
        assert len(tables) == 2
        txn.events.close()
        with pytest.raises(SpillError, match="closed"):
            list(txn.events)


def test_small_transactions_stay_in_memory(tmp_path: Path) -> None:
    with TransactionAssembler(_options(tmp_path, max_txn_in_memory=TINY)) as assembler:
        out = list(assembler.feed_all([begin(100, 7), ins(101, 1), commit(102)]))
        assert assembler.spilled_transactions == 0
        assert isinstance(out[0].events, tuple)


def test_spilled_stream_with_aborted_subtransaction(tmp_path: Path) -> None:
    events: list[Event] = [
        sstart(100, 800),
        *[ins(101 + i, i, 800) for i in range(10)],
        *[ins(120 + i, 100 + i, 801) for i in range(10)],
        sstop(140),
        sabort(141, 800, 801),
        sstart(142, 800, first=False),
        ins(143, 50, 800),
        sstop(144),
        scommit(150, 800),
    ]
    in_memory = [materialised(t) for t in TransactionAssembler().feed_all(events)]
    with TransactionAssembler(_options(tmp_path, max_txn_in_memory=TINY)) as assembler:
        spilled = [materialised(t) for t in assembler.feed_all(events)]
        assert assembler.spilled_transactions == 1
    assert row_ids(spilled[0]) == [*range(10), 50]
    assert spilled == in_memory


def test_spilled_transaction_dropped_on_abort_removes_its_file(tmp_path: Path) -> None:
    events: list[Event] = [sstart(100, 800), *[ins(101 + i, i, 800) for i in range(30)], sstop(140)]
    with TransactionAssembler(_options(tmp_path, max_txn_in_memory=TINY)) as assembler:
        list(assembler.feed_all(events))
        assert len(_spill_files(tmp_path)) == 1
        assembler.feed(sabort(141, 800, 800))
        assert _spill_files(tmp_path) == []
        assert assembler.pending_transactions == 0


def test_total_cap_spills_the_largest_transactions(tmp_path: Path) -> None:
    # Three streamed transactions of about 0.5, 1.5 and 2.5 kB; cap 3 kB in total.
    sizes = {800: 5, 900: 15, 1000: 25}
    options = _options(tmp_path, max_reorderbuffer_in_memory=3000 / MB)
    with TransactionAssembler(options) as assembler:
        lsn = 100
        for xid, count in sizes.items():
            assembler.feed(sstart(lsn, xid))
            for i in range(count):
                lsn += 1
                assembler.feed(ins(lsn, xid + i, xid))
            lsn += 1
            assembler.feed(sstop(lsn))
        # When 1000's rows push the total over 3 kB, 900 (15 rows) is the largest; once it is
        # on disk, 800 and all of 1000 fit.
        assert assembler.spilled_transactions == 1
        assert assembler.memory_bytes <= 3000
        assert len(_spill_files(tmp_path)) == 1
        out = []
        for xid in sizes:
            lsn += 10
            out.extend(assembler.feed(scommit(lsn, xid)))
        assert [row_ids(t) for t in out] == [
            [xid + i for i in range(count)] for xid, count in sizes.items()
        ]
        assert [type(t.events).__name__ for t in out] == ["tuple", "SpilledEvents", "tuple"]
        assert assembler.memory_bytes == 0


def test_caller_supplied_sizes_drive_the_limits(tmp_path: Path) -> None:
    with TransactionAssembler(_options(tmp_path, max_txn_in_memory=1 / MB * 10_000)) as a:
        a.feed(begin(100, 7))
        a.feed(ins(101, 1), size=9_000)
        assert a.spilled_transactions == 0
        a.feed(ins(102, 2), size=2_000)
        assert a.spilled_transactions == 1


def test_close_removes_the_spill_directory(tmp_path: Path) -> None:
    assembler = TransactionAssembler(_options(tmp_path, max_txn_in_memory=TINY))
    list(assembler.feed_all([begin(100, 7), *[ins(101 + i, i) for i in range(30)]]))
    assert len(_spill_files(tmp_path)) == 1
    assembler.close()
    assert list(tmp_path.iterdir()) == []


_CRASH = """
import os, sys
from pgcdc.transactions import AssemblyOptions, TransactionAssembler
from tests.transactions.builders import begin, ins
a = TransactionAssembler(AssemblyOptions(spill_dir=sys.argv[1], max_txn_in_memory=0.001))
for e in [begin(100, 7), *[ins(101 + i, i) for i in range(30)]]:
    a.feed(e)
os._exit(0)  # a crash: no close, no finalizers
"""


def test_files_left_by_a_crash_are_cleaned_at_next_start(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{root / 'src'}"}
    subprocess.run([sys.executable, "-c", _CRASH, str(tmp_path)], check=True, env=env)
    assert len(_spill_files(tmp_path)) == 1
    # A live assembler's files are not touched by another's start.
    live = SpillDirectory(tmp_path)
    live_dir = live.path
    assert live.removed_at_start != []
    assert _spill_files(tmp_path) == []
    with TransactionAssembler(_options(tmp_path, max_txn_in_memory=TINY)):
        assert live_dir.is_dir()
    live.close()
    assert not live_dir.exists()
    assert clean_stale(tmp_path) == []


def test_unwritable_spill_root_is_a_typed_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SpillError, match="spill_dir"):
        TransactionAssembler(AssemblyOptions(spill_dir=str(blocker / "x"), max_txn_in_memory=1))
