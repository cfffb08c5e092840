"""openGauss's mppdb_decoding output plugin: options, the binary record format, heartbeats and
the sending-batch framing, built from openGauss's documentation of its logical decoding options
(no openGauss server runs here; see docs/opengauss.md for what is and is not verified).

A binary batch (decode-style 'b') is a run of records, each framed as::

    uint32 length   bytes from the LSN up to (not including) the separator; 0 ends the batch
    uint64 lsn      B: first_lsn, C: end_lsn, I/U/D: the change's own LSN
    char   kind     B C I U D, then the kind's fields (below)
    char   sep      'P' another record follows, 'F' the batch is complete

    B: uint64 csn, uint64 first_lsn, ['T' uint32 n, commit time text], ['N' uint32 n, user name]
    C: ['X' uint64 xid], ['T' uint32 n, commit time text]
    I/U/D: uint16 n, schema, uint16 n, table, ['N' tuple] ['O' tuple]   (new tuple first)
    tuple: uint16 attrnum, then per column: uint16 n, name, uint32 type OID,
           uint32 n (0xFFFFFFFF for NULL), value in text form

All integers are big-endian. A heartbeat is 'h', uint64 LSN (or CSN), uint64 LSN (or CSN),
int64 time since 1970, then 'F' in binary style, a zero uint32 in batched text/JSON style, and
nothing otherwise.
"""

from __future__ import annotations

import enum
import re
import struct
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime, timedelta, timezone
from typing import Literal

from pgcdc.errors import DecodeError, InvalidOption, InvalidTablePattern, UnsupportedFeature
from pgcdc.events import (
    EMPTY_ROW,
    Begin,
    Column,
    Commit,
    Delete,
    EncodedRow,
    Event,
    Heartbeat,
    Insert,
    RawValue,
    Relation,
    Row,
    Table,
    Update,
)
from pgcdc.lsn import LSN

__all__ = [
    "DecodeStyle",
    "MppdbDecoder",
    "MppdbOptions",
    "MppdbState",
    "TablePatterns",
    "parse_heartbeat",
    "parse_table_patterns",
    "split_sending_batch",
]

_U16 = struct.Struct(">H")
_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")
_HEARTBEAT = struct.Struct(">QQq")
_NULL_LENGTH = 0xFFFFFFFF
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_TIME_UNITS = {"s": 1_000_000, "ms": 1_000, "us": 1}
_TIMESTAMP = re.compile(
    r"(?P<date>\d{4,}-\d\d-\d\d)[ T](?P<time>\d\d:\d\d:\d\d)(?:\.(?P<fraction>\d{1,6}))?"
    r"(?P<sign>[+-])(?P<tzh>\d\d)(?::?(?P<tzm>\d\d))?(?::(?P<tzs>\d\d))?"
)


# --- white-table-list ------------------------------------------------------------------------

_ANY = "*"


@dataclass(frozen=True, slots=True)
class TablePatterns:
    """A parsed white-table-list: ``(schema, table)`` entries, ``None`` standing for ``*``.

    openGauss's grammar: ``schema.table`` entries joined by ',', no whitespace anywhere, ``*``
    for any whole schema or table name. Names compare exactly (case-sensitive), as stored.
    """

    entries: tuple[tuple[str | None, str | None], ...]

    def matches(self, schema: str, table: str) -> bool:
        return any(
            (s is None or s == schema) and (t is None or t == table) for s, t in self.entries
        )

    def __str__(self) -> str:
        return ",".join(f"{s or _ANY}.{t or _ANY}" for s, t in self.entries)


