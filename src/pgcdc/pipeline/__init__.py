"""``pgcdc pipeline run``: configuration (a TOML file, flags on top) and orchestration of the
receiver (slot -> change log, in a spawned process) and the Spark query (change log -> Delta).

Example ``pipeline.toml`` (every key optional except the conninfo, see docs/pipeline.md)::

    [source]
    conninfo = "host=db dbname=app user=cdc"
    slot = "pgcdc"
    publications = ["pgcdc"]
    create_slot = true
    failover = true               # a new slot is a failover slot (PostgreSQL 17+)
    snapshot = "initial"          # or "never"
    snapshot_workers = 4
    snapshot_copy_format = "auto" # binary COPY where the types allow, else text; or "text"
    snapshot_in = "auto"          # "executors": Spark tasks copy into Delta; "receiver":
                                  # through the change log (auto: executors)
    standby = false               # true: decode on a hot standby (PostgreSQL 16+), read-only
    receive_timeout = 60.0        # seconds of silence before the connection counts as lost

    [paths]
    changelog = "./changelog"
    lake = "./lake"
    checkpoint = "./checkpoint"
    umask = "077"                 # files 0600, directories 0700 (the default)
    # for s3:// paths (else AWS_* from the environment; see docs/deployment.md)
    storage_options = { aws_endpoint_url = "https://s3.example.com", aws_region = "eu-west-1" }

    [tables]
    kinds = ["changelog", "mirror", "history"]
    "public.big_events" = ["changelog"]

    [delta]
    compact_files = 200           # compact a table once it holds this many small files (0: never)

    [spark]
    master = "local[*]"
    writes = "auto"               # Delta writes in "executors" or on the "driver" (auto: the
                                  # driver for a local master, executors for a cluster)
    trigger_interval = 5.0        # seconds between batches (with --once: 0.25 at most)
    max_changes_per_batch = 200000
    stop_timeout = 60.0           # on a stop, seconds the batch being written may take to finish
                                  # before it is interrupted (then replayed on the next start)
"""

from __future__ import annotations

import contextlib
import difflib
import logging
import math
import os
import re
import signal
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pgcdc.changelog import ChangeLog, ChangeLogWriter
from pgcdc.connection import server_errors
from pgcdc.connection.commands import supports_failover
from pgcdc.connection.conninfo import connect, normalize
from pgcdc.connection.deadline import answered_within
from pgcdc.connection.preflight import LOGICAL_DECODING_ON_STANDBY
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.connection.sql import SlotInfo, create_logical_slot, drop_slot, get_slot
from pgcdc.connection.standby import in_recovery
from pgcdc.errors import (
    InvalidOption,
    PgcdcError,
    PipelineQueryError,
    ServerIsStandby,
    SlotNotFound,
    SnapshotError,
    StatementTimedOut,
    StorageError,
    UnsupportedFeature,
)
from pgcdc.lsn import LSN
from pgcdc.pipeline.origin import (
    ConfirmGuard,
    PendingSnapshot,
    ServerTimeline,
    SlotOrigin,
    clear_snapshot_pending,
    load_origin,
    mark_snapshot_pending,
    save_origin,
    snapshot_pending,
    verify,
)
from pgcdc.pipeline.process import ReceiverProcess
from pgcdc.receiver import (
    DEFAULT_RECEIVE_TIMEOUT,
    Backoff,
    Receiver,
    ReceiverOptions,
    ReceiverProgress,
    RetryPolicy,
    first_line,
)
from pgcdc.sinks.kinds import DEFAULT_COMPACT_FILES, SinkKind, parse_kinds
from pgcdc.snapshot import (
    COPY_FORMATS,
    SnapshotResult,
    recopy_tables,
    snapshot_tables,
    take_snapshot,
)
from pgcdc.storage import StorageOptions

if TYPE_CHECKING:  # imported when a query starts: the receiver's process never loads Spark
    from pgcdc.spark.pipeline import PipelineConfig

log = logging.getLogger(__name__)

# How often the pipeline's receiver makes the change log durable: the data source reads only
# durable transactions, so at low rates this is part of every change's commit-to-visible time.
RECEIVER_FLUSH_SECONDS = 0.25
# A --once run's trigger interval at most: its query waits only for the receiver's end.
ONCE_POLL = 0.25
SNAPSHOT_MODES = ("initial", "never")
WRITES_MODES = ("auto", "driver", "executors")
SNAPSHOT_PLACES = ("auto", "executors", "receiver")
# Change data is production data: files 0600 and directories 0700 unless configured otherwise.
DEFAULT_UMASK = 0o077
# Spark's master URL forms (SparkContext.createTaskScheduler); others fail deep inside the JVM.
_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?|local-cluster\[\d+,\s*\d+,\s*\d+\]"
    r"|(spark|mesos|k8s)://\S+|yarn"
)
_PYTHON_ERROR = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception)): (.+)$")


