"""Committed transactions <-> Arrow record batches, with one fixed schema for every event kind.

One schema keeps the log readable by Spark without knowing the tables in advance: rows stay raw
(as ``pgcdc.events`` holds them) in ``list<struct<kind, value>>`` columns, and each change row
carries its table definition as dictionary-encoded JSON, so a batch can be interpreted alone.
Pure functions: no IO here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pyarrow as pa

from pgcdc.decoding import state as decoder_state
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.decoding.state import table_to_dict, type_to_dict
from pgcdc.errors import CorruptChangeLog, UnloggableInput
from pgcdc.events import (
    UNCHANGED_TOAST,
    Delete,
    Event,
    Insert,
    Message,
    RawValue,
    Relation,
    Row,
    Table,
    Truncate,
    Type,
    Unchanged,
    Update,
)
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction, TransactionOutcome

FORMAT_VERSION = 1

# Value kinds inside a row, as in pgoutput's TupleData.
VALUE_NULL = ord("n")
VALUE_UNCHANGED_TOAST = ord("u")
VALUE_TEXT = ord("t")
VALUE_BINARY = ord("b")

# "transaction": the one row of a transaction without events (an empty commit, or the
# COMMIT PREPARED / ROLLBACK PREPARED that settles a transaction emitted at PREPARE).
KINDS: tuple[str, ...] = (
    "insert",
    "update",
    "delete",
    "truncate",
    "message",
    "relation",
    "type",
    "transaction",
)
_KIND_INDEX = {kind: index for index, kind in enumerate(KINDS)}
_KIND_DICTIONARY = pa.array(KINDS, pa.string())

ROW_VALUE_TYPE = pa.struct([("kind", pa.uint8()), ("value", pa.binary())])
ROW_TYPE = pa.list_(pa.field("item", ROW_VALUE_TYPE, nullable=False))
KIND_TYPE = pa.dictionary(pa.int8(), pa.string())
TABLE_TYPE = pa.dictionary(pa.int32(), pa.string())
OUTCOME_TYPE = pa.dictionary(pa.int8(), pa.string())
_OUTCOMES = tuple(TransactionOutcome)
_OUTCOME_INDEX = {outcome: index for index, outcome in enumerate(_OUTCOMES)}
_OUTCOME_DICTIONARY = pa.array([o.value for o in _OUTCOMES], pa.string())
_OUTCOME_BY_VALUE = {o.value: o for o in _OUTCOMES}

SCHEMA = pa.schema(
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
            self.types[event.oid] = TypeInfo(event.oid, event.namespace, event.name)

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


def _row_values(row: Row) -> tuple[list[int], list[bytes | None], int]:
    """A row's value kinds and bytes, and its size; an unloggable value raises first."""
    kinds: list[int] = []
    values: list[bytes | None] = []
    size = 0
    for value in row:
        if isinstance(value, str):
            data = value.encode("utf-8", "surrogatepass")
            kinds.append(VALUE_TEXT)
            values.append(data)
            size += len(data)
        elif isinstance(value, bytes):
            kinds.append(VALUE_BINARY)
            values.append(value)
            size += len(value)
        elif value is None:
            kinds.append(VALUE_NULL)
            values.append(None)
        elif value is UNCHANGED_TOAST:
            kinds.append(VALUE_UNCHANGED_TOAST)
            values.append(None)
        else:
            raise UnloggableInput(
                f"row value {value!r} of type {type(value).__name__} cannot be logged: "
                "rows hold str, bytes, None or UNCHANGED_TOAST as the server sent them"
            )
    return kinds, values, size


class _RowColumn:
    """Builds a ``list<struct<kind, value>>`` column from flat lists, without per-value dicts."""

    __slots__ = ("kinds", "mask", "offsets", "values")

    def __init__(self) -> None:
        self.offsets: list[int] = [0]
        self.kinds: list[int] = []
        self.values: list[bytes | None] = []
        self.mask: list[bool] = []

    def append(self, row: tuple[list[int], list[bytes | None], int] | None) -> None:
        if row is None:
            self.mask.append(True)
        else:
            self.mask.append(False)
            self.kinds.extend(row[0])
            self.values.extend(row[1])
        self.offsets.append(len(self.kinds))

    def build(self) -> pa.Array:
        values = pa.StructArray.from_arrays(
            [pa.array(self.kinds, pa.uint8()), pa.array(self.values, pa.binary())],
            fields=list(ROW_VALUE_TYPE),
        )
        return pa.ListArray.from_arrays(
            pa.array(self.offsets, pa.int32()),
            values,
            type=ROW_TYPE,
            mask=pa.array(self.mask, pa.bool_()),
        )


