"""Real decoded transactions (pgoutput through the SQL interface, PostgreSQL 15 and 18) go into
the change log and come back equal."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.connection.sql import get_binary_changes
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions
from pgcdc.events import UNCHANGED_TOAST, Insert, Message, Relation, Truncate, Update
from pgcdc.transactions import TransactionAssembler
from tests.conftest import Database


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_decoded_transactions_round_trip_through_the_log(db: Database, tmp_path, binary):
    with db.connect() as conn:
        conn.execute("CREATE TABLE items (id int PRIMARY KEY, name text, big text, data bytea)")
        # Stored out of line uncompressed, so an UPDATE leaves it as unchanged TOAST.
        conn.execute("ALTER TABLE items ALTER big SET STORAGE EXTERNAL")
        conn.execute("CREATE TABLE audit (note text)")
        conn.execute("ALTER TABLE audit REPLICA IDENTITY FULL")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
        with conn.transaction():
            conn.execute(
                "INSERT INTO items SELECT g, 'näme ' || g, repeat(md5(g::text), 400), "
                "decode('00ff', 'hex') FROM generate_series(1, 50) g"
            )
            conn.execute("SELECT pg_logical_emit_message(true, 'pfx', '\\x00ff01'::bytea)")
        conn.execute("UPDATE items SET name = NULL WHERE id <= 3")
        conn.execute("SELECT pg_logical_emit_message(false, 'lone', 'hello')")
        conn.execute("DELETE FROM items WHERE id = 4")
        conn.execute("INSERT INTO audit VALUES ('a'), (NULL)")
        conn.execute("UPDATE audit SET note = 'b' WHERE note = 'a'")
        conn.execute("TRUNCATE audit")
        server = conn.pgconn.server_version
        options = PgOutputOptions(["pub"], proto_version=1, binary=binary, messages=True)
        rows = get_binary_changes(conn, "s", options=options.for_server(server))

    decoder = PgOutputDecoder.for_options(options)
    with TransactionAssembler() as assembler:
        txns = [t for row in rows for t in assembler.feed_all(decoder.decode(row.data, row.lsn))]
    events = [e for t in txns for e in t.events]
    # What the server did is all there, before logging.
    assert sum(isinstance(e, Insert) for e in events) == 52
    assert any(isinstance(e, Relation) for e in events)
    assert any(isinstance(e, Truncate) for e in events)
    assert {e.content for e in events if isinstance(e, Message)} == {b"\x00\xff\x01", b"hello"}
    updates = [e for e in events if isinstance(e, Update) and e.table.name == "items"]
    assert len(updates) == 3 and all(u.new[2] is UNCHANGED_TOAST for u in updates)
    value_types = {type(v) for e in events if isinstance(e, Insert) for v in e.new}
    assert (bytes in value_types) == binary

    log = ChangeLog(tmp_path)
    with log.writer(frame_bytes=8000, segment_bytes=40_000) as writer:
        for txn in txns:
            assert writer.append(txn)
        assert writer.flush() == txns[-1].end_lsn
    restored = list(log.read_transactions())
    materialised = [replace(t, events=tuple(t.events)) for t in txns]
    assert restored == materialised
    assert len(log.segments()) > 1
