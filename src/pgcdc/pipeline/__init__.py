"""``pgcdc pipeline run``: configuration (a TOML file, flags on top) and orchestration of the
receiver (slot -> change log, in a spawned process) and the Spark query (change log -> Delta).

Example ``pipeline.toml`` (every key optional except the conninfo, see docs/pipeline.md)::

    [source]
    conninfo = "host=db dbname=app user=cdc"
    slot = "pgcdc"
    publications = ["pgcdc"]
    create_slot = true
    snapshot = "initial"          # or "never"
    snapshot_workers = 4

    [paths]
    changelog = "./changelog"
    lake = "./lake"
    checkpoint = "./checkpoint"

    [tables]
    kinds = ["changelog", "mirror", "history"]
    "public.big_events" = ["changelog"]

    [spark]
    master = "local[*]"
    trigger_interval = 5.0
    max_changes_per_batch = 200000
"""

from __future__ import annotations

import contextlib
import logging
import threading
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg

from pgcdc.changelog import ChangeLog, ChangeLogWriter
from pgcdc.connection import server_errors
from pgcdc.connection.sql import create_logical_slot, get_slot
from pgcdc.errors import InvalidOption, PipelineQueryError
from pgcdc.lsn import LSN
from pgcdc.pipeline.origin import ConfirmGuard, SlotOrigin, load_origin, save_origin, verify
from pgcdc.pipeline.process import ReceiverProcess
from pgcdc.receiver import Receiver, ReceiverOptions, ReceiverProgress, RetryPolicy
from pgcdc.sinks import SinkKind
from pgcdc.snapshot import SnapshotResult, take_snapshot
from pgcdc.spark.pipeline import PipelineConfig, parse_kinds, spark_session, start

log = logging.getLogger(__name__)

SNAPSHOT_MODES = ("initial", "never")


@dataclass(frozen=True)
class Settings:
    """Everything ``pipeline run`` needs."""

    conninfo: str
    slot: str = "pgcdc"
    publications: tuple[str, ...] = ("pgcdc",)
    create_slot: bool = True
    # "initial": a new slot starts with a consistent snapshot of the published tables (as
    # Debezium's snapshot.mode=initial); "never": only changes from the slot's creation on.
    snapshot: str = "initial"
    snapshot_workers: int = 4
    changelog: str = "./changelog"
    lake: str = "./lake"
    checkpoint: str = "./checkpoint"
    kinds: tuple[SinkKind, ...] = (SinkKind.CHANGELOG, SinkKind.MIRROR, SinkKind.HISTORY)
    table_kinds: Mapping[str, tuple[SinkKind, ...]] = field(default_factory=dict)
    master: str = "local[*]"
    trigger_interval: float = 5.0
    max_changes_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # How the receiver rides out server faults (restarts, a terminated walsender).
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def pipeline(self) -> PipelineConfig:
        return PipelineConfig(
            changelog=self.changelog,
            lake=self.lake,
            checkpoint=self.checkpoint,
            kinds=self.kinds,
            table_kinds=dict(self.table_kinds),
            trigger_interval=self.trigger_interval,
            max_changes_per_batch=self.max_changes_per_batch,
            max_bytes_per_batch=self.max_bytes_per_batch,
        )

    def receiver(self, end_lsn: LSN | None = None) -> ReceiverOptions:
        return ReceiverOptions(
            conninfo=self.conninfo,
            slot=self.slot,
            publications=self.publications,
            create_slot=self.create_slot,
            end_lsn=end_lsn,
            fsync_interval=1.0,
            status_interval=5.0,
        )


