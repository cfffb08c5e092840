"""The initial snapshot: every row of the published tables as of a new slot's consistent point.

A replication slot created with ``snapshot="export"`` names an MVCC snapshot that sees exactly
the transactions the slot will *not* decode. Worker connections import it (``SET TRANSACTION
SNAPSHOT``) and copy the tables in parallel, large tables split into ctid ranges (TID range
scans, PostgreSQL 14+) so one big table keeps every worker busy. The rows go, through a bounded
queue, into one synthetic committed transaction in the sink: a ``Relation`` per table (the same
``Table`` pgoutput will send) and then ``Insert`` events. A table whose column types all have
binary decoders is copied in binary format, its rows kept as pgoutput's binary mode sends them
(``EncodedRow``s of send-function bytes, ``pgcdc.decoding.copybinary``), which spares the server
the output functions and pgcdc the parsing; any other table (extension types) is copied in text
format, its values as pgoutput's text mode sends them (the output function under the receiver's
session settings). Readers type both forms to the same values.
Streaming the slot afterwards continues with the first transaction the snapshot does not
contain: no gap, no overlap.

The exported snapshot lives only while the exporting replication connection stays open and
idle, so that connection is closed only after the sink has flushed.

The synthetic transaction's ``commit_lsn`` is ``consistent_point - 1`` and its ``end_lsn`` is
``consistent_point``: a real transaction whose commit record starts exactly at the consistent
point is decoded (not in the snapshot), and the sink's duplicate rule (drop a commit LSN not
above the last one) would drop it if the snapshot claimed that same commit LSN.

A re-copy (``recopy_tables``) uses the same machinery for tables a running pipeline already
streams, after a change the slot never streams (a table rewrite) left their rows stale
downstream: a TEMPORARY slot exports the snapshot at its consistent point C; the caller
drains its own slot into the sink up to exactly C (every commit before C, none from C on);
then one synthetic transaction at C - 1 / C holds a ``Truncate`` of the tables and their rows
as of C. Applied in log order that is: every change before C, the tables replaced by their
state at C, then (streamed afterwards from the slot) every change from C on.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import queue
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

import psycopg
from psycopg import generators, pq, sql, waiting

from pgcdc.connection.catalog import type_closure, type_event
from pgcdc.connection.commands import CreatedSlot, supports_failover
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.connection.server_errors import translated
from pgcdc.connection.sql import stream_peeked_binary_changes
from pgcdc.decoding.copybinary import CopyBinaryReader, binary_decodable
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.decoding.values import TypeRegistry
from pgcdc.errors import (
    DecodeError,
    InvalidOption,
    PgcdcError,
    PublicationNotFound,
    SlotAlreadyExists,
    SnapshotError,
    SnapshotLost,
)
from pgcdc.events import (
    Begin,
    Column,
    Delete,
    Event,
    Insert,
    Relation,
    ReplicaIdentity,
    Row,
    Table,
    Truncate,
    Update,
    builder,
    encode_tuple_data,
    new_encoded_row,
)
from pgcdc.lsn import LSN
from pgcdc.receiver import DEFAULT_SESSION_SETTINGS, session_options, while_slot_busy
from pgcdc.transactions import CommittedTransaction, TransactionSink

__all__ = [
    "COPY_FORMATS",
    "DEFAULT_CHUNK_PAGES",
    "Chunk",
    "Key",
    "SnapshotPlan",
    "SnapshotProgress",
    "SnapshotResult",
    "SnapshotTable",
    "TableWindow",
    "chunk_pages",
    "copy_chunk",
    "copy_out",
    "copy_query",
    "exported_slot",
    "inserts",
    "parse_copy_text_row",
    "plan_chunks",
    "plan_snapshot",
    "recopy_tables",
    "snapshot_tables",
    "take_snapshot",
    "window_changes",
    "with_copy_formats",
]

DEFAULT_CHUNK_PAGES = 4096  # 32 MB of heap per COPY with 8 kB pages
BATCH_ROWS = 1000  # rows per queue item: amortises queue locking, bounds memory with the queue
BATCH_BYTES = 1 << 20
QUEUE_BATCHES_PER_WORKER = 2
PROGRESS_SECONDS = 10.0  # between progress reports of a long copy
_log = logging.getLogger(__name__)
APPLICATION_NAME = "pgcdc snapshot"
# "auto": binary format for every table whose column types all have binary decoders, text for
# the others; "text": text format for every table (as before binary COPY; a way around a
# binary decoder one would rather not trust).
COPY_FORMATS = ("auto", "text")


# --- catalog: tables as pgoutput describes them ----------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotTable:
    """A table to copy: its pgoutput definition, what to select, and how big it is."""

    table: Table
    relkind: str  # "r" plain (split by ctid), "p" partitioned root (copied whole)
    pages: int  # heap pages when the snapshot began
    row_filter: str | None = None  # the publications' row filter (OR of them), as SQL
    binary: bool = False  # copied in COPY's binary format
    filenode: int = 0  # pg_class.relfilenode: a rewrite (VACUUM FULL, CLUSTER) changes it

    @property
    def splittable(self) -> bool:
        return self.relkind == "r"


_PUBLICATIONS = "SELECT pubname::text FROM pg_publication WHERE pubname = ANY(%s)"

# pg_publication_tables names each published table once per publication, with the published
# columns (PG15+: the column list, or every published column) and the row filter.
_PUBLISHED_15 = """
SELECT format('%%I.%%I', schemaname, tablename)::regclass::oid::bigint, attnames::text[], rowfilter
FROM pg_publication_tables WHERE pubname = ANY(%s)
"""
_PUBLISHED_OLD = """
SELECT format('%%I.%%I', schemaname, tablename)::regclass::oid::bigint, NULL::text[], NULL::text
FROM pg_publication_tables WHERE pubname = ANY(%s)
"""
# Permanent plain tables outside the system schemas (leaf partitions included, their parents
# not, so no row is copied twice).
_USER_TABLES = """
SELECT c.oid::bigint FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.relkind = 'r' AND c.relpersistence = 'p'
  AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_toast'
  AND n.nspname !~ '^pg_temp_'
