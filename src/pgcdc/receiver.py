"""The receiver: a logical replication slot in, committed transactions into a durable sink.

One loop connects the layers: ``ReplicationStream`` -> decoder -> ``TransactionAssembler`` ->
``TransactionSink`` (the change log, or a CLI output). It is what makes the pipeline exactly
once:

- Nothing is lost: the slot is confirmed only up to what the sink has made durable, and never
  beyond the oldest transaction the assembler still holds (a streamed transaction in progress,
  a prepared one waiting for COMMIT PREPARED). After any crash the server re-sends everything
  after the confirmed position.
- Nothing is stored twice: what the server re-sends and the sink already holds (commit LSN not
  above ``sink.last_commit_lsn``) is dropped here, before the sink sees it.
- Nothing holds WAL needlessly: when the assembler holds nothing and the sink has flushed, the
  confirmation follows the keepalives' ``wal_end``, as PostgreSQL's apply worker and
  pg_recvlogical do, so an idle database (or one whose writes all go to other databases) lets
  the server recycle WAL.
- Synchronous replication works: flush feedback goes out right after each fsync, so with
  ``fsync_interval=0`` a commit on the server returns once pgcdc has logged it.
- Server faults are ridden out: ``run(retry=...)`` reconnects after a lost connection, a
  terminated walsender or a restarting server, waiting as a ``Backoff`` says. The backoff is a
  pure policy (a failure and the clock in, a delay or "give up" out), so it is tested without
  a server; the loop around it only connects, waits and logs. Each new session resumes from
  the slot's confirmed position and the dedupe above drops what the sink already holds.

The decisions above (when to flush, what to confirm, when ``end_lsn`` stops the stream) are
made by a ``ReplicationSession`` (pgcdc.transactions.session), which does no IO and is tested
without a server; the loop here reads, decodes, stores, flushes and confirms as it answers.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Final, Protocol, TypeVar

import psycopg
from mypy_extensions import mypyc_attr
from psycopg._encodings import pg2pyenc
from psycopg.conninfo import conninfo_to_dict

from pgcdc import errors
from pgcdc.connection import preflight, server_errors
from pgcdc.connection.catalog import TypeDescriber
from pgcdc.connection.conninfo import connect
from pgcdc.connection.deadline import answered_within
from pgcdc.connection.protocol import PrimaryKeepalive, XLogData
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.connection.sql import get_slot
from pgcdc.decoding import Decoder
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions, max_proto_version
from pgcdc.errors import InvalidOption, SlotInUse, SlotNotFound, SlotNotSynced
from pgcdc.events import (
    Delete,
    Event,
    Insert,
    Message,
    Relation,
    RowRun,
    Truncate,
    Type,
    Update,
)
from pgcdc.lsn import INVALID_LSN, LSN
from pgcdc.transactions import (
    AssemblyOptions,
    CommittedTransaction,
    ReplicationSession,
    TransactionAssembler,
    TransactionSink,
)
from pgcdc.transactions.session import Flush, Stop

__all__ = [
    "DEFAULT_RECEIVE_TIMEOUT",
    "DEFAULT_SESSION_SETTINGS",
    "Backoff",
    "Receiver",
    "ReceiverOptions",
    "ReceiverProgress",
    "RetryPolicy",
    "first_line",
    "retryable",
    "session_options",
    "while_slot_busy",
]

PLUGINS: Final = ("pgoutput", "test_decoding")
STREAMING_SINCE: Final = 140000
# The session settings of every connection pgcdc reads values through (walsender, snapshot
# COPY, SQL interface): each changes a type's text output, and a server, database or role
# default (ALTER DATABASE ... SET) would otherwise alter values silently. Native logical
# replication forces the first three plus client_encoding (libpqwalreceiver). Timestamps in ISO
# form and UTC, intervals as pgcdc.decoding.values reads them, floats exact (extra_float_digits
# 3: the shortest text that rounds back; 0 rounds 3.1415927 to 3.14159), bytea in hex.
# lc_monetary is not forced: money is stored in units of the database's locale (forcing C
# would rescale yen to cents); its text is read with money_fraction_digits (a mismatch is a
# DecodeError, docs/types.md). lc_numeric, xmloption and standard_conforming_strings do not
# change any type's output. These come last in ``options`` so they win over the user's.
SESSION_SETTINGS: Final = (
    ("DateStyle", "ISO"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
)
DEFAULT_SESSION_SETTINGS: Final[Mapping[str, str]] = MappingProxyType(dict(SESSION_SETTINGS))
_log = logging.getLogger(__name__)
_T = TypeVar("_T")


class MessageStream(Protocol):
    """What the loop needs of a started stream (``ReplicationStream`` is the one users run): an
    interface, not the class, so a compiled receiver still runs over a replayed stream."""

    @property
    def confirmed_lsn(self) -> LSN: ...
    @property
    def server_wal_end(self) -> LSN | None: ...
    @property
    def ended(self) -> bool: ...
    def read_many(self, timeout: float | None, limit: int) -> list[XLogData | PrimaryKeepalive]: ...
    def confirm(self, lsn: LSN) -> None: ...
    def stop(self) -> None: ...


_SETTING_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")
# Seconds of silence before a replication connection counts as lost: PostgreSQL's
# wal_receiver_timeout default. The server is asked for a reply after half of it, so an idle
# but healthy server is never mistaken for a dead one.
DEFAULT_RECEIVE_TIMEOUT: Final = 60.0
# How long a quiet read may block before the stop event is looked at again.
STOP_CHECK_SECONDS: Final = 0.2
# Once the stream has caught up with the server, reads wait this long for the next messages to
# gather (``start_replication``'s ``coalesce``), at most a tenth of the flush interval: a
# transaction is durable only at the next flush anyway, while a wakeup per message costs the
# receiver, and the walsender that wakes it, more than the messages themselves. With
# ``fsync_interval=0`` (synchronous replication waits for every commit) it reads eagerly.
READ_COALESCE_SECONDS: Final = 0.005


def read_coalesce(fsync_interval: float) -> float:
    """Seconds a caught-up read waits for more messages, for a flush every ``fsync_interval``."""
    return min(READ_COALESCE_SECONDS, fsync_interval / 10)


# Progress (``Receiver.progress``, ``on_progress``) is published on a keepalive at most this
# often: a walsender that has caught up sends one about every transaction, and a publish costs
# as much as logging a small transaction. One held back is published within STOP_CHECK_SECONDS.
KEEPALIVE_PUBLISH_SECONDS: Final = 0.1
# Messages handled between looks at the stop event and the flush clock. Small batches also keep
# few objects alive at once, which spares the garbage collector (see DEFAULT_BATCH).
BURST_MESSAGES: Final = 64
# Collector thresholds while receiving (CPython's default is 700, 10, 10): see
# _CollectorThresholds.
GC_THRESHOLDS: Final = (50_000, 20, 20)
_CONTENT: Final = frozenset((Insert, Update, Delete, Truncate, Message))
# Up to this many events, _store counts a transaction's changes in a plain loop.
_FEW_EVENTS: Final = 16
# Row changes a RowRun starts with; pgoutput puts the row's TupleData after type byte, relation
# OID and tuple marker (outside stream blocks), and the run's messages share those bytes and the
# column count. A run is fed once it reaches either bound.
_RUN_STARTS: Final = frozenset((Insert, Update, Delete))
_RUN_ROW_START: Final = RowRun.HEADER_BYTES
# pgoutput's Begin and Commit message types, which ``_loop`` hands the assembler as fields.
_BEGIN_BYTE: Final = ord("B")
_COMMIT_BYTE: Final = ord("C")
RUN_MAX_ROWS: Final = 4096
# A run without rows after its first change yet: shared, never appended to.
_NO_LSNS: Final[list[LSN]] = []
_NO_ROWS: Final[list[bytes]] = []
RUN_MAX_BYTES: Final = 1 << 20
# SQLSTATE classes a new session can get past: 08 connection exception, 57 operator
# intervention (walsender terminated, server shutting down or starting up).
TRANSIENT_SQLSTATE_CLASSES: Final = ("08", "57")


def retryable(error: BaseException) -> bool:
    """Whether a new session could succeed where this error ended one: a lost or refused
    connection, a terminated walsender, a server shutting down or starting up. Everything
    else (authentication, a missing slot or publication, an invalidated slot, wal_level, the
    sink, bytes that do not decode) needs a person, so retrying would only hide it."""
    if isinstance(error, errors.AuthenticationFailed):
        return False
    if isinstance(error, (errors.ConnectionLost, errors.ConnectionFailed)):
        return True
    if isinstance(error, errors.ServerError) and error.sqlstate:
        return error.sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES
    return False


@mypyc_attr(native_class=False)  # a plain class: pickled to the pipeline's receiver process
@dataclass(frozen=True)
class RetryPolicy:
    """How ``Receiver.run`` retries after a failure ``retryable`` accepts: capped exponential
    backoff with jitter (many clients of one restarting server must not reconnect in step)."""

    initial: float = 1.0  # seconds before the first retry
    maximum: float = 60.0  # the cap
    multiplier: float = 2.0
    # The share of each delay taken away at random: 0.5 waits between half and all of it.
    jitter: float = 0.5
    # A session that streamed this long before it failed counts as a success: the next
    # failure starts again from ``initial``.
    reset_after: float = 60.0
    # Retries in a row before giving up; None retries for as long as the failure is transient.
    attempts: int | None = None

    def __post_init__(self) -> None:
        for name in ("initial", "maximum", "reset_after"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise InvalidOption(f"retry {name} must be a number of seconds >= 0, not {value!r}")
        if self.maximum < self.initial:
            raise InvalidOption(
                f"retry maximum ({self.maximum!r} s) must not be below initial ({self.initial!r} s)"
            )
        if not self.multiplier >= 1:
            raise InvalidOption(f"retry multiplier must be >= 1, not {self.multiplier!r}")
        if not 0 <= self.jitter <= 1:
            raise InvalidOption(f"retry jitter must be between 0 and 1, not {self.jitter!r}")
        if self.attempts is not None and self.attempts < 0:
            raise InvalidOption(
                f"retry attempts must be None (no limit) or >= 0, not {self.attempts!r}"
            )


class Backoff:
    """The retry decisions of one ``Receiver.run``, free of IO: ``failed`` takes the error and
    the clock (when the failed session started, and now) and gives the seconds to wait before
    the next session, or None to give up."""

    def __init__(
        self, policy: RetryPolicy, *, uniform: Callable[[], float] = random.random
    ) -> None:
        self.policy = policy
        self._uniform = uniform
        self.failures = 0  # in a row, since the last session that counted as a success
        self._delay = policy.initial  # the next delay before jitter, grown step by step

    def failed(self, error: BaseException, started: float, now: float) -> float | None:
        policy = self.policy
        if not retryable(error):
            return None
        if now - started >= policy.reset_after:
            self.failures = 0
            self._delay = policy.initial
        if policy.attempts is not None and self.failures >= policy.attempts:
            return None
        delay = self._delay
        # Capped at every step, so a days-long outage never overflows a float.
        self._delay = min(policy.maximum, delay * policy.multiplier)
        self.failures += 1
        return delay * (1.0 - policy.jitter * self._uniform())


def while_slot_busy(
    attempt: Callable[[], _T], seconds: float, stop: threading.Event | None = None
) -> _T:
    """``attempt()``, retried with backoff while the slot is active for another process (a
    walsender or a peek the server has not yet seen the end of), for up to ``seconds``; then
    its SlotInUse propagates."""
    deadline = time.monotonic() + seconds
    delay = 0.25
    waiting = stop or threading.Event()
    while True:
        try:
            return attempt()
        except SlotInUse as busy:
            if waiting.is_set() or time.monotonic() + delay > deadline:
                raise
            _log.info(
                "slot %r is active for PID %s; retrying in %.2f s",
                busy.slot,
                busy.active_pid,
                delay,
            )
            waiting.wait(delay)
            delay = min(delay * 2, 5.0)


def first_line(error: BaseException) -> str:
    """The error's first line, for one-line log records."""
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


