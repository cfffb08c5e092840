"""The initial snapshot copied by Spark tasks straight into the Delta tables.

The driver creates the slot, exporting its snapshot, which lives while the driver holds the
exporting connection (``pgcdc.snapshot.exported_slot``), plans the chunks (ctid ranges) and
runs one Spark task per chunk. A task imports the snapshot, COPYs its chunk (binary format
where the types allow), types the rows with the code that types the change log's rows
(``insert_changes``), builds each kind's rows with the sinks' own builders (``initial_rows``)
and stages them as data files of the tables (``pgcdc.sinks.staged``). Only add actions reach
the driver, which commits each Delta table's in one transaction: a table's snapshot appears
whole or not at all, and its rows never pass through the driver or the change log. The
receiver then streams the slot from its consistent point: no gap, no overlap.

A crash of the driver ends the exported snapshot (it dies with its connection). The next run
resumes from the slot (``pgcdc.pipeline.claim_slot``): the tables committed stay, the others
are copied under a new snapshot at a later point, whose earlier changes the sinks skip for them.
A table under way keeps the chunks its tasks recorded (``_record``) that hold no row changed
since (``_resumed``). A table an earlier attempt half-wrote is replaced by the new commit, never
added to. A failed task is retried by Spark inside the same snapshot, its earlier files left
unreferenced.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import sys
import threading
import time
import urllib.parse
import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from pgcdc.connection.server_errors import translated
from pgcdc.decoding import columnar
from pgcdc.decoding.arrow import DEFAULT_OPTIONS, framed_to_arrow
from pgcdc.decoding.copybinary import CopyBinaryReader, frame_copy
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.errors import PgcdcError, SinkError, SnapshotError, portable
from pgcdc.events import ReplicaIdentity, Table, encode_tuple_data
from pgcdc.lsn import LSN
from pgcdc.receiver import DEFAULT_SESSION_SETTINGS
from pgcdc.sinks import keys
from pgcdc.sinks.delta import (
    SNAPSHOT_APP_SUFFIX,
    DeltaSink,
    ensure_table,
    initial_rows,
    prepare,
    table_schema,
)
from pgcdc.sinks.kinds import SinkKind
from pgcdc.sinks.staged import commit, stage
from pgcdc.snapshot import (
    DEFAULT_CHUNK_PAGES,
    MAX_WINDOW_MESSAGES,
    PROGRESS_SECONDS,
    Chunk,
    Key,
    SnapshotResult,
    SnapshotTable,
    TableWindow,
    chunk_pages,
    copy_chunk,
    copy_out,
    copy_query,
    exported_slot,
    open_worker,
    plan_chunks,
    plan_snapshot,
    window_changes,
)
from pgcdc.spark.changes import insert_changes, tuples_to_arrow
from pgcdc.spark.pipeline import PipelineConfig, make_sink
from pgcdc.spark.source import spec_for
from pgcdc.storage import StorageOptions, filesystem

log = logging.getLogger(__name__)

# Chunks per task slot when the chunk size is chosen here: enough that slots finish together.
CHUNKS_PER_SLOT = 4
MIN_CHUNK_PAGES = 128
# The most tuples a heap page of 8 kB holds (PostgreSQL's MaxHeapTuplesPerPage): a chunk of
# n pages holds at most n times as many rows, which numbers the chunks' rows apart.
MAX_TUPLES_PER_PAGE = 291
# Where tasks record the chunks they staged, for a resume to keep: under the lake, a directory
# per pipeline and snapshot point, a file per chunk.
PROGRESS_DIRECTORY = "_pgcdc_snapshot_progress"
# The most rows inserted since kept chunks were copied that a resume fetches by key; a table
# with more is copied again.
MAX_FETCHED_KEYS = 10_000


@dataclass(frozen=True)
class _Target:
    """One Delta table a source table's snapshot lands in."""

    kind: SinkKind
    path: str
    schema: pa.Schema
    partition_by: tuple[str, ...]


@dataclass(frozen=True)
class _CopyJob:
    """What every task needs (picklable: it is shipped to the executors)."""

    conninfo: str
    snapshot_name: str
    session_settings: dict[str, str] | None
    consistent_point: int
    commit_time: datetime
    types: dict[int, TypeInfo]
    targets: dict[str, tuple[_Target, ...]]
    storage: StorageOptions
    # Where the tasks record their chunks (``_record``), and what each table's rows depend on.
    progress: str | None = None
    identities: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class _Task:
    """One chunk to copy, and where its rows' ``_seq`` starts: the chunks of a table number
    their rows apart (``ordinal`` times the most rows a chunk can hold), so every snapshot row
    of a table has its own (commit LSN, seq), as in the change log's one transaction."""

    chunk: Chunk
    ordinal: int
    stride: int
    last: bool

    @property
    def first_seq(self) -> int:
        return self.ordinal * self.stride


