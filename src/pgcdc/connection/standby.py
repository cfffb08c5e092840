"""Is a physical standby ready to take over the pipeline's slot after a failover?

PostgreSQL 17 keeps copies of failover slots on standbys that synchronize them
(``sync_replication_slots``). That needs settings on both sides: on the standby slot sync,
hot_standby_feedback, a physical slot on the primary (``primary_slot_name``), a
``primary_conninfo`` that names a database and ``wal_level = logical``; on the primary, that
standby's slot in ``synchronized_standby_slots``, so that the primary sends a logical change
only once the standby has it (without it a promoted standby may lack changes pgcdc already
logged). ``check_standby`` reads both and lists everything missing, each with the statement
that sets it, in one ``StandbyNotReady``.

Decoding on a standby (PostgreSQL 16+) needs less of it, but from the standby alone:
hot_standby_feedback and ``primary_slot_name``, so that the primary keeps the catalog rows the
standby's slots need (else a VACUUM there makes the standby invalidate them), which
``check_decoding_on_standby`` lists. The primary's ``wal_level = logical`` shows on the standby
only through its slots: it creates none and invalidates all (``wal_level_insufficient``) while
the primary's level is lower, so the preflight's slot (the one named, or a temporary probe)
proves it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict

from pgcdc.connection import server_errors
from pgcdc.connection.conninfo import connect
from pgcdc.connection.sql import FAILOVER_SLOTS, SlotInfo, get_slot
from pgcdc.errors import StandbyNotReady

__all__ = [
    "DecodingStandbyReport",
    "StandbyReport",
    "check_decoding_on_standby",
    "check_standby",
    "in_recovery",
]


@dataclass(frozen=True, slots=True)
class StandbyReport:
    """What the standby check found: ready for a failover."""

    primary_slot_name: str
    # The pipeline's slot as the standby has it (None: not synchronized yet, or none asked).
    synced_slot: SlotInfo | None


@dataclass(frozen=True, slots=True)
class DecodingStandbyReport:
    """What the check of a standby to decode on found: ready."""

    primary_slot_name: str


ON_STANDBY = "on the standby"


def _turn_on(name: str) -> str:
    return f"{ON_STANDBY}: ALTER SYSTEM SET {name} = on; SELECT pg_reload_conf()"


# The standby's primary_slot_name, with the physical slot it names on the primary.
PRIMARY_SLOT_FIX = (
    "on the primary: SELECT pg_create_physical_replication_slot('<name>'); "
    f"{ON_STANDBY}: ALTER SYSTEM SET primary_slot_name = '<name>'; SELECT pg_reload_conf()"
)


def _settings(conn: psycopg.Connection[Any], *names: str) -> dict[str, str]:
    rows = conn.execute(
        "SELECT name, setting FROM pg_settings WHERE name = ANY(%s::text[])", (list(names),)
    ).fetchall()
    return dict(rows)


def in_recovery(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server is a standby (or still recovering)."""
    row = conn.execute("SELECT pg_is_in_recovery()").fetchone()
    return bool(row and row[0])


