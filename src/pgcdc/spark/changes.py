"""Change log record batches -> typed change tables in the sinks' contract. Pure: no IO.

This is what a Spark executor runs on its share of the log: rows of each source table become
one Arrow table per run of changes that share a table definition (``pgcdc.sinks.changes``),
so a Relation change mid-batch (an added or dropped column) starts a new run and the driver
can write the runs in order with the right ``TableSpec`` each.

Columnar: a batch's change rows are grouped per table with Arrow/numpy and typed per table by
``rows_to_arrow`` in one call; metadata columns are taken from the log's columns as they are.
No per-row Python here except building the row objects ``rows_to_arrow`` reads. A batch
holding a TRUNCATE (rare: it names several tables in one row) goes through ``decode_rows``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.changelog.codec import DecodedRow, decode_rows, table_from_dict, type_info_of
from pgcdc.decoding import columnar
from pgcdc.decoding.arrow import (
    COLUMNAR_MIN_ROWS,
    DEFAULT_OPTIONS,
    ArrowOptions,
    framed_to_arrow,
    rows_to_arrow,
)
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.errors import CorruptChangeLog, DecodeError
from pgcdc.events import (
    Delete,
    EncodedRow,
    Insert,
    RawValue,
    Row,
    Table,
    Truncate,
    Type,
    Update,
    encode_tuple_data,
)
from pgcdc.sinks import changes as c
from pgcdc.sinks.schema import contiguous

# Enough rows to amortise the per-chunk costs (one Spark row, one IPC stream, one concat on the
# driver), few enough to keep one Spark row well under Spark's 2 GiB binary limit.
DEFAULT_CHUNK_ROWS = 100_000

_CHANGE_KINDS = pa.array([c.INSERT, c.UPDATE, c.DELETE, c.TRUNCATE], pa.string())
_NO_COMMIT_TIME = (
    "transaction {lsn} has no commit time in the change log; the Delta sinks need one "
    "(pgoutput always sends it; enable include-timestamp with test_decoding)"
)


@dataclass(frozen=True, slots=True)
class TableChanges:
    """A run of one table's changes under one definition, in the sinks' input contract.

    ``first`` is the (commit LSN, seq) of its first change: runs of a table sort by it.
    """

    table: Table
    first: tuple[int, int]
    changes: pa.Table


# --- the columnar path -----------------------------------------------------------------------


def _rows(column: pa.Array, empty: EncodedRow) -> list[Row]:
    """A binary column of TupleData as rows for ``rows_to_arrow`` (``empty`` for nulls)."""
    return [empty if data is None else EncodedRow(data) for data in column.to_pylist()]


def tuples_to_arrow(
    table: Table,
    column: pa.Array,
    options: ArrowOptions,
    types: Mapping[int, TypeInfo],
) -> pa.RecordBatch:
    """``rows_to_arrow`` of a binary column of TupleData (nulls read as all-null rows), framed
    where the column's buffer already holds them: no Python object per row (making one bytes
    and one EncodedRow per row took two thirds of the executors' typing time). Small columns,
    and any the columnar reader rejects, go through ``rows_to_arrow`` as before: it decodes
    them the same way, or says what is wrong."""
    width = len(table.columns)
    empty = encode_tuple_data((None,) * width)
    if len(column) < COLUMNAR_MIN_ROWS:
        return rows_to_arrow(table, _rows(column, EncodedRow(empty)), options, types)
    filled = pc.fill_null(column, pa.scalar(empty, pa.binary())) if column.null_count else column
    filled = contiguous(filled) if isinstance(filled, pa.ChunkedArray) else filled
    offsets = np.frombuffer(filled.buffers()[1], np.int32)[filled.offset :][: len(filled) + 1]
    offsets = offsets.astype(np.int64)
    values = filled.buffers()[2]
    data = [] if values is None else [values[int(offsets[0]) : int(offsets[-1])]]
    ends = offsets[1:] - offsets[0]
    starts = offsets[:-1] - offsets[0]
    framed = columnar.frame_rows(columnar.WireBuffer.joined(data), starts, ends, width)
    if framed is None:
        return rows_to_arrow(table, _rows(column, EncodedRow(empty)), options, types)
    return framed_to_arrow(table, *framed, options, types)


def _old_struct(
    table: Table,
    old: pa.Array,
    options: ArrowOptions,
    types: Mapping[int, TypeInfo],
) -> tuple[pa.StructArray, pa.Array]:
    """``_old``: the old key or row where the log has one, else null; typed like the row. And
    ``_old_text``: the text forms of its values the typed fields cannot hold."""
    present = old.is_valid()
    width = len(table.columns)
    if old.null_count == len(old):
        schema = rows_to_arrow(table, [], options, types).schema
        struct = pa.struct([schema.field(i) for i in range(width)])
        return pa.nulls(len(old), struct), pa.nulls(len(old), c.TEXT_TYPE)
    typed = tuples_to_arrow(table, old.filter(present), options, types)
    fields = [
        pa.field(typed.schema.field(i).name, typed.schema.field(i).type) for i in range(width)
    ]
    text = typed.column(options.text_column)
    if old.null_count == 0:
        children = [typed.column(i) for i in range(width)]
        return pa.StructArray.from_arrays(children, fields=fields), text
    mask = present.to_numpy(zero_copy_only=False)
    where = pa.array(np.cumsum(mask) - 1, pa.int64(), mask=~mask)
    children = [typed.column(i).take(where) for i in range(width)]
    struct = pa.StructArray.from_arrays(children, fields=fields, mask=pc.invert(present))
    return struct, text.take(where)


def _typed(
    table: Table, rows: pa.RecordBatch, options: ArrowOptions, types: Mapping[int, TypeInfo]
) -> pa.Table:
    """One table's INSERT/UPDATE/DELETE rows of a change log batch as a change table."""
    commit_time = rows.column("commit_time")
    if commit_time.null_count:
        lsn = pc.filter(rows.column("commit_lsn"), commit_time.is_null())[0].as_py()
        raise DecodeError(_NO_COMMIT_TIME.format(lsn=lsn))
    ops = rows.column("kind").cast(pa.string())
    is_delete = pc.equal(ops, c.DELETE)
    new, old = rows.column("new"), rows.column("old")
    if (
        pc.any(pc.and_(pc.invert(is_delete), new.is_null())).as_py()
        or pc.any(pc.and_(is_delete, old.is_null())).as_py()
    ):
        raise CorruptChangeLog("a change row the event requires is missing from the change log")
    typed = tuples_to_arrow(table, new, options, types)
    old_typed = _old_struct(table, old, options, types)
    metadata = [
        ops,
        rows.column("commit_lsn"),
        rows.column("seq").cast(pa.int64()),
        rows.column("lsn"),
        rows.column("xid").cast(pa.int64()),
        commit_time,
        rows.column("origin"),
    ]
    return _change_table(table, typed, metadata, old_typed, options)


