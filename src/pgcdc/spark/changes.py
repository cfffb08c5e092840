"""Change log record batches -> typed change tables in the sinks' contract. Pure: no IO.

This is what a Spark executor runs on its share of the log: rows of each source table become
one Arrow table per run of changes that share a table definition (``pgcdc.sinks.changes``),
so a Relation change mid-batch (an added or dropped column) starts a new run and the driver
can write the runs in order with the right ``TableSpec`` each.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.changelog.codec import DecodedRow, decode_rows
from pgcdc.decoding.arrow import DEFAULT_OPTIONS, ArrowOptions, rows_to_arrow
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.errors import DecodeError
from pgcdc.events import Delete, Insert, RawValue, Row, Table, Truncate, Type, Update
from pgcdc.sinks import changes as c

# Enough rows to amortise the per-chunk costs, few enough to keep one Spark row small.
DEFAULT_CHUNK_ROWS = 20_000


@dataclass(frozen=True, slots=True)
class TableChanges:
    """A run of one table's changes under one definition, in the sinks' input contract.

    ``first`` is the (commit LSN, seq) of its first change: runs of a table sort by it.
    """

    table: Table
    first: tuple[int, int]
    changes: pa.Table


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
            raise DecodeError(
                f"transaction {row.commit_lsn} has no commit time in the change log; the Delta "
                "sinks need one (pgoutput always sends it; enable include-timestamp with "
                "test_decoding)"
            )
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
        pa.array(run.seq, pa.uint32()),
        pa.array(run.lsn, pa.uint64()),
        pa.array(run.xid, pa.int64()),
        pa.array(run.commit_time, c.COMMIT_TIME_TYPE),
        pa.array(run.origin, pa.string()),
        typed.column(options.unchanged_column),
        typed.column(options.text_column),
        old,
    ]
    schema = pa.schema(
        [typed.schema.field(i) for i in range(width)]
        + [pa.field(f.name, f.type, f.nullable) for f in c.METADATA_FIELDS]
        + [pa.field(c.OLD, old.type)]
    )
    table = pa.Table.from_arrays(arrays, schema=schema)
    return TableChanges(run.table, (run.commit_lsn[0], run.seq[0]), table)


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


def change_tables(
    batches: Iterable[pa.RecordBatch],
    *,
    types: Mapping[int, TypeInfo] | None = None,
    from_lsn: int = 0,
    options: ArrowOptions = DEFAULT_OPTIONS,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> Iterator[TableChanges]:
    """The INSERT/UPDATE/DELETE/TRUNCATE rows of change log ``batches`` (log order) with
    commit LSN >= ``from_lsn``, typed, as runs per table; earlier rows only contribute the
    Type definitions they carry (``types`` holds those in force before the first batch)."""
    known: dict[int, TypeInfo] = dict(types or {})
    runs: dict[str, _Run] = {}

    def run_for(table: Table) -> Iterator[TableChanges]:
        name = table.qualified_name
        run = runs.get(name)
        if run is not None and (run.table != table or len(run.ops) >= chunk_rows):
            yield _build(run, options, known)
            run = None
        if run is None:
            runs[name] = _Run(table)

    for batch in batches:
        for row in decode_rows(_kind_filter(batch, from_lsn)):
            event = row.event
            if isinstance(event, Type):
                known[event.oid] = TypeInfo(event.oid, event.namespace, event.name)
                continue
            if row.commit_lsn < from_lsn or event is None:
                continue
            if isinstance(event, Insert):
                yield from run_for(event.table)
                runs[event.table.qualified_name].add(row, c.INSERT, event.new, None, event.lsn)
            elif isinstance(event, Update):
                yield from run_for(event.table)
                runs[event.table.qualified_name].add(row, c.UPDATE, event.new, event.old, event.lsn)
            elif isinstance(event, Delete):
                yield from run_for(event.table)
                empty: Row = (None,) * len(event.table.columns)
                runs[event.table.qualified_name].add(row, c.DELETE, empty, event.old, event.lsn)
            elif isinstance(event, Truncate):
                for table in event.tables:
                    yield from run_for(table)
                    nothing: tuple[RawValue, ...] = (None,) * len(table.columns)
                    runs[table.qualified_name].add(row, c.TRUNCATE, nothing, None, event.lsn)
    for run in runs.values():
        if run.ops:
            yield _build(run, options, known)


__all__ = ["DEFAULT_CHUNK_ROWS", "TableChanges", "change_tables"]
