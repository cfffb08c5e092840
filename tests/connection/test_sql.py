"""The SQL interface of logical decoding against real PostgreSQL 15 and 18 servers."""

from __future__ import annotations

import dataclasses
import uuid

import psycopg
import pytest

from pgcdc import errors
from pgcdc.connection import server_errors
from pgcdc.connection.sql import (
    OptionValue,
    advance_slot,
    create_logical_slot,
    drop_slot,
    emit_message,
    get_binary_changes,
    get_changes,
    get_slot,
    list_slots,
    peek_binary_changes,
    peek_changes,
    stream_peeked_binary_changes,
)
from pgcdc.lsn import LSN
from tests.conftest import Database


def _xid_of(conn: psycopg.Connection, *statements: str) -> int:
    """Run ``statements`` in one transaction; return its xid."""
    with conn.transaction():
        for statement in statements:
            conn.execute(statement)
        row = conn.execute("SELECT pg_current_xact_id()::text").fetchone()
    assert row is not None
    return int(row[0])


def _current_lsn(conn: psycopg.Connection) -> LSN:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return LSN.parse(row[0])


@pytest.fixture
def role(db: Database):
    """A login role without REPLICATION (roles are cluster-wide: drop it afterwards)."""
    name = f"norepl_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'secret'")
    db.execute(f"GRANT ALL ON DATABASE {db.name} TO {name}")
    yield name
    db.execute(f"REVOKE ALL ON DATABASE {db.name} FROM {name}")
    db.execute(f"DROP ROLE {name}")


# --- slots -----------------------------------------------------------------------------------


def test_created_slots_are_listed_with_their_properties(db: Database) -> None:
    with db.connect() as conn:
        start = create_logical_slot(conn, "plain", "test_decoding")
        create_logical_slot(conn, "prepared", "pgoutput", two_phase=True)
        create_logical_slot(conn, "scratch", "test_decoding", temporary=True)
        slots = {info.name: info for info in list_slots(conn) if info.database == db.name}
        assert set(slots) == {"plain", "prepared", "scratch"}

        plain = slots["plain"]
        assert (plain.plugin, plain.slot_type, plain.database) == (
            "test_decoding",
            "logical",
            db.name,
        )
        assert plain.confirmed_flush_lsn == start
        assert plain.restart_lsn is not None and plain.restart_lsn <= start
        assert not plain.temporary and not plain.active and plain.active_pid is None
        assert plain.two_phase is False
        assert plain.wal_status == "reserved"
        assert not plain.invalidated and plain.invalidation_reason is None
        assert plain.failover is (False if db.major >= 17 else None)

        assert slots["prepared"].two_phase is True
        assert slots["prepared"].plugin == "pgoutput"
        # A temporary slot belongs to the session that created it, which holds it active.
        scratch = slots["scratch"]
        assert scratch.temporary and scratch.active
        assert scratch.active_pid == conn.info.backend_pid

        again = get_slot(conn, "plain")
        assert again is not None
        # The distances to the server's WAL position grow with any WAL written meanwhile (the
        # background writer logs running transactions on its own): the rest is the same slot.
        assert again.lag_bytes is not None and plain.lag_bytes is not None
        assert again.retained_wal_bytes is not None and plain.retained_wal_bytes is not None
        assert again.lag_bytes >= plain.lag_bytes
        assert again.retained_wal_bytes >= plain.retained_wal_bytes
        unmoved = dataclasses.replace(
            again, lag_bytes=plain.lag_bytes, retained_wal_bytes=plain.retained_wal_bytes
        )
        assert unmoved == plain
        assert get_slot(conn, "absent") is None
        assert drop_slot(conn, "plain") is True
        assert get_slot(conn, "plain") is None
        assert drop_slot(conn, "plain", if_exists=True) is False
        with pytest.raises(errors.SlotNotFound, match="pg_create_logical_replication_slot"):
            drop_slot(conn, "plain")


def test_failover_slots_need_postgresql_17(db: Database) -> None:
    with db.connect() as conn:
        if db.major >= 17:
            create_logical_slot(conn, "failover", "pgoutput", failover=True)
            info = get_slot(conn, "failover")
            assert info is not None and info.failover is True
        else:
            with pytest.raises(errors.UnsupportedFeature, match="PostgreSQL 17"):
                create_logical_slot(conn, "failover", "pgoutput", failover=True)
            assert get_slot(conn, "failover") is None


