"""Many pgoutput messages straight to typed Arrow batches, without an event per change.

``PgOutputDecoder.decode_one`` costs a few microseconds of Python per message, more than a
walsender spends producing it. For bulk decoding (a captured stream, the SQL interface, a
backlog), ``decode_batch`` reads every message's type byte with numpy and hands the few
non-change messages (Begin, Commit, Relation, Type, stream and two-phase markers) to the
decoder one by one. The Insert/Update/Delete messages between two messages that change the
decoder's state (anything but Begin and Commit, so runs go on across transactions) are decoded
column by column: the relation OID, the tuple markers and the TupleData framing of all of
them at once, then typed Arrow columns exactly as ``rows_to_arrow`` builds them.

Anything unusual in a run (an unknown relation, a malformed message, text that is not UTF-8),
or a run too short to gain from numpy, goes through ``decode_one`` and ``rows_to_arrow``
instead, which give the same batches, or raise the same typed errors, in message order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from pgcdc.decoding import columnar
from pgcdc.decoding.arrow import DEFAULT_OPTIONS, ArrowOptions, framed_to_arrow, rows_to_arrow
from pgcdc.decoding.pgoutput import PgOutputDecoder
from pgcdc.decoding.values import TypeRegistry, Types, registry_for
from pgcdc.errors import DecodeError
from pgcdc.events import (
    Delete,
    EncodedRow,
    Event,
    Insert,
    Row,
    Table,
    Update,
    builder,
    new_encoded_row,
)
from pgcdc.lsn import LSN
from pgcdc.tupledata import KIND_NULL

__all__ = ["ChangeBatch", "DecodedBatch", "decode_batch", "decode_many"]

Int64s = npt.NDArray[np.int64]

_INSERT, _UPDATE, _DELETE = b"I"[0], b"U"[0], b"D"[0]
_BEGIN, _COMMIT = b"B"[0], b"C"[0]

MIN_COLUMNAR_RUN = 100
"""Regions with fewer changes go through decode_one and rows_to_arrow: below about this
many, numpy's per-call cost outweighs what it saves."""

_NEW, _KEY, _OLD = b"N"[0], b"K"[0], b"O"[0]


@dataclass(frozen=True, slots=True)
class ChangeBatch:
    """Changes of one table from one run of consecutive change messages, typed.

    ``positions`` are the changes' indexes in the messages given to ``decode_batch`` (in
    order); ``ops`` holds 'I', 'U' or 'D'. ``new`` has ``arrow_schema(table)``: the new row of
    inserts and updates, all null for deletes. ``old`` (same schema, None when no change of
    the batch carried one) holds the old key or row of deletes and of updates that sent one,
    null rows elsewhere; ``old_is_key`` tells which ('K' rather than 'O').
    """

    table: Table
    positions: Int64s
    ops: pa.Array
    new: pa.RecordBatch
    old: pa.RecordBatch | None
    old_is_key: npt.NDArray[np.bool_]

    def __len__(self) -> int:
        return len(self.positions)


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """What ``decode_batch`` returns: the non-change events with their message indexes, and
    the typed changes, both in message order."""

    events: list[tuple[int, Event]]
    changes: list[ChangeBatch]

    @property
    def change_count(self) -> int:
        return sum(len(batch) for batch in self.changes)


Region = tuple[list[tuple[int, Event]], list[ChangeBatch]]
"""A region's non-change events (with their indexes) and its typed changes."""


def decode_batch(
    decoder: PgOutputDecoder,
    payloads: Sequence[bytes | memoryview],
    lsns: Sequence[LSN],
    options: ArrowOptions = DEFAULT_OPTIONS,
    types: Types = None,
) -> DecodedBatch:
    """pgoutput ``payloads`` (one message each, at ``lsns``) decoded: changes as typed Arrow
    batches, other messages as events through ``decoder`` (whose state they update).

    ``types`` defaults to the types the stream announced (``decoder.state.types``).
    """
    registry = registry_for(types if types is not None else decoder.state.types)
    count, buffer, first, starts, ends, change, passive = _frame(payloads, lsns)
    events: list[tuple[int, Event]] = []
    changes: list[ChangeBatch] = []
    run = _Run(decoder, buffer, first, starts, ends, registry, options)
    region_start = 0
    for index in [*np.flatnonzero(~(change | passive)).tolist(), count]:
        if index > region_start:
            region = np.arange(region_start, index, dtype=np.int64)
            found = _columnar_region(run, (payloads, lsns), region, change[region_start:index])
            if found is None:
                found = _one_by_one(
                    decoder, (payloads, lsns), region, registry=registry, options=options
                )
            events.extend(found[0])
            changes.extend(found[1])
        if index < count:
            events.append((index, decoder.decode_one(payloads[index], lsns[index])))
        region_start = index + 1
    return DecodedBatch(events, changes)


