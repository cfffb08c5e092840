"""Write batches of changes (``pgcdc.sinks.changes``) to Delta Lake tables with delta-rs.

Three kinds of table per source table, each optional:

changelog
    Every change appended: the table's columns (new values), ``_op``, ``_commit_lsn``, ``_seq``,
    ``_lsn``, ``_xid``, ``_commit_time``, ``_origin``, ``_unchanged`` and ``_old`` (a struct of
    the table's columns). LSNs are Delta ``long`` (LSNs below 2**63; PostgreSQL would need
    8 EiB of WAL to pass that). Unchanged TOASTed values stay null here, named in ``_unchanged``.
mirror (SCD1)
    The current rows, keyed by the replica identity, plus ``_commit_lsn``, ``_commit_time`` and
    ``_text`` of the change that last wrote each row. One MERGE per batch.
history (SCD2)
    One row per version with ``_op`` (insert or update: what opened it), ``_valid_from_lsn``,
    ``_valid_to_lsn``, ``_valid_from_time``, ``_valid_to_time``, ``_is_current`` and ``_text``.
    LSNs are commit LSNs, so the state as of LSN L is ``_valid_from_lsn <= L < _valid_to_lsn``;
    an open version has ``_valid_to_lsn`` = 2**63-1 and ``_valid_to_time`` =
    9999-12-31 23:59:59.999999 UTC. A version replaced within its own transaction has an empty
    interval (from = to).

Schema changes (``pgcdc.sinks.schema``): new columns are added; dropped columns stay in the
Delta table: changelog and history rows written after the drop have null there, mirror rows keep
the last value they had (a row inserted after the drop has null). A type widening rewrites the
table once, in one commit.

Exactly once: every data commit carries the Delta application transaction (``app_id``,
``version``); a batch whose version the table already recorded is skipped. Schema commits
before it are idempotent, so a crash between them and the data commit is harmless.
"""

from __future__ import annotations

import enum
import functools
import logging
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from pgcdc.decoding.arrow import rows_to_arrow
from pgcdc.errors import InvalidChangeBatch, PgcdcError, StaleRowsWarning, UnresolvedToastError
from pgcdc.events import Column, Table
from pgcdc.sinks import changes as c
from pgcdc.sinks.plan import Key, Version, assemble, plan
from pgcdc.sinks.schema import align, delta_schema, evolve, normalize_read_type, to_delta

log = logging.getLogger(__name__)

LSN_TYPE = pa.int64()
LSN_INFINITY = (1 << 63) - 1
TIME_INFINITY = datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)

VALID_FROM_LSN = "_valid_from_lsn"
VALID_TO_LSN = "_valid_to_lsn"
VALID_FROM_TIME = "_valid_from_time"
VALID_TO_TIME = "_valid_to_time"
IS_CURRENT = "_is_current"
_ACTION = "__pgcdc_action"


class SinkKind(enum.Enum):
    CHANGELOG = "changelog"
    MIRROR = "mirror"
    HISTORY = "history"


@dataclass(frozen=True)
class WriteResult:
    table: str
    kind: SinkKind
    path: str
    # False when the table had already recorded this batch version (a replay) or it was empty.
    applied: bool
    rows: int


# --- preparing a batch -----------------------------------------------------------------------


def prepare(spec: c.TableSpec, changes: pa.Table) -> tuple[c.TableSpec, pa.Table]:
    """Validate, convert to Delta types and order by (commit LSN, seq)."""
    normalized = c.normalize(spec, changes)
    dspec = replace(spec, schema=delta_schema(spec.schema))
    arrays = []
    for name in normalized.column_names:
        array = normalized.column(name).combine_chunks()
        if name in (c.COMMIT_LSN, c.LSN_COLUMN):
            if len(array) and pc.max(array).as_py() > LSN_INFINITY - 1:
                raise InvalidChangeBatch(
                    f"{spec.qualified_name}: {name} beyond 2**63-1 cannot be stored as a Delta long"
                )
            arrays.append(array.cast(LSN_TYPE))
        else:
            arrays.append(to_delta(array))
    table = pa.Table.from_arrays(arrays, names=normalized.column_names)
    if _in_order(table):
        return dspec, table  # what the (stable) sort would return, without copying every column
    order = pc.sort_indices(table, sort_keys=[(c.COMMIT_LSN, "ascending"), (c.SEQ, "ascending")])
    return dspec, table.take(order)


