"""The test_decoding output plugin: its text lines in, ``pgcdc.events`` out, and back again.

test_decoding (contrib/test_decoding) prints one line per callback, e.g.::

    BEGIN 754
    table public.t: INSERT: id[integer]:1 name[text]:'it''s'
    COMMIT 754 (at 2026-11-22 01:43:17.328752+00)

What the lines cannot tell, and what pgcdc does about it:

- No LSNs: BEGIN, COMMIT and PREPARE carry none, so every event takes the line's own LSN (the
  ``lsn`` column of the SQL interface, the XLogData start of pg_recvlogical). For COMMIT that is
  the end of the commit record, and it is used as both ``commit_lsn`` and ``end_lsn``.
- No table OIDs and no key flags: a ``Table`` is keyed by its qualified name, has ``oid`` 0 and
  every column ``is_key=False``. A ``Relation`` event is emitted before an INSERT or UPDATE whose
  new tuple shows a column list (names and types) different from the one last seen for that name;
  old-key tuples never define a table, because they show only some columns.
- Type names, not OIDs: ``format_type_be`` spellings are mapped with ``pgtypes.BY_SQL_NAME``
  (typmods stripped when present; real servers never print them); unknown names get OID 0, and
  ``Column.type_name`` always keeps the exact spelling so the line can be reproduced.
- Old rows: ``old-key:`` is printed for both a replica identity key and a REPLICA IDENTITY FULL
  row, and NULL columns are left out of it. Old rows are widened to the table, absent columns
  are ``None``, and ``old_is_key`` is True unless every column is present.
- A prepared transaction starts with a plain ``BEGIN``: it decodes to ``Begin`` ... ``Prepare``,
  never ``BeginPrepare``.
- Streamed transactions: test_decoding prints no row data for streamed changes, truncates or
  transactional messages; those lines raise ``MissingOutputData`` rather than lose the change.
- Without include-timestamp, lines carry no time: commit, prepare and rollback times are None.
  Without include-xids, events whose xid is mandatory (StreamStart, Prepare, CommitPrepared,
  ...) raise ``MissingOutputData``: a transaction id cannot be made up.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from pgcdc.decoding.pgtypes import BY_NAME, BY_OID, BY_SQL_NAME
from pgcdc.errors import DecodeError, MissingOutputData
from pgcdc.events import (
    EMPTY_ROW,
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    EncodedRow,
    Event,
    Insert,
    Message,
    Prepare,
    RawValue,
    Relation,
    RollbackPrepared,
    Row,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Table,
    Truncate,
    Update,
)
from pgcdc.lsn import LSN

__all__ = [
    "TestDecodingDecoder",
    "TestDecodingState",
    "column_for",
    "format_test_decoding",
    "quote_identifier",
]

# print_literal() in test_decoding.c prints these types bare, bit strings as B'...', booleans as
# true/false, and quotes everything else.
_BARE_TYPES = frozenset(
    {"smallint", "integer", "bigint", "oid", "real", "double precision", "numeric"}
)
_BIT_TYPES = frozenset({"bit", "bit varying"})
_BOOLEAN = "boolean"

_NULL = "null"
_TOAST = "unchanged-toast-datum"
_NO_TUPLE = "(no-tuple-data)"

# Keywords quote_identifier() quotes (every category but UNRESERVED), from pg_get_keywords() of
# PostgreSQL 18; the ones PostgreSQL 15 does not reserve are listed by the version that added them.
_RESERVED_KEYWORDS = frozenset(
    [
        "all",
        "analyse",
        "analyze",
        "and",
        "any",
        "array",
        "as",
        "asc",
        "asymmetric",
        "authorization",
        "between",
        "bigint",
        "binary",
        "bit",
        "boolean",
        "both",
        "case",
        "cast",
        "char",
        "character",
        "check",
        "coalesce",
        "collate",
        "collation",
        "column",
        "concurrently",
        "constraint",
        "create",
        "cross",
        "current_catalog",
        "current_date",
        "current_role",
        "current_schema",
        "current_time",
        "current_timestamp",
        "current_user",
        "dec",
        "decimal",
        "default",
        "deferrable",
        "desc",
        "distinct",
        "do",
        "else",
        "end",
        "except",
        "exists",
        "extract",
        "false",
        "fetch",
        "float",
        "for",
        "foreign",
        "freeze",
        "from",
        "full",
        "grant",
        "greatest",
        "group",
        "grouping",
        "having",
        "ilike",
        "in",
        "initially",
        "inner",
        "inout",
        "int",
        "integer",
        "intersect",
        "interval",
        "into",
        "is",
        "isnull",
        "join",
        "json",
        "json_array",
        "json_arrayagg",
        "json_exists",
        "json_object",
        "json_objectagg",
        "json_query",
        "json_scalar",
        "json_serialize",
        "json_table",
        "json_value",
        "lateral",
        "leading",
        "least",
        "left",
        "like",
        "limit",
        "localtime",
        "localtimestamp",
        "merge_action",
        "national",
        "natural",
        "nchar",
        "none",
        "normalize",
        "not",
        "notnull",
        "null",
        "nullif",
        "numeric",
        "offset",
        "on",
        "only",
        "or",
        "order",
        "out",
        "outer",
        "overlaps",
        "overlay",
        "placing",
        "position",
        "precision",
        "primary",
        "real",
        "references",
        "returning",
        "right",
        "row",
        "select",
        "session_user",
        "setof",
        "similar",
        "smallint",
        "some",
        "substring",
        "symmetric",
        "system_user",
        "table",
        "tablesample",
        "then",
        "time",
        "timestamp",
        "to",
        "trailing",
        "treat",
        "trim",
        "true",
        "union",
        "unique",
        "user",
        "using",
        "values",
        "varchar",
        "variadic",
        "verbose",
        "when",
        "where",
        "window",
        "with",
        "xmlattributes",
        "xmlconcat",
        "xmlelement",
        "xmlexists",
        "xmlforest",
        "xmlnamespaces",
        "xmlparse",
        "xmlpi",
        "xmlroot",
        "xmlserialize",
        "xmltable",
    ]
)
_KEYWORDS_ADDED_IN = {
    16: frozenset(
        ["json", "json_array", "json_arrayagg", "json_object", "json_objectagg", "system_user"]
    ),
    17: frozenset(
        [
            "json_exists",
            "json_query",
            "json_scalar",
            "json_serialize",
            "json_table",
            "json_value",
            "merge_action",
        ]
    ),
}
_SAFE_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]*")
_XID = r"(?P<xid>\d+)"
_AT = r"(?: \(at (?P<at>[^()]*)\))?"
_GID = r"(?P<gid>E?'(?:[^']|'')*')"
_TIMESTAMP = re.compile(
    r"(?P<year>\d{4,})-(?P<month>\d\d)-(?P<day>\d\d) (?P<hour>\d\d):(?P<minute>\d\d):"
    r"(?P<second>\d\d)(?:\.(?P<fraction>\d{1,6}))?"
    r"(?P<sign>[+-])(?P<tzh>\d\d)(?::(?P<tzm>\d\d))?(?::(?P<tzs>\d\d))?"
)

_BEGIN = re.compile(r"BEGIN(?: " + _XID + ")?")
_COMMIT = re.compile(r"COMMIT(?: " + _XID + ")?" + _AT)
_TWO_PHASE = re.compile(
    r"(?P<kind>PREPARE TRANSACTION|COMMIT PREPARED|ROLLBACK PREPARED) "
    + _GID
    + r"(?:, txid "
    + _XID
    + ")?"
    + _AT
)
_STREAM_START = re.compile(r"opening a streamed block for transaction(?: TXN " + _XID + ")?")
_STREAM_STOP = re.compile(r"closing a streamed block for transaction(?: TXN " + _XID + ")?")
_STREAM_CHANGE = re.compile(r"streaming (?:change|truncate) for (?:TXN " + _XID + "|transaction)")
_STREAM_ABORT = re.compile(r"aborting streamed \(sub\)transaction(?: TXN " + _XID + ")?")
_STREAM_COMMIT = re.compile(r"committing streamed transaction(?: TXN " + _XID + ")?" + _AT)
_STREAM_PREPARE = re.compile(
    r"preparing streamed transaction (?P<txn>TXN )?" + _GID + r"(?:, txid " + _XID + ")?" + _AT
)
_MESSAGE_HEAD = re.compile(
    rb"(?P<streaming>streaming )?message: transactional: (?P<tx>[01]) prefix: "
)
_MESSAGE_SIZE = re.compile(rb", sz: (?P<size>\d+)(?P<content> content:)?")


@dataclass
class TestDecodingState:
    """What decoding later lines needs from earlier ones. Plain data, so it pickles."""

    # Last full column list seen per (schema, table).
    tables: dict[tuple[str, str], Table] = field(default_factory=dict)
    # Streamed top-level transactions that started and have not committed or aborted.
    open_streams: set[int] = field(default_factory=set)
    # gid -> (LSN of its PREPARE line, prepare time or None without include-timestamp):
    # ROLLBACK PREPARED lines lack both.
    prepared: dict[str, tuple[LSN, datetime | None]] = field(default_factory=dict)


class TestDecodingDecoder:
    """Decodes test_decoding lines, one per payload, into events (see the module docstring).

    ``encoding`` is the database's server encoding: the replication stream is not converted.
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, state: TestDecodingState | None = None, *, encoding: str = "utf-8") -> None:
        self._state = state if state is not None else TestDecodingState()
        self.encoding = encoding

    @property
    def state(self) -> TestDecodingState:
        return self._state

    def decode(self, payload: bytes, lsn: LSN) -> list[Event]:
        if _MESSAGE_HEAD.match(payload):
            return [self._message(payload, lsn)]
        try:
            line = payload.decode(self.encoding)
        except UnicodeDecodeError as exc:
            raise DecodeError(
                f"test_decoding line at {lsn} is not valid {self.encoding}: {exc}; pass the "
                "database's server encoding to TestDecodingDecoder(encoding=...)"
            ) from None
        try:
            return self._line(line, lsn)
        except _Malformed as exc:
            raise DecodeError(
                f"malformed test_decoding line at {lsn}: {exc} in {_excerpt(line)}"
            ) from None

    # --- one line ---------------------------------------------------------------------------

    def _line(self, line: str, lsn: LSN) -> list[Event]:
        if line.startswith("table "):
            return self._table_line(line, lsn)
        if m := _BEGIN.fullmatch(line):
            return [Begin(lsn, _int(m["xid"]))]
        if m := _COMMIT.fullmatch(line):
            return [Commit(lsn, lsn, lsn, _time(m["at"]), _int(m["xid"]))]
        if m := _TWO_PHASE.fullmatch(line):
            return [self._two_phase(m, lsn, line)]
        if m := _STREAM_START.fullmatch(line):
            xid = _need_xid(m, line)
            first = xid not in self._state.open_streams
            self._state.open_streams.add(xid)
            return [StreamStart(lsn, xid, first)]
        if m := _STREAM_STOP.fullmatch(line):
            return [StreamStop(lsn, _int(m["xid"]))]
        if _STREAM_CHANGE.fullmatch(line):
            raise MissingOutputData(
                f"test_decoding printed {line!r} at {lsn} without the change's data; it never "
                "prints streamed changes, so decoding on would lose them. Do not pass "
                "stream-changes to test_decoding (or use pgoutput, which streams the data)"
            )
        if m := _STREAM_ABORT.fullmatch(line):
            return [self._stream_abort(_need_xid(m, line), lsn)]
        if m := _STREAM_COMMIT.fullmatch(line):
            xid = _need_xid(m, line)
            self._state.open_streams.discard(xid)
            return [StreamCommit(lsn, xid, lsn, lsn, _time(m["at"]))]
        if (m := _STREAM_PREPARE.fullmatch(line)) and (m["txn"] is None) == (m["xid"] is None):
            xid = _need_xid(m, line)
            gid = _unquote_literal(m["gid"])
            when = _time(m["at"])
            self._state.open_streams.discard(xid)
            self._state.prepared[gid] = (lsn, when)
            return [StreamPrepare(lsn, xid, gid, lsn, lsn, when)]
        raise _Malformed("not a line test_decoding prints")

    def _two_phase(self, m: re.Match[str], lsn: LSN, line: str) -> Event:
        gid = _unquote_literal(m["gid"])
        xid = _need_xid(m, line)
        when = _time(m["at"])
        if m["kind"] == "PREPARE TRANSACTION":
            self._state.prepared[gid] = (lsn, when)
            return Prepare(lsn, xid, gid, lsn, lsn, when)
        if m["kind"] == "COMMIT PREPARED":
            self._state.prepared.pop(gid, None)
            return CommitPrepared(lsn, xid, gid, lsn, lsn, when)
        prepared = self._state.prepared.pop(gid, None)
        if prepared is None:
            raise MissingOutputData(
                f"ROLLBACK PREPARED {gid!r} at {lsn}: test_decoding does not print the prepare's "
                "end LSN and time, and this decoder's state has no PREPARE for that gid; decode "
                "from a state that saw the PREPARE TRANSACTION line"
            )
        return RollbackPrepared(lsn, xid, gid, prepared[0], lsn, prepared[1], when)

    def _stream_abort(self, xid: int, lsn: LSN) -> StreamAbort:
        streams = self._state.open_streams
        if xid in streams:
            streams.discard(xid)
            return StreamAbort(lsn, xid, xid)
        if len(streams) == 1:
            return StreamAbort(lsn, next(iter(streams)), xid)
        raise MissingOutputData(
            f"test_decoding aborted streamed subtransaction {xid} at {lsn} but does not say "
            f"which transaction it belongs to, and {len(streams)} streamed transactions are "
            "open; do not pass stream-changes to test_decoding"
        )

    def _message(self, payload: bytes, lsn: LSN) -> Message:
        head = _MESSAGE_HEAD.match(payload)
        assert head is not None
        start = head.end()
        # The prefix is printed raw, so it may itself contain ", sz: "; the size that matches the
        # bytes left over is the real one.
        for size_match in _MESSAGE_SIZE.finditer(payload, start):
            size = int(size_match["size"])
            rest = len(payload) - size_match.end()
            has_content = size_match["content"] is not None
            if (has_content and rest == size) or (not has_content and rest == 0):
                break
        else:
            raise DecodeError(
                f"malformed test_decoding message at {lsn}: no ', sz: N content:' matching the "
                f"bytes that follow, in {_excerpt(payload.decode(self.encoding, 'replace'))}"
            )
        transactional = head["tx"] == b"1"
        if not has_content:
            raise MissingOutputData(
                f"test_decoding printed a streamed transactional message at {lsn} without its "
                "content; do not pass stream-changes to test_decoding"
            )
        try:
            prefix = payload[start : size_match.start()].decode(self.encoding)
        except UnicodeDecodeError as exc:
            raise DecodeError(f"message prefix at {lsn} is not {self.encoding}: {exc}") from None
        if head["streaming"] and transactional:
            raise DecodeError(f"streamed transactional message at {lsn} carries content")
        return Message(lsn, transactional, prefix, payload[size_match.end() :])

    # --- table lines ------------------------------------------------------------------------

    def _table_line(self, line: str, lsn: LSN) -> list[Event]:
        cursor = _Cursor(line, len("table "))
        names = [cursor.qualified_name()]
        while cursor.take(", "):
            names.append(cursor.qualified_name())
        cursor.expect(": ")
        if len(names) > 1 or cursor.peek("TRUNCATE:"):
            cursor.expect("TRUNCATE:")
            return [self._truncate(cursor, names, lsn)]
        namespace, name = names[0]
        for action in ("INSERT:", "UPDATE:", "DELETE:"):
            if cursor.take(action):
                break
        else:
            raise _Malformed(f"unknown action at offset {cursor.pos}")
        events: list[Event] = []
        if action == "DELETE:":
            old_columns, old_values = cursor.tuple_or_none()
            cursor.end()
            if old_columns is None:
                table = self._state.tables.get((namespace, name)) or Table(namespace, name, ())
                return [Delete(lsn, table, EMPTY_ROW)]
            table, old_row = self._old_row(namespace, name, old_columns, old_values)
            return [
                Delete(
                    lsn,
                    table,
                    EncodedRow.from_values(old_row),
                    old_is_key=len(old_columns) < len(table.columns),
                )
            ]
        old_part: tuple[list[Column], list[RawValue]] | None = None
        if action == "UPDATE:" and cursor.take(" old-key:"):
            old_part = cursor.columns(stop=" new-tuple:")
            cursor.expect(" new-tuple:")
        new_columns, new_values = cursor.tuple_or_none()
        cursor.end()
        if new_columns is None:
            table = self._state.tables.get((namespace, name)) or Table(namespace, name, ())
            new: Row = ()
        else:
            table = Table(namespace, name, tuple(new_columns))
            if self._state.tables.get((namespace, name)) != table:
                self._state.tables[(namespace, name)] = table
                events.append(Relation(lsn, table))
            new = tuple(new_values)
        if action == "INSERT:":
            if old_part is not None:
                raise _Malformed("INSERT with an old tuple")
            events.append(Insert(lsn, table, EncodedRow.from_values(new)))
            return events
        old: Row | None = None
        old_is_key = False
        if old_part is not None:
            old = _widen(table, *old_part)
            old_is_key = len(old_part[0]) < len(table.columns)
        events.append(
            Update(
                lsn,
                table,
                EncodedRow.from_values(new),
                None if old is None else EncodedRow.from_values(old),
                old_is_key,
            )
        )
        return events

    def _old_row(
        self, namespace: str, name: str, columns: list[Column], values: list[RawValue]
    ) -> tuple[Table, Row]:
        """An old-key tuple against the last full column list, or alone when it does not fit."""
        known = self._state.tables.get((namespace, name))
        if known is not None:
            try:
                return known, _widen(known, columns, values)
            except _Malformed:
                pass
        return Table(namespace, name, tuple(columns)), tuple(values)

    def _truncate(self, cursor: _Cursor, names: list[tuple[str, str]], lsn: LSN) -> Truncate:
        flags: list[str] = []
        if cursor.take(" (no-flags)"):
            pass
        else:
            if cursor.take(" restart_seqs"):
                flags.append("restart_seqs")
            if cursor.take(" cascade"):
                flags.append("cascade")
            if not flags:
                raise _Malformed("TRUNCATE without flags or (no-flags)")
        cursor.end()
        tables = tuple(self._state.tables.get(n) or Table(n[0], n[1], ()) for n in names)
        return Truncate(lsn, tables, "cascade" in flags, "restart_seqs" in flags)


