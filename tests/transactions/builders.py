"""Hand-built event sequences for the assembler tests."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from pgcdc.events import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    EncodedRow,
    Event,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    RollbackPrepared,
    RowRun,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Table,
    Update,
)
from pgcdc.lsn import LSN
from pgcdc.transactions import AssemblyOptions, CommittedTransaction, TransactionAssembler

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def table(name: str = "t", schema: str = "public", oid: int = 16384) -> Table:
    return Table(schema, name, (Column("id", 23, is_key=True), Column("v", 25)), oid=oid)


T = table()


def at(lsn: int) -> datetime:
    return EPOCH + timedelta(seconds=lsn)


def ins(lsn: int, row_id: int, xid: int | None = None, tbl: Table = T) -> Insert:
    return Insert(LSN(lsn), tbl, (str(row_id), f"value {row_id}"), xid)


def rel(lsn: int, tbl: Table = T, xid: int | None = None) -> Relation:
    return Relation(LSN(lsn), tbl, xid)


def begin(lsn: int, xid: int) -> Begin:
    return Begin(LSN(lsn), xid, LSN(lsn + 1000), at(lsn))


def commit(lsn: int, xid: int | None = None) -> Commit:
    return Commit(LSN(lsn), LSN(lsn), LSN(lsn + 8), at(lsn), xid)


def sstart(lsn: int, xid: int, first: bool = True) -> StreamStart:
    return StreamStart(LSN(lsn), xid, first)


def sstop(lsn: int) -> StreamStop:
    return StreamStop(LSN(lsn))


def scommit(lsn: int, xid: int) -> StreamCommit:
    return StreamCommit(LSN(lsn), xid, LSN(lsn), LSN(lsn + 8), at(lsn))


def sabort(lsn: int, xid: int, subxid: int) -> StreamAbort:
    return StreamAbort(LSN(lsn), xid, subxid)


def begin_prepare(lsn: int, xid: int, gid: str) -> BeginPrepare:
    return BeginPrepare(LSN(lsn), xid, gid, LSN(lsn + 500), LSN(lsn + 508), at(lsn))


def prepare(lsn: int, xid: int, gid: str) -> Prepare:
    return Prepare(LSN(lsn), xid, gid, LSN(lsn), LSN(lsn + 8), at(lsn))


def sprepare(lsn: int, xid: int, gid: str) -> StreamPrepare:
    return StreamPrepare(LSN(lsn), xid, gid, LSN(lsn), LSN(lsn + 8), at(lsn))


def commit_prepared(lsn: int, xid: int, gid: str) -> CommitPrepared:
    return CommitPrepared(LSN(lsn), xid, gid, LSN(lsn), LSN(lsn + 8), at(lsn))


def rollback_prepared(lsn: int, xid: int, gid: str) -> RollbackPrepared:
    return RollbackPrepared(
        LSN(lsn), xid, gid, LSN(lsn - 100), LSN(lsn + 8), at(lsn - 100), at(lsn)
    )


def origin(lsn: int, name: str = "upstream") -> Origin:
    return Origin(LSN(lsn), name, LSN(0x99))


def message(
    lsn: int, transactional: bool, content: bytes = b"hello", xid: int | None = None
) -> Message:
    return Message(LSN(lsn), transactional, "pfx", content, xid)


def run(events: Iterable[Event], **options: Any) -> list[CommittedTransaction]:
    with TransactionAssembler(AssemblyOptions(**options)) as assembler:
        out = list(assembler.feed_all(events))
        # Materialise before close() so spilled transactions can still be read.
        return [materialised(txn) for txn in out]


def materialised(txn: CommittedTransaction) -> CommittedTransaction:
    from dataclasses import replace

    return replace(txn, events=tuple(txn.events))


def row_ids(txn: CommittedTransaction) -> list[int]:
    """The ids of the rows a transaction inserted, in order."""
    ids = []
    for event in txn.events:
        if isinstance(event, Insert):
            assert isinstance(event.new[0], str)
            ids.append(int(event.new[0]))
    return ids


def with_runs(events: Iterable[Event]) -> list[Event]:
    """``events`` with each stretch of row changes the receiver would join (same kind, table
    and tuple marker, plain transaction, no old row on an Update) as one RowRun."""
    out: list[Event] = []
    stretch: list[Insert | Update | Delete] = []

    def close() -> None:
        if len(stretch) > 1:
            lsns = [change.lsn for change in stretch[1:]]
            rows = [row_data(change) for change in stretch[1:]]
            out.append(RowRun(stretch[0], lsns, rows))
        else:
            out.extend(stretch)
        stretch.clear()

    for event in events:
        if (
            isinstance(event, Insert | Update | Delete)
            and event.xid is None
            and not (isinstance(event, Update) and event.old is not None)
        ):
            if stretch and _run_header(event) != _run_header(stretch[0]):
                close()
            stretch.append(event)
        else:
            close()
            out.append(event)
    close()
    return out


def _run_header(change: Insert | Update | Delete) -> tuple[Any, ...]:
    marker = change.old_is_key if isinstance(change, Delete) else None
    return type(change), change.table, marker


def row_data(change: Insert | Update | Delete) -> bytes:
    """The TupleData bytes of the row a RowRun keeps for ``change``."""
    kept = change.old if isinstance(change, Delete) else change.new
    assert kept is not None
    return EncodedRow.from_values(kept).data