@dataclass(frozen=True)
class Settings:
    """Everything ``pipeline run`` needs."""

    conninfo: str
    slot: str = "pgcdc"
    publications: tuple[str, ...] = ("pgcdc",)
    create_slot: bool = True
    # A slot the pipeline creates is a failover slot where the server supports them (17+):
    # standbys with sync_replication_slots keep a copy, so the pipeline follows a promotion.
    failover: bool = True
    # "initial": a new slot starts with a consistent snapshot of the published tables (as
    # Debezium's snapshot.mode=initial); "never": only changes from the slot's creation on.
    snapshot: str = "initial"
    snapshot_workers: int = 4
    # The snapshot's COPY format (pgcdc.snapshot.COPY_FORMATS): "auto" copies a table in binary
    # format when every column type has a binary decoder (else in text), "text" every table.
    snapshot_copy_format: str = "auto"
    # Where the initial snapshot is copied: "executors" (Spark tasks COPY chunks and write the
    # Delta tables, one commit per table; the rows skip the change log), "receiver" (the
    # receiver's threads copy into the change log, and the query lands it like any
    # transaction), or "auto" (executors).
    snapshot_in: str = "auto"
    # pgoutput's binary format: the walsender sends send-function output (cheaper for numeric,
    # timestamps, arrays); values land as in text format.
    binary: bool = False
    # pgoutput's two-phase decoding (PostgreSQL 15+): a prepared transaction is decoded at
    # PREPARE and held in the receiver until COMMIT PREPARED lands it (ROLLBACK PREPARED drops
    # it), so a large one is not decoded all at once at its commit. Enabled on the slot at its
    # first start and, before PostgreSQL 17, not turned off again.
    two_phase: bool = False
    changelog: str = "./changelog"
    lake: str = "./lake"
    checkpoint: str = "./checkpoint"
    # The umask the pipeline (and its receiver process, Spark's JVM and Hadoop's file system)
    # creates the change log, consumer state, lake and checkpoint with.
    umask: int = DEFAULT_UMASK
    # How to reach s3:// paths (the change log, the lake); empty: the environment's AWS_*.
    storage: StorageOptions = field(default_factory=StorageOptions)
    kinds: tuple[SinkKind, ...] = (SinkKind.CHANGELOG, SinkKind.MIRROR, SinkKind.HISTORY)
    table_kinds: Mapping[str, tuple[SinkKind, ...]] = field(default_factory=dict)
    master: str = "local[*]"
    trigger_interval: float = 5.0
    max_changes_per_batch: int | None = None
    max_bytes_per_batch: int | None = None
    spark_conf: Mapping[str, str] = field(default_factory=dict)
    # Where a batch's Delta writes run: "executors" (the batch's data never reaches the
    # driver), "driver" (no shuffle: what a local master does best), or "auto" (the driver for
    # a local master, executors for any other).
    writes: str = "auto"
    # On a stop, seconds the batch being written may take to finish before it is interrupted
    # (an interrupted batch is replayed on the next start).
    stop_timeout: float = 60.0
    # Compact a Delta table (small files binned into large ones, no row changed) once it holds
    # this many files under the target size; 0: never (pgcdc.sinks.delta.compact_if_fragmented).
    compact_files: int = DEFAULT_COMPACT_FILES
    # How the receiver rides out server faults (restarts, a terminated walsender).
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Seconds of silence on the replication connection before it counts as lost and is
    # replaced (a network partition leaves the socket open); 0 waits for ever.
    receive_timeout: float = DEFAULT_RECEIVE_TIMEOUT
    # Decode on a hot standby (PostgreSQL 16+): the server may be in recovery. Off by default
    # so that a multi-host conninfo never streams from a standby by accident after a failover.
    standby: bool = False
    # Tables to re-copy before streaming on (``--recopy schema.table``, never in the file: a
    # one-off remedy for rows a table rewrite left stale downstream).
    recopy: tuple[str, ...] = ()

    def pipeline(self) -> PipelineConfig:
        from pgcdc.spark.pipeline import PipelineConfig

        return PipelineConfig(
            changelog=self.changelog,
            lake=self.lake,
            checkpoint=self.checkpoint,
            kinds=self.kinds,
            table_kinds=dict(self.table_kinds),
            trigger_interval=self.trigger_interval,
            max_changes_per_batch=self.max_changes_per_batch,
            max_bytes_per_batch=self.max_bytes_per_batch,
            storage=self.storage,
            writes=self.resolved_writes,
            compact_files=self.compact_files,
        )

    @property
    def resolved_snapshot_in(self) -> str:
        """``snapshot_in`` with "auto" decided."""
        return "executors" if self.snapshot_in == "auto" else self.snapshot_in

    @property
    def resolved_writes(self) -> str:
        """``writes`` with "auto" decided by the master."""
        if self.writes != "auto":
            return self.writes
        return "driver" if self.master.startswith("local") else "executors"

    def receiver(self, end_lsn: LSN | None = None) -> ReceiverOptions:
        return ReceiverOptions(
            conninfo=self.conninfo,
            slot=self.slot,
            publications=self.publications,
            create_slot=self.create_slot,
            binary=self.binary,
            two_phase=self.two_phase,
            end_lsn=end_lsn,
            fsync_interval=RECEIVER_FLUSH_SECONDS,
            status_interval=5.0,
            receive_timeout=self.receive_timeout,
        )


