"""The decoder oracle: one workload, three decodings, one answer.

Three slots are created at the same point and the same workload is decoded through pgoutput in
text mode, pgoutput in binary mode and test_decoding (read with the SQL interface, which returns
exactly the plugin's bytes per row). Each stream is turned into typed Python values with
``pgcdc.decoding.values.row_to_python`` and the three must agree change by change, in order:
tables, columns, operations, LSNs, old keys and rows, and every typed value. Where the plugins
legitimately differ, the test normalises explicitly (see ``_for_test_decoding`` and
``Oracle.typed_as_binary``) and checks the difference itself instead of dropping it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import psycopg
from psycopg import sql

from pgcdc.connection.catalog import type_info
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions
from pgcdc.decoding.pgtypes import BY_OID, TypeInfo
from pgcdc.decoding.test_decoding import TestDecodingDecoder
from pgcdc.decoding.values import BoundedList, TypeRegistry
from pgcdc.events import (
    UNCHANGED_TOAST,
    Begin,
    Commit,
    Delete,
    Event,
    Insert,
    Message,
    Origin,
    RawValue,
    Relation,
    ReplicaIdentity,
    Table,
    Truncate,
    Type,
    Unchanged,
    Update,
)
from pgcdc.lsn import LSN
from tests.conftest import Database

Conn = psycopg.Connection[Any]

# --- the workload ----------------------------------------------------------------------------

# Every type of issue 3, one column each (arrays too), with the user-defined types pgoutput
# announces with Type messages: an enum, an array of it, a domain, a composite and a range.
COLUMNS = [
    ("id", "integer PRIMARY KEY"),
    ("b", "boolean"),
    ("i2", "smallint"),
    ("i4", "integer"),
    ("i8", "bigint"),
    ("o", "oid"),
    ("f4", "real"),
    ("f8", "double precision"),
    ("n", "numeric"),
    ("n_ps", "numeric(12,4)"),
    ("t", "text"),
    ("vc", "varchar(10)"),
    ("bp", "char(5)"),
    ("nm", "name"),
    ("by", "bytea"),
    ("d", "date"),
    ("tm", "time"),
    ("tmtz", "timetz"),
    ("ts", "timestamp"),
    ("tstz", "timestamptz"),
    ("iv", "interval"),
    ("u", "uuid"),
    ("js", "json"),
    ("jsb", "jsonb"),
    ("ip", "inet"),
    ("net", "cidr"),
    ("mac", "macaddr"),
    ("m", "money"),
    ("bt", "bit(4)"),
    ("vb", "varbit(8)"),
    ("a_i4", "integer[]"),
    ("a_i4_2d", "integer[]"),
    ("a_txt", "text[]"),
    ("a_tstz", "timestamptz[]"),
    ("a_num", "numeric[]"),
    ("a_bool", "boolean[]"),
    ("a_mood", "mood[]"),
    ("md", "mood"),
    ("dom", "posint"),
    ("comp", "pair"),
    ("rng", "floatrange"),
    ("irng", "int4range"),
]
BIG_DIGITS = "123456789012345678901234567890123456789012345678901234567890.123456789"
ROWS: list[dict[str, str]] = [
    {
        "id": "1",
        "b": "true",
        "i2": "-32768",
        "i4": "2147483647",
        "i8": "-9223372036854775808",
        "o": "4294967295",
        "f4": "1.5",
        "f8": "-0.1",
        "n": "123.456",
        "n_ps": "12.5",
        "t": "'ünïcödé ✓ 😀 it''s'",
        "vc": "'abc'",
        "bp": "'ab'",
        "nm": "'pg_class'",
        "by": "'\\x00ff10'",
        "d": "'2024-02-29'",
        "tm": "'23:59:59.999999'",
        "tmtz": "'12:34:56+05:30'",
        "ts": "'2024-01-02 03:04:05.123456'",
        "tstz": "'2024-01-02 03:04:05.123456+02'",
        "iv": "'1 year 2 mons 3 days 04:05:06.789'",
        "u": "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'",
        "js": '\'{"a": [1, 2.50, "x"], "a": "dup"}\'',
        "jsb": '\'{"b": 1, "a": [true, null, 1.5]}\'',
        "ip": "'192.168.0.1/24'",
        "net": "'10.0.0.0/8'",
        "mac": "'08:00:2b:01:02:03'",
        "m": "'1234.56'",
        "bt": "B'1010'",
        "vb": "B'101'",
        "a_i4": "'{1,NULL,3}'",
        "a_i4_2d": "'{{1,2},{3,NULL}}'",
        "a_txt": "ARRAY['a b', 'c,d', NULL, '', 'NULL', 'x\"y', 'back\\slash', 'ü']",
        "a_tstz": "'{\"2024-01-01 00:00:00+00\",infinity,NULL}'",
        "a_num": "'{1.5,NaN,-Infinity,NULL}'",
        "a_bool": "'{t,f,NULL}'",
        "a_mood": "'{sad,happy,NULL}'",
        "md": "'ok'",
        "dom": "5",
        "comp": "ROW(1, 'a b')",
        "rng": "'[1.5,2.5)'",
        "irng": "'[1,10)'",
    },
    {
        "id": "2",
        "b": "false",
        "i2": "32767",
        "i4": "0",
        "i8": "9223372036854775807",
        "o": "0",
        "f4": "'NaN'",
        "f8": "'-Infinity'",
        "n": BIG_DIGITS,
        "n_ps": "'NaN'",
        "t": "''",
        "vc": "''",
        "bp": "''",
        "nm": "''",
        "by": "''",
        "d": "'4713-01-01 BC'",
        "tm": "'24:00:00'",
        "tmtz": "'00:00:00-08'",
        "ts": "'0044-03-15 10:00:00 BC'",
        "tstz": "'infinity'",
        "iv": "'-1 year -2 mons +3 days -04:05:06.000001'",
        "u": "'00000000-0000-0000-0000-000000000000'",
        "js": "'\"\"'",
        "jsb": "'\"ü\"'",
        "ip": "'2001:db8::1/64'",
        "net": "'2001:db8::/32'",
        "mac": "'ff-ff-ff-ff-ff-ff'",
        "m": "'-92233720368547758.08'",
        "bt": "B'0000'",
        "vb": "B''",
        "a_i4": "'{}'",
        "a_i4_2d": "'[0:1][-1:0]={{1,2},{3,4}}'",
        "a_txt": "'{}'",
        "a_tstz": "'{-infinity}'",
        "a_num": f"'{{Infinity,{BIG_DIGITS}}}'",
        "a_bool": "'{}'",
        "a_mood": "'{}'",
        "md": "'happy'",
        "dom": "2147483647",
        "comp": "ROW(NULL, '')",
        "rng": "'empty'",
        "irng": "'(,)'",
    },
    {"id": "3"},  # every other column NULL
    {
        "id": "4",
        "f4": "'Infinity'",
        "f8": "'NaN'",
        "n": "'-Infinity'",
        "n_ps": "-12345678.1234",
        "d": "'infinity'",
        "ts": "'-infinity'",
        "tstz": "'0100-01-01 00:00:00.000001+00 BC'",
        "m": "'92233720368547758.07'",
        "t": "E'tab\\there\\nnew line \\\\ backslash'",
    },
]

SCHEMA = [
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE DOMAIN posint AS integer CHECK (VALUE > 0)",
    "CREATE TYPE pair AS (a integer, b text)",
    "CREATE TYPE floatrange AS RANGE (subtype = float8)",
    "CREATE TABLE everything ("
    + ", ".join(f"{name} {sql_type}" for name, sql_type in COLUMNS)
    + ")",
    "CREATE TABLE full_rows (id integer PRIMARY KEY, v text, n integer)",
    "ALTER TABLE full_rows REPLICA IDENTITY FULL",
    "CREATE TABLE by_index (a integer NOT NULL, b text, c integer)",
    "CREATE UNIQUE INDEX by_index_a ON by_index (a)",
    "ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_a",
    # Out of line and uncompressed (EXTERNAL), so an UPDATE that leaves them alone does not
    # write them again: the server sends them as unchanged TOAST.
    "CREATE TABLE toasty (id integer PRIMARY KEY, big text, blob bytea, n integer)",
    "ALTER TABLE toasty ALTER big SET STORAGE EXTERNAL, ALTER blob SET STORAGE EXTERNAL",
    "CREATE TABLE parent (id serial PRIMARY KEY)",
    "CREATE TABLE child (id serial PRIMARY KEY, parent_id integer REFERENCES parent)",
    "CREATE PUBLICATION pub FOR ALL TABLES",
    "SELECT pg_replication_origin_create('oracle_origin')",
]
ORIGIN_LSN = LSN("0/1234ABCD")
ORIGIN_TIME = datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)
# md5 hex of consecutive numbers: no repeats for pglz to find, > 2 kB, stored out of line.
BIG_TEXT = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 200) g)"
BIG_BYTES = "(SELECT decode(string_agg(md5(g::text), ''), 'hex') FROM generate_series(1, 200) g)"


def _insert(row: dict[str, str]) -> str:
    names = ", ".join(row)
    return f"INSERT INTO everything ({names}) VALUES ({', '.join(row.values())})"


def run_workload(db: Database) -> None:
    """Every change kind, replica identity, TOAST, TRUNCATE flags, messages, an origin and DDL
    mid-stream. Statements outside ``transaction()`` blocks commit on their own."""
    with db.connect() as conn:
        with conn.transaction():
            for row in ROWS:
                conn.execute(_insert(row))
            conn.execute("SELECT pg_logical_emit_message(true, 'oracle', 'in a transaction')")
        conn.execute("UPDATE everything SET t = 'changed', jsb = NULL WHERE id = 1")
        conn.execute("UPDATE everything SET id = 20 WHERE id = 2")  # key change: old key
        conn.execute("DELETE FROM everything WHERE id = 3")
        conn.execute("SELECT pg_logical_emit_message(false, 'oracle', E'\\\\x00ff'::bytea)")

        conn.execute("INSERT INTO full_rows VALUES (1, 'a', NULL), (2, 'b', 7)")
        conn.execute("UPDATE full_rows SET v = 'a2' WHERE id = 1")  # old row has a NULL
        conn.execute("UPDATE full_rows SET id = 3, v = 'b2' WHERE id = 2")
        conn.execute("DELETE FROM full_rows WHERE id = 3")

        conn.execute("INSERT INTO by_index VALUES (1, 'x', 1), (2, 'y', NULL)")
        conn.execute("UPDATE by_index SET c = 2 WHERE a = 1")  # index key unchanged: no old
        conn.execute("UPDATE by_index SET a = 5 WHERE a = 1")
        conn.execute("DELETE FROM by_index WHERE a = 2")

        conn.execute(f"INSERT INTO toasty VALUES (1, {BIG_TEXT}, {BIG_BYTES}, 0)")
        conn.execute("UPDATE toasty SET n = 1")  # big and blob: unchanged TOAST
        conn.execute("UPDATE toasty SET big = big || 'x', n = 2")  # big sent again, blob not
        conn.execute("DELETE FROM toasty")

        conn.execute("ALTER TABLE everything ADD COLUMN extra text DEFAULT 'dflt'")
        conn.execute("INSERT INTO everything (id, extra) VALUES (5, 'added')")
        conn.execute("UPDATE everything SET extra = 'set' WHERE id = 1")
        conn.execute("DELETE FROM everything WHERE id = 5")

        conn.execute("INSERT INTO parent DEFAULT VALUES")
        conn.execute("INSERT INTO child (parent_id) VALUES (1)")
        conn.execute("TRUNCATE parent RESTART IDENTITY CASCADE")
        conn.execute("TRUNCATE by_index")

    with db.connect() as replicated:
        replicated.execute("SELECT pg_replication_origin_session_setup('oracle_origin')")
        with replicated.transaction():
            replicated.execute(
                "SELECT pg_replication_origin_xact_setup(%s::text::pg_lsn, %s)",
                (str(ORIGIN_LSN), ORIGIN_TIME),
            )
            replicated.execute("INSERT INTO full_rows VALUES (10, 'from the origin', 1)")
        replicated.execute("SELECT pg_replication_origin_session_reset()")


# --- reading the three slots -----------------------------------------------------------------


def _decoding_session(conn: Conn) -> None:
    """The SQL interface decodes in this session, so its settings shape the text output:
    pin the ones pgcdc.decoding.values expects, and a time zone with a non-hour offset."""
    conn.execute("SET DateStyle = 'ISO, MDY'")
    conn.execute("SET IntervalStyle = 'postgres'")
    conn.execute("SET TimeZone = 'Asia/Kolkata'")


def _slot_rows(conn: Conn, slot: str, options: dict[str, str]) -> list[tuple[LSN, bytes]]:
    flat = [item for pair in options.items() for item in pair]
    rows = conn.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes("
        "%s, NULL, NULL, VARIADIC %s::text[])",
        (slot, flat),
    ).fetchall()
    return [(LSN.parse(lsn), bytes(data)) for lsn, data in rows]


@dataclass
class Streams:
    text: list[Event]
    binary: list[Event]
    test_decoding: list[Event]


def decode_three_ways(db: Database) -> Streams:
    with db.connect() as conn:
        for statement in SCHEMA:
            conn.execute(statement)
        for slot, plugin in (
            ("p_text", "pgoutput"),
            ("p_bin", "pgoutput"),
            ("td", "test_decoding"),
        ):
            conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
    run_workload(db)
    with db.connect() as conn:
        _decoding_session(conn)
        version = conn.info.server_version
        streams = []
        for slot, binary in (("p_text", False), ("p_bin", True)):
            options = PgOutputOptions(["pub"], binary=binary, messages=True)
            decoder = PgOutputDecoder.for_options(options)
            rows = _slot_rows(conn, slot, options.for_server(version))
            streams.append([e for lsn, data in rows for e in decoder.decode(data, lsn)])
        td_options = {"include-xids": "1", "include-timestamp": "1", "skip-empty-xacts": "1"}
        td_decoder = TestDecodingDecoder()
        td_rows = _slot_rows(conn, "td", td_options)
        td_events = [e for lsn, data in td_rows for e in td_decoder.decode(data, lsn)]
    return Streams(streams[0], streams[1], td_events)


# --- typed, comparable records ---------------------------------------------------------------


def canonical(value: Any) -> Any:
    """A value that compares equal exactly when two typed values are the same: NaN equals
    NaN, -0.0 differs from 0.0, 1 differs from True and 1.0, the numeric scale counts, and
    aware datetimes compare as instants whatever offset they were printed in."""
    if isinstance(value, Unchanged) or value is None:
        return value
    if isinstance(value, BoundedList):
        return ("BoundedList", value.lower_bounds, tuple(canonical(v) for v in value))
    if isinstance(value, list):
        return ("list", tuple(canonical(v) for v in value))
    if isinstance(value, float):
        return ("float", "nan" if math.isnan(value) else repr(value))
    if isinstance(value, Decimal):
        return ("Decimal", str(value))
    if isinstance(value, datetime) and value.tzinfo is not None:
        return ("datetime+tz", value.astimezone(UTC))
    return (type(value).__name__, value)


Typer = Callable[[Table, Sequence[RawValue]], tuple[Any, ...]]


def records(
    events: Sequence[Event], typed: Typer, resolve: Callable[[Table], Table] = lambda t: t
) -> list[tuple[Any, ...]]:
    """Each event as a tuple of what must agree between decodings, rows typed by ``typed``
    against the table ``resolve`` gives (test_decoding's tables get their type OIDs there)."""
    out: list[tuple[Any, ...]] = []
    for original in events:
        event = original
        if isinstance(event, Insert | Update | Delete):
            event = replace(event, table=resolve(event.table))
        match event:
            case Begin(xid=xid):
                out.append(("begin", xid))
            case Commit(end_lsn=end_lsn, commit_time=when):
                out.append(("commit", end_lsn, when))
            case Origin(name=name, origin_lsn=origin_lsn):
                out.append(("origin", name, origin_lsn))
            case Type(oid=oid, namespace=namespace, name=name):
                out.append(("type", oid, namespace, name))
            case Relation(table=table):
                out.append(("relation", table))
            case Insert(lsn=lsn, table=table, new=new):
                out.append(("insert", lsn, _shape(table), typed(table, new)))
            case Update(lsn=lsn, table=table, new=new, old=old, old_is_key=old_is_key):
                old_typed = None if old is None else typed(table, old)
                out.append(("update", lsn, _shape(table), typed(table, new), old_typed, old_is_key))
            case Delete(lsn=lsn, table=table, old=old, old_is_key=old_is_key):
                out.append(("delete", lsn, _shape(table), typed(table, old), old_is_key))
            case Truncate(lsn=lsn, tables=tables, cascade=cascade, restart_identity=restart):
                names = tuple(t.qualified_name for t in tables)
                out.append(("truncate", lsn, names, cascade, restart))
            case Message(lsn=lsn, transactional=transactional, prefix=prefix, content=content):
                out.append(("message", lsn, transactional, prefix, content))
            case _:
                raise AssertionError(f"the workload has no {type(event).__name__} events")
    return out


def _shape(table: Table) -> tuple[str, tuple[tuple[str, int], ...]]:
    return table.qualified_name, tuple((c.name, c.type_oid) for c in table.columns)


class Oracle:
    """Typing helpers bound to the server: its TypeInfos and its send functions."""

    def __init__(self, conn: Conn, streams: Streams) -> None:
        self.conn = conn
        user_oids = {e.oid for e in streams.text if isinstance(e, Type)}
        user_oids |= {
            c.type_oid
            for e in streams.text
            if isinstance(e, Relation)
            for c in e.table.columns
            if c.type_oid not in BY_OID
        }
        self.types: dict[int, TypeInfo] = type_info(conn, user_oids)
        self.relations = [e for e in streams.text if isinstance(e, Relation)]
        self.registry = TypeRegistry(self.types)
        self._oid_by_name: dict[str, int] = {}

    def typed(self, table: Table, row: Sequence[RawValue]) -> tuple[Any, ...]:
        return tuple(canonical(v) for v in self.registry.row_to_python(table, row))

    def opaque(self, type_oid: int) -> bool:
        """Types pgcdc keeps as the server's text: composites and ranges (from binary too)."""
        return self.registry.resolve(type_oid).name in ("composite", "range")

    def with_server_oids(self, table: Table) -> Table:
        """test_decoding names types; the server says which OID each name is. Built-in names
        that pgcdc already mapped must map to the same OID."""
        columns = []
        for column in table.columns:
            assert column.type_name is not None
            oid = self._oid_by_name.get(column.type_name)
            if oid is None:
                row = self.conn.execute("SELECT %s::regtype::oid", (column.type_name,)).fetchone()
                assert row is not None
                oid = self._oid_by_name[column.type_name] = int(row[0])
            assert column.type_oid in (0, oid), (column, oid)
            columns.append(replace(column, type_oid=oid))
        return replace(table, columns=tuple(columns))


def _opaque_values(oracle: Oracle, events: Sequence[Event], kind: type) -> int:
    """How many non-NULL composite and range values arrived as ``kind`` (str or bytes)."""
    count = 0
    for event in events:
        if isinstance(event, Insert):
            for column, raw in zip(event.table.columns, event.new, strict=True):
                if raw is not None and oracle.opaque(column.type_oid):
                    assert isinstance(raw, kind), (column, raw)
                    count += 1
    return count


def _for_test_decoding(
    pgoutput: list[tuple[Any, ...]], full_tables: set[str]
) -> list[tuple[Any, ...]]:
    """The pgoutput records test_decoding can reproduce, each difference checked, not hidden.

    - Origin and Type: test_decoding prints no such lines (checked on their own in the test).
    - Relation: test_decoding has no relation line; its decoder infers a Relation when an
      INSERT or UPDATE shows a new column list, so Relations fall in other places. Every change
      still carries its table's name and column (name, type OID) list, compared there.
    - REPLICA IDENTITY FULL old rows: test_decoding prints them as ``old-key:`` without their
      NULL columns, so its decoder can only call an old row whole (old_is_key False) when no
      column is NULL. The values agree; old_is_key agrees exactly when the row has no NULL.
    """
    out = []
    for record in pgoutput:
        kind = record[0]
        if kind in ("origin", "type", "relation"):
            continue
        if kind in ("update", "delete") and record[2][0] in full_tables:
            old = record[4] if kind == "update" else record[3]
            assert record[-1] is False, record  # pgoutput: a FULL table's old row is whole
            out.append((*record[:-1], old is not None and None in old))
        else:
            out.append(record)
    return out


def _replayed(events: Sequence[Event], name: str, oracle: Oracle) -> dict[Any, tuple[Any, ...]]:
    """Apply one table's decoded changes to {key: typed row} (the key is the first column)."""
    rows: dict[Any, tuple[Any, ...]] = {}
    for event in events:
        if isinstance(event, Truncate) and any(t.name == name for t in event.tables):
            rows.clear()
        if not isinstance(event, Insert | Update | Delete) or event.table.name != name:
            continue
        if isinstance(event, Delete):
            del rows[oracle.typed(event.table, event.old)[0]]
            continue
        new = oracle.typed(event.table, event.new)
        assert UNCHANGED_TOAST not in new
        if isinstance(event, Update):
            old = event.old if event.old is not None else event.new
            del rows[oracle.typed(event.table, old)[0]]
        rows[new[0]] = new
    return rows


def replayed_shorter_rows(events: Sequence[Event]) -> int:
    """How many everything rows were last written before ADD COLUMN (so the default check
    above runs on at least one)."""
    last: dict[Any, int] = {}
    for event in events:
        if isinstance(event, Insert | Update) and event.table.name == "everything":
            last[event.new[0]] = len(event.new)
        if isinstance(event, Delete) and event.table.name == "everything":
            last.pop(event.old[0], None)
    return sum(width < len(COLUMNS) + 1 for width in last.values())


def _server_rows(conn: Conn, name: str, oracle: Oracle) -> dict[Any, tuple[Any, ...]]:
    """The table's rows as the server's output functions print them (what text-mode decoding
    is sent), typed through the table's last Relation."""
    relation = next(e.table for e in reversed(oracle.relations) if e.table.name == name)
    cursor = conn.execute(sql.SQL("SELECT * FROM {}").format(sql.Identifier(name)))
    result = cursor.pgresult
    assert result is not None
    rows = {}
    for i in range(result.ntuples):
        raw = tuple(
            None if (v := result.get_value(i, j)) is None else bytes(v).decode()
            for j in range(result.nfields)
        )
        typed = oracle.typed(relation, raw)
        rows[typed[0]] = typed
    return rows


# --- the test --------------------------------------------------------------------------------


def test_three_decodings_agree(db: Database) -> None:
    streams = decode_three_ways(db)
    with db.connect() as conn:
        _decoding_session(conn)
        oracle = Oracle(conn, streams)
        full_tables = {
            f"public.{name}"
            for (name,) in conn.execute(
                "SELECT relname::text FROM pg_class WHERE relreplident = 'f' "
                "AND relnamespace = 'public'::regnamespace"
            )
        }
        text_records = records(streams.text, oracle.typed)
        binary_records = records(streams.binary, oracle.typed)
        td_records = records(streams.test_decoding, oracle.typed, oracle.with_server_oids)

    # The comparison is not vacuous: the workload's pieces all came through.
    kinds = [r[0] for r in text_records]
    assert kinds.count("insert") == len(ROWS) + 2 + 2 + 1 + 1 + 1 + 1 + 1
    assert kinds.count("update") == 1 + 1 + 2 + 2 + 2 + 1
    assert kinds.count("delete") == 1 + 1 + 1 + 1 + 1
    assert kinds.count("truncate") == 2 and kinds.count("message") == 2
    assert full_tables == {"public.full_rows"}

    # 1. pgoutput text and binary: the same messages, and the same typed values. Composite
    # and range values came as bytes in binary mode and as str in text mode, and decode to the
    # same text (pgcdc.decoding.textforms prints the send format as the output function does).
    assert _opaque_values(oracle, streams.binary, bytes) >= 6
    assert _opaque_values(oracle, streams.text, str) >= 6
    assert binary_records == text_records
    # Binary mode really was binary: typed values came from bytes, not from text.
    assert any(
        isinstance(raw, bytes) for e in streams.binary if isinstance(e, Insert) for raw in e.new
    )

    # 2. test_decoding against pgoutput (text), change by change.
    expected = _for_test_decoding(text_records, full_tables)
    td_without_relations = [r for r in td_records if r[0] != "relation"]
    for position, (got, want) in enumerate(zip(td_without_relations, expected, strict=False)):
        assert got == want, f"record {position} differs"
    assert len(td_without_relations) == len(expected)

    # 3. What only pgoutput says, checked on its own.
    origins = [e for e in streams.text if isinstance(e, Origin)]
    assert [(o.name, o.origin_lsn) for o in origins] == [("oracle_origin", ORIGIN_LSN)]
    at = streams.text.index(origins[0])
    assert isinstance(streams.text[at - 1], Begin)
    after_origin = next(e for e in streams.text[at:] if isinstance(e, Insert))
    assert after_origin.new[1] == "from the origin"
    # Type messages: one per user-defined column type, named as the catalogue names it, except
    # the domain, which pgoutput names by its base type (logicalrep_write_typ uses getBaseType).
    sent_types = {e.oid: (e.namespace, e.name) for e in streams.text if isinstance(e, Type)}
    assert set(sent_types) == set(oracle.types)
    by_name = {t.name: t for t in oracle.types.values()}
    assert {"mood", "_mood", "posint", "pair", "floatrange"} == set(by_name)
    domain = by_name.pop("posint")
    assert domain.kind == "d" and domain.base_oid == 23
    assert sent_types[domain.oid] == ("pg_catalog", "int4")
    assert all(sent_types[t.oid] == (t.namespace, t.name) for t in by_name.values())
    assert by_name["mood"].kind == "e" and by_name["_mood"].element_oid == by_name["mood"].oid

    # Unchanged TOAST comes out as UNCHANGED_TOAST from all three decodings.
    for events in (streams.text, streams.binary, streams.test_decoding):
        toasty = [e for e in events if isinstance(e, Update) and e.table.name == "toasty"]
        assert [e.new[1:3] for e in toasty] == [
            (UNCHANGED_TOAST, UNCHANGED_TOAST),
            (toasty[1].new[1], UNCHANGED_TOAST),
        ]
        assert isinstance(toasty[1].new[1], str | bytes) and len(toasty[1].new[1]) > 6400

    # The replica identities pgoutput reported are the ones the schema set.
    identities = {
        e.table.name: e.table.replica_identity for e in streams.text if isinstance(e, Relation)
    }
    assert identities["full_rows"] is ReplicaIdentity.FULL
    assert identities["by_index"] is ReplicaIdentity.INDEX
    assert identities["everything"] is ReplicaIdentity.DEFAULT

    # The three could agree on a wrong value: replaying the changes must give the rows the
    # server holds, read back in its own text output and typed the same way.
    with db.connect() as conn:
        _decoding_session(conn)
        oracle.conn = conn
        for name in ("everything", "full_rows"):
            replayed = _replayed(streams.text, name, oracle)
            held = _server_rows(conn, name, oracle)
            assert replayed.keys() == held.keys() and held
            for key, row in replayed.items():
                # Rows last changed before ADD COLUMN were decoded without the new column; the
                # server fills it with the column's default.
                assert held[key][: len(row)] == row
                assert held[key][len(row) :] in ((), (("str", "dflt"),))
    assert replayed_shorter_rows(streams.text) >= 1