def _uint(value: int | None, bits: int, what: str) -> int | None:
    if value is not None and not (isinstance(value, int) and 0 <= value < 1 << bits):
        raise UnloggableInput(f"{what} {value!r} does not fit the change log (a {bits}-bit uint)")
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


class BatchBuilder:
    """Accumulates events of one or more transactions and builds them into a record batch.

    ``add`` returns an estimate of the bytes added, so a writer can cut frames at a size
    without holding a large transaction in memory.
    """

    def __init__(self) -> None:
        self._table_json: dict[Table, str] = {}
        self.clear()

    def clear(self) -> None:
        self.rows = 0
        self._columns: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
        self._new = _RowColumn()
        self._old = _RowColumn()
        self._table_indices: list[int | None] = []
        self._table_dictionary: dict[str, int] = {}
        if len(self._table_json) > 10_000:
            self._table_json.clear()

    def _table_text(self, table: Table) -> str:
        text = self._table_json.get(table)
        if text is None:
            for column in table.columns:
                _uint(column.type_oid, 32, "column type oid")
            text = self._table_json[table] = _json(table_to_dict(table))
        return text

    def _table_index(self, text: str) -> int:
        index = self._table_dictionary.get(text)
        if index is None:
            index = self._table_dictionary[text] = len(self._table_dictionary)
        return index

    def add(self, txn: CommittedTransaction, seq: int, event: Event | None) -> int:
        """Append one event of ``txn`` at position ``seq`` (None: the row of a transaction
        without events); return its approximate size. Unloggable input raises before
        anything is added, so the builder stays consistent."""
        table: Table | None
        new: Row | None
        old: Row | None
        old_is_key: bool | None
        if event is None:
            kind, table, new, old, old_is_key = "transaction", None, None, None, None
        elif isinstance(event, Insert):
            kind, table, new, old, old_is_key = "insert", event.table, event.new, None, None
        elif isinstance(event, Update):
            kind, table, new, old = "update", event.table, event.new, event.old
            old_is_key = event.old_is_key
        elif isinstance(event, Delete):
            kind, table, new, old = "delete", event.table, None, event.old
            old_is_key = event.old_is_key
        elif isinstance(event, Relation):
            kind, table, new, old, old_is_key = "relation", event.table, None, None, None
        elif isinstance(event, Truncate | Message | Type):
            kind = {Truncate: "truncate", Message: "message", Type: "type"}[type(event)]
            table, new, old, old_is_key = None, None, None, None
        else:
            raise UnloggableInput(
                f"{type(event).__name__} events do not belong in a committed transaction; the "
                "change log stores Relation, Type, Insert, Update, Delete, Truncate and Message"
            )
        if txn.commit_time is not None and (
            not isinstance(txn.commit_time, datetime) or txn.commit_time.tzinfo is None
        ):
            raise UnloggableInput(
                f"commit_time {txn.commit_time!r} has no time zone; decoders give UTC-aware times"
            )
        values: dict[str, Any] = dict.fromkeys(self._columns)
        values.update(
            commit_lsn=_uint(txn.commit_lsn, 64, "commit_lsn"),
            end_lsn=_uint(txn.end_lsn, 64, "end_lsn"),
            xid=_uint(txn.xid, 64, "xid"),
            commit_time=txn.commit_time,
            origin=_text(txn.origin, "origin"),
            origin_lsn=_uint(txn.origin_lsn, 64, "origin_lsn"),
            gid=_text(txn.gid, "gid"),
            outcome=_OUTCOME_INDEX[txn.outcome],
            size=_uint(txn.size, 64, "size"),
            seq=_uint(seq, 32, "event position"),
            lsn=_uint(event.lsn if event else txn.commit_lsn, 64, "event lsn"),
            kind=_KIND_INDEX[kind],
            event_xid=_uint(event.xid, 64, "event xid") if event else None,
            old_is_key=old_is_key,
        )
        table_text = None
        if table is not None:
            values["relation_oid"] = _uint(table.oid, 32, "relation oid")
            values["namespace"] = _text(table.namespace, "namespace")
            values["name"] = _text(table.name, "table name")
            table_text = self._table_text(table)
        new_row = _row_values(new) if new is not None else None
        old_row = _row_values(old) if old is not None else None
        size = 64 + (new_row[2] if new_row else 0) + (old_row[2] if old_row else 0)
        if isinstance(event, Truncate):
            values["truncate_cascade"] = bool(event.cascade)
            values["truncate_restart_identity"] = bool(event.restart_identity)
            values["truncate_relations"] = [_uint(t.oid, 32, "relation oid") for t in event.tables]
            values["truncate_tables"] = _json([table_to_dict(t) for t in event.tables])
        elif isinstance(event, Message):
            if not isinstance(event.content, bytes):
                raise UnloggableInput(f"message content must be bytes, not {event.content!r}")
            values["message_transactional"] = bool(event.transactional)
            values["message_prefix"] = _text(event.prefix, "message prefix")
            values["message_content"] = event.content
            size += len(event.content)
        elif isinstance(event, Type):
            values["type_oid"] = _uint(event.oid, 32, "type oid")
            values["type_namespace"] = _text(event.namespace, "type namespace")
            values["type_name"] = _text(event.name, "type name")
        # Validated: now add the row everywhere.
        for name, column in self._columns.items():
            column.append(values[name])
        self._table_indices.append(self._table_index(table_text) if table_text else None)
        self._new.append(new_row)
        self._old.append(old_row)
        self.rows += 1
        return size

    def build(self) -> pa.RecordBatch:
        """The accumulated rows as one batch of ``SCHEMA``; then start afresh."""
        arrays: list[pa.Array] = []
        try:
            for f in SCHEMA:
                if f.name == "kind":
                    arrays.append(
                        pa.DictionaryArray.from_arrays(
                            pa.array(self._columns["kind"], pa.int8()), _KIND_DICTIONARY
                        )
                    )
                elif f.name == "outcome":
                    arrays.append(
                        pa.DictionaryArray.from_arrays(
                            pa.array(self._columns["outcome"], pa.int8()), _OUTCOME_DICTIONARY
                        )
                    )
                elif f.name == "table":
                    arrays.append(
                        pa.DictionaryArray.from_arrays(
                            pa.array(self._table_indices, pa.int32()),
                            pa.array(list(self._table_dictionary), pa.string()),
                        )
                    )
                elif f.name == "new":
                    arrays.append(self._new.build())
                elif f.name == "old":
                    arrays.append(self._old.build())
                else:
                    arrays.append(pa.array(self._columns[f.name], f.type))
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            raise UnloggableInput(
                f"a transaction field does not fit the change log: {exc}"
            ) from exc
        batch = pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)
        self.clear()
        return batch


