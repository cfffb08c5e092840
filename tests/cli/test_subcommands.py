"""pgcdc slots, peek, get, emit and check against real servers."""

from __future__ import annotations

import json

import pytest

from pgcdc.cli.main import main
from pgcdc.lsn import LSN
from tests.cli.helpers import pgcdc
from tests.conftest import Database


def test_slots_table_and_json(db: Database, capsys: pytest.CaptureFixture[str]) -> None:
    db.execute("CREATE TABLE t (id integer)")
    db.execute("SELECT pg_create_logical_replication_slot('lagging', 'test_decoding')")
    db.execute("INSERT INTO t SELECT generate_series(1, 1000)")
    assert main(["slots", "-d", db.conninfo()]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[:3] == ["slot", "plugin", "type"] and "lag" in header and "retained" in header
    ours = next(line for line in lines if line.startswith("lagging "))
    assert "test_decoding" in ours and db.name in ours
    # aligned: every column starts where its header does
    assert ours.index("test_decoding") == lines[0].index("plugin")

    assert main(["-d", db.conninfo(), "slots", "--json"]) == 0  # connection before the command
    slots = {slot["slot"]: slot for slot in json.loads(capsys.readouterr().out)}
    slot = slots["lagging"]
    assert slot["plugin"] == "test_decoding" and slot["database"] == db.name
    assert slot["lag_bytes"] > 0 and slot["retained_wal_bytes"] >= slot["lag_bytes"]
    LSN.parse(slot["confirmed_flush_lsn"])


def test_peek_leaves_the_slot_and_get_consumes(db: Database) -> None:
    db.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    db.execute("SELECT pg_create_logical_replication_slot('p', 'test_decoding')")
    db.execute("INSERT INTO t VALUES (1, 'one'), (2, 'two')")
    db.execute("INSERT INTO t VALUES (3, 'three')")
    conn = ["-d", db.conninfo(), "--slot", "p"]
    peeked = pgcdc("peek", *conn, "-o", "include-xids=0")
    assert peeked.returncode == 0, peeked.stderr
    rows = [line.split(b"\t") for line in peeked.stdout.splitlines()]
    assert [row[2] for row in rows] == [
        b"BEGIN",
        b"table public.t: INSERT: id[integer]:1 v[text]:'one'",
        b"table public.t: INSERT: id[integer]:2 v[text]:'two'",
        b"COMMIT",
        b"BEGIN",
        b"table public.t: INSERT: id[integer]:3 v[text]:'three'",
        b"COMMIT",
    ]
    LSN.parse(rows[0][0].decode())
    assert pgcdc("peek", *conn, "-o", "include-xids=0").stdout == peeked.stdout  # unchanged

    first = pgcdc("get", *conn, "--upto-nchanges", "1")
    assert first.returncode == 0, first.stderr
    assert b"'one'" in first.stdout and b"'three'" not in first.stdout
    rest = pgcdc("get", *conn)
    assert b"'three'" in rest.stdout and b"'one'" not in rest.stdout
    assert pgcdc("get", *conn).stdout == b""


def test_peek_binary_pgoutput_with_upto_lsn(db: Database) -> None:
    db.execute("CREATE TABLE t (id integer PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    db.execute("SELECT pg_create_logical_replication_slot('b', 'pgoutput')")
    db.execute("INSERT INTO t VALUES (1)")
    upto = db.scalar("SELECT pg_current_wal_lsn()::text")
    db.execute("INSERT INTO t VALUES (2)")
    options = ["-o", "proto_version=1", "-o", "publication_names=pub"]
    result = pgcdc("peek", "-d", db.conninfo(), "-S", "b", "--binary", "--upto-lsn", upto, *options)
    assert result.returncode == 0, result.stderr
    data = [line.split(b"\t")[2] for line in result.stdout.splitlines()]
    assert [item[:4] for item in data] == [b"\\x42", b"\\x52", b"\\x49", b"\\x43"]  # B R I C
    text = pgcdc("peek", "-d", db.conninfo(), "-S", "b", *options)
    assert text.returncode == 1 and text.stderr.startswith(b"pgcdc: error: ")


def test_emit_from_argument_and_stdin(db: Database) -> None:
    db.execute("SELECT pg_create_logical_replication_slot('m', 'test_decoding')")
    result = pgcdc("emit", "-d", db.conninfo(), "--prefix", "app", "hello")
    assert result.returncode == 0, result.stderr
    lsn = LSN.parse(result.stdout.decode())
    piped = pgcdc(
        "emit", "-d", db.conninfo(), "--prefix", "bin", "--transactional", input=b"\x00\xffz"
    )
    assert piped.returncode == 0, piped.stderr
    assert LSN.parse(piped.stdout.decode()) > lsn
    with db.connect() as conn:
        rows = conn.execute(
            "SELECT data FROM pg_logical_slot_peek_binary_changes('m', NULL, NULL)"
        ).fetchall()
    data = [bytes(row[0]) for row in rows]
    assert b"message: transactional: 0 prefix: app, sz: 5 content:hello" in data
    assert b"message: transactional: 1 prefix: bin, sz: 3 content:\x00\xffz" in data


def test_check_reports_or_explains(db: Database, capsys: pytest.CaptureFixture[str]) -> None:
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    db.execute("SELECT pg_create_logical_replication_slot('ok', 'pgoutput')")
    assert main(["check", "-d", db.conninfo(), "-S", "ok", "--publication", "pub"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("ok: ") and f"database: {db.name}" in out
    assert f"PostgreSQL {db.major}." in out and "slot: ok confirmed at" in out

    code = main(["check", "-d", db.conninfo(), "-S", "ok", "--publication", "missing"])
    assert code == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("pgcdc: error: publication 'missing' does not exist")
    assert len(err) == 1

    assert main(["check", "-d", db.conninfo(), "-S", "nope", "--create-slot"]) == 0
    assert "slot: none yet" in capsys.readouterr().out
