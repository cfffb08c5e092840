"""Write batches of changes (``pgcdc.sinks.changes``) to Delta Lake tables with delta-rs.

Three kinds of table per source table, each optional:

changelog
    Every change appended: the table's columns (new values), ``_op``, ``_commit_lsn``, ``_seq``,
    ``_lsn``, ``_xid``, ``_commit_time``, ``_origin``, ``_unchanged``, ``_old`` (a struct of
    the table's columns) and ``_old_text`` (the text forms of ``_old``'s values). LSNs are
    Delta ``long`` (LSNs below 2**63; PostgreSQL would need 8 EiB of WAL to pass that).
    Unchanged TOASTed values stay null here, named in ``_unchanged``.
mirror (SCD1)
    The current rows, keyed by the replica identity, plus ``_commit_lsn``, ``_commit_time`` and
    ``_text`` of the change that last wrote each row, and ``_pgcdc_key``. One MERGE per batch.
history (SCD2)
    One row per version with ``_op`` (insert or update: what opened it), ``_valid_from_lsn``,
    ``_valid_to_lsn``, ``_valid_from_time``, ``_valid_to_time``, ``_is_current`` and ``_text``.
    LSNs are commit LSNs, so the state as of LSN L is ``_valid_from_lsn <= L < _valid_to_lsn``;
    an open version has ``_valid_to_lsn`` = 2**63-1 and ``_valid_to_time`` =
    9999-12-31 23:59:59.999999 UTC. A version replaced within its own transaction has an empty
    interval (from = to). Also ``_pgcdc_key``.

Rows of the mirror and history are matched by ``_pgcdc_key``, an exact encoding of the replica
identity's values, typed or (where the typed column cannot hold them) text, never by the typed
values, which may be null (``pgcdc.sinks.keys``). Keyless REPLICA IDENTITY FULL tables also
carry ``_pgcdc_copy``, the copy number among identical rows, so the mirror keeps multiplicity.
A mirror or history written before ``_pgcdc_key`` existed (no such column, some rows) is not
continued, as its rows cannot be matched and may already be merged wrongly: writing to it raises
``SinkError`` telling the user to move it away and reload the table from a fresh snapshot.

Dates delta-rs cannot write (after year 262142: its statistics panic) go to ``_text`` like the
values the decoder keeps as text; ``pgcdc.sinks.read`` reads BC and post-9999 dates back.

Schema changes (``pgcdc.sinks.schema``): new columns (and the field the changelog's ``_old``
gains with each) are added by a Delta schema change alone, no data file rewritten, and rows
written before read back null there; dropped columns stay in the Delta table: changelog and
history rows written after the drop have null there, mirror rows keep the last value they had
(a row inserted after the drop has null). A type widening rewrites the table once, in one
commit.

Exactly once: every data commit carries the Delta application transaction (``app_id``,
``version``); a batch whose version the table already recorded is skipped. Schema commits
before it are idempotent, so a crash between them and the data commit is harmless.

A table whose initial snapshot the executors landed records it as application
``<app_id>-snapshot``, version = the snapshot's consistent point. Changes committed before it
are in that snapshot, so they are not applied again: after a crash the snapshot resumes with
the tables not yet landed, copied at a later point than the stream starts from
(``pgcdc.spark.snapshot``).
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from pgcdc.decoding.arrow import rows_to_arrow
from pgcdc.errors import (
    InvalidChangeBatch,
    LakePathError,
    PgcdcError,
    SinkError,
    StaleRowsWarning,
    UnresolvedToastError,
    recopy_hint,
)
from pgcdc.events import Column, Table
from pgcdc.sinks import changes as c
from pgcdc.sinks import keys as k
from pgcdc.sinks.kinds import DEFAULT_COMPACT_FILES, SinkKind
from pgcdc.sinks.parquet import writer_properties
from pgcdc.sinks.paths import legacy_table_path, table_path
from pgcdc.sinks.plan import Key, Version, assemble, plan
from pgcdc.sinks.read import dataset
from pgcdc.sinks.schema import (
    align,
    contiguous,
    delta_schema,
    evolve,
    normalize_read_type,
    park_unstorable,
    to_delta,
)

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
# In a history MERGE's source, the identity of the version a row closes; null on the rows that
# insert versions, so that they match nothing (see ``_write_history``).
_CLOSES = "__pgcdc_closes_"
# A history table is partitioned by ``_is_current``: a batch's MERGE closes current versions
# only, so it rewrites files of the current partition (one row per key), never the closed
# versions, which only grow; unpartitioned, every MERGE copied the whole history again. Tables
# made before this layout stay unpartitioned (the same statements work on both).
_PARTITION_BY: dict[SinkKind, tuple[str, ...]] = {SinkKind.HISTORY: (IS_CURRENT,)}
_TARGET_FILE_BYTES = 100 * 1024 * 1024  # delta-rs's default target size


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
    arrays: dict[str, pa.Array] = {}
    for name in normalized.column_names:
        array = contiguous(normalized.column(name))
        if name in (c.COMMIT_LSN, c.LSN_COLUMN):
            if len(array) and pc.max(array).as_py() > LSN_INFINITY - 1:
                raise InvalidChangeBatch(
                    f"{spec.qualified_name}: {name} beyond 2**63-1 cannot be stored as a Delta long"
                )
            arrays[name] = array.cast(LSN_TYPE)
        else:
            arrays[name] = to_delta(array)
    arrays = _park(dspec, arrays)
    if dspec.key_columns:
        arrays.update(_identity(dspec, arrays))
    table = pa.Table.from_pydict(arrays)
    if _in_order(table):
        return dspec, table  # what the (stable) sort would return, without copying every column
    order = pc.sort_indices(table, sort_keys=[(c.COMMIT_LSN, "ascending"), (c.SEQ, "ascending")])
    return dspec, table.take(order)


def _park(dspec: c.TableSpec, arrays: dict[str, pa.Array]) -> dict[str, pa.Array]:
    """Values delta-rs cannot write typed moved to ``_text`` / ``_old_text``."""
    names = dspec.schema.names
    table, text = park_unstorable({n: arrays[n] for n in names}, arrays[c.TEXT])
    old = arrays[c.OLD]
    fields, old_text = park_unstorable(
        {n: pc.struct_field(old, n) for n in names}, arrays[c.OLD_TEXT]
    )
    old = pa.StructArray.from_arrays(
        [fields[n] for n in names], fields=list(old.type), mask=old.is_null()
    )
    return {**arrays, **table, c.TEXT: text, c.OLD: old, c.OLD_TEXT: old_text}


def _identity(dspec: c.TableSpec, arrays: dict[str, pa.Array]) -> dict[str, pa.Array]:
    """``_pgcdc_key`` of each change's new row and ``_pgcdc_old_key`` of its old row (null when
    it has none). A key column the change did not send (unchanged TOAST) has its old value."""
    old = arrays[c.OLD]
    has_old = old.is_valid()
    unchanged = arrays[c.UNCHANGED]
    listed = pc.list_flatten(unchanged)
    parents = pc.list_parent_indices(unchanged).to_numpy()
    new_parts, old_parts = [], []
    for name in dspec.key_columns:
        new = k.framed(arrays[name], k.text_of(arrays[c.TEXT], name))
        before = k.framed(pc.struct_field(old, name), k.text_of(arrays[c.OLD_TEXT], name))
        if dspec.old_is_full_row:
            new, before = k.named(name, new), k.named(name, before)
        rows = parents[pc.equal(listed, name).to_numpy(zero_copy_only=False)]
        if len(rows):
            mask = np.zeros(len(old), dtype=bool)
            mask[rows] = True
            new = pc.if_else(pc.and_(pa.array(mask), has_old), before, new)
        new_parts.append(new)
        old_parts.append(before)
    old_key = pc.if_else(has_old, k.encode_framed(old_parts), pa.scalar(None, k.KEY_TYPE))
    return {k.KEY: k.encode_framed(new_parts), k.OLD_KEY: old_key}


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
    return pa.schema(
        [
            *dspec.schema,
            *meta,
            pa.field(c.OLD, c.old_type(dspec)),
            pa.field(c.OLD_TEXT, c.TEXT_TYPE),
        ]
    )


def _identity_fields(dspec: c.TableSpec) -> list[pa.Field]:
    fields = [pa.field(k.KEY, k.KEY_TYPE)]
    return [*fields, pa.field(k.COPY, k.COPY_TYPE)] if k.counts_copies(dspec) else fields


def _mirror_schema(dspec: c.TableSpec) -> pa.Schema:
    return pa.schema(
        [
            *dspec.schema,
            pa.field(c.COMMIT_LSN, LSN_TYPE),
            pa.field(c.COMMIT_TIME, c.COMMIT_TIME_TYPE),
            pa.field(c.TEXT, c.TEXT_TYPE),
            *_identity_fields(dspec),
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
            *_identity_fields(dspec),
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
    kind: SinkKind,
    spec: c.TableSpec,
    storage_options: dict[str, str] | None,
    table: DeltaTable | None,
) -> tuple[DeltaTable, pa.Schema]:
    """Create the ``kind`` table (partitioned as ``_PARTITION_BY`` says), or evolve it so the
    kind's columns for ``spec`` fit; return it and its schema.

    ``table``: the table at ``path`` as the caller just opened it (None: there was none), so
    a write loads the table's log once, not once per step (a fixed cost of every table, kind
    and batch that small transactions across many tables pay on few rows)."""
    wanted = _SCHEMAS[kind](spec)
    if table is None:
        nullable = pa.schema([pa.field(f.name, f.type) for f in wanted])
        table = DeltaTable.create(
            path,
            nullable,
            mode="ignore",
            partition_by=list(_PARTITION_BY.get(kind, ())) or None,
            storage_options=storage_options,
        )
        return table, table_schema(table)
    existing = table_schema(table)
    target = evolve(existing, wanted, spec.qualified_name, spec.relation_lsn)
    if target == existing:
        return table, existing
    widened = [f.name for f in existing if not _only_added(f.type, target.field(f.name).type)]
    if not widened:
        # Metadata only: files written before lack the new columns (and struct fields, as
        # ``_old`` gains one per added column) and read back null there.
        log.info(
            "%s: adding columns %s", path, [n for n in target.names if n not in existing.names]
        )
        if not fill_added_columns(table, existing, target, spec):
            write_deltalake(table, target.empty_table(), mode="append", schema_mode="merge")
    else:
        log.warning("%s: widening %s rewrites the table", path, widened)
        data = align(dataset(table, storage_options).to_table(), target)
        _overwrite(table, data)
    table = DeltaTable(path, storage_options=storage_options)
    return table, table_schema(table)


def _only_added(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether ``new`` is ``old`` or ``old`` with struct fields added (at any depth): a change
    a Delta schema merge makes without rewriting a file."""
    if old == new:
        return True
    if not (pa.types.is_struct(old) and pa.types.is_struct(new)):
        return False
    if new.num_fields < old.num_fields:
        return False
    return all(
        new.field(i).name == o.name and _only_added(o.type, new.field(i).type)
        for i, o in enumerate(old)
    )


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
            f"the source holds values. Re-copy the table: {recopy_hint(spec.namespace, spec.name)}"
        )
        log.warning("%s", message)
        warnings.warn(message, StaleRowsWarning, stacklevel=2)
    fills = {name: col for name, col in columns.items() if col.missing is not None}
    if not fills:
        return False
    data = align(dataset(table).to_table(), target)
    rows = pa.array([True] * data.num_rows) if not history else data.column(IS_CURRENT)
    for name, col in fills.items():
        value = _missing_value(spec, col, target.field(name).type)
        if value is None:
            continue
        index = data.schema.get_field_index(name)
        filled = pc.if_else(rows, pa.scalar(value, target.field(name).type), data.column(name))
        data = data.set_column(index, target.field(name), filled)
    log.info("%s: adding columns %s with existing rows' values", spec.qualified_name, added)
    _overwrite(table, data)
    return True