ORDER BY c.oid
"""
_RELATIONS = """
SELECT c.oid::bigint, n.nspname::text, c.relname::text, c.relreplident::text, c.relkind::text,
       pg_relation_size(c.oid) / current_setting('block_size')::bigint, c.relfilenode::bigint
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = ANY(%s::oid[])
"""
# pgoutput's key flag: every column under REPLICA IDENTITY FULL, else the columns of the
# replica identity index (the primary key for DEFAULT, the chosen index for USING INDEX).
_COLUMNS = """
SELECT a.attrelid::bigint, a.attname::text, a.atttypid::bigint, a.atttypmod, a.attgenerated::text,
       c.relreplident = 'f' OR EXISTS (
           SELECT 1 FROM pg_index i
           WHERE i.indrelid = a.attrelid AND a.attnum = ANY(i.indkey)
             AND CASE c.relreplident WHEN 'd' THEN i.indisprimary
                                     WHEN 'i' THEN i.indisreplident ELSE false END)
FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
WHERE a.attrelid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attrelid, a.attnum
"""


def _resolve(conn: psycopg.Connection[Any], names: Sequence[str]) -> list[int]:
    oids = []
    for name in names:
        row = conn.execute("SELECT to_regclass(%s)::oid::bigint", (name,)).fetchone()
        if row is None or row[0] is None:
            raise SnapshotError(
                f"table {name!r} does not exist (names resolve as in SQL: schema.table, "
                "search_path for unqualified names, double quotes for mixed case)"
            )
        oids.append(int(row[0]))
    return oids


def _published(
    conn: psycopg.Connection[Any], publications: Sequence[str]
) -> dict[int, tuple[frozenset[str] | None, str | None]]:
    """Published tables: OID -> (published column names or None for all, row filter)."""
    found = {row[0] for row in conn.execute(_PUBLICATIONS, (list(publications),))}
    missing = [p for p in publications if p not in found]
    if missing:
        raise PublicationNotFound(
            f"publication(s) {', '.join(missing)} do not exist in this database; create them "
            "(CREATE PUBLICATION <name> FOR ALL TABLES) or pass existing names"
        )
    query = _PUBLISHED_15 if conn.info.server_version >= 150000 else _PUBLISHED_OLD
    columns: dict[int, set[frozenset[str] | None]] = {}
    filters: dict[int, list[str | None]] = {}
    for oid, attnames, rowfilter in conn.execute(query, (list(publications),)):
        columns.setdefault(oid, set()).add(None if attnames is None else frozenset(attnames))
        filters.setdefault(oid, []).append(rowfilter)
    published: dict[int, tuple[frozenset[str] | None, str | None]] = {}
    for oid, lists in columns.items():
        if len(lists) > 1:
            raise SnapshotError(
                f"table OID {oid} has different column lists in the publications "
                f"{', '.join(publications)}; pgoutput refuses that too: give it the same "
                "column list everywhere, or stream one publication"
            )
        row_filters = filters[oid]
        # pgoutput ORs the filters of a table's publications; one without a filter wins.
        combined = (
            None
            if any(f is None for f in row_filters)
            else " OR ".join(f"({f})" for f in sorted(set(row_filters)))  # type: ignore[type-var]
        )
        published[oid] = (next(iter(lists)), combined)
    return published


def snapshot_tables(
    conn: psycopg.Connection[Any],
    tables: Sequence[str] | None = None,
    publications: Sequence[str] = (),
) -> list[SnapshotTable]:
    """The tables to copy, each with the ``Table`` pgoutput sends for it.

    Run it inside the imported snapshot so definitions and sizes are those the rows have.
    ``tables`` None means the publications' tables (with their column lists and row filters)
    or, without publications, every permanent user table.
    """
    with translated():
        published = _published(conn, publications) if publications else None
        if tables is not None:
            oids = _resolve(conn, tables)
            if published is not None:
                outside = [n for n, o in zip(tables, oids, strict=True) if o not in published]
                if outside:
                    raise SnapshotError(
                        f"table(s) {', '.join(outside)} are not in publication(s) "
                        f"{', '.join(publications)}: their changes would never stream after "
                        "the snapshot; add them to a publication or leave them out"
                    )
        elif published is not None:
            oids = sorted(published)
        else:
            oids = [row[0] for row in conn.execute(_USER_TABLES)]
        oids = list(dict.fromkeys(oids))
        relations = {row[0]: row[1:] for row in conn.execute(_RELATIONS, (oids,))}
        columns: dict[int, list[Column]] = {oid: [] for oid in oids}
        # pgoutput sends generated columns only from PostgreSQL 18, and only stored ones its
        # publication asks for (a column list, or publish_generated_columns = stored), which
        # pg_publication_tables lists.
        generated_published = conn.info.server_version >= 180000
        for oid, name, type_oid, typmod, generated, key in conn.execute(_COLUMNS, (oids,)):
            wanted = None if published is None else published[oid][0]
            if generated and not (generated_published and wanted is not None and name in wanted):
                continue
            if wanted is not None and name not in wanted:
                continue
            columns[oid].append(Column(name, type_oid, typmod, bool(key)))
    result = []
    for oid in oids:
        namespace, name, identity, relkind, pages, filenode = relations[oid]
        if relkind not in ("r", "p"):
            raise SnapshotError(
                f"{namespace}.{name} is not a table (relkind {relkind!r}); pgoutput publishes "
                "only tables: leave it out of --table"
            )
        table = Table(namespace, name, tuple(columns[oid]), oid, ReplicaIdentity(identity))
        row_filter = None if published is None else published[oid][1]
        result.append(SnapshotTable(table, relkind, int(pages), row_filter, filenode=int(filenode)))
    return result


# --- the copy plan ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Chunk:
    """One COPY: a table, or the pages [first_page, end_page) of it (end None: to the end).

    ``keys``: only the rows with these key values (PostgreSQL text forms, in the order of the
    table's key columns), and only on the pages of ``within`` (page ranges as above; empty:
    anywhere). A resumed snapshot fetches so the rows inserted or changed since its kept
    chunks were copied (``pgcdc.spark.snapshot``)."""

    table: SnapshotTable
    first_page: int | None = None
    end_page: int | None = None
    keys: tuple[tuple[str, ...], ...] | None = None
    within: tuple[tuple[int | None, int | None], ...] = ()


def plan_chunks(tables: Sequence[SnapshotTable], chunk_pages: int) -> list[Chunk]:
    """Split plain tables larger than ``chunk_pages`` into ctid ranges, biggest tables first.

    The last range of a table is open-ended, so rows on pages added since its size was read
    (invisible to the snapshot anyway) can never fall between ranges.
    """
    if chunk_pages < 1:
        raise InvalidOption(f"chunk_pages must be at least 1, not {chunk_pages}")
    chunks: list[Chunk] = []
    for spec in sorted(tables, key=lambda t: -t.pages):
        if not spec.splittable or spec.pages <= chunk_pages:
            chunks.append(Chunk(spec))
            continue
        starts = range(0, spec.pages, chunk_pages)
        for first in starts:
            end = first + chunk_pages
            chunks.append(Chunk(spec, first, end if end < spec.pages else None))
    return chunks


def _on_pages(first: int | None, end: int | None) -> list[sql.Composable]:
    """Conditions for the pages [first, end) (None: open)."""
    conditions: list[sql.Composable] = []
    if first is not None:
        conditions.append(sql.SQL("ctid >= {}::tid").format(sql.Literal(f"({first},0)")))
    if end is not None:
        conditions.append(sql.SQL("ctid < {}::tid").format(sql.Literal(f"({end},0)")))
    return conditions


def copy_query(chunk: Chunk) -> sql.Composed:
    """``COPY (SELECT <published columns> FROM t WHERE <ctid range> AND <row filter>)``, and
    for a chunk of ``keys``, ``AND (<key columns>) IN (<keys>) AND <on the pages of within>``
    (the literals take the key columns' types, so the key's index finds them)."""
    table = chunk.table.table
    columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.columns)
    conditions = _on_pages(chunk.first_page, chunk.end_page)
    if chunk.table.row_filter is not None:
        conditions.append(sql.SQL("(" + chunk.table.row_filter + ")"))
    if chunk.keys is not None:
        names = sql.SQL(", ").join(sql.Identifier(c.name) for c in table.key_columns)
        rows = sql.SQL(", ").join(
            sql.SQL("({})").format(sql.SQL(", ").join(map(sql.Literal, key))) for key in chunk.keys
        )
        found = sql.SQL("({}) IN ({})").format(names, rows)
        conditions.append(found if chunk.keys else sql.SQL("false"))
    ranges = [
        sql.SQL("({})").format(sql.SQL(" AND ").join(_on_pages(*r) or [sql.SQL("true")]))
        for r in chunk.within
    ]
    if ranges:
        conditions.append(sql.SQL("({})").format(sql.SQL(" OR ").join(ranges)))
    where = sql.SQL(" WHERE ") + sql.SQL(" AND ").join(conditions) if conditions else sql.SQL("")
    binary = sql.SQL(" (FORMAT binary)" if chunk.table.binary else "")
    return sql.SQL("COPY (SELECT {} FROM {}{}) TO STDOUT{}").format(
        columns, sql.Identifier(table.namespace, table.name), where, binary
    )


# --- COPY format per table ------------------------------------------------------------------

_COMPOSITE_FIELDS = """
SELECT t.oid::bigint, array_agg(a.atttypid::bigint ORDER BY a.attnum)
FROM pg_type t JOIN pg_attribute a ON a.attrelid = t.typrelid
WHERE t.oid = ANY(%s::oid[]) AND a.attnum > 0 AND NOT a.attisdropped
GROUP BY t.oid
"""
# Binary money is a count of lc_monetary's smallest unit, which the registry scales by its
# money_fraction_digits and prints (inside composites) as cash_out does under lc_monetary C:
# only a database whose money prints that way gets the values its text copy would give.
_MONEY_TEXT = "SELECT (-1234.56)::money::text"
_C_MONEY_TEXT = "-$1,234.56"


def with_copy_formats(
    conn: psycopg.Connection[Any],
    specs: Sequence[SnapshotTable],
    types: Mapping[int, TypeInfo],
    copy_format: str,
    session_settings: Mapping[str, str] | None,
) -> list[SnapshotTable]:
    """``specs`` marked for binary COPY where every column type decodes from binary to what
    its text decodes to (``copybinary.binary_decodable``); the rest stay text.

    Run it in the planner's session: lc_monetary there is what the copies' money is in.
    """
    _check_copy_format(copy_format)
    if copy_format == "text" or not specs:
        return list(specs)
    registry = TypeRegistry(types)
    composites = [oid for oid, info in types.items() if info.kind == "c"]
    with translated():
        fields = (
            {int(oid): list(oids) for oid, oids in conn.execute(_COMPOSITE_FIELDS, (composites,))}
            if composites
            else {}
        )
        money_text = conn.execute(_MONEY_TEXT).fetchone()
    # The text a composite, range or multirange decodes to is printed by pgcdc as the server
    # prints it under pgcdc's session settings; under others the text path's would differ.
    settings = {k.lower(): v for k, v in (session_settings or {}).items()}
    default_printing = session_settings is not None and all(
        settings.get(k.lower()) == v for k, v in DEFAULT_SESSION_SETTINGS.items()
    )
    money = money_text is not None and money_text[0] == _C_MONEY_TEXT
    money = money and registry.money_fraction_digits == 2
    chosen = []
    for spec in specs:
        binary = binary_decodable(
            registry,
            (c.type_oid for c in spec.table.columns),
            fields,
            prints_as_text=default_printing,
            money=money,
        )
        if not binary:
            _log.info(
                "copying %s in text format: a column type has no binary decoder",
                spec.table.qualified_name,
            )
        chosen.append(replace(spec, binary=binary))
    return chosen


# --- COPY text format ------------------------------------------------------------------------

# The escapes COPY TO writes (CopyAttributeOutText); it never writes octal or hex escapes.
_UNESCAPE = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}
_ESCAPE = re.compile(r"\\(.?)", re.DOTALL)


def _unescape(match: re.Match[str]) -> str:
    try:
        return _UNESCAPE[match.group(1)]
    except KeyError:
        raise DecodeError(
            f"unexpected escape {match.group(0)!r} in COPY text output (COPY TO writes only "
            "\\b \\f \\n \\r \\t \\v \\\\ and \\N)"
        ) from None


def parse_copy_text_row(line: bytes | bytearray | memoryview, width: int) -> Row:
    """One line of ``COPY ... TO STDOUT`` text format (UTF-8) as the raw row pgoutput's text
    mode would send: the output function's text, escapes undone, ``\\N`` as None."""
    try:
        text = str(line, "utf-8")
    except UnicodeDecodeError as error:
        raise DecodeError(f"COPY row is not UTF-8 ({error}); set client_encoding=UTF8") from None
    if not text.endswith("\n"):
        raise DecodeError(f"COPY row does not end with a newline: {text[:60]!r}")
    if width == 0:
        if text != "\n":
            raise DecodeError(f"COPY row of a table without columns has data: {text[:60]!r}")
        return ()
    fields = text[:-1].split("\t")
    if len(fields) != width:
        raise DecodeError(f"COPY row has {len(fields)} fields, expected {width}: {text[:60]!r}")
    if "\\" not in text:
        return tuple(fields)
    return tuple(
        None if f == "\\N" else _ESCAPE.sub(_unescape, f) if "\\" in f else f for f in fields
    )


