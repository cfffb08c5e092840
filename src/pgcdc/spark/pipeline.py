"""The Delta pipeline: one Spark streaming query over the change log writing every captured
table's changelog / mirror / history with ``pgcdc.sinks``, exactly once.

Executors type the changes (``format=chunks``: one row per run of a table's typed changes).
``foreachBatch`` then writes them, where ``writes`` says: on the driver, which collects the batch
once as Arrow; or in executors, one task per group of tables (the batch shuffled by table name),
so the batch's data never reaches the driver, which gets only each write's result. Either way
each table's runs are ordered by (commit LSN, seq) and written one after the other. A table
whose definition changes inside a batch (a column added or dropped) has several runs: run *r*
of every table is written as Delta application transaction version ``batch_id * 1024 + r``, so
each write has one ``TableSpec`` and a replayed batch (after a crash, or a retried task) is
skipped table by table.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from pgcdc.changelog import ChangeLog
from pgcdc.decoding.state import table_from_dict
from pgcdc.errors import CheckpointUnavailable, PipelineQueryError, SinkError
from pgcdc.lsn import LSN
from pgcdc.sinks import DeltaSink, SinkKind, TableSpec, WriteResult
from pgcdc.sinks.kinds import DEFAULT_COMPACT_FILES, parse_kinds
from pgcdc.spark import class_archive
from pgcdc.spark.local_python import choose_python, start_fork_server
from pgcdc.spark.source import PgcdcDataSource, offset_lsn, read_ipc, spec_for
from pgcdc.storage import StorageOptions

log = logging.getLogger(__name__)

RUNS_PER_BATCH = 1024
# What Spark says when its JVM has no Hadoop file system for the checkpoint's scheme.
_CHECKPOINT_UNREACHABLE = ("CANNOT_LOAD_CHECKPOINT_FILE_MANAGER", "No FileSystem for scheme")


@dataclass(frozen=True)
class PipelineConfig:
    """Where the pipeline reads and writes, and what it writes."""

    changelog: str
    lake: str
    checkpoint: str
    kinds: tuple[SinkKind, ...] = (SinkKind.CHANGELOG, SinkKind.MIRROR, SinkKind.HISTORY)
    table_kinds: Mapping[str, tuple[SinkKind, ...]] = field(default_factory=dict)
    consumer: str = "pipeline"
    trigger_interval: float = 5.0
    max_changes_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    # How to reach object storage: the Delta sinks and the source's executors get the same.
    storage: StorageOptions = field(default_factory=StorageOptions)
    query_name: str = "pgcdc"
    # "driver" or "executors": where a batch's Delta writes run.
    writes: str = "driver"
    # Compact a Delta table once it holds this many small files (0: never).
    compact_files: int = DEFAULT_COMPACT_FILES

    @property
    def app_id(self) -> str:
        """Delta application id: the checkpoint's identity (one query writes each checkpoint)."""
        identity = self.checkpoint
        if "://" not in identity:
            identity = str(Path(identity).resolve())
        return "pgcdc-" + hashlib.sha256(identity.encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Chunk:
    """One run of one table's typed changes, as an executor produced it."""

    table: str
    definition: str
    first: tuple[int, int]
    changes: pa.Table


def chunks_from_arrow(table: pa.Table) -> list[Chunk]:
    """A ``format=chunks`` batch as Arrow (``DataFrame.toArrow``: no per-row Python objects
    from Spark) to chunks; each IPC stream is read in place."""
    chunks: list[Chunk] = []
    for batch in table.to_batches():
        data = batch.column("chunk")
        for i, (name, definition, lsn, seq) in enumerate(
            zip(
                batch.column("table").to_pylist(),
                batch.column("definition").to_pylist(),
                batch.column("first_commit_lsn").to_pylist(),
                batch.column("first_seq").to_pylist(),
                strict=True,
            )
        ):
            chunks.append(Chunk(name, definition, (lsn, seq), read_ipc(data[i].as_buffer())))
    return chunks


def chunks_from_rows(rows: Iterable[Any]) -> list[Chunk]:
    """Spark rows of ``format=chunks`` (collected once) to chunks."""
    return [
        Chunk(
            row["table"],
            row["definition"],
            (row["first_commit_lsn"], row["first_seq"]),
            read_ipc(bytes(row["chunk"])),
        )
        for row in rows
    ]


def rounds(chunks: Sequence[Chunk]) -> list[list[tuple[TableSpec, pa.Table]]]:
    """Group chunks per table into consecutive runs under one definition, in log order;
    round r holds every table's r-th run."""
    per_table: dict[str, list[Chunk]] = defaultdict(list)
    for chunk in chunks:
        per_table[chunk.table].append(chunk)
    result: list[list[tuple[TableSpec, pa.Table]]] = []
    for table_chunks in per_table.values():
        table_chunks.sort(key=lambda ch: ch.first)
        runs: list[list[Chunk]] = []
        for chunk in table_chunks:
            if (
                runs
                and runs[-1][-1].definition == chunk.definition
                and _same_schema(runs[-1][-1], chunk)
            ):
                runs[-1].append(chunk)
            else:
                runs.append([chunk])
        for index, run in enumerate(runs):
            table = table_from_dict(json.loads(run[0].definition))
            spec = spec_for(table, run[0].changes.schema)
            data = pa.concat_tables([ch.changes for ch in run])
            while len(result) <= index:
                result.append([])
            result[index].append((spec, data))
    if len(result) > RUNS_PER_BATCH:
        raise SinkError(
            f"a micro-batch holds {len(result)} definitions of one table (more than "
            f"{RUNS_PER_BATCH}); lower maxChangesPerBatch so fewer schema changes share a batch"
        )
    return result


def _same_schema(a: Chunk, b: Chunk) -> bool:
    return bool(a.changes.schema.equals(b.changes.schema))


def write_chunks(sink: DeltaSink, batch_id: int, chunks: Sequence[Chunk]) -> list[WriteResult]:
    """Write one micro-batch exactly once (versions ``batch_id * 1024 + round``)."""
    results: list[WriteResult] = []
    for index, batch in enumerate(rounds(chunks)):
        results += sink.write_batch(batch_id * RUNS_PER_BATCH + index, batch)
    return results


def write_in_executors(frame: Any, batch_id: int, config: PipelineConfig) -> list[WriteResult]:
    """Write a ``format=chunks`` batch in Spark tasks: the batch is shuffled by table, so each
    table's chunks meet in one task, which writes them as ``write_chunks`` does (same versions:
    a retried task skips what its table already has). Only the results reach the driver. (RDD
    rows, not ``mapInArrow``, which needs pandas: a batch has a row per chunk, not per change.)"""

    def write_partition(rows: Iterable[Any]) -> Iterable[tuple[str, str, str, bool, int]]:
        chunks = chunks_from_rows(rows)
        if not chunks:
            return []
        results = write_chunks(make_sink(config), batch_id, chunks)
        return [(r.table, r.kind.value, r.path, r.applied, r.rows) for r in results]

    written = frame.repartition("table").rdd.mapPartitions(write_partition).collect()
    return [
        WriteResult(table, SinkKind(kind), path, applied, rows)
        for table, kind, path, applied, rows in written
    ]


def make_sink(config: PipelineConfig) -> DeltaSink:
    return DeltaSink(
        config.lake,
        app_id=config.app_id,
        kinds=config.kinds,
        table_kinds=config.table_kinds,
        storage_options=config.storage.delta(),
        compact_files=config.compact_files,
    )


def spark_session(master: str = "local[*]", app_name: str = "pgcdc", **conf: str) -> Any:
    """A SparkSession with the pgcdc data source registered (workers run this interpreter).

    Defaults, each overridden by ``conf``: no UI, two shuffle partitions, Python workers that
    import the installed pyspark rather than compile SPARK_HOME's zip (``pgcdc.spark.daemon``)
    and allocate Arrow's memory with the C library's malloc (pyarrow's default, mimalloc, spent
    much of an executor's CPU in the kernel handing freed pages back and faulting new ones in,
    as the initial snapshot's tasks build large columns one after the other) and, for a local
    master, a driver JVM that compiles only with C1 (the C2 compiler spent seconds of CPU per
    run on code that mostly copies bytes, CPU the receiver needs) and maps the class archive
    when there is one (``pgcdc.spark.class_archive``). A local session's other Python processes
    (data source lookup, planning, the streaming source) skip the zip too, through
    ``PYSPARK_PYTHON`` and ``PYSPARK_DRIVER_PYTHON`` (``pgcdc.spark.local_python.choose_python``)
    unless the user set them, and are forked from a fork server that imported pyspark and pgcdc
    as the JVM started (``pgcdc.spark.local_python.start_fork_server``)."""
    local = master.startswith("local")
    choose_python(local)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName(app_name)
    defaults = {
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.python.daemon.module": "pgcdc.spark.daemon",
        "spark.executorEnv.ARROW_DEFAULT_MEMORY_POOL": "system",
    }
    if local:
        defaults["spark.driver.extraJavaOptions"] = " ".join(class_archive.driver_options())
    settings = {**defaults, **conf}
    for key, value in settings.items():
        builder = builder.config(key, value)
    _start_jvm_apart(master, app_name, settings)
    spark = builder.getOrCreate()
    spark.dataSource.register(PgcdcDataSource)
    return spark


def _start_jvm_apart(master: str, app_name: str, settings: Mapping[str, str]) -> None:
    """Start Spark's JVM, unless one runs, in a session of its own, with the settings the
    builder would start it with. A terminal's Ctrl-C (SIGINT to its foreground process group)
    then reaches pgcdc's processes only, which stop the query and Spark in order; in the group
    it also reached the JVM's Python workers, which pyspark lets print a KeyboardInterrupt
    traceback each. The JVM still ends with the driver: it exits when its stdin, a pipe from
    the driver, closes."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    with SparkContext._lock:  # pyspark's own check-and-start, as ``_ensure_initialized`` does
        if SparkContext._gateway is None:
            conf = SparkConf().setMaster(master).setAppName(app_name)
            conf.setAll(list(settings.items()))
            if master.startswith("local"):
                start_fork_server(settings)  # importing while the JVM starts
            apart = {"start_new_session": True}
            gateway = launch_gateway(conf, popen_kwargs=apart)  # type: ignore[no-untyped-call]
            SparkContext._gateway = gateway
            SparkContext._jvm = gateway.jvm


def _checkpoint_unavailable(config: PipelineConfig, error: BaseException) -> CheckpointUnavailable:
    return CheckpointUnavailable(
        f"Spark cannot keep its checkpoint at {config.checkpoint} ({_spark_reason(error)}): keep "
        "paths.checkpoint on a filesystem the driver owns (a local directory; pyspark ships no "
        "hadoop-aws, so s3a:// cannot work without extra jars); the change log and the lake "
        "may stay on s3:// (see docs/deployment.md)"
    )


def _checkpoint_fs(spark: Any, config: PipelineConfig) -> tuple[Any, Any]:
    """The checkpoint's Hadoop path and file system; CheckpointUnavailable when Spark has no
    file system for its scheme (s3a:// without hadoop-aws's classes)."""
    try:
        path = spark._jvm.org.apache.hadoop.fs.Path(config.checkpoint)
        return path, path.getFileSystem(spark._jsc.hadoopConfiguration())
    except Exception as exc:
        raise _checkpoint_unavailable(config, exc) from None


def check_checkpoint(spark: Any, config: PipelineConfig) -> None:
    """Raise CheckpointUnavailable now, not after an initial snapshot of hours."""
    _checkpoint_fs(spark, config)


def _drop_leftovers_of_a_cut_first_batch(spark: Any, config: PipelineConfig) -> None:
    """A kill while Spark writes a new checkpoint's first offsets leaves only that write's
    hidden temporary files in ``offsets/`` (Hadoop writes one, then renames it): Spark 4 then
    refuses to start at batch 0 (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY) and the pipeline
    stayed wedged until a person emptied the checkpoint. With no batch recorded there is
    nothing to keep, so they are removed."""
    root, fs = _checkpoint_fs(spark, config)
    offsets = spark._jvm.org.apache.hadoop.fs.Path(root, "offsets")
    if not fs.exists(offsets):
        return
    names = [status.getPath().getName() for status in fs.listStatus(offsets)]
    if any(name.isdigit() for name in names):
        return
    leftovers = sorted(name for name in names if name.startswith("."))
    for name in leftovers:
        fs.delete(spark._jvm.org.apache.hadoop.fs.Path(offsets, name), False)
    if leftovers:
        log.warning(
            "checkpoint %s: removed %s, left in offsets/ by a first batch whose start was cut "
            "short (a kill); the query starts at batch 0",
            config.checkpoint,
            ", ".join(leftovers),
        )


class StopRequested(Exception):
    """A batch refused because the pipeline is stopping (it is replayed on the next start)."""


def _not_a_refusal(record: logging.LogRecord) -> bool:
    """py4j logs whatever ``foreachBatch`` raises with its traceback (as an ERROR, on stderr
    when nothing else handles it); a batch the gate refused is the stop, not an error."""
    return not (record.exc_info and isinstance(record.exc_info[1], StopRequested))


class BatchGate:
    """Which batch ``foreachBatch`` is writing, and a stop that refuses the next one.

    ``query.stop()`` interrupts the stream thread wherever it is: in a batch's writes, that
    fails the batch half way (so the next start replays it) and Spark's own check of the
    interruption can overflow its stack on the long py4j error text. See ``stop``."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._writing = 0
        self._closed = False
        self.refused = False
        self.last_started: int | None = None

    @contextlib.contextmanager
    def batch(self, batch_id: int) -> Iterator[None]:
        with self._changed:
            if self._closed:
                self.refused = True
                raise StopRequested(f"batch {batch_id} not written: the pipeline is stopping")
            self._writing += 1
            self.last_started = batch_id
        try:
            yield
        finally:
            with self._changed:
                self._writing -= 1
                self._changed.notify_all()

    def close(self, timeout: float) -> bool:
        """Refuse new batches; wait up to ``timeout`` seconds for the one being written.
        Returns whether none is being written."""
        with self._changed:
            self._closed = True
            return self._changed.wait_for(lambda: self._writing == 0, timeout)


def stop(query: Any, gate: BatchGate, timeout: float, now: threading.Event | None = None) -> None:
    """Stop ``query`` between batches: the batch being written finishes and is recorded as
    done in the checkpoint (its commit follows ``foreachBatch``), and no other starts, unless
    that takes over ``timeout`` seconds or ``now`` is set meanwhile; then Spark interrupts it
    (the next start replays it)."""
    deadline = time.monotonic() + timeout

    def may_wait() -> float:
        """Seconds the next wait may take: 0 once the deadline passed or ``now`` is set."""
        if now is not None and now.is_set():
            return 0.0
        return min(max(deadline - time.monotonic(), 0.0), 0.1)

    idle = gate.close(0)
    if not idle:
        log.info(
            "stopping: batch %s is being written and finishes first (up to %g s: "
            "[spark] stop_timeout)",
            gate.last_started,
            timeout,
        )
    while not idle and (wait := may_wait()) > 0:
        idle = gate.close(wait)
    if idle and gate.last_started is not None:
        while query.isActive and (wait := may_wait()) > 0:
            progress = query.lastProgress
            if progress is not None and progress.batchId >= gate.last_started:
                break
            time.sleep(min(wait, 0.05))
    query.stop()


def start(
    spark: Any,
    config: PipelineConfig,
    *,
    available_now: bool = False,
    gate: BatchGate | None = None,
    hold_until: str | None = None,
) -> Any:
    """Start the streaming query; returns the ``StreamingQuery``. Batches pass ``gate``;
    ``hold_until``: the source's option of that name (no partial batch until that file is
    there)."""
    gate = gate or BatchGate()
    logging.getLogger("py4j.clientserver").addFilter(_not_a_refusal)
    _drop_leftovers_of_a_cut_first_batch(spark, config)
    reader = (
        spark.readStream.format("pgcdc")
        .option("path", config.changelog)
        .option("format", "chunks")
        .option("consumer", config.consumer)
        .options(**config.storage.spark_options())
    )
    if config.max_changes_per_batch is not None:
        reader = reader.option("maxChangesPerBatch", str(config.max_changes_per_batch))
    if config.max_bytes_per_batch is not None:
        reader = reader.option("maxBytesPerBatch", str(config.max_bytes_per_batch))
    if hold_until is not None:
        reader = reader.option("holdUntil", hold_until)
    sink = make_sink(config)

    def apply(frame: Any, batch_id: int) -> None:
        with gate.batch(batch_id):
            write(frame, batch_id)

    def write(frame: Any, batch_id: int) -> None:
        started = time.perf_counter()
        if config.writes == "executors":
            results = write_in_executors(frame, batch_id, config)
            written = sum(r.rows for r in results if r.applied)
            log.info(
                "batch %d: %d rows written by executors in %.2f s",
                batch_id,
                written,
                time.perf_counter() - started,
            )
            return
        chunks = chunks_from_arrow(_collect(frame, batch_id))
        collected = time.perf_counter()
        results = write_chunks(sink, batch_id, chunks)
        written = sum(r.rows for r in results if r.applied)
        log.info(
            "batch %d: %d chunks read in %.2f s, %d rows written in %.2f s",
            batch_id,
            len(chunks),
            collected - started,
            written,
            time.perf_counter() - collected,
        )

    writer = (
        reader.load()
        .writeStream.queryName(config.query_name)
        .option("checkpointLocation", config.checkpoint)
        .foreachBatch(apply)
    )
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.trigger_interval} seconds")
    try:
        return writer.start()
    except Exception as exc:
        if any(mark in str(exc) for mark in _CHECKPOINT_UNREACHABLE):
            raise _checkpoint_unavailable(config, exc) from None
        raise PipelineQueryError(
            f"the streaming query could not start: {_spark_reason(exc)} "
            f"(checkpoint {config.checkpoint}, change log {config.changelog})"
        ) from exc


def land_everything_logged(query: Any, config: PipelineConfig) -> None:
    """Return once ``query`` has written everything the change log holds now (or ended).
    ``processAllAvailable`` alone may return on a trigger that looked at the log before its
    last transactions were there, so the query's offset is checked against the log's end."""
    logged = ChangeLog(config.changelog, storage=config.storage).last_commit_lsn()
    while query.isActive:
        query.processAllAvailable()
        if _query_end(query) >= logged:
            return


def _query_end(query: Any) -> LSN:
    """The end offset of the query's last trigger (LSN 0 before the first)."""
    progress = query.lastProgress
    if progress is None or not progress.sources:
        return LSN(0)
    end = progress.sources[0]["endOffset"]
    if end is None:
        return LSN(0)
    return offset_lsn(json.loads(end) if isinstance(end, str) else end)


def _collect(frame: Any, batch_id: int) -> pa.Table:
    """The batch on the driver, as Arrow; a batch over ``spark.driver.maxResultSize`` is a
    typed error saying how to keep batches off the driver."""
    try:
        return frame.toArrow()
    except Exception as exc:
        if "maxResultSize" not in str(exc):
            raise
        raise SinkError(
            f"batch {batch_id} is larger than spark.driver.maxResultSize lets the driver "
            'receive: set [spark] writes = "executors" (the batch then stays in the executors, '
            "which write the Delta tables), or lower [spark] max_bytes_per_batch"
        ) from None


def _spark_reason(error: BaseException) -> str:
    """The line of a Spark error that says what went wrong: a Java error seen through py4j
    starts with the call that failed and ends with the Java stack."""
    for line in str(error).splitlines():
        reason = line.strip(": \t")
        if reason and not reason.startswith("An error occurred while calling"):
            return reason
    return type(error).__name__


def run_once(spark: Any, config: PipelineConfig) -> None:
    """Drain what the change log holds now (Trigger.AvailableNow) and return."""
    query = start(spark, config, available_now=True)
    query.awaitTermination()
    error = query.exception()
    if error is not None:
        raise PipelineQueryError(f"the pipeline query failed: {error}")


__all__ = [
    "BatchGate",
    "Chunk",
    "PipelineConfig",
    "StopRequested",
    "check_checkpoint",
    "chunks_from_arrow",
    "chunks_from_rows",
    "make_sink",
    "parse_kinds",
    "rounds",
    "run_once",
    "spark_session",
    "start",
    "stop",
    "write_chunks",
    "write_in_executors",
]
