"""Preflight: find out, before streaming, whether the server can serve a logical stream.

A misconfigured server otherwise shows up as an error deep inside a replication connection, or
worse, as a slot that quietly holds WAL. ``check`` reads the catalog with an ordinary
connection, raises the first problem as a typed ``pgcdc.errors`` error whose message says
exactly how to fix it, and otherwise returns what it found.

Whether an output plugin is installed cannot be read from any catalog (plugins are shared
libraries, not extensions), so when no existing slot proves it, ``check`` creates and drops a
temporary slot with that plugin. The server loads the plugin before it waits for running
transactions to finish, so if that wait outlasts ``probe_timeout`` the plugin has loaded and
the check passes without waiting any longer.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from pgcdc import errors
from pgcdc.connection import server_errors
from pgcdc.connection.catalog import ServerFacts, server_facts
from pgcdc.connection.conninfo import connect
from pgcdc.connection.deadline import answered_within
from pgcdc.connection.sql import SlotInfo, create_logical_slot, drop_slot, list_slots

QUERY_CANCELED = "57014"
LOGICAL_DECODING_ON_STANDBY = 160000


@dataclass(frozen=True, slots=True)
class PreflightReport:
    """What the checks found: all of it fit for streaming."""

    facts: ServerFacts
    database: str
    plugin: str
    # The existing slot, or None when the stream will create one (or use a temporary slot).
    slot: SlotInfo | None
    publications: tuple[str, ...]
    # "slot" when the existing slot already uses the plugin, "probe" when a temporary slot
    # loaded it.
    plugin_verified_by: str


def check(
    conninfo: str,
    *,
    slot: str | None,
    plugin: str = "pgoutput",
    publications: Sequence[str] = (),
    create_slot: bool = False,
    probe_timeout: float = 5.0,
    answer_timeout: float | None = None,
) -> PreflightReport:
    """Check that ``slot`` (or, when None, a temporary slot) can stream ``plugin`` output for
    ``publications`` from the database ``conninfo`` names; raise the first problem found.

    With ``create_slot`` a missing slot is fine as long as a replication slot is free. With
    ``answer_timeout``, each connection's queries that get no answer for that many seconds end
    with ``ConnectionLost`` (a silent network), as the stream's ``receive_timeout`` does.
    """
    with (
        server_errors.translated(),
        connect(conninfo) as conn,
        answered_within(conn, answer_timeout, "the preflight checks"),
    ):
        facts = server_facts(conn)
        database = conn.info.dbname
        _check_server(conn, facts)
        slots = list_slots(conn)
        existing = next((info for info in slots if info.name == slot), None)
        if slot is not None:
            _check_slot(slot, existing, database, plugin, create_slot)
        if existing is None:
            _check_free_slot(facts, slots)
        _check_free_wal_sender(facts)
        _check_publications(conn, database, publications)
    _probe_wal_sender(conninfo, answer_timeout)
    if existing is None:
        _probe_plugin(conninfo, plugin, probe_timeout, answer_timeout)
    return PreflightReport(
        facts=facts,
        database=database,
        plugin=plugin,
        slot=existing,
        publications=tuple(publications),
        plugin_verified_by="slot" if existing is not None else "probe",
    )


def _check_server(conn: psycopg.Connection[Any], facts: ServerFacts) -> None:
    if facts.wal_level != "logical":
        raise errors.WalLevelNotLogical(
            f"wal_level is {facts.wal_level!r}; set wal_level = logical (in postgresql.conf, or "
            "ALTER SYSTEM SET wal_level = logical) and restart the server"
        )
    if facts.in_recovery and facts.server_version_num < LOGICAL_DECODING_ON_STANDBY:
        raise errors.UnsupportedFeature(
            "this server is a standby, and logical decoding on a standby needs PostgreSQL 16 or "
            "later; connect to the primary instead"
        )
    if not facts.can_replicate:
        role = sql.Identifier(facts.role).as_string(conn)
        raise errors.MissingReplicationPrivilege(
            f"role {facts.role!r} has neither the REPLICATION attribute nor superuser, so it "
            f"cannot use replication slots or start a WAL sender; as a superuser run "
            f"ALTER ROLE {role} WITH REPLICATION"
        )


def _check_slot(
    slot: str, existing: SlotInfo | None, database: str, plugin: str, create_slot: bool
) -> None:
    drop = f"SELECT pg_drop_replication_slot('{slot}')"
    if existing is None:
        if create_slot:
            return
        raise errors.SlotNotFound(
            f"replication slot {slot!r} does not exist; create it with SELECT "
            f"pg_create_logical_replication_slot('{slot}', '{plugin}') or let pgcdc create it "
            "(create_slot=True, pgcdc --create-slot)"
        )
    if existing.slot_type != "logical":
        raise errors.SlotMismatch(
            f"replication slot {slot!r} is a {existing.slot_type} slot, not a logical one; "
            f"choose another name, or drop it ({drop}) if nothing uses it"
        )
    if existing.database != database:
        raise errors.SlotMismatch(
            f"replication slot {slot!r} belongs to database {existing.database!r}, not "
            f"{database!r}; connect to {existing.database!r} or use another slot name"
        )
    if existing.plugin != plugin:
        raise errors.SlotMismatch(
            f"replication slot {slot!r} decodes with {existing.plugin!r}, not {plugin!r}; use "
            f"plugin {existing.plugin!r}, another slot name, or drop it ({drop}) and recreate it"
        )
    if existing.invalidated:
        raise errors.SlotInvalidated(
            f"replication slot {slot!r} has been invalidated ({existing.invalidation_reason}, "
            f"wal_status {existing.wal_status!r}): "
            f"{server_errors.invalidation_cause(existing.invalidation_reason)}, so changes "
            f"have been lost to it; drop it ({drop}), recreate it and take a new initial "
            "snapshot"
        )
    if existing.active:
        pid = existing.active_pid
        raise errors.SlotInUse(
            f"replication slot {slot!r} is active for PID {pid}: another client is streaming "
            f"from it; stop that client, or end it with SELECT pg_terminate_backend({pid})",
            slot=slot,
            active_pid=pid,
        )


def _check_free_slot(facts: ServerFacts, slots: list[SlotInfo]) -> None:
    if facts.free_replication_slots > 0:
        return
    idle = [info.name for info in slots if not info.active]
    candidates = f"; inactive slots that may be dropped: {', '.join(idle)}" if idle else ""
    raise errors.NoFreeReplicationSlot(
        f"all replication slots are in use ({facts.replication_slots_used} of "
        f"max_replication_slots = {facts.max_replication_slots}); drop one that is no longer "
        "needed (list them with SELECT slot_name, active, database FROM pg_replication_slots, "
        "drop with SELECT pg_drop_replication_slot('<name>')) or raise max_replication_slots "
        f"and restart the server{candidates}"
    )


def _check_free_wal_sender(facts: ServerFacts) -> None:
    free = facts.free_wal_senders
    if free is None or free > 0:
        return  # the probe connection tells when the count is hidden from this role
    raise errors.NoFreeWalSender(
        f"all WAL senders are in use ({facts.wal_senders_used} of max_wal_senders = "
        f"{facts.max_wal_senders}); raise max_wal_senders (ALTER SYSTEM SET max_wal_senders = "
        f"{facts.max_wal_senders + 1}) and restart the server, or stop a replication client "
        "(SELECT pid, application_name, client_addr FROM pg_stat_replication)"
    )


def _probe_wal_sender(conninfo: str, answer_timeout: float | None) -> None:
    """Open (and close) a replication connection: proves a WAL sender is free and that
    pg_hba.conf and the role admit replication connections to this database."""
    with (
        server_errors.translated(),
        psycopg.connect(conninfo, replication="database", autocommit=True) as conn,
        answered_within(conn, answer_timeout, "the preflight's IDENTIFY_SYSTEM"),
    ):
        conn.execute("IDENTIFY_SYSTEM")


def _check_publications(
    conn: psycopg.Connection[Any], database: str, publications: Sequence[str]
) -> None:
    if not publications:
        return
    rows = conn.execute(
        "SELECT pubname::text FROM pg_publication WHERE pubname = ANY(%s::text[])",
        (list(publications),),
    ).fetchall()
    found = {name for (name,) in rows}
    missing = [name for name in publications if name not in found]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        create = sql.Identifier(missing[0]).as_string(conn)
        raise errors.PublicationNotFound(
            f"publication {names} does not exist in database {database!r}; create it there with "
            f"CREATE PUBLICATION {create} FOR ALL TABLES (or FOR TABLE ...), or pass an "
            "existing publication"
        )


def _probe_plugin(conninfo: str, plugin: str, timeout: float, answer_timeout: float | None) -> None:
    """Prove the server can load ``plugin`` by creating (and dropping) a temporary slot."""
    probe = f"pgcdc_preflight_{os.getpid()}_{secrets.token_hex(4)}"
    deadline = None if answer_timeout is None else max(answer_timeout, timeout + 1)
    with (
        server_errors.translated(),
        psycopg.connect(conninfo, autocommit=True) as conn,
        answered_within(conn, deadline, "the preflight's plugin probe"),
    ):
        conn.execute(
            "SELECT set_config('statement_timeout', %s, false)", (f"{int(timeout * 1000)}ms",)
        )
        try:
            create_logical_slot(conn, probe, plugin, temporary=True)
        except errors.ServerError as error:
            if error.sqlstate != QUERY_CANCELED:
                raise
            # Canceled while waiting for running transactions: the plugin had loaded.
            return
        drop_slot(conn, probe, if_exists=True)