def _frame(
    payloads: Sequence[bytes | memoryview], lsns: Sequence[LSN]
) -> tuple[
    int,
    columnar.WireBuffer,
    npt.NDArray[np.uint8],
    Int64s,
    Int64s,
    npt.NDArray[np.bool_],
    npt.NDArray[np.bool_],
]:
    """The messages joined into one buffer: (count, buffer, first bytes, starts, ends, is a
    change, is Begin/Commit). Begin and Commit leave the decoder's state alone, so a run of
    changes goes on across them."""
    if len(payloads) != len(lsns):
        raise ValueError(f"{len(payloads)} payloads but {len(lsns)} LSNs")
    count = len(payloads)
    lengths = np.fromiter(map(len, payloads), np.int64, count)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    buffer = columnar.WireBuffer.joined(payloads)
    first = buffer.u8[starts]
    change = ((first == _INSERT) | (first == _UPDATE) | (first == _DELETE)) & (lengths > 0)
    passive = ((first == _BEGIN) | (first == _COMMIT)) & (lengths > 0)
    return count, buffer, first, starts, ends, change, passive


def _columnar_region(
    run: _Run,
    messages: tuple[Sequence[bytes | memoryview], Sequence[LSN]],
    region: Int64s,
    is_change: npt.NDArray[np.bool_],
) -> Region | None:
    """Changes and Begin/Commit messages of ``region``: the changes column by column, the
    others through decode_one. None when the region is small or anything in it is unusual
    (then it is decoded message by message, which raises the first error in order)."""
    if int(np.count_nonzero(is_change)) < MIN_COLUMNAR_RUN:
        return None
    payloads, lsns = messages
    try:
        # Begin and Commit only read the state, so decoding them again later is harmless.
        events = [
            (index, run.decoder.decode_one(payloads[index], lsns[index]))
            for index in region[~is_change].tolist()
        ]
    except DecodeError:
        return None
    found = run.decode(region[is_change])
    return None if found is None else (events, found)


