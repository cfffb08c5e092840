"""The pgoutput plugin's binary protocol, versions 1-4: payload bytes in, ``pgcdc.events`` out.

Layouts follow PostgreSQL's ``src/backend/replication/logical/proto.c`` (the documentation's
"Logical Replication Message Formats"). pgoutput sends one message per XLogData payload (and per
row of ``pg_logical_slot_*_binary_changes``). Pure and sans-IO: the only memory between messages
is the ``DecoderState`` (relations, types, open stream block).

This is the receiver's hot path, so the decoder dispatches on the first byte through a table,
reads fixed fields with precompiled ``struct.Struct`` objects, lets truncation surface as the
``struct.error``/``IndexError`` it raises anyway (turned into ``DecodeError`` once, outside the
loop: try blocks cost nothing in Python 3.11 until they fire) and hands out cached ``Table``
objects instead of building one per change.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal, NoReturn

from mypy_extensions import mypyc_attr

from pgcdc.decoding.pgtypes import BY_NAME, TypeInfo
from pgcdc.decoding.state import DecoderState
from pgcdc.errors import ConfigurationError, DecodeError, UnknownRelation, UnsupportedFeature
from pgcdc.events import (
    Begin,
    BeginPrepare,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Insert,
    Message,
    Origin,
    Prepare,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    Row,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Table,
    Truncate,
    Type,
    Update,
    builder,
    new_encoded_row,
)
from pgcdc.lsn import LSN
from pgcdc.pgtime import from_micros
from pgcdc.tupledata import read_tuple_reference, trailing_bytes_error, tuple_end

__all__ = ["MAX_PROTO_VERSION", "PgOutputDecoder", "PgOutputOptions", "max_proto_version"]

MAX_PROTO_VERSION: Final = 4
"""The newest pgoutput protocol this decoder reads."""

Streaming = Literal["off", "on", "parallel"]

_PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)

# Rare messages' fields are read with struct; the hot ones (Begin, Commit, Insert, Update,
# Delete, a row's column count) with the functions below: compiled, they read bytes with no
# object made, where ``unpack_from`` makes a tuple and calls (a tenth of the time).
_U32: Final = struct.Struct("!I").unpack_from
_I32: Final = struct.Struct("!i").unpack_from
_U16: Final = struct.Struct("!H").unpack_from
_LSN: Final = struct.Struct("!Q").unpack_from
_STREAM_START: Final = struct.Struct("!IB").unpack_from  # xid, first_segment
_STREAM_COMMIT: Final = struct.Struct("!IBQQq").unpack_from  # xid, flags, commit/end lsn, time
_STREAM_ABORT: Final = struct.Struct("!II").unpack_from  # xid, subxid
_STREAM_ABORT_INFO: Final = struct.Struct("!IIQq").unpack_from  # + abort lsn and time (v4 parallel)
_BEGIN_PREPARE: Final = struct.Struct("!QQqI").unpack_from  # prepare_lsn, end_lsn, time, xid
_PREPARE: Final = struct.Struct("!BQQqI").unpack_from  # flags, lsn, end_lsn, time, xid
_ROLLBACK_PREPARED: Final = struct.Struct("!BQQqqI").unpack_from  # flags, 2 lsns, 2 times, xid
_MESSAGE: Final = struct.Struct("!BQ").unpack_from  # flags, lsn
_ATTR: Final = struct.Struct("!Ii").unpack_from  # type oid, type modifier

_NEW: Final = ord("N")
_KEY: Final = ord("K")
_OLD: Final = ord("O")

# First protocol version that has each message type.
_SINCE: Final = {
    **dict.fromkeys(b"BCORYIUDTM", 1),
    **dict.fromkeys(b"SEcA", 2),
    **dict.fromkeys(b"bPKrp", 3),
}
_NAMES: Final = {
    ord("B"): "Begin",
    ord("C"): "Commit",
    ord("O"): "Origin",
    ord("R"): "Relation",
    ord("Y"): "Type",
    ord("I"): "Insert",
    ord("U"): "Update",
    ord("D"): "Delete",
    ord("T"): "Truncate",
    ord("M"): "Message",
    ord("S"): "Stream Start",
    ord("E"): "Stream Stop",
    ord("c"): "Stream Commit",
    ord("A"): "Stream Abort",
    ord("b"): "Begin Prepare",
    ord("P"): "Prepare",
    ord("K"): "Commit Prepared",
    ord("r"): "Rollback Prepared",
    ord("p"): "Stream Prepare",
}
_REPLICA_IDENTITY: Final = {ord(r.value): r for r in ReplicaIdentity}


# The events and rows of the hot messages, made without their __init__ (see events.builder):
# each takes its fields' values in field order.
_new_insert: Final = builder(Insert)
_new_update: Final = builder(Update)
_new_delete: Final = builder(Delete)
_new_begin: Final = builder(Begin)
_new_commit: Final = builder(Commit)
_new_row: Final = new_encoded_row


# PostgreSQL TimestampTz (microseconds since 2000-01-01 UTC) as an aware datetime: every
# transaction has one (its Begin's, which its Commit repeats).
_time: Final = from_micros


# LSNs read with an unsigned 64-bit ``struct`` format are always in range: ``_int_new(LSN, v)``
# builds them without LSN.__new__'s check (two per transaction boundary).
_int_new: Final = int.__new__


def _cstring(buf: bytes, pos: int) -> tuple[str, int]:
    end = buf.find(0, pos)
    if end < 0:
        raise DecodeError("a string field has no terminating NUL byte")
    return buf[pos:end].decode(), end + 1


def _u16(buf: bytes, pos: int) -> int:
    """The big-endian unsigned 16 bits at ``pos`` (IndexError past the end, as truncated)."""
    return (buf[pos] << 8) | buf[pos + 1]


def _u32(buf: bytes, pos: int) -> int:
    """The big-endian unsigned 32 bits at ``pos``."""
    return (buf[pos] << 24) | (buf[pos + 1] << 16) | (buf[pos + 2] << 8) | buf[pos + 3]


def _u64(buf: bytes, pos: int) -> int:
    """The big-endian unsigned 64 bits at ``pos``."""
    return (_u32(buf, pos) << 32) | _u32(buf, pos + 4)


def _i64(buf: bytes, pos: int) -> int:
    """The big-endian signed 64 bits at ``pos``."""
    value = _u64(buf, pos)
    return value - (1 << 64) if value >= 1 << 63 else value


def _check_width(buf: bytes, pos: int, table: Table) -> None:
    """The TupleData at ``pos`` has as many columns as ``table``."""
    try:
        width = _u16(buf, pos)
    except IndexError:
        read_tuple_reference(buf, pos)  # raises: no column count
        raise
    if width != len(table.columns):
        raise _width_error(width, table)


def _width_error(width: int, table: Table) -> DecodeError:
    return DecodeError(
        f"the row has {width} columns but the Relation message for "
        f"{table.qualified_name} (OID {table.oid}) has {len(table.columns)}"
    )


class PgOutputDecoder:
    """Decodes pgoutput messages of protocol ``proto_version`` (1-4): the version the stream
    was started with, since streaming and two-phase messages only exist from 2 and 3 on.

    ``state`` carries relation and type definitions from earlier messages; pass a saved one to
    continue decoding mid-stream. The decoder never rewrites values: rows hold ``str`` (text
    columns), ``bytes`` (binary), ``None`` (NULL) or ``UNCHANGED_TOAST``.

    Rows are ``EncodedRow``s: the TupleData bytes as they came. The decoder walks a row only
    where it must find where the row ends (an Update's old row, before its new one) and checks
    every row's column count against the relation; the rest is checked by whoever consumes
    the rows, once for a whole batch (the change log writer, ``decode_batch``,
    ``rows_to_arrow``), or on first use (``EncodedRow.values`` raises ``DecodeError``). That
    is what keeps the receiver's path to the change log free of a per-row walk in Python.
    Text is read as ``EncodedRow`` reads it (UTF-8, lone surrogates allowed), so a row may
    hold encoded surrogates, which a UTF8 server never sends.
    """

    __slots__ = (
        "_begin_time",
        "_dispatch",
        "_relations",
        "_state",
        "proto_version",
        "streaming",
    )

    def __init__(
        self,
        state: DecoderState | None = None,
        *,
        proto_version: int = 1,
        streaming: Streaming | None = None,
    ) -> None:
        """``streaming`` is the option the stream was started with; it only matters for Stream
        Abort, which carries the abort LSN and time exactly when it is 'parallel'. None accepts
        both layouts (told apart by length)."""
        if not 1 <= proto_version <= MAX_PROTO_VERSION:
            raise UnsupportedFeature(
                f"pgoutput proto_version {proto_version} is not supported: this decoder reads "
                f"versions 1 to {MAX_PROTO_VERSION}"
            )
        if streaming not in (None, "off", "on", "parallel"):
            raise ConfigurationError(
                f"streaming={streaming!r} is not valid: use 'off', 'on', 'parallel' or None"
            )
        self.proto_version = proto_version
        self.streaming = streaming
        self._state = state if state is not None else DecoderState()
        self._relations = self._state.relations
        # The last Begin's commit time, raw and as a datetime: its Commit carries the same
        # timestamp, which is then not converted twice (datetimes are immutable).
        self._begin_time: tuple[int | None, datetime] = (None, _PG_EPOCH)
        handlers: dict[int, Callable[[bytes, LSN], Event]] = {
            ord("B"): self._begin,
            ord("C"): self._commit,
            ord("O"): self._origin,
            ord("R"): self._relation,
            ord("Y"): self._type,
            ord("I"): self._insert,
            ord("U"): self._update,
            ord("D"): self._delete,
            ord("T"): self._truncate,
            ord("M"): self._message,
            ord("S"): self._stream_start,
            ord("E"): self._stream_stop,
            ord("c"): self._stream_commit,
            ord("A"): self._stream_abort,
            ord("b"): self._begin_prepare,
            ord("P"): self._prepare,
            ord("K"): self._commit_prepared,
            ord("r"): self._rollback_prepared,
            ord("p"): self._stream_prepare,
        }
        self._dispatch = {k: h for k, h in handlers.items() if _SINCE[k] <= proto_version}

    @classmethod
    def for_options(
        cls,
        options: PgOutputOptions,
        state: DecoderState | None = None,
    ) -> PgOutputDecoder:
        """The decoder for a stream started with ``options``."""
        return cls(state, proto_version=options.proto_version, streaming=options.streaming)

    @property
    def state(self) -> DecoderState:
        return self._state

    @state.setter
    def state(self, state: DecoderState) -> None:
        self._state = state
        self._relations = state.relations

    def __reduce__(self) -> tuple[Any, ...]:
        return (_restore, (self._state, self.proto_version, self.streaming))

    def decode(self, payload: bytes | memoryview, lsn: LSN) -> list[Event]:
        """The event in one pgoutput payload (always exactly one)."""
        return [self.decode_one(payload, lsn)]

    def decode_one(self, payload: bytes | memoryview, lsn: LSN) -> Event:
        """The event in one payload: ``bytes``, or the ``memoryview`` the replication stream
        hands out (copied once, since values must outlive its buffer)."""
        if type(payload) is not bytes:
            payload = bytes(payload)
        try:
            return self._dispatch[payload[0]](payload, lsn)
        except Exception as exc:
            self.reraise(exc, payload, lsn)

    @property
    def handlers(self) -> Mapping[int, Callable[[bytes, LSN], Event]]:
        """``decode_one``'s handler of each message type (the payload's first byte), for a
        caller that inlines ``decode_one`` for ``bytes``: an exception from the lookup or the
        handler then goes to ``reraise``."""
        return self._dispatch

    def reraise(self, exc: Exception, payload: bytes, lsn: LSN) -> NoReturn:
        """Raise what ``decode_one`` raises when looking up ``payload``'s handler, or running
        it, raised ``exc`` (call it while handling ``exc``)."""
        error = self._error_for(exc, payload, lsn)
        if error is exc:
            raise exc
        raise error from None

    def _error_for(self, exc: Exception, payload: bytes, lsn: LSN) -> Exception:
        """A ``DecodeError`` that says where and why, or ``exc`` itself (an
        ``UnknownRelation``, or an error that is not about the payload)."""
        if not payload:
            return DecodeError(f"empty pgoutput message at LSN {lsn}")
        if payload[0] not in self._dispatch:
            return self._unknown_type(payload, lsn)
        if isinstance(exc, struct.error | IndexError):
            return self._malformed(payload, lsn, f"truncated ({exc})")
        if isinstance(exc, UnicodeDecodeError | OverflowError):
            return self._malformed(payload, lsn, str(exc))
        if isinstance(exc, DecodeError) and not isinstance(exc, UnknownRelation):
            return self._malformed(payload, lsn, str(exc))
        return exc

    # --- errors ------------------------------------------------------------------------------

    def _unknown_type(self, payload: bytes | memoryview, lsn: LSN) -> DecodeError:
        code = payload[0]
        since = _SINCE.get(code)
        if since is not None:
            return DecodeError(
                f"pgoutput {_NAMES[code]} message at LSN {lsn} needs protocol {since}, but the "
                f"decoder was made for proto_version {self.proto_version}: create the decoder "
                "with the proto_version the stream was started with"
            )
        return DecodeError(
            f"unknown pgoutput message type {chr(code)!r} (0x{code:02x}) at LSN {lsn}: the "
            f"stream is not pgoutput protocol 1-{MAX_PROTO_VERSION}, or it is corrupt"
        )

    def _malformed(self, payload: bytes | memoryview, lsn: LSN, why: str) -> DecodeError:
        name = _NAMES.get(payload[0], "?")
        head = payload[:32].hex()
        return DecodeError(
            f"malformed pgoutput {name} message at LSN {lsn} ({len(payload)} bytes, starting "
            f"{head}{'...' if len(payload) > 32 else ''}): {why}"
        )

    @staticmethod
    def _check_end(buf: bytes, pos: int) -> None:
        if pos != len(buf):
            raise trailing_bytes_error(len(buf) - pos)

    def _stream_xid(self, buf: bytes) -> tuple[int | None, int]:
        """The xid pgoutput puts after the type byte inside a stream block, and where the
        message body starts."""
        if self._state.stream_xid is None:
            return None, 1
        return _u32(buf, 1), 5

    def _table(self, oid: int, lsn: LSN, what: str) -> Table:
        table = self._relations.get(oid)
        if table is None:
            raise UnknownRelation(
                f"{what} at LSN {lsn} refers to relation OID {oid}, but no Relation message "
                "for it has been decoded: decoding started mid-stream. Read the stream from the "
                "slot's start (a fresh decoder from the slot's confirmed position), or restore "
                "the DecoderState saved with the position you resumed from",
                relation_oid=oid,
            )
        return table

    @staticmethod
    def _row(buf: bytes, pos: int, table: Table) -> tuple[Row, int]:
        """The TupleData at ``pos``, followed by more of the message, as a row of ``table``,
        and the position after it: its framing walked (``tuple_end``), its text left to the
        rows' consumer."""
        _check_width(buf, pos, table)
        end = tuple_end(buf, pos)
        return _new_row(buf[pos:end], None), end

    @staticmethod
    def _last_row(buf: bytes, pos: int, table: Table) -> Row:
        """The TupleData at ``pos``, which ends the message, as a row of ``table``: its bytes
        to the end, not walked (bytes after the row read as trailing bytes of it), its column
        count checked."""
        _check_width(buf, pos, table)
        return _new_row(buf[pos:], None)

    # --- transaction boundaries --------------------------------------------------------------

    def begin_fields(self, buf: bytes) -> tuple[int, datetime, int]:
        """The final LSN (as an int: the receiver's loop does not keep it), commit time and
        xid of the Begin message ``buf``: what its event holds, for a caller that hands them
        on without the event (the receiver's loop; see ``TransactionAssembler.begin_plain``).
        Raises as ``decode_one`` does (see ``reraise``)."""
        if self._state.stream_xid is not None:
            raise DecodeError("Begin inside a stream block (no Stream Stop before it)")
        final_lsn, commit_time, xid = _u64(buf, 1), _i64(buf, 9), _u32(buf, 17)
        if len(buf) != 21:
            self._check_end(buf, 21)
        converted = _time(commit_time)
        self._begin_time = (commit_time, converted)
        return final_lsn, converted, xid

    def commit_fields(self, buf: bytes) -> tuple[int, LSN, LSN, datetime]:
        """The flags, commit LSN, end LSN and commit time of the Commit message ``buf``: what
        its event holds besides its own LSN, for a caller that hands them on without the event
        (see ``TransactionAssembler.commit_held``). Raises as ``decode_one`` does."""
        flags, commit_lsn, end_lsn = buf[1], _u64(buf, 2), _u64(buf, 10)
        commit_time = _i64(buf, 18)
        if len(buf) != 26:
            self._check_end(buf, 26)
        begin_raw, begin_time = self._begin_time
        return (
            flags,
            _int_new(LSN, commit_lsn),
            _int_new(LSN, end_lsn),
            begin_time if commit_time == begin_raw else _time(commit_time),
        )

    def _begin(self, buf: bytes, lsn: LSN) -> Event:
        final_lsn, commit_time, xid = self.begin_fields(buf)
        # Begin(lsn, xid, final_lsn, commit_time): csn, first_lsn and user None.
        return _new_begin(lsn, xid, _int_new(LSN, final_lsn), commit_time, None, None, None)

    def _commit(self, buf: bytes, lsn: LSN) -> Event:
        flags, commit_lsn, end_lsn, commit_time = self.commit_fields(buf)
        # Commit(lsn, commit_lsn, end_lsn, commit_time, flags=flags).
        return _new_commit(lsn, commit_lsn, end_lsn, commit_time, None, flags)

    def _origin(self, buf: bytes, lsn: LSN) -> Event:
        (origin_lsn,) = _LSN(buf, 1)
        name, pos = _cstring(buf, 9)
        self._check_end(buf, pos)
        return Origin(lsn, name, LSN(origin_lsn))

    # --- catalogue ---------------------------------------------------------------------------

    def _relation(self, buf: bytes, lsn: LSN) -> Event:
        xid, pos = self._stream_xid(buf)
        (oid,) = _U32(buf, pos)
        namespace, pos = _cstring(buf, pos + 4)
        name, pos = _cstring(buf, pos)
        identity = _REPLICA_IDENTITY.get(buf[pos])
        if identity is None:
            raise DecodeError(f"unknown replica identity {chr(buf[pos])!r}")
        (natts,) = _U16(buf, pos + 1)
        pos += 3
        columns = []
        for _ in range(natts):
            flags = buf[pos]
            column_name, pos = _cstring(buf, pos + 1)
            type_oid, type_modifier = _ATTR(buf, pos)
            pos += 8
            columns.append(Column(column_name, type_oid, type_modifier, bool(flags & 1)))
        self._check_end(buf, pos)
        table = Table(namespace or "pg_catalog", name, tuple(columns), oid, identity)
        cached = self._relations.get(oid)
        if cached != table:  # keep the cached object when pgoutput re-sends the same definition
            self._relations[oid] = table
        else:
            table = cached
        return Relation(lsn, table, xid)

    def annotate_relation(self, table: Table) -> None:
        """Use ``table`` (the last Relation's table with catalog facts added, same OID and
        columns) for the changes that follow, so they carry those facts too."""
        self._relations[table.oid] = table

    def _type(self, buf: bytes, lsn: LSN) -> Event:
        xid, pos = self._stream_xid(buf)
        (oid,) = _U32(buf, pos)
        namespace, pos = _cstring(buf, pos + 4)
        name, pos = _cstring(buf, pos)
        self._check_end(buf, pos)
        namespace = namespace or "pg_catalog"
        # pgoutput names a domain by its base type; a built-in name on a non-built-in OID
        # can only be a domain over that built-in type.
        builtin = BY_NAME.get(name) if namespace == "pg_catalog" else None
        if builtin is not None and builtin.oid != oid:
            info = TypeInfo(oid, namespace, name, kind="d", base_oid=builtin.oid)
        else:
            info = TypeInfo(oid, namespace, name)
        self._state.add_type(info)
        return Type(lsn, oid, namespace, name, xid)

    # --- changes -----------------------------------------------------------------------------

    def _insert(self, buf: bytes, lsn: LSN) -> Event:
        # The most frequent message: _stream_xid and _last_row are inlined here.
        xid = self._state.stream_xid
        if xid is None:
            pos = 1
        else:
            xid = _u32(buf, 1)
            pos = 5
        oid = _u32(buf, pos)
        table = self._relations.get(oid) or self._table(oid, lsn, "Insert")
        if buf[pos + 4] != _NEW:
            raise DecodeError(f"expected 'N' (new tuple), got {chr(buf[pos + 4])!r}")
        pos += 5
        _check_width(buf, pos, table)
        return _new_insert(lsn, table, _new_row(buf[pos:], None), xid)

    def _update(self, buf: bytes, lsn: LSN) -> Event:
        # Frequent in OLTP: _stream_xid, and _last_row for the new row alone, are inlined here.
        xid = self._state.stream_xid
        if xid is None:
            pos = 1
        else:
            xid = _u32(buf, 1)
            pos = 5
        oid = _u32(buf, pos)
        table = self._relations.get(oid) or self._table(oid, lsn, "Update")
        kind = buf[pos + 4]
        pos += 5
        old: Row | None = None
        new: Row
        if kind == _NEW:
            _check_width(buf, pos, table)
            new = _new_row(buf[pos:], None)
        elif kind in (_KEY, _OLD):
            old, pos = self._row(buf, pos, table)
            new_marker = buf[pos]
            pos += 1
            if new_marker != _NEW:
                raise DecodeError(f"expected 'N' (new tuple), got {chr(new_marker)!r}")
            new = self._last_row(buf, pos, table)
        else:
            raise DecodeError(f"expected 'K', 'O' or 'N', got {chr(kind)!r}")
        return _new_update(lsn, table, new, old, kind == _KEY, xid)

    def _delete(self, buf: bytes, lsn: LSN) -> Event:
        xid, pos = self._stream_xid(buf)
        oid = _u32(buf, pos)
        table = self._relations.get(oid) or self._table(oid, lsn, "Delete")
        kind = buf[pos + 4]
        if kind not in (_KEY, _OLD):
            raise DecodeError(f"expected 'K' (old key) or 'O' (old row), got {chr(kind)!r}")
        old = self._last_row(buf, pos + 5, table)
        return _new_delete(lsn, table, old, kind == _KEY, xid)

    def _truncate(self, buf: bytes, lsn: LSN) -> Event:
        xid, pos = self._stream_xid(buf)
        (count,) = _I32(buf, pos)
        flags = buf[pos + 4]
        pos += 5
        if count < 0 or len(buf) - pos != 4 * count:
            raise DecodeError(
                f"{count} relation OIDs announced but {len(buf) - pos} bytes follow them"
            )
        oids = struct.unpack_from(f"!{count}I", buf, pos)
        tables = tuple(self._table(oid, lsn, "Truncate") for oid in oids)
        return Truncate(lsn, tables, bool(flags & 1), bool(flags & 2), xid)

    def _message(self, buf: bytes, lsn: LSN) -> Event:
        xid, pos = self._stream_xid(buf)
        flags, _message_lsn = _MESSAGE(buf, pos)
        prefix, pos = _cstring(buf, pos + 9)
        (length,) = _I32(buf, pos)
        pos += 4
        if length < 0 or pos + length != len(buf):
            raise DecodeError(
                f"message content of {length} bytes announced, {len(buf) - pos} bytes follow"
            )
        return Message(lsn, bool(flags & 1), prefix, buf[pos:], xid)

    # --- streamed transactions (protocol 2+) -------------------------------------------------

    def _stream_start(self, buf: bytes, lsn: LSN) -> Event:
        xid, first_segment = _STREAM_START(buf, 1)
        self._check_end(buf, 6)
        if self._state.stream_xid is not None:
            raise DecodeError(
                f"Stream Start for xid {xid} inside the stream block of xid "
                f"{self._state.stream_xid} (no Stream Stop between them)"
            )
        self._state.stream_xid = xid
        return StreamStart(lsn, xid, first_segment == 1)

    def _stream_stop(self, buf: bytes, lsn: LSN) -> Event:
        self._check_end(buf, 1)
        if self._state.stream_xid is None:
            raise DecodeError("Stream Stop outside a stream block (no Stream Start before it)")
        self._state.stream_xid = None
        return StreamStop(lsn)

    def _stream_commit(self, buf: bytes, lsn: LSN) -> Event:
        xid, flags, commit_lsn, end_lsn, commit_time = _STREAM_COMMIT(buf, 1)
        self._check_end(buf, 30)
        return StreamCommit(
            lsn, xid, LSN(commit_lsn), LSN(end_lsn), _time(commit_time), flags=flags
        )

    def _stream_abort(self, buf: bytes, lsn: LSN) -> Event:
        # Protocol 4 with streaming=parallel appends the abort LSN and time.
        parallel = self.streaming == "parallel"
        if len(buf) == 25 and self.proto_version >= 4 and (parallel or self.streaming is None):
            xid, subxid, abort_lsn, abort_time = _STREAM_ABORT_INFO(buf, 1)
            return StreamAbort(lsn, xid, subxid, LSN(abort_lsn), _time(abort_time))
        if parallel:
            raise DecodeError(
                f"{len(buf)} bytes, but with streaming='parallel' a Stream Abort has 25"
            )
        xid, subxid = _STREAM_ABORT(buf, 1)
        self._check_end(buf, 9)
        return StreamAbort(lsn, xid, subxid)

    # --- two-phase commit (protocol 3+) ------------------------------------------------------

    def _begin_prepare(self, buf: bytes, lsn: LSN) -> Event:
        prepare_lsn, end_lsn, prepare_time, xid = _BEGIN_PREPARE(buf, 1)
        gid, pos = _cstring(buf, 29)
        self._check_end(buf, pos)
        return BeginPrepare(lsn, xid, gid, LSN(prepare_lsn), LSN(end_lsn), _time(prepare_time))

    def _prepare(self, buf: bytes, lsn: LSN) -> Event:
        return self._gid_message(Prepare, buf, lsn)

    def _stream_prepare(self, buf: bytes, lsn: LSN) -> Event:
        return self._gid_message(StreamPrepare, buf, lsn)

    def _commit_prepared(self, buf: bytes, lsn: LSN) -> Event:
        return self._gid_message(CommitPrepared, buf, lsn)

    def _gid_message(
        self, kind: type[Prepare | StreamPrepare | CommitPrepared], buf: bytes, lsn: LSN
    ) -> Event:
        """Prepare, Stream Prepare and Commit Prepared share one layout: flags, two LSNs,
        a time, the xid and the gid."""
        flags, first_lsn, end_lsn, moment, xid = _PREPARE(buf, 1)
        gid, pos = _cstring(buf, 30)
        self._check_end(buf, pos)
        return kind(lsn, xid, gid, LSN(first_lsn), LSN(end_lsn), _time(moment), flags=flags)

    def _rollback_prepared(self, buf: bytes, lsn: LSN) -> Event:
        flags, prepare_end, rollback_end, prepare_time, rollback_time, xid = _ROLLBACK_PREPARED(
            buf, 1
        )
        gid, pos = _cstring(buf, 38)
        self._check_end(buf, pos)
        return RollbackPrepared(
            lsn,
            xid,
            gid,
            LSN(prepare_end),
            LSN(rollback_end),
            _time(prepare_time),
            _time(rollback_time),
            flags=flags,
        )


