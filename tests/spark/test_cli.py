"""``pgcdc pipeline run --once`` and ``pgcdc demo`` through the real command, on PG15 and PG18:
the Delta mirrors they leave equal the source tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc.cli.main import main
from pgcdc.connection.sql import get_slot
from pgcdc.errors import InvalidOption, MirrorDiffers
from pgcdc.pipeline import load
from pgcdc.pipeline.demo import check_mirrors
from pgcdc.sinks import SinkKind, read_table
from tests.conftest import Database

from .helpers import mirror_rows, table_rows


def _source_rows(db: Database, table: str) -> tuple[list[str], list[dict[str, Any]]]:
    with db.connect() as conn:
        return table_rows(conn, table)


def test_pipeline_run_once_from_a_config_file_with_flag_overrides(
    db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8, 2))")
    db.execute("CREATE PUBLICATION cdc FOR TABLE items")
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f"""
[source]
conninfo = "{db.conninfo()}"
slot = "from_file"
publications = ["cdc"]

[paths]
changelog = "{tmp_path / "log"}"
lake = "{tmp_path / "wrong-lake"}"
checkpoint = "{tmp_path / "checkpoint"}"

[tables]
kinds = ["changelog", "mirror"]

[spark]
master = "local[2]"
"""
    )
    lake = tmp_path / "lake"
    argv = ["pipeline", "run", "--config", str(config), "--lake", str(lake), "--slot", "cli"]
    argv.append("--once")
    # First run creates the slot (nothing to drain yet); the second drains the changes.
    assert main(argv) == 0
    assert db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'cli'") == 1
    db.execute("INSERT INTO items SELECT g, 'item ' || g, g * 1.5 FROM generate_series(1, 200) g")
    db.execute("UPDATE items SET price = price * 2 WHERE id % 3 = 0")
    db.execute("DELETE FROM items WHERE id % 7 = 0")
    capsys.readouterr()
    assert main([*argv, "--verbose"]) == 0
    # -v says what the run did.
    assert "rows written in" in capsys.readouterr().err
    columns, expected = _source_rows(db, "public.items")
    assert len(expected) > 150
    assert mirror_rows(lake, "public.items", columns) == expected
    assert not (tmp_path / "wrong-lake").exists()
    assert not (lake / "public" / "items" / "history").exists()


def test_config_errors_say_what_to_fix(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[spark]\nmaster = 3\n")
    with pytest.raises(InvalidOption, match="master"):
        load(bad, {"conninfo": "dbname=x"})
    with pytest.raises(InvalidOption, match="conninfo"):
        load(None, {})
    with pytest.raises(InvalidOption, match="kind"):
        load(None, {"conninfo": "dbname=x", "kinds": ["mirror", "snapshot"]})
    with pytest.raises(InvalidOption, match="use one of auto, driver, executors"):
        load(None, {"conninfo": "dbname=x", "writes": "workers"})
    racing = {"conninfo": "dbname=x", "spark_conf": {"spark.speculation": "true"}}
    with pytest.raises(InvalidOption, match="speculative copy"):
        load(None, {**racing, "master": "spark://h:7077"})
    assert load(None, racing).resolved_writes == "driver"  # a local master writes there
    assert load(None, {"conninfo": "dbname=x", "master": "yarn"}).resolved_writes == "executors"


def test_demo_fills_the_lake_with_the_source_tables(
    db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo snapshots the rows it seeded while its workload runs, streams the rest, and
    checks each mirror against its source itself; that check fails on a difference."""
    lake = tmp_path / "lake"
    argv = ["demo", "--dsn", db.conninfo(), "--lake", str(lake), "--duration", "3"]
    assert main([*argv, "--interval", "1", "--master", "local[2]", "--rate", "100"]) == 0
    output = capsys.readouterr().out
    assert "slot pgcdc_demo already exists" not in output
    for table in ("customers", "orders", "inventory"):
        columns, expected = _source_rows(db, f"pgcdc_demo.{table}")
        assert expected, table
        assert mirror_rows(lake, f"pgcdc_demo.{table}", columns) == expected, table
        assert f"pgcdc_demo.{table}: mirror equals the source ({len(expected)} rows)" in output
    # Seeded rows the workload never touched reach the mirror through the initial snapshot
    # only, so the equality above covers it. The demo's own check can fail:
    db.execute("UPDATE pgcdc_demo.inventory SET quantity = quantity + 1 WHERE sku = 'SKU-0001'")
    with pytest.raises(MirrorDiffers, match=r"pgcdc_demo\.inventory differs"):
        check_mirrors(db.conninfo(), lake)


def _slot_failover(db: Database, name: str) -> bool | None:
    with db.connect() as conn:
        slot = get_slot(conn, name)
    assert slot is not None
    return slot.failover


