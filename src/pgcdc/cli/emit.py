"""``pgcdc emit``: write a logical decoding message into WAL (pg_logical_emit_message)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pgcdc.cli.common import add_connection_arguments, add_help_argument, conninfo_from
from pgcdc.connection import sql
from pgcdc.connection.conninfo import connect
from pgcdc.connection.server_errors import translated


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "emit", add_help=False, help="write a logical decoding message",
        description="Write a logical decoding message; prints its LSN. Without CONTENT the "
        "message is read from stdin, byte for byte.",
    )  # fmt: skip
    add_help_argument(parser)
    add_connection_arguments(parser, top_level=False)
    parser.add_argument("--prefix", required=True, help="the message prefix (e.g. an app name)")
    parser.add_argument(
        "--transactional", action="store_true",
        help="decode the message with its transaction (only if it commits)",
    )  # fmt: skip
    parser.add_argument("content", nargs="?", help="the message text (default: stdin)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    content: str | bytes = args.content if args.content is not None else sys.stdin.buffer.read()
    with translated(), connect(conninfo_from(args)) as conn:
        lsn = sql.emit_message(conn, args.transactional, args.prefix, content)
    print(lsn)
    return 0