def _widen(table: Table, columns: list[Column], values: list[RawValue]) -> Row:
    """Place an old tuple's values (NULLs and non-key columns left out) in the table's columns."""
    positions = {c.name: i for i, c in enumerate(table.columns)}
    row: list[RawValue] = [None] * len(table.columns)
    last = -1
    for column, value in zip(columns, values, strict=True):
        index = positions.get(column.name)
        if index is None or index <= last or table.columns[index].type_name != column.type_name:
            raise _Malformed(f"old tuple column {column.name!r} does not fit table {table.name!r}")
        row[index] = value
        last = index
    return tuple(row)


# --- lexing ----------------------------------------------------------------------------------


class _Malformed(Exception):
    """Internal: where and why a line does not parse; decode() turns it into DecodeError."""


class _Cursor:
    def __init__(self, text: str, pos: int = 0) -> None:
        self.text = text
        self.pos = pos

    def peek(self, literal: str) -> bool:
        return self.text.startswith(literal, self.pos)

    def take(self, literal: str) -> bool:
        if self.text.startswith(literal, self.pos):
            self.pos += len(literal)
            return True
        return False

    def expect(self, literal: str) -> None:
        if not self.take(literal):
            raise _Malformed(f"expected {literal!r} at offset {self.pos}")

    def end(self) -> None:
        if self.pos != len(self.text):
            raise _Malformed(f"unexpected text at offset {self.pos}")

    def identifier(self) -> str:
        if self.take('"'):
            parts: list[str] = []
            while True:
                close = self.text.find('"', self.pos)
                if close < 0:
                    raise _Malformed("unterminated quoted identifier")
                parts.append(self.text[self.pos : close])
                self.pos = close + 1
                if not self.take('"'):
                    break
                parts.append('"')
            name = "".join(parts)
            if not name:
                raise _Malformed("empty quoted identifier")
            return name
        m = _SAFE_IDENTIFIER.match(self.text, self.pos)
        if m is None:
            raise _Malformed(f"expected an identifier at offset {self.pos}")
        self.pos = m.end()
        return m.group()

    def qualified_name(self) -> tuple[str, str]:
        namespace = self.identifier()
        self.expect(".")
        return namespace, self.identifier()

    def type_name(self) -> str:
        """format_type_be() output: may be quoted and qualified, and ends in "[]" for arrays."""
        start = self.pos
        text = self.text
        while self.pos < len(text):
            ch = text[self.pos]
            if ch == '"':
                close = self.pos + 1
                while True:
                    close = text.find('"', close)
                    if close < 0:
                        raise _Malformed("unterminated quoted type name")
                    if text.startswith('""', close):
                        close += 2
                        continue
                    break
                self.pos = close + 1
            elif ch == "[":
                if not text.startswith("[]", self.pos):
                    raise _Malformed(f"unexpected '[' in type name at offset {self.pos}")
                self.pos += 2
            elif ch == "]":
                break
            else:
                self.pos += 1
        if self.pos >= len(text) or self.pos == start:
            raise _Malformed("unterminated column type")
        return text[start : self.pos]

    def value(self, type_name: str) -> RawValue:
        for word, raw in ((_NULL, None), (_TOAST, UNCHANGED_TOAST)):
            if self.text.startswith(word, self.pos) and self._ends_at(self.pos + len(word)):
                self.pos += len(word)
                return raw
        kind = _literal_kind(type_name)
        if kind == "quoted":
            if not self.take("'"):
                raise _Malformed(f"expected a quoted value at offset {self.pos}")
            return self._quoted_rest()
        if kind == "bit":
            self.expect("B'")
            close = self.text.find("'", self.pos)
            if close < 0:
                raise _Malformed("unterminated bit string")
            bits = self.text[self.pos : close]
            self.pos = close + 1
            return bits
        end = self.text.find(" ", self.pos)
        end = len(self.text) if end < 0 else end
        token = self.text[self.pos : end]
        if kind == "boolean":
            if token not in ("true", "false"):
                raise _Malformed(f"expected true or false at offset {self.pos}")
            self.pos = end
            return "t" if token == "true" else "f"
        if not token or "'" in token:
            raise _Malformed(f"expected a number at offset {self.pos}")
        self.pos = end
        return token

    def _ends_at(self, pos: int) -> bool:
        return pos == len(self.text) or self.text[pos] == " "

    def _quoted_rest(self) -> str:
        parts: list[str] = []
        while True:
            close = self.text.find("'", self.pos)
            if close < 0:
                raise _Malformed("unterminated quoted value")
            parts.append(self.text[self.pos : close])
            self.pos = close + 1
            if not self.take("'"):
                return "".join(parts)
            parts.append("'")

    def columns(self, stop: str | None = None) -> tuple[list[Column], list[RawValue]]:
        columns: list[Column] = []
        values: list[RawValue] = []
        while self.pos < len(self.text) and not (stop and self.peek(stop)):
            self.expect(" ")
            name = self.identifier()
            self.expect("[")
            type_name = self.type_name()
            self.expect("]:")
            values.append(self.value(type_name))
            columns.append(column_for(name, type_name))
        return columns, values

    def tuple_or_none(self) -> tuple[list[Column] | None, list[RawValue]]:
        if self.take(" " + _NO_TUPLE):
            return None, []
        return self.columns()