def _overwrite(table: DeltaTable, data: pa.Table) -> None:
    """Replace the table's rows and schema with ``data``, in the table's partitioning."""
    partition_by = list(table.metadata().partition_columns) or None
    write_deltalake(
        table, data, mode="overwrite", schema_mode="overwrite", partition_by=partition_by
    )


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
            f"those rows keep null: re-copy the table: {recopy_hint(spec.namespace, spec.name)}"
        )
        log.warning("%s", message)
        warnings.warn(message, StaleRowsWarning, stacklevel=3)
        return None


# The Delta application id a snapshot commit records, after the pipeline's own.
SNAPSHOT_APP_SUFFIX = "-snapshot"


def _commit(app_id: str, version: int) -> CommitProperties:
    return CommitProperties(app_transactions=[Transaction(app_id, version)])


def _append(table: DeltaTable, rows: pa.Table, commit: CommitProperties) -> None:
    write_deltalake(
        table,
        rows,
        mode="append",
        commit_properties=commit,
        writer_properties=writer_properties(rows),
    )


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
    # Identity columns are never null.
    return " AND ".join(f"(t.{_quote(n)} = s.{_quote(n)})" for n in k.identity_columns(dspec))


def _key_in(keys: pa.Array) -> pc.Expression:
    """``_pgcdc_key`` is one of ``keys``; cast, as files written by a MERGE hold binary_view,
    which pyarrow's statistics filter cannot compare with binary."""
    return pc.field(k.KEY).cast(k.KEY_TYPE).isin(keys)


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
    predicate = _key_in(pa.array(list({key[0] for key in keys}), k.KEY_TYPE))
    if current_only:
        predicate = predicate & (pc.field(IS_CURRENT) == pa.scalar(True))
    present = set(table_schema(table).names)
    identity = k.identity_columns(dspec)
    wanted = pa.schema([*dspec.schema, pa.field(c.TEXT, c.TEXT_TYPE), *_identity_fields(dspec)])
    columns = [n for n in wanted.names if n in present]
    found = dataset(table).to_table(columns=columns, filter=predicate)
    found = align(found, wanted)
    rows: dict[Key, int] = {}
    key_values = zip(*(found.column(n).to_pylist() for n in identity), strict=True)
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
            f"unchanged TOASTed value, but the Delta table has no row with its key "
            f"({_describe(dspec, changes, version.row)}) to take it from; load the table's "
            "initial snapshot before its changes, or set REPLICA IDENTITY FULL on it"
        )
    return found, rows


