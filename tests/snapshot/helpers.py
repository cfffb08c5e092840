"""Shared pieces of the snapshot tests: a sink that lets a test act while the snapshot is
taken, and the change log applied back into tables."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from pgcdc.changelog import ChangeLog, ChangeLogWriter
from pgcdc.decoding.values import row_to_python
from pgcdc.events import UNCHANGED_TOAST, Delete, Event, Insert, Relation, Row, Table, Update
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions, session_options
from pgcdc.transactions import CommittedTransaction
from tests.conftest import Database


class ProbeSink:
    """A change log writer that calls ``on_first_insert`` while the snapshot transaction is
    being appended (workers are mid-copy) and ``on_flush`` before it flushes."""

    def __init__(
        self,
        writer: ChangeLogWriter,
        on_first_insert: Callable[[], None] | None = None,
        on_flush: Callable[[], None] | None = None,
    ) -> None:
        self.writer = writer
        self.on_first_insert = on_first_insert
        self.on_flush = on_flush
        self.appended: list[CommittedTransaction] = []

    @property
    def last_commit_lsn(self) -> LSN:
        return self.writer.last_commit_lsn

    def _watch(self, events: Any) -> Iterator[Event]:
        seen = False
        for event in events:
            if not seen and isinstance(event, Insert) and self.on_first_insert is not None:
                seen = True
                self.on_first_insert()
            yield event

    def append(self, txn: CommittedTransaction) -> bool:
        self.appended.append(txn)
        watched = CommittedTransaction(
            txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time, self._watch(txn.events)
        )
        return self.writer.append(watched)

    def flush(self) -> LSN:
        if self.on_flush is not None:
            self.on_flush()
        return self.writer.flush()


def current_lsn(db: Database) -> LSN:
    return LSN.parse(db.scalar("SELECT pg_current_wal_lsn()::text"))


def stream_to(db: Database, root: Path, end: LSN, slot: str = "s") -> None:
    """Stream the slot into the same change log up to ``end`` (pgoutput, text values)."""
    options = ReceiverOptions(db.conninfo(), slot, publications=("pub",), end_lsn=end)
    with ChangeLog(root).writer() as sink:
        Receiver(options, sink).run()


def key_of(table: Table, row: Row) -> tuple[Any, ...]:
    keys = [i for i, c in enumerate(table.columns) if c.is_key]
    return tuple(row[i] for i in keys)


def replay(
    root: Path,
) -> tuple[dict[str, dict[Any, tuple[Any, ...]]], dict[str, Counter[tuple[Any, ...]]]]:
    """Apply every logged change: keyed tables by key, keyless ones as multisets of rows.

    Rows are typed (``row_to_python``): the snapshot's binary copies and the streamed text
    rows hold the same values in different raw forms."""
    keyed: dict[str, dict[Any, tuple[Any, ...]]] = {}
    bags: dict[str, Counter[tuple[Any, ...]]] = {}
    for txn in ChangeLog(root).read_transactions():
        for event in txn.events:
            if isinstance(event, Relation):
                continue
            if isinstance(event, Insert | Update | Delete):
                # Rows may come back as a Row subclass (EncodedRow): compare plain tuples.
                table = event.table
                new = None if isinstance(event, Delete) else row_to_python(table, event.new)
                old = (
                    None
                    if isinstance(event, Insert) or event.old is None
                    else row_to_python(table, event.old)
                )
                name = table.name
                if not any(c.is_key for c in table.columns) or table.replica_identity.value == "f":
                    bag = bags.setdefault(name, Counter())
                    if old is not None:
                        assert bag[old] > 0, f"{name}: no row {old} to change"
                        bag[old] -= 1
                    if new is not None:
                        bag[new] += 1
                    continue
                rows = keyed.setdefault(name, {})
                if isinstance(event, Insert):
                    assert new is not None
                    key = key_of(table, new)
                    assert key not in rows, f"{name}: row {key} inserted twice"
                    rows[key] = new
                elif isinstance(event, Update):
                    assert new is not None
                    previous = rows.pop(key_of(table, old or new))
                    new = tuple(
                        p if v is UNCHANGED_TOAST else v for p, v in zip(previous, new, strict=True)
                    )
                    rows[key_of(table, new)] = new
                else:
                    assert old is not None
                    del rows[key_of(table, old)]
    return keyed, {k: +v for k, v in bags.items()}


def source_rows(db: Database, table: Table) -> list[Row]:
    """The table's rows as the server prints them: each value's output function text (the
    raw result, not a ``::text`` cast, which trims char(n)), under pgcdc's session settings."""
    columns = ", ".join(f'"{c.name}"' for c in table.columns)
    with db.connect(options=session_options(db.conninfo())) as conn, conn.cursor() as cursor:
        cursor.execute(f'SELECT {columns} FROM "{table.namespace}"."{table.name}"')
        result = cursor.pgresult
        assert result is not None
        return [
            tuple(
                None if (v := result.get_value(r, c)) is None else v.decode()
                for c in range(result.nfields)
            )
            for r in range(result.ntuples)
        ]


def source_values(db: Database, table: Table) -> list[tuple[Any, ...]]:
    """``source_rows`` typed, to compare with ``replay``'s rows."""
    return [row_to_python(table, row) for row in source_rows(db, table)]


def typed(table: Table, rows: Any) -> list[str]:
    """Rows typed by ``pgcdc.decoding.values``, compared by repr (so NaN equals NaN)."""
    return sorted(repr(row_to_python(table, r)) for r in rows)
