"""What every ``pgcdc`` command shares: connection options, LSN and option parsing, messages."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from pgcdc.connection.conninfo import normalize
from pgcdc.lsn import LSN

PROG = "pgcdc"


def add_connection_arguments(parser: argparse.ArgumentParser, *, top_level: bool) -> None:
    """pg_recvlogical's connection options. Subcommands add them with SUPPRESS defaults, so a
    value given before the subcommand name (``pgcdc -d X slots``) is kept."""
    default: Any = None if top_level else argparse.SUPPRESS
    group = parser.add_argument_group("connection options")
    group.add_argument(
        "-d", "--dbname", default=default, metavar="CONNSTR",
        help="database to connect to: a name, a conninfo string or a postgresql:// URI",
    )  # fmt: skip
    group.add_argument("-h", "--host", default=default, help="database server host or socket dir")
    group.add_argument("-p", "--port", default=default, help="database server port number")
    group.add_argument("-U", "--username", default=default, metavar="NAME", help="user name")
    group.add_argument(
        "-w", "--no-password", action="store_true", default=default,
        help="never prompt for a password (pgcdc never prompts; accepted for compatibility)",
    )  # fmt: skip


def add_help_argument(parser: argparse.ArgumentParser) -> None:
    """``--help`` and ``-?`` as pg_recvlogical spells them (``-h`` is the host)."""
    parser.add_argument("-?", "--help", action="help", help="show this help, then exit")


def conninfo_from(args: argparse.Namespace) -> str:
    """One libpq conninfo string from ``-d`` (name, conninfo or URI) and ``-h/-p/-U``, with
    pgcdc's default connect_timeout (see ``pgcdc.connection.conninfo.normalize``)."""
    base = getattr(args, "dbname", None) or ""
    overrides = {
        key: value
        for key, value in (
            ("host", getattr(args, "host", None)),
            ("port", getattr(args, "port", None)),
            ("user", getattr(args, "username", None)),
        )
        if value
    }
    if base and "=" not in base and "://" not in base:
        overrides["dbname"] = base  # a plain database name, as pg_recvlogical takes it
        base = ""
    return normalize(base, **overrides)


def lsn_argument(text: str) -> LSN:
    """argparse type for -I/-E/--upto-lsn: "X/Y" as PostgreSQL prints LSNs."""
    try:
        return LSN.parse(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def seconds_argument(text: str) -> float:
    """argparse type for intervals in seconds: zero or more (0 turns the interval off)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be zero or a positive number of seconds")
    return value


def plugin_option(text: str) -> tuple[str, str | None]:
    """-o NAME[=VALUE], as pg_recvlogical splits it (at the first '=')."""
    name, sep, value = text.partition("=")
    if not name:
        raise argparse.ArgumentTypeError(f"option {text!r} has no name; use NAME or NAME=VALUE")
    return name, value if sep else None


def info(message: str) -> None:
    """A progress or verbose line on stderr, prefixed like pg_recvlogical's."""
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def progress_logged(enabled: bool) -> Iterator[None]:
    """While in the block, pgcdc's INFO log records (the receiver process's too, which it
    forwards) go to stderr as ``info`` lines: what a long-running command is doing."""
    if not enabled:
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    logger = logging.getLogger("pgcdc")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def error_line(message: str) -> None:
    """A typed error as one clear line (its first line; details follow on their own)."""
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def stop_on_signals(
    stop: threading.Event, *, interrupted_again: threading.Event | None = None
) -> Iterator[None]:
    """SIGINT and SIGTERM set ``stop``: long work then flushes, confirms and exits 0, as
    pg_recvlogical does. A second SIGINT (Ctrl-C again, while the stop waits for work it lets
    finish) sets ``interrupted_again``. Only the main thread can install handlers; elsewhere
    this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    interrupted = False

    def handler(signum: int, frame: FrameType | None) -> None:
        # Only events are set: an exception raised here would surface in whatever the main
        # thread runs (a py4j call, which then logs it with a traceback and drops its socket).
        nonlocal interrupted
        if signum == signal.SIGINT:
            if interrupted and interrupted_again is not None:
                interrupted_again.set()
            interrupted = True
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