_KEYS: dict[str, tuple[str, str, type | tuple[type, ...]]] = {
    # settings field: (TOML table, key, type)
    "conninfo": ("source", "conninfo", str),
    "slot": ("source", "slot", str),
    "publications": ("source", "publications", list),
    "create_slot": ("source", "create_slot", bool),
    "snapshot": ("source", "snapshot", str),
    "snapshot_workers": ("source", "snapshot_workers", int),
    "changelog": ("paths", "changelog", str),
    "lake": ("paths", "lake", str),
    "checkpoint": ("paths", "checkpoint", str),
    "master": ("spark", "master", str),
    "trigger_interval": ("spark", "trigger_interval", (int, float)),
    "max_changes_per_batch": ("spark", "max_changes_per_batch", int),
    "max_bytes_per_batch": ("spark", "max_bytes_per_batch", int),
    "spark_conf": ("spark", "conf", dict),
}


def load(path: str | Path | None, overrides: Mapping[str, Any]) -> Settings:
    """Settings from a TOML file (optional) with ``overrides`` (non-None flag values) on top."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except OSError as exc:
            raise InvalidOption(f"cannot read the pipeline config {path}: {exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise InvalidOption(f"{path} is not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    for name, (section, key, kind) in _KEYS.items():
        table = data.get(section, {})
        if key in table:
            if not isinstance(table[key], kind) or isinstance(table[key], bool) != (kind is bool):
                raise InvalidOption(f"[{section}] {key} = {table[key]!r} has the wrong type")
            values[name] = table[key]
    tables = dict(data.get("tables", {}))
    if "kinds" in tables:
        values["kinds"] = parse_kinds(tables.pop("kinds"))
    values["table_kinds"] = {name: parse_kinds(kinds) for name, kinds in tables.items()}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if (
        isinstance(values.get("kinds"), list | tuple)
        and values["kinds"]
        and isinstance(values["kinds"][0], str)
    ):
        values["kinds"] = parse_kinds(values["kinds"])
    if "publications" in values:
        values["publications"] = tuple(values["publications"])
    if values.get("snapshot", "initial") not in SNAPSHOT_MODES:
        raise InvalidOption(
            f"snapshot = {values['snapshot']!r}: use one of {', '.join(SNAPSHOT_MODES)}"
        )
    if not values.get("conninfo"):
        raise InvalidOption(
            "no source database: pass -d/--dbname (a conninfo or URI) or set [source] conninfo "
            "in the config file"
        )
    return Settings(**values)


def current_wal_lsn(conninfo: str) -> LSN:
    """The server's current WAL insert position: what ``--once`` drains up to."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return LSN.parse(row[0])


def receive(
    settings: Settings, end_lsn: LSN | None, stop: threading.Event | None
) -> ReceiverProgress:
    """Run the receiver into the change log until ``end_lsn`` or ``stop``, after the initial
    snapshot when this is the pipeline's first start. The slot must be the one the log was
    filled from (``claim_slot``). Server faults a new session can get past are retried as
    ``settings.retry`` says; the others end the run with their error."""
    with ChangeLog(settings.changelog).writer() as writer:
        guard = ConfirmGuard(settings.changelog)

        def claim() -> None:
            # Before every session: a slot replaced while the receiver was away is refused.
            guard.origin = claim_slot(settings, writer)

        receiver = Receiver(
            settings.receiver(end_lsn), writer, on_confirm=guard, before_session=claim
        )
        return receiver.run(stop, retry=settings.retry)