def _describe(dspec: c.TableSpec, changes: pa.Table, row: int) -> str:
    """The key columns of change ``row`` as a user reads them, for error messages."""
    texts = dict(changes.column(c.TEXT)[row].as_py() or [])
    shown = []
    for name in dspec.key_columns:
        scalar = changes.column(name)[row]
        try:
            value = texts.get(name, scalar.as_py())
        except (OverflowError, ValueError):  # a date Python cannot hold
            value = str(scalar.cast(pa.int64()).as_py()) + " days since 1970"
        shown.append(f"{name}={value!r}")
    return ", ".join(shown)


def _key_rows(dspec: c.TableSpec, keys: Sequence[Key]) -> dict[str, pa.Array]:
    """Identity columns of ``keys`` (identity tuples)."""
    types = {k.KEY: k.KEY_TYPE, k.COPY: k.COPY_TYPE}
    return {
        name: pa.array([key[i] for key in keys], types[name])
        for i, name in enumerate(k.identity_columns(dspec))
    }


def _take(changes: pa.Table, column: str, rows: Sequence[int] | None) -> pa.Array:
    """``column`` of change ``rows`` (None: of every change, in order)."""
    array = contiguous(changes.column(column))
    return array if rows is None else array.take(pa.array(rows, pa.int64()))