def _change_table(
    table: Table,
    typed: pa.RecordBatch,
    metadata: list[pa.Array],
    old: tuple[pa.Array, pa.Array],
    options: ArrowOptions,
) -> pa.Table:
    """A change table from the typed new rows (``rows_to_arrow``'s batch), the metadata
    columns (``c.METADATA_FIELDS`` but the last two, which the typed rows hold), and ``_old``
    and ``_old_text`` (``_old_struct``)."""
    old_struct, old_text = old
    width = len(table.columns)
    arrays = [typed.column(i) for i in range(width)]
    arrays += [
        *metadata,
        typed.column(options.unchanged_column),
        typed.column(options.text_column),
        old_struct,
        old_text,
    ]
    schema = pa.schema(
        [typed.schema.field(i) for i in range(width)]
        + [pa.field(f.name, f.type, f.nullable) for f in c.METADATA_FIELDS]
        + [pa.field(c.OLD, old_struct.type), pa.field(c.OLD_TEXT, c.TEXT_TYPE)]
    )
    return pa.Table.from_arrays(arrays, schema=schema)


def insert_changes(
    table: Table,
    typed: pa.RecordBatch,
    *,
    commit_lsn: int,
    lsn: int,
    commit_time: datetime,
    types: Mapping[int, TypeInfo],
    first_seq: int = 0,
    options: ArrowOptions = DEFAULT_OPTIONS,
) -> pa.Table:
    """INSERTs of ``typed`` (rows typed by ``rows_to_arrow`` or its columnar equivalents, as
    ``tuples_to_arrow`` types a change log column) in one transaction, as the change table
    ``_typed`` makes of such rows logged: an initial snapshot's chunk copied outside the change
    log. ``_seq`` counts up from ``first_seq``."""
    count = typed.num_rows
    old = _old_struct(table, pa.nulls(count, pa.binary()), options, types)
    metadata = [
        pa.repeat(pa.scalar(c.INSERT, pa.string()), count),
        pa.repeat(pa.scalar(commit_lsn, pa.uint64()), count),
        pa.array(np.arange(first_seq, first_seq + count, dtype=np.int64)),
        pa.repeat(pa.scalar(lsn, pa.uint64()), count),
        pa.nulls(count, pa.int64()),
        pa.repeat(pa.scalar(commit_time, c.COMMIT_TIME_TYPE), count),
        pa.nulls(count, pa.string()),
    ]
    return _change_table(table, typed, metadata, old, options)