def _restore(
    state: DecoderState, proto_version: int, streaming: Streaming | None, *_row_mode: object
) -> PgOutputDecoder:
    """Unpickle a decoder (one pickled before rows had one form also carries its row mode,
    which is ignored now)."""
    return PgOutputDecoder(state, proto_version=proto_version, streaming=streaming)


# --- options -----------------------------------------------------------------------------------

OriginFilter = Literal["any", "none"]

_PLAIN_IDENTIFIER: Final = re.compile(r"[a-z_][a-z0-9_$]*")
_NAMEDATALEN: Final = 64


def max_proto_version(server_version_num: int) -> int:
    """The newest pgoutput protocol a server speaks (LOGICALREP_PROTO_MAX_VERSION_NUM)."""
    if server_version_num < 140000:
        return 1
    if server_version_num < 150000:
        return 2
    if server_version_num < 160000:
        return 3
    return 4


def _quote_publication(name: str) -> str:
    """One element of publication_names as the server's SplitIdentifierString reads it:
    unquoted names are folded to lower case, so anything but a plain lower-case identifier
    is double-quoted (with inner quotes doubled)."""
    if _PLAIN_IDENTIFIER.fullmatch(name):
        return name
    return '"' + name.replace('"', '""') + '"'


def _version_text(server_version_num: int) -> str:
    major = server_version_num // 10000
    return str(major) if major >= 10 else f"{major}.{server_version_num // 100 % 100}"


