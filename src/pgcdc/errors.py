"""The typed errors pgcdc raises. Each says what is wrong and how to fix it."""

from __future__ import annotations

import pickle
import re
from typing import Any

# Secrets a conninfo or URI may carry, wherever they appear in a message: keyword form
# (password=..., sslpassword='...'), URI userinfo (postgresql://user:secret@host) and URI query
# parameters (?password=...). The whole value goes, up to the next space (more rather than less).
_SECRET_KEYWORD = re.compile(
    r"(?<![\w-])((?:ssl)?password\s*=\s*)('(?:[^'\\]|\\.)*'?|(?:\\.|[^\s\\])*)",
    re.IGNORECASE,
)
_SECRET_USERINFO = re.compile(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@", re.IGNORECASE)
REDACTED = "********"


def redact(text: str) -> str:
    """``text`` with every password and sslpassword of a conninfo or URI in it replaced.

    PgcdcError applies it to every message, so no typed error (printed, logged, sent back
    from the receiver process) can carry a secret from a conninfo or a libpq message."""
    if "assword" not in text.lower() and "://" not in text:
        return text
    text = _SECRET_USERINFO.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    return _SECRET_KEYWORD.sub(lambda m: f"{m.group(1)}{REDACTED}", text)


class PgcdcError(Exception):
    """Base class of every error pgcdc raises on purpose. Its message never holds a password
    (see ``redact``)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(redact(arg) if isinstance(arg, str) else arg for arg in args))


# --- configuration and preflight -------------------------------------------------------------


class ConfigurationError(PgcdcError):
    """The server, role or slot is not set up for logical decoding; the message says the fix."""


class WalLevelNotLogical(ConfigurationError):
    pass


class NoFreeReplicationSlot(ConfigurationError):
    pass


class NoFreeWalSender(ConfigurationError):
    pass


class MissingReplicationPrivilege(ConfigurationError):
    pass


class SlotInUse(ConfigurationError):
    def __init__(self, message: str, *, slot: str, active_pid: int | None) -> None:
        super().__init__(message)
        self.slot = slot
        self.active_pid = active_pid


class SlotNotFound(ConfigurationError):
    pass


class SlotAlreadyExists(ConfigurationError):
    pass


class SlotInvalidated(ConfigurationError):
    pass


class SlotReplaced(ConfigurationError):
    """The slot a change log was filled from was dropped and created again, advanced by
    another client, or is another slot: streaming it would leave a gap in the log, so pgcdc
    refuses; the message says how to start over."""


class SlotNotSynced(SlotNotFound):
    """After a failover the new primary has no copy of the slot (it was not a failover slot,
    or the standby had not synchronized it): resuming would need a new slot and leave a gap."""


class TimelineDiverged(ConfigurationError):
    """The server is on a timeline that does not continue the change log's: it was promoted
    from a standby that had not received changes the log holds (or it is not a successor of
    the server the log was filled from), so the log holds changes the source lost."""


class StandbyNotReady(ConfigurationError):
    """A physical standby could not take over the pipeline's slot after a failover, or is not
    ready to decode on; the message lists what to set, and where."""


class PublicationNotFound(ConfigurationError):
    pass


class PluginNotInstalled(ConfigurationError):
    pass


class UnsupportedFeature(ConfigurationError):
    """A command or option needs a newer server or protocol than the one in use."""


# --- the server said no ----------------------------------------------------------------------


class ServerError(PgcdcError):
    """An ErrorResponse from the server: the SQLSTATE and its message, as the server sent them."""

    def __init__(self, message: str, *, sqlstate: str | None, detail: str | None = None) -> None:
        text = f"{message} (SQLSTATE {sqlstate})" if sqlstate else message
        if detail:
            text += f"\nDETAIL: {detail}"
        super().__init__(text)
        self.sqlstate = sqlstate
        self.server_message = message
        self.detail = detail


class StatementTimedOut(ServerError):
    """One of pgcdc's own catalog or preflight queries ran past its statement timeout."""


class ReplicationStreamError(ServerError):
    """The server ended a replication stream with an error (slot dropped, walsender killed...)."""


class ConnectionLost(PgcdcError):
    """The connection closed without an ErrorResponse (network failure, server crash)."""


class SnapshotLost(ConnectionLost):
    """The exported snapshot a copy joins is gone: the connection that exported it ended (a
    server restart, a lost connection, a driver that died). Taking the snapshot again gets
    past it, as a new session gets past a lost connection."""


# --- bytes that do not parse -----------------------------------------------------------------


class DecodeError(PgcdcError, ValueError):
    """Bytes from the server (or a log file) do not form a valid message of the expected kind."""


class ProtocolError(DecodeError):
    """A COPY-BOTH replication sub-protocol message is malformed or unexpected."""


class UnknownRelation(DecodeError):
    """A change names a relation whose Relation message the decoder has not seen: decoding began
    mid-stream without the state that went with that position."""

    def __init__(self, message: str, *, relation_oid: int) -> None:
        super().__init__(message)
        self.relation_oid = relation_oid


# --- connection (pgcdc.connection.replication) -----------------------------------------------


class InvalidArgument(PgcdcError, ValueError):
    """A value pgcdc was asked to send cannot be sent as given (e.g. a NUL byte in a name)."""


class ConnectionFailed(PgcdcError):
    """Could not open a connection (unreachable host, TLS verification, refused by server)."""


class ServerIsStandby(ConnectionFailed):
    """The conninfo reached a standby where the primary is needed: a connection failure a
    retry can get past (the standby may be promoted, or libpq reach the primary next time)."""


class AuthenticationFailed(ConnectionFailed):
    """The server rejected the credentials; check the password, .pgpass and pg_hba.conf."""


class ConnectionTimedOut(ConnectionFailed):
    """The server did not complete the connection within connect_timeout (a host that accepts
    TCP but never answers, a firewall dropping packets, an overloaded server)."""


# --- the durable change log ------------------------------------------------------------------


class ChangeLogError(PgcdcError):
    """A problem with the durable change log (``pgcdc.changelog``)."""


class CorruptChangeLog(ChangeLogError, DecodeError):
    """A change log file is damaged where it cannot be a torn tail (a sealed segment, a header)."""


class ChangeLogLocked(ChangeLogError):
    """Another writer holds the change log; only one process may append to it."""


class UnloggableInput(ChangeLogError, ValueError):
    """A transaction, event, value or name cannot be stored in the change log as given."""


class UnknownConsumer(ChangeLogError, KeyError):
    """A change log consumer name was used before ``register``."""


# --- Delta Lake sinks ------------------------------------------------------------------------


class SinkError(PgcdcError):
    """A batch of changes cannot be written to a Delta table as it stands."""


class StaleRowsWarning(UserWarning):
    """A source change the slot does not stream left rows downstream stale (a column added
    with a volatile default, or ALTER COLUMN ... TYPE: both rewrite the table): re-copy it."""


def _sql_name(part: str) -> str:
    """``part`` as SQL names it: as is when lower-case and plain, else double-quoted."""
    if re.fullmatch(r"[a-z_][a-z0-9_$]*", part):
        return part
    return '"' + part.replace('"', '""') + '"'


def recopy_hint(namespace: str, name: str) -> str:
    """The command that re-copies a table whose rows went stale (``StaleRowsWarning``)."""
    return (
        f"stop the pipeline and run it once with --recopy {_sql_name(namespace)}."
        f"{_sql_name(name)} (pgcdc pipeline run --config ... --recopy ...), which replaces "
        "the table downstream by a copy of it and streams on from there"
    )


class InvalidChangeBatch(SinkError, ValueError):
    """A change table does not follow the sink's input contract (``pgcdc.sinks.changes``)."""


class SchemaChangeError(SinkError):
    """A source column changed type in a way the Delta table cannot follow without losing data."""

    def __init__(self, message: str, *, table: str, column: str, lsn: object) -> None:
        super().__init__(message)
        self.table = table
        self.column = column
        self.lsn = lsn


class UnresolvedToastError(SinkError):
    """An unchanged TOASTed value has no earlier value to carry (not in the batch or the table)."""


class LakePathError(SinkError, ValueError):
    """A name has no lake path, a path is not one pgcdc made, or a table sits at the path an
    older pgcdc gave it (``pgcdc.sinks.paths``); the message says what to move where."""


class MissingOutputData(DecodeError):
    """The plugin's output is well formed but lacks what an event needs (test_decoding prints no
    row data for streamed changes); decoding on would lose data, so the message says which plugin
    option to change."""


# --- transaction assembly (pgcdc.transactions) -----------------------------------------------


class InvalidOption(ConfigurationError, ValueError):
    """A decoding or assembly option has a value pgcdc cannot use; the message says which
    values it accepts."""


class InvalidTablePattern(InvalidOption):
    """A white-table-list entry is not ``schema.table`` (``*`` for any name, no spaces)."""


class TransactionSequenceError(DecodeError):
    """Decoded events do not form transactions (a change outside Begin/Commit, a commit for a
    transaction never begun): the stream was cut or resumed without its state."""


class SpillError(PgcdcError):
    """A transaction could not be spilled to, or read back from, its temporary file."""


# --- preflight (pgcdc.connection.preflight) --------------------------------------------------


class SlotMismatch(ConfigurationError):
    """An existing slot cannot serve this stream: it is physical, belongs to another database,
    or decodes with another output plugin."""


# --- the pgcdc command (pgcdc.cli) -----------------------------------------------------------


class OutputError(PgcdcError):
    """An output file of ``pgcdc --start`` cannot be opened or written, or a change cannot be
    written in the chosen ``--format``; the message says which and what to use instead."""


class InvalidRowValue(PgcdcError, TypeError):
    """A row holds a value that is not a raw server value (str, bytes, None or
    UNCHANGED_TOAST), so it cannot be put in TupleData wire form."""


# --- the initial snapshot (pgcdc.snapshot) ---------------------------------------------------


class SnapshotError(PgcdcError):
    """The initial snapshot could not be taken or stored; the slot it created was dropped, so
    it can be retried as it stands once the cause is fixed."""


class ReceiverProcessError(PgcdcError):
    """The pipeline's receiver process died, or failed with an error that could not be sent
    back as itself (the message names the original type)."""


class StorageError(PgcdcError):
    """A file or directory pgcdc writes (change log, consumer state, lake, checkpoint, spill)
    could not be created or written: a full disk, a missing permission, a file in the way."""


def storage_error(error: OSError) -> StorageError:
    """``error`` as one line that names the path and what to do about it. Nothing confirmed to
    the server is lost by a failed write: pgcdc confirms only what it has stored."""
    import errno

    where = f" ({error.filename})" if error.filename else ""
    reason = error.strerror or str(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        fix = (
            "free space on that file system (or give the change log, lake or checkpoint a "
            "bigger one), then run the same command again: it resumes from what was stored"
        )
    elif error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "give pgcdc's user write access there, or point pgcdc at another directory"
    elif error.errno in (errno.ENOTDIR, errno.EEXIST, errno.EISDIR):
        fix = "a file is where pgcdc needs a directory (or the reverse): give another path"
    else:
        fix = "fix the file system problem, then run the same command again"
    return StorageError(f"{reason}{where}; {fix}")


class MirrorDiffers(SinkError):
    """A mirror checked against its source table (``pgcdc demo``) does not equal it."""


class PipelineQueryError(PgcdcError):
    """The pipeline's Spark streaming query could not start, or stopped with an error; the
    message carries Spark's own reason (for a Java error, its first line)."""


class CheckpointUnavailable(PipelineQueryError):
    """Spark cannot keep its checkpoint at the path given: its JVM has no file system for that
    scheme (pyspark ships no hadoop-aws, so ``s3a://`` fails). Keep the checkpoint on a file
    system the driver owns."""


def _rebuild(cls: type[BaseException], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """An exception of ``cls`` without calling its ``__init__`` (some take keyword-only
    arguments, which plain pickling of exceptions cannot pass)."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


def portable(exc: BaseException) -> tuple[Any, ...]:
    """``exc`` as (rebuild function, arguments) that pickle, to cross into another process
    (the receiver's, a Spark task's) and be raised there as itself; else as a
    ReceiverProcessError naming its type."""
    for state in (dict(exc.__dict__), {}):
        candidate = (_rebuild, (type(exc), exc.args, state))
        try:
            pickle.loads(pickle.dumps(candidate))
        except Exception:
            continue
        return candidate
    message = f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    return (ReceiverProcessError, (message,))