# --- the three writers -----------------------------------------------------------------------


def _write_changelog(
    path: str,
    dspec: c.TableSpec,
    changes: pa.Table,
    commit: CommitProperties,
    so: Any,
    *,
    opened: DeltaTable | None,
) -> None:
    table, schema = _ensure(path, SinkKind.CHANGELOG, dspec, so, opened)
    _append(table, align(changes, schema), commit)


def _key_events(dspec: c.TableSpec, changes: pa.Table) -> pa.Table | None:
    """The key events of an ordered batch without TRUNCATE or unchanged TOAST, in Arrow: one row
    per key a change touches, with ``__order`` = 2 * change row + (0: the old key goes, 1: the
    new key is written), keyed by the row's identity columns. None: the batch needs ``plan``
    (TOAST lineage, TRUNCATE, a DELETE without key)."""
    ops = contiguous(changes.column(c.OP))
    if pc.any(pc.equal(ops, c.TRUNCATE)).as_py():
        return None
    if pc.any(pc.greater(pc.list_value_length(changes.column(c.UNCHANGED)), 0)).as_py():
        return None
    old = contiguous(changes.column(c.OLD))
    has_old = old.is_valid()
    is_delete = pc.equal(ops, c.DELETE)
    if pc.any(pc.and_(is_delete, pc.invert(has_old))).as_py():
        return None
    number = pa.array(np.arange(changes.num_rows, dtype=np.int64))
    gone = pc.or_(is_delete, pc.and_(pc.equal(ops, c.UPDATE), has_old))
    written = pc.invert(is_delete)
    old_keys = pa.table(
        {n: changes.column(_OLD_IDENTITY[n]) for n in k.identity_columns(dspec)}
    ).filter(gone)
    new_keys = changes.select(list(k.identity_columns(dspec))).filter(written)
    order = pa.concat_arrays(
        [
            pc.multiply(number.filter(gone), 2),
            pc.add(pc.multiply(number.filter(written), 2), 1),
        ]
    )
    events = pa.concat_tables([old_keys, new_keys.cast(old_keys.schema)])
    return events.append_column(_ORDER, order)


_ORDER = "__order"
_OLD_IDENTITY = {k.KEY: k.OLD_KEY, k.COPY: k.OLD_COPY}


