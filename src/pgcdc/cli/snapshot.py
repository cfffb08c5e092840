"""``pgcdc snapshot``: the initial snapshot of the published tables into a change log, from a
new slot; with ``--then-stream``, the slot's changes follow into the same log."""

from __future__ import annotations

import argparse
import sys
import threading
from typing import Any

from pgcdc.cli.common import (
    add_connection_arguments,
    add_help_argument,
    conninfo_from,
    info,
    lsn_argument,
    stop_on_signals,
)
from pgcdc.errors import InvalidOption
from pgcdc.receiver import Receiver, ReceiverOptions
from pgcdc.snapshot import COPY_FORMATS, DEFAULT_CHUNK_PAGES, take_snapshot


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, not {text!r}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "snapshot", add_help=False, help="copy the tables into a change log from a new slot",
        description="Create a logical replication slot and copy every row it will not stream "
        "(its exported snapshot) into a change log, as one transaction, in parallel. With "
        "--then-stream the slot's changes follow into the same log: no gap, no overlap.",
    )  # fmt: skip
    add_help_argument(parser)
    add_connection_arguments(parser, top_level=False)
    parser.add_argument("-S", "--slot", required=True, help="the slot to create (must not exist)")
    parser.add_argument(
        "--publication", action="append", default=[], dest="publications", metavar="NAME",
        help="copy this publication's tables, with its column lists and row filters; "
        "repeatable (needed by --then-stream)",
    )  # fmt: skip
    parser.add_argument(
        "--table", action="append", dest="tables", metavar="NAME",
        help="copy only this table (schema.table); repeatable. Default: the publications' "
        "tables, or every user table",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=_positive, default=4, help="parallel connections copying (default 4)"
    )
    parser.add_argument(
        "--chunk-pages", type=_positive, default=DEFAULT_CHUNK_PAGES, metavar="PAGES",
        help=f"split tables into ctid ranges of this many pages (default {DEFAULT_CHUNK_PAGES})",
    )  # fmt: skip
    parser.add_argument(
        "--copy-format", choices=COPY_FORMATS, default="auto",
        help="auto (default): binary COPY for tables whose column types all have binary "
        "decoders, text for the others; text: text COPY for every table",
    )  # fmt: skip
    parser.add_argument("--log", required=True, metavar="DIR", help="the change log to write")
    parser.add_argument(
        "--then-stream", action="store_true",
        help="stream the slot into the log after the snapshot, until SIGINT/SIGTERM or --endpos",
    )  # fmt: skip
    parser.add_argument(
        "-E", "--endpos", type=lsn_argument, metavar="LSN",
        help="with --then-stream: stop once everything up to this LSN is in the log",
    )  # fmt: skip
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pgcdc.changelog import ChangeLog

    if args.then_stream and not args.publications:
        raise InvalidOption(
            "--then-stream needs --publication: pgoutput streams the tables of a publication "
            "(CREATE PUBLICATION <name> FOR ALL TABLES)"
        )
    if args.endpos is not None and not args.then_stream:
        raise InvalidOption("--endpos only applies with --then-stream")
    conninfo = conninfo_from(args)
    stop = threading.Event()
    with stop_on_signals(stop), ChangeLog(args.log).writer() as sink:
        result = take_snapshot(
            conninfo,
            slot=args.slot,
            sink=sink,
            tables=args.tables,
            publications=tuple(args.publications),
            workers=args.workers,
            chunk_pages=args.chunk_pages,
            copy_format=args.copy_format,
            # How a long copy goes, on stderr (stdout says what was done).
            on_progress=lambda progress: info(f"snapshot: {progress}"),
        )
        print(
            f"snapshot: {len(result.tables)} tables, {result.rows} rows at "
            f"{result.consistent_point} (slot {args.slot})",
            flush=True,
        )
        if args.then_stream and not stop.is_set():
            options = ReceiverOptions(
                conninfo, args.slot, publications=tuple(args.publications), end_lsn=args.endpos
            )
            progress = Receiver(options, sink).run(stop)
            if sys.stderr.isatty():
                info(
                    f"streamed {progress.transactions} transactions, durable {progress.durable_lsn}"
                )
    return 0
