"""``pgcdc pipeline run --once`` and ``pgcdc demo`` through the real command, on PG15 and PG18:
the Delta mirrors they leave equal the source tables."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc.cli.main import main
from pgcdc.errors import InvalidOption
from pgcdc.pipeline import load
from pgcdc.sinks import SinkKind, read_table
from tests.conftest import Database

from .helpers import sort_rows


def _source_rows(db: Database, table: str) -> tuple[list[str], list[dict[str, Any]]]:
    with db.connect() as conn:
        cursor = conn.execute(f"SELECT * FROM {table}")
        assert cursor.description is not None
        columns = [d.name for d in cursor.description]
        return columns, sort_rows([dict(zip(columns, r, strict=True)) for r in cursor])


def _mirror_rows(lake: Path, table: str, columns: list[str]) -> list[dict[str, Any]]:
    schema, name = table.split(".")
    data = read_table(lake / schema / name / SinkKind.MIRROR.value)
    return sort_rows(data.select(columns).to_pylist())


def test_pipeline_run_once_from_a_config_file_with_flag_overrides(
    db: Database, tmp_path: Path
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
    assert main(argv) == 0
    columns, expected = _source_rows(db, "public.items")
    assert len(expected) > 150
    assert _mirror_rows(lake, "public.items", columns) == expected
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


def test_demo_fills_the_lake_with_the_source_tables(db: Database, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    argv = ["demo", "--dsn", db.conninfo(), "--lake", str(lake), "--duration", "3"]
    assert main([*argv, "--interval", "1", "--master", "local[2]", "--rate", "100"]) == 0
    for table in ("customers", "orders", "inventory"):
        columns, expected = _source_rows(db, f"pgcdc_demo.{table}")
        assert expected, table
        assert _mirror_rows(lake, f"pgcdc_demo.{table}", columns) == expected, table