def _in_order(table: pa.Table) -> bool:
    """Whether the rows already ascend by (commit LSN, seq), as a batch read in log order does."""
    lsn_column, seq_column = table.column(c.COMMIT_LSN), table.column(c.SEQ)
    if lsn_column.null_count or seq_column.null_count:
        return False
    lsn = lsn_column.to_numpy()
    seq = seq_column.to_numpy()
    later = lsn[1:] > lsn[:-1]
    same = lsn[1:] == lsn[:-1]
    return bool(np.all(later | (same & (seq[1:] >= seq[:-1]))))


def changelog_schema(dspec: c.TableSpec) -> pa.Schema:
    meta = [
        pa.field(f.name, LSN_TYPE if f.type == pa.uint64() else f.type) for f in c.METADATA_FIELDS
    ]
    meta = [pa.field(f.name, pa.int64() if f.type == pa.uint32() else f.type) for f in meta]
    return pa.schema([*dspec.schema, *meta, pa.field(c.OLD, c.old_type(dspec))])


def _mirror_schema(dspec: c.TableSpec) -> pa.Schema:
    return pa.schema(
        [
            *dspec.schema,
            pa.field(c.COMMIT_LSN, LSN_TYPE),
            pa.field(c.COMMIT_TIME, c.COMMIT_TIME_TYPE),
            pa.field(c.TEXT, c.TEXT_TYPE),
        ]
    )


def _history_schema(dspec: c.TableSpec) -> pa.Schema:
    return pa.schema(
        [
            *dspec.schema,
            pa.field(c.OP, pa.string()),
            pa.field(VALID_FROM_LSN, LSN_TYPE),
            pa.field(VALID_TO_LSN, LSN_TYPE),
            pa.field(VALID_FROM_TIME, c.COMMIT_TIME_TYPE),
            pa.field(VALID_TO_TIME, c.COMMIT_TIME_TYPE),
            pa.field(IS_CURRENT, pa.bool_()),
            pa.field(c.TEXT, c.TEXT_TYPE),
        ]
    )


# --- Delta table plumbing --------------------------------------------------------------------


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _open(path: str, storage_options: dict[str, str] | None) -> DeltaTable | None:
    if not DeltaTable.is_deltatable(path, storage_options=storage_options):
        return None
    return DeltaTable(path, storage_options=storage_options)


def table_schema(table: DeltaTable) -> pa.Schema:
    """A Delta table's schema as Arrow, in the types the sinks write."""
    schema = pa.schema(table.schema().to_arrow())
    return pa.schema([pa.field(f.name, normalize_read_type(f.type)) for f in schema])


def _ensure(
    path: str,
    wanted: pa.Schema,
    spec: c.TableSpec,
    storage_options: dict[str, str] | None,
) -> tuple[DeltaTable, pa.Schema]:
    """Create the table, or evolve it so ``wanted`` columns fit; return it and its schema."""
    table = _open(path, storage_options)
    if table is None:
        nullable = pa.schema([pa.field(f.name, f.type) for f in wanted])
        table = DeltaTable.create(path, nullable, mode="ignore", storage_options=storage_options)
        return table, table_schema(table)
    existing = table_schema(table)
    target = evolve(existing, wanted, spec.qualified_name, spec.relation_lsn)
    if target == existing:
        return table, existing
    widened = [f.name for f in existing if target.field(f.name).type != f.type]
    if not widened:
        log.info(
            "%s: adding columns %s", path, [n for n in target.names if n not in existing.names]
        )
        if not fill_added_columns(table, existing, target, spec):
            write_deltalake(table, target.empty_table(), mode="append", schema_mode="merge")
    else:
        log.warning("%s: widening %s rewrites the table", path, widened)
        data = align(table.to_pyarrow_table(), target)
        write_deltalake(table, data, mode="overwrite", schema_mode="overwrite")
    table = DeltaTable(path, storage_options=storage_options)
    return table, table_schema(table)


