"""test_decoding against real PostgreSQL 15 and 18: what the server prints parses into the right
events, every value equals the server's own text output of the column, and formatting gives the
line back byte for byte."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgcdc.decoding.test_decoding import TestDecodingDecoder, format_test_decoding
from pgcdc.errors import MissingOutputData
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
    RawValue,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Table,
    Truncate,
    Update,
)
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from tests.conftest import Database

WEIRD = '"My Schema"."we""ird"'

SCHEMA = f"""
CREATE SCHEMA "My Schema";
CREATE TABLE {WEIRD} (
    id integer PRIMARY KEY,
    "Mixed Col" text,
    "select" text,
    i2 smallint, i8 bigint, n numeric(10,2), r real, d double precision,
    b boolean, bits bit(4), vb bit varying(8),
    vc varchar(10), ch char(3), t text, by bytea, js jsonb,
    ts timestamptz, tsn timestamp(3), dt date, tm time, iv interval,
    arr integer[], tarr text[], u uuid, ip inet, o oid
);
CREATE TABLE full_ident (id integer PRIMARY KEY, a text, b integer);
ALTER TABLE full_ident REPLICA IDENTITY FULL;
CREATE TABLE by_index (id integer, code text NOT NULL, v text);
CREATE UNIQUE INDEX by_index_code ON by_index (code);
ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_code;
CREATE TABLE no_key (a integer, b text);
CREATE TABLE toasty (id integer PRIMARY KEY, small text, big text);
CREATE TABLE parent (id serial PRIMARY KEY);
CREATE TABLE child (id serial PRIMARY KEY, parent_id integer REFERENCES parent (id));
"""

ROW_1 = (
    f"INSERT INTO {WEIRD} VALUES (1, 'it''s a \"test\"', 'x: [y] z', 1, 9223372036854775807, "
    "12.50, 'NaN', '-Infinity', true, B'1010', B'101', 'ñandú 🐘', 'ab', "
    "E'line1\\nline2\\ttab '' quote \\\\ backslash', '\\x00ff', '{\"k\": [1, \"v\"]}', "
    "'2026-01-02 03:04:05.678+02', '1999-12-31 23:59:59.123', '2000-02-29', '12:34:56', "
    "'1 year 2 mons 3 days 04:05:06', '{1,NULL,3}', '{\"a b\",\"c,d\",NULL,\"\"}', "
    "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '192.168.0.1/24', 42)"
)
ROW_2 = f"INSERT INTO {WEIRD} (id, \"Mixed Col\", t, b) VALUES (2, '', '', false)"
ROW_3 = f"INSERT INTO {WEIRD} (id) VALUES (3)"


def _changes(conn: psycopg.Connection[Any], slot: str, *options: str) -> list[tuple[LSN, bytes]]:
    placeholders = ", ".join(["%s"] * len(options))
    rows = conn.execute(
        f"SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes(%s, NULL, NULL"
        f"{', ' + placeholders if options else ''})",
        (slot, *options),
    ).fetchall()
    return [(LSN(lsn), bytes(data)) for lsn, data in rows]


def _decode_all(
    lines: list[tuple[LSN, bytes]], decoder: TestDecodingDecoder
) -> list[tuple[bytes, list[Event]]]:
    return [(data, decoder.decode(data, lsn)) for lsn, data in lines]


def _assert_round_trip(decoded: list[tuple[bytes, list[Event]]], server_major: int) -> None:
    """Each line formats back byte for byte from its own event alone (StreamStop included: it
    carries test_decoding's xid)."""
    for data, events in decoded:
        line_events = [e for e in events if not isinstance(e, Relation)]
        assert len(line_events) == 1, (data, events)
        text = format_test_decoding(line_events[0], server_major=server_major)
        assert text.encode() == data


def _text_rows(conn: psycopg.Connection[Any], table: str, key: str) -> dict[str, tuple[Any, ...]]:
    """Every row as the server's own text output of each column (its output function), keyed
    by ``key``."""
    columns = [
        name
        for (name,) in conn.execute(
            "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 "
            "AND NOT attisdropped ORDER BY attnum",
            (table,),
        )
    ]
    # The type's output function, as logical decoding uses (a boolean::text cast says "true").
    quoted = [f'"{c.replace(chr(34), chr(34) * 2)}"' for c in columns]
    select = ", ".join(f"CASE WHEN {q} IS NOT NULL THEN format('%s', {q}) END" for q in quoted)
    rows = conn.execute(f"SELECT {select} FROM {table}").fetchall()
    position = columns.index(key)
    return {row[position]: tuple(row) for row in rows}


def _mirror(events: list[Event], table_name: str, key: str) -> dict[RawValue, tuple[RawValue, ...]]:
    """Replay the decoded changes of one table into {key: row}, carrying unchanged TOAST."""
    rows: dict[RawValue, tuple[RawValue, ...]] = {}
    for event in events:
        if isinstance(event, Insert | Update | Delete) and event.table.name == table_name:
            names = [c.name for c in event.table.columns]
            k = names.index(key)
        if isinstance(event, Insert) and event.table.name == table_name:
            rows[event.new[k]] = tuple(event.new)
        elif isinstance(event, Update) and event.table.name == table_name:
            old_key = event.old[k] if event.old is not None else event.new[k]
            previous = rows.pop(old_key)
            rows[event.new[k]] = tuple(
                before if after is UNCHANGED_TOAST else after
                for before, after in zip(previous, event.new, strict=True)
            )
        elif isinstance(event, Delete) and event.table.name == table_name:
            del rows[event.old[k]]
        elif isinstance(event, Truncate) and any(t.name == table_name for t in event.tables):
            rows.clear()
    return rows


def test_workload_parses_and_matches_server_text(db: Database) -> None:
    with db.connect() as conn:
        conn.execute(SCHEMA)
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
        conn.execute(ROW_1)
        with conn.transaction():
            conn.execute(ROW_2)
            conn.execute(ROW_3)
            conn.execute("SELECT pg_logical_emit_message(true, 'p, sz: 1 content:', 'hello')")
        conn.execute(f"UPDATE {WEIRD} SET t = 'changed', js = NULL WHERE id = 2")
        conn.execute(f"UPDATE {WEIRD} SET id = 20 WHERE id = 2")  # key change: old-key
        conn.execute(f"DELETE FROM {WEIRD} WHERE id = 3")
        conn.execute("INSERT INTO full_ident VALUES (1, 'a', NULL), (2, 'b', 7)")
        conn.execute("UPDATE full_ident SET a = 'a2' WHERE id = 1")
        conn.execute("UPDATE full_ident SET a = 'b2' WHERE id = 2")
        conn.execute("DELETE FROM full_ident WHERE id = 2")
        conn.execute("INSERT INTO by_index VALUES (1, 'c1', 'v'), (2, 'c2', 'w')")
        conn.execute("UPDATE by_index SET code = 'c1b' WHERE code = 'c1'")
        conn.execute("UPDATE by_index SET v = 'w2' WHERE code = 'c2'")
        conn.execute("DELETE FROM by_index WHERE code = 'c2'")
        conn.execute("INSERT INTO no_key VALUES (1, 'x')")
        conn.execute("DELETE FROM no_key")
        big = conn.execute("SELECT string_agg(md5(g::text), '') FROM generate_series(1, 200) g")
        big_text = big.fetchone()[0]  # type: ignore[index]
        conn.execute("INSERT INTO toasty VALUES (1, 's', %s)", (big_text,))
        conn.execute("UPDATE toasty SET small = 's2' WHERE id = 1")
        conn.execute("SELECT pg_logical_emit_message(false, 'nontx', 'bye')")
        conn.execute("INSERT INTO parent DEFAULT VALUES")
        conn.execute("INSERT INTO child (parent_id) VALUES (1)")
        conn.execute("TRUNCATE parent RESTART IDENTITY CASCADE")
        conn.execute("TRUNCATE no_key")

        lines = _changes(conn, "s", "include-xids", "1", "include-timestamp", "1")
        decoded = _decode_all(lines, TestDecodingDecoder())
        events = [e for _, es in decoded for e in es]
        _assert_round_trip(decoded, db.major)

        # Every column of every surviving row equals the server's text output.
        for table, key in ((WEIRD, "id"), ("full_ident", "id"), ("by_index", "code")):
            name = 'we"ird' if table == WEIRD else table
            assert _mirror(events, name, key) == _text_rows(conn, table, key)
        assert _mirror(events, "toasty", "id") == _text_rows(conn, "toasty", "id")

    by_kind: dict[type, list[Any]] = {}
    for event in events:
        by_kind.setdefault(type(event), []).append(event)
    begins, commits = by_kind[Begin], by_kind[Commit]
    assert len(begins) == len(commits) > 10
    assert all(b.xid == c.xid and b.xid is not None for b, c in zip(begins, commits, strict=True))
    assert all(c.commit_time is not None and c.commit_time.tzinfo for c in commits)

    weird_insert = next(e for e in by_kind[Insert] if e.table.name == 'we"ird')
    assert weird_insert.table.namespace == "My Schema"
    names = [c.name for c in weird_insert.table.columns]
    assert names[:3] == ["id", "Mixed Col", "select"]
    values = dict(zip(names, weird_insert.new, strict=True))
    assert values["Mixed Col"] == 'it\'s a "test"'
    assert values["t"] == "line1\nline2\ttab ' quote \\ backslash"
    assert values["b"] == "t" and values["bits"] == "1010" and values["r"] == "NaN"
    types = {c.name: (c.type_oid, c.type_name) for c in weird_insert.table.columns}
    assert types["n"] == (1700, "numeric")
    assert types["vc"] == (1043, "character varying")
    assert types["arr"] == (1007, "integer[]")
    assert types["ts"] == (1184, "timestamp with time zone")
    row3 = next(e for e in by_kind[Insert] if e.table.name == 'we"ird' and e.new[0] == "3")
    assert row3.new[1:] == (None,) * (len(names) - 1)

    updates = by_kind[Update]
    key_change = next(u for u in updates if u.new[0] == "20")
    assert key_change.old is not None and key_change.old[0] == "2" and key_change.old_is_key
    assert key_change.old[1:] == (None,) * (len(names) - 1)
    plain = next(u for u in updates if u.table.name == 'we"ird' and u.new[0] == "2")
    assert plain.old is None

    full_updates = [u for u in updates if u.table.name == "full_ident"]
    # The old row of a FULL table: NULL columns are left out, so only a row without NULLs is
    # known to be whole.
    assert full_updates[0].old == ("1", "a", None) and full_updates[0].old_is_key
    assert full_updates[1].old == ("2", "b", "7") and not full_updates[1].old_is_key
    full_delete = next(d for d in by_kind[Delete] if d.table.name == "full_ident")
    assert full_delete.old == ("2", "b2", "7") and not full_delete.old_is_key

    index_updates = [u for u in updates if u.table.name == "by_index"]
    assert index_updates[0].old == (None, "c1", None) and index_updates[0].old_is_key
    assert index_updates[1].old is None
    index_delete = next(d for d in by_kind[Delete] if d.table.name == "by_index")
    assert index_delete.old == (None, "c2", None)

    no_key_delete = next(d for d in by_kind[Delete] if d.table.name == "no_key")
    assert no_key_delete.old == ()

    toast_update = next(u for u in updates if u.table.name == "toasty")
    assert toast_update.new == ("1", "s2", UNCHANGED_TOAST)

    truncates = by_kind[Truncate]
    assert [t.name for t in truncates[0].tables] == ["parent", "child"]
    assert truncates[0].cascade and truncates[0].restart_identity
    assert truncates[1].tables[0].name == "no_key"
    assert not truncates[1].cascade and not truncates[1].restart_identity

    messages = by_kind[Message]
    assert [(m.transactional, m.prefix, m.content) for m in messages] == [
        (True, "p, sz: 1 content:", b"hello"),
        (False, "nontx", b"bye"),
    ]
    relations = [e.table.name for e in by_kind[Relation]]
    # No DDL ran, so each table is described once (DELETE-only tables never: no full tuple).
    assert sorted(relations) == sorted(
        ['we"ird', "full_ident", "by_index", "no_key", "toasty", "parent", "child"]
    )


def test_without_xids_or_timestamps(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY)")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
        conn.execute("INSERT INTO t VALUES (1)")
        lines = _changes(conn, "s", "include-xids", "0")
    decoded = _decode_all(lines, TestDecodingDecoder())
    assert [data for data, _ in decoded] == [
        b"BEGIN",
        b"table public.t: INSERT: id[integer]:1",
        b"COMMIT",
    ]
    begin, commit = decoded[0][1][0], decoded[2][1][0]
    assert isinstance(begin, Begin) and begin.xid is None
    assert isinstance(commit, Commit) and commit.xid is None and commit.commit_time is None
    assert commit.commit_lsn == commit.end_lsn == lines[2][0]
    _assert_round_trip(decoded, db.major)


@pytest.mark.parametrize("timestamps", [True, False], ids=["timestamps", "no-timestamps"])
def test_streamed_transactions(db: Database, timestamps: bool) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE big (id integer, pad text)")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
        with conn.transaction():
            committed_xid = int(conn.execute("SELECT txid_current()").fetchone()[0])  # type: ignore[index]
            conn.execute(
                "INSERT INTO big SELECT g, repeat('x', 100) FROM generate_series(1, 3000) g"
            )
        conn.execute("INSERT INTO big VALUES (0, 'flush')")
        conn.execute("SET logical_decoding_work_mem = '64kB'")
        lines = _changes(
            conn,
            "s",
            "include-xids",
            "1",
            "include-timestamp",
            "1" if timestamps else "0",
            "stream-changes",
            "1",
        )

    decoder = TestDecodingDecoder()
    decoded: list[tuple[bytes, list[Event]]] = []
    change_lines = 0
    for lsn, data in lines:
        if data.startswith(b"streaming change for TXN "):
            change_lines += 1
            with pytest.raises(MissingOutputData, match="stream-changes"):
                decoder.decode(data, lsn)
            continue
        decoded.append((data, decoder.decode(data, lsn)))
    assert change_lines > 100

    events = [e for _, es in decoded for e in es]
    starts = [e for e in events if isinstance(e, StreamStart)]
    assert {s.xid for s in starts} == {committed_xid}
    assert starts[0].first_segment is True
    assert sum(s.first_segment for s in starts) == 1
    stops = [e for e in events if isinstance(e, StreamStop)]
    assert len(stops) == len(starts) and {s.xid for s in stops} == {committed_xid}
    commits = [e for e in events if isinstance(e, StreamCommit)]
    assert [c.xid for c in commits] == [committed_xid]
    if timestamps:
        assert commits[0].commit_time is not None
        assert commits[0].commit_time.tzinfo is not None
    else:
        assert commits[0].commit_time is None
        assert not any(b" (at " in data for _, data in lines)
    assert decoder.state.open_streams == set()
    _assert_round_trip(decoded, db.major)


def test_two_phase(db: Database) -> None:
    gid_plain, gid_odd = "gid-1", "it's a \\ gid"
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding', false, true)")
        xids = []
        for gid, value in ((gid_plain, "a"), (gid_odd, "b")):
            conn.execute("BEGIN")
            xids.append(int(conn.execute("SELECT txid_current()").fetchone()[0]))  # type: ignore[index]
            conn.execute("INSERT INTO t VALUES (%s, %s)", (len(xids), value))
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        prepared_lines = _changes(conn, "s", "include-xids", "1", "include-timestamp", "1")
        conn.execute(sql.SQL("COMMIT PREPARED {}").format(sql.Literal(gid_plain)))
        conn.execute(sql.SQL("ROLLBACK PREPARED {}").format(sql.Literal(gid_odd)))
        finished_lines = _changes(conn, "s", "include-xids", "1", "include-timestamp", "1")

    decoder = TestDecodingDecoder()
    decoded = _decode_all(prepared_lines + finished_lines, decoder)
    events = [e for _, es in decoded for e in es if not isinstance(e, Relation)]
    kinds = [type(e).__name__ for e in events]
    assert kinds == [
        "Begin", "Insert", "Prepare",
        "Begin", "Insert", "Prepare",
        "CommitPrepared", "RollbackPrepared",
    ]  # fmt: skip
    prepares = [e for e in events if isinstance(e, Prepare)]
    assert [(p.gid, p.xid) for p in prepares] == [(gid_plain, xids[0]), (gid_odd, xids[1])]
    commit = events[6]
    assert isinstance(commit, CommitPrepared) and (commit.gid, commit.xid) == (gid_plain, xids[0])
    rollback = events[7]
    assert isinstance(rollback, RollbackPrepared) and rollback.gid == gid_odd
    assert rollback.prepare_time == prepares[1].prepare_time
    assert rollback.prepare_end_lsn == prepares[1].end_lsn
    assert b"E'it''s a \\\\ gid'" in decoded[5][0]
    assert decoder.state.prepared == {}
    _assert_round_trip(decoded, db.major)


def test_two_phase_without_timestamps(db: Database) -> None:
    """include-timestamp off (test_decoding's default): PREPARE, COMMIT/ROLLBACK PREPARED and a
    streamed prepare decode with their times None and everything else intact."""
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding', false, true)")
        xids: dict[str, int] = {}
        for gid, rows in (("small-commit", 1), ("small-rollback", 1), ("big", 3000)):
            conn.execute("BEGIN")
            xids[gid] = int(conn.execute("SELECT txid_current()").fetchone()[0])  # type: ignore[index]
            conn.execute(
                "INSERT INTO t SELECT g, repeat('v', 100) FROM generate_series(%s::int, %s::int) g",
                (len(xids) * 10_000, len(xids) * 10_000 + rows - 1),
            )
            conn.execute(sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid)))
        conn.execute("SET logical_decoding_work_mem = '64kB'")
        options = ("include-xids", "1", "include-timestamp", "0", "stream-changes", "1")
        prepared_lines = _changes(conn, "s", *options)
        conn.execute("COMMIT PREPARED 'small-commit'")
        conn.execute("ROLLBACK PREPARED 'small-rollback'")
        conn.execute("COMMIT PREPARED 'big'")
        finished_lines = _changes(conn, "s", *options)

    decoder = TestDecodingDecoder()
    decoded: list[tuple[bytes, list[Event]]] = []
    streamed_changes = 0
    for lsn, data in prepared_lines + finished_lines:
        assert b" (at " not in data
        if data.startswith(b"streaming change for TXN "):
            streamed_changes += 1  # no row data: raises, covered in test_streamed_transactions
            continue
        decoded.append((data, decoder.decode(data, lsn)))
    assert streamed_changes > 100
    events = [e for _, es in decoded for e in es if not isinstance(e, Relation)]
    prepares = [e for e in events if isinstance(e, Prepare)]
    assert [(p.gid, p.xid, p.prepare_time) for p in prepares] == [
        ("small-commit", xids["small-commit"], None),
        ("small-rollback", xids["small-rollback"], None),
    ]
    (stream_prepare,) = [e for e in events if isinstance(e, StreamPrepare)]
    assert (stream_prepare.gid, stream_prepare.xid) == ("big", xids["big"])
    assert stream_prepare.prepare_time is None
    stops = [e for e in events if isinstance(e, StreamStop)]
    assert stops and {s.xid for s in stops} == {xids["big"]}
    commits = [e for e in events if isinstance(e, CommitPrepared)]
    assert [(c.gid, c.xid, c.commit_time) for c in commits] == [
        ("small-commit", xids["small-commit"], None),
        ("big", xids["big"], None),
    ]
    (rollback,) = [e for e in events if isinstance(e, RollbackPrepared)]
    assert (rollback.gid, rollback.xid) == ("small-rollback", xids["small-rollback"])
    assert rollback.prepare_time is None and rollback.rollback_time is None
    assert rollback.prepare_end_lsn == prepares[1].end_lsn
    assert decoder.state.prepared == {} and decoder.state.open_streams == set()
    _assert_round_trip(decoded, db.major)