def test_slot_errors_are_typed(db: Database, role: str) -> None:
    with db.connect() as conn:
        create_logical_slot(conn, "taken", "test_decoding")
        with pytest.raises(errors.SlotAlreadyExists, match="pg_drop_replication_slot"):
            create_logical_slot(conn, "taken", "test_decoding")
        with pytest.raises(errors.SlotNotFound, match="create it first"):
            get_changes(conn, "missing")
        with pytest.raises(errors.SlotNotFound):
            advance_slot(conn, "missing", _current_lsn(conn))
        # The server cannot load it: 58P01 on 15, not allowed by output_plugin_libraries on 18.
        with pytest.raises(errors.PluginNotInstalled, match="install") as plugin_error:
            create_logical_slot(conn, "nojson", "wal2json")
        assert "wal2json" in str(plugin_error.value)
        assert get_slot(conn, "nojson") is None
        # Unrecognised errors keep their SQLSTATE.
        with pytest.raises(errors.ServerError) as unknown:
            get_changes(conn, "taken", options={"no-such-option": "1"})
        assert unknown.value.sqlstate == "22023"
        assert type(unknown.value) is errors.ServerError

    with psycopg.connect(db.conninfo(user=role, password="secret"), autocommit=True) as conn:
        with pytest.raises(errors.MissingReplicationPrivilege, match="WITH REPLICATION"):
            create_logical_slot(conn, "mine", "test_decoding")
        with pytest.raises(errors.MissingReplicationPrivilege, match="WITH REPLICATION"):
            peek_changes(conn, "taken")
    # Refused at connection time, where libpq gives no SQLSTATE.
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(db.conninfo(user=role, password="secret", replication="database"))
    translated = server_errors.from_psycopg(refused.value)
    assert isinstance(translated, errors.MissingReplicationPrivilege)
    assert "ALTER ROLE" in str(translated)


def test_a_slot_held_by_another_session_is_in_use(db: Database) -> None:
    with db.connect() as holder, db.connect() as other:
        create_logical_slot(holder, "held", "test_decoding", temporary=True)
        with pytest.raises(errors.SlotInUse, match="pg_terminate_backend") as in_use:
            peek_changes(other, "held")
        assert in_use.value.slot == "held"
        assert in_use.value.active_pid == holder.info.backend_pid
        assert str(holder.info.backend_pid) in str(in_use.value)


def test_a_missing_publication_is_typed(db: Database) -> None:
    with db.connect() as conn:
        with (
            pytest.raises(errors.PublicationNotFound, match="CREATE PUBLICATION"),
            server_errors.translated(),
        ):
            conn.execute("ALTER PUBLICATION nopub ADD TABLE pg_class")
        if db.major < 18:
            # PostgreSQL 18's pgoutput only warns about (and skips) a missing publication.
            create_logical_slot(conn, "pub", "pgoutput")
            conn.execute("CREATE TABLE t (a int)")
            conn.execute("INSERT INTO t VALUES (1)")
            with pytest.raises(errors.PublicationNotFound, match='"nopub"'):
                get_binary_changes(
                    conn, "pub", options={"proto_version": 1, "publication_names": ["nopub"]}
                )


def test_a_closed_connection_is_connection_lost(db: Database) -> None:
    with db.connect() as conn, db.connect() as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        with pytest.raises(errors.PgcdcError):
            list_slots(conn)  # the server's goodbye (57P01), or the closed socket
        with pytest.raises(errors.ConnectionLost, match="reconnect"):
            list_slots(conn)


# --- reading changes -------------------------------------------------------------------------


