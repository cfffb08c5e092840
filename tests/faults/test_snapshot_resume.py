"""SIGKILL of ``pgcdc pipeline run`` while Spark tasks land the initial snapshot, after one
table landed and before the other did, with changes to both before the restart: the restart
resumes from the slot the snapshot created. The landed table is not copied again (its
snapshot commit stays at the slot's consistent point) and streams every change from there; the
other is copied at a new point, and the changes committed before it (which that copy holds)
are not applied again. Mirrors equal the source, and the lake's changelog replays to it with
every change once."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from pgcdc import pipeline
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from pgcdc.sinks import read_table
from pgcdc.sinks.delta import SNAPSHOT_APP_SUFFIX
from tests.cli.helpers import CLI
from tests.conftest import Database
from tests.faults import test_reconnect as faults
from tests.processes import kill_everything

ITEMS_ROWS = 400_000
SLOT = "resumed"
KINDS = ("changelog", "mirror", "history")


def _config(db: Database, tmp_path: Path) -> Path:
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f"""
[source]
conninfo = "{db.conninfo()}"
slot = "{SLOT}"
publications = ["cdc"]
snapshot_in = "executors"

[paths]
changelog = "{tmp_path / "log"}"
lake = "{tmp_path / "lake"}"
checkpoint = "{tmp_path / "checkpoint"}"

[tables]
kinds = {json.dumps(list(KINDS))}

[spark]
master = "local[1]"
"""
    )
    return config


def _snapshot_at(lake: Path, table: str, app_id: str, kind: str = "mirror") -> int | None:
    """The consistent point the snapshot commit of the table's ``kind`` recorded, None before
    it."""
    path = lake / "public" / table / kind
    if not (path / "_delta_log").exists():
        return None
    return DeltaTable(str(path)).transaction_version(app_id + SNAPSHOT_APP_SUFFIX)


def _landed(lake: Path, table: str, app_id: str) -> bool:
    """Every kind of the table has its snapshot commit (each kind commits on its own: killed
    between them, the table is not landed, and the restart copies it again for the others)."""
    return all(_snapshot_at(lake, table, app_id, kind) is not None for kind in KINDS)


def _run(config: Path) -> subprocess.CompletedProcess[str]:
    """``pgcdc pipeline run --once`` as users run it; its output in ``stdout``."""
    return subprocess.run(
        [*CLI, "pipeline", "run", "--verbose", "--config", str(config), "--once"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=480,
        check=False,
    )


def _killed_once(config: Path, output: Path, reached: Callable[[], bool]) -> None:
    """Start ``pgcdc pipeline run --once`` as users run it (its output appended to ``output``)
    and SIGKILL its process group once ``reached()`` or once it has exited."""
    with output.open("ab") as sink:
        child = subprocess.Popen(
            [*CLI, "pipeline", "run", "--verbose", "--config", str(config), "--once"],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_until(lambda: reached() or child.poll() is not None, timeout=300, interval=0.05)
    finally:
        kill_everything(child)


def _small_rows(db: Database) -> dict[int, str]:
    return dict(db.execute("SELECT id, note FROM small"))


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_a_killed_snapshot_resumes_without_copying_landed_tables_again(
    db: Database, tmp_path: Path
) -> None:
    db.execute(faults.ITEMS)
    # Negative ids for the snapshot's rows: the workload's inserts are positive.
    db.execute(
        "INSERT INTO items SELECT -g, md5(g::text), 0 FROM generate_series(1, %s) g",
        (ITEMS_ROWS,),
    )
    db.execute("CREATE TABLE small (id int PRIMARY KEY, note text)")
    db.execute("INSERT INTO small SELECT g, 'before' FROM generate_series(1, 100) g")
    db.execute("CREATE PUBLICATION cdc FOR TABLE items, small")
    db.execute("VACUUM ANALYZE items, small")  # pages planned: items is split, small is not
    config = _config(db, tmp_path)
    app_id = pipeline.load(config, {}).pipeline().app_id
    lake = tmp_path / "lake"
    output = tmp_path / "run.log"
    # The small table's job ends first (smallest tables first); items is still copying.
    _killed_once(config, output, lambda: _landed(lake, "small", app_id))
    log = output.read_text(errors="replace")
    first_point = _snapshot_at(lake, "small", app_id)
    assert first_point is not None, log[-3000:]
    assert _snapshot_at(lake, "items", app_id) is None, "items landed before the kill"
    pending = json.loads((tmp_path / "log" / "pgcdc-snapshot-pending.json").read_text())
    assert LSN.parse(pending["consistent_point"]) == first_point

    # Changes to both tables while nothing runs: the landed table streams them from its
    # snapshot's point; the other's new copy holds them.
    wait_until(
        lambda: (
            db.scalar("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
            is None
        ),
        timeout=120,
    )
    db.execute("UPDATE small SET note = 'during' WHERE id % 3 = 0")
    db.execute("DELETE FROM small WHERE id % 10 = 1")
    db.execute("INSERT INTO small VALUES (1000, 'new')")
    with faults.Workload(db.conninfo(), recent=700, pause=0.01) as workload:
        workload.wait_for(30)
        # The restart copies items while the workload goes on.
        restarted = _run(config)
        assert restarted.returncode == 0, restarted.stdout[-3000:]
        assert "resuming it from slot" in restarted.stdout, restarted.stdout[-3000:]
        assert "1 of 2 tables landed already" in restarted.stdout, restarted.stdout[-3000:]
        # And the stream goes on.
        workload.wait_for(workload.transactions + 20)
    finished = _run(config)
    assert finished.returncode == 0, finished.stdout[-3000:]

    # small was not copied again; items was copied at a later point.
    assert _snapshot_at(lake, "small", app_id) == first_point
    items_point = _snapshot_at(lake, "items", app_id)
    assert items_point is not None and items_point > first_point

    assert faults._mirror(lake) == faults._source_rows(db.conninfo())
    changelog = read_table(lake / "public" / "items" / "changelog")
    replayed = faults.replay_lake_changelog(changelog.to_pylist(), ITEMS_ROWS)
    assert replayed == faults._source_rows(db.conninfo())

    mirror = read_table(lake / "public" / "small" / "mirror").select(["id", "note"]).to_pylist()
    assert {r["id"]: r["note"] for r in mirror} == _small_rows(db)
    # small's changelog: its 100 snapshot rows at the first point, then the changes made
    # while nothing ran, each once.
    small_log = read_table(lake / "public" / "small" / "changelog").to_pylist()
    ops = sorted(
        (r["_op"], r["id"] if r["_op"] != "delete" else r["_old"]["id"]) for r in small_log
    )
    updated, deleted = len(range(3, 101, 3)), len(range(1, 101, 10))
    assert len(ops) == len(set(ops)) == 100 + updated + deleted + 1, ops[:10]
    assert {r["_commit_lsn"] for r in small_log if r["_op"] == "insert" and r["id"] <= 100} == {
        first_point - 1
    }


def _records(lake: Path) -> list[dict[str, Any]]:
    """The chunk records the snapshot's tasks left under the lake."""
    root = lake / "_pgcdc_snapshot_progress"
    return [json.loads(p.read_text()) for p in sorted(root.glob("*/*/*.json"))]