def _orders_by_key(dspec: c.TableSpec, changes: pa.Table, how: str) -> pa.Table | None:
    """Each key the batch touches with its events' change orders aggregated by ``how``
    (``"max"``: the last, ``"list"``: all); None when the batch needs ``plan``."""
    events = _key_events(dspec, changes)
    if events is None:
        return None
    keys = list(k.identity_columns(dspec))
    return events.group_by(keys, use_threads=False).aggregate([(_ORDER, how)])


def fold_mirror(dspec: c.TableSpec, changes: pa.Table) -> tuple[pa.Array, pa.Table] | None:
    """The mirror's end state for an ordered batch without TRUNCATE or unchanged TOAST, in
    Arrow: (rows whose values each touched key ends with, keys that end deleted). Last write
    wins per key in (commit LSN, seq) order; a key change deletes the old key. None: the batch
    needs ``plan``."""
    last = _orders_by_key(dspec, changes, "max")
    if last is None:
        return None
    keys = list(k.identity_columns(dspec))
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
    keys = list(k.identity_columns(dspec))
    lists = contiguous(grouped.column(f"{_ORDER}_list"))
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


def _rows(dspec: c.TableSpec, changes: pa.Table, rows: pa.Array | None) -> pa.Table:
    """The table columns and ``_text`` of change ``rows`` (None: of every change, in order)."""
    taken = changes.select([*dspec.schema.names, c.TEXT])
    taken = taken if rows is None else taken.take(rows)
    schema = dspec.schema.append(pa.field(c.TEXT, c.TEXT_TYPE))
    return pa.Table.from_arrays(
        [contiguous(taken.column(n)) for n in taken.column_names], schema=schema
    )


def _number_copies(
    dspec: c.TableSpec, table: DeltaTable | None, changes: pa.Table, *, current_only: bool
) -> pa.Table:
    """``changes`` with the copy numbers of their new and old rows (``keys`` module docstring),
    for keyless REPLICA IDENTITY FULL tables; other tables' rows are unique by their key.
    ``table`` None: the rows land in an empty table."""
    if not k.counts_copies(dspec):
        return changes
    ops: list[str] = changes.column(c.OP).to_pylist()
    new: list[bytes] = changes.column(k.KEY).to_pylist()
    old: list[bytes | None] = changes.column(k.OLD_KEY).to_pylist()
    touched = {key for key, op in zip(new, ops, strict=True) if op in (c.INSERT, c.UPDATE)}
    touched |= {key for key in old if key is not None}
    counts: dict[bytes, int] = {}
    if touched and table is not None and _has_data(table):
        predicate = _key_in(pa.array(list(touched), k.KEY_TYPE))
        if current_only:
            predicate = predicate & (pc.field(IS_CURRENT) == pa.scalar(True))
        found = dataset(table).to_table(columns=[k.KEY], filter=predicate).column(k.KEY)
        for key in found.to_pylist():
            counts[key] = counts.get(key, 0) + 1
    copies: list[int | None] = [None] * len(ops)
    old_copies: list[int | None] = [None] * len(ops)
    for row, op in enumerate(ops):
        if op == c.TRUNCATE:
            counts = {}
            continue
        gone = old[row]
        if gone is not None and op in (c.UPDATE, c.DELETE):
            old_copies[row] = counts.get(gone, 0)  # the highest copy goes
            counts[gone] = max(old_copies[row] or 0, 1) - 1
        if op == c.INSERT or (op == c.UPDATE and gone is not None):
            counts[new[row]] = copies[row] = counts.get(new[row], 0) + 1
        elif op == c.UPDATE:  # no old row sent: the row stays where it is
            copies[row] = counts.setdefault(new[row], 1) or 1
    changes = changes.append_column(k.COPY, pa.array(copies, k.COPY_TYPE))
    return changes.append_column(k.OLD_COPY, pa.array(old_copies, k.COPY_TYPE))


def _mirror_rows(
    dspec: c.TableSpec, changes: pa.Table, rows: pa.Table, lineage: Sequence[int] | None
) -> pa.Table:
    """Mirror rows: the values of ``rows`` with the commit and identity of the changes
    (``lineage``; None: every change, in order) that wrote them."""
    rows = rows.append_column(c.COMMIT_LSN, _take(changes, c.COMMIT_LSN, lineage))
    rows = rows.append_column(c.COMMIT_TIME, _take(changes, c.COMMIT_TIME, lineage))
    for name in k.identity_columns(dspec):
        rows = rows.append_column(name, _take(changes, name, lineage))
    return rows


