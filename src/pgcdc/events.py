"""The one event model: what every output plugin decodes into and every later layer consumes.

Each event carries ``lsn``, the WAL position it arrived at (the XLogData start position, or the
``lsn`` column of the SQL interface). Column values in a ``Row`` stay in the form the server sent
them: ``str`` for text format, ``bytes`` for binary format, ``None`` for SQL NULL and
``UNCHANGED_TOAST`` for a TOASTed value the server did not send because it did not change.
``pgcdc.decoding.values`` turns them into typed Python or Arrow values; keeping them raw here is
what lets the receiver log changes without paying for type conversion it does not need.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import TypeAlias

from pgcdc.lsn import LSN


class Unchanged(enum.Enum):
    """Marks a TOASTed column the server left out because the UPDATE did not change it."""

    TOAST = "unchanged-toast"

    def __repr__(self) -> str:
        return "UNCHANGED_TOAST"


UNCHANGED_TOAST = Unchanged.TOAST

RawValue: TypeAlias = str | bytes | Unchanged | None
Row: TypeAlias = tuple[RawValue, ...]


class ReplicaIdentity(enum.Enum):
    """pg_class.relreplident: which old values an UPDATE or DELETE carries."""

    DEFAULT = "d"
    NOTHING = "n"
    FULL = "f"
    INDEX = "i"


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type_oid: int
    type_modifier: int = -1
    is_key: bool = False
    # Plugins that send type names instead of OIDs (test_decoding) fill this in.
    type_name: str | None = None


@dataclass(frozen=True, slots=True)
class Table:
    """A table's definition as the output plugin described it; changes refer to it."""

    namespace: str
    name: str
    columns: tuple[Column, ...]
    oid: int = 0
    replica_identity: ReplicaIdentity = ReplicaIdentity.DEFAULT

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def key_columns(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.is_key)


# --- transaction boundaries ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Begin:
    lsn: LSN
    xid: int | None
    final_lsn: LSN | None = None
    commit_time: datetime | None = None
    # openGauss mppdb_decoding: commit sequence number and first LSN of the transaction.
    csn: int | None = None
    first_lsn: LSN | None = None
    # openGauss include-user: the user who ran the transaction.
    user: str | None = None


@dataclass(frozen=True, slots=True)
class Commit:
    lsn: LSN
    commit_lsn: LSN | None
    end_lsn: LSN | None
    commit_time: datetime | None = None
    xid: int | None = None
    flags: int = 0


@dataclass(frozen=True, slots=True)
class Origin:
    lsn: LSN
    name: str
    origin_lsn: LSN


# --- catalogue -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Relation:
    """A table definition the server sent; it replaces any earlier one with the same OID."""

    lsn: LSN
    table: Table
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Type:
    """A non-built-in type's name, sent before the first Relation that uses it."""

    lsn: LSN
    oid: int
    namespace: str
    name: str
    xid: int | None = None


# --- changes ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Insert:
    lsn: LSN
    table: Table
    new: Row
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Update:
    """``old`` is the old key (``old_is_key``) or the whole old row (REPLICA IDENTITY FULL),
    or None when the server sent neither (the key did not change)."""

    lsn: LSN
    table: Table
    new: Row
    old: Row | None = None
    old_is_key: bool = False
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    lsn: LSN
    table: Table
    old: Row
    old_is_key: bool = True
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Truncate:
    lsn: LSN
    tables: tuple[Table, ...]
    cascade: bool = False
    restart_identity: bool = False
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class Message:
    """A logical decoding message from pg_logical_emit_message."""

    lsn: LSN
    transactional: bool
    prefix: str
    content: bytes
    xid: int | None = None


# --- streamed (in-progress) transactions, protocol 2+ ----------------------------------------


@dataclass(frozen=True, slots=True)
class StreamStart:
    lsn: LSN
    xid: int
    first_segment: bool


@dataclass(frozen=True, slots=True)
class StreamStop:
    lsn: LSN
    # test_decoding names the transaction when a block closes; pgoutput does not.
    xid: int | None = None


@dataclass(frozen=True, slots=True)
class StreamCommit:
    lsn: LSN
    xid: int
    commit_lsn: LSN
    end_lsn: LSN
    commit_time: datetime | None = None
    flags: int = 0


@dataclass(frozen=True, slots=True)
class StreamAbort:
    """Aborts ``subxid`` (the whole transaction when it equals ``xid``). Protocol 4 with
    parallel streaming adds the abort LSN and time."""

    lsn: LSN
    xid: int
    subxid: int
    abort_lsn: LSN | None = None
    abort_time: datetime | None = None


# --- two-phase commit, protocol 3+ -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BeginPrepare:
    lsn: LSN
    xid: int
    gid: str
    prepare_lsn: LSN
    end_lsn: LSN
    prepare_time: datetime | None = None


@dataclass(frozen=True, slots=True)
class Prepare:
    lsn: LSN
    xid: int
    gid: str
    prepare_lsn: LSN
    end_lsn: LSN
    prepare_time: datetime | None = None
    flags: int = 0


@dataclass(frozen=True, slots=True)
class StreamPrepare:
    lsn: LSN
    xid: int
    gid: str
    prepare_lsn: LSN
    end_lsn: LSN
    prepare_time: datetime | None = None
    flags: int = 0


@dataclass(frozen=True, slots=True)
class CommitPrepared:
    lsn: LSN
    xid: int
    gid: str
    commit_lsn: LSN
    end_lsn: LSN
    commit_time: datetime | None = None
    flags: int = 0


@dataclass(frozen=True, slots=True)
class RollbackPrepared:
    lsn: LSN
    xid: int
    gid: str
    prepare_end_lsn: LSN
    rollback_end_lsn: LSN
    prepare_time: datetime | None = None
    rollback_time: datetime | None = None
    flags: int = 0


# --- liveness --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """The source is alive and has nothing for us up to ``lsn`` (openGauss 'h' records, and
    pgcdc's own idle heartbeats)."""

    lsn: LSN
    time: datetime | None = None
    # openGauss heartbeats also carry the position up to which the server has flushed WAL.
    flush_lsn: LSN | None = None


Change: TypeAlias = Insert | Update | Delete | Truncate
Event: TypeAlias = (
    Begin
    | Commit
    | Origin
    | Relation
    | Type
    | Insert
    | Update
    | Delete
    | Truncate
    | Message
    | StreamStart
    | StreamStop
    | StreamCommit
    | StreamAbort
    | BeginPrepare
    | Prepare
    | StreamPrepare
    | CommitPrepared
    | RollbackPrepared
    | Heartbeat
)