def claim_slot(settings: Settings, writer: ChangeLogWriter) -> SlotOrigin | None:
    """Make sure the slot can fill this change log without a gap, and keep recording it.

    A log that holds transactions (or has a recorded slot) goes on only with the same slot,
    still valid and not moved past what pgcdc confirmed (``origin.verify``); anything else is
    a typed error saying how to start over, never a new slot. A new log starts with a new slot:
    with ``snapshot = "initial"`` a snapshot of the published tables (only a new slot exports
    the snapshot that matches its start), else the slot is created here, so that its start is
    recorded before anything streams. None: no slot to record (the receiver reports it).
    Connection errors are typed, so the receiver's retries ride them out."""
    root = settings.changelog
    origin = load_origin(root)
    fresh = origin is None and writer.last_commit_lsn == 0
    with (
        server_errors.translated(),
        psycopg.connect(settings.conninfo, autocommit=True) as conn,
    ):
        database = conn.info.dbname
        slot = get_slot(conn, settings.slot)
        if not fresh:
            origin = verify(
                origin, slot, name=settings.slot, database=database, log_end=writer.durable_lsn
            )
        elif slot is not None:
            if settings.snapshot == "initial":
                log.warning(
                    "slot %s already exists, so no initial snapshot was taken: the lake will "
                    "hold only changes the slot streams (drop the slot to start over with a "
                    "snapshot)",
                    settings.slot,
                )
            if slot.confirmed_flush_lsn is not None:
                start = slot.confirmed_flush_lsn
                origin = SlotOrigin(settings.slot, database, start, start)
        elif settings.snapshot != "initial" and settings.create_slot:
            start = create_logical_slot(conn, settings.slot, "pgoutput")
            origin = SlotOrigin(settings.slot, database, start, start)
    if fresh and origin is None and settings.snapshot == "initial":
        result = initial_snapshot(settings, writer)
        start = result.consistent_point
        origin = SlotOrigin(settings.slot, database, start, start)
    if origin is not None:
        save_origin(root, origin)
    return origin


def initial_snapshot(settings: Settings, writer: ChangeLogWriter) -> SnapshotResult:
    """Create the slot and snapshot the published tables into the (empty) change log."""
    result = take_snapshot(
        settings.conninfo,
        slot=settings.slot,
        sink=writer,
        publications=settings.publications,
        workers=settings.snapshot_workers,
    )
    writer.flush()
    log.info(
        "initial snapshot: %d rows of %d tables at %s",
        result.rows,
        len(result.tables),
        result.consistent_point,
    )
    return result


@contextlib.contextmanager
def _session(settings: Settings) -> Iterator[Any]:
    spark = spark_session(settings.master, "pgcdc-pipeline", **dict(settings.spark_conf))
    try:
        yield spark
    finally:
        spark.stop()


def run(
    settings: Settings,
    *,
    once: bool = False,
    stop: threading.Event | None = None,
    spark: Any = None,
    on_tick: Callable[[Any], None] | None = None,
    tick_seconds: float = 5.0,
) -> None:
    """Run the pipeline. ``once``: drain what the server has now and return. Otherwise run
    until ``stop`` is set (or a part fails), then stop the query and the receiver cleanly."""
    stop = stop or threading.Event()
    with contextlib.ExitStack() as stack:
        end_lsn = current_wal_lsn(settings.conninfo) if once else None
        # A process of its own: in a thread the receiver shared the GIL with foreachBatch.
        # It starts first and logs while the Spark session starts (seconds); if that fails,
        # the stack stops it.
        receiver = ReceiverProcess(settings, end_lsn)
        receiver.start()
        stack.callback(receiver.join)
        stack.callback(receiver.stop)
        if spark is None:
            spark = stack.enter_context(_session(settings))
        # Spark starts and writes while the receiver is still logging: with --once too, so
        # the query's start-up and first batches overlap the receiving.
        query = start(spark, settings.pipeline())
        try:
            while not stop.is_set():
                if receiver.error is not None or not query.isActive:
                    break
                if once and not receiver.is_alive():
                    # Everything up to end_lsn is logged: drain it, then stop.
                    try:
                        query.processAllAvailable()
                    except Exception:
                        if query.exception() is None:
                            raise
                    break
                if on_tick is not None:
                    on_tick(spark)
                if once:
                    receiver.join(min(tick_seconds, 0.2))
                else:
                    stop.wait(tick_seconds)
        finally:
            stop.set()
            receiver.stop()
            query.stop()
            receiver.join()
        if receiver.error is not None:
            raise receiver.error
        error = query.exception()
        if error is not None:
            raise PipelineQueryError(f"the pipeline query failed: {error}")


def with_overrides(settings: Settings, **changes: Any) -> Settings:
    return replace(settings, **changes)


__all__ = [
    "Settings",
    "claim_slot",
    "current_wal_lsn",
    "load",
    "receive",
    "run",
    "with_overrides",
]