@dataclass(frozen=True)
class _Copied:
    """A task's result: the add actions of its chunk's files, per kind; or the pgcdc error
    that ended it (``errors.portable``), raised on the driver as itself, so a typed error
    reaches the user and a transient one is retried (a Spark task failure is a Java error)."""

    table: str
    rows: int = 0
    bytes: int = 0
    adds: dict[SinkKind, list[dict[str, Any]]] = field(default_factory=dict)
    error: tuple[Any, ...] | None = None


def _changes(job: _CopyJob, table: Table, typed: pa.RecordBatch, first_seq: int = 0) -> pa.Table:
    """The snapshot's rows (typed: ``_copied_rows``) as the change log path makes them: INSERTs
    committed at the consistent point - 1 (see ``pgcdc.snapshot``)."""
    return insert_changes(
        table,
        typed,
        commit_lsn=job.consistent_point - 1,
        lsn=job.consistent_point,
        commit_time=job.commit_time,
        types=job.types,
        first_seq=first_seq,
    )


def _copied_rows(
    conn: psycopg.Connection[Any], chunk: Chunk, types: Mapping[int, TypeInfo]
) -> tuple[pa.RecordBatch, int]:
    """COPY ``chunk`` on ``conn`` and type its rows as the change log's are typed; and the COPY
    bytes read. A binary copy is framed where COPY sent it and typed from there
    (``frame_copy``); a text copy, or a binary stream that is not as the server sends it, goes
    through TupleData, whose reader says what is wrong."""
    table = chunk.table.table
    width = len(table.columns)
    if chunk.table.binary:
        [(data, ends)] = copy_out(
            conn, copy_query(chunk), batch_rows=sys.maxsize, batch_bytes=sys.maxsize
        )
        framing = frame_copy(data, ends, width)
        strings = None if framing is None else columnar.text_columns(framing)
        if framing is not None and strings is not None:
            return framed_to_arrow(table, framing, strings, DEFAULT_OPTIONS, types), len(data)
        reader = CopyBinaryReader(width)
        rows = reader.read_joined(data, ends)
        reader.finish()
        size = len(data)
    else:
        parts = list(copy_chunk(conn, chunk))
        rows = [row for batch, _ in parts for row in batch]
        size = sum(read for _, read in parts)
    return tuples_to_arrow(table, pa.array(rows, pa.binary()), DEFAULT_OPTIONS, types), size


@dataclass(frozen=True)
class _Counters:
    """Spark accumulators each task adds its chunk to (one chunk; its rows, COPY bytes and
    pages as planned), for the driver's progress reports (``_report``)."""

    chunks: Any
    rows: Any
    bytes: Any
    pages: Any


def copy_task(job: _CopyJob, task: _Task, counters: _Counters | None = None) -> _Copied:
    """Run in a Spark task: copy the task's chunk inside the exported snapshot and stage its
    rows in every Delta table of its source table."""
    try:
        copied = _copy(job, task)
    except PgcdcError as error:
        return _Copied(task.chunk.table.table.qualified_name, error=portable(error))
    if counters is not None:
        counters.chunks.add(1)
        counters.rows.add(copied.rows)
        counters.bytes.add(copied.bytes)
        counters.pages.add(chunk_pages(task.chunk))
    return copied


def _copy(job: _CopyJob, task: _Task) -> _Copied:
    chunk = task.chunk
    with translated(), open_worker(job.conninfo, job.snapshot_name, job.session_settings) as conn:
        typed, read = _copied_rows(conn, chunk, job.types)
    table = chunk.table.table
    if typed.num_rows > task.stride and not task.last:
        raise SnapshotError(
            f"{table.qualified_name}: {typed.num_rows} rows in {chunk_pages(chunk)} pages, more "
            f"than {MAX_TUPLES_PER_PAGE} a page (a server built with a larger block size?); set "
            '[source] snapshot_in = "receiver"'
        )
    changes = _changes(job, table, typed, task.first_seq)
    dspec, prepared = prepare(spec_for(table, changes.schema), changes)
    targets = job.targets[table.qualified_name]
    built = initial_rows([target.kind for target in targets], dspec, prepared)
    adds = {
        target.kind: stage(
            target.path,
            built[target.kind],
            target.schema,
            job.storage,
            partition_by=target.partition_by,
        )
        for target in targets
    }
    copied = _Copied(table.qualified_name, typed.num_rows, read, adds)
    if job.progress is not None and chunk.keys is None:
        _record(job, chunk, copied, _key_range(prepared))
    return copied