def parse_table_patterns(text: str) -> TablePatterns:
    """Parse a white-table-list; InvalidTablePattern says which entry is wrong and why.

    ``*`` stands for a whole name only: openGauss documents no partial wildcards, and giving
    ``t*`` a meaning openGauss does not would select tables the user did not ask for.
    """
    if not text:
        raise InvalidTablePattern(
            "white-table-list is empty; list tables as schema.table joined by ',' "
            "(e.g. 'public.t1,*.t3,my_schema.*'), or leave the option out to keep every table"
        )
    if any(ch.isspace() for ch in text):
        raise InvalidTablePattern(
            f"white-table-list {text!r} contains whitespace, which openGauss does not allow; "
            "write schema.table entries joined by ',' with no spaces"
        )
    entries: list[tuple[str | None, str | None]] = []
    for entry in text.split(","):
        parts = entry.split(".")
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise InvalidTablePattern(
                f"white-table-list entry {entry!r} (in {text!r}) is not schema.table; write "
                "exactly one '.' between a schema and a table name, '*' for any name"
            )
        for part in parts:
            if _ANY in part and part != _ANY:
                raise InvalidTablePattern(
                    f"white-table-list entry {entry!r} uses '*' inside a name; '*' stands only "
                    "for a whole schema or table name (e.g. 'app.*' or '*.orders')"
                )
        entries.append(tuple(None if p == _ANY else p for p in parts))  # type: ignore[arg-type]
    return TablePatterns(tuple(entries))


# --- options ---------------------------------------------------------------------------------


class DecodeStyle(enum.Enum):
    """decode-style: how parallel decoding formats its output."""

    JSON = "j"
    TEXT = "t"
    BINARY = "b"


_INT_MAX = 2_147_483_647


