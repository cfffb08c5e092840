"""``pgcdc --create-slot / --drop-slot / --start``: pg_recvlogical's actions, flags and output.

The flags, their combinations and their errors follow pg_recvlogical
(src/bin/pg_basebackup/pg_recvlogical.c): with ``--plugin test_decoding --format text`` the
output file holds the very bytes pg_recvlogical would write. pgcdc adds ``--format json`` (typed
JSON lines, the default for pgoutput), ``--format changelog --log DIR`` (the durable change
log), ``--publication`` for pgoutput, and progress on stderr when it is a terminal.

Unlike pg_recvlogical, the slot is only ever confirmed up to a whole transaction that is
written (and, with ``-F`` above 0, fsync'd): a stop in the middle of a transaction resends it
next time instead of leaving half of it behind the confirmed position.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from pgcdc import errors
from pgcdc.cli.common import (
    conninfo_from,
    info,
    lsn_argument,
    plugin_option,
    seconds_argument,
    stop_on_signals,
)
from pgcdc.connection.catalog import type_info
from pgcdc.connection.commands import major_version
from pgcdc.connection.conninfo import connect
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.lsn import LSN
from pgcdc.receiver import (
    DEFAULT_SESSION_SETTINGS,
    Receiver,
    ReceiverOptions,
    ReceiverProgress,
    RetryPolicy,
    first_line,
)
from pgcdc.transactions import AssemblyOptions, CommittedTransaction

DEFAULT_RECONNECT_DELAY = 5.0  # seconds, as pg_recvlogical's RECONNECT_SLEEP_TIME
PROGRESS_INTERVAL = 0.5  # seconds between progress lines on a terminal
FORMATS = ("text", "json", "changelog")
NO_STATUS_INTERVAL = 86400.0  # -s 0: no periodic status packets (confirmations still go out)


class UsageError(Exception):
    """The command line is inconsistent; main() reports it like argparse (exit code 2)."""


class _Sink(Protocol):
    @property
    def last_commit_lsn(self) -> LSN: ...

    def append(self, txn: CommittedTransaction) -> bool: ...

    def flush(self) -> LSN: ...

    def close(self) -> None: ...


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """pg_recvlogical's actions and options, and pgcdc's own output options."""
    actions = parser.add_argument_group("actions (pg_recvlogical)")
    actions.add_argument("--create-slot", action="store_true", help="create a new slot (-S)")
    actions.add_argument("--drop-slot", action="store_true", help="drop the slot (-S)")
    actions.add_argument("--start", action="store_true", help="start streaming from the slot")
    options = parser.add_argument_group("replication options (pg_recvlogical)")
    options.add_argument("-S", "--slot", metavar="SLOTNAME", help="name of the logical slot")
    options.add_argument(
        "-P", "--plugin", default=None,
        help="output plugin for --create-slot and --start (default: test_decoding, or the "
        "slot's plugin when it exists)",
    )  # fmt: skip
    options.add_argument(
        "--if-not-exists", action="store_true",
        help="do not error if the slot already exists when creating it",
    )  # fmt: skip
    options.add_argument(
        "-t", "--two-phase", "--enable-two-phase", dest="two_phase", action="store_true",
        help="decode prepared transactions (with --create-slot)",
    )  # fmt: skip
    options.add_argument(
        "--failover", "--enable-failover", dest="failover", action="store_true",
        help="let standbys synchronise the slot (with --create-slot; PostgreSQL 17+)",
    )  # fmt: skip
    options.add_argument(
        "-f", "--file", metavar="FILE", help="write the stream to FILE; - for stdout"
    )
    options.add_argument(
        "-F", "--fsync-interval", type=seconds_argument, default=10.0, metavar="SECS",
        help="time between fsyncs of the output file; 0 never fsyncs (default: 10)",
    )  # fmt: skip
    options.add_argument(
        "-o", "--option", dest="plugin_options", action="append", type=plugin_option,
        default=[], metavar="NAME[=VALUE]", help="pass option NAME to the output plugin",
    )  # fmt: skip
    options.add_argument(
        "-I", "--startpos", type=lsn_argument, metavar="LSN",
        help="where in an existing slot streaming should start",
    )  # fmt: skip
    options.add_argument(
        "-E", "--endpos", type=lsn_argument, metavar="LSN",
        help="exit after receiving everything up to LSN",
    )  # fmt: skip
    options.add_argument(
        "-s", "--status-interval", type=seconds_argument, default=10.0, metavar="SECS",
        help="time between status packets sent to the server (default: 10)",
    )  # fmt: skip
    options.add_argument(
        "-n", "--no-loop", action="store_true", help="do not reconnect when the connection is lost"
    )
    options.add_argument(
        "-v", "--verbose", action="count", default=0, help="say what is happening on stderr"
    )
    own = parser.add_argument_group("pgcdc output options")
    own.add_argument(
        "--format", choices=FORMATS,
        help="text: test_decoding's lines as pg_recvlogical writes them (default for "
        "test_decoding); json: one typed JSON object per change (default otherwise); "
        "changelog: the durable change log in --log DIR",
    )  # fmt: skip
    own.add_argument(
        "--publication", dest="publications", action="append", default=[], metavar="NAME",
        help="publication to stream (pgoutput; repeatable)",
    )  # fmt: skip
    own.add_argument("--log", metavar="DIR", help="change log directory (--format changelog)")
    own.add_argument(
        "--reconnect-delay", type=seconds_argument, default=DEFAULT_RECONNECT_DELAY,
        metavar="SECS", help="wait before reconnecting after a lost connection (default: 5)",
    )  # fmt: skip


def validate(args: argparse.Namespace) -> None:
    """pg_recvlogical's checks of the action and option combination."""
    if not args.slot:
        raise UsageError("no slot specified (-S/--slot)")
    if not (args.create_slot or args.drop_slot or args.start):
        raise UsageError("at least one action needs to be specified: --create-slot, --start "
                         "or --drop-slot")  # fmt: skip
    if args.drop_slot and (args.create_slot or args.start):
        raise UsageError("cannot use --create-slot or --start together with --drop-slot")
    if args.startpos is not None and (args.create_slot or args.drop_slot):
        raise UsageError("cannot use --create-slot or --drop-slot together with --startpos")
    if args.endpos is not None and not args.start:
        raise UsageError("--endpos may only be specified with --start")
    if not args.create_slot:
        for flag, given in (("--two-phase", args.two_phase), ("--failover", args.failover)):
            if given:
                raise UsageError(f"{flag} may only be specified with --create-slot")
    if args.start:
        output_format = output_format_for(args)
        if output_format == "changelog":
            if not args.log:
                raise UsageError("--format changelog needs --log DIR")
        elif not args.file:
            raise UsageError("no target file specified (-f FILE, - for stdout)")
        if args.log and output_format != "changelog":
            raise UsageError("--log DIR goes with --format changelog")


