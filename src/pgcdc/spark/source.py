"""``spark.readStream.format("pgcdc")``: the change log as a PySpark Python Data Source.

Offsets are commit LSNs (``{"lsn": "X/Y"}``): a micro-batch holds every transaction with
``start < commit_lsn <= end``, whole. Partitions are change log segments and carry what an
executor needs to decode them alone (the root, the segment, the LSN range and the type
definitions in force), so typing happens in the executors, in parallel.

Options:

``path``                  the change log root (a local path or any pyarrow filesystem URI)
``table``                 ``schema.table``: that table's typed columns plus metadata (the
                          layout of the Delta changelog table, ``pgcdc.sinks.delta``)
``format``                ``changes`` (default without ``table``): one row per change, values
                          as PostgreSQL text in a map; ``chunks``: the pipeline's internal form
``consumer``              change log consumer acknowledged by ``commit`` (default ``spark``)
``startingLsn``           first commit LSN to read (default: after the consumer's position)
``endingLsn``             last commit LSN to read (batch reads)
``maxChangesPerBatch``    read limit in log rows (``ReadMaxRows``); transactions stay whole
``maxBytesPerBatch``      read limit in change bytes (``ReadMaxBytes``); transactions stay whole
``rowsPerPartition``      split a segment into tasks of about this many log rows (100000)
``holdUntil``             a path on the driver: until a file is there, a micro-batch is taken
                          only when the read limits fill it (``pipeline run --once`` creates it
                          when its receiver has logged everything, so the backlog lands in as
                          few batches as the limits allow)
``decimal``/``temporal``  ``pgcdc.decoding.arrow.ArrowOptions``
``storage.<key>``         how to reach an ``s3://`` log (``pgcdc.storage.StorageOptions`` keys,
                          such as ``storage.aws_endpoint_url``); executors get them with their
                          partitions. Default: the environment's ``AWS_*``
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from pgcdc.changelog import ChangeLog, SegmentInfo
from pgcdc.changelog import segments as fmt
from pgcdc.changelog.codec import decode_rows, type_info_of, type_rows
from pgcdc.changelog.reader import FrameInfo, read_segment, segment_frames
from pgcdc.decoding.arrow import ArrowOptions, arrow_schema
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.decoding.state import table_from_dict, table_to_dict, type_from_dict, type_to_dict
from pgcdc.decoding.values import pg_text, row_to_python
from pgcdc.errors import InvalidOption
from pgcdc.events import (
    UNCHANGED_TOAST,
    Delete,
    Event,
    Insert,
    Row,
    Table,
    Truncate,
    Type,
    Update,
)
from pgcdc.lsn import LSN
from pgcdc.sinks.changes import TableSpec
from pgcdc.sinks.schema import align, delta_schema
from pgcdc.spark.changes import change_tables
from pgcdc.storage import StorageOptions

_MAX_LSN = (1 << 64) - 1
# A segment with more rows (in the batch's range) is read by several tasks in parallel.
DEFAULT_PARTITION_ROWS = 100_000

CHUNK_SCHEMA = pa.schema(
    [
        pa.field("table", pa.string(), nullable=False),
        pa.field("definition", pa.string(), nullable=False),
        pa.field("first_commit_lsn", pa.int64(), nullable=False),
        pa.field("first_seq", pa.int64(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("chunk", pa.binary(), nullable=False),
    ]
)
"""``format=chunks``: one row per run of a table's typed changes (a zstd-compressed Arrow IPC
stream in the sinks' contract; ``read_ipc`` reads it), so the driver gets typed data without
converting a value itself."""

TEXT_MAP = pa.map_(pa.string(), pa.string())
CHANGES_SCHEMA = pa.schema(
    [
        pa.field("op", pa.string(), nullable=False),
        pa.field("schema", pa.string(), nullable=False),
        pa.field("table", pa.string(), nullable=False),
        pa.field("commit_lsn", pa.int64(), nullable=False),
        pa.field("seq", pa.int64(), nullable=False),
        pa.field("lsn", pa.int64(), nullable=False),
        pa.field("xid", pa.int64()),
        pa.field("commit_time", pa.timestamp("us", tz="UTC")),
        pa.field("origin", pa.string()),
        pa.field("values", TEXT_MAP),
        pa.field("old_values", TEXT_MAP),
        pa.field("unchanged_toast", pa.list_(pa.string()), nullable=False),
    ]
)
"""Default ``format=changes``: every table in one schema; ``values``/``old_values`` map column
names to the PostgreSQL text form (SQL NULL is a null entry; an unchanged TOASTed value is
absent from ``values`` and named in ``unchanged_toast``)."""


def offset(lsn: int) -> dict[str, str]:
    return {"lsn": str(LSN(lsn))}


def offset_lsn(value: Mapping[str, Any]) -> LSN:
    try:
        return LSN.parse(str(value["lsn"]))
    except (KeyError, ValueError) as exc:
        raise InvalidOption(f"not a pgcdc offset: {value!r} ({exc})") from None


def _lsn_option(options: Mapping[str, str], name: str) -> LSN | None:
    text = options.get(name)
    if text is None:
        return None
    try:
        return LSN.parse(text) if "/" in text else LSN(int(text))
    except ValueError:
        raise InvalidOption(f"option {name}={text!r} is not an LSN: write it as 'X/Y'") from None


def _int_option(options: Mapping[str, str], name: str) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise InvalidOption(f"option {name}={text!r} must be a positive integer")
    return value


@dataclass(frozen=True)
class Settings:
    """The data source's options, checked once on the driver."""

    path: str
    mode: str
    table: str | None
    consumer: str
    starting_lsn: LSN | None
    ending_lsn: LSN | None
    max_rows: int | None
    max_bytes: int | None
    arrow: ArrowOptions
    partition_rows: int = DEFAULT_PARTITION_ROWS
    storage: StorageOptions = field(default_factory=StorageOptions)
    hold_until: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> Settings:
        path = options.get("path")
        if not path:
            raise InvalidOption(
                'the pgcdc data source needs the change log root: .option("path", ...) or '
                ".load(path)"
            )
        table = options.get("table")
        mode = options.get("format", "typed" if table else "changes")
        if mode not in ("typed", "changes", "chunks") or (mode == "typed") != bool(table):
            raise InvalidOption(
                f"format={mode!r}: use 'changes' or 'chunks', or give option table='schema.table'"
                " for typed columns"
            )
        if table is not None and table.count(".") < 1:
            raise InvalidOption(f"table={table!r}: write it as 'schema.table'")
        try:
            arrow = ArrowOptions(
                decimal=options.get("decimal", "precise"),  # type: ignore[arg-type]
                temporal=options.get("temporal", "precise"),  # type: ignore[arg-type]
            )
        except ValueError as exc:
            raise InvalidOption(str(exc)) from None
        return cls(
            path=path,
            mode=mode,
            table=table,
            consumer=options.get("consumer", "spark"),
            starting_lsn=_lsn_option(options, "startingLsn"),
            ending_lsn=_lsn_option(options, "endingLsn"),
            max_rows=_int_option(options, "maxChangesPerBatch"),
            max_bytes=_int_option(options, "maxBytesPerBatch"),
            arrow=arrow,
            partition_rows=_int_option(options, "rowsPerPartition") or DEFAULT_PARTITION_ROWS,
            storage=StorageOptions.from_spark_options(options),
            hold_until=options.get("holdUntil") or None,
        )