@dataclass
class _Run:
    decoder: PgOutputDecoder
    buffer: columnar.WireBuffer
    first: npt.NDArray[np.uint8]
    starts: Int64s
    ends: Int64s
    registry: TypeRegistry
    options: ArrowOptions

    def decode(self, messages: Int64s) -> list[ChangeBatch] | None:
        """The changes of ``messages`` (Insert/Update/Delete, in order), grouped by table in
        order of first appearance; None when any is unusual."""
        u32 = self.buffer.view(">u4")
        body = self.starts[messages] + (1 if self.decoder.state.stream_xid is None else 5)
        limits = self.ends[messages]
        if bool((body + 5 > limits).any()):
            return None
        oids = u32[body]
        if bool((oids == oids[0]).all()):  # the usual run: one table
            unique, first_seen = oids[:1], np.zeros(1, np.int64)
            group_of = np.zeros(len(oids), np.int64)
        else:
            unique, first_seen, group_of = np.unique(oids, return_index=True, return_inverse=True)
        relations = self.decoder.state.relations
        # Every message of the run is read and checked before any value is converted, as
        # decode_one would have read them all before rows_to_arrow ran.
        framed = []
        for group in np.argsort(first_seen, kind="stable").tolist():
            table = relations.get(int(unique[group]))
            if table is None:
                return None
            rows = np.flatnonzero(group_of == group)
            found = self._frame(table, messages[rows], body[rows], limits[rows])
            if found is None:
                return None
            framed.append(found)
        return [frame.typed(self.options, self.registry) for frame in framed]

    def _frame(
        self, table: Table, messages: Int64s, body: Int64s, limits: Int64s
    ) -> _Framed | None:
        found = self._read(table, messages, body, limits)
        if found is None:
            return None
        ops, marker, has_old, two, framing, second = found
        width = len(table.columns)
        count = len(messages)
        new_parts = [(np.flatnonzero(~has_old), framing, np.flatnonzero(~has_old))]
        if second is not None:
            new_parts.append((np.flatnonzero(two), second, np.arange(int(two.sum()))))
        new = _select(count, width, new_parts)
        new_strings = columnar.text_columns(new)
        if new_strings is None:
            return None
        old: tuple[columnar.Framing, list[pa.Array | None]] | None = None
        if bool(has_old.any()):
            old_rows = np.flatnonzero(has_old)
            old_framing = _select(count, width, [(old_rows, framing, old_rows)])
            old_strings = columnar.text_columns(old_framing)
            if old_strings is None:
                return None
            old = (old_framing, old_strings)
        return _Framed(table, messages, ops, marker == _KEY, (new, new_strings), old)

    def _read(self, table: Table, messages: Int64s, body: Int64s, limits: Int64s) -> _Read | None:
        """The markers and the framing of the tuples of one table's ``messages``, checked as
        decode_one checks them; None when any is unusual."""
        u8 = self.buffer.u8
        ops = self.first[messages]
        marker = u8[body + 4]
        is_new = marker == _NEW
        has_old = (marker == _KEY) | (marker == _OLD)
        valid = np.where(
            ops == _INSERT, is_new, np.where(ops == _DELETE, has_old, is_new | has_old)
        )
        if not bool(valid.all()):
            return None
        width = len(table.columns)
        framing = columnar.frame_tuples(self.buffer, body + 5, limits, width)
        if framing is None:
            return None
        two = (ops == _UPDATE) & has_old
        ends = framing.ends
        if bool((ends[~two] != limits[~two]).any()):
            return None
        second: columnar.Framing | None = None
        if bool(two.any()):
            after = ends[two]
            if bool((after >= limits[two]).any()) or bool((u8[after] != _NEW).any()):
                return None
            second = columnar.frame_tuples(self.buffer, after + 1, limits[two], width)
            if second is None or bool((second.ends != limits[two]).any()):
                return None
        return ops, marker, has_old, two, framing, second

    def events(self, messages: Int64s, lsns: Sequence[LSN]) -> list[Event] | None:
        """The events decode_one (lazy rows) gives for ``messages`` (Insert/Update/Delete,
        in order), their framing checked for all at once; None when any is unusual."""
        u32 = self.buffer.view(">u4")
        streaming = self.decoder.state.stream_xid is not None
        body = self.starts[messages] + (5 if streaming else 1)
        limits = self.ends[messages]
        if bool((body + 5 > limits).any()):
            return None
        oids = u32[body]
        count = len(messages)
        # Per message: its table's number, the first tuple's range, the second's (updates
        # with an old tuple: the new one), as plain lists for the loop that builds events.
        table_of = np.zeros(count, np.int64)
        first_end = np.zeros(count, np.int64)
        second_start = np.full(count, -1, np.int64)
        relations = self.decoder.state.relations
        tables: list[Table] = []
        for oid in dict.fromkeys(oids.tolist()):
            table = relations.get(oid)
            if table is None:
                return None
            rows = np.flatnonzero(oids == oid)
            found = self._read(table, messages[rows], body[rows], limits[rows])
            if found is None:
                return None
            _, _, _, two, framing, second = found
            if columnar.text_columns(framing) is None:
                return None
            if second is not None and columnar.text_columns(second) is None:
                return None
            table_of[rows] = len(tables)
            tables.append(table)
            first_end[rows] = framing.ends
            second_start[rows[two]] = framing.ends[two] + 1
        data = self.buffer.data
        xids = u32[self.starts[messages] + 1].tolist() if streaming else [None] * count
        out: list[Event] = []
        append = out.append
        for index, op, marker, table_number, start, end, second, limit, xid in zip(
            messages.tolist(),
            self.first[messages].tolist(),
            self.buffer.u8[body + 4].tolist(),
            table_of.tolist(),
            (body + 5).tolist(),
            first_end.tolist(),
            second_start.tolist(),
            limits.tolist(),
            xids,
            strict=True,
        ):
            table = tables[table_number]
            row = _encoded(data[start:end], None)
            event: Event
            if op == _INSERT:
                event = _new_insert(lsns[index], table, row, xid)
            elif op == _DELETE:
                event = _new_delete(lsns[index], table, row, marker == _KEY, xid)
            else:
                old, new = (row, _encoded(data[second:limit], None)) if second >= 0 else (None, row)
                event = _new_update(lsns[index], table, new, old, marker == _KEY, xid)
            append(event)
        return out


