"""Output files of ``pgcdc --start``: each is a ``TransactionSink`` the receiver appends to.

``TextOutput`` writes test_decoding's lines exactly as pg_recvlogical writes them (each
message's bytes, then ``\\n``), so that the two tools' output for the same slot contents is
byte-identical. ``JsonOutput`` writes one JSON object per change, message and truncate.

The JSON value mapping (``json_value``) is lossless:

- SQL NULL is ``null``; an unchanged TOASTed value the server did not send is the object
  ``{"unchanged_toast": true}`` (no column value is ever a JSON object otherwise);
- booleans, integers and finite floats are JSON booleans and numbers; float NaN and infinities
  are the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"``;
- numeric (``Decimal``) is a string of its exact digits (``"12.50"``, ``"NaN"``);
- bytea is ``"\\\\x"`` followed by lower-case hex, as PostgreSQL prints it;
- timestamps, dates and times are ISO 8601 strings (timestamptz in UTC with ``+00:00``);
  values Python cannot hold (BC, infinity, ``24:00:00``) are PostgreSQL's text for them;
- arrays are JSON arrays of mapped elements, except arrays with lower bounds other than 1,
  which are PostgreSQL's array text (``"[0:1]={1,2}"``);
- everything else (interval, uuid, inet, pg_lsn, json, enum, unknown types) is PostgreSQL's
  text form of the value (``pgcdc.decoding.values.pg_text``).

Writes happen at ``append`` (the bytes reach the OS at once, as with pg_recvlogical);
``flush`` makes them durable (fsync for regular files) and returns the end LSN the slot may be
confirmed to.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any, BinaryIO

from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.decoding.test_decoding import format_test_decoding
from pgcdc.decoding.values import BoundedList, pg_text, row_to_python
from pgcdc.errors import DecodeError, OutputError
from pgcdc.events import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    CommitPrepared,
    Delete,
    Event,
    Insert,
    Message,
    Prepare,
    RollbackPrepared,
    Row,
    Table,
    Truncate,
    Type,
    Unchanged,
    Update,
)
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction, TransactionOutcome

UNCHANGED_TOAST_MARKER: dict[str, bool] = {"unchanged_toast": True}
"""How JSON output shows an unchanged TOASTed value (distinct from ``null``)."""

TypeLookup = Callable[[Iterable[int]], Mapping[int, TypeInfo]]
"""Looks up non-built-in types by OID (``pgcdc.connection.catalog.type_info`` on a connection)."""


def open_output_file(path: str) -> BinaryIO:
    """The output as pg_recvlogical opens it: ``-`` is stdout, a file is created or appended."""
    if path == "-":
        import sys

        return sys.stdout.buffer
    try:
        fd = os.open(path, os.O_CREAT | os.O_APPEND | os.O_WRONLY, 0o600)
    except OSError as error:
        raise OutputError(
            f"could not open output file {path!r}: {error.strerror}; check that the directory "
            "exists and is writable"
        ) from None
    return os.fdopen(fd, "ab")


class _FileOutput:
    """Bytes to a binary stream; remembers what was appended and what is durable."""

    def __init__(self, stream: BinaryIO, *, fsync: bool = True, name: str = "output") -> None:
        self._stream = stream
        self._name = name
        self._fsync = fsync and _is_regular_file(stream)
        self._last_commit = LSN(0)
        self._last_end = LSN(0)
        self._durable_end = LSN(0)
        self.transactions = 0

    @property
    def last_commit_lsn(self) -> LSN:
        return self._last_commit

    @property
    def durable_lsn(self) -> LSN:
        """End LSN of the last transaction made durable by ``flush``."""
        return self._durable_end

    def append(self, txn: CommittedTransaction) -> bool:
        if txn.commit_lsn <= self._last_commit:
            return False
        data = self._render(txn)
        try:
            if data:
                self._stream.write(data)
                self._stream.flush()
        except OSError as error:
            raise OutputError(f"could not write to {self._name}: {error.strerror}") from None
        self._last_commit = LSN(txn.commit_lsn)
        self._last_end = LSN(max(txn.end_lsn, txn.commit_lsn))
        self.transactions += 1
        return True

    def flush(self) -> LSN:
        try:
            self._stream.flush()
            if self._fsync:
                os.fsync(self._stream.fileno())
        except OSError as error:
            raise OutputError(f"could not flush {self._name}: {error.strerror}") from None
        self._durable_end = self._last_end
        return self._durable_end

    def close(self) -> None:
        """Flush, then close the stream unless it is stdout (which the process owns)."""
        self.flush()
        if self._stream.fileno() != 1:
            self._stream.close()

    def _render(self, txn: CommittedTransaction) -> bytes:
        raise NotImplementedError


def _is_regular_file(stream: BinaryIO) -> bool:
    """fsync only regular files that are not terminals, as pg_recvlogical does."""
    try:
        fd = stream.fileno()
        return stat.S_ISREG(os.fstat(fd).st_mode) and not os.isatty(fd)
    except (OSError, ValueError):
        return False


# --- text: test_decoding's lines --------------------------------------------------------------


class TextOutput(_FileOutput):
    """test_decoding's lines, one per message, each followed by ``\\n`` (pg_recvlogical's
    format). ``server_major`` picks the keyword list test_decoding quotes identifiers by."""

    def __init__(
        self,
        stream: BinaryIO,
        *,
        fsync: bool = True,
        name: str = "output",
        server_major: int = 18,
        encoding: str = "utf-8",
    ) -> None:
        super().__init__(stream, fsync=fsync, name=name)
        self._major = server_major
        self._encoding = encoding

    def _render(self, txn: CommittedTransaction) -> bytes:
        lines: list[bytes] = []
        lsn = txn.commit_lsn
        events = iter(txn.events)
        if txn.outcome is TransactionOutcome.COMMIT_PREPARED:
            lines.append(
                self._line(
                    CommitPrepared(lsn, _xid(txn), _gid(txn), lsn, txn.end_lsn, txn.commit_time)
                )
            )
        elif txn.outcome is TransactionOutcome.ROLLBACK_PREPARED:
            lines.append(
                self._line(
                    RollbackPrepared(
                        lsn, _xid(txn), _gid(txn), lsn, txn.end_lsn, None, txn.commit_time
                    )
                )
            )
        elif txn.xid is None and _lone_message(txn):
            lines += (self._line(event) for event in events)
        else:
            lines.append(self._line(Begin(lsn, txn.xid)))
            lines += (self._line(event) for event in events if _printable(event))
            if txn.outcome is TransactionOutcome.PREPARE:
                end = Prepare(lsn, _xid(txn), _gid(txn), lsn, txn.end_lsn, txn.commit_time)
                lines.append(self._line(end))
            else:
                end_commit = Commit(lsn, lsn, txn.end_lsn, txn.commit_time, txn.xid)
                lines.append(self._line(end_commit))
        return b"".join(lines)

    def _line(self, event: Event) -> bytes:
        if type(event) is Message:
            # The content goes out as the bytes the server sent, whatever their encoding.
            head = (
                f"message: transactional: {int(event.transactional)} prefix: {event.prefix}, "
                f"sz: {len(event.content)} content:"
            )
            return head.encode(self._encoding) + event.content + b"\n"
        try:
            text = format_test_decoding(event, server_major=self._major, encoding=self._encoding)
        except DecodeError as error:
            raise _unwritable(event, error) from error
        except ValueError as error:
            raise OutputError(
                f"cannot write {type(event).__name__} at {event.lsn} as test_decoding text: "
                f"{error}; use --format json or --format changelog for this stream"
            ) from None
        return _encoded(event, text, self._encoding) + b"\n"


def _encoded(event: Event, text: str, encoding: str) -> bytes:
    """``text``, the rendering of ``event``, in ``encoding``. Rows are read allowing lone
    surrogates (the change log keeps such bytes as they came), which no UTF8 server sends: a
    row holding one is malformed, and so named; a character the encoding lacks is an
    OutputError."""
    try:
        return text.encode(encoding)
    except UnicodeEncodeError as error:
        bad = error.object[error.start : error.end]
        if any(0xD800 <= ord(c) <= 0xDFFF for c in bad):
            raise _unwritable(
                event, DecodeError(f"a text value holds an encoded surrogate ({bad!a})")
            ) from None
        raise OutputError(
            f"cannot write {type(event).__name__} at {event.lsn} in {encoding}: {error.reason} "
            f"({bad!a}); write UTF-8 (--format json, or a UTF8 client encoding)"
        ) from None


def _unwritable(event: Event, error: DecodeError) -> DecodeError:
    """A change whose row cannot be read (its consumer, the output, is where pgoutput's rows
    are checked) or typed: which one, and why. Nothing of its transaction is written."""
    table = getattr(event, "table", None)
    where = f" of {table.qualified_name}" if isinstance(table, Table) else ""
    return DecodeError(
        f"cannot write the {type(event).__name__} at LSN {event.lsn}{where}: {error}; nothing "
        "of its transaction is written or confirmed"
    )


def _printable(event: Event) -> bool:
    return type(event) in (Insert, Update, Delete, Truncate, Message)


def _lone_message(txn: CommittedTransaction) -> bool:
    """A non-transactional message travels alone, with no BEGIN/COMMIT around it."""
    events = list(txn.events)
    return len(events) == 1 and type(events[0]) is Message and not events[0].transactional


def _xid(txn: CommittedTransaction) -> int:
    if txn.xid is None:
        raise OutputError(
            f"prepared transaction {txn.gid!r} at {txn.commit_lsn} has no xid to print; keep "
            "test_decoding's include-xids on"
        )
    return txn.xid


def _gid(txn: CommittedTransaction) -> str:
    return txn.gid or ""


# --- JSON lines -------------------------------------------------------------------------------


def json_value(value: Any) -> Any:
    """A typed value (``pgcdc.decoding.values``) as a JSON-safe value, losslessly (see the
    module docstring for the mapping)."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, Unchanged):
        return dict(UNCHANGED_TOAST_MARKER)
    if isinstance(value, LSN):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return pg_text(value)
    if isinstance(value, Decimal):
        return pg_text(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "\\x" + bytes(value).hex()
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, BoundedList):
        return pg_text(value)
    if isinstance(value, list):
        return [json_value(item) for item in value]
    return pg_text(value)