# A plain class in the compiled build: __post_init__ checks and normalises what a caller passes
# (a list of publications, settings of any type), which a native class would refuse before it.
@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class ReceiverOptions:
    """What to stream and how. Option names follow pgoutput and pg_recvlogical."""

    conninfo: str
    slot: str
    plugin: str = "pgoutput"  # or "test_decoding"
    publications: tuple[str, ...] = ()  # pgoutput
    proto_version: int | None = None  # None: the highest the server supports
    streaming: str | None = None  # None: "on" where supported (>= PG14), else "off"
    two_phase: bool = False
    binary: bool = False
    messages: bool = True
    plugin_options: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    create_slot: bool = False  # create it (if missing) before streaming
    start_lsn: LSN | None = None  # None: the slot's confirmed position
    end_lsn: LSN | None = None  # stop once everything up to here is stored
    status_interval: float = 10.0  # seconds, as pg_recvlogical -s
    # Seconds without a message after which the connection counts as lost (and, with a retry
    # policy, is replaced), as PostgreSQL's wal_receiver_timeout; 0 waits for ever.
    receive_timeout: float = DEFAULT_RECEIVE_TIMEOUT
    fsync_interval: float = 10.0  # seconds, as pg_recvlogical -F; 0 = after every transaction
    assembly: AssemblyOptions = field(default_factory=AssemblyOptions)
    application_name: str = "pgcdc"
    preflight: bool = True  # run pgcdc.connection.preflight.check before connecting
    # Seconds to keep retrying while the slot is active for another process, as Debezium's
    # slot.max.retries x slot.retry.delay.ms: after a crash the server holds the dead
    # client's walsender until it notices (up to wal_sender_timeout). 0: fail at once.
    slot_busy_wait: float = 60.0
    # The walsender session's settings (GUCs), set last so they win over the user's options.
    # The default makes text values parseable by pgcdc.decoding.values; None or {} leaves the
    # server's (and the user's) settings, as pg_recvlogical does.
    session_settings: Mapping[str, str] | None = field(
        default_factory=lambda: DEFAULT_SESSION_SETTINGS
    )

    def __post_init__(self) -> None:
        if self.plugin not in PLUGINS:
            raise InvalidOption(
                f"plugin {self.plugin!r} is not supported by the receiver; use one of "
                f"{', '.join(PLUGINS)}"
            )
        # Read untyped (the compiled build checks a typed read): a caller may pass a list.
        publications: object = getattr(self, "publications")  # noqa: B009
        if isinstance(publications, str):
            raise InvalidOption(
                f"publications must be a tuple of names, not one string: write ({publications!r},)"
            )
        object.__setattr__(self, "publications", tuple(publications))  # type: ignore[arg-type]
        if not self.slot_busy_wait >= 0:
            raise InvalidOption(
                f"slot_busy_wait must be 0 (fail at once) or more seconds, not "
                f"{self.slot_busy_wait!r}"
            )
        if self.plugin == "pgoutput" and not self.publications:
            raise InvalidOption(
                "pgoutput needs at least one publication: create one with CREATE PUBLICATION "
                "<name> FOR ALL TABLES (or FOR TABLE ...) and pass publications=('<name>',)"
            )
        if self.plugin == "test_decoding" and self.streaming not in (None, "off"):
            raise InvalidOption(
                f"streaming={self.streaming!r} cannot be used with test_decoding: it prints no "
                "row data for streamed changes, so they would be lost; use pgoutput, or "
                "streaming=None/'off'"
            )
        if self.streaming not in (None, "off", "on", "parallel"):
            raise InvalidOption(
                f"streaming={self.streaming!r} is not valid: use 'off', 'on', 'parallel' or "
                "None (on where the server supports it)"
            )
        for name in ("status_interval", "fsync_interval", "receive_timeout"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
                raise InvalidOption(f"{name} must be a number of seconds >= 0, not {value!r}")
        if self.status_interval <= 0:
            raise InvalidOption(
                f"status_interval must be positive (seconds between status updates), not "
                f"{self.status_interval!r}"
            )
        if not self.slot:
            raise InvalidOption("slot must name a replication slot")
        object.__setattr__(self, "plugin_options", MappingProxyType(dict(self.plugin_options)))
        settings = self.session_settings
        if settings is not None:
            # Read as the untyped values a caller may pass, which these checks are for.
            given: Mapping[object, object] = settings  # type: ignore[assignment]
            for setting, value in given.items():
                if not isinstance(setting, str) or not _SETTING_NAME.fullmatch(setting):
                    raise InvalidOption(
                        f"session setting name {setting!r} is not a configuration parameter name "
                        "(letters, digits, '_' and '.'), e.g. {'TimeZone': 'UTC'}"
                    )
                if not isinstance(value, str) or "\0" in value:
                    raise InvalidOption(
                        f"session setting {setting} must be a string without NUL characters, "
                        f"not {value!r}"
                    )
            object.__setattr__(self, "session_settings", MappingProxyType(dict(settings)))


@mypyc_attr(native_class=False)  # a plain class: pickled from the pipeline's receiver process
@dataclass(frozen=True, slots=True)
class ReceiverProgress:
    """Where the receiver stands; a new snapshot after every flush, keepalive and at exit."""

    transactions: int = 0  # transactions stored in the sink by this run
    changes: int = 0  # their changes and messages
    bytes_received: int = 0  # output plugin payload bytes received
    duplicates: int = 0  # re-sent transactions the sink already held, dropped
    durable_lsn: LSN = INVALID_LSN  # the sink's durable end
    confirmed_lsn: LSN = INVALID_LSN  # reported to the server as flushed
    server_wal_end: LSN | None = None  # from the latest keepalive
    stopped_by: str | None = None  # "end_lsn", "stop" when run() returned

    @property
    def lag_bytes(self) -> int | None:
        """How far the slot's confirmation trails the server's WAL end (None before the first
        keepalive)."""
        if self.server_wal_end is None:
            return None
        return max(0, int(self.server_wal_end) - int(self.confirmed_lsn))


def session_options(
    conninfo: str, settings: Mapping[str, str] | None = DEFAULT_SESSION_SETTINGS
) -> str:
    """The libpq ``options`` value: the user's (conninfo or PGOPTIONS) then ``settings``,
    which come last so they win (spaces and backslashes escaped as libpq wants)."""
    given = conninfo_to_dict(conninfo).get("options")
    if given is None:
        given = os.environ.get("PGOPTIONS", "")
    ours = " ".join(
        f"-c {name}={_escape_option(value)}" for name, value in (settings or {}).items()
    )
    return f"{given} {ours}".strip()


class _CollectorThresholds:
    """Runs the garbage collector less often while receivers run (restored afterwards).

    A transaction's events stay buffered until its commit; with CPython's default thresholds
    the collector walks them again and again while a large transaction builds up (1.1 us per
    change at 20k-change transactions, a third of the receiver's work). The receiver's objects
    form no reference cycles, so reference counting frees them; collecting less often only
    delays freeing cyclic garbage made elsewhere in the process. Receivers in several threads
    share the setting: the last one out restores the thresholds it found."""

    def __init__(self, thresholds: tuple[int, int, int]) -> None:
        self._thresholds = thresholds
        self._lock = threading.Lock()
        self._users = 0
        self._before = gc.get_threshold()

    @contextlib.contextmanager
    def raised(self) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._before = gc.get_threshold()
                gc.set_threshold(*map(max, self._thresholds, self._before))
            self._users += 1
        try:
            yield
        finally:
            with self._lock:
                self._users -= 1
                if self._users == 0:
                    gc.set_threshold(*self._before)


_fewer_collections: Final = _CollectorThresholds(GC_THRESHOLDS).raised


def _escape_option(value: str) -> str:
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


def _counted(events: Iterable[Event], counter: list[int]) -> Iterator[Event]:
    """Count content events while the sink streams a spilled transaction through."""
    content = _CONTENT
    for event in events:
        if type(event) in content:
            counter[0] += 1
        yield event


def _log_retry(error: BaseException, delay: float, attempt: int) -> None:
    _log.warning(
        "replication session failed (%s: %s); reconnection attempt %d in %.1f s",
        type(error).__name__,
        first_line(error),
        attempt,
        delay,
    )


class Receiver:
    """Streams one slot into one sink until ``end_lsn``, a stop request, or an error."""

    def __init__(
        self,
        options: ReceiverOptions,
        sink: TransactionSink,
        *,
        on_progress: Callable[[ReceiverProgress], None] | None = None,
        on_confirm: Callable[[LSN], None] | None = None,
        before_session: Callable[[], None] | None = None,
    ) -> None:
        self.options = options
        self.sink = sink
        self.on_progress = on_progress
        # Told each position before it is confirmed to the server (the pipeline records it).
        self.on_confirm = on_confirm
        # Called before each session connects, inside the retries: the pipeline checks there
        # that the slot is still the one its change log is filled from.
        self.before_session = before_session
        self.progress = ReceiverProgress()
        self._transactions = 0
        self._changes = 0
        self._bytes = 0
        self._duplicates = 0
        # The decisions (flush clock, confirm targets, end_lsn), kept apart from the IO here.
        self._policy = ReplicationSession(
            fsync_interval=options.fsync_interval,
            end_lsn=options.end_lsn,
            max_wait=STOP_CHECK_SECONDS,
        )
        self._stream: MessageStream | None = None
        self._assembler: TransactionAssembler | None = None
        self._types = TypeDescriber(
            options.conninfo,
            options.application_name,
            session_options(options.conninfo, options.session_settings),
            timeout=options.receive_timeout or None,
        )
        # A session has connected, so the slot exists (created then, if asked): later sessions
        # must find it, never create it again.
        self._slot_ready = False

    # --- setup -------------------------------------------------------------------------------

    def _connect(self) -> ReplicationConnection:
        options = self.options
        create_slot = options.create_slot and not self._slot_ready
        if options.preflight:
            preflight.check(
                options.conninfo,
                slot=options.slot,
                plugin=options.plugin,
                publications=options.publications,
                create_slot=create_slot,
                answer_timeout=options.receive_timeout or None,
            )
        conn = ReplicationConnection.connect(
            options.conninfo,
            options=session_options(options.conninfo, options.session_settings),
            application_name=options.application_name,
            # pgoutput converts values to the client encoding; the decoder reads UTF-8.
            **({} if options.session_settings is None else {"client_encoding": "UTF8"}),
        )
        try:
            if create_slot:
                with self._answered(conn, "looking the slot up"):
                    exists = self._slot_exists(conn)
                if not exists:
                    conn.create_replication_slot(
                        options.slot,
                        options.plugin,
                        snapshot="nothing",
                        two_phase=options.two_phase,
                    )
        except BaseException:
            conn.close()
            raise
        return conn

    def _answered(
        self, conn: ReplicationConnection, what: str
    ) -> contextlib.AbstractContextManager[None]:
        """Hold a command before the stream to ``receive_timeout``, as the stream is held: on
        a silent network it ends with ConnectionLost, which a new session retries."""
        return answered_within(conn.connection, self.options.receive_timeout or None, what)

    def _slot_exists(self, conn: ReplicationConnection) -> bool:
        name = self.options.slot.replace("'", "''")
        result = conn.execute(f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{name}'")
        return bool(result.rows)

    def _plugin(self, conn: ReplicationConnection) -> tuple[dict[str, str], Decoder]:
        """START_REPLICATION options and the decoder for them."""
        options = self.options
        version = conn.server_version
        if options.plugin == "pgoutput":
            proto = options.proto_version or max_proto_version(version)
            streaming = options.streaming
            if streaming is None:
                streaming = "on" if version >= STREAMING_SINCE and proto >= 2 else "off"
            pg = PgOutputOptions(
                options.publications,
                proto_version=proto,
                binary=options.binary,
                messages=options.messages,
                streaming=streaming,  # type: ignore[arg-type]
                two_phase=options.two_phase,
            )
            plugin_options = {**pg.for_server(version), **options.plugin_options}
            # Rows stay wire bytes, never decoded here: the sink checks them (the change log,
            # many at once) or reads them (DecodeError on a malformed one).
            return plugin_options, PgOutputDecoder.for_options(pg)
        plugin_options = {"include-xids": "1", "include-timestamp": "1"}
        if options.two_phase:
            plugin_options["two-phase-commit"] = "1"
        plugin_options.update(options.plugin_options)
        if plugin_options.get("stream-changes", "0").lower() in ("1", "on", "true", "yes"):
            raise InvalidOption(
                "stream-changes cannot be passed to test_decoding: it prints no row data for "
                "streamed changes, so they would be lost; use pgoutput to stream"
            )
        # Imported here: a pgoutput session (the usual one) does not need this parser.
        from pgcdc.decoding.test_decoding import TestDecodingDecoder

        encoding = pg2pyenc(conn.show("server_encoding").encode())
        return plugin_options, TestDecodingDecoder(encoding=encoding)

    # --- running -----------------------------------------------------------------------------

    def run(
        self,
        stop: threading.Event | None = None,
        *,
        retry: RetryPolicy | None = None,
        on_retry: Callable[[BaseException, float, int], None] | None = None,
    ) -> ReceiverProgress:
        """Stream until ``end_lsn`` is stored or ``stop`` is set; flush, confirm and return the
        final progress. Errors from the server, the decoder or the sink propagate typed, after
        what was already received is flushed.

        With ``retry``, a failure ``retryable`` accepts starts a new session after the delay
        the policy gives (``on_retry(error, delay, attempt)`` is told first; by default one log
        line); the slot is created, if asked, only before the first session that connects, so
        a slot dropped meanwhile is an error, never a new slot with a gap before it."""
        stop = stop if stop is not None else threading.Event()
        if retry is None:
            try:
                return self._session(stop)
            except errors.PgcdcError as error:
                self._raise_if_invalidated(error)
                raise
        backoff = Backoff(retry)
        clock = time.monotonic
        while True:
            started = clock()
            try:
                return self._session(stop)
            except errors.PgcdcError as error:
                self._raise_if_invalidated(error)
                delay = backoff.failed(error, started, clock())
                if delay is None or stop.is_set():
                    if (
                        isinstance(error, SlotNotFound)
                        and not isinstance(error, SlotNotSynced)  # says what happened itself
                        and self._slot_ready
                    ):
                        raise self._slot_lost(error) from error
                    if delay is None and backoff.failures:
                        error.add_note(f"gave up after {backoff.failures} reconnection attempts")
                    raise
                (on_retry or _log_retry)(error, delay, backoff.failures)
            if stop.wait(delay):
                self._publish("stop")
                return self.progress

    def _raise_if_invalidated(self, error: errors.PgcdcError) -> None:
        """A slot invalidated under a running stream ends the run as SlotInvalidated, naming
        the slot and the catalog's reason. A standby's recovery conflict cancels the
        walsender's stream with "canceling statement due to conflict with recovery" (SQLSTATE
        40001) and a detail that names neither, so without this the run would end on a
        ReplicationStreamError that does not say the slot is gone or what to do."""
        if isinstance(error, errors.SlotInvalidated):
            return  # found before streaming (preflight, START_REPLICATION): says so itself
        if not isinstance(error.__cause__, errors.SlotInvalidated):
            return
        reason = self._invalidation_reason()
        raise errors.SlotInvalidated(
            f"replication slot {self.options.slot!r} was invalidated while pgcdc streamed "
            f"from it ({reason or 'reason unknown'}): "
            f"{server_errors.invalidation_cause(reason)}; what is stored is complete up to "
            f"{LSN(self._policy.durable_lsn)}, but the changes after that can no longer be "
            "streamed: drop the slot, then start over with a new initial snapshot into a new "
            "destination (for pgcdc pipeline: a new change log, lake and checkpoint); the "
            "server said: "
            f"{first_line(error)}"
        ) from error

    def _invalidation_reason(self) -> str | None:
        """The slot's invalidation reason from the catalog, None when it cannot be read."""
        try:
            with (
                connect(self.options.conninfo) as conn,
                answered_within(conn, self.options.receive_timeout or None, "the slot lookup"),
            ):
                slot = get_slot(conn, self.options.slot)
        except (errors.PgcdcError, psycopg.Error):
            return None
        return slot.invalidation_reason if slot is not None else None

    def _slot_lost(self, error: SlotNotFound) -> SlotNotFound:
        """The slot went away between sessions: say what that means for the data."""
        durable = LSN(self._policy.durable_lsn)
        return SlotNotFound(
            f"replication slot {self.options.slot!r} was dropped while pgcdc streamed from it "
            f"({first_line(error)}): what is stored is complete up to {durable}, "
            "but the changes after that are gone with the slot, and a new slot would start "
            "after a gap; start over with a new initial snapshot into a new destination (for "
            "pgcdc pipeline: a new change log, lake and checkpoint)"
        )

    def _session(self, stop: threading.Event) -> ReceiverProgress:
        """One replication session: connect, stream, flush and confirm."""
        options = self.options
        if self.before_session is not None:
            self.before_session()
        conn = self._while_slot_busy(self._connect, stop)
        self._slot_ready = True
        stopped_by: str | None = None
        try:
            with self._answered(conn, "the session's set-up"):
                plugin_options, decoder = self._plugin(conn)
            self._policy.resume(self.sink.flush())
            with TransactionAssembler(
                options.assembly, stored_through=self.sink.last_commit_lsn
            ) as assembler:
                self._assembler = assembler
                stream = self._while_slot_busy(
                    lambda: self._start(conn, plugin_options),
                    stop,
                )
                self._stream = stream
                try:
                    with _fewer_collections():
                        stopped_by = self._loop(stream, decoder, assembler, stop)
                except BaseException:
                    self._flush_quietly()
                    raise
                self._flush()
                stream.stop()
        finally:
            self._stream = None
            self._assembler = None
            self._types.close()
            conn.close()
        self._publish(stopped_by)
        return self.progress

    def _start(self, conn: ReplicationConnection, plugin_options: dict[str, str]) -> MessageStream:
        """START_REPLICATION, held to ``receive_timeout`` until the stream takes over."""
        options = self.options
        with self._answered(conn, "START_REPLICATION"):
            return conn.start_replication(
                options.slot,
                options.start_lsn or INVALID_LSN,
                plugin_options,
                status_interval=options.status_interval,
                receive_timeout=options.receive_timeout,
                coalesce=read_coalesce(options.fsync_interval),
            )

    def _while_slot_busy(self, attempt: Callable[[], _T], stop: threading.Event) -> _T:
        return while_slot_busy(attempt, self.options.slot_busy_wait, stop)

    def _loop(
        self,
        stream: MessageStream,
        decoder: Decoder,
        assembler: TransactionAssembler,
        stop: threading.Event,
    ) -> str:
        policy = self._policy
        # LSNs below this never stop the stream: the policy is asked only from there on.
        watch_from = policy.watch_from
        message_done = policy.message_done
        read_many = stream.read_many
        clock = time.monotonic
        # pgoutput's decoder is called directly (one event per message, ``decode_one`` inlined:
        # its handler by message type; a plain transaction's Begin and Commit give their fields
        # to the assembler, no event); others go via _xlog.
        pgoutput = decoder if type(decoder) is PgOutputDecoder else None
        handlers: Mapping[int, Callable[[bytes, LSN], Event]] = (
            pgoutput.handlers if pgoutput is not None else {}
        )
        feed = assembler.feed
        begin_plain = assembler.begin_plain
        commit_held = assembler.commit_held
        store = self._store
        # Row changes whose message starts like the one before it (same kind, table, tuple
        # marker and width) join it in a RowRun as their rows' bytes, with no decoding, for a
        # sink that takes them. The run is fed when a message does not join it.
        runs = type(decoder) is PgOutputDecoder and getattr(self.sink, "accepts_row_runs", False)
        # The event types that may start a run: none when the sink takes no runs.
        run_starts: frozenset[type] = _RUN_STARTS if runs else frozenset()
        run_first: Insert | Update | Delete | None = None
        # The run's first message. Its type and the low byte of its relation OID (bytes 0
        # and 4) turn away most other messages before the prefix the others must share is
        # taken from it, when a second change joins (most runs end at once, on a Commit or
        # another table's change); starting a run sets nothing else.
        run_source = b""
        run_prefix = b""
        # A run's rows after its first change: fresh lists once a second change joins, and
        # with them the run's LSNs and payload bytes.
        run_lsns: list[LSN] = _NO_LSNS
        run_rows: list[bytes] = _NO_ROWS
        run_size = 0
        # A class of a module that is not compiled, read once (compiled code would look it up
        # in this module's dict for every message).
        update = Update
        # A keepalive's publish held back (see KEEPALIVE_PUBLISH_SECONDS), and when one is due.
        publish_held = False
        next_publish = 0.0
        policy.streaming(clock())
        while True:
            if stop.is_set():
                return "stop"
            now = clock()
            if publish_held and now >= next_publish:
                publish_held = False
                next_publish = now + KEEPALIVE_PUBLISH_SECONDS
                self._publish(None)
            wait = policy.tick(now)
            if isinstance(wait, Flush):
                self._flush()
                wait = policy.tick(now)
                assert not isinstance(wait, Flush)  # flushed just now
            # Messages already received are handled in a batch; stop and the flush clock are
            # looked at between batches.
            for message in read_many(wait, BURST_MESSAGES):
                if type(message) is XLogData:
                    if pgoutput is None:
                        if self._xlog(message, decoder, assembler):
                            return "end_lsn"
                        continue
                    lsn = message.data_start
                    if lsn >= watch_from and policy.message(lsn) is not None:
                        return "end_lsn"  # commits after end_lsn start here; leave them unread
                    # One copy out of the stream's buffer, which the decoder would make anyway:
                    # the tests and slices below then read bytes, cheaper than a memoryview.
                    payload = message.payload
                    if type(payload) is not bytes:
                        payload = bytes(payload)
                    size = len(payload)
                    self._bytes += size
                    if run_first is not None:
                        # Only a message of the run's type can join it; any other (often the
                        # Commit after a transaction's one change) ends it unread.
                        if size > 4 and payload[0] == run_source[0] and payload[4] == run_source[4]:
                            if not run_rows:
                                run_prefix = run_source[: _RUN_ROW_START + 2]
                                run_size = len(run_source)
                            if (
                                payload.startswith(run_prefix)
                                and run_size < RUN_MAX_BYTES
                                and len(run_rows) < RUN_MAX_ROWS
                            ):
                                if run_rows:
                                    run_lsns.append(lsn)
                                    run_rows.append(payload[_RUN_ROW_START:])
                                else:
                                    run_lsns, run_rows = [lsn], [payload[_RUN_ROW_START:]]
                                run_size += size
                                if lsn >= watch_from and message_done(lsn) is not None:
                                    return "end_lsn"
                                continue
                        if run_rows:
                            completed = feed(RowRun(run_first, run_lsns, run_rows), run_size)
                            run_rows = _NO_ROWS
                        else:
                            completed = feed(run_first, len(run_source))
                        run_first = None
                        if completed:
                            for txn in completed:
                                store(txn)
                    # A plain transaction's Begin and Commit go to the assembler as their
                    # fields, with no event made, when it takes them on its hot path.
                    first_byte = payload[0] if size else 0  # empty: no handler, reraise says so
                    if first_byte == _BEGIN_BYTE:
                        try:
                            _, commit_time, xid = pgoutput.begin_fields(payload)
                        except Exception as exc:
                            pgoutput.reraise(exc, payload, lsn)
                        if begin_plain(xid, lsn, commit_time):
                            if lsn >= watch_from and message_done(lsn) is not None:
                                return "end_lsn"
                            continue
                    elif first_byte == _COMMIT_BYTE:
                        try:
                            _, commit_lsn, end_lsn, commit_time = pgoutput.commit_fields(payload)
                        except Exception as exc:
                            pgoutput.reraise(exc, payload, lsn)
                        committed = commit_held(lsn, commit_lsn, end_lsn, commit_time, None)
                        if committed is not None:
                            store(committed)
                            if lsn >= watch_from and message_done(lsn) is not None:
                                return "end_lsn"
                            continue
                    # Otherwise the message's event: a Begin or Commit the assembler did not
                    # take above is decoded again, for ``feed``.
                    try:
                        event = handlers[first_byte](payload, lsn)
                    except Exception as exc:
                        pgoutput.reraise(exc, payload, lsn)
                    kind = type(event)
                    if (
                        kind in run_starts
                        and event.xid is None  # type: ignore[union-attr]
                        and (kind is not update or event.old is None)  # type: ignore[union-attr]
                    ):
                        run_first = event  # type: ignore[assignment]
                        run_source = payload
                        if lsn >= watch_from and message_done(lsn) is not None:
                            return "end_lsn"
                        continue
                    if type(event) is Type:  # rare: complete it from pg_type
                        *rests_on, event = self._types.describe(event)
                        for described in rests_on:
                            for txn in feed(described, 0):
                                store(txn)
                    elif type(event) is Relation:  # rare: add pg_attribute's defaults
                        table = self._types.describe_relation(event.table)
                        if table is not event.table:
                            decoder.annotate_relation(table)  # type: ignore[attr-defined]
                            event = replace(event, table=table)
                    completed = feed(event, size)
                    if completed:
                        for txn in completed:
                            store(txn)
                    if lsn >= watch_from and message_done(lsn) is not None:
                        return "end_lsn"
                else:
                    # A keepalive: the server has sent everything before wal_end.
                    for action in policy.keepalive(
                        message.wal_end,
                        assembler.pending_transactions,
                        assembler.oldest_pending_lsn,
                        stream.confirmed_lsn,
                    ):
                        if isinstance(action, Stop):
                            return action.reason
                        self._send_confirm(action.lsn)
                    if now >= next_publish:
                        next_publish = now + KEEPALIVE_PUBLISH_SECONDS
                        self._publish(None)
                    else:
                        publish_held = True

    def _xlog(
        self,
        message: XLogData,
        decoder: Decoder,
        assembler: TransactionAssembler,
    ) -> bool:
        """Decode, assemble and store one message of a decoder that may give several events
        (test_decoding); True when ``end_lsn`` has been reached. pgoutput's path is inlined in
        ``_loop``."""
        lsn = message.data_start
        policy = self._policy
        if lsn >= policy.watch_from and policy.message(lsn) is not None:
            return True  # commits after end_lsn start here; leave them unread
        payload = message.payload
        size = len(payload)
        self._bytes += size
        feed = assembler.feed
        if type(payload) is not bytes:
            payload = bytes(payload)
        events = decoder.decode(payload, lsn)
        if len(events) > 1:
            size //= len(events)
        for event in events:
            for txn in feed(event, size):
                self._store(txn)
        return lsn >= policy.watch_from and policy.message_done(lsn) is not None

    def _store(self, txn: CommittedTransaction) -> None:
        sink = self.sink
        if txn.commit_lsn <= sink.last_commit_lsn:
            self._policy.transaction_dropped(txn.end_lsn)
            self._drop(txn)
            return
        events = txn.events
        counter: list[int] | None = None  # a spilled transaction's, counted as it streams
        count = 0
        if type(events) is tuple or type(events) is list:
            if len(events) <= _FEW_EVENTS:
                # Small transactions (most of them): a loop costs less than the passes below.
                for event in events:
                    kind = type(event)
                    if kind in _CONTENT:
                        count += 1
                    elif kind is RowRun:
                        count += len(event)
            else:
                types = list(map(type, events))
                count = sum(map(_CONTENT.__contains__, types))
                if RowRun in types:
                    count += sum(len(e) for e in events if type(e) is RowRun)
        else:
            counter = [0]
            txn = replace(txn, events=_counted(events, counter))
        try:
            appended = sink.append(txn)
        except BaseException:
            # The stream has still shown it: confirms may reach its end once durable.
            self._policy.transaction_dropped(txn.end_lsn)
            raise
        if not appended:
            self._policy.transaction_dropped(txn.end_lsn)
            self._drop(txn)
            return
        self._transactions += 1
        self._changes += count if counter is None else counter[0]
        if self._policy.transaction_stored(txn.end_lsn) is not None:
            self._flush()

    def _drop(self, txn: CommittedTransaction) -> None:
        self._duplicates += 1
        close = getattr(txn.events, "close", None)
        if close is not None:
            close()  # a spilled transaction's file

    def _flush(self) -> None:
        self._policy.flushed(self.sink.flush(), time.monotonic())
        self._confirm()
        self._publish(None)

    def _flush_quietly(self) -> None:
        """On the way out after an error: keep what was received (its transactions are whole),
        and tell the server if the stream still works; the original error wins."""
        try:
            self._policy.flushed(self.sink.flush(), time.monotonic())
            stream = self._stream
            if stream is not None and not stream.ended:
                self._confirm()
                stream.stop()
        except Exception:  # the error being raised matters more
            pass

    def _confirm(self) -> None:
        stream = self._stream
        assembler = self._assembler
        if stream is None or assembler is None or stream.ended:
            return
        action = self._policy.confirm(assembler.oldest_pending_lsn, stream.confirmed_lsn)
        if action is not None:
            self._send_confirm(action.lsn)

    def _send_confirm(self, lsn: LSN) -> None:
        """Perform a ``Confirm``: the pipeline records it first, then the server is told."""
        stream = self._stream
        if stream is None or stream.ended:
            return
        if self.on_confirm is not None:
            self.on_confirm(lsn)
        stream.confirm(lsn)

    def _publish(self, stopped_by: str | None) -> None:
        stream = self._stream
        self.progress = ReceiverProgress(
            transactions=self._transactions,
            changes=self._changes,
            bytes_received=self._bytes,
            duplicates=self._duplicates,
            durable_lsn=LSN(self._policy.durable_lsn),
            confirmed_lsn=stream.confirmed_lsn
            if stream is not None
            else self.progress.confirmed_lsn,
            server_wal_end=stream.server_wal_end
            if stream is not None
            else self.progress.server_wal_end,
            stopped_by=stopped_by,
        )
        if self.on_progress is not None:
            self.on_progress(self.progress)