_Read = tuple[
    npt.NDArray[np.uint8],  # operation codes
    npt.NDArray[np.uint8],  # tuple markers (N, K, O)
    npt.NDArray[np.bool_],  # has an old tuple
    npt.NDArray[np.bool_],  # an update with old and new tuples
    columnar.Framing,  # the first tuple of each message
    columnar.Framing | None,  # the new tuple of the updates with two
]

_encoded = new_encoded_row
_new_insert = builder(Insert)
_new_update = builder(Update)
_new_delete = builder(Delete)


def decode_many(
    decoder: PgOutputDecoder, payloads: Sequence[bytes | memoryview], lsns: Sequence[LSN]
) -> list[Event]:
    """``[decoder.decode_one(p, lsn) for p, lsn in zip(payloads, lsns)]``: the same events
    and the same errors, the framing of each long run of changes read with numpy at once
    instead of message by message in Python. As with ``decode_one``, the rows are left to
    their consumer to check."""
    count, buffer, first, starts, ends, change, passive = _frame(payloads, lsns)
    run = _Run(decoder, buffer, first, starts, ends, registry_for(None), DEFAULT_OPTIONS)
    events: list[Event] = []
    region_start = 0
    for index in [*np.flatnonzero(~(change | passive)).tolist(), count]:
        if index > region_start:
            region = np.arange(region_start, index, dtype=np.int64)
            found = _region_events(run, (payloads, lsns), region, change[region_start:index])
            if found is None:
                found = [decoder.decode_one(payloads[i], lsns[i]) for i in region.tolist()]
            events.extend(found)
        if index < count:
            events.append(decoder.decode_one(payloads[index], lsns[index]))
        region_start = index + 1
    return events


def _region_events(
    run: _Run,
    messages: tuple[Sequence[bytes | memoryview], Sequence[LSN]],
    region: Int64s,
    is_change: npt.NDArray[np.bool_],
) -> list[Event] | None:
    if int(np.count_nonzero(is_change)) < MIN_COLUMNAR_RUN:
        return None
    payloads, lsns = messages
    try:
        others = {
            index: run.decoder.decode_one(payloads[index], lsns[index])
            for index in region[~is_change].tolist()
        }
    except DecodeError:
        return None
    changes = run.events(region[is_change], lsns)
    if changes is None:
        return None
    found = iter(changes)
    return [others[index] if index in others else next(found) for index in region.tolist()]


@dataclass(frozen=True, slots=True)
class _Framed:
    """One table's changes of a run, read and checked, not yet converted."""

    table: Table
    messages: Int64s
    ops: npt.NDArray[np.uint8]
    old_is_key: npt.NDArray[np.bool_]
    new: tuple[columnar.Framing, list[pa.Array | None]]
    old: tuple[columnar.Framing, list[pa.Array | None]] | None

    def typed(self, options: ArrowOptions, registry: TypeRegistry) -> ChangeBatch:
        table = self.table
        new = framed_to_arrow(table, *self.new, options, registry)
        old = None if self.old is None else framed_to_arrow(table, *self.old, options, registry)
        return ChangeBatch(table, self.messages, _op_strings(self.ops), new, old, self.old_is_key)


def _op_strings(ops: npt.NDArray[np.uint8]) -> pa.Array:
    """The one-letter operation codes as an Arrow string array, without a str per change."""
    offsets = np.arange(len(ops) + 1, dtype=np.int32)
    return pa.Array.from_buffers(
        pa.string(), len(ops), [None, pa.py_buffer(offsets), pa.py_buffer(ops.tobytes())]
    )


def _select(
    count: int, width: int, parts: list[tuple[Int64s, columnar.Framing, Int64s]]
) -> columnar.Framing:
    """One framing of ``count`` rows: row ``rows[i]`` from row ``taken[i]`` of a part's
    framing, for each (rows, framing, taken) part; NULL everywhere else."""
    if len(parts) == 1 and len(parts[0][0]) == count:  # every row, in order: as it is
        return parts[0][1]
    buffer = parts[0][1].columns[0].buffer if width else None
    views = []
    for k in range(width):
        kinds = np.full(count, KIND_NULL, np.uint8)
        starts = np.zeros(count, np.int64)
        lengths = np.zeros(count, np.int64)
        for rows, framing, taken in parts:
            view = framing.columns[k]
            kinds[rows] = view.kinds[taken]
            starts[rows] = view.starts[taken]
            lengths[rows] = view.lengths[taken]
        assert buffer is not None
        views.append(columnar.ColumnView(buffer, kinds, starts, lengths))
    return columnar.Framing(tuple(views), np.zeros(count, np.int64))