def test_first_run_snapshots_existing_rows_then_streams(db: Database, tmp_path: Path) -> None:
    """Rows written before the pipeline ever ran reach the mirror through the initial snapshot,
    later changes through the slot; a second start does not snapshot again."""
    db.execute("CREATE TABLE accounts (id int PRIMARY KEY, owner text, balance numeric(12, 2))")
    db.execute(
        "INSERT INTO accounts SELECT g, 'owner ' || g, g * 10 FROM generate_series(1, 300) g"
    )
    db.execute("CREATE PUBLICATION cdc FOR TABLE accounts")
    lake = tmp_path / "lake"
    argv = [
        "pipeline", "run", "-d", db.conninfo(), "--slot", "snap", "--publication", "cdc",
        "--changelog", str(tmp_path / "log"), "--lake", str(lake),
        "--checkpoint", str(tmp_path / "checkpoint"), "--kinds", "changelog,mirror",
        "--master", "local[2]", "--snapshot-workers", "2", "--once",
    ]  # fmt: skip
    assert main(argv) == 0
    # A failover slot where the server has them (PostgreSQL 17+: standbys keep a copy).
    assert _slot_failover(db, "snap") is (True if db.major >= 17 else None)
    columns, expected = _source_rows(db, "public.accounts")
    assert len(expected) == 300
    assert mirror_rows(lake, "public.accounts", columns) == expected

    db.execute("UPDATE accounts SET balance = balance + 1 WHERE id % 2 = 0")
    db.execute("DELETE FROM accounts WHERE id > 250")
    db.execute("INSERT INTO accounts VALUES (1000, 'late', 1)")
    assert main(argv) == 0
    columns, expected = _source_rows(db, "public.accounts")
    assert mirror_rows(lake, "public.accounts", columns) == expected
    changelog = read_table(lake / "public" / "accounts" / SinkKind.CHANGELOG.value)
    # 300 snapshot inserts, 150 updates, 50 deletes, 1 insert: nothing twice.
    assert changelog.num_rows == 300 + 150 + 50 + 1


def test_snapshot_never_skips_existing_rows(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE notes (id int PRIMARY KEY, body text)")
    db.execute("INSERT INTO notes SELECT g, 'old' FROM generate_series(1, 20) g")
    db.execute("CREATE PUBLICATION cdc FOR TABLE notes")
    lake = tmp_path / "lake"
    argv = [
        "pipeline", "run", "-d", db.conninfo(), "--slot", "nosnap", "--publication", "cdc",
        "--changelog", str(tmp_path / "log"), "--lake", str(lake),
        "--checkpoint", str(tmp_path / "checkpoint"), "--kinds", "mirror",
        "--master", "local[2]", "--snapshot", "never", "--once", "--no-failover",
    ]  # fmt: skip
    assert main(argv) == 0
    assert _slot_failover(db, "nosnap") is (False if db.major >= 17 else None)
    db.execute("INSERT INTO notes VALUES (100, 'new')")
    assert main(argv) == 0
    assert mirror_rows(lake, "public.notes", ["id", "body"]) == [{"id": 100, "body": "new"}]


def _notes_over_one_mib(
    db: Database, tmp_path: Path, *, snapshot_in: str, writes: str, kinds: str
) -> Path:
    """A 30k-row table published to "cdc" (over 2 MiB of random hex digits: zstd cannot shrink
    it below the limit), and a pipeline TOML file whose driver may receive only 1 MiB of task
    results."""
    if db.execute("SELECT to_regclass('notes')") == [(None,)]:
        db.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
        db.execute(
            "INSERT INTO notes SELECT g, md5(random()::text) || md5(random()::text) "
            "|| md5(random()::text) || md5(random()::text) FROM generate_series(1, 30000) g"
        )
        db.execute("CREATE PUBLICATION cdc FOR TABLE notes")
    config = tmp_path / f"{snapshot_in}-{writes}.toml"
    config.write_text(
        f"""
[source]
conninfo = "{db.conninfo()}"
publications = ["cdc"]
snapshot_in = "{snapshot_in}"

[paths]
changelog = "{tmp_path / "log"}"
lake = "{tmp_path / "lake"}"
checkpoint = "{tmp_path / "checkpoint"}"

[tables]
kinds = {kinds}

[spark]
master = "local[2]"
writes = "{writes}"
conf = {{ "spark.driver.maxResultSize" = "1m" }}
"""
    )
    return config


def _changes_land(db: Database, config: Path) -> None:
    """Some notes updated and deleted, the pipeline run again: the mirror equals the source."""
    db.execute("UPDATE notes SET note = 'changed' WHERE id % 100 = 0")
    db.execute("DELETE FROM notes WHERE id % 101 = 0")
    assert main(["pipeline", "run", "--config", str(config), "--once"]) == 0
    columns, expected = _source_rows(db, "public.notes")
    assert len(expected) > 29_000
    assert mirror_rows(config.parent / "lake", "public.notes", columns) == expected


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_writes_in_executors_keep_batches_off_the_driver(
    db: Database, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver may receive 1 MiB of task results, the snapshot's batch (copied by the
    receiver into the change log) is larger: collected to the driver it is a typed error saying
    what to set; written in executors it lands."""
    settings = {"snapshot_in": "receiver", "kinds": '["mirror"]'}
    on_driver = _notes_over_one_mib(db, tmp_path, writes="driver", **settings)
    assert main(["pipeline", "run", "--config", str(on_driver), "--once"]) == 1
    error = capsys.readouterr().err
    assert "larger than spark.driver.maxResultSize" in error, error[-2000:]
    assert 'writes = "executors"' in error
    assert not (tmp_path / "lake" / "public" / "notes" / "mirror").exists()
    _changes_land(db, _notes_over_one_mib(db, tmp_path, writes="executors", **settings))


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_a_snapshot_in_executors_never_passes_through_the_driver(
    db: Database, tmp_path: Path
) -> None:
    """The same 1 MiB limit on task results with Delta writes on the driver: the initial
    snapshot, copied by Spark tasks that write the Delta tables themselves, lands whole (the
    driver gets only add actions), and the stream's small batches after it land too."""
    config = _notes_over_one_mib(
        db,
        tmp_path,
        snapshot_in="executors",
        writes="driver",
        kinds='["changelog", "mirror", "history"]',
    )
    assert main(["pipeline", "run", "--config", str(config), "--once"]) == 0
    columns, expected = _source_rows(db, "public.notes")
    assert mirror_rows(tmp_path / "lake", "public.notes", columns) == expected
    _changes_land(db, config)
