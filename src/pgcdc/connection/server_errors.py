"""Turn the server's ErrorResponses into pgcdc's typed errors with a fix in the message.

The SQLSTATE alone is too coarse (42501 covers both a missing REPLICATION attribute and a
plugin library the server refuses to load), so the primary message and its DETAIL are matched
too. Messages differ between versions (PostgreSQL 16+ quotes GUC names: ``"wal_level"``), so
the patterns below accept both spellings. Errors raised while connecting carry no SQLSTATE at
all in libpq: ``from_psycopg`` recovers the server's FATAL text from the connection message.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from pgcdc import errors

# SQLSTATEs (src/backend/utils/errcodes.txt).
UNDEFINED_OBJECT = "42704"
DUPLICATE_OBJECT = "42710"
OBJECT_IN_USE = "55006"
OBJECT_NOT_IN_PREREQUISITE_STATE = "55000"
CONFIGURATION_LIMIT_EXCEEDED = "53400"
TOO_MANY_CONNECTIONS = "53300"
INSUFFICIENT_PRIVILEGE = "42501"
UNDEFINED_FILE = "58P01"
QUERY_CANCELED = "57014"

_ACTIVE_PID = re.compile(r"is active for PID (\d+)")
_SLOT_NAME = re.compile(r'replication slot "([^"]*)"')
_ADVANCE_MINIMUM = re.compile(r"cannot advance replication slot to \S+, minimum is (\S+)")
_PUBLICATION_NAME = re.compile(r'publication "([^"]*)" does not exist')
_PLUGIN_LIBRARY = re.compile(r'(?:library|file) "([^"]*)"')
# 58P01 (undefined_file) is any missing file: a plugin library, but also a timeline history
# file or a pg_read_file() argument. Only these messages, from loading a shared library
# (dfmgr.c), mean the plugin is not installed.
_MISSING_LIBRARY = re.compile(r'could not (?:access file|load library) "[^"]*"')
# libpq's text for a refused connection: '... failed: FATAL:  <message>\nDETAIL:  <detail>'.
_FATAL = re.compile(r"FATAL:\s+(?P<message>[^\n]*)(?:\nDETAIL:\s+(?P<detail>[^\n]*))?")
_NO_REPLICATION_ATTRIBUTE = re.compile(
    r"superuser or replication role|REPLICATION attribute|to start WAL ?sender"
    r"|permission denied to use replication slots",
    re.IGNORECASE,
)
_WAL_SENDERS_EXHAUSTED = re.compile(r"max_wal_senders")
# The stream of a slot that a standby's recovery invalidates is ended with "canceling
# statement due to conflict with recovery" (40001) and this detail (errdetail_recovery_conflict,
# seen on PostgreSQL 18): it names no slot and no reason.
_RECOVERY_CONFLICT = "conflict with recovery"
_SLOT_CONFLICT_DETAIL = "logical replication slot"

# Why a slot was invalidated (pg_replication_slots.invalidation_reason, PostgreSQL 17+; 16 has
# only the boolean ``conflicting``) and what keeps it from happening again.
_INVALIDATION_CAUSES = {
    "wal_removed": "the server removed WAL the slot still needed (max_slot_wal_keep_size)",
    "rows_removed": (
        "a recovery conflict on the standby: the primary removed catalog rows the slot still "
        "needed; keep hot_standby_feedback = on on the standby, with primary_slot_name naming "
        "a physical slot on the primary, so that the primary keeps them"
    ),
    "wal_level_insufficient": (
        "a recovery conflict on the standby: the primary's wal_level was lowered below "
        "logical; keep wal_level = logical on the primary"
    ),
    "idle_timeout": "the slot was idle longer than idle_replication_slot_timeout",
    "conflicting": (
        "a recovery conflict on the standby: the primary removed catalog rows the slot needed "
        "(keep hot_standby_feedback = on and primary_slot_name on the standby) or its "
        "wal_level was lowered below logical"
    ),
}


def translate(
    sqlstate: str | None, message: str, detail: str | None = None, hint: str | None = None
) -> errors.PgcdcError:
    """The most specific typed error for a server error; ServerError when nothing fits."""
    text = f"{message}\n{detail or ''}"
    slot = _SLOT_NAME.search(message)
    slot_name = slot.group(1) if slot else ""
    if sqlstate == OBJECT_IN_USE and slot:
        pid = _ACTIVE_PID.search(message)
        return errors.SlotInUse(
            f"{message}: another client is streaming from slot {slot_name!r}"
            + (f" (pid {pid.group(1)})" if pid else "")
            + "; stop it, or terminate it with "
            + (
                f"SELECT pg_terminate_backend({pid.group(1)})"
                if pid
                else "pg_terminate_backend(pid)"
            )
            + ", then retry",
            slot=slot_name,
            active_pid=int(pid.group(1)) if pid else None,
        )
    if sqlstate == UNDEFINED_OBJECT and slot and "does not exist" in message:
        return errors.SlotNotFound(
            f"{message}; create it first (pgcdc --create-slot, or "
            f"SELECT pg_create_logical_replication_slot('{slot_name}', 'pgoutput'))"
        )
    minimum = _ADVANCE_MINIMUM.search(message)
    if minimum:
        return errors.InvalidArgument(
            f"{message}: a slot only moves forwards and has already confirmed up to "
            f"{minimum.group(1)}; advance it to {minimum.group(1)} or later"
        )
    if sqlstate == DUPLICATE_OBJECT and slot:
        return errors.SlotAlreadyExists(
            f"{message}; use it, drop it first (SELECT pg_drop_replication_slot('{slot_name}')), "
            "or pass --if-not-exists"
        )
    if "wal_level" in message and "logical" in message and "on the primary" in message:
        # A standby refusing to decode: the level that counts is its primary's.
        return errors.WalLevelNotLogical(
            f"{message}; on the primary: ALTER SYSTEM SET wal_level = logical and restart it "
            "(the standby's slots it invalidated meanwhile must be created again)"
        )
    if "wal_level" in message and "logical" in message:
        return errors.WalLevelNotLogical(
            f"{message}; set wal_level = logical in postgresql.conf (or ALTER SYSTEM SET "
            "wal_level = logical) and restart the server"
        )
    if sqlstate == CONFIGURATION_LIMIT_EXCEEDED and "replication slot" in message:
        return errors.NoFreeReplicationSlot(
            f"{message}; drop an unused slot (list them with SELECT slot_name, active FROM "
            "pg_replication_slots, drop with SELECT pg_drop_replication_slot('<name>')) or raise "
            "max_replication_slots and restart the server"
        )
    if "output plugin" in message and sqlstate == INSUFFICIENT_PRIVILEGE:
        # PostgreSQL 18.x: the library is not listed in output_plugin_libraries.
        library = _PLUGIN_LIBRARY.search(message)
        name = library.group(1) if library else "<plugin>"
        return errors.PluginNotInstalled(
            f"{message}; the server only loads output plugins listed in output_plugin_libraries: "
            f"install the {name!r} shared library on the server, add it to "
            "output_plugin_libraries in postgresql.conf and reload the server configuration"
        )
    if sqlstate in (INSUFFICIENT_PRIVILEGE, None) and _NO_REPLICATION_ATTRIBUTE.search(text):
        return errors.MissingReplicationPrivilege(
            f"{message}; grant it with ALTER ROLE <role> WITH REPLICATION (as a superuser)"
        )
    if sqlstate in (TOO_MANY_CONNECTIONS, None) and _WAL_SENDERS_EXHAUSTED.search(message):
        return errors.NoFreeWalSender(
            f"{message}; raise max_wal_senders (ALTER SYSTEM SET max_wal_senders = <n>) and "
            "restart the server, or stop another replication client (see SELECT pid, "
            "application_name FROM pg_stat_replication)"
        )
    if _MISSING_LIBRARY.search(message):
        library = _PLUGIN_LIBRARY.search(message)
        name = library.group(1) if library else "<plugin>"
        return errors.PluginNotInstalled(
            f"{message}; the output plugin {name!r} is not installed on the server: install its "
            "shared library into the server's lib directory (pg_config --pkglibdir), or use "
            "pgoutput, which ships with PostgreSQL (test_decoding is in contrib)"
        )
    publication = _PUBLICATION_NAME.search(message)
    if publication:
        return errors.PublicationNotFound(
            f'{message}; create it with CREATE PUBLICATION "{publication.group(1)}" FOR ALL '
            "TABLES (or FOR TABLE ...), or pass the name of an existing one"
        )
    if _RECOVERY_CONFLICT in message and _SLOT_CONFLICT_DETAIL in (detail or ""):
        return errors.SlotInvalidated(
            f"{message} ({detail}): the standby invalidated the replication slot this session "
            f"streamed from: {invalidation_cause('conflicting')}; the changes after what was "
            "stored can no longer be streamed, and the slot's invalidation_reason (pgcdc slots) "
            "says why; drop the slot, recreate it, then take a new initial snapshot"
        )
    if slot and ("invalidated" in text or "can no longer" in message):
        return errors.SlotInvalidated(
            f"{message}"
            + (f" ({detail})" if detail else "")
            + f"; the slot lost WAL or catalog rows it needed: drop it (SELECT "
            f"pg_drop_replication_slot('{slot_name}')), recreate it, then take a new initial "
            "snapshot"
        )
    if sqlstate == QUERY_CANCELED and "statement timeout" in message:
        return errors.StatementTimedOut(
            f"{message}: a catalog query of pgcdc's ran longer than statement_timeout; look for "
            "a lock holding it up (SELECT * FROM pg_locks WHERE NOT granted), or raise the "
            "timeout: PGCDC_STATEMENT_TIMEOUT=SECONDS (0 for none), or your own "
            "statement_timeout (the role's, or options='-c statement_timeout=...')",
            sqlstate=sqlstate,
            detail=detail,
        )
    return errors.ServerError(message, sqlstate=sqlstate, detail=detail)


def invalidation_cause(reason: str | None) -> str:
    """What invalidated a slot, and how to keep it from happening again, for an error message:
    the fix differs between a primary (WAL kept) and a standby (a recovery conflict)."""
    if reason is None:
        return "the server removed WAL or catalog rows it needed"
    return _INVALIDATION_CAUSES.get(reason, f"invalidation_reason {reason!r}")


def from_psycopg(error: psycopg.Error) -> errors.PgcdcError:
    """``translate`` for a psycopg exception, including refused connections (no SQLSTATE)."""
    if isinstance(error, psycopg.errors.ConnectionTimeout):
        return errors.ConnectionTimedOut(
            f"{error}: the server did not answer within connect_timeout; check host and port, "
            "or raise connect_timeout in the conninfo (or PGCONNECT_TIMEOUT)"
        )
    diag = error.diag
    if diag.sqlstate and diag.message_primary:
        return translate(
            diag.sqlstate, diag.message_primary, diag.message_detail, diag.message_hint
        )
    text = str(error).strip()
    fatal = _FATAL.search(text)
    text = " ".join(text.split())  # libpq's text spans lines; the CLI prints one
    if fatal:
        translated = translate(None, fatal.group("message").strip(), fatal.group("detail"))
        if type(translated) is not errors.ServerError:
            return translated
    if fatal or text.startswith("connection failed"):
        if "authentication failed" in text:
            return errors.AuthenticationFailed(
                f"{text}; check the user name and password (or .pgpass) and pg_hba.conf"
            )
        return errors.ConnectionFailed(
            f"{text}; check that the server is running and reachable with this conninfo "
            "(host, port, dbname, sslmode) and that pg_hba.conf admits the connection"
        )
    if isinstance(error, psycopg.OperationalError):
        return errors.ConnectionLost(f"{text}; reconnect and retry")
    return errors.ServerError(text, sqlstate=error.sqlstate)


@contextmanager
def translated() -> Iterator[None]:
    """Re-raise psycopg errors in the block as pgcdc's typed errors (the original as cause)."""
    try:
        yield
    except psycopg.Error as error:
        raise from_psycopg(error) from error