def column_for(name: str, type_name: str) -> Column:
    """The Column for test_decoding's ``name[type_name]``: built-in OID by name, else 0."""
    builtin = BY_SQL_NAME.get(_strip_typmod(type_name)) or BY_NAME.get(type_name)
    return Column(name, builtin.oid if builtin else 0, type_name=type_name)


def _strip_typmod(type_name: str) -> str:
    """'character varying(10)[]' -> 'character varying[]' (real servers print no typmods)."""
    if '"' in type_name:
        return type_name
    stripped = re.sub(r"\([^()]*\)", "", type_name)
    if stripped.startswith("interval "):
        stripped = "interval" + ("[]" if stripped.endswith("[]") else "")
    return stripped


def _literal_kind(type_name: str) -> str:
    base = _strip_typmod(type_name)
    if base in _BARE_TYPES:
        return "bare"
    if base in _BIT_TYPES:
        return "bit"
    if base == _BOOLEAN:
        return "boolean"
    return "quoted"


def _int(text: str | None) -> int | None:
    return int(text) if text is not None else None


def _need_xid(m: re.Match[str], line: str) -> int:
    if m["xid"] is None:
        raise MissingOutputData(
            f"test_decoding line {line!r} has no transaction id; pass include-xids=1 "
            "(the default) to test_decoding"
        )
    return int(m["xid"])