def _write_mirror(
    path: str,
    dspec: c.TableSpec,
    changes: pa.Table,
    commit: CommitProperties,
    so: Any,
    *,
    opened: DeltaTable | None,
) -> None:
    table, schema = _ensure(path, SinkKind.MIRROR, dspec, so, opened)
    changes = _number_copies(dspec, table, changes, current_only=False)
    folded = fold_mirror(dspec, changes)
    truncate_row: int | None = None
    if folded is not None:
        lineage_rows, deleted_keys = folded
        rows = _rows(dspec, changes, lineage_rows)
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
    rows = _mirror_rows(dspec, changes, rows, lineage)
    if not _has_data(table):
        _append(table, align(rows, schema), commit)
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
        writer_properties=writer_properties(rows),
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
    array = contiguous(changes.column(column))
    return pc.fill_null(array.take(indices), pa.scalar(open_value, array.type))


def _history_rows(
    dspec: c.TableSpec,
    changes: pa.Table,
    rows: pa.Table,
    starts: np.ndarray[Any, Any],
    ends: np.ndarray[Any, Any],
) -> pa.Table:
    """History versions: the values of ``rows``, opened by change ``starts`` and closed by
    change ``ends`` (-1: still current)."""
    start_rows = pa.array(starts, pa.int64())
    rows = rows.append_column(c.OP, changes.column(c.OP).take(start_rows))
    rows = rows.append_column(VALID_FROM_LSN, changes.column(c.COMMIT_LSN).take(start_rows))
    rows = rows.append_column(VALID_TO_LSN, _ended(changes, c.COMMIT_LSN, ends, LSN_INFINITY))
    rows = rows.append_column(VALID_FROM_TIME, changes.column(c.COMMIT_TIME).take(start_rows))
    rows = rows.append_column(VALID_TO_TIME, _ended(changes, c.COMMIT_TIME, ends, TIME_INFINITY))
    rows = rows.append_column(IS_CURRENT, pa.array(ends < 0, pa.bool_()))
    for name in k.identity_columns(dspec):
        rows = rows.append_column(name, changes.column(name).take(start_rows))
    return rows


