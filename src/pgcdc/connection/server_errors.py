"""Turn the server's ErrorResponses into pgcdc's typed errors with a fix in the message."""

from __future__ import annotations

import re

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

_ACTIVE_PID = re.compile(r"is active for PID (\d+)")
_SLOT_NAME = re.compile(r'replication slot "([^"]*)"')


def translate(sqlstate: str | None, message: str, detail: str | None = None) -> errors.PgcdcError:
    """The most specific typed error for a server error; ServerError when nothing fits."""
    slot = _SLOT_NAME.search(message)
    slot_name = slot.group(1) if slot else ""
    if sqlstate == OBJECT_IN_USE and slot:
        pid = _ACTIVE_PID.search(message)
        return errors.SlotInUse(
            f"{message}: another client is streaming from slot {slot_name!r}"
            + (f" (pid {pid.group(1)})" if pid else "")
            + "; stop it, or terminate it with pg_terminate_backend(pid), then retry",
            slot=slot_name,
            active_pid=int(pid.group(1)) if pid else None,
        )
    if sqlstate == UNDEFINED_OBJECT and slot and "does not exist" in message:
        return errors.SlotNotFound(
            f"{message}; create it first (pgcdc --create-slot, or "
            f"pg_create_logical_replication_slot('{slot_name}', 'pgoutput'))"
        )
    if sqlstate == DUPLICATE_OBJECT and slot:
        return errors.SlotAlreadyExists(
            f"{message}; use it, drop it first, or pass --if-not-exists"
        )
    if "wal_level" in message and "logical" in message:
        return errors.WalLevelNotLogical(
            f"{message}; set wal_level = logical in postgresql.conf and restart the server"
        )
    if sqlstate == CONFIGURATION_LIMIT_EXCEEDED and "replication slot" in message:
        return errors.NoFreeReplicationSlot(
            f"{message}; drop an unused slot (see pgcdc slots) or raise max_replication_slots "
            "and restart"
        )
    if sqlstate == TOO_MANY_CONNECTIONS and "wal sender" in message.lower():
        return errors.NoFreeWalSender(
            f"{message}; raise max_wal_senders and restart, or stop another replication client"
        )
    if sqlstate == INSUFFICIENT_PRIVILEGE and "replication" in message.lower():
        return errors.MissingReplicationPrivilege(
            f"{message}; grant it with ALTER ROLE <role> WITH REPLICATION"
        )
    if sqlstate == UNDEFINED_FILE or "could not access file" in message:
        return errors.PluginNotInstalled(
            f"{message}; install the output plugin's shared library on the server "
            "(pgoutput and test_decoding ship with PostgreSQL; test_decoding is in contrib)"
        )
    if "publication" in message and "does not exist" in message:
        return errors.PublicationNotFound(
            f"{message}; create it with CREATE PUBLICATION <name> FOR ALL TABLES (or FOR TABLE ...)"
        )
    if slot and ("invalidated" in message or "can no longer" in message):
        return errors.SlotInvalidated(
            f"{message}; the slot lost WAL it needed: drop and recreate it, then take a new "
            "initial snapshot"
        )
    return errors.ServerError(message, sqlstate=sqlstate, detail=detail)
