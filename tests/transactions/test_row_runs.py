"""RowRuns through the assembler: whatever the options, a stream with runs gives the same
transactions, once runs are expanded, as the same stream change by change."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from pgcdc.errors import TransactionSequenceError
from pgcdc.events import Delete, EncodedRow, Event, Insert, RowRun, Update
from pgcdc.lsn import LSN
from pgcdc.transactions import AssemblyOptions, CommittedTransaction, TransactionAssembler

from .builders import (
    begin,
    begin_prepare,
    commit,
    commit_prepared,
    ins,
    origin,
    prepare,
    rel,
    rollback_prepared,
    scommit,
    sstart,
    sstop,
    table,
    with_runs,
)

U = table("u", oid=16385)


def row(row_id: int) -> EncodedRow:
    return EncodedRow.from_values((str(row_id), f"value {row_id}"))


def inserts(first_lsn: int, ids: Iterable[int], tbl: Any = None) -> list[Insert]:
    extra = {} if tbl is None else {"tbl": tbl}
    return [
        replace(ins(first_lsn + i, row_id, **extra), new=row(row_id))
        for i, row_id in enumerate(ids)
    ]


def updates(first_lsn: int, ids: Iterable[int]) -> list[Update]:
    return [Update(LSN(first_lsn + i), table(), row(row_id + 1000)) for i, row_id in enumerate(ids)]


def deletes(first_lsn: int, ids: Iterable[int]) -> list[Delete]:
    return [
        Delete(LSN(first_lsn + i), table(), row(row_id), old_is_key=True)
        for i, row_id in enumerate(ids)
    ]


def size_of(event: Event) -> int:
    """A stand-in for the payload length the receiver passes."""
    if isinstance(event, RowRun):
        return sum(size_of(change) for change in event.changes())
    if isinstance(event, Insert | Update):
        assert isinstance(event.new, EncodedRow)
        return 6 + len(event.new.data)
    if isinstance(event, Delete):
        assert isinstance(event.old, EncodedRow)
        return 6 + len(event.old.data)
    return 32


def assemble(
    events: Iterable[Event], options: AssemblyOptions
) -> tuple[list[CommittedTransaction], int, list[int]]:
    """The transactions (events materialised, RowRuns kept), how many were spilled, and the
    memory held before and after each event that is not a row change."""
    out: list[CommittedTransaction] = []
    memory: list[int] = []
    with TransactionAssembler(options) as assembler:
        for event in events:
            row_change = isinstance(event, Insert | Update | Delete | RowRun)
            if not row_change:
                memory.append(assembler.memory_bytes)
            for txn in assembler.feed(event, size_of(event)):
                out.append(replace(txn, events=tuple(txn.events)))
            if not row_change:
                memory.append(assembler.memory_bytes)
        return out, assembler.spilled_transactions, memory


def expanded(txns: list[CommittedTransaction]) -> list[CommittedTransaction]:
    return [
        replace(
            txn,
            events=tuple(
                change
                for event in txn.events
                for change in (event.changes() if isinstance(event, RowRun) else (event,))
            ),
        )
        for txn in txns
    ]


def plain_workload() -> list[Event]:
    return [
        begin(100, 700),
        rel(101),
        *inserts(102, range(1, 40)),
        rel(150, U),
        *inserts(151, range(1, 10), U),
        *updates(170, range(1, 30)),
        *deletes(200, range(30, 40)),
        commit(300),
        begin(400, 701),
        *inserts(401, range(100, 104), U),
        *deletes(410, range(1, 5)),
        commit(420),
    ]


def prepared_workload() -> list[Event]:
    return [
        begin_prepare(100, 700, "a"),
        rel(101),
        *inserts(102, range(1, 60)),
        prepare(200, 700, "a"),
        begin_prepare(300, 701, "b"),
        *inserts(301, range(60, 70)),
        prepare(320, 701, "b"),
        begin(400, 702),
        *inserts(401, range(70, 120)),
        commit(500),
        commit_prepared(600, 700, "a"),
        rollback_prepared(700, 701, "b"),
    ]


def origin_workload() -> list[Event]:
    return [
        begin(100, 700),
        origin(101),
        rel(102),
        *inserts(103, range(1, 20)),
        commit(200),
        begin(300, 701),
        *inserts(301, range(20, 30)),
        commit(400),
    ]


def streamed_workload() -> list[Event]:
    """Streamed changes carry an xid, so they never join a run; a plain transaction that
    commits between the stream's blocks does."""
    streamed = [replace(e, xid=800) for e in inserts(102, range(1, 10))]
    return [
        sstart(100, 800),
        rel(101, xid=800),
        *streamed,
        sstop(120),
        begin(200, 701),
        *inserts(201, range(50, 70)),
        commit(300),
        sstart(400, 800, first=False),
        *[replace(e, xid=800) for e in inserts(401, range(10, 15))],
        sstop(420),
        scommit(500, 800),
    ]