def _key_range(prepared: pa.Table) -> list[str] | None:
    """The least and greatest ``_pgcdc_key`` of a chunk's rows, in hex; None without rows or
    key."""
    if keys.KEY not in prepared.column_names:
        return None
    bounds = pc.min_max(prepared.column(keys.KEY))
    if not bounds["min"].is_valid:
        return None
    return [bounds["min"].as_py().hex(), bounds["max"].as_py().hex()]


def _identity(spec: SnapshotTable) -> dict[str, Any]:
    """What a chunk's copied rows depend on besides the snapshot: a table whose identity
    changed since (ALTER TABLE, a publication's row filter, a rewrite by VACUUM FULL or
    CLUSTER, which moves rows between pages) is copied again, not resumed."""
    return {
        "oid": spec.table.oid,
        "filenode": spec.filenode,
        "columns": [[c.name, c.type_oid, c.type_modifier, c.is_key] for c in spec.table.columns],
        "row_filter": spec.row_filter,
    }


def _record(job: _CopyJob, chunk: Chunk, copied: _Copied, key_range: list[str] | None) -> None:
    """Record, once its files are staged, that the chunk is copied, with the least and greatest
    ``_pgcdc_key`` of its rows (hex; None without rows or key): written whole under a temporary
    name and then moved, so a crash leaves no half record."""
    assert job.progress is not None
    fs, root = filesystem(job.progress, job.storage or None)
    record = {
        "point": job.consistent_point,
        "identity": job.identities[copied.table],
        "first_page": chunk.first_page,
        "end_page": chunk.end_page,
        "rows": copied.rows,
        "bytes": copied.bytes,
        "key_range": key_range,
        "adds": {kind.value: adds for kind, adds in copied.adds.items()},
    }
    name = f"{root}/{chunk.table.table.oid}-{chunk.first_page or 0}"
    fs.create_dir(root, recursive=True)
    with fs.open_output_stream(name + ".tmp") as out:
        out.write(json.dumps(record).encode())
    fs.move(name + ".tmp", name + ".json")


def _progress_root(config: PipelineConfig) -> str:
    return f"{config.lake.rstrip('/')}/{PROGRESS_DIRECTORY}/{config.app_id}"


def _forget_progress(config: PipelineConfig) -> None:
    """Remove the pipeline's chunk records, and their directory once no pipeline has any."""
    fs, root = filesystem(_progress_root(config), config.storage or None)
    if fs.get_file_info(root).type != pafs.FileType.NotFound:
        fs.delete_dir(root)
    parent = root.rsplit("/", 1)[0]
    if fs.get_file_info(parent).type == pafs.FileType.Directory and not fs.get_file_info(
        pafs.FileSelector(parent)
    ):
        fs.delete_dir(parent)


@dataclass(frozen=True)
class _Kept:
    """The chunks of a table an interrupted attempt staged, which its commit keeps: their rows,
    COPY bytes and add actions per kind."""

    rows: int
    bytes: int
    adds: dict[SinkKind, list[dict[str, Any]]]


