"""``pgcdc snapshot`` as users run it (a subprocess) on PostgreSQL 15 and 18."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pgcdc.changelog import ChangeLog
from pgcdc.events import Insert
from pgcdc.lsn import LSN
from tests.conftest import Database

from .helpers import current_lsn, replay, source_values

CLI = [sys.executable, "-m", "pgcdc.cli.main"]


def test_snapshot_then_stream_fills_one_log(db: Database, tmp_path: Path) -> None:
    db.execute(
        "CREATE TABLE items (id int PRIMARY KEY, name text);"
        "INSERT INTO items SELECT g, 'before ' || g FROM generate_series(1, 500) g;"
        "CREATE TABLE filler (pad text);"
        "CREATE PUBLICATION pub FOR TABLE items"
    )
    # Stop streaming once the WAL is well past the changes made after the snapshot.
    end = current_lsn(db) + (4 << 20)
    log = tmp_path / "log"
    with subprocess.Popen(
        [*CLI, "snapshot", "-d", db.conninfo(), "-S", "s", "--publication", "pub",
         "--workers", "2", "--log", str(log), "--then-stream", "-E", str(end)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    ) as process:  # fmt: skip
        assert process.stdout is not None and process.stderr is not None
        line = process.stdout.readline()
        assert line.startswith("snapshot: 1 tables, 500 rows at "), process.stderr.read()
        consistent_point = LSN.parse(line.split(" at ")[1].split()[0])
        db.execute(
            "UPDATE items SET name = 'after' WHERE id <= 10; DELETE FROM items WHERE id > 490;"
            "INSERT INTO items VALUES (1000, 'new')"
        )
        db.execute("INSERT INTO filler SELECT repeat('f', 1000) FROM generate_series(1, 6000)")
        assert process.wait(timeout=120) == 0, process.stderr.read()
        # How the copy went, on stderr.
        assert "snapshot: 500 rows (" in process.stderr.read()
    txns = list(ChangeLog(log).read_transactions())
    assert txns[0].end_lsn == consistent_point
    assert sum(isinstance(e, Insert) for e in txns[0].events) == 500
    assert len(txns) == 2  # the snapshot, then the one streamed transaction (filler is unpublished)
    keyed, _ = replay(log)
    table = next(e.table for e in txns[0].events if isinstance(e, Insert))
    assert sorted(keyed["items"].values(), key=repr) == sorted(source_values(db, table), key=repr)
    assert len(keyed["items"]) == 491


def test_existing_slot_and_missing_publication_are_reported(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute("SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
    base = [*CLI, "snapshot", "-d", db.conninfo(), "--log", str(tmp_path)]
    taken = subprocess.run(
        [*base, "-S", "taken"], capture_output=True, text=True, timeout=120, check=False
    )
    assert taken.returncode == 1
    assert taken.stderr.startswith("pgcdc: error: replication slot 'taken' already exists")
    streaming = subprocess.run(
        [*base, "-S", "s", "--then-stream"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert streaming.returncode == 1 and "--then-stream needs --publication" in streaming.stderr
    assert db.execute("SELECT slot_name FROM pg_replication_slots") == [("taken",)]
