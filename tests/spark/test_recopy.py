"""``pgcdc pipeline run --recopy schema.table`` on PG15 and PG18: tables whose rows a change
the slot never streams left stale (a volatile ADD COLUMN DEFAULT, a dropped column of a keyless
REPLICA IDENTITY FULL table) are replaced downstream by their state at a consistent point C,
with every change before C and after it (one committed while the copy was being taken too)
applied exactly once, and the other tables untouched."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.cli.main import main
from pgcdc.errors import StaleRowsWarning
from pgcdc.events import Insert, Truncate
from tests.conftest import Database

from .helpers import assert_logged_once, history_at, mirror_rows, table_rows

TABLES = ("public.t", "public.other", "public.bag")


def _commit_once_the_copy_point_is_set(db: Database, done: threading.Event) -> None:
    """Waits for the re-copy's temporary slot to reach its consistent point C, then commits
    a change to the re-copied table and one to another table: both commit after C, so only
    the stream after the copy may deliver them."""
    with db.connect() as conn:
        conn.autocommit = True
        while not done.wait(0.02):
            found = conn.execute(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name LIKE 'pgcdc_recopy_%' "
                "AND confirmed_flush_lsn IS NOT NULL"
            ).fetchone()
            if found:
                with conn.transaction():
                    conn.execute("UPDATE t SET label = 'during the copy' WHERE id = 5")
                    conn.execute("INSERT INTO other VALUES (999, 'during the copy')")
                return


def _assert_lake_equals_source(db: Database, lake: Path) -> None:
    lsn = int(db.scalar("SELECT pg_current_wal_lsn() - '0/0'"))
    with db.connect() as conn:
        for name in TABLES:
            columns, rows = table_rows(conn, name)
            assert mirror_rows(lake, name, columns) == rows, name
            assert history_at(lake, name, columns, lsn) == rows, name


def test_recopy_replaces_stale_tables_exactly_once(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, label text)")
    db.execute("CREATE TABLE other (id int PRIMARY KEY, label text)")
    db.execute("CREATE TABLE bag (a text, b int)")
    db.execute("ALTER TABLE bag REPLICA IDENTITY FULL")
    db.execute("CREATE PUBLICATION cdc FOR TABLE t, other, bag")
    db.execute("INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 20) g")
    db.execute("INSERT INTO other SELECT g, 'row ' || g FROM generate_series(1, 5) g")
    db.execute("INSERT INTO bag SELECT 'a' || (g % 3), g FROM generate_series(1, 6) g")
    lake, log = tmp_path / "lake", tmp_path / "log"
    argv = [
        "pipeline", "run", "-d", db.conninfo(), "--slot", "recopy", "--publication", "cdc",
        "--changelog", str(log), "--lake", str(lake), "--checkpoint", str(tmp_path / "cp"),
        "--master", "local[2]", "--once",
        # The initial snapshot in the change log too: every change the lake's changelog holds
        # is then one the log holds (assert_logged_once).
        "--snapshot-in", "receiver",
    ]  # fmt: skip
    assert main(argv) == 0  # the initial snapshot

    # While the pipeline is stopped: table rewrites the slot does not stream, and changes to
    # the re-copied table and to another one before and after them.
    db.execute("UPDATE t SET label = 'before the rewrite' WHERE id = 1")
    db.execute("INSERT INTO other VALUES (6, 'gap')")
    db.execute("ALTER TABLE t ADD COLUMN c float8 DEFAULT random()")
    db.execute("ALTER TABLE bag DROP COLUMN b")  # the old rows' whole-row keys change
    db.execute("UPDATE t SET label = 'after the rewrite' WHERE id = 2")
    db.execute("DELETE FROM t WHERE id = 3")
    db.execute("UPDATE other SET label = 'gap too' WHERE id = 1")

    done = threading.Event()
    writer = threading.Thread(target=_commit_once_the_copy_point_is_set, args=(db, done))
    writer.start()
    try:
        # The stale rows are reported (the drain streams t's changes after the ALTER) and
        # the warning names the remedy run here.
        with pytest.warns(StaleRowsWarning, match="--recopy public.t "):
            assert main([*argv, "--recopy", "public.t", "--recopy", "public.bag"]) == 0
    finally:
        done.set()
        writer.join()
    assert db.scalar("SELECT label FROM t WHERE id = 5") == "during the copy"
    assert not db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name <> 'recopy'")

    # Later changes: the keyless table's UPDATE and DELETE find the re-copied rows.
    db.execute("UPDATE bag SET a = 'changed' WHERE a = 'a1'")
    db.execute("DELETE FROM bag WHERE a = 'a2'")
    db.execute("UPDATE t SET c = -1 WHERE id = 4")
    assert main(argv) == 0
    _assert_lake_equals_source(db, lake)

    transactions = list(ChangeLog(str(log)).read_transactions())
    copies = [t for t in transactions if any(isinstance(e, Truncate) for e in t.events)]
    assert len(copies) == 1
    (copy,) = copies
    assert copy.commit_lsn == copy.end_lsn - 1
    changes = [e for e in copy.events if isinstance(e, Truncate | Insert)]
    assert isinstance(changes[0], Truncate)
    assert {t.qualified_name for t in changes[0].tables} == {"public.t", "public.bag"}
    assert all(isinstance(e, Insert) for e in changes[1:])
    # The change committed after C came from the stream, after the copy.
    streamed_after = [
        txn
        for txn in transactions
        if txn.commit_lsn > copy.commit_lsn
        and any(isinstance(e, Insert) and e.table.name == "other" for e in txn.events)
    ]
    assert len(streamed_after) == 1
    # Every streamed change (the gap's, the one during the copy, the later ones) and the
    # copy's truncate and inserts are in the changelog tables once.
    assert_logged_once(lake, TABLES, transactions)


def test_recopy_names_are_checked_before_anything_runs(
    db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db.execute("CREATE TABLE published (id int PRIMARY KEY)")
    db.execute("CREATE TABLE unpublished (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION cdc FOR TABLE published")
    argv = [
        "pipeline", "run", "-d", db.conninfo(), "--publication", "cdc", "--once",
        "--changelog", str(tmp_path / "log"), "--lake", str(tmp_path / "lake"),
    ]  # fmt: skip
    for name, problem in (
        ("published", "not a table name: give it as schema.table"),
        ("public.published.x", "not a table name"),
        ('"unclosed.x', "not a table name"),
        ("public.unpublished", "are not in publication"),
        ("public.missing", "does not exist"),
    ):
        assert main([*argv, "--recopy", name]) == 1
        errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
        assert len(errors) == 1 and problem in errors[0] and "--recopy" in errors[0], errors
    assert not (tmp_path / "log").exists()  # refused before anything started
