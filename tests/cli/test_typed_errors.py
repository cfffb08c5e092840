"""Mistakes and broken environments end ``pgcdc`` with one typed line saying what is wrong and
how to fix it, never a traceback; a full disk loses nothing once space is back."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.decoding.values import row_to_python
from pgcdc.events import Insert
from pgcdc.localpg import free_port
from pgcdc.lsn import LSN
from pgcdc.sinks import SinkKind, read_table
from tests.cli.helpers import assert_one_line_error, pgcdc
from tests.conftest import Database
from tests.spark.helpers import sort_rows


def run_pipeline(db: Database, tmp_path: Path, *extra: str, conninfo: str | None = None) -> Any:
    argv = [
        "pipeline", "run", "-d", conninfo or db.conninfo(), "--slot", "typed",
        "--publication", "cdc", "--master", "local[1]", "--kinds", "mirror",
        "--changelog", str(tmp_path / "log"), "--lake", str(tmp_path / "lake"),
        "--checkpoint", str(tmp_path / "checkpoint"), *extra,
    ]  # fmt: skip
    return pgcdc(*argv, cwd=tmp_path, timeout=400)


def mirror_equals_source(db: Database, lake: Path) -> None:
    with db.connect() as conn:
        cursor = conn.execute("SELECT id, body FROM items")
        expected = sort_rows([{"id": r[0], "body": r[1]} for r in cursor])
    mirror = read_table(lake / "public" / "items" / SinkKind.MIRROR.value)
    assert sort_rows(mirror.select(["id", "body"]).to_pylist()) == expected


def test_bad_flags_are_one_line_each(db: Database, tmp_path: Path) -> None:
    a_file = tmp_path / "not-a-dir"
    a_file.write_text("x")
    for extra, needles in (
        (["--trigger-interval", "-1"], ["trigger_interval", "-1"]),
        (["--master", "nosuch://x"], ["nosuch://x", "local[*]"]),
        (["--changelog", str(a_file)], [str(a_file), "directory"]),
        (["--lake", str(a_file)], [str(a_file), "directory"]),
        (["--master", "local[x]"], ["local[x]"]),
    ):
        result = run_pipeline(db, tmp_path, *extra, "--once")
        assert_one_line_error(result, *needles)
    assert db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'typed'") == 0


@pytest.mark.parametrize("once", [True, False])
def test_wrong_password_or_refused_port_in_pipeline_run(
    db: Database, tmp_path: Path, once: bool
) -> None:
    flags = ["--once"] if once else []
    refused = run_pipeline(db, tmp_path, *flags, conninfo=db.conninfo(port=free_port()))
    assert_one_line_error(refused, "refused", "check that the server is running")
    wrong = run_pipeline(db, tmp_path, *flags, conninfo=db.conninfo(password="not-it"))
    assert_one_line_error(wrong, "password authentication failed", "password")


def test_peek_on_a_pgoutput_slot_asks_for_publication(db: Database) -> None:
    db.execute("CREATE TABLE t (id integer PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    db.execute("SELECT pg_create_logical_replication_slot('po', 'pgoutput')")
    db.execute("INSERT INTO t VALUES (1)")
    for verb in ("peek", "get"):
        result = pgcdc(verb, "-d", db.conninfo(), "-S", "po")
        assert_one_line_error(result, "'po'", "pgoutput", "--publication NAME")
    result = pgcdc("peek", "-d", db.conninfo(), "-S", "po", "--publication", "pub")
    assert_one_line_error(result, "pgoutput", "--binary")
    result = pgcdc("peek", "-d", db.conninfo(), "-S", "po", "--publication", "pub", "--binary")
    assert result.returncode == 0, result.stderr
    data = [line.split(b"\t")[2] for line in result.stdout.splitlines()]
    assert [item[:4] for item in data] == [b"\\x42", b"\\x52", b"\\x49", b"\\x43"]  # B R I C
    # Nothing was consumed: get reads the same changes.
    got = pgcdc("get", "-d", db.conninfo(), "-S", "po", "--publication", "pub", "--binary")
    assert got.stdout == result.stdout


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MB tmpfs (root may mount one); skipped, with the reason, where mounting fails."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _grow(mount: Path) -> None:
    subprocess.run(["mount", "-o", "remount,size=256m", str(mount)], check=True)


# One server version per target (suite time): the disk fills on pgcdc's side, the same
# against either server.
@pytest.mark.parametrize(
    ("full", "cluster"), [("changelog", "pg15"), ("lake", "pg18")], indirect=["cluster"]
)
def test_a_full_disk_is_one_line_and_loses_nothing(
    db: Database, tmp_path: Path, small_disk: Path, full: str
) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, body text)")
    db.execute("CREATE PUBLICATION cdc FOR TABLE items")
    where = {"changelog": ["--changelog"], "lake": ["--lake"]}[full]
    target = small_disk / full
    created = run_pipeline(db, tmp_path, *where, str(target), "--snapshot", "never", "--once")
    assert created.returncode == 0, created.stderr.decode()
    # ~3 MB of text that does not compress away: more than the 1 MB disk holds.
    with db.connect() as conn, conn.transaction():
        conn.execute(
            "INSERT INTO items SELECT g, string_agg(md5(g::text || ':' || i::text), '') "
            "FROM generate_series(1, 600) g, generate_series(1, 160) i GROUP BY g"
        )
        row = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()
    assert row is not None
    before_commit = LSN.parse(row[0])  # the transaction's commit record lies after this
    result = run_pipeline(db, tmp_path, *where, str(target), "--once")
    assert_one_line_error(result, "No space left on device", "free space")
    log = target if full == "changelog" else tmp_path / "log"
    confirmed = LSN.parse(
        db.scalar(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'typed'"
        )
    )
    if full == "changelog":
        # The log could not hold the transaction, so the slot must still deliver it.
        assert confirmed <= before_commit, (confirmed, before_commit)
        assert not _logged_ids(log)
    _grow(small_disk)
    again = run_pipeline(db, tmp_path, *where, str(target), "--once")
    assert again.returncode == 0, again.stderr.decode()
    mirror_equals_source(db, target if full == "lake" else tmp_path / "lake")
    # The change log holds each change exactly once.
    assert sorted(_logged_ids(log)) == list(range(1, 601))


def _logged_ids(log: Path) -> list[int]:
    """The ids the log inserted, typed (a snapshot's binary copy logs bytes)."""
    return [
        int(row_to_python(event.table, event.new)[0])
        for txn in ChangeLog(log).read_transactions()
        for event in txn.events
        if isinstance(event, Insert)
    ]
