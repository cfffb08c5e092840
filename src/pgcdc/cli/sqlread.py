"""``pgcdc peek`` and ``pgcdc get``: read a slot through the SQL interface of logical decoding.

``peek`` leaves the slot where it is; ``get`` consumes what it returns (the slot moves past it
at once). Each row prints as ``LSN<TAB>XID<TAB>DATA``; ``--binary`` reads with the binary
functions (pgoutput needs them) and prints DATA as ``\\x`` hex.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pgcdc.cli.common import (
    add_connection_arguments,
    add_help_argument,
    conninfo_from,
    lsn_argument,
    plugin_option,
)
from pgcdc.connection import sql
from pgcdc.connection.conninfo import connect
from pgcdc.connection.server_errors import translated
from pgcdc.errors import InvalidArgument
from pgcdc.receiver import session_options


def register(subparsers: Any) -> None:
    for name, verb in (("peek", "read changes without consuming them"),
                       ("get", "read and consume changes (the slot advances)")):  # fmt: skip
        parser = subparsers.add_parser(name, add_help=False, help=verb, description=verb)
        add_help_argument(parser)
        add_connection_arguments(parser, top_level=False)
        parser.add_argument("-S", "--slot", required=True, metavar="SLOTNAME")
        parser.add_argument("--upto-lsn", type=lsn_argument, metavar="LSN")
        parser.add_argument("--upto-nchanges", type=int, metavar="N")
        parser.add_argument(
            "-o", "--option", dest="plugin_options", action="append", type=plugin_option,
            default=[], metavar="NAME=VALUE", help="output plugin option (repeatable)",
        )  # fmt: skip
        parser.add_argument(
            "--binary", action="store_true", help="use the binary functions (pgoutput)"
        )
        parser.add_argument(
            "--publication", dest="publications", action="append", default=[], metavar="NAME",
            help="publication a pgoutput slot decodes (repeatable; sets publication_names and "
            "proto_version=1 unless -o gives them)",
        )  # fmt: skip
        parser.set_defaults(handler=run, consume=name == "get")


def run(args: argparse.Namespace) -> int:
    options: dict[str, sql.OptionValue] = {}
    for name, value in args.plugin_options:
        if value is None:
            raise InvalidArgument(
                f"option {name!r} has no value; the SQL functions need NAME=VALUE"
            )
        options[name] = value
    if args.upto_nchanges is not None and args.upto_nchanges < 0:
        raise InvalidArgument(f"--upto-nchanges must be 0 or more, not {args.upto_nchanges}")
    conninfo = conninfo_from(args)
    kwargs: dict[str, Any] = {
        "upto_lsn": args.upto_lsn,
        "upto_nchanges": args.upto_nchanges,
        "options": options,
    }
    rows: list[tuple[Any, int, str | bytes]]
    if args.publications:
        options.setdefault("publication_names", ",".join(args.publications))
    # The receiver's session settings: values print as its walsender (and the snapshot) print
    # them, whatever the database's or role's defaults (extra_float_digits, DateStyle, ...).
    session = session_options(conninfo)
    with (
        translated(),
        connect(conninfo, limit_statements=False, options=session, client_encoding="UTF8") as conn,
    ):
        slot = sql.get_slot(conn, args.slot)
        if slot is not None and slot.plugin == "pgoutput":
            _check_pgoutput(args, options)
        if args.binary:
            read_binary = sql.get_binary_changes if args.consume else sql.peek_binary_changes
            rows = list(read_binary(conn, args.slot, **kwargs))
        else:
            read_text = sql.get_changes if args.consume else sql.peek_changes
            rows = list(read_text(conn, args.slot, **kwargs))
    out = sys.stdout.buffer
    for lsn, xid, data in rows:
        body = ("\\x" + data.hex()).encode() if isinstance(data, bytes) else data.encode()
        out.write(f"{lsn}\t{xid}\t".encode() + body + b"\n")
    out.flush()
    return 0


def _check_pgoutput(args: argparse.Namespace, options: dict[str, sql.OptionValue]) -> None:
    """pgoutput needs its publications and a protocol version, and writes binary messages:
    say so before the server answers "client sent proto_version=0"."""
    if "publication_names" not in options:
        raise InvalidArgument(
            f"slot {args.slot!r} decodes with pgoutput, which needs the publications to read: "
            "pass --publication NAME (repeatable)"
        )
    options.setdefault("proto_version", "1")
    if not args.binary:
        raise InvalidArgument(
            f"slot {args.slot!r} decodes with pgoutput, whose messages are binary: add --binary "
            "(each prints as \\x hex)"
        )