def _time(text: str | None) -> datetime | None:
    if text is None:
        return None
    m = _TIMESTAMP.fullmatch(text)
    if m is None:
        raise _Malformed(f"unreadable timestamp {text!r}")
    offset = timedelta(hours=int(m["tzh"]), minutes=int(m["tzm"] or 0), seconds=int(m["tzs"] or 0))
    try:
        return datetime(
            int(m["year"]),
            int(m["month"]),
            int(m["day"]),
            int(m["hour"]),
            int(m["minute"]),
            int(m["second"]),
            int((m["fraction"] or "0").ljust(6, "0")),
            timezone(-offset if m["sign"] == "-" else offset),
        )
    except (ValueError, OverflowError) as exc:
        raise _Malformed(f"timestamp {text!r} out of range: {exc}") from None


def _unquote_literal(text: str) -> str:
    """Undo quote_literal_cstr(): '' is a quote; in E'' literals, \\\\ is a backslash."""
    escaped = text.startswith("E")
    body = text[2:-1] if escaped else text[1:-1]
    value = body.replace("''", "'")
    if escaped:
        if re.search(r"\\(?!\\)", value.replace("\\\\", "")):
            raise _Malformed(f"stray backslash in {text!r}")
        value = value.replace("\\\\", "\\")
    elif "\\" in value:
        raise _Malformed(f"backslash outside an E'' literal in {text!r}")
    return value