def _replayed(changes: list[dict[str, Any]]) -> dict[str, tuple[str, str, str]]:
    """A changelog applied in commit order: each change once, every insert of a new id, every
    update and delete of a row it holds."""
    changes.sort(key=lambda c: (c["_commit_lsn"], c["_seq"]))
    positions = [(c["_commit_lsn"], c["_seq"]) for c in changes]
    assert len(positions) == len(set(positions)), "a change landed twice"
    rows: dict[str, tuple[str, str, str]] = {}
    for change in changes:
        if change["_op"] == "delete":
            key = str(change["_old"]["id"])
            assert key in rows, f"delete of id {key}, which the changelog never inserted"
            del rows[key]
            continue
        key = str(change["id"])
        assert (key in rows) == (change["_op"] == "update"), (change["_op"], key)
        rows[key] = (key, str(change["v"]), str(change["n"]))
    return rows


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
@pytest.mark.parametrize(
    "meanwhile",
    [
        "inserts",
        "inserts, a staged file vacuumed",
        "changes elsewhere",
        "changes elsewhere, keys scattered",
        "changes on kept pages",
    ],
)
def test_a_snapshot_killed_mid_table_keeps_the_chunks_it_copied(
    db: Database, tmp_path: Path, meanwhile: str
) -> None:
    """Killed once a chunk of items was copied; rows inserted while nothing runs (on kept
    pages and on others), and maybe updated and deleted. The restart keeps the chunks copied
    unless they hold a row changed since, copies the other pages at a new point and looks
    the rows inserted or changed since up by key on the kept pages. Either way the mirror
    equals the source and the changelog replays to it, each change once. With keys scattered
    over the pages (as UUIDs are) every chunk's key range holds changed keys: the keys of its
    staged rows tell it holds none. A chunk one of whose staged files a VACUUM removed meanwhile
    is copied again."""
    db.execute(faults.ITEMS)
    scattered = meanwhile.endswith("keys scattered")
    # Scattered: the ids 1..ITEMS_ROWS in an order unrelated to the pages (7919 is prime to
    # ITEMS_ROWS).
    ids = f"(g::bigint * 7919) %% {ITEMS_ROWS} + 1" if scattered else "g"
    db.execute(
        f"INSERT INTO items SELECT -({ids}), md5(g::text), 0 FROM generate_series(1, %s) g",
        (ITEMS_ROWS,),
    )
    # Room for a few rows on every page, which the free space map knows: rows inserted while
    # nothing runs fill the first pages (which the first chunks copied) and then others.
    db.execute("DELETE FROM items WHERE id % 40 = 0")
    db.execute("CREATE PUBLICATION cdc FOR TABLE items")
    db.execute("VACUUM ANALYZE items")
    config = _config(db, tmp_path)
    app_id = pipeline.load(config, {}).pipeline().app_id
    lake = tmp_path / "lake"
    _killed_once(config, tmp_path / "run.log", lambda: bool(_records(lake)))
    records = _records(lake)
    assert records, (tmp_path / "run.log").read_text(errors="replace")[-3000:]
    assert _snapshot_at(lake, "items", app_id) is None, "items landed before the kill"
    first_point = int(records[0]["point"])
    kept = [(r["first_page"] or 0, r["end_page"]) for r in records]

    wait_until(
        lambda: (
            db.scalar("SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (SLOT,))
            is None
        ),
        timeout=120,
    )
    if meanwhile.startswith("changes elsewhere"):  # rows of the last pages, no kept chunk's
        last = db.scalar("SELECT relpages FROM pg_class WHERE relname = 'items'") - 100
        assert all(end is not None and end <= last for _, end in kept), (kept, last)
        db.execute(f"UPDATE items SET n = 3 WHERE ctid >= '({last},0)' AND id % 7 = 0")
        db.execute(f"DELETE FROM items WHERE ctid >= '({last},0)' AND id % 11 = 0")
    elif meanwhile == "changes on kept pages":  # a row of each kept chunk
        for first, _ in kept:
            db.execute(
                "UPDATE items SET n = 5 WHERE id = (SELECT id FROM items WHERE ctid >= %s::tid "
                "AND ctid < %s::tid AND id < 0 LIMIT 1)",
                (f"({first},0)", f"({first + 1},0)"),
            )
    vacuumed = meanwhile.endswith("a staged file vacuumed")
    if vacuumed:  # as a VACUUM of the history table would: the file no commit references
        history = lake / "public" / "items" / "history"
        (history / records[0]["adds"]["history"][0]["path"]).unlink()
    db.execute("INSERT INTO items SELECT g, 'meanwhile', 1 FROM generate_series(1, 3000) g")
    db.execute("INSERT INTO items SELECT g, 'meanwhile', 2 FROM generate_series(3001, 6000) g")

    def on_kept(where: str) -> set[bool]:
        return {
            any(first <= page and (end is None or page < end) for first, end in kept)
            for (page,) in db.execute(f"SELECT (ctid::text::point)[0]::int FROM items {where}")
        }

    assert on_kept("WHERE id > 0") == {True, False}, "inserted rows not on kept and other pages"
    if meanwhile.startswith("changes elsewhere"):  # updated rows moved to kept pages are found
        assert True in on_kept("WHERE n = 3"), "no updated row moved to a kept page"

    restarted = _run(config)
    assert restarted.returncode == 0, restarted.stdout[-3000:]
    items_point = _snapshot_at(lake, "items", app_id)
    assert items_point is not None and items_point > first_point
    mirror = DeltaTable(str(lake / "public" / "items" / "mirror"))
    files = {uri.rsplit("/mirror/", 1)[1] for uri in mirror.file_uris()}
    staged = {add["path"] for r in records for add in r["adds"]["mirror"]}
    if vacuumed:
        assert "is copied again: its staged file" in restarted.stdout, restarted.stdout[-3000:]
        dropped = {add["path"] for add in records[0]["adds"]["mirror"]}
        assert not dropped & files, "a chunk whose staged file is gone was kept"
        staged -= dropped
    if meanwhile == "changes on kept pages":
        assert "items is copied again whole: each chunk copied may hold a row" in restarted.stdout
        assert not staged & files
    elif staged:
        assert "items resumes: " in restarted.stdout, restarted.stdout[-3000:]
        assert staged <= files, "a kept chunk was copied again"
        if scattered:  # each kept chunk's key range held a changed key; its staged keys none
            assert f"(the staged keys of {len(records)} read)" in restarted.stdout
    assert not _records(lake), "the chunk records outlived the snapshot"

    # The stream goes on from the first point, each change once.
    db.execute("UPDATE items SET v = 'after' WHERE id % 97 = 0")
    db.execute("DELETE FROM items WHERE id % 89 = 0")
    db.execute("INSERT INTO items SELECT g, 'after', 4 FROM generate_series(7001, 7100) g")
    finished = _run(config)
    assert finished.returncode == 0, finished.stdout[-3000:]
    source = faults._source_rows(db.conninfo())
    assert faults._mirror(lake) == source
    changelog = read_table(lake / "public" / "items" / "changelog").to_pylist()
    assert _replayed(changelog) == source
    history = read_table(lake / "public" / "items" / "history").to_pylist()
    current = [(str(r["id"]), r["v"], str(r["n"])) for r in history if r["_is_current"]]
    assert len(current) == len(source) and {r[0]: r for r in current} == source