# --- what the executors run ------------------------------------------------------------------


class SegmentPartition(InputPartition):
    """One segment's transactions with ``low <= commit_lsn <= high``; picklable.

    ``rows``: only that range of the segment's rows (a big segment is split so that executors
    share it; the driver reorders runs by commit LSN, so a transaction may span two parts).
    ``types`` holds the definitions in force where the part's rows start (the driver reads a
    segment's Type rows once, so no part re-reads the rows before its range)."""

    def __init__(
        self,
        root: str,
        path: str,
        low: int,
        high: int,
        types: str,
        *,
        rows: tuple[int, int | None] | None = None,
        storage: StorageOptions | None = None,
    ) -> None:
        super().__init__((path, rows))
        self.root = root
        self.storage = storage
        self.path = path
        self.low = low
        self.high = high
        self.types = types
        self.rows = rows


def _types(text: str) -> dict[int, TypeInfo]:
    return {t.oid: t for t in (type_from_dict(d) for d in json.loads(text))}


# Chunks cross Python -> JVM rows -> the driver's Arrow -> Python: zstd (about 3x smaller on
# typical rows, fast both ways) cuts the bytes Spark copies in ``toArrow`` by as much.
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def _ipc(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue()


def read_ipc(data: bytes | pa.Buffer) -> pa.Table:
    return pa.ipc.open_stream(data).read_all()


def _segment_batches(partition: SegmentPartition) -> Iterator[pa.RecordBatch]:
    fs, _ = fmt.resolve(partition.root, None, partition.storage)
    # From the part's first row (a frame start at or before ``low``): rows below ``low`` still
    # define types (change_tables skips everything else below ``low``).
    return read_segment(partition.path, None, partition.high, filesystem=fs, rows=partition.rows)


def _typed_runs(partition: SegmentPartition, settings: Settings) -> Iterator[Any]:
    return change_tables(
        _segment_batches(partition),
        types=_types(partition.types),
        from_lsn=partition.low,
        options=settings.arrow,
    )


def read_chunks(partition: SegmentPartition, settings: Settings) -> Iterator[pa.RecordBatch]:
    for run in _typed_runs(partition, settings):
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "table": run.table.qualified_name,
                    "definition": json.dumps(table_to_dict(run.table), sort_keys=True),
                    "first_commit_lsn": run.first[0],
                    "first_seq": run.first[1],
                    "rows": run.changes.num_rows,
                    "chunk": _ipc(run.changes),
                }
            ],
            schema=CHUNK_SCHEMA,
        )


