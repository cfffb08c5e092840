"""Committed transactions <-> Arrow record batches, with one fixed schema for every event kind.

One schema keeps the log readable by Spark without knowing the tables in advance: rows stay raw,
in pgoutput's TupleData wire form (``int16 ncols``, then per column ``n`` | ``u`` | ``t`` or
``b`` + int32 length + bytes) in ``binary`` columns, exactly as the receiver got them, and each
change row carries its table definition as dictionary-encoded JSON, so a batch can be
interpreted alone. Reading gives ``EncodedRow``s, decoded where they are used (the Spark
executors). Format 2; format 1 (``list<struct<kind, value>>`` rows) is not read.
Pure functions: no IO here.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from operator import attrgetter
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc.decoding import state as decoder_state
from pgcdc.decoding.columnar import first_unreadable_row
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.decoding.state import table_to_dict, type_to_dict
from pgcdc.errors import CorruptChangeLog, DecodeError, InvalidRowValue, UnloggableInput
from pgcdc.events import (
    Delete,
    EncodedRow,
    Event,
    Insert,
    Message,
    Relation,
    Row,
    RowRun,
    Table,
    Truncate,
    Type,
    Unchanged,
    Update,
    encode_tuple_data,
    new_encoded_row,
)
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction, TransactionOutcome
from pgcdc.tupledata import KIND_BINARY, KIND_NULL, KIND_TEXT, KIND_UNCHANGED

FORMAT_VERSION: Final = 2

# Value kinds inside a row: pgoutput's TupleData (``pgcdc.tupledata``).
VALUE_NULL: Final = KIND_NULL
VALUE_UNCHANGED_TOAST: Final = KIND_UNCHANGED
VALUE_TEXT: Final = KIND_TEXT
VALUE_BINARY: Final = KIND_BINARY

# "transaction": the one row of a transaction without events (an empty commit, or the
# COMMIT PREPARED / ROLLBACK PREPARED that settles a transaction emitted at PREPARE).
KINDS: Final[tuple[str, ...]] = (
    "insert",
    "update",
    "delete",
    "truncate",
    "message",
    "relation",
    "type",
    "transaction",
)
_KIND_INDEX: Final = {kind: index for index, kind in enumerate(KINDS)}
_KIND_DICTIONARY: Final = pa.array(KINDS, pa.string())

ROW_TYPE: Final = pa.binary()
KIND_TYPE: Final = pa.dictionary(pa.int8(), pa.string())
TABLE_TYPE: Final = pa.dictionary(pa.int32(), pa.string())
OUTCOME_TYPE: Final = pa.dictionary(pa.int8(), pa.string())
_OUTCOMES: Final = tuple(TransactionOutcome)
_OUTCOME_INDEX: Final = {outcome: index for index, outcome in enumerate(_OUTCOMES)}
_OUTCOME_DICTIONARY: Final = pa.array([o.value for o in _OUTCOMES], pa.string())
_OUTCOME_BY_VALUE: Final = {o.value: o for o in _OUTCOMES}
_COMMIT: Final = TransactionOutcome.COMMIT
_COMMIT_INDEX: Final = _OUTCOME_INDEX[_COMMIT]

SCHEMA: Final = pa.schema(
    [
        # The transaction, repeated on each of its rows.
        pa.field("commit_lsn", pa.uint64(), nullable=False),
        pa.field("end_lsn", pa.uint64(), nullable=False),
        pa.field("xid", pa.uint64()),
        pa.field("commit_time", pa.timestamp("us", tz="UTC")),
        pa.field("origin", pa.string()),
        pa.field("origin_lsn", pa.uint64()),
        pa.field("gid", pa.string()),
        pa.field("outcome", OUTCOME_TYPE, nullable=False),
        pa.field("size", pa.uint64(), nullable=False),
        # The event.
        pa.field("seq", pa.uint32(), nullable=False),
        pa.field("lsn", pa.uint64(), nullable=False),
        pa.field("kind", KIND_TYPE, nullable=False),
        pa.field("event_xid", pa.uint64()),
        # insert/update/delete/relation: the table (identity, and the whole definition as JSON).
        pa.field("relation_oid", pa.uint32()),
        pa.field("namespace", pa.string()),
        pa.field("name", pa.string()),
        pa.field("table", TABLE_TYPE),
        pa.field("new", ROW_TYPE),
        pa.field("old", ROW_TYPE),
        pa.field("old_is_key", pa.bool_()),
        # truncate
        pa.field("truncate_cascade", pa.bool_()),
        pa.field("truncate_restart_identity", pa.bool_()),
        pa.field("truncate_relations", pa.list_(pa.uint32())),
        pa.field("truncate_tables", pa.string()),
        # message
        pa.field("message_transactional", pa.bool_()),
        pa.field("message_prefix", pa.string()),
        pa.field("message_content", pa.binary()),
        # type
        pa.field("type_oid", pa.uint32()),
        pa.field("type_namespace", pa.string()),
        pa.field("type_name", pa.string()),
        # What pg_type says of it (events.Type); absent from logs written before they were
        # recorded, which read as "not looked up".
        pa.field("type_kind", pa.string()),
        pa.field("type_base_oid", pa.uint32()),
        pa.field("type_element_oid", pa.uint32()),
        pa.field("type_base_modifier", pa.int32()),
    ],
    metadata={"pgcdc.changelog.format": str(FORMAT_VERSION)},
)


# --- table and type definitions as JSON ------------------------------------------------------


def table_from_dict(data: dict[str, Any]) -> Table:
    try:
        return decoder_state.table_from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptChangeLog(f"damaged table definition in the change log: {exc!r}") from None


def type_from_dict(data: dict[str, Any]) -> TypeInfo:
    try:
        return decoder_state.type_from_dict(data)
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptChangeLog(f"damaged type definition in the change log: {exc!r}") from None


def type_info_of(event: Type) -> TypeInfo:
    """The TypeInfo a logged Type event stands for: what the receiver learnt from pg_type, or
    only the name (an unknown kind decodes as text) when it was not looked up."""
    return TypeInfo(
        event.oid,
        event.namespace,
        event.name,
        kind=event.kind or "b",
        base_oid=event.base_oid,
        element_oid=event.element_oid,
        base_modifier=event.base_modifier,
    )


def _json(value: Any) -> str:
    # ensure_ascii keeps lone surrogates (from undecodable names) representable as UTF-8.
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


@dataclass
class LogState:
    """The relation (OID -> Table) and type (OID -> TypeInfo) definitions in force at a point
    of the log: what a reader needs to interpret the rows that follow it."""

    relations: dict[int, Table] = field(default_factory=dict)
    types: dict[int, TypeInfo] = field(default_factory=dict)

    def copy(self) -> LogState:
        return LogState(dict(self.relations), dict(self.types))

    def observe(self, event: Event) -> None:
        """Track the definitions a logged event sets."""
        if isinstance(event, Relation):
            self.relations[event.table.oid] = event.table
        elif isinstance(event, Type):
            self.types[event.oid] = type_info_of(event)

    def to_dict(self) -> dict[str, Any]:
        return {
            "relations": [table_to_dict(t) for t in self.relations.values()],
            "types": [type_to_dict(t) for t in self.types.values()],
        }

    @classmethod
    def from_dict(cls, data: Any) -> LogState:
        try:
            relations = [table_from_dict(t) for t in data["relations"]]
            types = [type_from_dict(t) for t in data["types"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptChangeLog(f"damaged relation state in the change log: {exc!r}") from None
        return cls({t.oid: t for t in relations}, {t.oid: t for t in types})


# --- encoding --------------------------------------------------------------------------------


def _check_lsn(value: int, what: str) -> int:
    if not 0 <= value < 1 << 64:
        raise UnloggableInput(f"{what} {value} is not a 64-bit LSN")
    return value


def _row_data(row: Row) -> bytes:
    """A row's TupleData bytes: an ``EncodedRow``'s as they are, a tuple's encoded once."""
    if type(row) is EncodedRow:
        return row.data
    if row is None:
        raise UnloggableInput(
            "a row change without its row (an Insert's new row, a Delete's old row: None) "
            "cannot be logged; decoders always give one"
        )
    try:
        return encode_tuple_data(row)
    except InvalidRowValue as exc:
        raise UnloggableInput(f"{exc}; it cannot be logged") from None