def output_format_for(args: argparse.Namespace) -> str:
    if args.format:
        return str(args.format)
    if args.log and not args.file:
        return "changelog"
    return "text" if (args.plugin or "test_decoding") == "test_decoding" else "json"


def run(args: argparse.Namespace) -> int:
    """Carry out the actions; 0 on success and on a stop by SIGINT/SIGTERM or -E."""
    validate(args)
    conninfo = conninfo_from(args)
    stop = threading.Event()
    with stop_on_signals(stop):
        with _replication_connection(conninfo) as conn:
            server_major = major_version(conn.server_version)
            if args.drop_slot:
                if args.verbose:
                    info(f'dropping replication slot "{args.slot}"')
                conn.drop_replication_slot(args.slot)
                return 0
            existing = _existing_plugin(conn, args.slot)
            plugin = args.plugin or existing or "test_decoding"
            if args.create_slot and (existing is None or not args.if_not_exists):
                _create_slot(conn, args, plugin)
            elif args.create_slot and args.verbose:
                info(f'replication slot "{args.slot}" exists')
            if existing is not None and existing != plugin:
                raise errors.SlotMismatch(
                    f"replication slot {args.slot!r} decodes with {existing!r}, not {plugin!r}; "
                    f"leave out -P/--plugin or pass -P {existing}, or use another slot"
                )
        if args.start and not stop.is_set():
            args.plugin = plugin
            _stream(args, conninfo, plugin, server_major, stop)
    return 0


@contextlib.contextmanager
def _replication_connection(conninfo: str) -> Iterator[ReplicationConnection]:
    conn = ReplicationConnection.connect(conninfo, application_name="pgcdc")
    try:
        yield conn
    finally:
        conn.close()


def _existing_plugin(conn: ReplicationConnection, slot: str) -> str | None:
    """The plugin an existing slot decodes with, so --start needs no -P (pg_recvlogical
    defaults to test_decoding, which the server checks against the slot anyway)."""
    result = conn.execute(
        "SELECT plugin FROM pg_replication_slots WHERE slot_name = "
        + "'" + slot.replace("'", "''") + "'"
    )  # fmt: skip
    return result.text(0, 0) if result.rows else None


def _create_slot(conn: ReplicationConnection, args: argparse.Namespace, plugin: str) -> None:
    if args.verbose:
        info(f'creating replication slot "{args.slot}"')
    try:
        conn.create_replication_slot(
            args.slot, plugin, snapshot="nothing", two_phase=args.two_phase,
            failover=args.failover,
        )  # fmt: skip
    except errors.SlotAlreadyExists:
        if not args.if_not_exists:
            raise
        if args.verbose:
            info(f'replication slot "{args.slot}" exists')


# --- streaming --------------------------------------------------------------------------------