def spec_for(table: Table, changes_schema: pa.Schema) -> TableSpec:
    """The sinks' spec for a run: the table's columns with the types the executor gave them."""
    columns = pa.schema([changes_schema.field(col.name) for col in table.columns])
    return TableSpec(
        namespace=table.namespace,
        name=table.name,
        schema=columns,
        key_columns=tuple(col.name for col in table.key_columns),
        relation_lsn=LSN(0),
        replica_identity=table.replica_identity,
        source_columns=table.columns,
    )


def read_typed(
    partition: SegmentPartition, settings: Settings, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    from pgcdc.sinks.delta import prepare  # deltalake: only for these reads

    for run in _typed_runs(partition, settings):
        if run.table.qualified_name != settings.table:
            continue
        spec = spec_for(run.table, run.changes.schema)
        _, prepared = prepare(spec, run.changes)
        yield from align(prepared, schema).to_batches()


def _text_map(table: Table, row: Row | None, types: Mapping[int, TypeInfo]) -> Any:
    if row is None:
        return None
    typed = row_to_python(table, row, types)
    return [
        (col.name, None if value is None else raw if isinstance(raw, str) else pg_text(value))
        for col, raw, value in zip(table.columns, row, typed, strict=True)
        if raw is not UNCHANGED_TOAST
    ]


def read_changes(partition: SegmentPartition, settings: Settings) -> Iterator[pa.RecordBatch]:
    types = _types(partition.types)
    for batch in _segment_batches(partition):
        rows = []
        for row in decode_rows(batch):
            event = row.event
            if row.commit_lsn < partition.low or event is None:
                continue
            targets: list[tuple[str, Table, Row | None, Row | None]] = []
            if isinstance(event, Insert):
                targets.append(("insert", event.table, event.new, None))
            elif isinstance(event, Update):
                targets.append(("update", event.table, event.new, event.old))
            elif isinstance(event, Delete):
                targets.append(("delete", event.table, None, event.old))
            elif isinstance(event, Truncate):
                targets += [("truncate", t, None, None) for t in event.tables]
            for op, table, new, old in targets:
                unchanged = [
                    col.name
                    for col, raw in zip(table.columns, new or (), strict=False)
                    if raw is UNCHANGED_TOAST
                ]
                rows.append(
                    {
                        "op": op,
                        "schema": table.namespace,
                        "table": table.name,
                        "commit_lsn": int(row.commit_lsn),
                        "seq": row.seq,
                        "lsn": int(event.lsn),
                        "xid": row.xid,
                        "commit_time": row.commit_time,
                        "origin": row.origin,
                        "values": _text_map(table, new, types),
                        "old_values": _text_map(table, old, types),
                        "unchanged_toast": unchanged,
                    }
                )
        if rows:
            yield pa.RecordBatch.from_pylist(rows, schema=CHANGES_SCHEMA)


# --- driver side -----------------------------------------------------------------------------


def latest_table(log: ChangeLog, qualified_name: str) -> tuple[Table, dict[int, TypeInfo]] | None:
    """The newest definition of a table in the log (and the types in force), or None."""
    namespace, _, name = qualified_name.partition(".")
    for info in reversed(log.segments()):
        state = log.state_at(info)
        found: Table | None = None
        for batch in log.read_segment(info.path):
            mask = pc.and_(
                pc.equal(batch.column("namespace"), namespace),
                pc.equal(batch.column("name"), name),
            )
            hits = pc.indices_nonzero(pc.fill_null(mask, False))
            if len(hits):
                column = batch.column("table")
                index = column.indices[hits[-1].as_py()].as_py()
                found = table_from_dict(json.loads(column.dictionary[index].as_py()))
        if found is None:
            found = next(
                (t for t in state.relations.values() if t.qualified_name == qualified_name), None
            )
        if found is not None:
            return found, dict(state.types)
    return None


def typed_schema(settings: Settings) -> pa.Schema:
    """The Arrow schema of ``table=`` reads: the Delta changelog table's layout."""
    assert settings.table is not None
    found = latest_table(ChangeLog(settings.path, storage=settings.storage), settings.table)
    if found is None:
        raise InvalidOption(
            f"table {settings.table!r} does not appear in the change log at {settings.path}: "
            "check the name (schema.table) and that the publication includes it"
        )
    table, types = found
    schema = arrow_schema(table, types, settings.arrow)
    spec = spec_for(table, schema)
    from pgcdc.sinks.delta import changelog_schema  # deltalake: only for these reads

    return changelog_schema(replace(spec, schema=delta_schema(spec.schema)))


def _summary(log: ChangeLog, info: SegmentInfo, low: int, high: int) -> np.ndarray:
    """(commit_lsn, rows, bytes) per transaction of a segment in [low, high], in order."""
    commits: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    for batch in log.read_segment(info.path, low, high):
        commits.append(batch.column("commit_lsn").to_numpy())
        sizes.append(batch.column("size").to_numpy())
    if not commits:
        return np.zeros((0, 3), np.uint64)
    all_commits = np.concatenate(commits)
    all_sizes = np.concatenate(sizes)
    starts = np.flatnonzero(np.r_[True, all_commits[1:] != all_commits[:-1]])
    counts = np.diff(np.r_[starts, len(all_commits)])
    return np.stack([all_commits[starts], counts, all_sizes[starts]], axis=1).astype(np.uint64)


def _row_ranges(
    frames: list[FrameInfo], low: int, high: int, target: int
) -> list[tuple[int, int | None] | None]:
    """Row ranges of a segment's frames in [low, high] of about ``target`` rows each, cut at
    frame starts or inside frames; the first starts at 0 and the last is open-ended, so
    together they cover every row (``[None]``: the whole segment in one part)."""
    cuts: list[int] = []
    number = taken = 0
    for frame in frames:
        start = number
        number += frame.rows
        if frame.last_commit_lsn < low or frame.first_commit_lsn > high:
            continue
        while taken + (number - start) > target:
            start += target - taken
            cuts.append(start)
            taken = 0
        taken += number - start
    if not cuts:
        return [None]
    bounds: list[int] = [0, *cuts]
    ends: list[int | None] = [*cuts, None]
    return [(a, b) for a, b in zip(bounds, ends, strict=True)]


def _first_row(frames: list[FrameInfo], low: int) -> int:
    """The segment's row number where the first frame with a transaction at or after ``low``
    starts (the row count when there is none)."""
    number = 0
    for frame in frames:
        if frame.last_commit_lsn >= low:
            return number
        number += frame.rows
    return number


@dataclass
class SegmentTypes:
    """The type definitions in force along one segment's rows, read by the driver once per
    segment (incrementally, as batches move through it)."""

    path: str
    base: dict[int, TypeInfo]
    scanned: int = 0
    # (first row it holds for, the definitions), ascending: one step per Type row.
    steps: list[tuple[int, dict[int, TypeInfo]]] = field(default_factory=list)

    def at(self, row: int, frames: list[FrameInfo], filesystem: Any) -> dict[int, TypeInfo]:
        """The definitions in force for the segment's row ``row`` (rows before it read)."""
        if row > self.scanned:
            self._scan(row, frames, filesystem)
        found = self.base
        for start, types in self.steps:
            if start > row:
                break
            found = types
        return found

    def _scan(self, stop: int, frames: list[FrameInfo], filesystem: Any) -> None:
        """Take in the Type rows before ``stop``, reading only the frames that may hold one."""
        for low, high in self._ranges_to_read(stop, frames):
            number = low
            for batch in read_segment(self.path, filesystem=filesystem, rows=(low, high)):
                is_type = type_rows(batch)
                if pc.any(is_type).as_py():
                    positions = pc.indices_nonzero(is_type).to_pylist()
                    rows = decode_rows(batch.filter(is_type))
                    for position, row in zip(positions, rows, strict=True):
                        self._add_step(number + position + 1, row.event)
                number += batch.num_rows
        self.scanned = stop

    def _ranges_to_read(self, stop: int, frames: list[FrameInfo]) -> list[list[int]]:
        """Row ranges in [scanned, stop) of the frames not noted as free of Type rows,
        neighbouring frames merged into one read."""
        ranges: list[list[int]] = []
        end = 0
        for frame in frames:
            start, end = end, end + frame.rows
            if start >= stop:
                break
            if end <= self.scanned or frame.holds_type_rows is False:
                continue
            low, high = max(start, self.scanned), min(end, stop)
            if ranges and ranges[-1][1] == low:
                ranges[-1][1] = high
            else:
                ranges.append([low, high])
        return ranges

    def _add_step(self, first_row: int, event: Event | None) -> None:
        """The definitions in force from ``first_row`` on, after the Type row ``event``."""
        assert isinstance(event, Type)
        types = dict(self.steps[-1][1] if self.steps else self.base)
        types[event.oid] = type_info_of(event)
        self.steps.append((first_row, types))


class _Reader:
    """What the batch and stream readers share: planning partitions over the log."""

    def __init__(self, settings: Settings, schema: pa.Schema | None) -> None:
        self.settings = settings
        self.schema = schema
        self.log = ChangeLog(settings.path, storage=settings.storage)
        self.segment_types: dict[str, SegmentTypes] = {}

    def plan(self, low: int, high: int) -> list[SegmentPartition]:
        parts: list[SegmentPartition] = []
        if high < low:
            return parts
        fs = self.log.filesystem
        segments = self.log.segments()
        live = {info.path for info in segments}
        for path in [p for p in self.segment_types if p not in live]:
            del self.segment_types[path]  # released
        for info in segments:
            assert info.first_commit_lsn is not None
            if info.last_commit_lsn < low or info.first_commit_lsn > high:
                continue
            known = self.segment_types.get(info.path)
            if known is None:
                known = SegmentTypes(info.path, dict(self.log.state_at(info).types))
                self.segment_types[info.path] = known
            frames = segment_frames(info.path, filesystem=fs)
            first = _first_row(frames, low)
            for rows in _row_ranges(frames, low, high, self.settings.partition_rows):
                start, stop = rows if rows is not None else (0, None)
                start = max(start, first)
                types = known.at(start, frames, fs)
                parts.append(
                    SegmentPartition(
                        self.settings.path,
                        info.path,
                        low,
                        high,
                        json.dumps([type_to_dict(t) for t in types.values()]),
                        rows=(start, stop),
                        storage=self.settings.storage,
                    )
                )
        return parts

    def read_partition(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, SegmentPartition):
            # pyspark reads one partition of its own when the reader plans none: nothing to read.
            return iter(())
        if self.settings.mode == "chunks":
            return read_chunks(partition, self.settings)
        if self.settings.mode == "typed":
            assert self.schema is not None
            return read_typed(partition, self.settings, self.schema)
        return read_changes(partition, self.settings)


class PgcdcBatchReader(_Reader, DataSourceReader):
    def partitions(self) -> list[SegmentPartition]:
        low = self.settings.starting_lsn or 0
        high = self.settings.ending_lsn if self.settings.ending_lsn is not None else _MAX_LSN
        return self.plan(low, high)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.read_partition(partition)


class PgcdcStreamReader(_Reader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, settings: Settings, schema: pa.Schema | None) -> None:
        super().__init__(settings, schema)
        self.pinned_end: LSN | None = settings.ending_lsn
        self._held = settings.hold_until is not None

    def initialOffset(self) -> dict[str, str]:  # noqa: N802 - Spark's name
        if self.settings.starting_lsn is not None:
            return offset(max(0, int(self.settings.starting_lsn) - 1))
        return offset(self.log.register_consumer(self.settings.consumer))

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        if self.settings.max_rows is not None:
            return ReadMaxRows(self.settings.max_rows)
        if self.settings.max_bytes is not None:
            return ReadMaxBytes(self.settings.max_bytes)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        self.pinned_end = self._available()

    def _available(self) -> LSN:
        last = self.log.last_commit_lsn()
        if self.settings.ending_lsn is not None:
            last = min(last, self.settings.ending_lsn)
        return LSN(last)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, str]:  # noqa: N802
        low = offset_lsn(start)
        max_rows = self.settings.max_rows
        max_bytes = self.settings.max_bytes
        if isinstance(limit, ReadMaxRows):
            max_rows = min(max_rows or limit.max_rows, limit.max_rows)
        elif isinstance(limit, ReadMaxBytes):
            max_bytes = min(max_bytes or limit.max_bytes, limit.max_bytes)
        limited = max_rows is not None or max_bytes is not None
        if self._held and os.path.exists(self.settings.hold_until or ""):
            self._held = False
        if self._held and not limited:
            return offset(low)
        high = self.pinned_end if self.pinned_end is not None else self._available()
        high = LSN(max(high, low))
        if high == low or not limited:
            return offset(high)
        end, full = self._limited(low, high, max_rows, max_bytes)
        # Held, only a batch the limits fill: a partial one would soon be followed by more,
        # each paying Spark's and Delta's fixed costs on cores the receiver needs.
        return offset(end if full or not self._held else low)

    def _limited(
        self, low: LSN, high: LSN, max_rows: int | None, max_bytes: int | None
    ) -> tuple[LSN, bool]:
        """The last commit LSN in (low, high] within the limits (at least one transaction), and
        whether a limit ended the batch there (rather than what the log holds)."""
        rows = size = 0
        end = low
        for info in self.log.segments():
            if info.last_commit_lsn <= low:
                continue
            assert info.first_commit_lsn is not None
            if info.first_commit_lsn > high:
                break
            summary = _summary(self.log, info, int(low) + 1, int(high))
            for commit, count, nbytes in summary.tolist():
                rows += count
                size += nbytes
                over = (max_rows is not None and rows > max_rows) or (
                    max_bytes is not None and size > max_bytes
                )
                if over and end > low:
                    return end, True
                end = LSN(commit)
        return end, False

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[SegmentPartition]:
        return self.plan(int(offset_lsn(start)) + 1, int(offset_lsn(end)))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self.read_partition(partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Spark finished every batch up to ``end``: the log may drop what all consumers passed."""
        self.log.register_consumer(self.settings.consumer)
        self.log.acknowledge(self.settings.consumer, offset_lsn(end))
        self.log.release()


class PgcdcDataSource(DataSource):
    """Register with ``spark.dataSource.register(PgcdcDataSource)``; see the module docs."""

    @classmethod
    def name(cls) -> str:
        return "pgcdc"

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.settings = Settings.parse(options)

    def arrow_schema(self) -> pa.Schema:
        if self.settings.mode == "chunks":
            return CHUNK_SCHEMA
        if self.settings.mode == "changes":
            return CHANGES_SCHEMA
        return typed_schema(self.settings)

    def schema(self) -> StructType:
        spark_schema: StructType = from_arrow_schema(self.arrow_schema())
        return spark_schema

    def _given(self, schema: StructType) -> pa.Schema | None:
        return self.arrow_schema() if self.settings.mode == "typed" else None

    def reader(self, schema: StructType) -> DataSourceReader:
        return PgcdcBatchReader(self.settings, self._given(schema))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return PgcdcStreamReader(self.settings, self._given(schema))


__all__ = [
    "CHANGES_SCHEMA",
    "CHUNK_SCHEMA",
    "PgcdcDataSource",
    "PgcdcStreamReader",
    "SegmentPartition",
    "Settings",
    "read_ipc",
    "spec_for",
]
