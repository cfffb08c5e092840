"""``pgcdc slots``: every replication slot with its lag and retained WAL."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pgcdc.cli.common import add_connection_arguments, add_help_argument, conninfo_from
from pgcdc.cli.recvlogical import human_bytes
from pgcdc.connection import server_errors
from pgcdc.connection.conninfo import connect
from pgcdc.connection.sql import SlotInfo, list_slots

COLUMNS = ("slot", "plugin", "type", "database", "active", "confirmed", "lag", "retained",
           "wal_status")  # fmt: skip


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "slots", add_help=False, help="list replication slots with lag and retained WAL",
        description="List the server's replication slots: how far each trails the current WAL "
        "position (lag) and how much WAL it keeps on the server's disk (retained).",
    )  # fmt: skip
    add_help_argument(parser)
    add_connection_arguments(parser, top_level=False)
    parser.add_argument("--json", action="store_true", help="one JSON array of slot objects")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    with server_errors.translated(), connect(conninfo_from(args)) as conn:
        slots = list_slots(conn)
    if args.json:
        json.dump([slot_to_json(slot) for slot in slots], sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_table(slots))
    return 0


def slot_to_json(slot: SlotInfo) -> dict[str, Any]:
    """A slot with LSNs as "X/Y" strings and byte counts as numbers."""
    return {
        "slot": slot.name,
        "plugin": slot.plugin,
        "type": slot.slot_type,
        "database": slot.database,
        "temporary": slot.temporary,
        "active": slot.active,
        "active_pid": slot.active_pid,
        "two_phase": slot.two_phase,
        "failover": slot.failover,
        "restart_lsn": _lsn(slot.restart_lsn),
        "confirmed_flush_lsn": _lsn(slot.confirmed_flush_lsn),
        "wal_status": slot.wal_status,
        "safe_wal_size": slot.safe_wal_size,
        "invalidation_reason": slot.invalidation_reason,
        "lag_bytes": slot.lag_bytes,
        "retained_wal_bytes": slot.retained_wal_bytes,
    }


def _lsn(value: object) -> str | None:
    return None if value is None else str(value)


def format_table(slots: list[SlotInfo]) -> str:
    """An aligned table, one slot a line, under a header."""
    if not slots:
        return "(no replication slots)\n"
    rows = [COLUMNS] + [
        (
            slot.name,
            slot.plugin or "",
            slot.slot_type,
            slot.database or "",
            "yes" if slot.active else "no",
            _lsn(slot.confirmed_flush_lsn) or "",
            human_bytes(slot.lag_bytes),
            human_bytes(slot.retained_wal_bytes),
            slot.invalidation_reason or slot.wal_status or "",
        )
        for slot in slots
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        + "\n"
        for row in rows
    )
