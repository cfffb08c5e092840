"""Slot actions, -I/-E, usage errors and typed errors, as pg_recvlogical behaves."""

from __future__ import annotations

from typing import Any

import pytest

from pgcdc.cli.main import main
from tests.cli.helpers import current_lsn, pgcdc
from tests.conftest import Database


def slot_plugin(db: Database, name: str) -> Any:
    return db.scalar("SELECT plugin FROM pg_replication_slots WHERE slot_name = %s", (name,))


def test_create_if_not_exists_twice_then_drop(db):
    conn = ["-d", db.conninfo()]
    first = pgcdc("--create-slot", "-S", "s1", "-P", "test_decoding", "--if-not-exists", *conn)
    assert first.returncode == 0, first.stderr
    assert slot_plugin(db, "s1") == "test_decoding"
    again = pgcdc(
        "--create-slot", "-S", "s1", "-P", "test_decoding", "--if-not-exists", "-v", *conn
    )
    assert again.returncode == 0, again.stderr
    assert b'replication slot "s1" exists' in again.stderr

    without = pgcdc("--create-slot", "-S", "s1", "-P", "test_decoding", *conn)
    assert without.returncode == 1
    lines = without.stderr.decode().splitlines()
    assert lines[0].startswith("pgcdc: error: ") and "s1" in lines[0]

    dropped = pgcdc("--drop-slot", "-S", "s1", *conn)
    assert dropped.returncode == 0, dropped.stderr
    assert slot_plugin(db, "s1") is None
    missing = pgcdc("--drop-slot", "-S", "s1", *conn)
    assert missing.returncode == 1
    assert missing.stderr.startswith(b"pgcdc: error: ")


def test_create_two_phase_slot(db):
    result = pgcdc("--create-slot", "-S", "tp", "-P", "test_decoding", "-t", "-d", db.conninfo())
    assert result.returncode == 0, result.stderr
    assert db.scalar("SELECT two_phase FROM pg_replication_slots WHERE slot_name = 'tp'")


def test_failover_slot_needs_postgresql_17(db):
    result = pgcdc(
        "--create-slot", "-S", "fo", "-P", "test_decoding", "--enable-failover", "-d", db.conninfo()
    )
    if db.major >= 17:
        assert result.returncode == 0, result.stderr
        assert db.scalar("SELECT failover FROM pg_replication_slots WHERE slot_name = 'fo'")
    else:
        assert result.returncode == 1
        assert b"PostgreSQL 17" in result.stderr


def test_create_and_start_together_with_startpos_and_endpos(db, tmp_path):
    """--create-slot --start creates, then streams; -I skips what commits before it; -E stops."""
    db.execute("CREATE TABLE t (id integer PRIMARY KEY)")
    created = pgcdc("--create-slot", "-S", "s", "-P", "test_decoding", "-d", db.conninfo())
    assert created.returncode == 0, created.stderr
    db.execute("INSERT INTO t VALUES (1)")
    db.execute("INSERT INTO t VALUES (2)")
    after_second = current_lsn(db)
    db.execute("INSERT INTO t VALUES (3)")
    out = tmp_path / "out.txt"
    # From the slot's start, up to the end of the second transaction only.
    result = pgcdc("--start", "-S", "s", "-f", str(out), "-E", after_second, "-d", db.conninfo())
    assert result.returncode == 0, result.stderr
    text = out.read_text()
    assert "id[integer]:1" in text and "id[integer]:2" in text and "id[integer]:3" not in text

    db.execute("SELECT pg_create_logical_replication_slot('s2', 'test_decoding')")
    db.execute("INSERT INTO t VALUES (4)")
    skip_to = current_lsn(db)
    db.execute("INSERT INTO t VALUES (5)")
    end = current_lsn(db)
    out2 = tmp_path / "out2.txt"
    result = pgcdc(
        "--start", "-S", "s2", "-f", str(out2), "-I", skip_to, "-E", end, "-d", db.conninfo()
    )
    assert result.returncode == 0, result.stderr
    text = out2.read_text()
    assert "id[integer]:5" in text and "id[integer]:4" not in text

    # pg_recvlogical appends to an existing file; so does pgcdc.
    again = pgcdc("--start", "-S", "s", "-f", str(out), "-E", end, "-d", db.conninfo())
    assert again.returncode == 0, again.stderr
    text = out.read_text()
    assert text.count("id[integer]:2") == 1  # confirmed before: not written again
    assert "id[integer]:3" in text and "id[integer]:5" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--start", "-S", "s"], "no target file specified"),
        (["--start", "-f", "-"], "no slot specified"),
        (["-S", "s"], "at least one action"),
        (["--drop-slot", "--start", "-S", "s", "-f", "-"], "together with --drop-slot"),
        (["--create-slot", "-S", "s", "-I", "0/10"], "together with --startpos"),
        (["--create-slot", "-S", "s", "-E", "0/10"], "--endpos may only be specified"),
        (["--start", "-S", "s", "-f", "-", "-t"], "--two-phase may only be specified"),
        (["--start", "-S", "s", "-f", "-", "-E", "nonsense"], "invalid LSN"),
        (["--start", "-S", "s", "--format", "changelog"], "--log DIR"),
        (["--start", "-S", "s", "-f", "-", "-F", "-1"], "zero or a positive"),
    ],
)
def test_usage_errors_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_start_on_missing_slot_is_one_clear_line(db):
    result = pgcdc("--start", "-S", "nope", "-f", "-", "-n", "-d", db.conninfo())
    assert result.returncode == 1
    first = result.stderr.decode().splitlines()[0]
    assert first.startswith("pgcdc: error: ") and "'nope' does not exist" in first


def test_plugin_that_disagrees_with_the_slot(db):
    db.execute("SELECT pg_create_logical_replication_slot('td', 'test_decoding')")
    result = pgcdc("--start", "-S", "td", "-P", "pgoutput", "-f", "-", "-d", db.conninfo())
    assert result.returncode == 1
    assert b"decodes with 'test_decoding'" in result.stderr