def fill_added_columns(
    table: DeltaTable, existing: pa.Schema, target: pa.Schema, spec: c.TableSpec
) -> bool:
    """Add ``target``'s new columns with the values the source's existing rows have; True when
    done (in one commit with the new schema, so a crash leaves both or neither), False when the
    caller should add them empty.

    ``ALTER TABLE ... ADD COLUMN c ... DEFAULT 7`` (non-volatile) changes no row: PostgreSQL
    keeps 7 in pg_attribute.attmissingval for rows that predate c, and the slot streams
    nothing for them. The receiver records that value with the Relation
    (``Column.missing``); every row already in the Delta table predates the column (changes
    of later definitions are written after it), so the mirror's rows and the history's current
    versions take it. Closed history versions and changelog rows keep null: c did not exist
    then. A column added with a default the slot cannot see (a volatile one, which rewrote
    the table) is reported with a ``StaleRowsWarning``: those rows need a re-copy."""
    if not spec.source_columns or not _has_data(table):
        return False
    added = [f.name for f in target if f.name not in existing.names]
    columns = {col.name: col for col in spec.source_columns if col.name in added}
    if not columns:
        return False
    history = VALID_FROM_LSN in existing.names
    if c.OP in existing.names and not history:
        return False  # the changelog: past changes did not have the column
    unseen = [name for name, col in columns.items() if col.default_unseen]
    if unseen:
        message = (
            f"{spec.qualified_name}: column(s) {unseen} were added with a default the "
            "replication slot does not stream (a volatile default rewrites the table without "
            f"logical changes): rows of {table.table_uri} written before hold null there while "
            f"the source holds values. Re-copy the table: pgcdc cannot yet re-snapshot one "
            f"table, so rebuild the pipeline with a new slot and a fresh initial snapshot"
        )
        log.warning("%s", message)
        warnings.warn(message, StaleRowsWarning, stacklevel=2)
    fills = {name: col for name, col in columns.items() if col.missing is not None}
    if not fills:
        return False
    data = align(table.to_pyarrow_table(), target)
    rows = pa.array([True] * data.num_rows) if not history else data.column(IS_CURRENT)
    for name, col in fills.items():
        value = _missing_value(spec, col, target.field(name).type)
        if value is None:
            continue
        index = data.schema.get_field_index(name)
        filled = pc.if_else(rows, pa.scalar(value, target.field(name).type), data.column(name))
        data = data.set_column(index, target.field(name), filled)
    log.info("%s: adding columns %s with existing rows' values", spec.qualified_name, added)
    write_deltalake(table, data, mode="overwrite", schema_mode="overwrite")
    return True


def _missing_value(spec: c.TableSpec, column: Column, delta_type: pa.DataType) -> Any:
    """``column.missing`` (PostgreSQL's text) as a value of the Delta column's type; None with
    a warning when it does not convert."""
    assert column.missing is not None
    source = Table(spec.namespace, spec.name, (replace(column, missing=None),))
    try:
        batch = rows_to_arrow(source, [(column.missing,)])
        array = to_delta(batch.column(0))
        if array.null_count:  # held only as text (_pgcdc_text): the column holds it as null
            raise ValueError("no typed form")
        return array.cast(delta_type)[0].as_py()
    except (PgcdcError, ValueError, pa.ArrowException) as exc:
        message = (
            f"{spec.qualified_name}.{column.name}: the value {column.missing!r} that existing "
            f"rows have (ADD COLUMN ... DEFAULT) does not convert to {delta_type} ({exc}); "
            "those rows keep null: re-copy the table"
        )
        log.warning("%s", message)
        warnings.warn(message, StaleRowsWarning, stacklevel=3)
        return None


def _commit(app_id: str, version: int) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app_id, version)])


def _has_data(table: DeltaTable) -> bool:
    return bool(table.file_uris())


def _execute(merger: Any, table: DeltaTable, schema: pa.Schema, commit: CommitProperties) -> None:
    """Run a MERGE; when it changed nothing (delta-rs then commits nothing), record the batch
    version with an empty commit, so a replay of the batch is still seen as one."""
    before = table.version()
    merger.execute()
    table.update_incremental()
    if table.version() == before:
        write_deltalake(table, schema.empty_table(), mode="append", commit_properties=commit)


def _key_predicate(dspec: c.TableSpec) -> str:
    # Replica identity keys (primary key, USING INDEX) are NOT NULL; FULL keys may hold NULLs.
    op = "IS NOT DISTINCT FROM" if dspec.old_is_full_row else "="
    return " AND ".join(f"(t.{_quote(k)} {op} s.{_quote(k)})" for k in dspec.key_columns)