def _excerpt(line: str) -> str:
    return repr(line if len(line) <= 200 else line[:200] + "...")


# --- formatting ------------------------------------------------------------------------------


def quote_identifier(name: str, *, server_major: int = 18) -> str:
    """PostgreSQL's quote_identifier(): bare when lower-case, safe and not a reserved keyword."""
    if _SAFE_IDENTIFIER.fullmatch(name) and not _is_reserved(name, server_major):
        return name
    return '"' + name.replace('"', '""') + '"'


def _is_reserved(word: str, server_major: int) -> bool:
    if word not in _RESERVED_KEYWORDS:
        return False
    return not any(
        word in added and server_major < version for version, added in _KEYWORDS_ADDED_IN.items()
    )


def _quote_literal(value: str) -> str:
    """quote_literal_cstr(): doubles quotes and backslashes, E'' when there is a backslash."""
    body = value.replace("'", "''")
    if "\\" in value:
        return "E'" + body.replace("\\", "\\\\") + "'"
    return "'" + body + "'"


def _format_time(when: datetime) -> str:
    """timestamptz_to_str(): ISO, trailing fractional zeros dropped, offset as +HH[:MM[:SS]]."""
    text = when.strftime("%Y-%m-%d %H:%M:%S")
    if when.microsecond:
        text += f".{when.microsecond:06d}".rstrip("0")
    offset = when.utcoffset()
    if offset is None:
        raise ValueError("test_decoding timestamps carry a time zone; got a naive datetime")
    seconds = int(offset.total_seconds())
    sign = "-" if seconds < 0 else "+"
    hours, rest = divmod(abs(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    text += f"{sign}{hours:02d}"
    if minutes or secs:
        text += f":{minutes:02d}"
    if secs:
        text += f":{secs:02d}"
    return text


def _at(when: datetime | None) -> str:
    return f" (at {_format_time(when)})" if when is not None else ""


def _txn(xid: int | None) -> str:
    return f" TXN {xid}" if xid is not None else ""


def _format_value(type_name: str, value: RawValue) -> str:
    if value is None:
        return _NULL
    if value is UNCHANGED_TOAST:
        return _TOAST
    if not isinstance(value, str):
        raise ValueError(f"test_decoding prints text values; got {type(value).__name__}")
    kind = _literal_kind(type_name)
    if kind == "bare":
        return value
    if kind == "bit":
        return f"B'{value}'"
    if kind == "boolean":
        return "true" if value == "t" else "false"
    return "'" + value.replace("'", "''") + "'"


def _type_name(column: Column) -> str:
    if column.type_name is not None:
        return column.type_name
    builtin = BY_OID.get(column.type_oid)
    if builtin is None:
        raise ValueError(f"column {column.name!r} has neither a type name nor a built-in OID")
    return builtin.sql_name


def _format_tuple(table: Table, row: Row, *, skip_nulls: bool, server_major: int) -> str:
    if len(row) != len(table.columns):
        raise ValueError(
            f"row has {len(row)} values but table {table.qualified_name} has "
            f"{len(table.columns)} columns"
        )
    parts = []
    for column, value in zip(table.columns, row, strict=True):
        if value is None and skip_nulls:
            continue
        type_name = _type_name(column)
        parts.append(
            f" {quote_identifier(column.name, server_major=server_major)}[{type_name}]:"
            f"{_format_value(type_name, value)}"
        )
    return "".join(parts)


def _table_name(table: Table, server_major: int) -> str:
    return (
        quote_identifier(table.namespace, server_major=server_major)
        + "."
        + quote_identifier(table.name, server_major=server_major)
    )


def format_test_decoding(
    event: Event, *, stream_xid: int | None = None, server_major: int = 18, encoding: str = "utf-8"
) -> str:
    """The line test_decoding prints for ``event`` (the inverse of TestDecodingDecoder).

    ``stream_xid`` is printed in "closing a streamed block" lines when the StreamStop carries no
    xid (pgoutput's do not; test_decoding's do); ``server_major`` picks the keyword list
    quote_identifier() uses. Relation events have no line of their own and raise ValueError, as
    do events test_decoding cannot print.
    """
    major = server_major
    match event:
        case Begin(xid=xid):
            return "BEGIN" if xid is None else f"BEGIN {xid}"
        case Commit(xid=xid, commit_time=when):
            return ("COMMIT" if xid is None else f"COMMIT {xid}") + _at(when)
        case Insert(table=table, new=new):
            body = (
                f" {_NO_TUPLE}"
                if new == ()
                else _format_tuple(table, new, skip_nulls=False, server_major=major)
            )
            return f"table {_table_name(table, major)}: INSERT:{body}"
        case Update(table=table, new=new, old=old):
            text = f"table {_table_name(table, major)}: UPDATE:"
            if old is not None:
                text += " old-key:" + _format_tuple(table, old, skip_nulls=True, server_major=major)
                text += " new-tuple:"
            if new == ():
                return text + f" {_NO_TUPLE}"
            return text + _format_tuple(table, new, skip_nulls=False, server_major=major)
        case Delete(table=table, old=old):
            body = (
                f" {_NO_TUPLE}"
                if old == ()
                else _format_tuple(table, old, skip_nulls=True, server_major=major)
            )
            return f"table {_table_name(table, major)}: DELETE:{body}"
        case Truncate(tables=tables, cascade=cascade, restart_identity=restart):
            names = ", ".join(_table_name(t, major) for t in tables)
            flags = (" restart_seqs" if restart else "") + (" cascade" if cascade else "")
            return f"table {names}: TRUNCATE:{flags or ' (no-flags)'}"
        case Message(transactional=transactional, prefix=prefix, content=content):
            return (
                f"message: transactional: {int(transactional)} prefix: {prefix}, "
                f"sz: {len(content)} content:{content.decode(encoding)}"
            )
        case Prepare(gid=gid, xid=xid, prepare_time=when):
            return f"PREPARE TRANSACTION {_quote_literal(gid)}, txid {xid}{_at(when)}"
        case CommitPrepared(gid=gid, xid=xid, commit_time=when):
            return f"COMMIT PREPARED {_quote_literal(gid)}, txid {xid}{_at(when)}"
        case RollbackPrepared(gid=gid, xid=xid, rollback_time=when):
            return f"ROLLBACK PREPARED {_quote_literal(gid)}, txid {xid}{_at(when)}"
        case StreamStart(xid=xid):
            return f"opening a streamed block for transaction{_txn(xid)}"
        case StreamStop(xid=xid):
            closing = stream_xid if xid is None else xid
            return f"closing a streamed block for transaction{_txn(closing)}"
        case StreamAbort(subxid=subxid):
            return f"aborting streamed (sub)transaction{_txn(subxid)}"
        case StreamCommit(xid=xid, commit_time=when):
            return f"committing streamed transaction{_txn(xid)}{_at(when)}"
        case StreamPrepare(gid=gid, xid=xid, prepare_time=when):
            return (
                f"preparing streamed transaction TXN {_quote_literal(gid)}, txid {xid}{_at(when)}"
            )
    raise ValueError(f"test_decoding prints no line for {type(event).__name__} events")