def _uint(value: int | None, bits: int, what: str) -> int | None:
    if value is not None and not (isinstance(value, int) and 0 <= value < 1 << bits):
        raise UnloggableInput(f"{what} {value!r} does not fit the change log (a {bits}-bit uint)")
    return value


def _int32(value: int, what: str) -> int:
    if not (isinstance(value, int) and -(1 << 31) <= value < 1 << 31):
        raise UnloggableInput(f"{what} {value!r} does not fit the change log (a 32-bit int)")
    return value


def _text(value: str | None, what: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise UnloggableInput(f"{what} {value!r} is not a str")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UnloggableInput(
            f"{what} {value!r} holds characters that are not valid Unicode (lone surrogates); "
            "set the database's client encoding so names and origins decode to text"
        ) from None
    return value


# Columns set once per transaction, per table, per event, and only by some event kinds.
_TXN_FIELDS: Final = (
    "commit_lsn",
    "end_lsn",
    "xid",
    "commit_time",
    "origin",
    "origin_lsn",
    "gid",
    "outcome",
    "size",
)
_TABLE_FIELDS: Final = ("relation_oid", "namespace", "name")
_EVENT_FIELDS: Final = ("seq", "lsn", "kind", "event_xid", "table", "new", "old", "old_is_key")
_SPARSE_FIELDS: Final = tuple(
    f.name
    for f in SCHEMA
    if f.name not in _TXN_FIELDS and f.name not in _TABLE_FIELDS and f.name not in _EVENT_FIELDS
)
_U32: Final = 1 << 32
_U64: Final = 1 << 64
# txn index, seq, lsn, kind, event xid, table index, new, old, old_is_key
_EventRow = tuple[
    int, int, int, int, int | None, int | None, bytes | None, bytes | None, bool | None
]
_INSERT: Final = _KIND_INDEX["insert"]
_UPDATE: Final = _KIND_INDEX["update"]
_DELETE: Final = _KIND_INDEX["delete"]
_RELATION: Final = _KIND_INDEX["relation"]
_TRANSACTION: Final = _KIND_INDEX["transaction"]
_SIMPLE_KINDS: Final[dict[type, int]] = {
    Truncate: _KIND_INDEX["truncate"],
    Message: _KIND_INDEX["message"],
    Type: _KIND_INDEX["type"],
}


class BatchBuilder:
    """Accumulates events of one or more transactions and builds them into a record batch.

    ``add`` (one event) and ``add_many`` (a run of one transaction's events) return an estimate
    of the bytes added, so a writer can cut frames at a size without holding a large
    transaction in memory.

    Storage is columnar: transaction fields are validated and stored once per transaction,
    table fields once per table (found by object identity: decoders hand out one ``Table``
    object per definition), event positions in ``array.array``s (C integers, nothing for the
    garbage collector to walk), rows as their TupleData bytes. ``add_many`` fills a run of
    inserts with a few C-level passes instead of per-event Python work; ``build`` hands the
    columns to Arrow in bulk.
    """

    def __init__(self) -> None:
        self._table_json: dict[Table, str] = {}
        self.clear()

    def clear(self) -> None:
        self.rows = 0
        # The event columns, one entry per row.
        self._c_txn = array("i")
        self._c_seq = array("I")
        self._c_lsn = array("Q")
        self._c_kind = array("b")
        self._c_xid: list[int | None] = []
        self._c_table = array("i")  # -1: no table
        self._c_new: list[bytes | None] = []
        self._c_old: list[bytes | None] = []
        self._c_old_is_key: list[bool | None] = []
        # The columns' appends, in ``_append``'s order, for ``_add_changes``.
        self._appends = (
            self._c_txn.append,
            self._c_seq.append,
            self._c_lsn.append,
            self._c_kind.append,
            self._c_xid.append,
            self._c_table.append,
            self._c_new.append,
            self._c_old.append,
            self._c_old_is_key.append,
        )
        self._txns: list[tuple[Any, ...]] = []
        self._txn: CommittedTransaction | None = None
        self._txn_pos = -1
        # id(table) -> (table, index into the table lists, TupleData framing bytes of a row);
        # holding the table keeps its id valid.
        self._table_ids: dict[int, tuple[Table, int, int]] = {}
        self._tables: list[tuple[int, str, str]] = []
        self._table_dictionary: dict[str, int] = {}
        self._table_text_index: list[int] = []
        self._sparse: dict[int, dict[str, Any]] = {}
        if len(self._table_json) > 10_000:
            self._table_json.clear()

    def _table_text(self, table: Table) -> str:
        text = self._table_json.get(table)
        if text is None:
            for column in table.columns:
                _uint(column.type_oid, 32, "column type oid")
            text = self._table_json[table] = _json(table_to_dict(table))
        return text

    def _table_index(self, table: Table) -> int:
        """The table's index in this batch, validating it the first time it is seen."""
        entry = self._table_ids.get(id(table))
        if entry is not None and entry[0] is table:
            return entry[1]
        fields = (
            _uint(table.oid, 32, "relation oid"),
            _text(table.namespace, "namespace"),
            _text(table.name, "table name"),
        )
        text = self._table_text(table)
        text_index = self._table_dictionary.get(text)
        if text_index is None:
            text_index = self._table_dictionary[text] = len(self._table_dictionary)
        index = len(self._tables)
        self._tables.append(fields)  # type: ignore[arg-type]
        self._table_text_index.append(text_index)
        self._table_ids[id(table)] = (table, index, _framing(table))
        return index

    def _txn_index(self, txn: CommittedTransaction) -> int:
        if txn is self._txn:
            return self._txn_pos
        commit_lsn, end_lsn, xid, size = txn.commit_lsn, txn.end_lsn, txn.xid, txn.size
        commit_time = txn.commit_time
        if (
            # What a receiver's plain commit holds, known valid: the fields as below, unchecked.
            type(commit_lsn) is LSN
            and type(end_lsn) is LSN
            and (xid is None or type(xid) is int)
            and type(size) is int
            and (
                commit_time is None
                or (type(commit_time) is datetime and commit_time.tzinfo is not None)
            )
            and txn.origin is None
            and txn.origin_lsn is None
            and txn.gid is None
            and txn.outcome is _COMMIT
            and 0 <= commit_lsn < _U64
            and 0 <= end_lsn < _U64
            and (xid is None or 0 <= xid < _U64)
            and 0 <= size < _U64
        ):
            self._txns.append(
                (commit_lsn, end_lsn, xid, commit_time, None, None, None, _COMMIT_INDEX, size)
            )  # fmt: skip
            self._txn = txn
            self._txn_pos = len(self._txns) - 1
            return self._txn_pos
        if txn.commit_time is not None and (
            not isinstance(txn.commit_time, datetime) or txn.commit_time.tzinfo is None
        ):
            raise UnloggableInput(
                f"commit_time {txn.commit_time!r} has no time zone; decoders give UTC-aware times"
            )
        fields = (
            _uint(txn.commit_lsn, 64, "commit_lsn"),
            _uint(txn.end_lsn, 64, "end_lsn"),
            _uint(txn.xid, 64, "xid"),
            txn.commit_time,
            _text(txn.origin, "origin"),
            _uint(txn.origin_lsn, 64, "origin_lsn"),
            _text(txn.gid, "gid"),
            _OUTCOME_INDEX[txn.outcome],
            _uint(txn.size, 64, "size"),
        )
        self._txns.append(fields)
        self._txn = txn
        self._txn_pos = len(self._txns) - 1
        return self._txn_pos

    def _append(self, row: _EventRow) -> None:
        """One validated row into every column (appends that cannot fail)."""
        txn_index, seq, lsn, kind, xid, table, new, old, old_is_key = row
        self._c_txn.append(txn_index)
        self._c_seq.append(seq)
        self._c_lsn.append(lsn)
        self._c_kind.append(kind)
        self._c_xid.append(xid)
        self._c_table.append(-1 if table is None else table)
        self._c_new.append(new)
        self._c_old.append(old)
        self._c_old_is_key.append(old_is_key)
        self.rows += 1

    def add(self, txn: CommittedTransaction, seq: int, event: Event | None) -> int:
        """Append one event of ``txn`` at position ``seq`` (None: the row of a transaction
        without events); return its approximate size. Unloggable input raises before
        anything is added, so the builder stays consistent."""
        if type(event) in _RUN_TYPES:
            size, taken, _ = self._add_changes(txn, (event,), 0, 1, seq, room=_U64)  # type: ignore[arg-type]
            if taken:
                return size
        return self._add(txn, seq, event)

    def _add_changes(
        self,
        txn: CommittedTransaction,
        events: Sequence[Event],
        position: int,
        end: int,
        seq: int,
        *,
        room: int,
    ) -> tuple[int, int, int]:
        """Append ``events[position:end]`` of ``txn``, the first at position ``seq``, while each
        is an Insert, Update or Delete of a table already in this batch, with the decoder's
        rows (``EncodedRow``s) and positions (an ``LSN``, a valid xid), until the estimated size
        reaches ``room`` (the event that reaches it is the last one taken): ``_add`` without
        its checks, and the columns' appends looked up once for the whole stretch. Return the
        size added, the index after the last event taken and the position after it."""
        if type(seq) is not int or seq < 0:
            return 0, position, seq
        if end - position > _U32 - seq:
            end = position + max(_U32 - seq, 0)
        table_ids = self._table_ids
        txn_index = self._txn_pos if txn is self._txn else -1
        (
            append_txn,
            append_seq,
            append_lsn,
            append_kind,
            append_xid,
            append_table,
            append_new,
            append_old,
            append_old_is_key,
        ) = self._appends
        size = 0
        first = position
        while position < end:
            event = events[position]
            kind = type(event)
            if kind is Insert:
                new, old = event.new, None  # type: ignore[union-attr]
                old_is_key: bool | None = None
                if type(new) is not EncodedRow:
                    break
            elif kind is Update:
                new, old = event.new, event.old  # type: ignore[union-attr]
                old_is_key = bool(event.old_is_key)  # type: ignore[union-attr]
                if type(new) is not EncodedRow or (old is not None and type(old) is not EncodedRow):
                    break
            elif kind is Delete:
                new, old = None, event.old  # type: ignore[union-attr]
                old_is_key = bool(event.old_is_key)  # type: ignore[union-attr]
                if type(old) is not EncodedRow:
                    break
            else:
                break
            # LSNs are range-checked when made.
            table = event.table  # type: ignore[union-attr]
            entry = table_ids.get(id(table))
            xid = event.xid  # type: ignore[union-attr]
            lsn = event.lsn
            if (
                entry is None
                or entry[0] is not table
                or type(lsn) is not LSN
                or not (xid is None or (type(xid) is int and 0 <= xid < _U64))
            ):
                break
            if txn_index < 0:
                txn_index = self._txn_index(txn)
            event_size = 64
            new_data = old_data = None
            if new is not None:
                new_data = new._data
                if len(new_data) > entry[2]:
                    event_size += len(new_data) - entry[2]
            if old is not None:
                old_data = old._data  # type: ignore[union-attr]
                if len(old_data) > entry[2]:
                    event_size += len(old_data) - entry[2]
            append_txn(txn_index)
            append_seq(seq)
            append_lsn(lsn)
            append_kind(_RUN_KINDS[kind])
            append_xid(xid)
            append_table(entry[1])
            append_new(new_data)
            append_old(old_data)
            append_old_is_key(old_is_key)
            position += 1
            seq += 1
            size += event_size
            if size >= room:
                break
        self.rows += position - first
        return size, position, seq

    def add_run(
        self,
        txn: CommittedTransaction,
        events: Sequence[Event],
        start: int,
        seq: int,
        *,
        room: int,
        definitions: list[Event],
    ) -> tuple[int, int, int]:
        """Append ``events[start:]`` of ``txn``, the first at position ``seq`` (each event takes
        one position, a ``RowRun`` one per change), until the estimated size reaches ``room``:
        the event that reaches it is the last one taken. Return the size added, the index after
        the last event taken and the position after it; add the Relation and Type events taken
        to ``definitions``.

        A run of Inserts, Updates or Deletes of one kind with decoder rows (the common case) is
        added column by column in C-level passes, and so are a RowRun's rows; anything else goes
        in stretches of row changes (``_add_changes``) and, between them, event by event.
        Unloggable input raises; the events before the failing one may have been added (a
        writer drops the whole transaction then)."""
        end = min(len(events), start + _MAX_RUN)
        size = 0
        position = start
        if end - start <= _FEW_EVENTS:
            # A few events (a small transaction's, or the last of a larger one): their row
            # changes in one stretch, without the look at kinds below.
            size, position, seq = self._add_changes(txn, events, start, end, seq, room=room)
            if position == end or (size >= room and position > start):
                return size, position, seq
        elif (
            seq + end - start <= _U32
            # Different first and last types (a transaction's mix of kinds): not one kind.
            and type(events[start]) is type(events[end - 1])
        ):
            run = events if start == 0 and end == len(events) else events[start:end]
            kinds = set(map(type, run))
            if len(kinds) == 1 and kinds <= _RUN_TYPES:
                added = self._add_rows(txn, seq, run, room)
                if added is not None:
                    size, taken = added
                    return size, start + taken, seq + taken
        while position < end:
            stretch, position, seq = self._add_changes(
                txn, events, position, end, seq, room=room - size
            )
            size += stretch
            # At least one event is taken, even with no room (a frame of one event).
            if position == end or (size >= room and position > start):
                break
            event = events[position]
            if type(event) is RowRun:
                size += self._add_row_run(txn, seq, event)
                seq += len(event)
            else:
                size += self._add(txn, seq, event)
                seq += 1
            if type(event) in _DEFINITIONS:
                definitions.append(event)
            position += 1
            if size >= room:
                break
        return size, position, seq

    def _add_rows(
        self, txn: CommittedTransaction, first_seq: int, events: Sequence[Event], room: int
    ) -> tuple[int, int] | None:
        """``add_run`` for a run of Inserts, Updates or Deletes, all of one kind: the size added
        and how many were taken. None (nothing added) unless every one has the same table, its
        row as an ``EncodedRow`` (an Update: no old row), one ``old_is_key``, an LSN and a valid
        xid."""
        count = len(events)
        kind_type = type(events[0])
        tables = list(map(_event_table, events))
        table = tables[0]
        if tables.count(table) != count:
            return None
        old_is_key: bool | None = None
        if kind_type is Insert:
            rows = list(map(_event_new, events))
        else:
            keys = set(map(_event_old_is_key, events))
            if len(keys) != 1:
                return None
            old_is_key = bool(keys.pop())
            if kind_type is Delete:
                rows = list(map(_event_old, events))
            else:
                if list(map(_event_old, events)).count(None) != count:
                    return None
                rows = list(map(_event_new, events))
        if set(map(type, rows)) != _ENCODED_ONLY:
            return None
        xids = set(map(_event_xid, events))
        if not all(xid is None or (type(xid) is int and 0 <= xid < _U64) for xid in xids):
            return None
        datas = list(map(_row_bytes, rows))
        size = _rows_size(table, datas)
        if size >= room:
            # The frame fills within this run: take the events up to the one that fills it.
            size = taken = 0
            framing = _framing(table)
            for data in datas:
                taken += 1
                value_bytes = len(data) - framing
                size += 64 + value_bytes if value_bytes > 0 else 64
                if size >= room:
                    break
            if taken < count:
                count = taken
                events = events[:count]
                datas = datas[:count]
                xids = set(map(_event_xid, events))
        xid_values = list(xids) * count if len(xids) == 1 else list(map(_event_xid, events))
        lsns = map(_event_lsn, events)
        if not self._extend_rows(
            txn,
            table,
            kind_type,
            first_seq=first_seq,
            lsns=lsns,
            xids=xid_values,
            datas=datas,
            old_is_key=old_is_key,
        ):
            return None
        return size, count

    def _add_row_run(self, txn: CommittedTransaction, seq: int, run: RowRun) -> int:
        """``add_run`` for a RowRun at position ``seq``: its first change as ``add`` adds it,
        then its rows column by column."""
        first = run.first
        size = self.add(txn, seq, first)
        datas = run.rows
        count = len(datas)
        if not count:
            return size
        if count <= _FEW_RUN_ROWS and self._add_few_run_rows(seq + 1, run):
            return size + _rows_size(first.table, datas)
        _uint(seq + count, 32, "event position")
        if type(first) is Update and first.old is not None:
            raise UnloggableInput("a RowRun of Updates carries new rows only (no old rows)")
        if set(map(type, datas)) != _BYTES_ONLY or len(run.lsns) != count:
            raise UnloggableInput("a RowRun needs one LSN and one bytes row per change")
        old_is_key = None if isinstance(first, Insert) else bool(first.old_is_key)
        lsns = run.lsns
        if not self._extend_rows(
            txn,
            first.table,
            type(first),
            first_seq=seq + 1,
            lsns=lsns,
            xids=[first.xid] * count,
            datas=datas,
            old_is_key=old_is_key,
        ):
            raise UnloggableInput(f"a RowRun's LSNs are not 64-bit LSNs: {lsns[:3]}...")
        return size + _rows_size(first.table, datas)

    def _add_few_run_rows(self, first_seq: int, run: RowRun) -> bool:
        """The rows of a short RowRun (a few changes of one table in a small transaction)
        appended one by one after its first change, which ``add`` has just taken; False, with
        nothing added, unless each is ``bytes`` with an ``LSN`` (range-checked when made) and
        the run fits in the seq column. Cheaper than ``_extend_rows``'s column passes for a
        handful of rows."""
        first = run.first
        datas = run.rows
        lsns = run.lsns
        count = len(datas)
        kind_type = type(first)
        entry = self._table_ids.get(id(first.table))
        if (
            len(lsns) != count
            or entry is None
            or entry[0] is not first.table
            or first_seq + count > _U32
            or (kind_type is Update and first.old is not None)  # type: ignore[union-attr]
        ):
            return False
        for lsn, data in zip(lsns, datas, strict=True):
            if type(lsn) is not LSN or type(data) is not bytes:
                return False
        old_is_key = None if kind_type is Insert else bool(first.old_is_key)  # type: ignore[union-attr]
        kind = _RUN_KINDS[kind_type]
        txn_index = self._txn_pos
        table_index = entry[1]
        xid = first.xid
        is_delete = kind_type is Delete
        seq = first_seq
        for lsn, data in zip(lsns, datas, strict=True):
            self._c_txn.append(txn_index)
            self._c_seq.append(seq)
            self._c_lsn.append(lsn)
            self._c_kind.append(kind)
            self._c_xid.append(xid)
            self._c_table.append(table_index)
            self._c_new.append(None if is_delete else data)
            self._c_old.append(data if is_delete else None)
            self._c_old_is_key.append(old_is_key)
            seq += 1
        self.rows += count
        return True

    def _extend_rows(
        self,
        txn: CommittedTransaction,
        table: Table,
        kind_type: type,
        *,
        first_seq: int,
        lsns: Iterable[int],
        xids: list[int | None],
        datas: list[bytes],
        old_is_key: bool | None,
    ) -> bool:
        """Add ``datas`` (new rows; old rows of Deletes) as rows of one kind and table, column
        by column; False, with nothing added, when an LSN is not a uint64."""
        count = len(datas)
        txn_index = self._txn_index(txn)
        table_index = self._table_index(table)
        lsn_column = self._c_lsn
        try:
            lsn_column.extend(lsns)  # checks every LSN is a uint64
        except (TypeError, OverflowError):
            del lsn_column[self.rows :]
            return False
        # Validated: the other columns grow by C-level extends that cannot fail.
        self._c_txn.extend(array("i", (txn_index,)) * count)
        end = first_seq + count
        self._c_seq.extend(_SEQ[first_seq:end] if end <= len(_SEQ) else range(first_seq, end))
        self._c_kind.extend(array("b", (_RUN_KINDS[kind_type],)) * count)
        self._c_xid.extend(xids)
        self._c_table.extend(array("i", (table_index,)) * count)
        nothing: list[None] = [None] * count
        self._c_new.extend(nothing if kind_type is Delete else datas)
        self._c_old.extend(datas if kind_type is Delete else nothing)
        self._c_old_is_key.extend(nothing if old_is_key is None else [old_is_key] * count)
        self.rows += count
        return True

    def _add(self, txn: CommittedTransaction, seq: int, event: Event | None) -> int:
        """``add`` for every event: validates each field."""
        new: bytes | None = None
        old: bytes | None = None
        old_is_key: bool | None = None
        table: int | None = None
        sparse: dict[str, Any] | None = None
        if isinstance(event, Insert):
            kind = _INSERT
            new = _row_data(event.new)
            table = self._table_index(event.table)
        elif isinstance(event, Update):
            kind = _UPDATE
            new = _row_data(event.new)
            old = None if event.old is None else _row_data(event.old)
            old_is_key = bool(event.old_is_key)
            table = self._table_index(event.table)
        elif isinstance(event, Delete):
            kind = _DELETE
            old = _row_data(event.old)
            old_is_key = bool(event.old_is_key)
            table = self._table_index(event.table)
        elif event is None:
            kind = _TRANSACTION
        elif isinstance(event, Relation):
            kind = _RELATION
            table = self._table_index(event.table)
        elif isinstance(event, Truncate | Message | Type):
            kind = _SIMPLE_KINDS[type(event)]
            sparse = _sparse_fields(event)
        else:
            raise UnloggableInput(
                f"{type(event).__name__} events do not belong in a committed transaction; the "
                "change log stores Relation, Type, Insert, Update, Delete, Truncate and Message"
            )
        txn_index = self._txn_index(txn)
        lsn: int = txn.commit_lsn if event is None else event.lsn
        xid: int | None = None if event is None else event.xid
        try:
            valid = (
                isinstance(lsn, int)
                and isinstance(seq, int)
                and 0 <= seq < _U32
                and 0 <= lsn < _U64
                and (xid is None or (isinstance(xid, int) and 0 <= xid < _U64))
            )
        except TypeError:
            valid = False
        if not valid:
            _uint(seq, 32, "event position")
            _uint(lsn, 64, "event lsn")
            _uint(xid, 64, "event xid")
        # Validated: now add the row.
        if sparse is not None:
            self._sparse[self.rows] = sparse
        self._append((txn_index, seq, lsn, kind, xid, table, new, old, old_is_key))
        # The value bytes, as the estimate always counted: TupleData framing (2 bytes, then
        # 5 per value; 1 per NULL) taken off by the table's width, never below zero.
        size = 64
        if new is not None:
            size += max(len(new) - _framing(event.table), 0)  # type: ignore[union-attr]
        if old is not None:
            size += max(len(old) - _framing(event.table), 0)  # type: ignore[union-attr]
        if sparse is not None:
            size += len(sparse.get("message_content") or b"")
        return size

    def _check_rows(self, name: str, rows: pa.Array) -> None:
        """Raise if a row cannot be read back: the pgoutput decoder leaves rows unchecked for
        their consumer, and this check, for a whole batch at once, is the change log's."""
        found = first_unreadable_row(rows)
        if found is None:
            return
        index, reason = found
        oid, namespace, table = self._tables[self._c_table[index]]
        raise DecodeError(
            f"the {name} row at LSN {LSN(self._c_lsn[index])} in {namespace}.{table} (OID "
            f"{oid}) is malformed: {reason}. Nothing of this batch is logged or confirmed, so "
            "the server sends it again after a restart"
        )

    def build(self) -> pa.RecordBatch:
        """The accumulated rows as one batch of ``SCHEMA``; then start afresh."""
        columns: dict[str, pa.Array] = {}
        rows = self.rows
        try:
            txn_index = _from_array(pa.int32(), self._c_txn)
            txns = list(zip(*self._txns, strict=True)) or [()] * len(_TXN_FIELDS)
            for name, values in zip(_TXN_FIELDS, txns, strict=True):
                if name == "outcome":
                    columns[name] = pa.DictionaryArray.from_arrays(
                        pa.array(values, pa.int8()).take(txn_index), _OUTCOME_DICTIONARY
                    )
                else:
                    columns[name] = pa.array(values, SCHEMA.field(name).type).take(txn_index)
            columns["seq"] = _from_array(pa.uint32(), self._c_seq)
            columns["lsn"] = _from_array(pa.uint64(), self._c_lsn)
            columns["kind"] = pa.DictionaryArray.from_arrays(
                _from_array(pa.int8(), self._c_kind), _KIND_DICTIONARY
            )
            column_lists: tuple[tuple[str, list[Any]], ...] = (
                ("event_xid", self._c_xid),
                ("new", self._c_new),
                ("old", self._c_old),
                ("old_is_key", self._c_old_is_key),
            )
            for name, column in column_lists:
                columns[name] = pa.array(column, SCHEMA.field(name).type)
            for name in ("new", "old"):
                self._check_rows(name, columns[name])
            table_index = _from_array(pa.int32(), self._c_table)
            if -1 in self._c_table:
                table_index = pc.if_else(pc.less(table_index, 0), None, table_index)
            tables = list(zip(*self._tables, strict=True)) or [()] * len(_TABLE_FIELDS)
            for name, values in zip(_TABLE_FIELDS, tables, strict=True):
                columns[name] = pa.array(values, SCHEMA.field(name).type).take(table_index)
            columns["table"] = pa.DictionaryArray.from_arrays(
                pa.array(self._table_text_index, pa.int32()).take(table_index),
                pa.array(list(self._table_dictionary), pa.string()),
            )
            for name in _SPARSE_FIELDS:
                if not self._sparse:
                    columns[name] = pa.nulls(rows, SCHEMA.field(name).type)
                    continue
                sparse: list[Any] = [None] * rows
                for row, fields in self._sparse.items():
                    sparse[row] = fields.get(name)
                columns[name] = pa.array(sparse, SCHEMA.field(name).type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise UnloggableInput(
                f"a transaction field does not fit the change log: {exc}"
            ) from exc
        batch = pa.RecordBatch.from_arrays([columns[f.name] for f in SCHEMA], schema=SCHEMA)
        self.clear()
        return batch


# Event types ``add_run`` adds column by column, and their kinds.
_RUN_KINDS: Final = {Insert: _INSERT, Update: _UPDATE, Delete: _DELETE}
_RUN_TYPES: Final = frozenset(_RUN_KINDS)
_ENCODED_ONLY: Final = frozenset((EncodedRow,))
_BYTES_ONLY: Final = frozenset((bytes,))
_LSNS_ONLY: Final = frozenset((LSN,))
_event_table: Final = attrgetter("table")
_event_new: Final = attrgetter("new")
_event_old: Final = attrgetter("old")
_event_old_is_key: Final = attrgetter("old_is_key")
_event_lsn: Final = attrgetter("lsn")
_event_xid: Final = attrgetter("xid")
_row_bytes: Final = attrgetter("_data")
# Positions 0... of a transaction's events, copied into the seq column in one step.
_SEQ: Final = array("I", range(1 << 16))
_DEFINITIONS: Final = frozenset((Relation, Type))
# Events ``add_run`` takes in one go at most.
_MAX_RUN: Final = 1024
# Up to this many events, ``add_run`` tries one stretch of row changes before anything else.
_FEW_EVENTS: Final = 8
# RowRuns up to this many rows (after the first change) are appended row by row.
_FEW_RUN_ROWS: Final = 8


def _from_array(arrow_type: pa.DataType, values: array[int]) -> pa.Array:
    """An Arrow array over an ``array.array``'s buffer (no per-value conversion)."""
    if not values:
        return pa.array([], arrow_type)
    return pa.Array.from_buffers(arrow_type, len(values), [None, pa.py_buffer(values)])


def _framing(table: Table) -> int:
    """TupleData bytes that are not values in a row of ``table`` (at most: a NULL takes 1)."""
    return 2 + 5 * len(table.columns)


def _rows_size(table: Table, datas: list[bytes]) -> int:
    """The estimated logged size of rows ``datas`` of ``table``, taken together: 64 bytes of
    fields each, plus their values' bytes."""
    count = len(datas)
    values = sum(map(len, datas)) - _framing(table) * count
    return 64 * count + (values if values > 0 else 0)


def _sparse_fields(event: Event) -> dict[str, Any]:
    """The columns only Truncate, Message and Type events fill, validated."""
    if isinstance(event, Truncate):
        return {
            "truncate_cascade": bool(event.cascade),
            "truncate_restart_identity": bool(event.restart_identity),
            "truncate_relations": [_uint(t.oid, 32, "relation oid") for t in event.tables],
            "truncate_tables": _json([table_to_dict(t) for t in event.tables]),
        }
    if isinstance(event, Message):
        if not isinstance(event.content, bytes):
            raise UnloggableInput(f"message content must be bytes, not {event.content!r}")
        return {
            "message_transactional": bool(event.transactional),
            "message_prefix": _text(event.prefix, "message prefix"),
            "message_content": event.content,
        }
    assert isinstance(event, Type)
    return {
        "type_oid": _uint(event.oid, 32, "type oid"),
        "type_namespace": _text(event.namespace, "type namespace"),
        "type_name": _text(event.name, "type name"),
        "type_kind": _text(event.kind, "type kind") or None,
        "type_base_oid": _uint(event.base_oid, 32, "type base oid"),
        "type_element_oid": _uint(event.element_oid, 32, "type element oid"),
        "type_base_modifier": _int32(event.base_modifier, "type modifier"),
    }


def encode(transactions: Iterable[CommittedTransaction]) -> pa.RecordBatch:
    """All events of ``transactions`` as one record batch (empty transactions leave no rows)."""
    builder = BatchBuilder()
    definitions: list[Event] = []
    for txn in transactions:
        events = txn.events
        if type(events) is not tuple and type(events) is not list:
            events = tuple(events)
        if not events:
            builder.add(txn, 0, None)
            continue
        position = seq = 0
        while position < len(events):
            _, position, seq = builder.add_run(
                txn, events, position, seq, room=_U64, definitions=definitions
            )
        definitions.clear()
    return builder.build()


# --- decoding --------------------------------------------------------------------------------


def _decode_rows(column: pa.Array) -> list[Row | None]:
    """The logged rows as ``EncodedRow``s over their TupleData bytes (decoded on use)."""
    rows: list[Row | None] = []
    append = rows.append
    for data in column.to_pylist():
        if data is None:
            append(None)
            continue
        if len(data) < 2:
            raise CorruptChangeLog(f"a logged row of {len(data)} bytes has no column count")
        append(new_encoded_row(data, None))
    return rows


@dataclass(frozen=True, slots=True)
class DecodedRow:
    """One logged event with the transaction it belongs to."""

    commit_lsn: LSN
    end_lsn: LSN
    xid: int | None
    commit_time: datetime | None
    origin: str | None
    origin_lsn: LSN | None
    gid: str | None
    outcome: TransactionOutcome
    size: int
    seq: int
    # None for the row of a transaction without events.
    event: Event | None


def type_rows(batch: pa.RecordBatch) -> pa.BooleanArray:
    """Which rows of ``batch`` (a ``SCHEMA`` batch) are Type rows, read from the kind
    column's dictionary indices."""
    kind = batch.column("kind")
    return pc.equal(kind.indices, kind.dictionary.index("type").as_py())


def holds_type_rows(batch: pa.RecordBatch) -> bool:
    """Whether ``batch`` has a Type row: frames note it, so planners that track type
    definitions read only the frames that change them."""
    return bool(pc.any(type_rows(batch)).as_py())


def decode_rows(batch: pa.RecordBatch) -> Iterator[DecodedRow]:
    """The events in ``batch`` (a ``SCHEMA`` batch), each with its transaction's fields."""
    if batch.num_rows == 0:
        return
    # Columns added to SCHEMA since a segment was written read as nulls.
    col = {
        name: batch.column(name)
        if name in batch.schema.names
        else pa.nulls(batch.num_rows, SCHEMA.field(name).type)
        for name in SCHEMA.names
    }
    py = {
        name: col[name].to_pylist()
        for name in SCHEMA.names
        if name not in ("new", "old", "table", "kind", "outcome")
    }
    kinds = col["kind"].cast(pa.string()).to_pylist()
    outcomes = col["outcome"].cast(pa.string()).to_pylist()
    table_column = col["table"]
    table_dictionary = [table_from_dict(json.loads(t)) for t in table_column.dictionary.to_pylist()]
    table_indices = table_column.indices.to_pylist()
    news = _decode_rows(col["new"])
    olds = _decode_rows(col["old"])
    for i, kind in enumerate(kinds):
        lsn = LSN(py["lsn"][i])
        xid = py["event_xid"][i]
        table_index = table_indices[i]
        table = table_dictionary[table_index] if table_index is not None else None
        event: Event | None
        try:
            if kind == "transaction":
                event = None
            elif kind == "insert":
                assert table is not None
                event = Insert(lsn, table, _present(news[i]), xid)
            elif kind == "update":
                assert table is not None
                event = Update(lsn, table, _present(news[i]), olds[i], py["old_is_key"][i], xid)
            elif kind == "delete":
                assert table is not None
                event = Delete(lsn, table, _present(olds[i]), py["old_is_key"][i], xid)
            elif kind == "relation":
                assert table is not None
                event = Relation(lsn, table, xid)
            elif kind == "truncate":
                tables = tuple(table_from_dict(t) for t in json.loads(py["truncate_tables"][i]))
                event = Truncate(
                    lsn, tables, py["truncate_cascade"][i], py["truncate_restart_identity"][i], xid
                )
            elif kind == "message":
                event = Message(
                    lsn,
                    py["message_transactional"][i],
                    py["message_prefix"][i],
                    py["message_content"][i],
                    xid,
                )
            elif kind == "type":
                modifier = py["type_base_modifier"][i]
                event = Type(
                    lsn,
                    py["type_oid"][i],
                    py["type_namespace"][i],
                    py["type_name"][i],
                    xid,
                    kind=py["type_kind"][i] or "",
                    base_oid=py["type_base_oid"][i] or 0,
                    element_oid=py["type_element_oid"][i] or 0,
                    base_modifier=-1 if modifier is None else modifier,
                )
            else:
                raise CorruptChangeLog(f"unknown event kind {kind!r} in the change log")
        except (AssertionError, TypeError, ValueError) as exc:
            raise CorruptChangeLog(f"damaged {kind} row in the change log: {exc!r}") from None
        origin_lsn = py["origin_lsn"][i]
        yield DecodedRow(
            commit_lsn=LSN(py["commit_lsn"][i]),
            end_lsn=LSN(py["end_lsn"][i]),
            xid=py["xid"][i],
            commit_time=py["commit_time"][i],
            origin=py["origin"][i],
            origin_lsn=LSN(origin_lsn) if origin_lsn is not None else None,
            gid=py["gid"][i],
            outcome=_OUTCOME_BY_VALUE[outcomes[i]],
            size=py["size"][i],
            seq=py["seq"][i],
            event=event,
        )


def _present(row: Row | None) -> Row:
    if row is None:
        raise CorruptChangeLog("a change row the event requires is missing from the change log")
    return row


def decode(batches: Iterable[pa.RecordBatch]) -> Iterator[CommittedTransaction]:
    """Regroup the rows of ``batches`` (in log order) into committed transactions."""
    current: DecodedRow | None = None
    events: list[Event] = []
    for batch in batches:
        for row in decode_rows(batch):
            if current is not None and row.commit_lsn != current.commit_lsn:
                yield _transaction(current, events)
                current, events = None, []
            if current is None:
                current = row
            if row.event is not None:
                events.append(row.event)
    if current is not None:
        yield _transaction(current, events)


def _transaction(first: DecodedRow, events: Sequence[Event]) -> CommittedTransaction:
    return CommittedTransaction(
        xid=first.xid,
        commit_lsn=first.commit_lsn,
        end_lsn=first.end_lsn,
        commit_time=first.commit_time,
        events=tuple(events),
        origin=first.origin,
        origin_lsn=first.origin_lsn,
        gid=first.gid,
        outcome=first.outcome,
        size=first.size,
    )


__all__ = [
    "FORMAT_VERSION",
    "KINDS",
    "SCHEMA",
    "BatchBuilder",
    "DecodedRow",
    "LogState",
    "TransactionOutcome",
    "Unchanged",
    "decode",
    "decode_rows",
    "encode",
    "table_from_dict",
    "table_to_dict",
    "type_info_of",
]