def _read_target(
    table: DeltaTable,
    *,
    dspec: c.TableSpec,
    keys: set[Key],
    versions: Sequence[Version],
    changes: pa.Table,
    current_only: bool,
) -> tuple[pa.Table | None, dict[Key, int]]:
    """Pre-batch rows for ``keys`` (unchanged TOAST needs their values)."""
    if not keys:
        return None, {}
    first = dspec.key_columns[0]
    first_type = dspec.schema.field(first).type
    predicate = pc.field(first).isin(pa.array(list({k[0] for k in keys}), first_type))
    if current_only:
        predicate = predicate & (pc.field(IS_CURRENT) == pa.scalar(True))
    present = set(table_schema(table).names)
    columns = [f.name for f in dspec.schema if f.name in present]
    found = table.to_pyarrow_dataset().to_table(columns=columns, filter=predicate)
    found = align(found, dspec.schema)
    rows: dict[Key, int] = {}
    key_values = zip(*(found.column(k).to_pylist() for k in dspec.key_columns), strict=True)
    for index, key in enumerate(key_values):
        rows.setdefault(key, index)
    missing = keys - rows.keys()
    if missing:
        key = next(iter(missing))
        version, column = next(
            (v, name) for v in versions for name, s in v.sources.items() if s == ("target", key)
        )
        lsn = changes.column(c.LSN_COLUMN)[version.row].as_py()
        raise UnresolvedToastError(
            f"{dspec.qualified_name}: column {column!r} of the change at LSN {lsn} is an "
            f"unchanged TOASTed value, but the Delta table has no row with key "
            f"{dict(zip(dspec.key_columns, key, strict=True))} to take it from; load the table's "
            "initial snapshot before its changes, or set REPLICA IDENTITY FULL on it"
        )
    return found, rows


def _key_rows(dspec: c.TableSpec, keys: Sequence[Key]) -> dict[str, pa.Array]:
    return {
        k: pa.array([key[i] for key in keys], dspec.schema.field(k).type)
        for i, k in enumerate(dspec.key_columns)
    }


def _take(changes: pa.Table, column: str, rows: Sequence[int]) -> pa.Array:
    return changes.column(column).combine_chunks().take(pa.array(rows, pa.int64()))


# --- the three writers -----------------------------------------------------------------------


def _write_changelog(
    path: str, dspec: c.TableSpec, changes: pa.Table, commit: CommitProperties, so: Any
) -> None:
    _, schema = _ensure(path, changelog_schema(dspec), dspec, so)
    write_deltalake(
        path,
        align(changes, schema),
        mode="append",
        commit_properties=commit,
        storage_options=so,
    )


# Key types whose Arrow grouping equals Python equality of the values (no floats: -0.0/NaN).
def _groupable(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(t)
        or pa.types.is_string(t)
        or pa.types.is_binary(t)
        or pa.types.is_boolean(t)
        or pa.types.is_decimal(t)
        or pa.types.is_date(t)
        or pa.types.is_timestamp(t)
    )


def _key_events(dspec: c.TableSpec, changes: pa.Table) -> pa.Table | None:
    """The key events of an ordered batch without TRUNCATE or unchanged TOAST, in Arrow: one row
    per key a change touches, with ``__order`` = 2 * change row + (0: the old key goes, 1: the
    new key is written). None: the batch needs ``plan`` (TOAST lineage,
    TRUNCATE, a DELETE without key, float or nested keys)."""
    keys = list(dspec.key_columns)
    if not all(_groupable(dspec.schema.field(k).type) for k in keys):
        return None
    ops = changes.column(c.OP).combine_chunks()
    if pc.any(pc.equal(ops, c.TRUNCATE)).as_py():
        return None
    if pc.any(pc.greater(pc.list_value_length(changes.column(c.UNCHANGED)), 0)).as_py():
        return None
    old = changes.column(c.OLD).combine_chunks()
    has_old = old.is_valid()
    is_delete = pc.equal(ops, c.DELETE)
    if pc.any(pc.and_(is_delete, pc.invert(has_old))).as_py():
        return None
    number = pa.array(np.arange(changes.num_rows, dtype=np.int64))
    gone = pc.or_(is_delete, pc.and_(pc.equal(ops, c.UPDATE), has_old))
    written = pc.invert(is_delete)
    old_keys = pa.table({k: pc.struct_field(old, k) for k in keys}).filter(gone)
    new_keys = changes.select(keys).filter(written)
    order = pa.concat_arrays(
        [
            pc.multiply(number.filter(gone), 2),
            pc.add(pc.multiply(number.filter(written), 2), 1),
        ]
    )
    events = pa.concat_tables([old_keys, new_keys.cast(old_keys.schema)])
    return events.append_column(_ORDER, order)