# A plain class in the compiled build: __post_init__ checks and normalises what a caller passes
# (a list of publication names), which a native class would refuse before it.
@mypyc_attr(native_class=False)
@dataclass(frozen=True)
class PgOutputOptions:
    """pgoutput's options for START_REPLICATION or ``pg_logical_slot_*_binary_changes``.

    Construction checks the options against each other; ``for_server`` checks them against a
    server version, so a mismatch is a clear error here rather than a failed stream later.
    """

    publication_names: Sequence[str]
    proto_version: int = 1
    binary: bool = False
    messages: bool = False
    streaming: Streaming = "off"
    two_phase: bool = False
    origin: OriginFilter | None = None

    def __post_init__(self) -> None:
        if isinstance(self.publication_names, str):
            raise ConfigurationError(
                "publication_names must be a sequence of names, not one string: "
                f"write [{self.publication_names!r}]"
            )
        names = tuple(self.publication_names)
        object.__setattr__(self, "publication_names", names)
        if not names:
            raise ConfigurationError(
                "pgoutput needs at least one publication: create one with CREATE PUBLICATION "
                "<name> FOR ALL TABLES (or FOR TABLE ...) and pass its name"
            )
        for name in names:
            if not isinstance(name, str) or not name:
                raise ConfigurationError(f"publication name {name!r} is not a non-empty string")
            if len(name.encode()) >= _NAMEDATALEN:
                raise ConfigurationError(
                    f"publication name {name!r} is longer than {_NAMEDATALEN - 1} bytes; the "
                    "server truncates such names: pass the name as stored in pg_publication"
                )
            if "\0" in name:
                raise ConfigurationError(f"publication name {name!r} contains a NUL character")
        if not 1 <= self.proto_version <= MAX_PROTO_VERSION:
            raise UnsupportedFeature(
                f"proto_version {self.proto_version} is not supported: use 1 to {MAX_PROTO_VERSION}"
            )
        if self.streaming not in ("off", "on", "parallel"):
            raise ConfigurationError(
                f"streaming={self.streaming!r} is not valid: use 'off', 'on' or 'parallel'"
            )
        if self.origin not in (None, "any", "none"):
            raise ConfigurationError(
                f"origin={self.origin!r} is not valid: use 'any', 'none' or None (not sent)"
            )
        if self.streaming == "on" and self.proto_version < 2:
            raise UnsupportedFeature(
                f"streaming='on' needs proto_version 2 or higher, not {self.proto_version}: "
                "pass proto_version=2 (PostgreSQL 14+)"
            )
        if self.streaming == "parallel" and self.proto_version < 4:
            raise UnsupportedFeature(
                f"streaming='parallel' needs proto_version 4, not {self.proto_version}: pass "
                "proto_version=4 (PostgreSQL 16+), or use streaming='on'"
            )
        if self.two_phase and self.proto_version < 3:
            raise UnsupportedFeature(
                f"two_phase needs proto_version 3 or higher, not {self.proto_version}: pass "
                "proto_version=3 (PostgreSQL 15+)"
            )

    @property
    def publication_names_option(self) -> str:
        """The publication_names value: comma-separated, quoted where the server needs it."""
        return ",".join(_quote_publication(name) for name in self.publication_names)

    def for_server(self, server_version_num: int) -> dict[str, str]:
        """The option name/value pairs to send to a server of ``server_version_num``
        (e.g. 150004). Options left at their defaults are not sent, so older servers that do
        not know them still accept the rest."""
        version = _version_text(server_version_num)
        if server_version_num < 100000:
            raise UnsupportedFeature(
                f"PostgreSQL {version} has no pgoutput: logical replication needs "
                "PostgreSQL 10 or newer"
            )
        newest = max_proto_version(server_version_num)
        if self.proto_version > newest:
            raise UnsupportedFeature(
                f"proto_version {self.proto_version} needs a newer server: PostgreSQL "
                f"{version} speaks pgoutput protocol {newest} at most; pass "
                f"proto_version={newest} or upgrade the server"
            )
        required = [
            (self.binary, 140000, "binary=True"),
            (self.messages, 140000, "messages=True"),
            (self.streaming == "on", 140000, "streaming='on'"),
            (self.two_phase, 150000, "two_phase=True"),
            (self.streaming == "parallel", 160000, "streaming='parallel'"),
            (self.origin is not None, 160000, f"origin={self.origin!r}"),
        ]
        for wanted, needs, what in required:
            if wanted and server_version_num < needs:
                raise UnsupportedFeature(
                    f"{what} needs PostgreSQL {needs // 10000} or newer; the server is "
                    f"PostgreSQL {version}: drop the option or upgrade the server"
                )
        options = {
            "proto_version": str(self.proto_version),
            "publication_names": self.publication_names_option,
        }
        if self.binary:
            options["binary"] = "true"
        if self.messages:
            options["messages"] = "true"
        if self.streaming != "off":
            options["streaming"] = self.streaming
        if self.two_phase:
            options["two_phase"] = "true"
        if self.origin is not None:
            options["origin"] = self.origin
        return options