@dataclass(frozen=True)
class MppdbOptions:
    """mppdb_decoding's options, validated against the ranges openGauss documents.

    ``None`` means "leave the option out" (the server default applies). ``to_pairs()`` gives
    the (name, value) pairs for START_REPLICATION or pg_logical_slot_get_changes(); only options
    that differ from openGauss's defaults are sent, since some (the parallel-decoding and
    CSN-order ones) are refused unless their mode is on.
    """

    include_xids: bool = True
    skip_empty_xacts: bool = False
    include_timestamp: bool = False
    only_local: bool = True
    white_table_list: str | None = None
    max_txn_in_memory: int = 0  # MB, 0..100, 0 = off
    max_reorderbuffer_in_memory: int = 0  # GB, 0..100, 0 = off
    include_user: bool = False
    exclude_userids: tuple[int, ...] = ()  # SQL functions only
    exclude_users: tuple[str, ...] = ()
    dynamic_resolution: bool = True
    standby_connection: bool = False  # SQL functions only (as documented)
    sender_timeout: int | None = None  # ms, 0..2147483647; None = logical_sender_timeout
    enable_heartbeat: bool = False
    parallel_decode_num: int = 1
    output_order: int = 0  # 0 commit-LSN order, 1 CSN order
    auto_advance: bool = False
    skip_generated_columns: bool = False  # SQL functions only
    # CSN-order options (output_order=1 only)
    logical_receiver_num: int = 1  # 1..20
    slice_id: int = -1  # 0..8192, -1 = not given
    # parallel-decoding options (parallel_decode_num > 1 only)
    sending_batch: int = 0  # 0 or 1
    decode_style: DecodeStyle = DecodeStyle.BINARY
    white_table_patterns: TablePatterns | None = field(init=False, default=None, compare=False)

    def __post_init__(self) -> None:
        for flag in ("include_xids", "skip_empty_xacts", "include_timestamp", "only_local",
                     "include_user", "dynamic_resolution", "standby_connection",
                     "enable_heartbeat", "auto_advance", "skip_generated_columns"):  # fmt: skip
            if not isinstance(getattr(self, flag), bool):
                _invalid(flag, getattr(self, flag), "true or false")
        _check_range("max_txn_in_memory", self.max_txn_in_memory, 0, 100, "MB; 0 turns it off")
        _check_range(
            "max_reorderbuffer_in_memory",
            self.max_reorderbuffer_in_memory,
            0,
            100,
            "GB; 0 turns it off",
        )
        if self.sender_timeout is not None:
            _check_range("sender_timeout", self.sender_timeout, 0, _INT_MAX, "milliseconds")
        _check_range(
            "parallel_decode_num", self.parallel_decode_num, 1, _INT_MAX, "1 decodes serially"
        )
        _check_range("output_order", self.output_order, 0, 1, "1 orders by CSN")
        _check_range("logical_receiver_num", self.logical_receiver_num, 1, 20, "receivers")
        if self.slice_id != -1:
            _check_range("slice_id", self.slice_id, 0, 8192, "-1 leaves it unset")
        _check_range("sending_batch", self.sending_batch, 0, 1, "1 sends in batches")
        if not isinstance(self.decode_style, DecodeStyle):
            _invalid("decode_style", self.decode_style, "DecodeStyle.JSON, TEXT or BINARY")
        for oid in self.exclude_userids:
            _check_range("exclude_userids", oid, 0, 0xFFFFFFFF, "user OIDs")
        for name in self.exclude_users:
            if not isinstance(name, str) or not name or "," in name:
                _invalid("exclude_users", name, "non-empty user names without ','")
        if self.parallel_decode_num == 1 and (
            self.sending_batch != 0 or self.decode_style is not DecodeStyle.BINARY
        ):
            raise InvalidOption(
                "sending_batch and decode_style are parallel-decoding options, which openGauss "
                "refuses while parallel_decode_num is 1; set parallel_decode_num > 1 or drop them"
            )
        if self.output_order == 0 and (self.logical_receiver_num != 1 or self.slice_id != -1):
            raise InvalidOption(
                "logical_receiver_num and slice_id are CSN-order options, which openGauss "
                "refuses while output_order is 0; set output_order=1 or drop them"
            )
        if self.white_table_list is not None:
            object.__setattr__(
                self, "white_table_patterns", parse_table_patterns(self.white_table_list)
            )

    def to_pairs(self) -> list[tuple[str, str]]:
        """(option name, value) pairs for the options that differ from openGauss's defaults."""
        defaults = MppdbOptions()
        pairs: list[tuple[str, str]] = []
        for f in fields(self):
            if not f.init:
                continue
            value = getattr(self, f.name)
            if value == getattr(defaults, f.name):
                continue
            name = f.name.replace("_", "-")
            if isinstance(value, bool):
                text = ("true" if value else "false") if f.name in _BOOL_WORDS else str(int(value))
            elif isinstance(value, DecodeStyle):
                text = value.value
            elif isinstance(value, tuple):
                text = ",".join(str(v) for v in value)
            else:
                text = str(value)
            pairs.append((name, text))
        return pairs


# Options openGauss documents as bool (true/false) rather than 0/1.
_BOOL_WORDS = frozenset(
    {"standby_connection", "enable_heartbeat", "auto_advance", "skip_generated_columns",
     "dynamic_resolution"}
)  # fmt: skip


def _invalid(name: str, value: object, accepted: str) -> None:
    raise InvalidOption(f"mppdb_decoding option {name}={value!r} is invalid; it accepts {accepted}")