# --- COPY binary format ----------------------------------------------------------------------

_new_insert = builder(Insert)


def inserts(lsn: LSN, table: Table, rows: Sequence[bytes]) -> list[Event]:
    """An ``Insert`` of each TupleData row, as an ``EncodedRow``, built without their
    ``__init__`` (``events.builder``): the constructors would cost more than splicing the row
    did."""
    events: list[Event] = []
    append = events.append
    for data in rows:
        append(_new_insert(lsn, table, new_encoded_row(data, None), None))
    return events


def copy_out(
    conn: psycopg.Connection[Any],
    query: sql.SQL | sql.Composed,
    *,
    batch_rows: int = BATCH_ROWS,
    batch_bytes: int = BATCH_BYTES,
) -> Iterator[tuple[bytes, list[int]]]:
    """Run ``query`` (a ``COPY ... TO STDOUT``) on ``conn``: its CopyData messages joined in
    batches of about ``batch_rows`` messages or ``batch_bytes``, each with where each message
    ends in it. The last batch may be empty; a server error is raised before it.

    psycopg starts and ends the COPY; the messages are taken from libpq in one loop, every
    message it already holds before the socket is waited on: psycopg's own iterator runs a
    generator and a wait per message (one per row), most of a binary copy's client CPU. Only
    to wait, and to take the COPY's end, are psycopg's generators run."""
    with conn.cursor() as cursor, cursor.copy(query):
        pgconn = conn.pgconn
        get_copy_data = pgconn.get_copy_data
        received = bytearray()
        ends: list[int] = []
        append = ends.append
        end = count = 0  # len(received), len(ends): counted, not asked for per message
        while True:
            size, data = get_copy_data(1)
            if size == 0:  # nothing whole held: wait for the next message, or the COPY's end
                got = waiting.wait(generators.copy_from(pgconn), pgconn.socket)
                if not isinstance(got, memoryview):
                    break  # its result, checked
                data, size = got, len(got)
            elif size < 0:  # the COPY's end, taken here: its result is fetched and checked
                for result in waiting.wait(generators.fetch_many(pgconn), pgconn.socket):
                    if result.status != pq.ExecStatus.COMMAND_OK:
                        raise psycopg.errors.error_from_result(result, encoding=conn.info.encoding)
                break
            received += data
            end += size
            count += 1
            append(end)
            if count >= batch_rows or end >= batch_bytes:
                yield bytes(received), ends
                received, ends = bytearray(), []
                append = ends.append
                end = count = 0
        yield bytes(received), ends