def encode(transactions: Iterable[CommittedTransaction]) -> pa.RecordBatch:
    """All events of ``transactions`` as one record batch (empty transactions leave no rows)."""
    builder = BatchBuilder()
    for txn in transactions:
        seq = -1
        for seq, event in enumerate(txn.events):
            builder.add(txn, seq, event)
        if seq < 0:
            builder.add(txn, 0, None)
    return builder.build()


# --- decoding --------------------------------------------------------------------------------

_UNCHANGED: RawValue = UNCHANGED_TOAST


def _decode_rows(column: pa.ListArray) -> list[Row | None]:
    offsets = column.offsets.to_pylist()
    values = column.values
    kinds = values.field("kind").to_pylist()
    datas = values.field("value").to_pylist()
    valid = column.is_valid().to_pylist()
    rows: list[Row | None] = []
    for index, is_valid in enumerate(valid):
        if not is_valid:
            rows.append(None)
            continue
        row: list[RawValue] = []
        for position in range(offsets[index], offsets[index + 1]):
            kind = kinds[position]
            if kind == VALUE_TEXT:
                row.append(datas[position].decode("utf-8", "surrogatepass"))
            elif kind == VALUE_BINARY:
                row.append(datas[position])
            elif kind == VALUE_NULL:
                row.append(None)
            elif kind == VALUE_UNCHANGED_TOAST:
                row.append(_UNCHANGED)
            else:
                raise CorruptChangeLog(f"unknown row value kind {kind!r} in the change log")
        rows.append(tuple(row))
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


def decode_rows(batch: pa.RecordBatch) -> Iterator[DecodedRow]:
    """The events in ``batch`` (a ``SCHEMA`` batch), each with its transaction's fields."""
    if batch.num_rows == 0:
        return
    col = {name: batch.column(name) for name in SCHEMA.names}
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
                event = Type(
                    lsn, py["type_oid"][i], py["type_namespace"][i], py["type_name"][i], xid
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
]