def _check_range(name: str, value: object, low: int, high: int, unit: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        _invalid(name, value, f"an integer from {low} to {high} ({unit})")


# --- decoding --------------------------------------------------------------------------------


@dataclass
class MppdbState:
    """Column lists last seen per (schema, table), so a Relation is sent only on change."""

    tables: dict[tuple[str, str], Table] = field(default_factory=dict)


class MppdbDecoder:
    """Decodes binary-style (decode-style 'b') mppdb_decoding payloads into events.

    Each event's ``lsn`` is its record's own LSN (several records share one payload). Begin
    carries the CSN, first LSN and commit time; the xid only comes with the commit ('X'), so
    Begin.xid is None. Commit uses the record's LSN (the commit's end) as commit_lsn and end_lsn.
    Tables have OID 0 and no key flags; column type OIDs come from the tuples.

    ``heartbeat_time_unit``: openGauss documents the heartbeat time as an int64 counted from
    1970 without naming the unit; microseconds (PostgreSQL's timestamp resolution) by default.
    """

    def __init__(
        self,
        state: MppdbState | None = None,
        *,
        encoding: str = "utf-8",
        heartbeat_time_unit: Literal["s", "ms", "us"] = "us",
        decode_style: DecodeStyle = DecodeStyle.BINARY,
    ) -> None:
        if decode_style is not DecodeStyle.BINARY:
            raise UnsupportedFeature(
                f"mppdb_decoding's {decode_style.name.lower()} style has no documented record "
                "layout to decode into events; use decode-style 'b', or split_sending_batch() "
                "to get each (lsn, text) record of a text or JSON batch"
            )
        if heartbeat_time_unit not in _TIME_UNITS:
            raise InvalidOption(
                f"heartbeat_time_unit={heartbeat_time_unit!r}; use 's', 'ms' or 'us'"
            )
        self._state = state if state is not None else MppdbState()
        self.encoding = encoding
        self.heartbeat_time_unit = heartbeat_time_unit

    @property
    def state(self) -> MppdbState:
        return self._state

    def decode(self, payload: bytes, lsn: LSN) -> list[Event]:
        if payload[:1] == b"h":
            return [parse_heartbeat(payload, terminator=b"F", time_unit=self.heartbeat_time_unit)]
        reader = _Reader(payload, lsn)
        events: list[Event] = []
        while True:
            length = reader.u32("record length")
            if length == 0:
                reader.end()
                return events
            end = reader.pos + length
            if end > len(payload):
                raise reader.error(f"record of {length} bytes runs past the payload's end")
            events.extend(self._record(reader, end))
            if reader.pos != end:
                raise reader.error(f"record ends at byte {reader.pos}, its length says {end}")
            separator = reader.take(1, "separator")
            if separator == b"F":
                if reader.pos != len(payload) and reader.rest() != b"\0\0\0\0":
                    raise reader.error("bytes after the batch's final 'F'")
                return events
            if separator != b"P":
                raise reader.error(f"separator {separator!r}, expected 'P' or 'F'")

    def _record(self, reader: _Reader, end: int) -> list[Event]:
        lsn = LSN(reader.u64("record LSN"))
        kind = reader.take(1, "record kind")
        if kind == b"B":
            csn = reader.u64("CSN")
            first_lsn = LSN(reader.u64("first LSN"))
            when = self._optional_time(reader, end)
            if reader.pos < end and reader.peek() == b"N":
                reader.pos += 1
                reader.text(reader.u32("user name length"), "user name", self.encoding)
            return [Begin(lsn, None, None, when, csn=csn, first_lsn=first_lsn)]
        if kind == b"C":
            xid = None
            if reader.pos < end and reader.peek() == b"X":
                reader.pos += 1
                xid = reader.u64("xid")
            when = self._optional_time(reader, end)
            return [Commit(lsn, lsn, lsn, when, xid)]
        if kind not in (b"I", b"U", b"D"):
            raise reader.error(f"record kind {kind!r}, expected B, C, I, U or D")
        schema = reader.text(reader.u16("schema length"), "schema", self.encoding)
        name = reader.text(reader.u16("table length"), "table", self.encoding)
        tuples: dict[bytes, tuple[list[Column], list[RawValue]]] = {}
        while reader.pos < end and reader.peek() in (b"N", b"O"):
            marker = reader.take(1, "tuple marker")
            if marker in tuples or (marker == b"N" and b"O" in tuples):
                raise reader.error(f"unexpected {marker.decode()} tuple (new comes first, once)")
            tuples[marker] = self._tuple(reader)
        events: list[Event] = []
        new = tuples.get(b"N")
        old = tuples.get(b"O")
        if kind == b"D":
            if new is not None:
                raise reader.error("DELETE with a new tuple")
            table = self._state.tables.get((schema, name)) or Table(schema, name, ())
            if old is None:
                return [Delete(lsn, table, EMPTY_ROW)]
            table, old_row, is_key = self._old_row(schema, name, *old)
            return [Delete(lsn, table, EncodedRow.from_values(old_row), old_is_key=is_key)]
        if kind == b"I" and old is not None:
            raise reader.error("INSERT with an old tuple")
        if new is None:
            table = self._state.tables.get((schema, name)) or Table(schema, name, ())
            new_row: Row = ()
        else:
            table = Table(schema, name, tuple(new[0]))
            if self._state.tables.get((schema, name)) != table:
                self._state.tables[(schema, name)] = table
                events.append(Relation(lsn, table))
            new_row = tuple(new[1])
        if kind == b"I":
            events.append(Insert(lsn, table, EncodedRow.from_values(new_row)))
            return events
        if old is None:
            events.append(Update(lsn, table, EncodedRow.from_values(new_row)))
            return events
        if not table.columns:
            table, old_row, is_key = self._old_row(schema, name, *old)
        else:
            old_row = _widen(table, *old, reader)
            is_key = len(old[0]) < len(table.columns)
        events.append(
            Update(
                lsn, table, EncodedRow.from_values(new_row), EncodedRow.from_values(old_row), is_key
            )
        )
        return events

    def _old_row(
        self, schema: str, name: str, columns: list[Column], values: list[RawValue]
    ) -> tuple[Table, Row, bool]:
        known = self._state.tables.get((schema, name))
        if known is not None:
            try:
                return (
                    known,
                    _widen(known, columns, values, None),
                    len(columns) < len(known.columns),
                )
            except DecodeError:
                pass
        return Table(schema, name, tuple(columns)), tuple(values), True

    def _tuple(self, reader: _Reader) -> tuple[list[Column], list[RawValue]]:
        count = reader.u16("column count")
        columns: list[Column] = []
        values: list[RawValue] = []
        seen: set[str] = set()
        for _ in range(count):
            column_name = reader.text(
                reader.u16("column name length"), "column name", self.encoding
            )
            if column_name in seen:
                raise reader.error(f"column {column_name!r} appears twice in one tuple")
            seen.add(column_name)
            type_oid = reader.u32("type OID")
            length = reader.u32("value length")
            value = None if length == _NULL_LENGTH else reader.text(length, "value", self.encoding)
            columns.append(Column(column_name, type_oid))
            values.append(value)
        return columns, values

    def _optional_time(self, reader: _Reader, end: int) -> datetime | None:
        if reader.pos < end and reader.peek() == b"T":
            reader.pos += 1
            return _parse_time(reader.text(reader.u32("time length"), "time", "ascii"), reader)
        return None


def _widen(
    table: Table, columns: list[Column], values: list[RawValue], reader: _Reader | None
) -> Row:
    """Place an old tuple's values in the table's columns; absent columns are None."""
    positions = {c.name: i for i, c in enumerate(table.columns)}
    row: list[RawValue] = [None] * len(table.columns)
    for column, value in zip(columns, values, strict=True):
        index = positions.get(column.name)
        if index is None or table.columns[index].type_oid != column.type_oid:
            message = f"old tuple column {column.name!r} is not a column of {table.qualified_name}"
            raise reader.error(message) if reader else DecodeError(message)
        row[index] = value
    return tuple(row)


def _parse_time(text: str, reader: _Reader) -> datetime:
    m = _TIMESTAMP.fullmatch(text)
    if m is None:
        raise reader.error(f"unreadable timestamp {text!r}")
    offset = timedelta(hours=int(m["tzh"]), minutes=int(m["tzm"] or 0), seconds=int(m["tzs"] or 0))
    try:
        naive = datetime.fromisoformat(f"{m['date']} {m['time']}")
        fraction = int((m["fraction"] or "0").ljust(6, "0"))
        return naive.replace(
            microsecond=fraction, tzinfo=timezone(-offset if m["sign"] == "-" else offset)
        )
    except ValueError as exc:
        raise reader.error(f"timestamp {text!r} out of range: {exc}") from None


def parse_heartbeat(
    payload: bytes, *, terminator: bytes = b"F", time_unit: Literal["s", "ms", "us"] = "us"
) -> Heartbeat:
    """An 'h' record: Heartbeat at its first position, timed by its int64 since 1970.

    ``terminator`` is b"F" in binary style, b"\\0\\0\\0\\0" for batched text/JSON, b"" otherwise.
    The second position (the flushed WAL, or the next CSN) has no field in Heartbeat.
    """
    reader = _Reader(payload, LSN(0))
    if reader.take(1, "heartbeat marker") != b"h":
        raise reader.error("not a heartbeat (no leading 'h')")
    position, _flushed, stamp = _HEARTBEAT.unpack(reader.take(_HEARTBEAT.size, "heartbeat"))
    if reader.take(len(terminator), "heartbeat terminator") != terminator:
        raise reader.error(f"heartbeat does not end with {terminator!r}")
    reader.end()
    try:
        when = _EPOCH + timedelta(microseconds=stamp * _TIME_UNITS[time_unit])
    except OverflowError:
        raise reader.error(f"heartbeat time {stamp} ({time_unit}) is out of range") from None
    return Heartbeat(LSN(position), when)


def split_sending_batch(payload: bytes) -> list[tuple[LSN, bytes] | Heartbeat]:
    """Split a text- or JSON-style batch (sending-batch=1) into its (lsn, record text) parts.

    Each record is uint32 length (counting the LSN and text that follow it), uint64 LSN, text;
    a zero length ends the batch. A heartbeat comes alone, 'h' ... ending in a zero uint32.
    """
    if payload[:1] == b"h":
        return [parse_heartbeat(payload, terminator=b"\0\0\0\0")]
    reader = _Reader(payload, LSN(0))
    parts: list[tuple[LSN, bytes] | Heartbeat] = []
    while True:
        length = reader.u32("record length")
        if length == 0:
            reader.end()
            return parts
        if length < _U64.size:
            raise reader.error(f"record length {length} is shorter than its LSN")
        record_lsn = LSN(reader.u64("record LSN"))
        parts.append((record_lsn, reader.take(length - _U64.size, "record text")))


class _Reader:
    """Big-endian reads over one payload; every shortfall is a DecodeError naming the field."""

    def __init__(self, data: bytes, lsn: LSN) -> None:
        self.data = data
        self.pos = 0
        self.lsn = lsn

    def error(self, message: str) -> DecodeError:
        return DecodeError(f"malformed mppdb_decoding payload at {self.lsn}: {message}")

    def take(self, size: int, what: str) -> bytes:
        end = self.pos + size
        if end > len(self.data):
            raise self.error(
                f"truncated: {what} needs {size} bytes at offset {self.pos}, "
                f"{len(self.data) - self.pos} left"
            )
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def peek(self) -> bytes:
        return self.data[self.pos : self.pos + 1]

    def rest(self) -> bytes:
        return self.data[self.pos :]

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self.error(f"{len(self.data) - self.pos} unexpected bytes after the batch end")

    def u16(self, what: str) -> int:
        value: int = _U16.unpack(self.take(2, what))[0]
        return value

    def u32(self, what: str) -> int:
        value: int = _U32.unpack(self.take(4, what))[0]
        return value

    def u64(self, what: str) -> int:
        value: int = _U64.unpack(self.take(8, what))[0]
        return value

    def text(self, size: int, what: str, encoding: str) -> str:
        raw = self.take(size, what)
        try:
            return raw.decode(encoding)
        except UnicodeDecodeError as exc:
            raise self.error(f"{what} is not valid {encoding}: {exc}") from None
