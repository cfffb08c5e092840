"""A change log is only ever filled from the slot it started with (issue 11, defect 2).

The scenario reported: with a small ``max_slot_wal_keep_size`` the slot is invalidated while the
pipeline is stopped; dropping and recreating the slot, as the error said, let ``pipeline run
--once`` exit 0 with a mirror of 451 rows against the source's 30,451. Now every start checks the
slot against what the change log recorded, and refuses a slot that would leave a gap with a
typed error saying how to start over; starting over that way gives a mirror equal to the source.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc import pipeline
from pgcdc.changelog import ChangeLog
from pgcdc.decoding.values import row_to_python
from pgcdc.errors import ChangeLogError, SlotInvalidated, SlotNotFound, SlotReplaced
from pgcdc.events import Insert, Update
from pgcdc.localpg import LocalCluster, wait_until
from pgcdc.lsn import LSN
from pgcdc.pipeline.origin import STATE_NAME, load_origin
from pgcdc.sinks import SinkKind, read_table
from tests.conftest import _INSTALLATIONS, TEST_SETTINGS, Database

SLOT = "gap"
Row = tuple[Any, ...]


def _settings(conninfo: str, root: Path, **changes: Any) -> pipeline.Settings:
    settings = pipeline.Settings(
        conninfo=conninfo,
        slot=SLOT,
        publications=("pub",),
        snapshot="initial",
        snapshot_workers=2,
        changelog=str(root / "log"),
        lake=str(root / "lake"),
        checkpoint=str(root / "checkpoint"),
        kinds=(SinkKind.MIRROR,),
        master="local[2]",
        trigger_interval=0.5,
    )
    return pipeline.with_overrides(settings, **changes)


def _execute(conninfo: str, statement: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cursor = conn.execute(statement)
        return cursor.fetchall() if cursor.description else []


def _current_lsn(conninfo: str) -> LSN:
    return LSN.parse(_execute(conninfo, "SELECT pg_current_wal_lsn()::text")[0][0])


def _slots(conninfo: str) -> list[tuple[Any, ...]]:
    return _execute(conninfo, "SELECT slot_name, wal_status FROM pg_replication_slots")


def _source_rows(conninfo: str) -> dict[str, Row]:
    rows = _execute(conninfo, "SELECT id::text, v FROM items")
    return {row[0]: tuple(row) for row in rows}


def _logged(root: Path) -> dict[str, Row]:
    """The change log replayed into rows by key (the snapshot and the inserts), as text (the
    snapshot's binary copy logs bytes, the stream text)."""
    rows: dict[str, Row] = {}
    for txn in ChangeLog(root / "log").read_transactions():
        for event in txn.events:
            if isinstance(event, Insert | Update):
                key, value = row_to_python(event.table, event.new)
                rows[str(key)] = (str(key), value)
    return rows


def _receive(settings: pipeline.Settings) -> None:
    pipeline.receive(settings, _current_lsn(settings.conninfo), None)


def _insert(conninfo: str, first: int, last: int) -> None:
    _execute(
        conninfo,
        f"INSERT INTO items SELECT g, md5(g::text) FROM generate_series({first}, {last}) g",
    )


def _source(conninfo: str, rows: int) -> None:
    _execute(conninfo, "CREATE TABLE items (id int PRIMARY KEY, v text)")
    _execute(conninfo, "CREATE PUBLICATION pub FOR TABLE items")
    _execute(
        conninfo, f"INSERT INTO items SELECT g, md5(g::text) FROM generate_series(1, {rows}) g"
    )


@pytest.fixture(params=sorted(_INSTALLATIONS))
def small_keep(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A cluster of this test's own whose slots may hold back only 1MB of WAL."""
    settings = {**TEST_SETTINGS, "max_slot_wal_keep_size": "1MB"}
    with LocalCluster(_INSTALLATIONS[request.param](), settings=settings) as cluster:
        yield cluster


def test_an_invalidated_slot_and_its_replacement_are_refused_never_a_silent_gap(
    small_keep: LocalCluster, tmp_path: Path, spark: Any
) -> None:
    conninfo = small_keep.conninfo()
    _source(conninfo, 451)
    settings = _settings(conninfo, tmp_path / "first")
    _receive(settings)  # the first start: the snapshot of 451 rows
    logged = _logged(tmp_path / "first")
    assert logged == _source_rows(conninfo)
    recorded = json.loads((tmp_path / "first" / "log" / STATE_NAME).read_text())
    assert (recorded["slot"], recorded["database"]) == (SLOT, "postgres")

    # The pipeline is stopped; 30,000 rows later the slot has lost the WAL it needed.
    _execute(
        conninfo, "INSERT INTO items SELECT g, md5(g::text) FROM generate_series(452, 30451) g"
    )

    def lost() -> bool:
        _execute(conninfo, "SELECT pg_switch_wal()")
        _execute(conninfo, "CREATE TABLE IF NOT EXISTS filler (x text)")
        _execute(
            conninfo, "INSERT INTO filler SELECT repeat('x', 100) FROM generate_series(1, 5000)"
        )
        _execute(conninfo, "CHECKPOINT")
        return _slots(conninfo) == [(SLOT, "lost")]

    wait_until(lost, timeout=120, interval=0.1)
    with pytest.raises(SlotInvalidated) as invalidated:
        _receive(settings)
    assert "start over" in str(invalidated.value) and "paths.changelog" in str(invalidated.value)
    assert "\n" not in str(invalidated.value)

    # What the old message said: drop and recreate the slot. The new slot starts after the
    # 30,000 rows; the pipeline says so instead of streaming on from there.
    _execute(conninfo, f"SELECT pg_drop_replication_slot('{SLOT}')")
    _execute(conninfo, f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
    _execute(conninfo, "INSERT INTO items VALUES (30452, 'after the new slot')")
    with pytest.raises(SlotReplaced, match="dropped and created again") as replaced:
        pipeline.run(settings, once=True, spark=spark)
    assert "paths.lake" in str(replaced.value)
    # Dropped and not recreated: pgcdc does not create it either (create_slot is on).
    _execute(conninfo, f"SELECT pg_drop_replication_slot('{SLOT}')")
    with pytest.raises(SlotNotFound, match="no longer exists"):
        pipeline.run(settings, once=True, spark=spark)
    assert _slots(conninfo) == []
    # Nothing was added to the old change log meanwhile: it is what it was, no gap behind it.
    assert _logged(tmp_path / "first") == logged

    # The remedy the errors give: new paths, a new snapshot; the mirror equals the source.
    fresh = _settings(conninfo, tmp_path / "second")
    pipeline.run(fresh, once=True, spark=spark)
    mirror = read_table(tmp_path / "second" / "lake" / "public" / "items" / "mirror")
    source = _source_rows(conninfo)
    assert len(source) == 30452
    assert {str(r["id"]): (str(r["id"]), r["v"]) for r in mirror.to_pylist()} == source


def test_a_recreated_slot_is_refused_even_when_no_wal_was_lost(
    db: Database, tmp_path: Path
) -> None:
    conninfo = db.conninfo()
    _source(conninfo, 10)
    settings = _settings(conninfo, tmp_path, snapshot="never")
    _receive(settings)
    _execute(conninfo, "INSERT INTO items VALUES (11, 'streamed')")
    _receive(settings)
    assert _logged(tmp_path) == {"11": ("11", "streamed")}
    _receive(settings)  # the same slot again: accepted
    # Dropped and created again at once: WAL back to the log's end is all still there, but
    # the change made in between would be missing.
    _execute(conninfo, f"SELECT pg_drop_replication_slot('{SLOT}')")
    _execute(conninfo, "INSERT INTO items VALUES (12, 'in the gap')")
    _execute(conninfo, f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
    _execute(conninfo, "INSERT INTO items VALUES (13, 'after')")
    with pytest.raises(SlotReplaced, match="dropped and created again"):
        _receive(settings)
    assert _logged(tmp_path) == {"11": ("11", "streamed")}
    # Another slot name than the one the log was filled from.
    with pytest.raises(SlotReplaced, match=f"filled from slot '{SLOT}'"):
        _receive(pipeline.with_overrides(settings, slot="other"))


def test_a_log_without_a_record_is_checked_against_its_end(db: Database, tmp_path: Path) -> None:
    """A change log filled before pgcdc recorded its slot: the slot may not start past it."""
    conninfo = db.conninfo()
    _source(conninfo, 3)
    settings = _settings(conninfo, tmp_path, snapshot="initial")
    _receive(settings)
    (tmp_path / "log" / STATE_NAME).unlink()
    _execute(conninfo, f"SELECT pg_drop_replication_slot('{SLOT}')")
    _execute(conninfo, "INSERT INTO items VALUES (4, 'gap')")
    _execute(conninfo, f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
    with pytest.raises(SlotReplaced, match="records no slot"):
        _receive(settings)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        '{"slot": "gap"}',
        '{"slot": "gap", "database": "d", "created_lsn": "x", "confirmed_bound": "0/1"}',
    ],
)
def test_a_damaged_record_is_a_typed_error(tmp_path: Path, text: str) -> None:
    (tmp_path / STATE_NAME).write_text(text)
    with pytest.raises(ChangeLogError, match="is damaged"):
        load_origin(str(tmp_path))
