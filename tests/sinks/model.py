"""A Python model of a source table, and the change tables its operations produce.

``Source`` plays PostgreSQL: it holds the true rows, applies each operation, and emits the change
rows the contract describes (an unchanged TOASTed column is null in the change, named in
``_unchanged``). It snapshots the true state after every commit, so tests can compare the mirror
with the final state and the history with the state at any commit LSN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa

from pgcdc.events import ReplicaIdentity
from pgcdc.lsn import LSN
from pgcdc.sinks.changes import TableSpec, change_schema

ITEMS_SCHEMA = pa.schema(
    [
        ("id", pa.int32()),
        ("name", pa.string()),
        ("body", pa.string()),
        ("qty", pa.int64()),
    ]
)


def items_spec(
    schema: pa.Schema = ITEMS_SCHEMA,
    *,
    keys: tuple[str, ...] = ("id",),
    lsn: int = 0x100,
    identity: ReplicaIdentity = ReplicaIdentity.DEFAULT,
    name: str = "items",
) -> TableSpec:
    return TableSpec("public", name, schema, keys, LSN(lsn), identity)


Row = dict[str, Any]


@dataclass
class Source:
    spec: TableSpec
    rows: dict[tuple[Any, ...], Row] = field(default_factory=dict)
    lsn: int = 0x1000
    xid: int = 700
    pending: list[Row] = field(default_factory=list)
    emitted: list[Row] = field(default_factory=list)
    # (commit LSN, state after that commit), in commit order.
    snapshots: list[tuple[int, dict[tuple[Any, ...], Row]]] = field(default_factory=list)
    time: datetime = datetime(2025, 1, 1, tzinfo=UTC)

    def key(self, row: Row) -> tuple[Any, ...]:
        return tuple(row[k] for k in self.spec.key_columns)

    def _change(self, op: str, new: Row | None, old: Row | None, unchanged: list[str]) -> None:
        self.lsn += 0x28
        change: Row = {f.name: None for f in self.spec.schema}
        if new is not None:
            change.update({k: v for k, v in new.items() if k not in unchanged})
        change.update(
            _op=op,
            _seq=len(self.pending),
            _lsn=self.lsn,
            _xid=self.xid,
            _origin=None,
            _unchanged=unchanged,
            _old=old,
        )
        self.pending.append(change)

    def insert(self, **values: Any) -> None:
        row = {f.name: values.get(f.name) for f in self.spec.schema}
        self.rows[self.key(row)] = row
        self._change("insert", row, None, [])

    def update(self, key: tuple[Any, ...], *, toast: tuple[str, ...] = (), **values: Any) -> None:
        """Update the row ``key``; ``toast`` columns keep their value and are not sent."""
        before = self.rows.pop(key)
        after = {**before, **values}
        for column in toast:
            after[column] = before[column]
        new_key = self.key(after)
        self.rows[new_key] = after
        old = self._old(before) if new_key != key else None
        self._change("update", after, old, list(toast))

    def delete(self, key: tuple[Any, ...]) -> None:
        before = self.rows.pop(key)
        self._change("delete", None, self._old(before), [])

    def truncate(self) -> None:
        self.rows.clear()
        self._change("truncate", None, None, [])

    def _old(self, before: Row) -> Row:
        if self.spec.replica_identity is ReplicaIdentity.FULL:
            return dict(before)
        return {k: before[k] for k in self.spec.key_columns}

    def commit(self) -> int:
        """End the transaction: stamp its changes with the commit LSN and time."""
        self.lsn += 0x28
        self.time += timedelta(seconds=1)
        for change in self.pending:
            change["_commit_lsn"] = self.lsn
            change["_commit_time"] = self.time
        self.emitted.extend(self.pending)
        self.pending = []
        self.xid += 1
        self.snapshots.append((self.lsn, {k: dict(v) for k, v in self.rows.items()}))
        return self.lsn

    def take(self) -> pa.Table:
        """The change table of every committed change not taken yet."""
        table = changes_table(self.spec, self.emitted)
        self.emitted = []
        return table


def changes_table(spec: TableSpec, rows: list[Row]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=change_schema(spec))


def state_at(snapshots: list[tuple[int, dict[tuple[Any, ...], Row]]], lsn: int) -> list[Row]:
    """The model's rows as of ``lsn`` (after every commit at or before it)."""
    state: dict[tuple[Any, ...], Row] = {}
    for commit_lsn, snapshot in snapshots:
        if commit_lsn > lsn:
            break
        state = snapshot
    return sorted(state.values(), key=lambda r: tuple(str(v) for v in r.values()))
