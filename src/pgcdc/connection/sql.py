"""The SQL interface of logical decoding over an ordinary (non-replication) psycopg connection.

Slots can be created, read, advanced and listed with plain SQL functions, which is what
monitoring, tests, preflight checks and one-off tools want: no walsender, no COPY-BOTH. Reading
with ``get_changes`` confirms what it returns at once (the slot moves past it even if the caller
then crashes), so anything that must not lose changes should ``peek_changes``, store, then
``advance_slot``.

Every server error leaves as a typed ``pgcdc.errors`` error (``server_errors.from_psycopg``).
Slot functions refuse to run inside a transaction that has written anything, so use an
autocommit connection.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeAlias, TypeVar

import psycopg
from psycopg import sql

from pgcdc.connection import server_errors
from pgcdc.errors import UnsupportedFeature
from pgcdc.lsn import LSN

Data = TypeVar("Data", str, bytes)

OptionValue: TypeAlias = str | int | bool | Sequence[str]
"""A plugin option's value: text as is, numbers in decimal, booleans as true/false, and a
sequence of names as a comma-separated list of quoted identifiers (pgoutput's
``publication_names``). The SQL functions reject valueless options (NULL in the array)."""

# server_version_num of the first release that has a feature.
TWO_PHASE_SLOTS = 140000
FAILOVER_SLOTS = 170000
FLUSHED_MESSAGES = 170000
CONFLICTING_COLUMN = 160000
INVALIDATION_REASON_COLUMN = 170000


class ChangeRow(NamedTuple, Generic[Data]):
    """One row of pg_logical_slot_{get,peek}[_binary]_changes: ``data`` is ``str`` for the
    text functions and ``bytes`` for the binary ones."""

    lsn: LSN
    xid: int
    data: Data


@dataclass(frozen=True, slots=True)
class SlotInfo:
    """A row of pg_replication_slots, with the distances that tell whether a slot is healthy.

    ``lag_bytes`` is how far the slot's confirmed position trails the server's current WAL
    position (what a consumer still has to read); ``retained_wal_bytes`` is how much WAL the
    slot keeps on the server's disk (from restart_lsn). Columns the server version lacks are
    None (``failover`` before 17, ``two_phase`` before 14).
    """

    name: str
    plugin: str | None
    slot_type: str
    database: str | None
    temporary: bool
    active: bool
    active_pid: int | None
    two_phase: bool | None
    failover: bool | None
    restart_lsn: LSN | None
    confirmed_flush_lsn: LSN | None
    wal_status: str | None
    safe_wal_size: int | None
    invalidation_reason: str | None
    lag_bytes: int | None
    retained_wal_bytes: int | None
    # A standby's copy of a failover slot (17+; stays true on a promoted standby); None before.
    synced: bool | None = None

    @property
    def invalidated(self) -> bool:
        """The slot can no longer be read: it lost WAL (or catalog rows) it needed."""
        return self.invalidation_reason is not None or self.wal_status == "lost"


def _require(conn: psycopg.Connection[Any], version_num: int, feature: str) -> None:
    server = conn.info.server_version
    if server < version_num:
        raise UnsupportedFeature(
            f"{feature} needs PostgreSQL {version_num // 10000} or later; this server is "
            f"{server // 10000}.{server % 10000}: upgrade the server or do without {feature}"
        )


def _lsn(value: str | None) -> LSN | None:
    return None if value is None else LSN.parse(value)


# --- slots -----------------------------------------------------------------------------------


def create_logical_slot(
    conn: psycopg.Connection[Any],
    slot: str,
    plugin: str = "pgoutput",
    *,
    temporary: bool = False,
    two_phase: bool = False,
    failover: bool = False,
) -> LSN:
    """Create a logical slot; returns its consistent point (where decoding will start).

    A temporary slot lives until this session ends. ``two_phase`` (PostgreSQL 14+) decodes
    prepared transactions at PREPARE; ``failover`` (17+) lets standbys synchronise the slot.
    Waits for transactions running at the time to finish, as the server must.
    """
    arguments: sql.Composable = sql.SQL("%s, %s, temporary => %s")
    params: list[Any] = [slot, plugin, temporary]
    if two_phase:
        _require(conn, TWO_PHASE_SLOTS, "two_phase slots")
        arguments = sql.SQL("{}, twophase => %s").format(arguments)
        params.append(True)
    if failover:
        _require(conn, FAILOVER_SLOTS, "failover slots")
        arguments = sql.SQL("{}, failover => %s").format(arguments)
        params.append(True)
    query = sql.SQL("SELECT lsn::text FROM pg_create_logical_replication_slot({})").format(
        arguments
    )
    with server_errors.translated():
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return LSN.parse(row[0])


def drop_slot(conn: psycopg.Connection[Any], slot: str, *, if_exists: bool = False) -> bool:
    """Drop a slot (logical or physical); False when it did not exist and ``if_exists``."""
    with server_errors.translated():
        if if_exists:
            row = conn.execute(
                "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s",
                (slot,),
            ).fetchone()
            return row is not None
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    return True


def advance_slot(conn: psycopg.Connection[Any], slot: str, upto: LSN) -> LSN:
    """Move the slot's confirmed position to ``upto`` without decoding for a client; returns
    where it ended up (no further than the flushed end of WAL). Moving backwards raises
    InvalidArgument: the changes before the confirmed position are gone."""
    with server_errors.translated():
        row = conn.execute(
            "SELECT end_lsn::text FROM pg_replication_slot_advance(%s, %s::pg_lsn)",
            (slot, str(LSN(upto))),
        ).fetchone()
    assert row is not None
    return LSN.parse(row[0])


_CURRENT_LSN = (
    "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn() ELSE pg_current_wal_lsn() END"
)


def list_slots(conn: psycopg.Connection[Any]) -> list[SlotInfo]:
    """Every replication slot on the server (physical ones too), by name."""
    version = conn.info.server_version
    two_phase_column = sql.SQL("two_phase" if version >= TWO_PHASE_SLOTS else "NULL::boolean")
    failover_column = sql.SQL("failover" if version >= FAILOVER_SLOTS else "NULL::boolean")
    synced_column = sql.SQL("synced" if version >= FAILOVER_SLOTS else "NULL::boolean")
    if version >= INVALIDATION_REASON_COLUMN:
        reason_column = sql.SQL("invalidation_reason")
    elif version >= CONFLICTING_COLUMN:
        reason_column = sql.SQL("CASE WHEN conflicting THEN 'conflicting' END")
    else:
        reason_column = sql.SQL("NULL::text")
    query = sql.SQL(
        "SELECT slot_name::text, plugin::text, slot_type, database::text, temporary, active, "
        "active_pid, {two_phase}, {failover}, restart_lsn::text, confirmed_flush_lsn::text, "
        "wal_status, safe_wal_size, {invalidation_reason}, "
        "pg_wal_lsn_diff(current.lsn, confirmed_flush_lsn)::bigint, "
        "pg_wal_lsn_diff(current.lsn, restart_lsn)::bigint, {synced} "
        "FROM pg_replication_slots, (SELECT {current} AS lsn) AS current "
        "ORDER BY slot_name"
    ).format(
        current=sql.SQL(_CURRENT_LSN),
        two_phase=two_phase_column,
        failover=failover_column,
        invalidation_reason=reason_column,
        synced=synced_column,
    )
    with server_errors.translated():
        rows = conn.execute(query).fetchall()
    slots = []
    for row in rows:
        (name, plugin, slot_type, database, temporary, active, active_pid, two_phase, failover,
         restart_lsn, confirmed_flush_lsn, wal_status, safe_wal_size, reason, lag,
         retained, synced) = row  # fmt: skip
        if reason is None and wal_status == "lost":
            reason = "wal_removed"  # before PostgreSQL 17 only wal_status says so
        slots.append(
            SlotInfo(
                name=name,
                plugin=plugin,
                slot_type=slot_type,
                database=database,
                temporary=temporary,
                active=active,
                active_pid=active_pid,
                two_phase=two_phase,
                failover=failover,
                restart_lsn=_lsn(restart_lsn),
                confirmed_flush_lsn=_lsn(confirmed_flush_lsn),
                wal_status=wal_status,
                safe_wal_size=safe_wal_size,
                invalidation_reason=reason,
                lag_bytes=lag,
                retained_wal_bytes=retained,
                synced=synced,
            )
        )
    return slots


def get_slot(conn: psycopg.Connection[Any], slot: str) -> SlotInfo | None:
    """The slot named ``slot``, or None when there is none."""
    return next((info for info in list_slots(conn) if info.name == slot), None)


# --- reading changes -------------------------------------------------------------------------


def _option_text(value: OptionValue) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return ",".join('"' + name.replace('"', '""') + '"' for name in value)


def _changes_query(
    function: str,
    slot: str,
    upto_lsn: LSN | None,
    upto_nchanges: int | None,
    options: Mapping[str, OptionValue] | None,
) -> tuple[sql.Composed, tuple[Any, ...]]:
    flat: list[str] = []
    for name, value in (options or {}).items():
        flat += [name, _option_text(value)]
    query = sql.SQL(
        "SELECT lsn::text, xid::text, data "
        "FROM {}(%s, %s::pg_lsn, %s::integer, VARIADIC %s::text[])"
    ).format(sql.Identifier(function))
    upto = None if upto_lsn is None else str(LSN(upto_lsn))
    return query, (slot, upto, upto_nchanges, flat)


def _read(
    conn: psycopg.Connection[Any],
    function: str,
    slot: str,
    *,
    upto_lsn: LSN | None,
    upto_nchanges: int | None,
    options: Mapping[str, OptionValue] | None,
) -> list[tuple[str, str, Any]]:
    query, params = _changes_query(function, slot, upto_lsn, upto_nchanges, options)
    with server_errors.translated():
        return conn.execute(query, params).fetchall()


def _text_rows(rows: list[tuple[str, str, Any]]) -> list[ChangeRow[str]]:
    return [ChangeRow(LSN.parse(lsn), int(xid), str(data)) for lsn, xid, data in rows]


def _binary_rows(rows: list[tuple[str, str, Any]]) -> list[ChangeRow[bytes]]:
    return [ChangeRow(LSN.parse(lsn), int(xid), bytes(data)) for lsn, xid, data in rows]


def get_changes(
    conn: psycopg.Connection[Any],
    slot: str,
    *,
    upto_lsn: LSN | None = None,
    upto_nchanges: int | None = None,
    options: Mapping[str, OptionValue] | None = None,
) -> list[ChangeRow[str]]:
    """Decode and consume changes as text (test_decoding). The slot advances past everything
    returned. ``upto_nchanges`` stops after the transaction in which that many rows were
    reached, so more rows than asked may come back."""
    return _text_rows(
        _read(
            conn,
            "pg_logical_slot_get_changes",
            slot,
            upto_lsn=upto_lsn,
            upto_nchanges=upto_nchanges,
            options=options,
        )
    )


def peek_changes(
    conn: psycopg.Connection[Any],
    slot: str,
    *,
    upto_lsn: LSN | None = None,
    upto_nchanges: int | None = None,
    options: Mapping[str, OptionValue] | None = None,
) -> list[ChangeRow[str]]:
    """Like ``get_changes`` but leaves the slot where it is."""
    return _text_rows(
        _read(
            conn,
            "pg_logical_slot_peek_changes",
            slot,
            upto_lsn=upto_lsn,
            upto_nchanges=upto_nchanges,
            options=options,
        )
    )


def get_binary_changes(
    conn: psycopg.Connection[Any],
    slot: str,
    *,
    upto_lsn: LSN | None = None,
    upto_nchanges: int | None = None,
    options: Mapping[str, OptionValue] | None = None,
) -> list[ChangeRow[bytes]]:
    """Decode and consume changes as bytes: the only way to read pgoutput through SQL (it
    needs ``proto_version`` and ``publication_names`` options)."""
    return _binary_rows(
        _read(
            conn,
            "pg_logical_slot_get_binary_changes",
            slot,
            upto_lsn=upto_lsn,
            upto_nchanges=upto_nchanges,
            options=options,
        )
    )


def peek_binary_changes(
    conn: psycopg.Connection[Any],
    slot: str,
    *,
    upto_lsn: LSN | None = None,
    upto_nchanges: int | None = None,
    options: Mapping[str, OptionValue] | None = None,
) -> list[ChangeRow[bytes]]:
    """Like ``get_binary_changes`` but leaves the slot where it is."""
    return _binary_rows(
        _read(
            conn,
            "pg_logical_slot_peek_binary_changes",
            slot,
            upto_lsn=upto_lsn,
            upto_nchanges=upto_nchanges,
            options=options,
        )
    )


def stream_peeked_binary_changes(
    conn: psycopg.Connection[Any],
    slot: str,
    *,
    upto_lsn: LSN | None = None,
    upto_nchanges: int | None = None,
    options: Mapping[str, OptionValue] | None = None,
    fetch_rows: int = 10_000,
) -> Generator[ChangeRow[bytes], None, None]:
    """``peek_binary_changes`` read through a server-side cursor, ``fetch_rows`` at a time, so
    a long stretch of the slot never sits in the client's memory at once. It runs in a
    transaction of its own on ``conn``."""
    query, params = _changes_query(
        "pg_logical_slot_peek_binary_changes", slot, upto_lsn, upto_nchanges, options
    )
    with server_errors.translated(), conn.transaction(), conn.cursor("pgcdc_peek") as cursor:
        cursor.itersize = fetch_rows
        cursor.execute(query, params)
        for lsn, xid, data in cursor:
            yield ChangeRow(LSN.parse(lsn), int(xid), bytes(data))


# --- writing ---------------------------------------------------------------------------------


def emit_message(
    conn: psycopg.Connection[Any],
    transactional: bool,
    prefix: str,
    content: str | bytes,
    *,
    flush: bool = False,
) -> LSN:
    """Write a logical decoding message into WAL; returns its LSN.

    A transactional message is decoded only if, and when, the surrounding transaction commits;
    a non-transactional one is decoded at once, even if the transaction rolls back. ``flush``
    (PostgreSQL 17+) flushes WAL immediately for non-transactional messages.
    """
    content_type = sql.SQL("bytea" if isinstance(content, bytes) else "text")
    arguments: sql.Composable = sql.SQL("%s, %s, %s::{}").format(content_type)
    params: list[Any] = [transactional, prefix, content]
    if flush:
        _require(conn, FLUSHED_MESSAGES, "flushed logical messages")
        arguments = sql.SQL("{}, %s").format(arguments)
        params.append(True)
    query = sql.SQL("SELECT pg_logical_emit_message({})::text").format(arguments)
    with server_errors.translated():
        row = conn.execute(query, params).fetchone()
    assert row is not None
    return LSN.parse(row[0])