_ORDER = "__order"


def _orders_by_key(dspec: c.TableSpec, changes: pa.Table, how: str) -> pa.Table | None:
    """Each key the batch touches with its events' change orders aggregated by ``how``
    (``"max"``: the last, ``"list"``: all); None when the batch needs ``plan``."""
    events = _key_events(dspec, changes)
    if events is None:
        return None
    keys = list(dspec.key_columns)
    return events.group_by(keys, use_threads=False).aggregate([(_ORDER, how)])


def fold_mirror(dspec: c.TableSpec, changes: pa.Table) -> tuple[pa.Array, pa.Table] | None:
    """The mirror's end state for an ordered batch without TRUNCATE or unchanged TOAST, in
    Arrow: (rows whose values each touched key ends with, keys that end deleted). Last write
    wins per key in (commit LSN, seq) order; a key change deletes the old key. None: the batch
    needs ``plan``."""
    last = _orders_by_key(dspec, changes, "max")
    if last is None:
        return None
    keys = list(dspec.key_columns)
    final = last.column(f"{_ORDER}_max").to_numpy()
    upsert = (final % 2) == 1
    deleted = last.select(keys).filter(pa.array(~upsert))
    return pa.array(np.sort(final[upsert] // 2)), deleted


@dataclass(frozen=True)
class HistoryFold:
    """A history batch folded in Arrow: the versions it opens and what closes them."""

    # Change rows that open a version (INSERT, UPDATE), ascending.
    starts: np.ndarray[Any, np.dtype[np.int64]]
    # The change row that closes each of them, -1 for versions still open after the batch.
    ends: np.ndarray[Any, np.dtype[np.int64]]
    # Every key the batch touched, with the first change row touching it: that change ends
    # the version the Delta table held for the key before the batch, if it held one.
    target_keys: pa.Table
    target_ends: np.ndarray[Any, np.dtype[np.int64]]


def fold_history(dspec: c.TableSpec, changes: pa.Table) -> HistoryFold | None:
    """The history's versions for an ordered batch without TRUNCATE or unchanged TOAST, in
    Arrow: every INSERT or UPDATE opens a version of its key, and the next change touching that
    key (in (commit LSN, seq) order) closes it, as ``plan`` does. None: the batch needs ``plan``.
    """
    grouped = _orders_by_key(dspec, changes, "list")
    if grouped is None:
        return None
    keys = list(dspec.key_columns)
    lists = grouped.column(f"{_ORDER}_list").combine_chunks()
    orders = pc.list_flatten(lists).to_numpy()
    parents = pc.list_parent_indices(lists).to_numpy()
    # Each key's events in change order (they come old keys first, then new ones).
    position = np.lexsort((orders, parents))
    orders, parents = orders[position], parents[position]
    rows = orders // 2
    same_key_next = np.zeros(len(orders), dtype=bool)
    same_key_next[:-1] = parents[1:] == parents[:-1]
    closers = np.full(len(orders), -1, dtype=np.int64)
    closers[:-1] = np.where(same_key_next[:-1], rows[1:], -1)
    opens = (orders % 2) == 1
    starts, ends = rows[opens], closers[opens]
    by_row = np.argsort(starts, kind="stable")
    first = np.ones(len(orders), dtype=bool)
    first[1:] = parents[1:] != parents[:-1]
    return HistoryFold(
        starts=starts[by_row],
        ends=ends[by_row],
        target_keys=grouped.select(keys),  # group i's events are those with parent i
        target_ends=rows[first],
    )


def _write_mirror(
    path: str, dspec: c.TableSpec, changes: pa.Table, commit: CommitProperties, so: Any
) -> None:
    table, schema = _ensure(path, _mirror_schema(dspec), dspec, so)
    folded = fold_mirror(dspec, changes)
    truncate_row: int | None = None
    if folded is not None:
        lineage_rows, deleted_keys = folded
        rows = changes.select(dspec.schema.names).take(lineage_rows)
        rows = pa.Table.from_arrays(
            [rows.column(n).combine_chunks() for n in rows.column_names], schema=dspec.schema
        )
        lineage: Sequence[int] = lineage_rows.to_pylist()
    else:
        p = plan(dspec, changes)
        truncate_row = p.truncate_row
        upserts = [v for v in p.final.values() if v is not None]
        deleted = [k for k, v in p.final.items() if v is None]
        deleted_keys = pa.table(_key_rows(dspec, deleted))
        needed = {s[1] for v in upserts for s in v.sources.values() if s[0] == "target"}
        target, target_rows = _read_target(
            table, dspec=dspec, keys=needed, versions=upserts, changes=changes, current_only=False
        )
        rows = assemble(dspec, changes, upserts, target, target_rows)
        lineage = [v.row for v in upserts]
    rows = rows.append_column(c.COMMIT_LSN, _take(changes, c.COMMIT_LSN, lineage))
    rows = rows.append_column(c.COMMIT_TIME, _take(changes, c.COMMIT_TIME, lineage))
    rows = rows.append_column(c.TEXT, _take(changes, c.TEXT, lineage))
    if not _has_data(table):
        write_deltalake(
            path, align(rows, schema), mode="append", commit_properties=commit, storage_options=so
        )
        return
    source_schema = schema.append(pa.field(_ACTION, pa.string()))
    upsert_rows = rows.append_column(_ACTION, pa.array(["upsert"] * rows.num_rows, pa.string()))
    delete_rows = deleted_keys.append_column(
        _ACTION, pa.array(["delete"] * deleted_keys.num_rows, pa.string())
    )
    source = pa.concat_tables(
        [align(upsert_rows, source_schema), align(delete_rows, source_schema)]
    )
    written = [*(f.name for f in _mirror_schema(dspec))]
    if truncate_row is not None:
        written = schema.names  # rows re-created after a TRUNCATE keep nothing of the old ones
    merger = table.merge(
        source,
        predicate=_key_predicate(dspec),
        source_alias="s",
        target_alias="t",
        commit_properties=commit,
    )
    merger = merger.when_matched_delete(predicate=f"s.{_ACTION} = 'delete'")
    merger = merger.when_matched_update(
        updates={_quote(n): f"s.{_quote(n)}" for n in written},
        predicate=f"s.{_ACTION} = 'upsert'",
    )
    merger = merger.when_not_matched_insert(
        updates={_quote(n): f"s.{_quote(n)}" for n in schema.names},
        predicate=f"s.{_ACTION} = 'upsert'",
    )
    if truncate_row is not None:
        merger = merger.when_not_matched_by_source_delete()
    _execute(merger, table, schema, commit)


def _timestamp_literal(value: datetime) -> str:
    micros = int((value - datetime(1970, 1, 1, tzinfo=UTC)).total_seconds()) * 1_000_000
    micros += value.microsecond
    return f"arrow_cast({micros}, 'Timestamp(Microsecond, Some(\"UTC\"))')"


def _ended(changes: pa.Table, column: str, ends: np.ndarray[Any, Any], open_value: Any) -> pa.Array:
    """``column`` of the changes that end each version; ``open_value`` for open versions."""
    indices = pa.array(ends, pa.int64(), mask=ends < 0)
    array = changes.column(column).combine_chunks()
    return pc.fill_null(array.take(indices), pa.scalar(open_value, array.type))


def _write_history(
    path: str, dspec: c.TableSpec, changes: pa.Table, commit: CommitProperties, so: Any
) -> None:
    table, schema = _ensure(path, _history_schema(dspec), dspec, so)
    folded = fold_history(dspec, changes)
    truncate_row: int | None = None
    if folded is not None:
        starts, ends = folded.starts, folded.ends
        rows = changes.select(dspec.schema.names).take(pa.array(starts))
        rows = pa.Table.from_arrays(
            [rows.column(n).combine_chunks() for n in rows.column_names], schema=dspec.schema
        )
        closed_keys, closed_ends = folded.target_keys, folded.target_ends
    else:
        p = plan(dspec, changes)
        truncate_row = p.truncate_row
        versions = p.versions
        target, target_rows = _read_target(
            table,
            dspec=dspec,
            keys=p.target_keys(),
            versions=versions,
            changes=changes,
            current_only=True,
        )
        rows = assemble(dspec, changes, versions, target, target_rows)
        starts = np.array([v.row for v in versions], dtype=np.int64)
        ends = np.array([-1 if v.closed_by is None else v.closed_by for v in versions], np.int64)
        closed = list(p.target_closed)
        closed_keys = pa.table(_key_rows(dspec, closed))
        closed_ends = np.array([p.target_closed[k] for k in closed], dtype=np.int64)
    start_rows = pa.array(starts, pa.int64())
    rows = rows.append_column(c.OP, changes.column(c.OP).take(start_rows))
    rows = rows.append_column(VALID_FROM_LSN, changes.column(c.COMMIT_LSN).take(start_rows))
    rows = rows.append_column(VALID_TO_LSN, _ended(changes, c.COMMIT_LSN, ends, LSN_INFINITY))
    rows = rows.append_column(VALID_FROM_TIME, changes.column(c.COMMIT_TIME).take(start_rows))
    rows = rows.append_column(VALID_TO_TIME, _ended(changes, c.COMMIT_TIME, ends, TIME_INFINITY))
    rows = rows.append_column(IS_CURRENT, pa.array(ends < 0, pa.bool_()))
    rows = rows.append_column(c.TEXT, changes.column(c.TEXT).take(start_rows))
    if (closed_keys.num_rows == 0 and truncate_row is None) or not _has_data(table):
        write_deltalake(
            path, align(rows, schema), mode="append", commit_properties=commit, storage_options=so
        )
        return
    source_schema = schema.append(pa.field(_ACTION, pa.string()))
    closing = pa.array(closed_ends, pa.int64())
    close_rows = closed_keys.append_column(VALID_TO_LSN, changes.column(c.COMMIT_LSN).take(closing))
    close_rows = close_rows.append_column(
        VALID_TO_TIME, changes.column(c.COMMIT_TIME).take(closing)
    )
    close_rows = close_rows.append_column(
        _ACTION, pa.array(["close"] * close_rows.num_rows, pa.string())
    )
    new_rows = rows.append_column(_ACTION, pa.array(["insert"] * rows.num_rows, pa.string()))
    source = pa.concat_tables([align(new_rows, source_schema), align(close_rows, source_schema)])
    merger = table.merge(
        source,
        predicate=f"s.{_ACTION} = 'close' AND t.{IS_CURRENT} AND {_key_predicate(dspec)}",
        source_alias="s",
        target_alias="t",
        commit_properties=commit,
    )
    merger = merger.when_matched_update(
        updates={
            VALID_TO_LSN: f"s.{VALID_TO_LSN}",
            VALID_TO_TIME: f"s.{VALID_TO_TIME}",
            IS_CURRENT: "false",
        }
    )
    merger = merger.when_not_matched_insert(
        updates={_quote(n): f"s.{_quote(n)}" for n in schema.names},
        predicate=f"s.{_ACTION} = 'insert'",
    )
    if truncate_row is not None:
        merger = merger.when_not_matched_by_source_update(
            updates={
                VALID_TO_LSN: str(changes.column(c.COMMIT_LSN)[truncate_row].as_py()),
                VALID_TO_TIME: _timestamp_literal(
                    changes.column(c.COMMIT_TIME)[truncate_row].as_py()
                ),
                IS_CURRENT: "false",
            },
            predicate=f"t.{IS_CURRENT}",
        )
    _execute(merger, table, schema, commit)


_WRITERS = {
    SinkKind.CHANGELOG: _write_changelog,
    SinkKind.MIRROR: _write_mirror,
    SinkKind.HISTORY: _write_history,
}


def write_table(
    path: str | Path,
    spec: c.TableSpec,
    changes: pa.Table,
    kind: SinkKind,
    *,
    app_id: str,
    version: int,
    storage_options: dict[str, str] | None = None,
) -> WriteResult:
    """Apply one batch of one table's changes to one Delta table, exactly once per ``version``.

    ``version`` must grow from batch to batch of the same ``app_id``; a version at or below the
    one the table recorded is a replay and is skipped.
    """
    return _write_table(
        str(path),
        spec,
        lambda: prepare(spec, changes),
        changes.num_rows,
        kind,
        app_id=app_id,
        version=version,
        storage_options=storage_options,
    )


def _write_table(
    path: str,
    spec: c.TableSpec,
    prepared: Callable[[], tuple[c.TableSpec, pa.Table]],
    rows: int,
    kind: SinkKind,
    *,
    app_id: str,
    version: int,
    storage_options: dict[str, str] | None,
) -> WriteResult:
    """``write_table`` with the batch prepared on demand (a replay or an empty batch never
    needs it; the kinds of one table share it)."""
    if kind is not SinkKind.CHANGELOG and not spec.has_usable_key:
        raise InvalidChangeBatch(
            f"{spec.qualified_name} has no usable replica identity, so it cannot have a "
            f"{kind.value} table; add a primary key, or ALTER TABLE {spec.qualified_name} "
            "REPLICA IDENTITY FULL (or USING INDEX), or write only its changelog"
        )
    existing = _open(path, storage_options)
    if existing is not None:
        done = existing.transaction_version(app_id)
        if done is not None and done >= version:
            return WriteResult(spec.qualified_name, kind, path, False, 0)
    if rows == 0:
        return WriteResult(spec.qualified_name, kind, path, False, 0)
    dspec, batch = prepared()
    _WRITERS[kind](path, dspec, batch, _commit(app_id, version), storage_options)
    return WriteResult(spec.qualified_name, kind, path, True, batch.num_rows)


class DeltaSink:
    """Delta tables for many source tables under one root: ``<root>/<schema>/<table>/<kind>``.

    Tables without a usable key get only a changelog (with a warning naming the fix), whatever
    kinds were asked for, so their changes are never dropped.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        app_id: str,
        kinds: Collection[SinkKind] = (SinkKind.CHANGELOG, SinkKind.MIRROR),
        table_kinds: Mapping[str, Collection[SinkKind]] | None = None,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.root = str(root).rstrip("/")
        self.app_id = app_id
        self.kinds = tuple(kinds)
        self.table_kinds = {name: tuple(k) for name, k in (table_kinds or {}).items()}
        self.storage_options = storage_options
        self._warned: set[str] = set()

    def path(self, spec: c.TableSpec, kind: SinkKind) -> str:
        parts = (quote(spec.namespace, safe=""), quote(spec.name, safe=""), kind.value)
        return "/".join((self.root, *parts))

    def kinds_for(self, spec: c.TableSpec) -> tuple[SinkKind, ...]:
        wanted = self.table_kinds.get(spec.qualified_name, self.kinds)
        if spec.has_usable_key:
            return tuple(wanted)
        if spec.qualified_name not in self._warned:
            self._warned.add(spec.qualified_name)
            warnings.warn(
                f"{spec.qualified_name} has no usable replica identity (REPLICA IDENTITY "
                "NOTHING, or DEFAULT without a primary key): writing its changelog only. "
                f"Add a primary key, or ALTER TABLE {spec.qualified_name} REPLICA IDENTITY "
                "FULL (or USING INDEX <unique index>) to get a mirror and a history",
                stacklevel=3,
            )
        return (SinkKind.CHANGELOG,)

    def write_batch(
        self, version: int, batches: Iterable[tuple[c.TableSpec, pa.Table]]
    ) -> list[WriteResult]:
        """Apply one micro-batch (any number of tables) exactly once per ``version``.

        Tables are written one after the other; after a crash, replaying the same version
        skips the tables that already have it and applies the rest.
        """
        batches = list(batches)
        names = [spec.qualified_name for spec, _ in batches]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise InvalidChangeBatch(
                f"table(s) {repeated} appear more than once in batch {version}; end the batch "
                "where a table's Relation changes, so each batch has one TableSpec per table"
            )
        results = []
        for spec, changes in batches:
            # Validated, converted and sorted once for all of the table's kinds.
            prepared = functools.cache(functools.partial(prepare, spec, changes))
            for kind in self.kinds_for(spec):
                results.append(
                    _write_table(
                        self.path(spec, kind),
                        spec,
                        prepared,
                        changes.num_rows,
                        kind,
                        app_id=self.app_id,
                        version=version,
                        storage_options=self.storage_options,
                    )
                )
        return results