def copy_chunk(conn: psycopg.Connection[Any], chunk: Chunk) -> Iterator[tuple[list[bytes], int]]:
    """COPY one chunk on ``conn`` (inside the exported snapshot): its rows as TupleData
    (``EncodedRow`` bytes; pgoutput's binary mode for a binary copy, its text mode for a text
    one), in batches of about ``BATCH_ROWS`` rows or ``BATCH_BYTES``, each with the COPY bytes
    it was read from. The last batch may be empty."""
    width = len(chunk.table.table.columns)
    with translated():
        if chunk.table.binary:
            reader = CopyBinaryReader(width)
            held: tuple[list[bytes], int] | None = None
            for data, ends in copy_out(conn, copy_query(chunk)):
                if held is not None:
                    yield held
                held = reader.read_joined(data, ends), len(data)
            reader.finish()  # the stream was whole before its last rows go out
            if held is not None:
                yield held
        else:
            for data, ends in copy_out(conn, copy_query(chunk)):
                yield (
                    [
                        encode_tuple_data(parse_copy_text_row(data[start:end], width))
                        for start, end in itertools.pairwise([0, *ends])
                    ],
                    len(data),
                )


# --- taking the snapshot ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    consistent_point: LSN  # the slot streams the transactions committed from here on
    tables: tuple[Table, ...]
    rows: int
    bytes: int  # COPY bytes read (text or binary format)
    snapshot_name: str = ""