def _write_history(
    path: str,
    dspec: c.TableSpec,
    changes: pa.Table,
    commit: CommitProperties,
    so: Any,
    *,
    opened: DeltaTable | None,
) -> None:
    table, schema = _ensure(path, SinkKind.HISTORY, dspec, so, opened)
    changes = _number_copies(dspec, table, changes, current_only=True)
    folded = fold_history(dspec, changes)
    truncate_row: int | None = None
    if folded is not None:
        starts, ends = folded.starts, folded.ends
        rows = _rows(dspec, changes, pa.array(starts))
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
    rows = _history_rows(dspec, changes, rows, starts, ends)
    if (closed_keys.num_rows == 0 and truncate_row is None) or not _has_data(table):
        _append(table, align(rows, schema), commit)
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
    # The join is on the identity a close row closes, null on the rows inserting versions:
    # joined on the identity itself, each of a key's new versions met each of its versions in
    # the table (a filter after the equi-join), quadratic in a key's versions per batch (a
    # pgbench branch updated thousands of times a batch took seconds).
    closing_rows = pc.equal(source.column(_ACTION), "close")
    identity = k.identity_columns(dspec)
    for name in identity:
        source = source.append_column(
            _CLOSES + name, pc.if_else(closing_rows, source.column(name), None)
        )
    joined = " AND ".join(f"(t.{_quote(n)} = s.{_quote(_CLOSES + n)})" for n in identity)
    merger = table.merge(
        source,
        predicate=f"{joined} AND t.{IS_CURRENT}",
        source_alias="s",
        target_alias="t",
        commit_properties=commit,
        writer_properties=writer_properties(rows),
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


_SCHEMAS = {
    SinkKind.CHANGELOG: changelog_schema,
    SinkKind.MIRROR: _mirror_schema,
    SinkKind.HISTORY: _history_schema,
}

_WRITERS = {
    SinkKind.CHANGELOG: _write_changelog,
    SinkKind.MIRROR: _write_mirror,
    SinkKind.HISTORY: _write_history,
}


def initial_rows(
    kinds: Sequence[SinkKind], dspec: c.TableSpec, changes: pa.Table
) -> dict[SinkKind, pa.Table]:
    """What each of ``kinds``' writers appends to an empty table for ``changes`` (prepared):
    INSERTs of distinct rows, as an initial snapshot's chunk holds. The same builders as every
    batch's, so a snapshot landed from executors is what the change log path would have
    written; the folds are not run, as their outcome for such changes is known once they are
    checked to be that (once for all kinds): ``fold_mirror``'s lineage is every change in
    order, and ``fold_history`` opens a version at every change and closes none."""
    built = {}
    if SinkKind.CHANGELOG in kinds:
        built[SinkKind.CHANGELOG] = changes
    if SinkKind.MIRROR not in kinds and SinkKind.HISTORY not in kinds:
        return built
    # Into an empty table the copies are numbered alike for both kinds (current_only only
    # narrows what is read of the table).
    changes = _number_copies(dspec, None, changes, current_only=False)
    if not _distinct_inserts(dspec, changes):
        raise InvalidChangeBatch(
            f"{dspec.qualified_name}: an initial snapshot's rows must be INSERTs of distinct "
            "rows, but two share an identity; report this as a bug"
        )
    rows = _rows(dspec, changes, None)
    if SinkKind.MIRROR in kinds:
        built[SinkKind.MIRROR] = _mirror_rows(dspec, changes, rows, None)
    if SinkKind.HISTORY in kinds:
        every = np.arange(changes.num_rows, dtype=np.int64)
        ends = np.full(len(every), -1, dtype=np.int64)
        built[SinkKind.HISTORY] = _history_rows(dspec, changes, rows, every, ends)
    return built


def _distinct_inserts(dspec: c.TableSpec, changes: pa.Table) -> bool:
    """Whether ``changes`` are INSERTs (every column sent) of rows of distinct identities."""
    if changes.num_rows == 0:
        return True
    if not pc.all(pc.equal(changes.column(c.OP), c.INSERT)).as_py():
        return False
    if pc.any(pc.greater(pc.list_value_length(changes.column(c.UNCHANGED)), 0)).as_py():
        return False
    keys = list(k.identity_columns(dspec))
    if len(keys) == 1:
        key = contiguous(changes.column(keys[0]))
        ascending = pc.less(key.slice(0, len(key) - 1), key.slice(1))
        if pc.all(ascending, skip_nulls=False).as_py():
            return True  # ascending, as a table filled in key order is copied: no hashing
        distinct = pc.count_distinct(key, mode="all").as_py()
    else:
        distinct = changes.select(keys).group_by(keys, use_threads=False).aggregate([]).num_rows
    return bool(distinct == changes.num_rows)


def ensure_table(
    path: str, kind: SinkKind, dspec: c.TableSpec, storage_options: dict[str, str] | None
) -> DeltaTable:
    """The Delta table of ``kind`` at ``path``, created (or evolved) for ``dspec``."""
    table, _ = _ensure(path, kind, dspec, storage_options, _open(path, storage_options))
    return table


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
    compact_files: int = 0,
) -> WriteResult:
    """``write_table`` with the batch prepared on demand (a replay or an empty batch never
    needs it; the kinds of one table share it); ``compact_files``: see
    ``compact_if_fragmented`` (0: never)."""
    if kind is not SinkKind.CHANGELOG and not spec.has_usable_key:
        raise InvalidChangeBatch(
            f"{spec.qualified_name} has no usable replica identity, so it cannot have a "
            f"{kind.value} table; add a primary key, or ALTER TABLE {spec.qualified_name} "
            "REPLICA IDENTITY FULL (or USING INDEX), or write only its changelog"
        )
    existing = _open(path, storage_options)
    snapshot_at = None
    if existing is not None:
        done = existing.transaction_version(app_id)
        if done is not None and done >= version:
            return WriteResult(spec.qualified_name, kind, path, False, 0)
        snapshot_at = existing.transaction_version(app_id + SNAPSHOT_APP_SUFFIX)
    if rows and snapshot_at is not None:
        prepared = _committed_from(prepared, snapshot_at)
        rows = prepared()[1].num_rows
    if rows == 0:
        if existing is None:
            # The table exists, empty, once the sink was given it: readers find it, in its schema.
            dspec, _ = prepared()
            _ensure(path, kind, dspec, storage_options, None)
        return WriteResult(spec.qualified_name, kind, path, False, 0)
    if existing is not None and kind is not SinkKind.CHANGELOG:
        _check_keyed(path, spec, existing)
    dspec, batch = prepared()
    commit = _commit(app_id, version)
    _WRITERS[kind](path, dspec, batch, commit, storage_options, opened=existing)
    # The files the table held before this write, and the one at least it added: a fresh
    # look at the table only once they may reach the threshold.
    if compact_files and existing is not None and len(existing.file_uris()) + 1 >= compact_files:
        compact_if_fragmented(path, compact_files, storage_options)
    return WriteResult(spec.qualified_name, kind, path, True, batch.num_rows)