def check_standby(primary: str, standby: str, *, slot: str | None = None) -> StandbyReport:
    """Check that the server ``standby`` connects to can take over ``slot`` (the pipeline's
    logical slot on ``primary``) when promoted; StandbyNotReady lists each missing setting."""
    with server_errors.translated(), connect(standby) as conn:
        if conn.info.server_version < FAILOVER_SLOTS:
            raise StandbyNotReady(
                "failover slots need PostgreSQL 17 or later on the primary and its standbys; "
                "before 17, a promoted standby has no copy of the slot"
            )
        if not in_recovery(conn):
            raise StandbyNotReady(
                "the --standby server is not in recovery: give the conninfo of a physical "
                "standby of the primary (made with pg_basebackup -R)"
            )
        found = _settings(
            conn,
            "sync_replication_slots",
            "hot_standby_feedback",
            "primary_slot_name",
            "primary_conninfo",
            "wal_level",
        )
        synced = get_slot(conn, slot) if slot else None
    fixes: list[str] = []
    for name in ("sync_replication_slots", "hot_standby_feedback"):
        if found.get(name) != "on":
            fixes.append(_turn_on(name))
    if found.get("wal_level") != "logical":
        fixes.append(f"{ON_STANDBY}: ALTER SYSTEM SET wal_level = logical, then restart it")
    physical = found.get("primary_slot_name", "")
    if not physical:
        fixes.append(PRIMARY_SLOT_FIX)
    primary_conninfo = found.get("primary_conninfo", "")
    if primary_conninfo and "*" not in primary_conninfo:  # hidden from roles without rights
        try:
            names_database = bool(conninfo_to_dict(primary_conninfo).get("dbname"))
        except psycopg.ProgrammingError:
            names_database = False
        if not names_database:
            fixes.append(
                f"{ON_STANDBY}: add dbname=<a database> to primary_conninfo (ALTER SYSTEM SET "
                "primary_conninfo = '... dbname=postgres'; SELECT pg_reload_conf()): slot "
                "synchronization connects to a database"
            )
    with server_errors.translated(), connect(primary) as conn:
        if in_recovery(conn):
            raise StandbyNotReady(
                "the server the main conninfo reaches is in recovery: give the primary's "
                "conninfo with -d and the standby's with --standby"
            )
        waits_for = _settings(conn, "synchronized_standby_slots").get(
            "synchronized_standby_slots", ""
        )
        physical_slot = get_slot(conn, physical) if physical else None
        logical_slot = get_slot(conn, slot) if slot else None
    if physical and physical_slot is None:
        fixes.append(
            f"on the primary: SELECT pg_create_physical_replication_slot('{physical}') (the "
            "standby's primary_slot_name)"
        )
    listed = [name.strip().strip('"') for name in waits_for.split(",")]
    if physical and physical not in listed and "*" not in listed:
        wanted = ", ".join([name for name in listed if name] + [physical])
        fixes.append(
            f"on the primary: ALTER SYSTEM SET synchronized_standby_slots = '{wanted}'; SELECT "
            "pg_reload_conf() (else pgcdc may log changes the standby never received, which a "
            "promotion loses)"
        )
    if slot and logical_slot is not None and not logical_slot.failover:
        fixes.append(
            f"on the primary: make slot {slot!r} a failover slot: while nothing streams from "
            f"it, run ALTER_REPLICATION_SLOT {slot} (FAILOVER true) in a replication "
            'connection (psql "dbname=... replication=database"); pgcdc pipeline creates its '
            "slot that way unless failover = false"
        )
    if fixes:
        raise StandbyNotReady(
            f"the standby is not ready to take over after a failover ({len(fixes)} to fix): "
            + "; and ".join(fixes)
        )
    return StandbyReport(physical, synced if synced is not None and synced.synced else None)


def check_decoding_on_standby(conninfo: str) -> DecodingStandbyReport:
    """Check what decoding on the standby ``conninfo`` reaches needs beyond what any server
    needs (pgcdc.connection.preflight checks that, and PostgreSQL 16+); StandbyNotReady lists
    each missing setting with the statement that sets it, and where."""
    with server_errors.translated(), connect(conninfo) as conn:
        found = _settings(conn, "hot_standby_feedback", "primary_slot_name")
    fixes: list[str] = []
    if found.get("hot_standby_feedback") != "on":
        fixes.append(
            _turn_on("hot_standby_feedback")
            + " (else a VACUUM on the primary removes catalog rows the standby's slots need, "
            "and the standby invalidates them: rows_removed)"
        )
    physical = found.get("primary_slot_name", "")
    if not physical:
        fixes.append(
            PRIMARY_SLOT_FIX + " (so that the primary keeps what hot_standby_feedback asks "
            "for while the standby is disconnected or restarting)"
        )
    if fixes:
        raise StandbyNotReady(
            f"the server is a standby, not ready for logical decoding on it ({len(fixes)} to "
            "fix): " + "; and ".join(fixes)
        )
    return DecodingStandbyReport(physical)