class _Definitions:
    """Table definitions by their JSON text (each batch's dictionary repeats them)."""

    def __init__(self) -> None:
        self._tables: dict[str, Table] = {}

    def get(self, text: str) -> Table:
        table = self._tables.get(text)
        if table is None:
            table = self._tables[text] = table_from_dict(json.loads(text))
        return table


def _columnar_pieces(
    rows: pa.RecordBatch,
    definitions: _Definitions,
    options: ArrowOptions,
    types: Mapping[int, TypeInfo],
) -> Iterator[TableChanges]:
    """Runs of one table under one definition in ``rows`` (INSERT/UPDATE/DELETE only)."""
    column = rows.column("table")
    if column.null_count:
        raise CorruptChangeLog("a change row in the change log has no table definition")
    indices = column.indices.to_numpy(zero_copy_only=False)
    texts = column.dictionary.to_pylist()
    used, first_positions = np.unique(indices, return_index=True)
    by_name: dict[str, list[int]] = {}
    for index in used[np.argsort(first_positions)].tolist():
        by_name.setdefault(definitions.get(texts[index]).qualified_name, []).append(index)
    for entries in by_name.values():
        positions = np.flatnonzero(np.isin(indices, entries))
        own = indices[positions]
        starts = np.flatnonzero(np.r_[True, own[1:] != own[:-1]])
        ends = np.r_[starts[1:], len(positions)]
        for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
            table = definitions.get(texts[int(own[start])])
            part = rows.take(pa.array(positions[start:end]))
            changes = _typed(table, part, options, types)
            first = (int(part.column("commit_lsn")[0].as_py()), int(part.column("seq")[0].as_py()))
            yield TableChanges(table, first, changes)


# --- the per-row path (batches with a TRUNCATE) ----------------------------------------------