CASES: dict[str, tuple[Any, dict[str, Any], bool]] = {
    # name: (workload, options, whether some RowRun must come out whole)
    "defaults": (plain_workload, {}, True),
    "xids stripped": (plain_workload, {"include_xids": False}, True),
    "table filter": (plain_workload, {"white_table_list": "public.u"}, False),
    "filter empties a transaction": (
        plain_workload,
        {"white_table_list": "public.nothing", "skip_empty_xacts": True},
        False,
    ),
    # The first transaction spills, the small second one does not.
    "spill per transaction": (plain_workload, {"max_txn_in_memory": 0.0005}, True),
    "held prepares": (prepared_workload, {}, True),
    "emit at prepare": (prepared_workload, {"emit_at_prepare": True}, True),
    "prepares evicted by the total cap": (
        prepared_workload,
        {"max_reorderbuffer_in_memory": 0.002},
        True,
    ),
    "origin any": (origin_workload, {}, True),
    "origin none": (origin_workload, {"origin_filter": "none"}, True),
    "streamed": (streamed_workload, {}, True),
}


@pytest.mark.parametrize("case", CASES)
def test_runs_assemble_to_what_their_changes_assemble_to(case: str, tmp_path: Path) -> None:
    workload, settings, runs_survive = CASES[case]
    options = AssemblyOptions(**settings, spill_dir=str(tmp_path))
    events = workload()
    runs = with_runs(events)
    assert any(isinstance(e, RowRun) for e in runs)
    singles, singles_spilled, singles_memory = assemble(events, options)
    joined, joined_spilled, joined_memory = assemble(runs, options)
    assert expanded(joined) == singles
    assert joined_spilled == singles_spilled
    assert joined_memory == singles_memory
    kept_whole = any(isinstance(e, RowRun) for txn in joined for e in txn.events)
    assert kept_whole == runs_survive
    if "spill" in case or "evicted" in case:
        assert joined_spilled > 0


def test_spilled_runs_come_back_as_their_changes(tmp_path: Path) -> None:
    """A run held in memory when its transaction spills is written change by change, each
    with its own LSN and row."""
    options = AssemblyOptions(max_txn_in_memory=0.0005, spill_dir=str(tmp_path))
    events: list[Event] = [
        begin(100, 700),
        rel(101),
        *inserts(102, range(1, 5)),
        *inserts(110, range(5, 60)),
    ]
    with TransactionAssembler(options) as assembler:
        for event in with_runs(events[:6]):
            assembler.feed(event, size_of(event))
        assert assembler.spilled_transactions == 0
        for event in with_runs(events[6:]):
            assembler.feed(event, size_of(event))
        assert assembler.spilled_transactions == 1
        [txn] = assembler.feed(commit(300))
        logged = list(txn.events)
    assert logged == events[1:]
    assert not any(isinstance(e, RowRun) for e in logged)


def test_a_run_outside_a_transaction_is_a_sequence_error() -> None:
    [run] = with_runs(inserts(100, range(3)))
    with TransactionAssembler() as assembler, pytest.raises(TransactionSequenceError):
        assembler.feed(run, size_of(run))


def test_a_run_stands_for_its_changes() -> None:
    changes = deletes(100, range(4))
    [run] = with_runs(changes)
    assert isinstance(run, RowRun)
    assert len(run) == 4
    assert (run.lsn, run.table, run.xid) == (LSN(100), changes[0].table, None)
    assert list(run.changes()) == changes
