"""Shared pieces of the receiver tests: a workload that records what committed, and readers
that turn the change log and the slot back into comparable facts."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Self

import psycopg

from pgcdc.changelog import ChangeLog, ChangeLogWriter
from pgcdc.events import Delete, Insert, Update
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction
from tests.conftest import Database

Conn = psycopg.Connection[Any]
# What one change looks like once logged: (kind, table, row values as text).
Fact = tuple[str, str, tuple[Any, ...]]


def current_lsn(conn: Conn) -> LSN:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return LSN.parse(row[0])


def slot_position(db: Database, slot: str) -> tuple[LSN | None, LSN | None, bool]:
    """(confirmed_flush_lsn, restart_lsn, active) of ``slot``."""
    row = db.execute(
        "SELECT confirmed_flush_lsn::text, restart_lsn::text, active FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    )[0]
    confirmed, restart, active = row
    return (
        LSN.parse(confirmed) if confirmed else None,
        LSN.parse(restart) if restart else None,
        bool(active),
    )


def facts(txn: CommittedTransaction) -> list[Fact]:
    """The row changes of a transaction, in order, as plain tuples."""
    out: list[Fact] = []
    for event in txn.events:
        if isinstance(event, Insert):
            out.append(("I", event.table.name, tuple(event.new)))
        elif isinstance(event, Update):
            out.append(("U", event.table.name, tuple(event.new)))
        elif isinstance(event, Delete):
            out.append(("D", event.table.name, tuple(event.old)))
    return out


def logged(root: str | Any) -> list[CommittedTransaction]:
    return list(ChangeLog(root).read_transactions())


def logged_facts(root: str | Any) -> list[tuple[int | None, list[Fact]]]:
    """(xid, changes) of every logged transaction that changed rows, in log order."""
    result = []
    for txn in ChangeLog(root).read_transactions():
        changes = facts(txn)
        if changes:
            result.append((txn.xid, changes))
    return result


def key_only(changes: Iterable[Fact]) -> list[tuple[str, str, Any]]:
    """Deletes carry only the key: compare (kind, table, first column)."""
    return [(kind, table, row[0]) for kind, table, row in changes]


class WrappedWriter:
    """A change log writer behind a wrapper, for a test's sink that changes one of its
    behaviours: the writer may be a compiled class, which Python classes cannot inherit from."""

    def __init__(self, root: Path) -> None:
        self._writer = ChangeLogWriter(root)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._writer, name)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self._writer.close()
