"""ALTER TABLE ... ADD COLUMN through ``pgcdc pipeline run --once`` on PG15 and PG18: the changelog
gains the column and its ``_old`` struct gains the field by a schema change alone (every data
file written before is still there, byte for byte), and old rows read back null there."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from pgcdc.cli.main import main
from pgcdc.sinks import SinkKind, read_table, table_path
from pgcdc.sinks.delta import table_schema
from tests.conftest import Database

from .helpers import sort_rows


def _files(path: str) -> dict[str, str]:
    """The table's current data files and a hash of each one's bytes."""
    return {
        uri: hashlib.sha256(Path(uri).read_bytes()).hexdigest()
        for uri in DeltaTable(path).file_uris()
    }


def _source(db: Database) -> list[dict[str, Any]]:
    with db.connect() as conn:
        cursor = conn.execute("SELECT id, label, note FROM items")
        return sort_rows([dict(zip(["id", "label", "note"], r, strict=True)) for r in cursor])


def test_add_column_widens_old_without_rewriting_the_changelog(
    db: Database, tmp_path: Path
) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, label text)")
    db.execute("ALTER TABLE items REPLICA IDENTITY FULL")  # _old holds every column
    db.execute("CREATE PUBLICATION cdc FOR TABLE items")
    lake = tmp_path / "lake"
    argv = [
        "pipeline", "run", "-d", db.conninfo(), "--slot", "addcol", "--publication", "cdc",
        "--changelog", str(tmp_path / "log"), "--lake", str(lake),
        "--checkpoint", str(tmp_path / "checkpoint"), "--kinds", "changelog,mirror",
        "--master", "local[2]", "--snapshot", "never", "--once",
    ]  # fmt: skip
    assert main(argv) == 0  # creates the slot
    db.execute("INSERT INTO items SELECT g, 'label ' || g FROM generate_series(1, 30) g")
    db.execute("UPDATE items SET label = label || ' changed' WHERE id <= 10")
    assert main(argv) == 0
    changelog = table_path(lake, "public", "items", SinkKind.CHANGELOG)
    before = _files(changelog)
    assert before
    old_rows = read_table(changelog).num_rows
    assert old_rows == 40

    db.execute("ALTER TABLE items ADD COLUMN note text")
    db.execute("UPDATE items SET note = 'note ' || id, label = label || '!' WHERE id > 25")
    db.execute("INSERT INTO items VALUES (100, 'late', 'fresh')")
    assert main(argv) == 0

    after = _files(changelog)
    assert {uri: after.get(uri) for uri in before} == before  # nothing rewritten or removed
    old_type = table_schema(DeltaTable(changelog)).field("_old").type
    assert [f.name for f in old_type] == ["id", "label", "note"]
    log = read_table(changelog).sort_by([("_commit_lsn", "ascending"), ("_seq", "ascending")])
    assert log.num_rows == old_rows + 5 + 1
    rows = log.to_pylist()
    for row in rows[:old_rows]:
        assert row["note"] is None
        assert row["_old"] is None or row["_old"]["note"] is None
    updates = [r for r in rows[old_rows:] if r["_op"] == "update"]
    assert sorted((r["_old"]["id"], r["_old"]["note"], r["note"]) for r in updates) == [
        (i, None, f"note {i}") for i in range(26, 31)
    ]
    mirror = read_table(table_path(lake, "public", "items", SinkKind.MIRROR))
    assert sort_rows(mirror.select(["id", "label", "note"]).to_pylist()) == _source(db)