@dataclass(frozen=True, slots=True)
class SnapshotProgress:
    """How far a snapshot's copy has got. ``pages`` is the planned size of its tables in 8 kB
    pages (pg_class.relpages, an estimate: ANALYZE and VACUUM keep it fresh); the share of
    pages copied paces the estimate of the time left, as rows are counted only once read."""

    rows: int
    bytes: int  # COPY bytes read (text or binary format)
    chunks_done: int
    chunks: int
    pages_done: int
    pages: int
    seconds: float  # since the copy began

    @property
    def remaining_seconds(self) -> float | None:
        """At the pace so far; None before the first chunk is done."""
        if not self.pages_done or not self.seconds:
            return None
        return max(self.seconds * (self.pages - self.pages_done) / self.pages_done, 0.0)

    def __str__(self) -> str:
        rate = self.rows / self.seconds if self.seconds else 0.0
        text = (
            f"{self.rows:,} rows ({self.bytes / 1e6:,.1f} MB) copied in {self.seconds:,.1f} s "
            f"({rate:,.0f} rows/s); {self.chunks_done} of {self.chunks} chunks, "
            f"{self.pages_done / self.pages if self.pages else 1.0:.0%} of the pages"
        )
        left = self.remaining_seconds
        if left is not None and self.chunks_done < self.chunks:
            text += f"; about {left:,.0f} s left"
        return text


def chunk_pages(chunk: Chunk) -> int:
    """The pages a chunk covers as planned (at least 1, so an empty table's chunk counts)."""
    if chunk.keys is not None:
        return 1
    first = chunk.first_page or 0
    end = chunk.table.pages if chunk.end_page is None else chunk.end_page
    return max(end - first, 1)


_DONE = object()


class _Copier:
    """Worker threads copying chunks under one imported snapshot into a bounded queue."""

    def __init__(
        self,
        conninfo: str,
        snapshot_name: str,
        lsn: LSN,
        chunks: list[Chunk],
        *,
        workers: int,
        session_settings: Mapping[str, str] | None,
    ) -> None:
        self.conninfo = conninfo
        self.session_settings = session_settings
        self.snapshot_name = snapshot_name
        self.lsn = lsn
        self.chunks: queue.SimpleQueue[Chunk] = queue.SimpleQueue()
        for chunk in chunks:
            self.chunks.put(chunk)
        self.results: queue.Queue[object] = queue.Queue(workers * QUEUE_BATCHES_PER_WORKER)
        self.stop = threading.Event()
        self.rows = 0
        self.bytes = 0
        self.chunk_count = len(chunks)
        self.chunks_done = 0
        self.pages = sum(map(chunk_pages, chunks))
        self.pages_done = 0
        self.started = time.monotonic()
        self.count_lock = threading.Lock()
        self.connections: set[psycopg.Connection[Any]] = set()
        self.threads = [
            threading.Thread(target=self._work, name=f"pgcdc-snapshot-{n}", daemon=True)
            for n in range(workers)
        ]

    def _put(self, item: object) -> bool:
        while not self.stop.is_set():
            try:
                self.results.put(item, timeout=0.2)
                return True
            except queue.Full:
                continue
        return False

    def _work(self) -> None:
        try:
            with open_worker(self.conninfo, self.snapshot_name, self.session_settings) as conn:
                with self.count_lock:
                    self.connections.add(conn)
                try:
                    self._copy_all(conn)
                finally:
                    with self.count_lock:
                        self.connections.discard(conn)
        except BaseException as error:  # handed to the consumer, which raises it
            self._put(error)
        finally:
            self._put(_DONE)

    def _copy_all(self, conn: psycopg.Connection[Any]) -> None:
        lsn = self.lsn
        while not self.stop.is_set():
            try:
                chunk = self.chunks.get_nowait()
            except queue.Empty:
                return
            table = chunk.table.table
            rows = size = 0
            for data, read in copy_chunk(conn, chunk):
                if not self._put(inserts(lsn, table, data)):
                    return
                rows += len(data)
                size += read
            with self.count_lock:
                self.rows += rows
                self.bytes += size
                self.chunks_done += 1
                self.pages_done += chunk_pages(chunk)

    def progress(self) -> SnapshotProgress:
        """What the workers have copied so far (whole chunks)."""
        with self.count_lock:
            return SnapshotProgress(
                rows=self.rows,
                bytes=self.bytes,
                chunks_done=self.chunks_done,
                chunks=self.chunk_count,
                pages_done=self.pages_done,
                pages=self.pages,
                seconds=time.monotonic() - self.started,
            )

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def events(
        self, on_progress: Callable[[SnapshotProgress], None] | None = None
    ) -> Iterator[Event]:
        """The Inserts of every worker, as they arrive; raises the first worker error.
        ``on_progress`` is told how far the copy has got every ``PROGRESS_SECONDS``."""
        running = len(self.threads)
        due = time.monotonic() + PROGRESS_SECONDS
        while running:
            if on_progress is not None and time.monotonic() >= due:
                on_progress(self.progress())
                due = time.monotonic() + PROGRESS_SECONDS
            item = self.results.get()
            if item is _DONE:
                running -= 1
            elif isinstance(item, BaseException):
                if isinstance(item, PgcdcError):
                    raise item
                raise SnapshotError(f"a snapshot worker failed: {item!r}") from item
            else:
                yield from item  # type: ignore[misc]

    def close(self) -> None:
        """Stop the workers; cancel the COPYs still running (after a failure), so giving up
        does not wait for a long scan to end."""
        self.stop.set()
        with self.count_lock:
            running = list(self.connections)
        for conn in running:
            with contextlib.suppress(psycopg.Error):  # it may have ended meanwhile
                conn.cancel_safe()
        for thread in self.threads:
            thread.join()


