"""Pure planning of a batch of keyed changes: which row versions exist, which end, and where each
value comes from. No IO: the mirror and history writers turn a ``Plan`` into one Delta commit.

A row's *lineage* follows it through key changes. Every INSERT or UPDATE opens a ``Version``;
the next change of the same row (UPDATE, DELETE, a key change, TRUNCATE) closes it. A column
listed in ``_unchanged`` takes its value from, in order: the change's own ``_old`` (when the
server sent that column: REPLICA IDENTITY FULL, or a key column), the row's previous version in
the batch, or the row's current state in the Delta table before the batch (``TARGET``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.errors import InvalidChangeBatch, UnresolvedToastError
from pgcdc.lsn import LSN
from pgcdc.sinks import changes as c
from pgcdc.sinks import keys as k
from pgcdc.sinks.schema import contiguous

# A row's identity: (``_pgcdc_key``,) or (``_pgcdc_key``, ``_pgcdc_copy``) (``keys``).
Key: TypeAlias = tuple[Any, ...]
# ("new", row): the row's new value; ("old", row): its _old value; ("target", key): the value
# the Delta table held for ``key`` before the batch.
Source: TypeAlias = tuple[Literal["new", "old", "target"], Any]


@dataclass(slots=True)
class Version:
    """One version of a row opened in the batch: the values of change ``row``, with overrides."""

    row: int
    key: Key
    sources: dict[str, Source] = field(default_factory=dict)
    closed_by: int | None = None


class _Target:
    """The row as the Delta table held it before the batch (it may not exist)."""


TARGET = _Target()


@dataclass
class Plan:
    versions: list[Version]
    # The state of every key the batch touched, at its end (None: no row).
    final: dict[Key, Version | None]
    # Rows the table held before the batch whose version the batch ended, and by which change.
    target_closed: dict[Key, int]
    # The first TRUNCATE: every pre-batch row not closed earlier ends there.
    truncate_row: int | None

    def target_keys(self) -> set[Key]:
        """Keys whose pre-batch values some version needs (unchanged TOAST)."""
        return {src[1] for v in self.versions for src in v.sources.values() if src[0] == "target"}


def _keys(table: pa.Table, columns: Sequence[str]) -> list[Key]:
    return list(zip(*(table.column(n).to_pylist() for n in columns), strict=True))


_OLD = {k.KEY: k.OLD_KEY, k.COPY: k.OLD_COPY}


def plan(spec: c.TableSpec, changes: pa.Table) -> Plan:
    """Walk a prepared, (commit LSN, seq)-ordered change table and plan its row versions.

    Rows are identified by their identity columns (``keys.identity_columns``), which
    ``delta.prepare`` computed, a key column not sent taken from the old row."""
    key_set = set(spec.key_columns)
    identity = k.identity_columns(spec)
    ops: list[str] = changes.column(c.OP).to_pylist()
    old_present: list[bool] = changes.column(c.OLD).is_valid().to_pylist()
    new_keys = _keys(changes, identity)
    old_keys = _keys(changes, [_OLD[n] for n in identity])
    lsns: list[int] = changes.column(c.LSN_COLUMN).to_pylist()
    unchanged_column = changes.column(c.UNCHANGED)
    has_unchanged = pc.greater(pc.list_value_length(unchanged_column), 0)
    unchanged: dict[int, list[str]] = {}
    if pc.any(has_unchanged).as_py():
        rows = pc.indices_nonzero(has_unchanged).to_pylist()
        lists = pc.take(unchanged_column, pa.array(rows, pa.int64())).to_pylist()
        unchanged = dict(zip(rows, lists, strict=True))

    versions: list[Version] = []
    current: dict[Key, Version | None] = {}
    target_closed: dict[Key, int] = {}
    truncate_row: int | None = None

    def lookup(key: Key) -> Version | _Target | None:
        if key in current:
            return current[key]
        return None if truncate_row is not None else TARGET

    def close(prev: Version | _Target | None, key: Key, row: int) -> None:
        if isinstance(prev, Version):
            if prev.closed_by is None:
                prev.closed_by = row
        elif prev is TARGET:
            target_closed.setdefault(key, row)

    for row, op in enumerate(ops):
        if op == c.TRUNCATE:
            for version in current.values():
                close(version, (), row)
            current.clear()
            if truncate_row is None:
                truncate_row = row
            continue
        if op == c.DELETE:
            if not old_present[row]:
                raise InvalidChangeBatch(
                    f"{spec.qualified_name}: DELETE at LSN {LSN(lsns[row])} has no _old key; "
                    "the table needs a replica identity (primary key, USING INDEX or FULL)"
                )
            key = old_keys[row]
            close(lookup(key), key, row)
            current[key] = None
            continue
        cols = unchanged.get(row, [])
        old_key = old_keys[row] if old_present[row] else None
        new_key = new_keys[row]
        if key_set.intersection(cols) and old_key is None:
            raise UnresolvedToastError(
                f"{spec.qualified_name}: change at LSN {LSN(lsns[row])} did not send key "
                f"column(s) {sorted(key_set.intersection(cols))} (unchanged TOAST) nor an "
                "old key; set REPLICA IDENTITY FULL on the table so the server sends them"
            )
        # An UPDATE without _old kept its key; an INSERT's "previous row" is any stale one.
        prev_key = old_key if old_key is not None and op == c.UPDATE else new_key
        prev = lookup(prev_key)
        sources: dict[str, Source] = {}
        for column in cols:
            if old_present[row] and (spec.old_is_full_row or column in key_set):
                sources[column] = ("old", row)
            elif isinstance(prev, Version):
                sources[column] = prev.sources.get(column, ("new", prev.row))
            elif prev is TARGET:
                sources[column] = ("target", prev_key)
            else:
                raise UnresolvedToastError(
                    f"{spec.qualified_name}: column {column!r} of the change at LSN "
                    f"{LSN(lsns[row])} is an unchanged TOASTed value, but the row it belongs "
                    "to does not exist before it (deleted or truncated earlier); the change "
                    "stream is inconsistent - rebuild the table from a fresh snapshot"
                )
        close(prev, prev_key, row)
        if new_key != prev_key:
            current[prev_key] = None
            close(lookup(new_key), new_key, row)
        version = Version(row, new_key, sources)
        versions.append(version)
        current[new_key] = version
    return Plan(versions, current, target_closed, truncate_row)


def assemble(
    spec: c.TableSpec,
    changes: pa.Table,
    versions: Sequence[Version],
    target: pa.Table | None,
    target_rows: dict[Key, int],
) -> pa.Table:
    """The table columns and ``_text`` of ``versions``, each value taken from where its
    ``Source`` says, with its text form if it had one (``_old_text`` for an old value).

    ``target`` holds the pre-batch rows ``target_rows`` points into (table columns, ``_text``).
    Vectorised: one ``take`` per column over [new values | old values | target values].
    """
    n = changes.num_rows
    rows = [v.row for v in versions]
    overridden = {name for v in versions for name in v.sources}
    old = contiguous(changes.column(c.OLD))
    arrays: list[pa.Array] = []
    for f in spec.schema:
        new = contiguous(changes.column(f.name))
        if f.name not in overridden:
            arrays.append(new.take(pa.array(rows, pa.int64())))
            continue
        parts = [new, pc.struct_field(old, f.name)]
        if target is not None:
            parts.append(contiguous(target.column(f.name)).cast(f.type))
        indices = []
        for v in versions:
            kind, where = v.sources.get(f.name, ("new", v.row))
            if kind == "new":
                indices.append(where)
            elif kind == "old":
                indices.append(n + where)
            else:
                indices.append(2 * n + target_rows[where])
        arrays.append(pa.concat_arrays(parts).take(pa.array(indices, pa.int64())))
    arrays.append(_texts(changes, versions, target, target_rows))
    return pa.Table.from_arrays(arrays, schema=spec.schema.append(pa.field(c.TEXT, c.TEXT_TYPE)))


def _texts(
    changes: pa.Table,
    versions: Sequence[Version],
    target: pa.Table | None,
    target_rows: dict[Key, int],
) -> pa.Array:
    """``_text`` of each version: its change's entries, and for each column it takes from
    elsewhere, that source's entry (a value kept only as text stays kept)."""
    texts = contiguous(changes.column(c.TEXT))
    taken = texts.take(pa.array([v.row for v in versions], pa.int64()))
    if not any(v.sources for v in versions):
        return taken
    old_texts = contiguous(changes.column(c.OLD_TEXT))
    target_texts = None if target is None else contiguous(target.column(c.TEXT))
    merged: list[list[tuple[str, str]] | None] = []
    for version, entries in zip(versions, taken.to_pylist(), strict=True):
        if not version.sources:
            merged.append(entries)
            continue
        kept = {name: text for name, text in entries or [] if name not in version.sources}
        for name, (kind, where) in version.sources.items():
            if kind == "new":
                found = texts[where].as_py()
            elif kind == "old":
                found = old_texts[where].as_py()
            else:
                assert target_texts is not None
                found = target_texts[target_rows[where]].as_py()
            kept.update((n, t) for n, t in found or [] if n == name)
        merged.append(list(kept.items()) or None)
    return pa.array(merged, c.TEXT_TYPE)
