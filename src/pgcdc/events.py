"""The one event model: what every output plugin decodes into and every later layer consumes.

Each event carries ``lsn``, the WAL position it arrived at (the XLogData start position, or the
``lsn`` column of the SQL interface). Column values in a ``Row`` stay in the form the server sent
them: ``str`` for text format, ``bytes`` for binary format, ``None`` for SQL NULL and
``UNCHANGED_TOAST`` for a TOASTed value the server did not send because it did not change.
``pgcdc.decoding.values`` turns them into typed Python or Arrow values; keeping them raw here is
what lets the receiver log changes without paying for type conversion it does not need.

A ``Row`` is any sequence of raw values. The decoders' rows are always ``EncodedRow``s, which
keep the row in TupleData wire form and decode it only when a value is looked at (or the batch
holding it is checked): pgoutput's as the server sent them, the text plugins' (test_decoding,
mppdb_decoding) made from the values they parsed, which they keep. The receiver logs
``EncodedRow`` bytes as they came; the Spark executors decode them, in parallel. What a valid
TupleData is, and how it is read and written, is ``pgcdc.tupledata``'s (re-exported here).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from datetime import datetime
from typing import Any, ClassVar, TypeAlias, TypeVar, overload

from pgcdc._native import c_extension
from pgcdc.lsn import LSN

# Re-exported: rows and their values are part of the event model.
from pgcdc.tupledata import UNCHANGED_TOAST as UNCHANGED_TOAST  # noqa: PLC0414
from pgcdc.tupledata import RawValue as RawValue  # noqa: PLC0414
from pgcdc.tupledata import Unchanged as Unchanged  # noqa: PLC0414
from pgcdc.tupledata import decode_tuple_data as decode_tuple_data  # noqa: PLC0414
from pgcdc.tupledata import encode_tuple_data as _encode_values
from pgcdc.tupledata import read_tuple, trailing_bytes_error

_NCOLS = struct.Struct("!H")
_T = TypeVar("_T")


def _python_builder(cls: type[_T], names: tuple[str, ...]) -> Callable[..., _T]:
    """``builder``'s reference: ``object.__new__(cls)``, then each slot's setter."""
    setters = tuple(cls.__dict__[name].__set__ for name in names)
    new = object.__new__

    def build(*values: Any) -> _T:
        if len(values) != len(setters):
            raise TypeError(f"a {cls.__name__} takes {len(setters)} values, got {len(values)}")
        made = new(cls)
        for setter, value in zip(setters, values, strict=True):
            setter(made, value)
        return made

    return build


_slotted = c_extension("pgcdc._slotted")


def builder(cls: type[_T], names: Sequence[str] | None = None) -> Callable[..., _T]:
    """A function making an instance of the slotted class ``cls`` from one value per slot in
    ``names`` (default: its dataclass fields, in order), without ``cls.__init__``.

    The generated ``__init__`` of a frozen dataclass sets each field through
    ``object.__setattr__``, which costs more than reading the whole row; hot paths build
    events and transactions with a builder instead. Only for classes without
    ``__post_init__``, so the constructor does nothing else that would be skipped. In C
    (``_slotted.c``: one call, where setters take one each) wherever it is built;
    ``_python_builder`` is the reference (``tests/test_events.py`` holds them equal).
    """
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} validates in __post_init__: build it with its constructor")
    slots = tuple(names) if names is not None else tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    if _slotted is None:
        return _python_builder(cls, slots)
    return _slotted.Builder(cls, slots)  # type: ignore[no-any-return]


def encode_tuple_data(row: Sequence[RawValue]) -> bytes:
    """``row`` in TupleData wire form (``pgcdc.tupledata.encode_tuple_data``); an
    ``EncodedRow``'s bytes as they are."""
    if type(row) is EncodedRow:
        return row.data
    return _encode_values(row)