def open_worker(
    conninfo: str,
    snapshot_name: str,
    session_settings: Mapping[str, str] | None = DEFAULT_SESSION_SETTINGS,
) -> psycopg.Connection[Any]:
    """A connection inside the exported snapshot, with the settings the receiver gives its
    walsender (so every value's text is what pgoutput sends there) and UTF-8 text."""
    with translated():
        conn = psycopg.connect(
            conninfo,
            options=session_options(conninfo, session_settings),
            application_name=APPLICATION_NAME,
            client_encoding="UTF8",
        )
        try:
            conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            conn.execute(sql.SQL("SET TRANSACTION SNAPSHOT {}").format(sql.Literal(snapshot_name)))
        except BaseException as error:
            conn.close()
            if isinstance(error, psycopg.Error) and error.sqlstate in _SNAPSHOT_GONE:
                raise SnapshotLost(
                    f"the exported snapshot {snapshot_name} is gone "
                    f"({error.diag.message_primary}): the connection that exported it ended (a "
                    "server restart, a lost connection), or this one reached another server (a "
                    "conninfo with several hosts, a pooler); the snapshot is taken again"
                ) from error
            raise
    return conn


# What SET TRANSACTION SNAPSHOT says of a snapshot whose exporting transaction ended (its file
# is removed then, and on a restart): 22023 "invalid snapshot identifier" on PostgreSQL 15,
# 42704 "snapshot ... does not exist" on 18, 55000 when the file outlived its process.
_SNAPSHOT_GONE = frozenset({"22023", "42704", "55000"})


def _check_copy_format(copy_format: str) -> None:
    """Refuse an unknown format before a slot is created for nothing."""
    if copy_format not in COPY_FORMATS:
        raise InvalidOption(f"copy_format {copy_format!r}: use one of {', '.join(COPY_FORMATS)}")


def _drop_slot(conn: ReplicationConnection, slot: str) -> str:
    """Drop the slot this snapshot created, so a retry can create it again; says which."""
    try:
        if not conn.closed:
            conn.drop_replication_slot(slot)
            return f"the new slot {slot!r} was dropped again; retry once the cause is fixed"
    except PgcdcError:
        pass
    return (
        f"the new slot {slot!r} could not be dropped: drop it with "
        f"SELECT pg_drop_replication_slot('{slot}') before retrying"
    )


def take_snapshot(
    conninfo: str,
    *,
    slot: str,
    sink: TransactionSink,
    plugin: str = "pgoutput",
    tables: Sequence[str] | None = None,
    publications: Sequence[str] = (),
    workers: int = 4,
    chunk_pages: int = DEFAULT_CHUNK_PAGES,
    session_settings: Mapping[str, str] | None = DEFAULT_SESSION_SETTINGS,
    failover: bool = False,
    copy_format: str = "auto",
    on_progress: Callable[[SnapshotProgress], None] | None = None,
) -> SnapshotResult:
    """Create ``slot`` and store every row it will not stream as one transaction in ``sink``.

    Streaming the slot afterwards (``pgcdc.receiver.Receiver``) delivers exactly the changes
    committed after the snapshot. The slot must not exist yet: only a new slot exports the
    snapshot that matches its start. On failure the slot is dropped again.
    ``session_settings`` must be the receiver's (``ReceiverOptions.session_settings``), so
    that values come out as its walsender prints them. ``failover``: create it as a failover
    slot where the server supports them (17+), so physical standbys keep a copy.
    ``on_progress`` is told how far the copy has got every ``PROGRESS_SECONDS`` and at its
    end (a copy of a large table takes hours).
    """
    if isinstance(publications, str) or isinstance(tables, str):
        raise InvalidOption("tables and publications are sequences of names, not one string")
    if workers < 1:
        raise InvalidOption(f"workers must be at least 1, not {workers}")
    if chunk_pages < 1:
        raise InvalidOption(f"chunk_pages must be at least 1, not {chunk_pages}")
    with exported_slot(conninfo, slot, plugin, failover=failover) as created:
        return _copy(
            conninfo,
            created.consistent_point,
            created.snapshot_name,
            sink=sink,
            tables=tables,
            publications=publications,
            workers=workers,
            chunk_pages=chunk_pages,
            session_settings=session_settings,
            copy_format=copy_format,
            on_progress=on_progress,
        )


@contextlib.contextmanager
def exported_slot(
    conninfo: str,
    slot: str,
    plugin: str = "pgoutput",
    *,
    failover: bool = False,
    temporary: bool = False,
    keep_on_failure: Callable[[], bool] = lambda: False,
) -> Iterator[CreatedSlot]:
    """Create ``slot``, exporting its snapshot, which lives while this block runs (the
    exporting connection stays open and idle). A failure inside drops the slot again, so a
    retry can create it (the error says whether that worked), unless ``keep_on_failure()``
    says what was done with the snapshot can be resumed from. A ``temporary`` slot goes when
    the block ends, whatever happened."""
    exporter = ReplicationConnection.connect(conninfo, application_name=APPLICATION_NAME)
    try:
        try:
            created = exporter.create_replication_slot(
                slot,
                plugin,
                temporary=temporary,
                snapshot="export",
                failover=failover and supports_failover(exporter.server_version),
            )
        except SlotAlreadyExists as error:
            raise SlotAlreadyExists(
                f"replication slot {slot!r} already exists: an initial snapshot needs a new "
                "slot, because only creating a slot exports the snapshot that matches where "
                f"it starts streaming. Choose another slot name, or drop it (SELECT "
                f"pg_drop_replication_slot('{slot}')) if its changes are not needed"
            ) from error
        if not created.snapshot_name:
            raise SnapshotError("the server created the slot but exported no snapshot")
        try:
            yield created
        except BaseException as error:
            if keep_on_failure():
                error.add_note(f"slot {slot!r} was kept: the next attempt resumes from it")
            elif not temporary:
                error.add_note(_drop_slot(exporter, slot))
            raise
    finally:
        exporter.close()


