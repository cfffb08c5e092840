"""The ``pgcdc`` command.

Without a subcommand, ``pgcdc`` is pg_recvlogical (``--create-slot``, ``--start``,
``--drop-slot`` and their flags; see ``pgcdc.cli.recvlogical``). Subcommands live in modules
``pgcdc.cli.<name>``, listed in ``COMMAND_MODULES``; each defines ``register(subparsers) ->
None``, which adds its subparser(s) and sets ``handler`` (``set_defaults(handler=f)``, where
``f(args) -> int | None`` returns the exit code; ``func`` is accepted too).

Exit codes: 0 success (also after SIGINT/SIGTERM, as pg_recvlogical), 1 a pgcdc error (one
line "pgcdc: error: ...", details on the following lines), 2 a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from types import ModuleType

from pgcdc import __version__
from pgcdc.cli import recvlogical
from pgcdc.cli.common import PROG, add_connection_arguments, add_help_argument, error_line
from pgcdc.errors import PgcdcError, storage_error
from pgcdc.runtime import freeze_imports

COMMAND_MODULES = (
    "pgcdc.cli.slots",
    "pgcdc.cli.sqlread",
    "pgcdc.cli.emit",
    "pgcdc.cli.check",
    "pgcdc.cli.pipeline",
    "pgcdc.cli.demo",
    "pgcdc.cli.snapshot",
)
# Written by another part of the project; until they exist, pgcdc runs without them.
OPTIONAL_MODULES = frozenset({"pgcdc.cli.pipeline", "pgcdc.cli.demo"})


def _command_modules() -> list[ModuleType]:
    modules = []
    for name in COMMAND_MODULES:
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as error:
            if name in OPTIONAL_MODULES and error.name == name:
                continue
            raise
    return modules


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        add_help=False,
        description="Change data capture from PostgreSQL logical decoding. Without a command, "
        "pgcdc controls logical decoding streams as pg_recvlogical does.",
    )
    add_help_argument(parser)
    parser.add_argument("-V", "--version", action="version", version=f"pgcdc {__version__}")
    recvlogical.add_arguments(parser)
    add_connection_arguments(parser, top_level=True)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for module in _command_modules():
        module.register(subparsers)
    return parser


# What pgcdc creates (output files, the change log of --start --log) is private, as
# pg_recvlogical's output file (0600); ``pipeline run --umask`` chooses its own.
UMASK = 0o077


def main(argv: Sequence[str] | None = None) -> int:
    # `kill -USR1 <pid>` prints every thread's stack to stderr: where a run that seems stuck
    # waits, without stopping it.
    if hasattr(signal, "SIGUSR1"):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # stderr has no fd
            faulthandler.register(signal.SIGUSR1, all_threads=True)
    previous = os.umask(UMASK)
    try:
        return _main(argv)
    finally:
        os.umask(previous)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    if argv is None:  # the process is this command, not a caller's (tests call main(argv))
        freeze_imports()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None) or getattr(args, "func", None)
    try:
        if args.command is None:
            return recvlogical.run(args)
        if handler is None:
            parser.error(f"command {args.command!r} registered no handler")
        return int(handler(args) or 0)
    except recvlogical.UsageError as error:
        parser.error(str(error))
    except PgcdcError as error:
        return _report(error)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except OSError as error:  # a file pgcdc writes: a full disk, a permission, a path
        return _report(storage_error(error))


def _report(error: PgcdcError) -> int:
    first, _, rest = str(error).partition("\n")
    error_line(first)
    if rest:
        print(rest, file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
