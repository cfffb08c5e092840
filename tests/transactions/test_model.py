"""Model-based property test: random interleavings of plain, streamed and two-phase transactions
with random aborts (whole and subtransaction) come out as exactly the committed transactions,
in commit order, with exactly their surviving changes, whether or not they spill to disk."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.events import Event, Insert, Message
from pgcdc.lsn import LSN
from pgcdc.transactions import AssemblyOptions, TransactionAssembler
from pgcdc.transactions.options import MB
from tests.conftest import examples

from .builders import (
    T,
    at,
    begin,
    begin_prepare,
    commit,
    commit_prepared,
    prepare,
    rollback_prepared,
    sabort,
    scommit,
    sprepare,
    sstart,
    sstop,
)

OUTCOMES = ("commit", "abort", "prepare-commit", "prepare-rollback")


@dataclass
class Segment:
    xid: int  # the top-level xid, or a subtransaction's
    rows: list[int]
    aborted: bool


@dataclass
class Txn:
    xid: int
    streamed: bool
    outcome: str
    segments: list[Segment]
    block_sizes: list[int] = field(default_factory=list)

    def surviving_rows(self) -> list[int]:
        return [r for s in self.segments if not s.aborted for r in s.rows]


@st.composite
def transactions(draw: st.DrawFn) -> list[Txn]:
    txns = []
    next_row = 0
    for i in range(draw(st.integers(1, 6))):
        xid = 1000 + 10 * i
        streamed = draw(st.booleans())
        outcome = draw(st.sampled_from(OUTCOMES))
        segments = []
        subxid = xid
        for _ in range(draw(st.integers(1, 4))):
            in_sub = streamed and draw(st.booleans())
            if in_sub:
                subxid += 1
            count = draw(st.integers(0, 4))
            rows = list(range(next_row, next_row + count))
            next_row += count
            segments.append(
                Segment(subxid if in_sub else xid, rows, in_sub and draw(st.booleans()))
            )
        txn = Txn(xid, streamed, outcome, segments)
        if streamed:
            total = sum(len(s.rows) for s in segments)
            remaining = max(total, 1)
            while remaining > 0:
                size = draw(st.integers(1, remaining))
                txn.block_sizes.append(size)
                remaining -= size
        txns.append(txn)
    return txns


class Lsns:
    def __init__(self) -> None:
        self.value = 100

    def __call__(self) -> int:
        self.value += 10
        return self.value


def _steps(txn: Txn, lsn: Lsns) -> list[list[tuple[str, object]]]:
    """A transaction as the server sends it: a list of steps, each a list of (kind, event)
    where kind marks what the step completes ('emit', 'drop' or '' for nothing)."""
    steps: list[list[tuple[str, object]]] = []
    gid = f"gid-{txn.xid}"
    if not txn.streamed:
        if txn.outcome == "abort":
            return []  # never decoded: the server sends only committed or prepared ones
        rows = txn.surviving_rows()
        if txn.outcome == "commit":
            body = [begin(lsn(), txn.xid), *[_insert(lsn(), r, None) for r in rows]]
            steps.append([("", e) for e in body] + [("emit", commit(lsn(), txn.xid))])
        else:
            body = [begin_prepare(lsn(), txn.xid, gid), *[_insert(lsn(), r, None) for r in rows]]
            steps.append([("", e) for e in body] + [("", prepare(lsn(), txn.xid, gid))])
            steps.append([_decision(txn, lsn(), gid)])
        return steps
    changes = [(s, r) for s in txn.segments for r in s.rows]
    position = 0
    for number, size in enumerate(txn.block_sizes):
        block = changes[position : position + size]
        position += size
        step: list[tuple[str, object]] = [("", sstart(lsn(), txn.xid, first=number == 0))]
        step += [("", _insert(lsn(), r, s.xid)) for s, r in block]
        step.append(("", sstop(lsn())))
        steps.append(step)
        # A subtransaction's abort follows the block holding its last change.
        for segment in txn.segments:
            if segment.aborted and segment.rows and segment.rows[-1] in [r for _, r in block]:
                steps.append([("", sabort(lsn(), txn.xid, segment.xid))])
    if txn.outcome == "commit":
        steps.append([("emit", scommit(lsn(), txn.xid))])
    elif txn.outcome == "abort":
        steps.append([("drop", sabort(lsn(), txn.xid, txn.xid))])
    else:
        steps.append([("", sprepare(lsn(), txn.xid, gid))])
        steps.append([_decision(txn, lsn(), gid)])
    return steps


def _decision(txn: Txn, lsn: int, gid: str) -> tuple[str, object]:
    if txn.outcome == "prepare-commit":
        return ("emit", commit_prepared(lsn, txn.xid, gid))
    return ("drop", rollback_prepared(lsn, txn.xid, gid))


def _insert(lsn: int, row: int, xid: int | None) -> Insert:
    return Insert(LSN(lsn), T, (str(row), "x" * 40), xid)


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    txns=transactions(),
    data=st.data(),
    txn_limit=st.sampled_from([0, 200, 600]),
    total_limit=st.sampled_from([0, 300, 1500]),
)
def test_output_is_the_committed_transactions_in_commit_order(
    txns: list[Txn], data: st.DataObject, txn_limit: int, total_limit: int
) -> None:
    lsn = Lsns()
    queues = {t.xid: _steps(t, lsn) for t in txns}
    by_xid = {t.xid: t for t in txns}
    stream: list[Event] = []
    expected: list[tuple[int | None, list[int] | bytes]] = []
    while any(queues.values()):
        if data.draw(st.integers(0, 9), label="message") == 0:
            note = f"note {len(stream)}".encode()
            stream.append(Message(LSN(lsn()), False, "p", note))
            expected.append((None, note))
        xid = data.draw(st.sampled_from(sorted(x for x, q in queues.items() if q)), label="next")
        for kind, event in queues[xid].pop(0):
            assert isinstance(event, Event.__args__)
            stream.append(event)
            if kind == "emit":
                expected.append((xid, by_xid[xid].surviving_rows()))

    with tempfile.TemporaryDirectory() as spill_root:
        options = AssemblyOptions(
            spill_dir=spill_root,
            max_txn_in_memory=txn_limit / MB,
            max_reorderbuffer_in_memory=total_limit / MB,
        )
        with TransactionAssembler(options) as assembler:
            got: list[tuple[int | None, list[int] | bytes]] = []
            for event in stream:
                for txn in assembler.feed(event):
                    events = list(txn.events)
                    if txn.xid is None:
                        [note_event] = events
                        assert isinstance(note_event, Message)
                        got.append((None, note_event.content))
                    else:
                        rows = [int(str(e.new[0])) for e in events if isinstance(e, Insert)]
                        got.append((txn.xid, rows))
                        assert txn.commit_time == at(int(txn.commit_lsn))
            assert got == expected
            assert assembler.pending_transactions == 0
            assert assembler.memory_bytes == 0
            assert assembler.oldest_pending_lsn is None
            assert list(Path(spill_root).glob("assembler-*/*.spill")) == []
