"""Catalog lookups against real PostgreSQL 15 and 18 servers."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from pgcdc.connection.catalog import column_defaults, server_facts, type_closure, type_info
from pgcdc.connection.sql import create_logical_slot, drop_slot
from pgcdc.decoding.pgtypes import BY_NAME
from tests.conftest import Database

INT4 = BY_NAME["int4"].oid
INT4_ARRAY = BY_NAME["_int4"].oid
TEXT = BY_NAME["text"].oid


def _oid(conn: psycopg.Connection, type_name: str) -> int:
    row = conn.execute("SELECT %s::regtype::oid::bigint", (type_name,)).fetchone()
    assert row is not None
    return int(row[0])


def test_type_info_names_kinds_bases_and_elements(db: Database) -> None:
    with db.connect() as conn:
        conn.execute('CREATE SCHEMA "Odd Schema"')
        conn.execute("CREATE TYPE \"Odd Schema\".mood AS ENUM ('sad', 'happy')")
        conn.execute("CREATE DOMAIN positive AS int4 CHECK (VALUE > 0)")
        conn.execute("CREATE DOMAIN small_positive AS positive CHECK (VALUE < 100)")
        conn.execute("CREATE DOMAIN int_list AS int4[]")
        conn.execute("CREATE TYPE pair AS (a int4, b text)")
        conn.execute("CREATE TYPE span AS RANGE (subtype = int4)")
        oids = {
            name: _oid(conn, name)
            for name in (
                '"Odd Schema".mood',
                '"Odd Schema".mood[]',
                "positive",
                "small_positive",
                "int_list",
                "pair",
                "span",
                "int4[]",
            )
        }
        missing = max(oids.values()) + 1_000_000

        info = type_info(conn, [*oids.values(), missing, oids["pair"]])

    assert set(info) == set(oids.values())
    mood = info[oids['"Odd Schema".mood']]
    assert (mood.namespace, mood.name, mood.kind) == ("Odd Schema", "mood", "e")
    assert (mood.base_oid, mood.element_oid) == (0, 0)

    mood_array = info[oids['"Odd Schema".mood[]']]
    assert (mood_array.name, mood_array.kind) == ("_mood", "b")
    assert mood_array.element_oid == oids['"Odd Schema".mood']

    # A domain over a domain resolves to the final base type.
    positive = info[oids["positive"]]
    nested = info[oids["small_positive"]]
    assert (positive.kind, positive.base_oid) == ("d", INT4)
    assert (nested.namespace, nested.kind, nested.base_oid) == ("public", "d", INT4)
    assert nested.element_oid == 0

    # A domain over an array keeps the array's element type.
    int_list = info[oids["int_list"]]
    assert (int_list.kind, int_list.base_oid, int_list.element_oid) == ("d", INT4_ARRAY, INT4)

    assert info[oids["pair"]].kind == "c"
    assert info[oids["span"]].kind == "r"
    builtin_array = info[INT4_ARRAY]
    assert (builtin_array.namespace, builtin_array.name) == ("pg_catalog", "_int4")
    assert (builtin_array.base_oid, builtin_array.element_oid) == (0, INT4)


def test_type_info_of_nothing_is_empty(db: Database) -> None:
    with db.connect() as conn:
        assert type_info(conn, []) == {}
        text = type_info(conn, [TEXT])[TEXT]
        # text has no element even though pg_type lists an array type for it.
        assert (text.name, text.kind, text.element_oid) == ("text", "b", 0)


def test_server_facts_match_the_server(db: Database) -> None:
    with db.connect() as conn:
        facts = server_facts(conn)
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN ('server_version_num', "
                "'wal_level', 'max_replication_slots', 'max_wal_senders', 'server_encoding')"
            ).fetchall()
        )
        assert facts.server_version_num == int(settings["server_version_num"])
        assert facts.server_version_num // 10000 == db.major
        assert facts.wal_level == settings["wal_level"] == "logical"
        assert facts.max_replication_slots == int(settings["max_replication_slots"])
        assert facts.max_wal_senders == int(settings["max_wal_senders"])
        assert facts.server_encoding == settings["server_encoding"]
        assert (facts.role, facts.role_superuser, facts.can_replicate) == ("postgres", True, True)
        assert facts.in_recovery is False

        # The counts follow slots and WAL senders as they come and go.
        create_logical_slot(conn, "counted", "test_decoding")
        with psycopg.connect(db.conninfo(replication="database"), autocommit=True) as sender:
            sender.execute("IDENTIFY_SYSTEM")
            busy = server_facts(conn)
        drop_slot(conn, "counted")
        after = server_facts(conn)
    assert busy.replication_slots_used == facts.replication_slots_used + 1
    assert busy.free_replication_slots == facts.free_replication_slots - 1
    assert facts.wal_senders_used is not None and facts.free_wal_senders is not None
    assert busy.wal_senders_used == facts.wal_senders_used + 1
    assert busy.free_wal_senders == facts.free_wal_senders - 1
    assert after.replication_slots_used == facts.replication_slots_used


@pytest.mark.parametrize("replication", [False, True])
def test_server_facts_for_an_unprivileged_role(db: Database, replication: bool) -> None:
    name = f"facts_{uuid.uuid4().hex[:8]}"
    attribute = "REPLICATION" if replication else "NOREPLICATION"
    db.execute(f"CREATE ROLE {name} LOGIN {attribute} PASSWORD 'secret'")
    if replication:
        db.execute(f"GRANT pg_monitor TO {name}")
    try:
        with (
            psycopg.connect(db.conninfo(replication="database"), autocommit=True) as sender,
            psycopg.connect(db.conninfo(user=name, password="secret"), autocommit=True) as conn,
        ):
            sender.execute("IDENTIFY_SYSTEM")
            facts = server_facts(conn)
    finally:
        db.execute(f"DROP ROLE {name}")
    assert (facts.role, facts.role_superuser) == (name, False)
    assert facts.role_replication is replication
    assert facts.can_replicate is replication
    # Other roles' WAL senders are visible only to pg_read_all_stats (part of pg_monitor).
    if replication:
        assert facts.wal_senders_used is not None and facts.wal_senders_used >= 1
    else:
        assert facts.wal_senders_used is None and facts.free_wal_senders is None
    assert facts.wal_level == "logical"


def test_type_closure_adds_what_types_rest_on_and_modifiers(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('sad', 'happy')")
        conn.execute("CREATE DOMAIN feeling AS mood")
        conn.execute("CREATE DOMAIN price AS numeric(10, 2)")
        conn.execute("CREATE DOMAIN dear AS price CHECK (VALUE > 100)")
        oids = {n: _oid(conn, n) for n in ("mood", "feeling", "price", "dear", "feeling[]")}
        found = type_closure(conn, [oids["feeling[]"], oids["dear"], INT4])
        typmod = conn.execute("SELECT typtypmod FROM pg_type WHERE oid = %s", (oids["price"],))
        [(price_modifier,)] = typmod.fetchall()
    # The array's element (a domain) and that domain's base (an enum) come along; built-ins
    # and the intermediate domain (dear's final base is numeric) do not.
    assert set(found) == {oids["feeling[]"], oids["feeling"], oids["mood"], oids["dear"]}
    assert found[oids["feeling[]"]].element_oid == oids["feeling"]
    assert found[oids["feeling"]].base_oid == oids["mood"] and found[oids["mood"]].kind == "e"
    dear = found[oids["dear"]]
    assert (dear.base_oid, dear.base_modifier) == (BY_NAME["numeric"].oid, price_modifier)
    assert price_modifier == ((10 << 16) | 2) + 4


def test_column_defaults_reads_missing_values_and_unseen_defaults(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id serial PRIMARY KEY, plain int)")
        conn.execute("INSERT INTO t (plain) VALUES (1)")
        conn.execute("ALTER TABLE t ADD COLUMN n int DEFAULT 7")
        conn.execute("ALTER TABLE t ADD COLUMN s text DEFAULT 'a \"b\", {c}'")
        conn.execute("ALTER TABLE t ADD COLUMN nothing text DEFAULT NULL")
        conn.execute("ALTER TABLE t ADD COLUMN r float8 DEFAULT random()")  # rewrites
        conn.execute("ALTER TABLE t ADD COLUMN gone int DEFAULT 1")
        conn.execute("ALTER TABLE t DROP COLUMN gone")
        oid = _oid(conn, "int4")  # any OID that is no table: nothing
        assert column_defaults(conn, oid) == {}
        [(table,)] = conn.execute("SELECT 't'::regclass::oid::bigint").fetchall()
        found = column_defaults(conn, table)
    assert found == {
        "id": (None, True),  # serial: nextval() default, not a missing value
        "plain": (None, False),
        "n": (None, True),  # the random() rewrite stored every value and cleared the rest
        "s": (None, True),
        "nothing": (None, False),
        "r": (None, True),
    }


def test_column_defaults_before_a_rewrite(db: Database) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("ALTER TABLE t ADD COLUMN n int DEFAULT 7")
        conn.execute("ALTER TABLE t ADD COLUMN s text DEFAULT 'a \"b\", {c}'")
        [(table,)] = conn.execute("SELECT 't'::regclass::oid::bigint").fetchall()
        found = column_defaults(conn, table)
    assert found == {"id": (None, False), "n": ("7", False), "s": ('a "b", {c}', False)}