def _recorded(config: PipelineConfig, since: int) -> dict[int, list[dict[str, Any]]]:
    """Per table OID, the chunk records of the newest snapshot point at or after ``since``
    that has any (records a crash cut short are left out: their chunks are copied again)."""
    fs, root = filesystem(_progress_root(config), config.storage or None)
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    found: dict[int, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for info in fs.get_file_info(selector):
        if info.type != pafs.FileType.File or not info.path.endswith(".json"):
            continue
        try:
            with fs.open_input_stream(info.path) as stream:
                record = json.loads(stream.read())
            point, oid = int(record["point"]), int(record["identity"]["oid"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            log.warning(
                "initial snapshot: %s is unreadable (%s); its chunk is copied again",
                info.path,
                error,
            )
            continue
        if point >= since:
            found[oid][point].append(record)
    return {oid: by_point[max(by_point)] for oid, by_point in found.items()}


def _remaining(
    kept: Sequence[tuple[int | None, int | None]], pages: int, pages_per_chunk: int
) -> list[tuple[int, int | None]]:
    """The page ranges outside ``kept``, as chunks of at most ``pages_per_chunk`` pages (by
    the table's ``pages`` now); the last one open-ended, as ``plan_chunks`` makes them."""
    gaps: list[tuple[int, int | None]] = []
    after: int | None = 0  # the first page no kept range covers
    for first, end in sorted((first or 0, end) for first, end in kept):
        assert after is not None
        if first > after:
            gaps.append((after, first))
        if end is None:
            after = None
            break
        after = max(after, end)
    if after is not None:
        gaps.append((after, None))
    chunks: list[tuple[int, int | None]] = []
    for start, end in gaps:
        stop = max(pages, start) if end is None else end
        starts = range(start, stop, pages_per_chunk)
        chunks += [(at, at + pages_per_chunk) for at in starts[:-1]]
        chunks.append((starts[-1] if starts else start, end))
    return chunks


def _why_copied_again(
    spec: SnapshotTable,
    records: Sequence[dict[str, Any]],
    since: tuple[tuple[Key, ...], tuple[Key, ...]] | None,
    counts_copies: bool,
) -> str | None:
    """Why none of a table's recorded chunks can be kept, or None (see ``_resumed``);
    ``since``: the keys inserted and changed since they were copied (``TableWindow.since``)."""
    if any(r["identity"] != _identity(spec) for r in records):
        return "its definition or its storage (VACUUM FULL, CLUSTER) changed since"
    if counts_copies or spec.table.replica_identity not in (
        ReplicaIdentity.DEFAULT,
        ReplicaIdentity.INDEX,
    ):
        return "its rows have no key to tell the rows changed since by"
    if since is None:
        return "it was truncated since, or a change since did not send its key"
    touched = len(set(since[0]) | set(since[1]))
    if touched > MAX_FETCHED_KEYS:
        return f"{touched} rows were changed since, more than {MAX_FETCHED_KEYS} to look up by key"
    return None


def _identity_keys(job: _CopyJob, table: Table, texts: Sequence[Key]) -> list[bytes]:
    """The rows' ``_pgcdc_key``s, sorted: the key columns' text typed and encoded by the path
    that types and encodes the copied rows (``_copy``)."""
    positions = [i for i, column in enumerate(table.columns) if column.is_key]
    rows = []
    for key in texts:
        values: list[str | None] = [None] * len(table.columns)
        for position, value in zip(positions, key, strict=True):
            values[position] = value
        rows.append(encode_tuple_data(values))
    typed = tuples_to_arrow(table, pa.array(rows, pa.binary()), DEFAULT_OPTIONS, job.types)
    changes = _changes(job, table, typed)
    _, prepared = prepare(spec_for(table, changes.schema), changes)
    return sorted(prepared.column(keys.KEY).to_pylist())


def _may_hold(record: dict[str, Any], identities: Sequence[bytes]) -> bool:
    """Whether a recorded chunk may hold a row of one of the (sorted) ``identities``: one
    between its least and greatest ``_pgcdc_key``."""
    if record.get("key_range") is None:
        return False  # no rows
    low, high = (bytes.fromhex(bound) for bound in record["key_range"])
    at = bisect.bisect_left(identities, low)
    return at < len(identities) and identities[at] <= high


def _staged_path(target: _Target, add: dict[str, Any], storage: StorageOptions) -> tuple[Any, str]:
    """The file system and path of a staged file (``add``: its add action) of ``target``."""
    fs, root = filesystem(target.path, storage or None)
    return fs, f"{root.rstrip('/')}/{urllib.parse.unquote(add['path'])}"


def _unusable(job: _CopyJob, name: str, record: dict[str, Any]) -> str | None:
    """Why a recorded chunk cannot go into the table's commit as it is, or None: it staged no
    rows for one of the table's kinds now (its kinds changed since), or one of its staged files
    is gone or not as written (a VACUUM of the table meanwhile removes files no commit
    references). Its pages are then copied again."""
    for target in job.targets[name]:
        staged = record["adds"].get(target.kind.value)
        if staged is None:
            return f"it staged no {target.kind.value} rows (the table's kinds changed since)"
        for add in staged:
            fs, path = _staged_path(target, add, job.storage)
            info = fs.get_file_info(path)
            if info.type != pafs.FileType.File or info.size != add["size"]:
                return f"its staged file {path} is gone or changed since"
    return None


def _usable(job: _CopyJob, name: str, records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records whose chunks can go into the table's commit as they are; the others are
    logged, with why, and their pages copied again (``_unusable``)."""
    usable = []
    for record in records:
        why = _unusable(job, name, record)
        if why is None:
            usable.append(record)
            continue
        log.warning(
            "initial snapshot: %s: the chunk of pages %s to %s is copied again: %s",
            name,
            record["first_page"] or 0,
            "the end" if record["end_page"] is None else record["end_page"],
            why,
        )
    return usable


def _staged_rows_hold(
    job: _CopyJob, name: str, record: dict[str, Any], identities: pa.Array
) -> bool:
    """Whether a recorded chunk's staged rows hold one of ``identities`` (``_pgcdc_key``s),
    read from its mirror (or history) files; True without such files (the changelog has no
    ``_pgcdc_key``). Asked of a chunk whose key range holds one of them: keys that do not
    follow the pages (UUIDs, text) give every chunk a range spanning nearly all, and a few
    rows changed since would otherwise have every chunk copied again. A file that cannot be
    read counts as holding one: the chunk is copied again, not committed."""
    for target in job.targets[name]:
        staged = record["adds"].get(target.kind.value)
        if target.kind in (SinkKind.MIRROR, SinkKind.HISTORY) and staged is not None:
            for add in staged:
                fs, path = _staged_path(target, add, job.storage)
                try:
                    with fs.open_input_file(path) as source:
                        held = pq.read_table(source, columns=[keys.KEY]).column(keys.KEY)
                except (OSError, pa.ArrowException) as error:
                    log.warning(
                        "initial snapshot: %s: %s is unreadable (%s); its chunk is copied again",
                        name,
                        path,
                        error,
                    )
                    return True
                if pc.any(pc.is_in(held, value_set=identities)).as_py():
                    return True
            return False
    return True


def _resumed(
    config: PipelineConfig,
    job: _CopyJob,
    *,
    slot: str,
    publications: Sequence[str],
    resume_from: LSN,
    tables: Sequence[SnapshotTable],
    copies_counted: Sequence[SnapshotTable],
    pages_per_chunk: int,
) -> tuple[dict[str, _Kept], list[Chunk]]:
    """The chunks an interrupted attempt copied at P that this one (at C) keeps, per table, and
    the chunks left to copy for those tables.

    A row nobody changed between P and C is the same at both, on the same page. So a chunk
    is kept unless it holds a row an UPDATE or DELETE changed since P (judged by the range of
    its rows' keys, which its task recorded, and where that range holds a changed key, by the
    keys of its staged rows), and the other pages are copied at C. The rows
    inserted or changed since P that sit on kept pages at C are looked up by key at C. A
    table truncated since, or whose changes since cannot be told by key, is copied again whole
    (``_why_copied_again``)."""
    recorded = _recorded(config, int(resume_from))
    wanted = [spec for spec in tables if spec.table.oid in recorded]
    if not wanted:
        return {}, []
    windows = window_changes(
        job.conninfo, slot, publications, LSN(job.consistent_point), job.session_settings
    )
    if windows is None:
        log.info(
            "initial snapshot: more than %d changes were made since the chunks were copied: "
            "their tables are copied again whole",
            MAX_WINDOW_MESSAGES,
        )
        return {}, []
    kept: dict[str, _Kept] = {}
    chunks: list[Chunk] = []
    for spec in wanted:
        records = recorded[spec.table.oid]
        name = spec.table.qualified_name
        at = LSN(records[0]["point"])
        since = windows.get(spec.table.oid, TableWindow()).since(at)
        reason = _why_copied_again(spec, records, since, spec in copies_counted)
        if reason is not None or since is None:
            log.info("initial snapshot: %s is copied again whole: %s", name, reason)
            continue
        records = _usable(job, name, records)
        inserted, changed = since
        identities = _identity_keys(job, spec.table, changed) if changed else []
        value_set = pa.array(identities, keys.KEY_TYPE)
        in_range = [_may_hold(r, identities) for r in records]
        held = [
            r
            for r, maybe in zip(records, in_range, strict=True)
            if not maybe or not _staged_rows_hold(job, name, r, value_set)
        ]
        if not held:
            log.info(
                "initial snapshot: %s is copied again whole: %s",
                name,
                "each chunk copied may hold a row changed since"
                if records
                else "none of the chunks copied can go into its commit as they are",
            )
            continue
        ranges = tuple((r["first_page"], r["end_page"]) for r in held)
        adds: dict[SinkKind, list[dict[str, Any]]] = defaultdict(list)
        for record in held:
            for kind, staged in record["adds"].items():
                adds[SinkKind(kind)] += staged
        kept[name] = _Kept(sum(r["rows"] for r in held), sum(r["bytes"] for r in held), adds)
        left = _remaining(ranges, spec.pages, pages_per_chunk)
        chunks += [Chunk(spec, first, end) for first, end in left]
        looked_up = tuple(dict.fromkeys(inserted + changed))
        if looked_up:
            chunks.append(Chunk(spec, keys=looked_up, within=ranges))
        log.info(
            "initial snapshot: %s resumes: %d of the %d chunks copied at %s kept (the staged "
            "keys of %d read), %d to copy, and %d keys inserted or changed since looked up on "
            "the kept pages",
            name,
            len(held),
            len(records),
            at,
            sum(in_range),
            len(left),
            len(looked_up),
        )
    return kept, chunks


def _replaces(delta: Any, path: str, app_id: str) -> bool:
    """Whether the snapshot's commit must replace what the table holds: an earlier attempt's
    snapshot, which a crash cut short. Other rows are refused: a new change log's snapshot
    lands in empty tables."""
    if not delta.file_uris():
        return False
    earlier_attempt = delta.transaction_version(app_id + SNAPSHOT_APP_SUFFIX) is not None
    if earlier_attempt and delta.transaction_version(app_id) is None:
        return True
    raise SinkError(
        f"{path} already holds rows, but the change log is new, so the pipeline starts with "
        "an initial snapshot into empty tables; point [paths] lake at a new directory (or move "
        'that table away), or set [source] snapshot_in = "receiver" to merge the snapshot '
        "into the rows there"
    )


def _pages_per_chunk(tables: Sequence[SnapshotTable], slots: int) -> int:
    """Chunks small enough that every task slot gets several, at most DEFAULT_CHUNK_PAGES."""
    total = sum(t.pages for t in tables if t.splittable)
    wanted = total // max(slots * CHUNKS_PER_SLOT, 1)
    return max(MIN_CHUNK_PAGES, min(DEFAULT_CHUNK_PAGES, wanted))


def _report(
    counters: _Counters, chunks: int, pages: int, started: float, done: threading.Event
) -> Callable[[], None]:
    """A loop for a thread: log, now and then, the chunks, rows, bytes and share of the pages
    the tasks finished, and the time left at that pace."""

    def loop() -> None:
        while not done.wait(PROGRESS_SECONDS):
            elapsed = time.monotonic() - started
            copied = counters.pages.value
            left = f", about {elapsed * (pages - copied) / copied:.0f} s left" if copied else ""
            log.info(
                "initial snapshot: %d of %d chunks copied (%s rows, %.1f MB, %.0f%% of the "
                "pages) in %.0f s%s",
                counters.chunks.value,
                chunks,
                f"{counters.rows.value:,}",
                counters.bytes.value / 1e6,
                100 * copied / max(pages, 1),
                elapsed,
                left,
            )

    return loop


def _jobs(chunks: Sequence[Chunk], pages_per_chunk: int, slots: int) -> list[list[_Task]]:
    """The chunks as tasks, in Spark jobs that each land whole tables, smallest tables first:
    a table is committed as soon as its job ends, so a crash loses only the tables of the job
    under way. Small tables share a job, so that it has several tasks per slot (a job's last
    tasks leave slots idle). Within a job the biggest chunks go first: the last tasks to start
    are the short ones."""
    by_table: dict[str, list[Chunk]] = defaultdict(list)
    for chunk in chunks:
        by_table[chunk.table.table.qualified_name].append(chunk)
    stride = pages_per_chunk * MAX_TUPLES_PER_PAGE
    enough = slots * CHUNKS_PER_SLOT
    jobs: list[list[_Task]] = []
    current: list[_Task] = []
    for own in sorted(by_table.values(), key=lambda own: sum(map(chunk_pages, own))):
        # A resumed table's chunk of fetched keys first: its few rows never outgrow their
        # numbers, as the open-ended last chunk may.
        own.sort(key=lambda c: (c.keys is None, c.first_page or 0))
        if len(own) >= enough and current:  # a table with tasks enough: a job of its own
            jobs.append(current)
            current = []
        current += [
            _Task(c, ordinal, stride, ordinal == len(own) - 1) for ordinal, c in enumerate(own)
        ]
        if len(current) >= enough:
            jobs.append(current)
            current = []
    if current:
        jobs.append(current)
    return [sorted(j, key=lambda t: chunk_pages(t.chunk), reverse=True) for j in jobs]


def _run_tasks(
    spark: Any,
    job: _CopyJob,
    jobs: Sequence[Sequence[_Task]],
    landed: Callable[[list[_Copied]], None],
) -> list[_Copied]:
    """One Spark task per chunk, one Spark job per group of tables; only their small results
    come back, and ``landed`` gets each job's as it ends. A task's pgcdc error is raised."""
    context = spark.sparkContext
    group = f"pgcdc-snapshot-{uuid.uuid4().hex[:8]}"
    context.setJobGroup(group, "pgcdc initial snapshot", interruptOnCancel=True)
    done = threading.Event()
    counters = _Counters(*(context.accumulator(0) for _ in range(4)))
    chunks = [task.chunk for tasks in jobs for task in tasks]
    pages = sum(map(chunk_pages, chunks))
    reporter = threading.Thread(
        target=_report(counters, len(chunks), pages, time.monotonic(), done),
        name="pgcdc-snapshot-progress",
        daemon=True,
    )
    reporter.start()
    copied: list[_Copied] = []
    try:
        for tasks in jobs:
            rdd = context.parallelize(list(tasks), len(tasks))
            copy = functools.partial(copy_task, job, counters=counters)
            results: list[_Copied] = rdd.map(copy).collect()
            for result in results:
                if result.error is not None:
                    rebuild, args = result.error
                    raise rebuild(*args)
            landed(results)
            copied += results
        return copied
    finally:
        done.set()
        context.setLocalProperty("spark.jobGroup.id", None)


def land_initial_snapshot(
    spark: Any,
    config: PipelineConfig,
    *,
    conninfo: str,
    slot: str,
    publications: Sequence[str],
    failover: bool = False,
    copy_format: str = "auto",
    session_settings: Mapping[str, str] | None = DEFAULT_SESSION_SETTINGS,
    pages_per_chunk: int | None = None,
    created_at: Callable[[LSN], None] | None = None,
    resume_from: LSN | None = None,
) -> SnapshotResult:
    """Create ``slot`` and land every row it will not stream in the pipeline's Delta tables,
    copied by Spark tasks, each table in one commit recording the snapshot's consistent
    point (``created_at`` learns it first). A failure before any table landed drops the slot
    again; after, the slot is kept for a resume.

    ``resume_from``: the consistent point of ``slot``, which exists and has streamed nothing.
    Tables that landed at or after it stay; the others are copied at a new consistent point
    (a temporary slot's), and the sinks skip their changes committed before it, which the new
    copy holds. The stream then starts from ``resume_from``."""
    started = time.monotonic()
    committed: list[str] = []
    if resume_from is None:
        exporting = exported_slot(
            conninfo, slot, failover=failover, keep_on_failure=lambda: bool(committed)
        )
    else:
        exporting = exported_slot(conninfo, f"pgcdc_resume_{uuid.uuid4().hex[:16]}", temporary=True)
    with exporting as created:
        if resume_from is None and created_at is not None:
            created_at(created.consistent_point)
        snapshot_name = created.snapshot_name or ""
        settings = None if session_settings is None else dict(session_settings)
        plan = plan_snapshot(
            conninfo,
            snapshot_name,
            tables=None,
            publications=publications,
            session_settings=settings,
            copy_format=copy_format,
        )
        job = _CopyJob(
            conninfo=conninfo,
            snapshot_name=snapshot_name,
            session_settings=settings,
            consistent_point=int(created.consistent_point),
            commit_time=plan.taken_at or datetime.now(UTC),
            types=plan.types,
            targets={},
            storage=config.storage,
            progress=f"{_progress_root(config)}/{int(created.consistent_point):016X}",
            identities={s.table.qualified_name: _identity(s) for s in plan.tables},
        )
        sink = make_sink(config)
        replaces: dict[tuple[str, SinkKind], bool] = {}
        todo: list[SnapshotTable] = []
        whole: list[SnapshotTable] = []
        for spec in plan.tables:
            targets, counts_copies = _targets(
                job, sink, spec.table, config, replaces, resume_from=resume_from
            )
            if not targets:
                continue  # landed by an earlier attempt
            job.targets[spec.table.qualified_name] = targets
            todo.append(spec)
            if counts_copies:
                whole.append(spec)
        slots = spark.sparkContext.defaultParallelism
        pages = pages_per_chunk or _pages_per_chunk(todo, slots)
        kept: dict[str, _Kept] = {}
        resumed: list[Chunk] = []
        if resume_from is None:
            _forget_progress(config)  # an earlier snapshot's records, its slot dropped
        else:
            kept, resumed = _resumed(
                config,
                job,
                slot=slot,
                publications=publications,
                resume_from=resume_from,
                tables=todo,
                copies_counted=whole,
                pages_per_chunk=pages,
            )
        split = [s for s in todo if s not in whole and s.table.qualified_name not in kept]
        # Keyless REPLICA IDENTITY FULL tables number identical rows: one task sees them all.
        chunks = plan_chunks(split, pages) + [Chunk(s) for s in whole] + resumed
        if resume_from is not None:
            log.info(
                "initial snapshot resumed: %d of %d tables landed already; the other %d at %s",
                len(plan.tables) - len(todo),
                len(plan.tables),
                len(todo),
                created.consistent_point,
            )
        jobs = _jobs(chunks, pages, slots)
        log.info(
            "initial snapshot: %d tables in %d chunks, copied by Spark tasks in %d jobs",
            len(todo),
            len(chunks),
            len(jobs),
        )
        app_id = config.app_id + SNAPSHOT_APP_SUFFIX

        def land(results: list[_Copied]) -> None:
            adds: dict[tuple[str, SinkKind], list[dict[str, Any]]] = defaultdict(list)
            for result in results:
                for kind, staged in result.adds.items():
                    adds[(result.table, kind)] += staged
            for name in dict.fromkeys(r.table for r in results):
                earlier = kept[name].adds if name in kept else {}
                for target in job.targets[name]:
                    commit(
                        target.path,
                        earlier.get(target.kind, []) + adds[(name, target.kind)],
                        replace=replaces[(name, target.kind)],
                        app_id=app_id,
                        version=job.consistent_point,
                        storage=config.storage,
                    )
                committed.append(name)

        # Tables whose every chunk was kept have no task: they land at once.
        chunked = {c.table.table.qualified_name for c in chunks}
        land([_Copied(name) for name in kept if name not in chunked])
        copied = _run_tasks(spark, job, jobs, land)
        _forget_progress(config)
    copied += [_Copied(name, k.rows, k.bytes) for name, k in kept.items()]
    rows = sum(r.rows for r in copied)
    log.info(
        "initial snapshot: %d rows of %d tables landed in %.1f s",
        rows,
        len(todo),
        time.monotonic() - started,
    )
    return SnapshotResult(
        consistent_point=created.consistent_point if resume_from is None else resume_from,
        tables=tuple(s.table for s in plan.tables),
        rows=rows,
        bytes=sum(r.bytes for r in copied),
        snapshot_name=snapshot_name,
    )


def _targets(
    job: _CopyJob,
    sink: DeltaSink,
    table: Table,
    config: PipelineConfig,
    replaces: dict[tuple[str, SinkKind], bool],
    *,
    resume_from: LSN | None = None,
) -> tuple[tuple[_Target, ...], bool]:
    """The Delta tables ``table`` lands in, created for its typed columns (typed as the tasks
    will type its rows), and whether its rows are numbered copies (``keys.counts_copies``).
    Resuming, those an earlier attempt landed (at or after ``resume_from``) are left out."""
    empty = _changes(
        job, table, tuples_to_arrow(table, pa.array([], pa.binary()), DEFAULT_OPTIONS, job.types)
    )
    spec = spec_for(table, empty.schema)
    dspec, _ = prepare(spec, empty)
    so = config.storage.delta()
    targets = []
    for kind in sink.kinds_for(spec):
        path = sink.checked_path(spec, kind)
        delta = ensure_table(path, kind, dspec, so)
        landed_at = delta.transaction_version(config.app_id + SNAPSHOT_APP_SUFFIX)
        if resume_from is not None and landed_at is not None and landed_at >= resume_from:
            continue
        replaces[(table.qualified_name, kind)] = _replaces(delta, path, config.app_id)
        partition_by = tuple(delta.metadata().partition_columns)
        targets.append(_Target(kind, path, table_schema(delta), partition_by))
    return tuple(targets), keys.counts_copies(spec)


__all__ = ["SNAPSHOT_APP_SUFFIX", "copy_task", "land_initial_snapshot"]