def _one_by_one(
    decoder: PgOutputDecoder,
    messages: tuple[Sequence[bytes | memoryview], Sequence[LSN]],
    region: Int64s,
    *,
    registry: TypeRegistry,
    options: ArrowOptions,
) -> Region:
    """The region through ``decode_one`` and ``rows_to_arrow``: the reference path, and the
    one that raises the typed error naming the message that is wrong (the first in message
    order, be it a message ``decode_one`` refuses or a row it leaves unchecked)."""
    groups: dict[int, tuple[Table, list[int], list[str], list[Row | None], list[Row | None]]] = {}
    keys: dict[int, list[bool]] = {}
    events: list[tuple[int, Event]] = []
    payloads, lsns = messages
    decoded: list[tuple[int, Event]] = []
    refused: DecodeError | None = None
    for index in region.tolist():
        try:
            decoded.append((index, decoder.decode_one(payloads[index], lsns[index])))
        except DecodeError as exc:
            refused = exc
            break
    _check_rows(decoder, messages, decoded)
    if refused is not None:
        raise refused
    for index, event in decoded:
        if not isinstance(event, (Insert, Update, Delete)):
            events.append((index, event))
            continue
        group = groups.setdefault(id(event.table), (event.table, [], [], [], []))
        key = keys.setdefault(id(event.table), [])
        group[1].append(index)
        if isinstance(event, Insert):
            group[2].append("I")
            group[3].append(event.new)
            group[4].append(None)
            key.append(False)
        elif isinstance(event, Update):
            group[2].append("U")
            group[3].append(event.new)
            group[4].append(event.old)
            key.append(event.old is not None and event.old_is_key)
        else:
            group[2].append("D")
            group[3].append(None)
            group[4].append(event.old)
            key.append(event.old_is_key)
    batches = []
    for table_id, (table, positions, ops, news, olds) in groups.items():
        nulls: Row = (None,) * len(table.columns)
        new_rows = [r if r is not None else nulls for r in news]
        new = rows_to_arrow(table, new_rows, options, registry)
        old = None
        if any(r is not None for r in olds):
            old_rows = [r if r is not None else nulls for r in olds]
            old = rows_to_arrow(table, old_rows, options, registry)
        batches.append(
            ChangeBatch(
                table,
                np.array(positions, np.int64),
                pa.array(ops, pa.string()),
                new,
                old,
                np.array(keys[table_id], np.bool_),
            )
        )
    return events, batches


_CHECK_BYTES = 1 << 30


def _check_rows(
    decoder: PgOutputDecoder,
    messages: tuple[Sequence[bytes | memoryview], Sequence[LSN]],
    decoded: list[tuple[int, Event]],
) -> None:
    """Raise the DecodeError of the first row of the ``decoded`` changes (message indexes and
    events) that cannot be read, naming its message. ``decode_one`` leaves rows to their
    consumer; this checks all of them at once, with UTF-8 as strict as a server's."""
    owners: list[int] = []
    datas: list[bytes] = []
    for index, event in decoded:
        if type(event) is Insert:
            rows: tuple[Row | None, ...] = (event.new,)
        elif type(event) is Update:
            rows = (event.old, event.new)
        elif type(event) is Delete:
            rows = (event.old,)
        else:
            continue
        for row in rows:
            if type(row) is EncodedRow:
                owners.append(index)
                datas.append(row.data)
    start = 0
    while start < len(datas):
        # Arrow's binary arrays hold up to 2 GiB: check the rows in slices below that.
        stop, size = start, 0
        while stop < len(datas) and (stop == start or size + len(datas[stop]) < _CHECK_BYTES):
            size += len(datas[stop])
            stop += 1
        found = columnar.first_unreadable_row(pa.array(datas[start:stop], pa.binary()), "strict")
        if found is not None:
            row_index, reason = found
            index = owners[start + row_index]
            payloads, lsns = messages
            raise decoder._malformed(payloads[index], lsns[index], reason)
        start = stop