@dataclass
class _Run:
    table: Table
    ops: list[str] = field(default_factory=list)
    new: list[Row] = field(default_factory=list)
    old: list[Row | None] = field(default_factory=list)
    commit_lsn: list[int] = field(default_factory=list)
    seq: list[int] = field(default_factory=list)
    lsn: list[int] = field(default_factory=list)
    xid: list[int | None] = field(default_factory=list)
    commit_time: list[datetime] = field(default_factory=list)
    origin: list[str | None] = field(default_factory=list)

    def add(self, row: DecodedRow, op: str, new: Row, old: Row | None, lsn: int) -> None:
        if row.commit_time is None:
            raise DecodeError(_NO_COMMIT_TIME.format(lsn=row.commit_lsn))
        self.ops.append(op)
        self.new.append(new)
        self.old.append(old)
        self.commit_lsn.append(int(row.commit_lsn))
        self.seq.append(row.seq)
        self.lsn.append(lsn)
        self.xid.append(row.xid)
        self.commit_time.append(row.commit_time)
        self.origin.append(row.origin)


def _build(run: _Run, options: ArrowOptions, types: Mapping[int, TypeInfo]) -> TableChanges:
    typed = rows_to_arrow(run.table, run.new, options, types)
    width = len(run.table.columns)
    nulls: Row = (None,) * width
    olds = rows_to_arrow(
        run.table, [o if o is not None else nulls for o in run.old], options, types
    )
    old = pa.StructArray.from_arrays(
        [olds.column(i) for i in range(width)],
        fields=[pa.field(f.name, f.type) for f in typed.schema][:width],
        mask=pa.array([o is None for o in run.old], pa.bool_()),
    )
    arrays = [typed.column(i) for i in range(width)]
    arrays += [
        pa.array(run.ops, pa.string()),
        pa.array(run.commit_lsn, pa.uint64()),
        pa.array(run.seq, pa.int64()),
        pa.array(run.lsn, pa.uint64()),
        pa.array(run.xid, pa.int64()),
        pa.array(run.commit_time, c.COMMIT_TIME_TYPE),
        pa.array(run.origin, pa.string()),
        typed.column(options.unchanged_column),
        typed.column(options.text_column),
        old,
        pc.if_else(old.is_valid(), olds.column(options.text_column), pa.scalar(None, c.TEXT_TYPE)),
    ]
    schema = pa.schema(
        [typed.schema.field(i) for i in range(width)]
        + [pa.field(f.name, f.type, f.nullable) for f in c.METADATA_FIELDS]
        + [pa.field(c.OLD, old.type), pa.field(c.OLD_TEXT, c.TEXT_TYPE)]
    )
    table = pa.Table.from_arrays(arrays, schema=schema)
    return TableChanges(run.table, (run.commit_lsn[0], run.seq[0]), table)


def _row_pieces(
    rows: pa.RecordBatch, options: ArrowOptions, types: Mapping[int, TypeInfo]
) -> Iterator[TableChanges]:
    """Like ``_columnar_pieces``, event by event: for batches holding a TRUNCATE."""
    runs: dict[str, _Run] = {}

    def run_for(table: Table) -> Iterator[TableChanges]:
        run = runs.get(table.qualified_name)
        if run is not None and run.table != table:
            yield _build(run, options, types)
            run = None
        if run is None:
            runs[table.qualified_name] = _Run(table)

    for row in decode_rows(rows):
        event = row.event
        if isinstance(event, Insert | Update | Delete):
            yield from run_for(event.table)
            run = runs[event.table.qualified_name]
            if isinstance(event, Insert):
                run.add(row, c.INSERT, event.new, None, event.lsn)
            elif isinstance(event, Update):
                run.add(row, c.UPDATE, event.new, event.old, event.lsn)
            else:
                empty: Row = (None,) * len(event.table.columns)
                run.add(row, c.DELETE, empty, event.old, event.lsn)
        elif isinstance(event, Truncate):
            for table in event.tables:
                yield from run_for(table)
                nothing: tuple[RawValue, ...] = (None,) * len(table.columns)
                runs[table.qualified_name].add(row, c.TRUNCATE, nothing, None, event.lsn)
    for run in runs.values():
        if run.ops:
            yield _build(run, options, types)


# --- batches -> runs -------------------------------------------------------------------------