def _stream(
    args: argparse.Namespace, conninfo: str, plugin: str, server_major: int, stop: threading.Event
) -> None:
    output_format = output_format_for(args)
    sink = _open_sink(args, output_format, conninfo, server_major)
    assembly = AssemblyOptions(
        skip_empty_xacts=False,
        # pg_recvlogical prints a prepared transaction at PREPARE when the slot decodes it then.
        emit_at_prepare=output_format == "text",
    )
    options = ReceiverOptions(
        conninfo=conninfo,
        slot=args.slot,
        plugin=plugin,
        publications=tuple(args.publications),
        two_phase=args.two_phase,
        plugin_options=plugin_options_for(args, plugin, output_format),
        start_lsn=args.startpos,
        end_lsn=args.endpos,
        status_interval=args.status_interval or NO_STATUS_INTERVAL,
        fsync_interval=args.fsync_interval,
        assembly=assembly,
        application_name="pgcdc",
        # Text output is the plugin's own text, as pg_recvlogical prints it: under the
        # server's (and the user's) DateStyle/TimeZone, not pgcdc's parsing settings.
        session_settings=None if output_format == "text" else DEFAULT_SESSION_SETTINGS,
    )
    reporter = ProgressReporter(enabled=sys.stderr.isatty())
    # pg_recvlogical's loop: the same wait after every lost connection, none with --no-loop.
    retry = RetryPolicy(
        initial=args.reconnect_delay,
        maximum=args.reconnect_delay,
        jitter=0.0,
        attempts=0 if args.no_loop else None,
    )

    def on_retry(error: BaseException, delay: float, attempt: int) -> None:
        reporter.clear()
        info(f"disconnected ({first_line(error)}); waiting {delay:g} seconds to try again")

    try:
        if args.verbose:
            where = options.start_lsn or "the slot's confirmed position"
            info(f"starting log streaming at {where} (slot {args.slot})")
        # Each new session resumes where the slot was confirmed; the sink skips what it holds.
        Receiver(options, sink, on_progress=reporter).run(stop, retry=retry, on_retry=on_retry)
        if args.verbose:
            why = "received interrupt signal" if stop.is_set() else "end position reached"
            info(f"{why}, exiting")
    finally:
        reporter.clear()
        sink.close()


def plugin_options_for(args: argparse.Namespace, plugin: str, output_format: str) -> dict[str, str]:
    """The -o options to send. A valueless -o NAME means true to test_decoding, as pg_recvlogical
    sends it. Text output is what pg_recvlogical prints, so it asks test_decoding for its
    defaults (no commit timestamps), which the receiver would otherwise turn on."""
    options: dict[str, str] = {}
    if plugin == "test_decoding" and output_format == "text":
        options["include-timestamp"] = "0"
    for name, value in args.plugin_options:
        options[name] = "on" if value is None else value
    return options


def _open_sink(
    args: argparse.Namespace, output_format: str, conninfo: str, server_major: int
) -> _Sink:
    if output_format == "changelog":
        from pgcdc.changelog import ChangeLog

        return ChangeLog(args.log).writer()
    # Only text and JSON output need these (and the value converters they bring in): the
    # change log's command starts without them.
    from pgcdc.cli.outputs import JsonOutput, TextOutput, open_output_file

    stream = open_output_file(args.file)
    name = "stdout" if args.file == "-" else repr(args.file)
    fsync = args.fsync_interval > 0
    if output_format == "text":
        return TextOutput(stream, fsync=fsync, name=name, server_major=server_major)
    return JsonOutput(stream, fsync=fsync, name=name, type_lookup=_type_lookup(conninfo))


def _type_lookup(conninfo: str) -> Callable[[Iterable[int]], Mapping[int, TypeInfo]]:
    """Non-built-in types (enums, domains, arrays of them) from pg_type, as they appear."""

    def lookup(oids: Iterable[int]) -> Mapping[int, TypeInfo]:
        with connect(conninfo) as conn:
            return type_info(conn, oids)

    return lookup


# --- signals and progress ---------------------------------------------------------------------


@dataclass
class ProgressReporter:
    """Changes, bytes and lag on one self-rewriting stderr line, only when stderr is a
    terminal (pipes and log files stay quiet)."""

    enabled: bool
    _last: float = 0.0
    _shown: bool = False

    def __call__(self, progress: ReceiverProgress) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self._last < PROGRESS_INTERVAL:
            return
        self._last = now
        sys.stderr.write("\r" + format_progress(progress) + "\x1b[K")
        sys.stderr.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()
            self._shown = False


def format_progress(progress: ReceiverProgress) -> str:
    """One line: transactions, changes, bytes received, durable position and lag."""
    parts = [
        f"{progress.transactions} transactions",
        f"{progress.changes} changes",
        f"{human_bytes(progress.bytes_received)} received",
        f"durable {progress.durable_lsn}",
    ]
    if progress.lag_bytes is not None:
        parts.append(f"lag {human_bytes(progress.lag_bytes)}")
    return ", ".join(parts)


def human_bytes(count: int | None) -> str:
    if count is None:
        return "-"
    value = float(count)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(value) < 1024 or unit == "TB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
