"""``pgcdc check``: preflight - can this server, role and slot serve a logical stream?"""

from __future__ import annotations

import argparse
from typing import Any

from pgcdc.cli.common import add_connection_arguments, add_help_argument, conninfo_from
from pgcdc.cli.recvlogical import human_bytes
from pgcdc.connection.conninfo import normalize
from pgcdc.connection.preflight import PreflightReport, check
from pgcdc.connection.standby import (
    DecodingStandbyReport,
    StandbyReport,
    check_decoding_on_standby,
    check_standby,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "check", add_help=False, help="check that the server is ready for logical decoding",
        description="Check wal_level, privileges, free slots and WAL senders, the slot, the "
        "publications and the output plugin, and on a standby what decoding there needs "
        "(PostgreSQL 16+, hot_standby_feedback, primary_slot_name); print what was found, or "
        "the first problem and how to fix it.",
    )  # fmt: skip
    add_help_argument(parser)
    add_connection_arguments(parser, top_level=False)
    parser.add_argument("-S", "--slot", metavar="SLOTNAME", help="the slot to stream from")
    parser.add_argument("-P", "--plugin", default="pgoutput", help="output plugin (pgoutput)")
    parser.add_argument(
        "--publication", dest="publications", action="append", default=[], metavar="NAME"
    )
    parser.add_argument(
        "--create-slot", action="store_true", help="a missing slot is fine: it will be created"
    )
    parser.add_argument(
        "--standby", metavar="CONNSTR",
        help="also check that this physical standby can take over the slot after a failover "
        "(PostgreSQL 17+: slot sync, hot_standby_feedback, primary_slot_name, and the "
        "primary's synchronized_standby_slots)",
    )  # fmt: skip
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    conninfo = conninfo_from(args)
    report = check(
        conninfo, slot=args.slot, plugin=args.plugin,
        publications=args.publications, create_slot=args.create_slot,
    )  # fmt: skip
    text = format_report(report)
    if report.facts.in_recovery:
        text += format_decoding_standby(check_decoding_on_standby(conninfo))
    if args.standby is not None:
        standby = check_standby(conninfo, normalize(args.standby), slot=args.slot)
        text += format_standby(standby, args.slot)
    print(text, end="")
    return 0


def format_standby(report: StandbyReport, slot: str | None) -> str:
    lines = [
        f"standby: ready for a failover (slot sync on, hot_standby_feedback on, streams "
        f"through slot {report.primary_slot_name}, which the primary waits for)"
    ]
    if slot:
        synced = report.synced_slot
        lines.append(
            f"standby's copy of {slot}: confirmed at {synced.confirmed_flush_lsn}"
            if synced is not None
            else f"standby's copy of {slot}: not synchronized yet (the standby copies it once "
            "the slot has moved past where the standby began)"
        )
    return "".join(line + "\n" for line in lines)


def format_decoding_standby(report: DecodingStandbyReport) -> str:
    lines = [
        "decoding on this standby: hot_standby_feedback on, streams through physical slot "
        f"{report.primary_slot_name} on the primary",
        "primary's wal_level: logical (else this standby could hold no valid logical slot)",
        "a slot created on a standby cannot be a failover slot (PostgreSQL refuses FAILOVER "
        "in recovery): if this standby is lost, so is the slot",
    ]
    return "".join(line + "\n" for line in lines)


def format_report(report: PreflightReport) -> str:
    facts = report.facts
    version = facts.server_version_num
    lines = [
        "ok: ready for logical decoding",
        f"server: PostgreSQL {version // 10000}.{version % 10000}"
        + (" (standby)" if facts.in_recovery else ""),
        f"database: {report.database}",
        f"role: {facts.role} ("
        + ("superuser" if facts.role_superuser else "replication") + ")",
        f"wal_level: {facts.wal_level}",
        f"replication slots: {facts.replication_slots_used} of {facts.max_replication_slots} used",
        "wal senders: "
        + ("hidden from this role" if facts.wal_senders_used is None
           else f"{facts.wal_senders_used} of {facts.max_wal_senders} used"),
        f"plugin: {report.plugin} (verified by {report.plugin_verified_by})",
    ]  # fmt: skip
    if report.slot is not None:
        slot = report.slot
        lines.append(
            f"slot: {slot.name} confirmed at {slot.confirmed_flush_lsn}, lag "
            f"{human_bytes(slot.lag_bytes)}, retains {human_bytes(slot.retained_wal_bytes)}"
        )
    else:
        lines.append("slot: none yet (will be created)")
    if report.publications:
        lines.append(f"publications: {', '.join(report.publications)}")
    return "".join(line + "\n" for line in lines)