def _kind_filter(batch: pa.RecordBatch, low: int) -> pa.RecordBatch:
    """Rows at or after ``low``, plus the Type rows before it (their definitions still count)."""
    commits = batch.column("commit_lsn")
    if batch.num_rows == 0 or pc.min(commits).as_py() >= low:
        return batch
    keep = pc.or_(
        pc.greater_equal(commits, pa.scalar(low, pa.uint64())),
        pc.equal(batch.column("kind").cast(pa.string()), "type"),
    )
    return batch.filter(keep)


class _Pending:
    """A table's pieces under one definition, waiting to be yielded as one run."""

    def __init__(self, piece: TableChanges) -> None:
        self.table = piece.table
        self.first = piece.first
        self.parts = [piece.changes]
        self.rows = piece.changes.num_rows

    def fits(self, piece: TableChanges) -> bool:
        return piece.table == self.table and piece.changes.schema.equals(self.parts[0].schema)

    def add(self, piece: TableChanges) -> None:
        self.parts.append(piece.changes)
        self.rows += piece.changes.num_rows

    def runs(self, chunk_rows: int) -> Iterator[TableChanges]:
        data = pa.concat_tables(self.parts) if len(self.parts) > 1 else self.parts[0]
        for start in range(0, data.num_rows, chunk_rows):
            part = data.slice(start, chunk_rows)
            lsn, seq = part.column(c.COMMIT_LSN)[0].as_py(), part.column(c.SEQ)[0].as_py()
            yield TableChanges(self.table, (int(lsn), int(seq)), part)


def change_tables(
    batches: Iterable[pa.RecordBatch],
    *,
    types: Mapping[int, TypeInfo] | None = None,
    from_lsn: int = 0,
    options: ArrowOptions = DEFAULT_OPTIONS,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Iterator[TableChanges]:
    """The INSERT/UPDATE/DELETE/TRUNCATE rows of change log ``batches`` (log order) with
    commit LSN >= ``from_lsn``, typed, as runs per table of at most ``chunk_rows`` rows;
    earlier rows only contribute the Type definitions they carry (``types`` holds those in
    force before the first batch). A batch is typed with the types known at its end: the
    server sends a Type before the first change that uses it."""
    known: dict[int, TypeInfo] = dict(types or {})
    definitions = _Definitions()
    pending: dict[str, _Pending] = {}
    low = pa.scalar(from_lsn, pa.uint64())
    for logged in batches:
        batch = _kind_filter(logged, from_lsn)
        if batch.num_rows == 0:
            continue
        kinds = batch.column("kind").cast(pa.string())
        is_type = pc.equal(kinds, "type")
        if pc.any(is_type).as_py():
            for row in decode_rows(batch.filter(is_type)):
                event = row.event
                assert isinstance(event, Type)
                known[event.oid] = type_info_of(event)
        wanted = pc.and_(
            pc.is_in(kinds, value_set=_CHANGE_KINDS),
            pc.greater_equal(batch.column("commit_lsn"), low),
        )
        rows = batch.filter(wanted)
        if rows.num_rows == 0:
            continue
        if pc.any(pc.equal(rows.column("kind").cast(pa.string()), c.TRUNCATE)).as_py():
            pieces = _row_pieces(rows, options, known)
        else:
            pieces = _columnar_pieces(rows, definitions, options, known)
        for piece in pieces:
            name = piece.table.qualified_name
            waiting = pending.get(name)
            if waiting is not None and waiting.fits(piece):
                waiting.add(piece)
            else:
                if waiting is not None:
                    yield from waiting.runs(chunk_rows)
                waiting = pending[name] = _Pending(piece)
            if waiting.rows >= chunk_rows:
                yield from waiting.runs(chunk_rows)
                del pending[name]
    for waiting in pending.values():
        yield from waiting.runs(chunk_rows)


__all__ = [
    "DEFAULT_CHUNK_ROWS",
    "TableChanges",
    "change_tables",
    "insert_changes",
    "tuples_to_arrow",
]