# --- resuming: what a slot decodes between two snapshots ------------------------------------

# The most pgoutput messages read to learn what changed between two snapshots: beyond, a
# resumed snapshot copies its tables again instead.
MAX_WINDOW_MESSAGES = 1_000_000
# How long a resume waits for its slot to be free for the peek (as the receiver waits).
SLOT_BUSY_SECONDS = 60.0


Key = tuple[str, ...]  # a row's key columns, as PostgreSQL text


@dataclass
class TableWindow:
    """A table's changes committed between two snapshots, by commit LSN: the keys INSERTs
    wrote, the keys UPDATEs and DELETEs changed (old and new: rows that may have existed
    before), and the last commit of a change that cannot be told by key (a TRUNCATE, or a key
    pgcdc cannot read back, such as an unchanged TOASTed one)."""

    inserted: list[tuple[LSN, Key]] = field(default_factory=list)
    changed: list[tuple[LSN, Key]] = field(default_factory=list)
    unkeyed_until: LSN | None = None

    def since(self, point: LSN) -> tuple[tuple[Key, ...], tuple[Key, ...]] | None:
        """The keys inserted and the keys changed by the transactions committed at or after
        ``point``; None if a change there cannot be told by key."""
        if self.unkeyed_until is not None and self.unkeyed_until >= point:
            return None
        inserted = tuple(dict.fromkeys(key for lsn, key in self.inserted if lsn >= point))
        changed = tuple(dict.fromkeys(key for lsn, key in self.changed if lsn >= point))
        return inserted, changed


def _key_of(table: Table, *rows: Row | None) -> Key | None:
    """The key columns' text from the first of ``rows`` that sent each, or None."""
    key: list[str] = []
    for index, column in enumerate(table.columns):
        if not column.is_key:
            continue
        sent = [v for row in rows if row is not None and isinstance(v := row[index], str)]
        if not sent:
            return None
        key.append(sent[0])
    return tuple(key) if key else None


def _note(windows: dict[int, TableWindow], event: Event, committed: LSN) -> None:
    """Add a change committed at ``committed`` to its table's window."""
    if isinstance(event, Truncate):
        for table in event.tables:
            windows.setdefault(table.oid, TableWindow()).unkeyed_until = committed
        return
    if not isinstance(event, Insert | Update | Delete):
        return
    window = windows.setdefault(event.table.oid, TableWindow())
    new = None if isinstance(event, Delete) else event.new
    old = None if isinstance(event, Insert) else event.old
    found = [_key_of(event.table, new, old)] if new is not None else []
    found += [_key_of(event.table, old)] if old is not None else []
    keys = [key for key in found if key is not None]
    if not keys or len(keys) < len(found):
        window.unkeyed_until = committed
    elif isinstance(event, Insert):
        window.inserted.append((committed, keys[0]))
    else:
        window.changed += [(committed, key) for key in keys]


def window_changes(
    conninfo: str,
    slot: str,
    publications: Sequence[str],
    upto: LSN,
    session_settings: Mapping[str, str] | None = DEFAULT_SESSION_SETTINGS,
) -> dict[int, TableWindow] | None:
    """Per table OID, the keys the transactions ``slot`` would stream that commit before
    ``upto`` inserted or changed (``TableWindow``), read without moving the slot
    (``pg_logical_slot_peek_binary_changes``, pgoutput protocol 1, text values under the
    settings the snapshot's COPYs run with, so a key reads back as the same value). None if
    that is more than MAX_WINDOW_MESSAGES messages. While the slot is busy (the peek of a run
    killed a moment ago may still be running on the server) it is tried again for up to
    SLOT_BUSY_SECONDS."""
    return while_slot_busy(
        lambda: _window_changes(conninfo, slot, publications, upto, session_settings),
        SLOT_BUSY_SECONDS,
    )


def _window_changes(
    conninfo: str,
    slot: str,
    publications: Sequence[str],
    upto: LSN,
    session_settings: Mapping[str, str] | None,
) -> dict[int, TableWindow] | None:
    decoder = PgOutputDecoder()
    windows: dict[int, TableWindow] = {}
    committed: LSN | None = None
    with (
        translated(),
        psycopg.connect(
            conninfo,
            options=session_options(conninfo, session_settings),
            application_name=APPLICATION_NAME,
            client_encoding="UTF8",
            autocommit=True,
        ) as conn,
    ):
        options = PgOutputOptions(publications).for_server(conn.info.server_version)
        peeked = stream_peeked_binary_changes(
            conn, slot, upto_lsn=upto, upto_nchanges=MAX_WINDOW_MESSAGES, options=options
        )
        with contextlib.closing(peeked) as rows:
            for count, row in enumerate(rows, 1):
                if count >= MAX_WINDOW_MESSAGES:
                    return None
                event = decoder.decode_one(row.data, row.lsn)
                if isinstance(event, Begin):
                    committed = event.final_lsn
                elif committed is not None and committed < upto:
                    _note(windows, event, committed)
    return windows