_KEYS: dict[str, tuple[str, str, type | tuple[type, ...]]] = {
    # settings field: (TOML table, key, type)
    "conninfo": ("source", "conninfo", str),
    "slot": ("source", "slot", str),
    "publications": ("source", "publications", list),
    "create_slot": ("source", "create_slot", bool),
    "failover": ("source", "failover", bool),
    "snapshot": ("source", "snapshot", str),
    "snapshot_workers": ("source", "snapshot_workers", int),
    "snapshot_copy_format": ("source", "snapshot_copy_format", str),
    "snapshot_in": ("source", "snapshot_in", str),
    "binary": ("source", "binary", bool),
    "two_phase": ("source", "two_phase", bool),
    "receive_timeout": ("source", "receive_timeout", (int, float)),
    "standby": ("source", "standby", bool),
    "changelog": ("paths", "changelog", str),
    "lake": ("paths", "lake", str),
    "checkpoint": ("paths", "checkpoint", str),
    "umask": ("paths", "umask", str),
    "storage": ("paths", "storage_options", dict),
    "master": ("spark", "master", str),
    "trigger_interval": ("spark", "trigger_interval", (int, float)),
    "max_changes_per_batch": ("spark", "max_changes_per_batch", int),
    "max_bytes_per_batch": ("spark", "max_bytes_per_batch", int),
    "spark_conf": ("spark", "conf", dict),
    "writes": ("spark", "writes", str),
    "stop_timeout": ("spark", "stop_timeout", (int, float)),
    "compact_files": ("delta", "compact_files", int),
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
    _check_keys(path, data)
    values: dict[str, Any] = {}
    for name, (section, key, kind) in _KEYS.items():
        table = data.get(section, {})
        if key in table:
            if not isinstance(table[key], kind) or isinstance(table[key], bool) != (kind is bool):
                # The value is not echoed: a misplaced secret (a password, a key) stays unprinted.
                wanted, found = _toml_kind(kind), _toml_kind(type(table[key]))
                raise InvalidOption(f"[{section}] {key} must be {wanted}, not {found}")
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
    if values.get("recopy"):
        values["recopy"] = tuple(dict.fromkeys(map(recopy_name, values["recopy"])))
    if values.get("snapshot", "initial") not in SNAPSHOT_MODES:
        raise InvalidOption(
            f"snapshot = {values['snapshot']!r}: use one of {', '.join(SNAPSHOT_MODES)}"
        )
    if values.get("snapshot_copy_format", "auto") not in COPY_FORMATS:
        raise InvalidOption(
            f"snapshot_copy_format = {values['snapshot_copy_format']!r}: use one of "
            f"{', '.join(COPY_FORMATS)}"
        )
    if not values.get("conninfo"):
        raise InvalidOption(
            "no source database: pass -d/--dbname (a conninfo or URI) or set [source] conninfo "
            "in the config file"
        )
    values["conninfo"] = normalize(values["conninfo"])
    if "umask" in values:
        values["umask"] = parse_umask(values["umask"])
    if isinstance(values.get("storage"), Mapping):
        values["storage"] = StorageOptions.parse(
            values["storage"], f"{path}: [paths] storage_options"
        )
    settings = Settings(**values)
    _validate(settings)
    return settings


# What a config key takes, or was given, as the TOML file spells it (for errors).
_TOML_KINDS: dict[type | tuple[type, ...], str] = {
    str: "a string", bool: "true or false", int: "an integer", float: "a float",
    (int, float): "a number", list: "an array", dict: "a table",
}  # fmt: skip


def _toml_kind(kind: type | tuple[type, ...]) -> str:
    """A TOML value type as the config file spells it; tomllib's other values are dates and
    times."""
    return _TOML_KINDS.get(kind, "a date or time")


def _check_keys(path: str | Path | None, data: Mapping[str, Any]) -> None:
    """Refuse unknown sections and keys: a misspelt key silently ignored leaves a setting at
    its default (``slot_name`` streaming from slot "pgcdc"). Names the closest valid key."""
    sections: dict[str, list[str]] = {}
    for section, key, _ in _KEYS.values():
        sections.setdefault(section, []).append(key)
    sections["tables"] = ["kinds"]

    def unknown(what: str, name: str, choices: list[str], where: str = "") -> InvalidOption:
        close = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return InvalidOption(
            f"{path}: unknown {what} {name!r}{where}; {hint}valid: {', '.join(choices)} "
            "(see docs/pipeline.md)"
        )

    for section, table in data.items():
        if section not in sections:
            raise unknown("section", f"[{section}]", [f"[{s}]" for s in sections])
        if not isinstance(table, dict):
            found = _toml_kind(type(table))
            raise InvalidOption(f"{path}: [{section}] must be a table of keys, not {found}")
        for key in table:
            if section == "tables" and (key == "kinds" or "." in key):
                continue  # "schema.table" = [kinds]
            if key in sections[section]:
                continue
            home = next((s for s, keys in sections.items() if key in keys), None)
            if home is not None:
                raise InvalidOption(f"{path}: {key!r} belongs in [{home}], not in [{section}]")
            where = f" in [{section}]"
            if section == "tables":
                where += " (a table is named schema.table)"
            raise unknown("key", key, sections[section], where)


# schema.table, each part a plain name or a double-quoted one ("" for a quote inside).
_QUALIFIED_NAME = re.compile(r'(?:[^".\s]+|"(?:[^"]|"")+")\.(?:[^".\s]+|"(?:[^"]|"")+")')


def recopy_name(name: str) -> str:
    """A ``--recopy`` table as given, once it is a qualified name (schema.table, as in SQL:
    unquoted parts fold to lower case); InvalidOption naming the form otherwise."""
    if not _QUALIFIED_NAME.fullmatch(name):
        raise InvalidOption(
            f"--recopy {name!r} is not a table name: give it as schema.table (public.orders; "
            'double-quote a part with capitals, dots or spaces: public."Order Lines")'
        )
    return name


def parse_umask(value: str | int) -> int:
    """An octal umask ("077", "0027") as an int; InvalidOption when it is not one."""
    if isinstance(value, int):
        number = value
    else:
        try:
            number = int(value, 8)
        except ValueError:
            number = -1
    if not 0 <= number <= 0o777:
        raise InvalidOption(
            f"umask = {value!r}: give an octal umask such as 077 (files 0600, directories "
            "0700: the default) or 027 (group may read)"
        )
    return number


@contextlib.contextmanager
def umask(mask: int) -> Iterator[None]:
    """The process umask set to ``mask`` for the block: what the receiver process and Spark's
    JVM inherit when they start, and what delta-rs creates the lake's files with."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def _validate(settings: Settings) -> None:
    """Refuse what would otherwise fail later, deep in Spark or in the receiver process."""
    if not _MASTER.fullmatch(settings.master):
        raise InvalidOption(
            f"master = {settings.master!r} is not a Spark master URL; use local[*], local[N], "
            "spark://HOST:PORT, yarn or k8s://HOST:PORT"
        )
    if settings.snapshot_in not in SNAPSHOT_PLACES:
        raise InvalidOption(
            f"snapshot_in = {settings.snapshot_in!r}: use one of {', '.join(SNAPSHOT_PLACES)} "
            "(where the initial snapshot is copied)"
        )
    if settings.writes not in WRITES_MODES:
        raise InvalidOption(
            f"writes = {settings.writes!r}: use one of {', '.join(WRITES_MODES)} (where a "
            "batch's Delta writes run)"
        )
    speculation = str(settings.spark_conf.get("spark.speculation", "false")).lower()
    if speculation == "true" and settings.resolved_writes == "executors":
        raise InvalidOption(
            "spark.speculation = true with Delta writes in executors: a speculative copy of a "
            "write task would race its original on the same Delta tables; leave "
            'spark.speculation off or set [spark] writes = "driver"'
        )
    seconds = {
        "trigger_interval": "give the seconds between batches, 0 or more",
        "stop_timeout": "give the seconds a stop waits for the batch being written, 0 or more",
        "receive_timeout": "give a positive number of seconds of silence before the "
        "replication connection counts as lost, or 0 to wait for ever",
    }
    for name, remedy in seconds.items():
        value = getattr(settings, name)
        if isinstance(value, bool) or not math.isfinite(value) or value < 0:
            raise InvalidOption(f"{name} = {value!r}: {remedy}")
    for name in ("snapshot_workers", "max_changes_per_batch", "max_bytes_per_batch"):
        value = getattr(settings, name)
        if value is not None and value <= 0:
            raise InvalidOption(f"{name} = {value!r}: give a positive integer")
    if settings.compact_files < 0 or settings.compact_files == 1:
        raise InvalidOption(
            f"compact_files = {settings.compact_files!r}: give the number of small files (2 or "
            "more) a Delta table may hold before it is compacted, or 0 never to compact"
        )
    for name in ("changelog", "lake", "checkpoint"):
        if "://" in getattr(settings, name):
            continue
        path = Path(getattr(settings, name))
        if path.exists() and not path.is_dir():
            raise InvalidOption(
                f"{name} = {str(path)!r} is a file, not a directory; give a directory "
                f"(it is created when missing)"
            )


def query_failure(error: Any, what: str = "the pipeline query") -> PgcdcError:
    """A failed query (or Spark job: ``what``) as one line: the Python error a task or
    foreachBatch raised (Spark wraps it in a Java stack), a full disk as a StorageError that
    says what to do."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines()]
    spark = ("org.", "java.", "scala.", "py4j.", "pyspark.")
    python = [m for m in map(_PYTHON_ERROR.match, lines) if m and not m[1].startswith(spark)]
    reason = python[-1].group(0) if python else next((line for line in lines if line), "")
    if re.search(r"No space left on device|os error 28|Errno 28", text):
        return StorageError(
            f"the lake or the checkpoint is out of space ({reason}); free space on that file "
            "system, then run the same command again: it resumes from what was stored"
        )
    return PipelineQueryError(f"{what} failed: {reason or type(error).__name__}")


def missing_slot(settings: Settings) -> SlotNotFound:
    return SlotNotFound(
        f"replication slot {settings.slot!r} does not exist, and create_slot = false "
        "(--no-create-slot) forbids creating it; create it first (pgcdc --create-slot -S "
        f"{settings.slot} -P pgoutput --enable-failover -d ...; leave out --enable-failover "
        "before PostgreSQL 17; the pipeline then takes no initial snapshot), "
        "or leave out --no-create-slot to let the pipeline create it with a snapshot"
    )


def check_server_role(conn: Any, *, standby_allowed: bool = False) -> bool:
    """Whether the server is a standby. Unless ``standby_allowed`` (``standby = true``), a standby
    reached (libpq takes the first host that answers unless target_session_attrs says
    otherwise) is a ServerIsStandby, which the receiver retries (a promotion makes it the
    primary); allowed, it must be PostgreSQL 16+, the first to decode in recovery. A primary
    is accepted either way: a standby decoded on may be promoted, and its slot goes on."""
    standby = in_recovery(conn)
    if standby and not standby_allowed:
        raise ServerIsStandby(
            f"the server at {conn.info.host}:{conn.info.port} is a standby (in recovery), and "
            "the pipeline streams from the primary; name every server in the conninfo with "
            "target_session_attrs=primary (host=a,b ... target_session_attrs=primary) so that "
            "libpq picks the primary, or set [source] standby = true to decode on this standby "
            "(PostgreSQL 16+, see docs/ha.md)"
        )
    if standby and conn.info.server_version < LOGICAL_DECODING_ON_STANDBY:
        version = conn.info.server_version
        raise UnsupportedFeature(
            f"the server at {conn.info.host}:{conn.info.port} is a standby running PostgreSQL "
            f"{version // 10000}, and logical decoding on a standby needs PostgreSQL 16 or "
            "later: upgrade the standby and its primary to 16+, or decode on the primary "
            "(standby = false, a conninfo with target_session_attrs=primary)"
        )
    return standby


def _start_checks(settings: Settings) -> LSN:
    """Before anything starts: the server answers, the slot is there unless it may be created.
    Returns the server's current WAL position (what ``--once`` drains up to)."""
    with connect(settings.conninfo) as conn:
        check_server_role(conn, standby_allowed=settings.standby)
        if not settings.create_slot and get_slot(conn, settings.slot) is None:
            raise missing_slot(settings)
        if settings.recopy:
            # Exists and is published (what the re-copy copies, as the slot streams it).
            try:
                snapshot_tables(conn, settings.recopy, settings.publications)
            except SnapshotError as error:
                raise SnapshotError(f"--recopy: {error}") from None
            conn.rollback()
        return _wal_end(conn)


def _wal_end(conn: Any) -> LSN:
    """The WAL position a slot can be decoded up to now: the primary's insert position, or
    on a standby what it has replayed (it has no insert position of its own)."""
    row = conn.execute(
        "SELECT (CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() "
        "ELSE pg_current_wal_lsn() END)::text"
    ).fetchone()
    assert row is not None
    return LSN.parse(row[0])


def current_wal_lsn(conninfo: str) -> LSN:
    """The server's current WAL position (replayed, on a standby): what ``--once`` drains up
    to."""
    with connect(conninfo) as conn:
        return _wal_end(conn)


def receive(
    settings: Settings, end_lsn: LSN | None, stop: threading.Event | None
) -> ReceiverProgress:
    """Run the receiver into the change log until ``end_lsn`` or ``stop``, after the initial
    snapshot when this is the pipeline's first start. The slot must be the one the log was
    filled from (``claim_slot``). Server faults a new session can get past are retried as
    ``settings.retry`` says; the others end the run with their error."""
    # On object storage a crashed predecessor's lease is waited out (up to its length).
    log_writer = ChangeLog(settings.changelog, storage=settings.storage).writer(lease_wait=True)
    with log_writer as writer:
        guard = ConfirmGuard(settings.changelog, storage=settings.storage)

        def claim() -> None:
            # Before every session: a slot replaced while the receiver was away is refused.
            guard.origin = claim_slot(settings, writer)

        def receiver(end: LSN | None) -> Receiver:
            return Receiver(settings.receiver(end), writer, on_confirm=guard, before_session=claim)

        if settings.recopy:
            if not recopy(settings, writer, receiver, claim, stop):
                return ReceiverProgress(stopped_by="stop")
            if end_lsn is not None:  # --once: what the server holds once the copy is logged
                end_lsn = max(end_lsn, current_wal_lsn(settings.conninfo))
        return receiver(end_lsn).run(stop, retry=settings.retry)


def recopy(
    settings: Settings,
    writer: ChangeLogWriter,
    receiver: Callable[[LSN | None], Receiver],
    claim: Callable[[], None],
    stop: threading.Event | None,
) -> bool:
    """Re-copy ``settings.recopy`` into the change log (``pgcdc.snapshot.recopy_tables``):
    the slot is drained up to the copy's consistent point C (``end_lsn`` C stores every
    transaction whose commit starts before C and leaves the others unread), then the copy is
    logged at C - 1, and streaming goes on from the slot. False: stopped before the copy.

    A crash before the copy's transaction is flushed leaves no part of it in the log (a
    transaction is logged whole or not at all) and the slot confirmed no further than the
    log: the same command re-copies again."""
    claim()  # the slot first: a new log's initial snapshot (or new slot) comes before C

    def drain_to(consistent_point: LSN) -> bool:
        progress = receiver(consistent_point).run(stop, retry=settings.retry)
        return progress.stopped_by == "end_lsn"

    result = recopy_tables(
        settings.conninfo,
        sink=writer,
        tables=settings.recopy,
        publications=settings.publications,
        drain_to=drain_to,
        workers=settings.snapshot_workers,
        copy_format=settings.snapshot_copy_format,
        on_progress=lambda progress: log.info("re-copy: %s", progress),
    )
    if result is None:
        return False
    log.info(
        "re-copied %s: %d rows at %s",
        ", ".join(t.qualified_name for t in result.tables),
        result.rows,
        result.consistent_point,
    )
    return True


# Takes the initial snapshot: (settings, the new change log's writer, on a standby, the
# consistent point an interrupted snapshot resumes from or None).
TakeSnapshot = Callable[[Settings, ChangeLogWriter, bool, LSN | None], SnapshotResult]


def claim_slot(
    settings: Settings,
    writer: ChangeLogWriter,
    take_snapshot: TakeSnapshot | None = None,
) -> SlotOrigin | None:
    """Make sure the slot can fill this change log without a gap, and keep recording it.

    A log that holds transactions (or has a recorded slot) goes on only with the same slot,
    still valid and not moved past what pgcdc confirmed (``origin.verify``); anything else is
    a typed error saying how to start over, never a new slot. A new log starts with a new slot:
    with ``snapshot = "initial"`` a snapshot of the published tables (only a new slot exports
    the snapshot that matches its start), else the slot is created here, so that its start is
    recorded before anything streams. None: no slot to record (the receiver reports it).
    Connection errors are typed, so the receiver's retries ride them out. ``take_snapshot``
    (settings, writer, on a standby, the consistent point to resume from or None) takes the
    initial snapshot; by default the receiver's threads copy it into the change log
    (``initial_snapshot``).

    A snapshot interrupted by a crash (of the server or of pgcdc) leaves its slot behind with
    nothing in the log. One the executors were landing resumes from that slot when it still
    starts where the snapshot was taken (``_resumable``): the tables already landed stay.
    Any other such slot is dropped and the snapshot taken again, never streamed from without
    the rows it should have started with."""
    root = settings.changelog
    origin = load_origin(root, settings.storage)
    fresh = origin is None and writer.last_commit_lsn == 0
    writer.flush()  # what the last session appended counts as held (log_end below)
    # Lookups are held to receive_timeout, as the stream is: on a silent network they end with
    # ConnectionLost, which the receiver retries (creating a slot or a snapshot may take long).
    timeout = settings.receive_timeout or None
    server = server_timeline(settings.conninfo, origin.timeline if origin else None, timeout)
    with server_errors.translated(), connect(settings.conninfo) as conn:
        with answered_within(conn, timeout, "looking the server and slot up"):
            standby = check_server_role(conn, standby_allowed=settings.standby)
            database = conn.info.dbname
            slot = get_slot(conn, settings.slot)
        pending = snapshot_pending(root, settings.storage) if fresh and slot else None
        resume_from = None
        if slot is not None and pending is not None and pending.slot == settings.slot:
            resume_from = _resumable(settings, pending, slot, take_snapshot is not None)
            if resume_from is None:
                log.warning(
                    "the initial snapshot into %s was interrupted before it completed: "
                    "dropping the slot %s it created and taking the snapshot again",
                    root,
                    settings.slot,
                )
                drop_slot(conn, settings.slot, if_exists=True)
            else:
                log.warning(
                    "the initial snapshot into %s was interrupted before it completed: "
                    "resuming it from slot %s (at %s), with the tables not landed yet",
                    root,
                    settings.slot,
                    resume_from,
                )
            slot = None
        if not fresh:
            origin = verify(
                origin,
                slot,
                name=settings.slot,
                database=database,
                log_end=writer.durable_lsn,
                server=server,
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
        elif not settings.create_slot:
            raise missing_slot(settings)
        elif settings.snapshot != "initial":
            start = _create_slot(conn, settings, standby=standby)
            origin = SlotOrigin(settings.slot, database, start, start)
    if fresh and origin is None and settings.snapshot == "initial":
        if resume_from is None:  # else the mark holds where the resume starts from
            mark_snapshot_pending(root, settings.slot, settings.storage)
        result = (take_snapshot or initial_snapshot)(settings, writer, standby, resume_from)
        start = result.consistent_point
        origin = SlotOrigin(settings.slot, database, start, start)
    if origin is not None:
        if origin.timeline is None:  # a new record: where it started
            origin = replace(origin, system_id=server.system_id, timeline=server.timeline)
        if standby:  # the slot is this standby's own: a promotion of it keeps the slot
            origin = replace(origin, on_standby=True)
        save_origin(root, origin, settings.storage)
        clear_snapshot_pending(root, settings.storage)
    return origin


def _resumable(
    settings: Settings, pending: PendingSnapshot, slot: SlotInfo, can_resume: bool
) -> LSN | None:
    """Where an interrupted initial snapshot can resume from, or None: only one the executors
    land (tables commit one by one; the receiver's path writes one transaction), from its
    slot still at the consistent point it recorded (nothing streamed, no WAL lost)."""
    point = pending.consistent_point
    if not can_resume or point is None or settings.snapshot != "initial":
        return None
    if settings.resolved_snapshot_in != "executors":
        return None
    if slot.invalidated or slot.confirmed_flush_lsn != point or slot.plugin != "pgoutput":
        return None
    return point


def _creating_on_standby(settings: Settings) -> None:
    """Creating a slot on a standby waits for the primary to log its running transactions:
    pgcdc writes nothing to the source, so on an idle primary someone must run
    pg_log_standby_snapshot() there. Said before the wait, which may be long."""
    log.warning(
        "creating slot %s on a standby: this waits until the primary logs its running "
        "transactions (every 15 s while it writes; on an idle primary run SELECT "
        "pg_log_standby_snapshot() on the primary)",
        settings.slot,
    )


def _create_slot(conn: Any, settings: Settings, *, standby: bool) -> LSN:
    """Create the pipeline's slot (without a snapshot); returns its consistent point. On a
    standby it is never a failover slot: the server refuses one created in recovery."""
    failover = settings.failover and not standby and supports_failover(conn.info.server_version)
    if standby:
        _creating_on_standby(settings)
    try:
        return create_logical_slot(conn, settings.slot, "pgoutput", failover=failover)
    except StatementTimedOut as error:
        if not standby:
            raise
        # Retried by the receiver (a timeout is transient), one log line per attempt.
        raise StatementTimedOut(
            f"creating slot {settings.slot!r} on the standby waited longer than "
            "statement_timeout for the primary to log its running transactions; run SELECT "
            "pg_log_standby_snapshot() on the primary (or let it write)",
            sqlstate=error.sqlstate,
        ) from error


def server_timeline(
    conninfo: str, known_timeline: int | None, timeout: float | None = None
) -> ServerTimeline:
    """The server's system identifier and timeline (IDENTIFY_SYSTEM), and when it is not on
    ``known_timeline`` (the change log's), where each earlier timeline ended
    (TIMELINE_HISTORY): what ``origin.verify`` checks a failover against. Answered within
    ``timeout`` seconds (None: no limit), else ConnectionLost."""
    conn = ReplicationConnection.connect(conninfo, application_name="pgcdc")
    try:
        with answered_within(conn.connection, timeout, "IDENTIFY_SYSTEM"):
            identity = conn.identify_system()
            switchpoints: dict[int, LSN] = {}
            if known_timeline is not None and identity.timeline not in (known_timeline, 1):
                switchpoints = conn.timeline_history(identity.timeline).switchpoints()
    finally:
        conn.close()
    return ServerTimeline(identity.system_id, identity.timeline, switchpoints)


def initial_snapshot(
    settings: Settings,
    writer: ChangeLogWriter,
    standby: bool = False,
    resume_from: LSN | None = None,
) -> SnapshotResult:
    """Create the slot and snapshot the published tables into the (empty) change log. On a
    standby the slot exports its snapshot as on a primary (PostgreSQL 16+), the workers
    import it there, and the slot is not a failover slot (refused in recovery). It never
    resumes (``claim_slot`` passes None): the copy is one transaction."""
    if resume_from is not None:
        raise SnapshotError("the receiver's initial snapshot cannot resume; take it again")
    if standby:
        _creating_on_standby(settings)
    result = take_snapshot(
        settings.conninfo,
        slot=settings.slot,
        sink=writer,
        publications=settings.publications,
        workers=settings.snapshot_workers,
        failover=settings.failover and not standby,
        copy_format=settings.snapshot_copy_format,
        on_progress=lambda progress: log.info("initial snapshot: %s", progress),
    )
    writer.flush()
    log.info(
        "initial snapshot: %d rows of %d tables at %s",
        result.rows,
        len(result.tables),
        result.consistent_point,
    )
    return result


def _snapshot_due_in_executors(settings: Settings) -> bool:
    """Whether this run may start with an initial snapshot the executors take: snapshot =
    "initial", snapshot_in executors and no slot recorded yet (``claim_slot`` decides, under
    the change log's lease)."""
    if settings.snapshot != "initial" or settings.resolved_snapshot_in != "executors":
        return False
    return load_origin(settings.changelog, settings.storage) is None


def snapshot_in_executors(settings: Settings, spark: Any, stop: threading.Event) -> LSN | None:
    """Claim the slot for a new change log as the receiver would (``claim_slot``), the initial
    snapshot copied by Spark tasks into the Delta tables (``pgcdc.spark.snapshot``) rather
    than by the receiver into the change log; the receiver then streams from the slot's
    consistent point. Returns that point, None when no snapshot was taken (the slot already
    existed, or ``stop`` was set). The change log's writer lease is held throughout, so no
    receiver races it. A failure a new attempt could get past (a server restart, a lost
    connection) is retried as ``settings.retry`` says: the slot it created is dropped (by
    this attempt, or by the next through the pending mark) and the snapshot taken again."""
    from pgcdc.spark.snapshot import land_initial_snapshot

    taken: list[SnapshotResult] = []

    def take(
        s: Settings, writer: ChangeLogWriter, standby: bool, resume_from: LSN | None
    ) -> SnapshotResult:
        if standby:
            _creating_on_standby(s)

        def created_at(point: LSN) -> None:  # what a resume after a crash starts from
            mark_snapshot_pending(s.changelog, s.slot, s.storage, point)

        try:
            result = land_initial_snapshot(
                spark,
                s.pipeline(),
                conninfo=s.conninfo,
                slot=s.slot,
                publications=s.publications,
                failover=s.failover and not standby,
                copy_format=s.snapshot_copy_format,
                created_at=created_at,
                resume_from=resume_from,
            )
        except PgcdcError:
            raise
        except Exception as error:  # a Spark job's failure: a Java stack around the reason
            failure = query_failure(error, "the initial snapshot's Spark job")
            for note in getattr(error, "__notes__", ()):
                failure.add_note(note)  # whether the slot was dropped
            raise failure from None
        taken.append(result)
        return result

    backoff = Backoff(settings.retry)
    while True:
        started = time.monotonic()
        try:
            log_root = ChangeLog(settings.changelog, storage=settings.storage)
            with log_root.writer(lease_wait=True) as writer:
                claim_slot(settings, writer, take)
            return taken[-1].consistent_point if taken else None
        except PgcdcError as error:
            delay = backoff.failed(error, started, time.monotonic())
            if delay is None:
                raise
            log.warning("initial snapshot: %s; taking it again in %.1f s", first_line(error), delay)
            if stop.wait(delay):
                return None


def _spark() -> Any:
    """``pgcdc.spark.pipeline``, imported when first needed: the receiver's process imports
    this module (and unpickles ``Settings``), and importing pyspark and deltalake there only
    delayed its first change."""
    import pgcdc.spark.pipeline

    return pgcdc.spark.pipeline


@contextlib.contextmanager
def _session(settings: Settings) -> Iterator[Any]:
    # Hadoop's local file system (the checkpoint) chmods what it creates by its own umask.
    conf = {"spark.hadoop.fs.permissions.umask-mode": f"{settings.umask:03o}"}
    conf.update(settings.spark_conf)
    # pyspark's SparkContext puts its own SIGINT handler over the caller's (cancel every job,
    # then KeyboardInterrupt), so a Ctrl-C failed the batch being written; the caller's (the
    # command's sets the stop) is put back.
    interrupt = signal.getsignal(signal.SIGINT)
    try:
        spark = _spark().spark_session(settings.master, "pgcdc-pipeline", **conf)
    except Exception as exc:
        raise PipelineQueryError(
            f"Spark did not start with master {settings.master!r}: "
            f"{next(iter(str(exc).splitlines()), type(exc).__name__)}; check the master URL "
            "and [spark] conf"
        ) from None
    if interrupt is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, interrupt)
    # The query's failure is reported as one typed line (query_failure); Spark's own log of
    # it is a Java stack with the Python traceback inside.
    with contextlib.suppress(Exception):
        spark._jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(
            "org.apache.spark.sql.execution.streaming",
            spark._jvm.org.apache.logging.log4j.Level.FATAL,
        )
    try:
        yield spark
    finally:
        spark.stop()


def run(
    settings: Settings,
    *,
    once: bool = False,
    stop: threading.Event | None = None,
    stop_now: threading.Event | None = None,
    spark: Any = None,
    on_tick: Callable[[Any], None] | None = None,
    tick_seconds: float = 5.0,
) -> None:
    """Run the pipeline. ``once``: drain what the server has now and return. Otherwise run
    until ``stop`` is set (or a part fails), then stop the query and the receiver cleanly:
    the batch being written finishes first, unless ``stop_now`` is set too (the next start
    writes that batch again)."""
    stop = stop or threading.Event()
    with contextlib.ExitStack() as stack:
        stack.enter_context(umask(settings.umask))
        # Connecting first also makes a wrong password or a down server fail before Spark
        # starts (seconds of JVM start-up, then a stack of logs around the one line).
        current = _start_checks(settings)
        end_lsn = current if once else None
        if _snapshot_due_in_executors(settings):
            if spark is None:
                spark = stack.enter_context(_session(settings))
            _spark().check_checkpoint(spark, settings.pipeline())
            landed = snapshot_in_executors(settings, spark, stop)
            if once and end_lsn is not None and landed is not None:
                end_lsn = max(end_lsn, landed)
        # A process of its own: in a thread the receiver shared the GIL with foreachBatch.
        # It starts first and logs while the Spark session starts (seconds); if that fails,
        # the stack stops it.
        receiver = ReceiverProcess(settings, end_lsn)
        receiver.start()
        stack.callback(receiver.join)
        stack.callback(receiver.stop)
        if spark is None:
            spark = stack.enter_context(_session(settings))
        # The query starts while the receiver is still logging. With --once it takes no
        # partial batch until the receiver is done (the source's holdUntil: a file made then),
        # so its start-up overlaps the receiving but the backlog lands in as few batches as
        # the limits allow, and it looks often, as its only wait is for that file.
        config = settings.pipeline()
        hold_until = None
        if once:
            hold_until = os.path.join(
                stack.enter_context(tempfile.TemporaryDirectory(prefix="pgcdc-once-")), "logged"
            )
            config = replace(config, trigger_interval=min(config.trigger_interval, ONCE_POLL))
        gate = _spark().BatchGate()
        query = _spark().start(spark, config, gate=gate, hold_until=hold_until)
        try:
            while not stop.is_set():
                if receiver.error is not None or not query.isActive:
                    break
                if hold_until is not None and not receiver.is_alive():
                    # Everything up to end_lsn is logged: land it, then stop.
                    Path(hold_until).touch()
                    try:
                        _spark().land_everything_logged(query, config)
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
            # Between batches: interrupted, the batch being written would be replayed.
            _spark().stop(query, gate, settings.stop_timeout, stop_now)
            receiver.join()
        if receiver.error is not None:
            raise receiver.error
        error = query.exception()
        # A batch the gate refused ends the query with its StopRequested: that is the stop.
        if error is not None and not gate.refused:
            raise query_failure(error)


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