def test_text_changes_peek_then_get(db: Database) -> None:
    with db.connect() as conn:
        create_logical_slot(conn, "text", "test_decoding")
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        xid = _xid_of(conn, "INSERT INTO t VALUES (1, 'one'), (2, 'two')")

        peeked = peek_changes(conn, "text")
        data = [row.data for row in peeked]
        assert data[-4:] == [
            f"BEGIN {xid}",
            "table public.t: INSERT: id[integer]:1 name[text]:'one'",
            "table public.t: INSERT: id[integer]:2 name[text]:'two'",
            f"COMMIT {xid}",
        ]
        assert [row.xid for row in peeked[-4:]] == [xid] * 4
        assert all(isinstance(row.lsn, LSN) for row in peeked)
        assert [row.lsn for row in peeked] == sorted(row.lsn for row in peeked)
        # Peeking does not consume; getting does.
        assert peek_changes(conn, "text") == peeked
        assert get_changes(conn, "text") == peeked
        assert get_changes(conn, "text") == []
        info = get_slot(conn, "text")
        assert info is not None and info.confirmed_flush_lsn == peeked[-1].lsn


def test_options_upto_nchanges_and_upto_lsn(db: Database) -> None:
    with db.connect() as conn:
        create_logical_slot(conn, "opts", "test_decoding")
        conn.execute("CREATE TABLE t (id int)")
        first = _xid_of(conn, "INSERT INTO t VALUES (1)")
        second = _xid_of(conn, "INSERT INTO t VALUES (2)", "INSERT INTO t VALUES (3)")
        quiet: dict[str, OptionValue] = {"include-xids": "0", "skip-empty-xacts": True}

        everything = peek_changes(conn, "opts", options=quiet)
        assert [row.data for row in everything] == [
            "BEGIN",
            "table public.t: INSERT: id[integer]:1",
            "COMMIT",
            "BEGIN",
            "table public.t: INSERT: id[integer]:2",
            "table public.t: INSERT: id[integer]:3",
            "COMMIT",
        ]
        assert [row.xid for row in everything] == [first] * 3 + [second] * 4
        # Without the options test_decoding names xids and shows the CREATE TABLE transaction.
        verbose = peek_changes(conn, "opts")
        assert len(verbose) > len(everything)
        assert f"BEGIN {first}" in [row.data for row in verbose]

        # upto_nchanges stops at the end of the transaction that reaches the count.
        assert peek_changes(conn, "opts", upto_nchanges=2, options=quiet) == everything[:3]
        # upto_lsn stops at transactions committing after it.
        first_commit = everything[2].lsn
        assert peek_changes(conn, "opts", upto_lsn=first_commit, options=quiet) == everything[:3]

        assert get_changes(conn, "opts", upto_nchanges=1, options=quiet) == everything[:3]
        assert get_changes(conn, "opts", options=quiet) == everything[3:]