@dataclass(frozen=True, slots=True)
class SnapshotPlan:
    """What a snapshot copies, as its exported snapshot sees the catalog."""

    tables: tuple[SnapshotTable, ...]
    # The non-built-in column types, as the receiver logs them from pgoutput's Type messages.
    types: dict[int, TypeInfo]
    # When the snapshot was taken: its rows' commit time (the sinks record one per change).
    taken_at: datetime | None


def plan_snapshot(
    conninfo: str,
    snapshot_name: str,
    *,
    tables: Sequence[str] | None,
    publications: Sequence[str],
    session_settings: Mapping[str, str] | None,
    copy_format: str = "auto",
) -> SnapshotPlan:
    """Look up, inside the exported snapshot, the tables to copy, their column types and the
    COPY format each takes."""
    with open_worker(conninfo, snapshot_name, session_settings) as planner:
        specs = snapshot_tables(planner, tables, publications)
        taken_at = planner.execute("SELECT now()").fetchone()
        types = type_closure(planner, {c.type_oid for s in specs for c in s.table.columns})
        specs = with_copy_formats(planner, specs, types, copy_format, session_settings)
        planner.rollback()
    return SnapshotPlan(tuple(specs), dict(types), taken_at[0] if taken_at else None)


def _copy(
    conninfo: str,
    consistent_point: LSN,
    snapshot_name: str | None,
    *,
    sink: TransactionSink,
    tables: Sequence[str] | None,
    publications: Sequence[str],
    workers: int,
    chunk_pages: int,
    session_settings: Mapping[str, str] | None,
    copy_format: str = "auto",
    truncate: bool = False,
    on_progress: Callable[[SnapshotProgress], None] | None = None,
) -> SnapshotResult:
    """Copy the tables under the exported snapshot into one synthetic transaction in
    ``sink`` at ``consistent_point - 1``; ``truncate``: a ``Truncate`` of them comes first
    (a re-copy replaces what the sink holds of them)."""
    if not snapshot_name:
        raise SnapshotError("the server created the slot but exported no snapshot")
    commit_lsn = LSN(consistent_point - 1)
    if sink.last_commit_lsn >= commit_lsn:
        fix = (
            "the slot was drained past it, which would log later changes before the copy: "
            "report this as a bug"
            if truncate
            else "write the snapshot into a new change log"
        )
        raise SnapshotError(
            f"the sink already holds transactions up to {sink.last_commit_lsn}, at or past the "
            f"snapshot's consistent point {consistent_point}; {fix}"
        )
    planned = plan_snapshot(
        conninfo,
        snapshot_name,
        tables=tables,
        publications=publications,
        session_settings=session_settings,
        copy_format=copy_format,
    )
    specs, types = planned.tables, planned.types
    chunks = plan_chunks(specs, chunk_pages)
    lsn = LSN(consistent_point)
    copier = _Copier(
        conninfo,
        snapshot_name,
        lsn,
        chunks,
        workers=min(workers, max(len(chunks), 1)),
        session_settings=session_settings,
    )

    def events() -> Iterator[Event]:
        for info in types.values():
            yield type_event(info, lsn)
        for spec in specs:
            yield Relation(lsn, spec.table)
        if truncate and specs:
            yield Truncate(lsn, tuple(spec.table for spec in specs))
        yield from copier.events(on_progress)

    copier.start()
    try:
        txn = CommittedTransaction(
            xid=None,
            commit_lsn=commit_lsn,
            end_lsn=lsn,
            commit_time=planned.taken_at,
            events=events(),
        )
        if not sink.append(txn):
            raise SnapshotError(
                f"the sink refused the snapshot transaction (its last commit LSN "
                f"{sink.last_commit_lsn} is not below {txn.commit_lsn}); use a new change log"
            )
    finally:
        copier.close()
    sink.flush()
    if on_progress is not None:
        on_progress(copier.progress())
    return SnapshotResult(
        consistent_point=lsn,
        tables=tuple(s.table for s in specs),
        rows=copier.rows,
        bytes=copier.bytes,
        snapshot_name=snapshot_name,
    )


def recopy_tables(
    conninfo: str,
    *,
    sink: TransactionSink,
    tables: Sequence[str],
    publications: Sequence[str],
    drain_to: Callable[[LSN], bool],
    workers: int = 4,
    chunk_pages: int = DEFAULT_CHUNK_PAGES,
    session_settings: Mapping[str, str] | None = DEFAULT_SESSION_SETTINGS,
    copy_format: str = "auto",
    on_progress: Callable[[SnapshotProgress], None] | None = None,
) -> SnapshotResult | None:
    """Replace ``tables`` in ``sink`` by their rows at a new consistent point C.

    A TEMPORARY slot (gone with its connection, so a crash leaves nothing behind) exports the
    snapshot at C. ``drain_to(C)`` must store in ``sink`` every transaction of the caller's
    slot whose commit starts before C and none from C on (those are not in the snapshot: they
    stream afterwards); False (a stop request) ends the re-copy with nothing appended (None).
    Then one transaction at C - 1 truncates the tables and inserts their rows as of C.
    """
    if isinstance(tables, str) or isinstance(publications, str):
        raise InvalidOption("tables and publications are sequences of names, not one string")
    _check_copy_format(copy_format)
    temporary_slot = f"pgcdc_recopy_{uuid.uuid4().hex[:16]}"
    with exported_slot(conninfo, temporary_slot, temporary=True) as created:
        # The exporting connection stays open and idle (the snapshot lives while it does)
        # while the caller's slot is drained on another connection.
        if not drain_to(created.consistent_point):
            return None
        return _copy(
            conninfo,
            created.consistent_point,
            created.snapshot_name,
            sink=sink,
            tables=tables,
            publications=publications,
            workers=workers,
            chunk_pages=chunk_pages,
            session_settings=session_settings,
            copy_format=copy_format,
            truncate=True,
            on_progress=on_progress,
        )