def compact_if_fragmented(
    path: str, files: int, storage_options: dict[str, str] | None = None
) -> dict[str, Any] | None:
    """Compact the table at ``path`` when it holds ``files`` or more files under the target
    size; returns delta-rs's metrics, or None when it did not. A failure is logged, not
    raised: the batch is written, and the table stays as it was (readable, only slower)."""
    table = DeltaTable(path, storage_options=storage_options)
    if len(table.file_uris()) < files:
        return None
    sizes = pa.table(table.get_add_actions(flatten=True)).column("size_bytes")
    small = pc.sum(pc.less(sizes, _TARGET_FILE_BYTES)).as_py() or 0
    if small < files:
        return None
    try:
        metrics: dict[str, Any] = table.optimize.compact(target_size=_TARGET_FILE_BYTES)
    except Exception as exc:  # the table is as it was: warn, go on
        log.warning(
            "%s: compacting its %d small files failed (%s); the table keeps them and the "
            "next batch tries again",
            path,
            small,
            exc,
        )
        return None
    log.info(
        "%s: %d small files compacted into %d",
        path,
        metrics.get("numFilesRemoved", 0),
        metrics.get("numFilesAdded", 0),
    )
    return metrics


def _committed_from(
    prepared: Callable[[], tuple[c.TableSpec, pa.Table]], lsn: int
) -> Callable[[], tuple[c.TableSpec, pa.Table]]:
    """``prepared`` less the changes committed before ``lsn`` (a snapshot taken there holds
    them)."""
    dspec, batch = prepared()
    if not len(batch) or pc.min(batch[c.COMMIT_LSN]).as_py() >= lsn:
        return prepared
    kept = batch.filter(pc.greater_equal(batch[c.COMMIT_LSN], pa.scalar(lsn, LSN_TYPE)))
    return lambda: (dspec, kept)


def _check_keyed(path: str, spec: c.TableSpec, table: DeltaTable) -> None:
    """A mirror or history written before rows were matched by ``_pgcdc_key`` cannot be
    continued: its rows have no key to match, and may already have merged rows wrongly."""
    names = table_schema(table).names
    if k.KEY in names or not _has_data(table):
        return
    raise SinkError(
        f"{path}: this {spec.qualified_name} table was written by an older pgcdc that matched "
        f"rows by their typed key values (no {k.KEY} column), which can merge distinct rows; "
        "rebuild it: move the table's directory away and load the table again from a fresh "
        "snapshot (the changelog table is not affected)"
    )


class DeltaSink:
    """Delta tables for many source tables under one root: ``<root>/<schema>/<table>/<kind>``,
    names mapped to path segments by ``pgcdc.sinks.paths``.

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
        compact_files: int = DEFAULT_COMPACT_FILES,
    ) -> None:
        """``compact_files``: compact a table once it holds that many small files (0: never;
        ``DEFAULT_COMPACT_FILES``)."""
        self.root = str(root).rstrip("/")
        self.compact_files = compact_files
        self.app_id = app_id
        self.kinds = tuple(kinds)
        self.table_kinds = {name: tuple(k) for name, k in (table_kinds or {}).items()}
        self.storage_options = storage_options
        self._warned: set[str] = set()
        self._checked: set[str] = set()

    def path(self, spec: c.TableSpec, kind: SinkKind) -> str:
        return table_path(self.root, spec.namespace, spec.name, kind)

    def checked_path(self, spec: c.TableSpec, kind: SinkKind) -> str:
        """``path``, once it is known not to leave behind a table an older pgcdc wrote elsewhere
        (a fresh table there would miss every row the old one holds)."""
        path = self.path(spec, kind)
        if path in self._checked:
            return path
        old = legacy_table_path(self.root, spec.namespace, spec.name, kind)
        so = self.storage_options
        if old is not None and _open(path, so) is None and _open(old, so) is not None:
            raise LakePathError(
                f"the {kind.value} table of {spec.qualified_name} is at {old}, where earlier "
                f"versions of pgcdc put it, but pgcdc now keeps it at {path} (lake paths escape "
                "every character but a-z, 0-9 and _, see docs/pipeline.md); stop the pipeline, "
                f"move {old} to {path} (a directory rename, or a copy of the prefix on an "
                "object store), and start it again"
            )
        self._checked.add(path)
        return path

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
                        self.checked_path(spec, kind),
                        spec,
                        prepared,
                        changes.num_rows,
                        kind,
                        app_id=self.app_id,
                        version=version,
                        storage_options=self.storage_options,
                        compact_files=self.compact_files,
                    )
                )
        return results