def test_binary_changes_from_pgoutput(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        conn.execute('CREATE PUBLICATION "Mixed Case" FOR TABLE t')
        create_logical_slot(conn, "bin", "pgoutput")
        xid = _xid_of(conn, "INSERT INTO t VALUES (7, 'seven')")
        options: dict[str, OptionValue] = {"proto_version": 1, "publication_names": ["Mixed Case"]}

        peeked = peek_binary_changes(conn, "bin", options=options)
        assert [row.data[:1] for row in peeked] == [b"B", b"R", b"I", b"C"]
        # Through a server-side cursor, a few rows at a time: the same rows.
        streamed = stream_peeked_binary_changes(conn, "bin", options=options, fetch_rows=3)
        assert list(streamed) == peeked
        assert all(isinstance(row.data, bytes) for row in peeked)
        assert {row.xid for row in peeked} == {xid}
        begin, relation, insert, _ = (row.data for row in peeked)
        assert int.from_bytes(begin[-4:], "big") == xid
        assert b"public\x00t\x00" in relation
        assert insert.endswith(b"t\x00\x00\x00\x017t\x00\x00\x00\x05seven")

        assert get_binary_changes(conn, "bin", options=options) == peeked
        assert get_binary_changes(conn, "bin", options=options) == []


def test_binary_and_text_functions_agree_on_test_decoding(db: Database) -> None:
    with db.connect() as conn:
        create_logical_slot(conn, "both", "test_decoding")
        conn.execute("CREATE TABLE t (note text)")
        conn.execute("INSERT INTO t VALUES ('naïve café')")
        text = peek_changes(conn, "both")
        binary = peek_binary_changes(conn, "both", options={"force-binary": True})
        assert [(row.lsn, row.xid) for row in binary] == [(row.lsn, row.xid) for row in text]
        assert [row.data.decode() for row in binary] == [row.data for row in text]
        # The binary functions take text output as is; the text ones refuse binary output.
        assert peek_binary_changes(conn, "both") == binary
        with pytest.raises(errors.ServerError, match="binary output"):
            peek_changes(conn, "both", options={"force-binary": True})


# --- messages and advancing ------------------------------------------------------------------


def test_emitted_messages_transactional_and_not(db: Database) -> None:
    with db.connect() as conn:
        create_logical_slot(conn, "msgs", "pgoutput")
        payload = bytes(range(256))
        plain = emit_message(conn, False, "pgcdc.test", payload)
        with conn.transaction():
            committed = emit_message(conn, True, "pgcdc.test", "kept")
        with conn.transaction(force_rollback=True):
            dropped = emit_message(conn, True, "pgcdc.test", "rolled back")
            survivor = emit_message(conn, False, "pgcdc.test", "survives")
        assert plain < committed < dropped < survivor
        # The SQL functions read only flushed WAL, and an abort does not flush: commit
        # something so the non-transactional message is flushed too.
        _xid_of(conn, "CREATE TABLE flushed ()")

        rows = get_binary_changes(
            conn,
            "msgs",
            options={"proto_version": 1, "publication_names": "none", "messages": True},
        )
        messages = [row for row in rows if row.data[:1] == b"M"]
        # Message layout: 'M', flags byte, LSN, prefix\0, length, content.
        assert [(row.data[1], row.data[-len(b"survives") :]) for row in messages][-1] == (
            0,
            b"survives",
        )
        assert [int.from_bytes(row.data[2:10], "big") for row in messages] == [
            plain,
            committed,
            survivor,
        ]
        assert messages[0].data.endswith(len(payload).to_bytes(4, "big") + payload)
        assert messages[1].data[1] == 1 and messages[1].data.endswith(b"kept")
        assert not any(b"rolled back" in row.data for row in rows)


def test_flushed_messages_need_postgresql_17(db: Database) -> None:
    with db.connect() as conn:
        create_logical_slot(conn, "flush", "test_decoding")
        if db.major >= 17:
            lsn = emit_message(conn, False, "p", "now", flush=True)
            rows = get_changes(conn, "flush")
            assert [(row.lsn, row.data.endswith("content:now")) for row in rows] == [(lsn, True)]
        else:
            with pytest.raises(errors.UnsupportedFeature, match="PostgreSQL 17"):
                emit_message(conn, False, "p", "now", flush=True)


def test_lag_and_retained_wal_grow_with_writes_and_shrink_after_advance(db: Database) -> None:
    with db.connect() as conn:
        create_logical_slot(conn, "lag", "test_decoding")
        conn.execute("CREATE TABLE t (filler text)")
        before = get_slot(conn, "lag")
        assert before is not None and before.lag_bytes is not None
        assert before.retained_wal_bytes is not None

        conn.execute("INSERT INTO t SELECT repeat('x', 100) FROM generate_series(1, 2000)")
        grown = get_slot(conn, "lag")
        assert grown is not None and grown.lag_bytes is not None
        assert grown.retained_wal_bytes is not None
        assert grown.lag_bytes > before.lag_bytes
        assert grown.retained_wal_bytes > before.retained_wal_bytes

        # A checkpoint logs the running transactions, which lets restart_lsn move on advance.
        conn.execute("CHECKPOINT")
        target = _current_lsn(conn)
        assert advance_slot(conn, "lag", target) == target
        advanced = get_slot(conn, "lag")
        assert advanced is not None and advanced.lag_bytes is not None
        assert advanced.retained_wal_bytes is not None
        assert advanced.confirmed_flush_lsn == target
        assert advanced.lag_bytes < grown.lag_bytes
        assert advanced.restart_lsn is not None and grown.restart_lsn is not None
        assert advanced.restart_lsn > grown.restart_lsn
        assert advanced.retained_wal_bytes < grown.retained_wal_bytes
        # Advancing never goes backwards.
        with pytest.raises(errors.InvalidArgument, match=f"{target} or later"):
            advance_slot(conn, "lag", LSN(int(target) - 1))
        assert get_changes(conn, "lag") == []