class JsonOutput(_FileOutput):
    """One JSON object per line for each change, message and truncate.

    Every object has ``operation`` (insert, update, delete, truncate, message), ``lsn`` (the
    change's position), ``commit_lsn``, ``end_lsn`` (LSNs as "X/Y"), ``xid`` and
    ``commit_time`` (ISO 8601, or null). Row changes add ``schema``, ``table``, ``key`` (the
    identifying key columns, null when the plugin does not say which they are), ``old`` and
    ``new`` (column name -> value, or null). Truncates add ``tables`` (``[{schema, table}]``),
    ``cascade``, ``restart_identity``; messages ``transactional``, ``prefix`` and ``content``
    (bytea form, ``"\\\\x.."``).
    """

    def __init__(
        self,
        stream: BinaryIO,
        *,
        fsync: bool = True,
        name: str = "output",
        type_lookup: TypeLookup | None = None,
    ) -> None:
        super().__init__(stream, fsync=fsync, name=name)
        self._type_lookup = type_lookup
        self._types: dict[int, TypeInfo] = {}

    def _render(self, txn: CommittedTransaction) -> bytes:
        header: dict[str, Any] = {
            "commit_lsn": str(txn.commit_lsn),
            "end_lsn": str(txn.end_lsn),
            "xid": txn.xid,
            "commit_time": None if txn.commit_time is None else txn.commit_time.isoformat(),
        }
        if txn.outcome is not TransactionOutcome.COMMIT:
            header["outcome"] = txn.outcome.value
            header["gid"] = txn.gid
        lines = []
        for event in txn.events:
            if type(event) is Type:
                self._learn_type(event.oid)
                continue
            try:
                body = self._change(event)
            except DecodeError as error:
                raise _unwritable(event, error) from error
            if body is None:
                continue
            record = {"operation": body.pop("operation"), "lsn": str(event.lsn), **header, **body}
            line = json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"
            lines.append(_encoded(event, line, "utf-8"))
        return b"".join(lines)

    def _learn_type(self, oid: int) -> None:
        if self._type_lookup is not None and oid not in self._types:
            self._types.update(self._type_lookup([oid]))

    def _change(self, event: Event) -> dict[str, Any] | None:
        match event:
            case Insert(table=table, new=new):
                return self._row_change("insert", table, None, new, key_from=new)
            case Update(table=table, new=new, old=old, old_is_key=old_is_key):
                old_values = None if old is None else self._old(table, old, old_is_key)
                key_from = new if old is None else old
                return self._row_change("update", table, old_values, new, key_from=key_from)
            case Delete(table=table, old=old, old_is_key=old_is_key):
                return self._row_change(
                    "delete", table, self._old(table, old, old_is_key), None, key_from=old
                )
            case Truncate(tables=tables, cascade=cascade, restart_identity=restart):
                return {
                    "operation": "truncate",
                    "tables": [{"schema": t.namespace, "table": t.name} for t in tables],
                    "cascade": cascade,
                    "restart_identity": restart,
                }
            case Message(transactional=transactional, prefix=prefix, content=content):
                return {
                    "operation": "message",
                    "transactional": transactional,
                    "prefix": prefix,
                    "content": json_value(content),
                }
        return None

    def _typed(self, table: Table, row: Row) -> dict[str, Any]:
        values = row_to_python(table, row, self._types)
        return {
            column.name: json_value(value)
            for column, value in zip(table.columns, values, strict=True)
        }

    def _old(self, table: Table, old: Row, old_is_key: bool) -> dict[str, Any]:
        """The old row; a key-only one keeps just the key columns (or, when the plugin does
        not flag keys, the columns it sent)."""
        values = self._typed(table, old)
        if not old_is_key:
            return values
        keys = {column.name for column in table.key_columns}
        if keys:
            return {name: value for name, value in values.items() if name in keys}
        return {
            column.name: values[column.name]
            for column, raw in zip(table.columns, old, strict=True)
            if raw is not None
        }

    def _row_change(
        self,
        operation: str,
        table: Table,
        old: dict[str, Any] | None,
        new: Row | None,
        *,
        key_from: Row,
    ) -> dict[str, Any]:
        key = None
        if table.key_columns:
            typed = self._typed(table, key_from)
            key = {column.name: typed[column.name] for column in table.key_columns}
        return {
            "operation": operation,
            "schema": table.namespace,
            "table": table.name,
            "key": key,
            "old": old,
            "new": None if new is None else self._typed(table, new),
        }


__all__ = [
    "UNCHANGED_TOAST",
    "UNCHANGED_TOAST_MARKER",
    "JsonOutput",
    "TextOutput",
    "TypeLookup",
    "json_value",
    "open_output_file",
]