class EncodedRow(Sequence[RawValue]):
    """An immutable row kept as pgoutput TupleData bytes, decoded on first use (then cached).

    It behaves as the tuple of its raw values (length, indexing, iteration, equality with
    tuples and other rows, hash, repr) and pickles as its bytes. ``len`` reads the column count
    without decoding. Decoding checks the bytes: a malformed row raises ``DecodeError``. The
    pgoutput decoder checks only a row's column count, so that the receiver never walks rows
    it only logs; the change log writer checks every row of a batch at once before it keeps
    them, and any other consumer gets the error when it reads the row.
    """

    __slots__ = ("_data", "_values")

    _data: bytes
    _values: tuple[RawValue, ...] | None

    def __init__(self, data: bytes) -> None:
        object.__setattr__(self, "_data", bytes(data) if type(data) is not bytes else data)
        object.__setattr__(self, "_values", None)

    @classmethod
    def from_values(cls, row: Sequence[RawValue]) -> EncodedRow:
        """A tuple row (or any sequence of raw values) as an EncodedRow."""
        if type(row) is EncodedRow:
            return row
        encoded = cls(encode_tuple_data(row))
        if type(row) is tuple:
            object.__setattr__(encoded, "_values", row)
        return encoded

    @property
    def data(self) -> bytes:
        """The TupleData bytes: int16 column count, then each column."""
        return self._data

    @property
    def values(self) -> tuple[RawValue, ...]:
        values = self._values
        if values is None:
            # decode_tuple_data, one call shorter: the Spark executors' row path.
            data = self._data
            values, end = read_tuple(data, 0, "surrogatepass")
            if end != len(data):
                raise trailing_bytes_error(len(data) - end)
            object.__setattr__(self, "_values", values)
        return values

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"EncodedRow is immutable (cannot set {name})")

    def __len__(self) -> int:
        values = self._values
        if values is not None:
            return len(values)
        return int(_NCOLS.unpack_from(self._data, 0)[0])

    @overload
    def __getitem__(self, index: int) -> RawValue: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[RawValue, ...]: ...

    def __getitem__(self, index: int | slice) -> RawValue | tuple[RawValue, ...]:
        return self.values[index]

    def __iter__(self) -> Iterator[RawValue]:
        return iter(self.values)

    def __contains__(self, value: object) -> bool:
        return value in self.values

    def __eq__(self, other: object) -> bool:
        if type(other) is EncodedRow:
            # The encoding is canonical: equal bytes exactly when equal values.
            return self._data == other._data
        if isinstance(other, tuple):
            return self.values == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    def __hash__(self) -> int:
        return hash(self.values)

    def __repr__(self) -> str:
        return f"EncodedRow({self.values!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (EncodedRow, (self._data,))


Row: TypeAlias = Sequence[RawValue]
"""A tuple of raw values or an ``EncodedRow``."""

# The row of a change the server sent without one (a DELETE under REPLICA IDENTITY NOTHING).
EMPTY_ROW = EncodedRow.from_values(())
# ``new_encoded_row(data, None)``: an EncodedRow over TupleData bytes already framed by its
# maker, without ``__init__``'s check (its values decoded on first use).
new_encoded_row: Callable[[bytes, None], EncodedRow] = builder(EncodedRow, ("_data", "_values"))


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
    # From pg_attribute, added by the receiver (pgoutput sends neither): the text of the value
    # rows written before the column was added have (ADD COLUMN ... DEFAULT, kept in
    # attmissingval; the slot sees no change for them), and whether the column has a default
    # that is not such a value (a volatile default rewrote the table, or it has always had it).
    missing: str | None = None
    default_unseen: bool = False


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
    """A non-built-in type's name, sent before the first Relation that uses it.

    pgoutput sends only the name; the receiver and the snapshot add what pg_type says (kind,
    a domain's final base type and type modifier, an array's element type), so that readers of
    the change log type the values as the decoder did. ``kind`` "" means not looked up."""

    lsn: LSN
    oid: int
    namespace: str
    name: str
    xid: int | None = None
    kind: str = ""
    base_oid: int = 0
    element_oid: int = 0
    base_modifier: int = -1


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
class RowRun:
    """``first`` and the row changes that followed it in its transaction with the same message
    header (kind, table, tuple marker and width), each kept as its TupleData's wire bytes: new
    rows, or old rows for Deletes. The receiver hands them to a sink that logs rows as bytes
    (``accepts_row_runs``) this way, without an event object per change; ``changes()`` gives
    the events they stand for. Never inside a streamed transaction (``xid`` is None)."""

    first: Insert | Update | Delete
    lsns: list[LSN]
    rows: list[bytes]

    # Each later change's message is this header (type byte, relation OID, tuple marker), then
    # its row.
    HEADER_BYTES: ClassVar[int] = 6

    @property
    def lsn(self) -> LSN:
        return self.first.lsn

    @property
    def table(self) -> Table:
        return self.first.table

    @property
    def xid(self) -> int | None:
        return self.first.xid

    def __len__(self) -> int:
        return 1 + len(self.rows)

    def sizes(self, size: int) -> list[int]:
        """The payload length of each change, given the run's total ``size``."""
        header = self.HEADER_BYTES
        later = [header + len(row) for row in self.rows]
        first = size - sum(later)
        if first <= 0:  # not a payload total: share it out
            return [max(size // len(self), 1)] * len(self)
        return [first, *later]

    def changes(self) -> Iterator[Insert | Update | Delete]:
        first = self.first
        yield first
        for lsn, data in zip(self.lsns, self.rows, strict=True):
            if isinstance(first, Delete):
                yield replace(first, lsn=lsn, old=EncodedRow(data))
            else:
                yield replace(first, lsn=lsn, new=EncodedRow(data))


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
    | RowRun
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