def test_tables_are_reported_again_after_ddl(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id integer PRIMARY KEY)")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO t VALUES (2)")
        conn.execute("ALTER TABLE t ADD COLUMN note varchar(5)")
        conn.execute("INSERT INTO t VALUES (3, 'x')")
        lines = _changes(conn, "s")
    events = [e for _, es in _decode_all(lines, TestDecodingDecoder()) for e in es]
    relations = [e for e in events if isinstance(e, Relation)]
    assert [[c.name for c in r.table.columns] for r in relations] == [["id"], ["id", "note"]]
    inserts = [e for e in events if isinstance(e, Insert)]
    assert inserts[2].table == relations[1].table and inserts[2].new == ("3", "x")
    assert isinstance(inserts[0].table, Table) and inserts[0].table.oid == 0


def test_streamed_abort_through_pg_recvlogical(db: Database, tmp_path: Path) -> None:
    """An aborted streamed transaction, as pg_recvlogical prints it. It has to be streamed while
    still open (PostgreSQL 17+ skips one it knows aborted), so a single walsender session
    decodes it: the SQL interface forgets what it streamed between calls."""
    out = tmp_path / "out.txt"
    db.execute("CREATE TABLE big (id integer, pad text)")
    db.execute("SELECT pg_create_logical_replication_slot('s', 'test_decoding')")
    receiver = subprocess.Popen(
        [
            str(db.cluster.installation.binary("pg_recvlogical")),
            "--dbname", db.conninfo(options="-c logical_decoding_work_mem=64kB"),
            "--slot", "s", "--start", "--file", str(out), "--no-loop",
            "-o", "include-xids=1", "-o", "include-timestamp=1", "-o", "stream-changes=1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        with db.connect() as other, db.connect() as conn:
            with other.transaction(force_rollback=True):
                row = other.execute("SELECT txid_current()").fetchone()
                aborted_xid = int(row[0])  # type: ignore[index]
                other.execute("SAVEPOINT sp")
                other.execute(
                    "INSERT INTO big SELECT g, repeat('y', 100) FROM generate_series(1, 3000) g"
                )
                conn.execute("INSERT INTO big VALUES (0, 'flush')")  # flushes the open WAL
                opening = f"opening a streamed block for transaction TXN {aborted_xid}\n"
                wait_until(lambda: out.exists() and opening in out.read_text())
            conn.execute("INSERT INTO big VALUES (-1, 'flush')")
            wait_until(lambda: "id[integer]:-1 " in out.read_text())
    finally:
        receiver.terminate()
        receiver.wait(timeout=30)

    decoder = TestDecodingDecoder()
    decoded: list[tuple[bytes, list[Event]]] = []
    for number, line in enumerate(out.read_bytes().splitlines()):
        if line.startswith(b"streaming change"):
            with pytest.raises(MissingOutputData):
                decoder.decode(line, LSN(number))
            continue
        decoded.append((line, decoder.decode(line, LSN(number))))
    events = [e for _, es in decoded for e in es]
    starts = [e for e in events if isinstance(e, StreamStart)]
    assert {s.xid for s in starts} == {aborted_xid} and starts[0].first_segment
    aborts = [e for e in events if isinstance(e, StreamAbort)]
    assert aborts and all(a.xid == aborted_xid for a in aborts)
    assert aborts[-1].subxid == aborted_xid
    assert decoder.state.open_streams == set()
    _assert_round_trip(decoded, db.major)
