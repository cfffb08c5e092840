"""What the catalog knows, carried through the change log into Delta, on PG15 and PG18 with
``pipeline.run(once=True)``, its real receiver process and a real SparkSession: domains (over
numeric(10,2), over a domain over int4, over text[]), arrays of domains and enums keep their
base types, in the snapshot and in the stream."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from pgcdc import pipeline
from pgcdc.changelog import ChangeLog
from pgcdc.errors import StaleRowsWarning
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions
from pgcdc.sinks import SinkKind, read_table
from tests.conftest import Database


def _settings(db: Database, tmp_path: Path) -> pipeline.Settings:
    return pipeline.Settings(
        conninfo=db.conninfo(),
        slot="facts",
        publications=("pub",),
        snapshot="initial",
        snapshot_workers=2,
        changelog=str(tmp_path / "log"),
        lake=str(tmp_path / "lake"),
        checkpoint=str(tmp_path / "checkpoint"),
        kinds=(SinkKind.CHANGELOG, SinkKind.MIRROR, SinkKind.HISTORY),
        master="local[2]",
        trigger_interval=0.5,
    )


def _lake(tmp_path: Path, table: str, kind: SinkKind) -> pa.Table:
    return read_table(tmp_path / "lake" / "public" / table / kind.value)


# The source's values in the types the lake should hold (casts: psycopg knows no domains).
_DOMAIN_SELECT = (
    "SELECT id, price::numeric, n::int4, tags::text[], mood::text, amounts::numeric[] "
    "FROM typed ORDER BY id"
)
_DOMAIN_COLUMNS = ("id", "price", "n", "tags", "mood", "amounts")


def test_domains_and_enums_keep_their_base_types(db: Database, tmp_path: Path, spark: Any) -> None:
    db.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    db.execute("CREATE DOMAIN price AS numeric(10, 2) CHECK (VALUE >= 0)")
    db.execute("CREATE DOMAIN positive AS int4 CHECK (VALUE > 0)")
    db.execute("CREATE DOMAIN small_positive AS positive CHECK (VALUE < 1000)")
    db.execute("CREATE DOMAIN tags AS text[]")
    db.execute(
        "CREATE TABLE typed (id int PRIMARY KEY, price price, n small_positive, tags tags, "
        "mood mood, amounts price[])"
    )
    db.execute("CREATE PUBLICATION pub FOR TABLE typed")
    insert = "INSERT INTO typed VALUES (%s, %s, %s, %s, %s, %s)"
    with db.connect() as conn:
        conn.execute(insert, (1, "12.30", 7, ["a", "b c"], "happy", ["1.5", None, "99999999.99"]))
        conn.execute(insert, (2, None, None, None, None, None))
    settings = _settings(db, tmp_path)
    pipeline.run(settings, once=True, spark=spark)  # the snapshot
    with db.connect() as conn:
        conn.execute(insert, (3, "0.01", 999, ["{x}", ""], "sad", []))
        conn.execute("UPDATE typed SET price = 45.60, mood = 'ok' WHERE id = 1")
    pipeline.run(settings, once=True, spark=spark)  # the stream

    decimal = pa.decimal128(10, 2)
    expected_types = {
        "id": pa.int32(),
        "price": decimal,
        "n": pa.int32(),
        "tags": pa.list_(pa.string()),
        "mood": pa.string(),
        "amounts": pa.list_(decimal),
    }
    source = [dict(zip(_DOMAIN_COLUMNS, row, strict=True)) for row in db.execute(_DOMAIN_SELECT)]
    assert [row["id"] for row in source] == [1, 2, 3]
    for kind in (SinkKind.MIRROR, SinkKind.HISTORY, SinkKind.CHANGELOG):
        table = _lake(tmp_path, "typed", kind)
        for name, arrow_type in expected_types.items():
            field = table.schema.field(name)
            assert field.type.equals(arrow_type), (kind, name, field.type)
    mirror = _lake(tmp_path, "typed", SinkKind.MIRROR)
    rows = sorted(mirror.select(list(_DOMAIN_COLUMNS)).to_pylist(), key=lambda r: r["id"])
    for got, want in zip(rows, source, strict=True):
        for name in _DOMAIN_COLUMNS:
            assert got[name] == want[name], (name, got, want)
    # The snapshot's version of row 1 (history) holds the snapshot's values, typed alike.
    history = _lake(tmp_path, "typed", SinkKind.HISTORY).to_pylist()
    first = [r for r in history if r["id"] == 1 and r["mood"] == "happy"]
    assert len(first) == 1 and str(first[0]["price"]) == "12.30"


def _current(table: pa.Table, columns: list[str]) -> list[dict[str, Any]]:
    if "_is_current" in table.column_names:
        table = table.filter(table.column("_is_current"))
    return sorted(table.select(columns).to_pylist(), key=lambda r: r["id"])


def test_add_column_default_reaches_rows_the_slot_never_sent(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text)")
    db.execute("CREATE TABLE rewritten (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub FOR TABLE items, rewritten")
    db.execute("INSERT INTO items SELECT g, 'n' || g FROM generate_series(1, 4) g")
    db.execute("INSERT INTO rewritten VALUES (1), (2)")
    settings = _settings(db, tmp_path)
    pipeline.run(settings, once=True, spark=spark)  # snapshot: the lake has rows 1-4
    with db.connect() as conn:
        # Changed before the column exists: this version is closed before it is added.
        conn.execute("UPDATE items SET name = 'one' WHERE id = 1")
        conn.execute("ALTER TABLE items ADD COLUMN n int DEFAULT 7")
        conn.execute("ALTER TABLE items ADD COLUMN s text DEFAULT 'x'")
        conn.execute("ALTER TABLE items ADD COLUMN t timestamptz DEFAULT now()")  # stable: once
        conn.execute("ALTER TABLE items ADD COLUMN plain int")  # no default: null is right
        # Rows 1 and 2 stay untouched; 3 is updated (explicit values); 4 gets an explicit NULL
        # later; 5 is inserted with an explicit NULL.
        conn.execute("UPDATE items SET name = 'three' WHERE id = 3")
        conn.execute("UPDATE items SET n = NULL, s = NULL WHERE id = 4")
        conn.execute("INSERT INTO items (id, name, n, s, t) VALUES (5, 'five', NULL, NULL, NULL)")
        # A volatile default rewrites the table: no change reaches the slot.
        conn.execute("ALTER TABLE rewritten ADD COLUMN r float8 DEFAULT random()")
        conn.execute("INSERT INTO rewritten VALUES (3, 0.5)")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pipeline.run(settings, once=True, spark=spark)

    columns = ["id", "name", "n", "s", "t", "plain"]
    source = [
        dict(zip(columns, row, strict=True))
        for row in db.execute(f"SELECT {', '.join(columns)} FROM items ORDER BY id")
    ]
    assert [r["n"] for r in source] == [7, 7, 7, None, None]  # what a subscriber shows
    assert source[0]["t"] is not None and source[0]["t"] == source[2]["t"]
    for kind in (SinkKind.MIRROR, SinkKind.HISTORY):
        lake = _current(_lake(tmp_path, "items", kind), columns)
        for got, want in zip(lake, source, strict=True):
            assert got == want, (kind, got, want)
    # Versions closed before the column was added keep null (it did not exist then); those
    # current when it was added (closed since by rows 3 and 4's changes) have its value.
    history = _lake(tmp_path, "items", SinkKind.HISTORY)
    closed = history.filter(pc.invert(history.column("_is_current")))
    assert sorted(closed.select(["id", "n"]).to_pylist(), key=lambda r: r["id"]) == [
        {"id": 1, "n": None},
        {"id": 3, "n": 7},
        {"id": 4, "n": 7},
    ]
    changelog = _lake(tmp_path, "items", SinkKind.CHANGELOG)
    before = changelog.filter(pc.less_equal(changelog.column("id"), 2))  # snapshot, id 1's update
    assert before.num_rows == 3 and before.column("n").null_count == 3
    # The rewrite the slot could not see is reported, naming the table and the remedy.
    stale = [w for w in caught if issubclass(w.category, StaleRowsWarning)]
    assert stale and all("public.rewritten" in str(w.message) for w in stale)
    assert "Re-copy the table" in str(stale[0].message)
    assert not any("public.items" in str(w.message) for w in stale)


def test_alter_column_type_in_a_session_is_reported(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE prices (id int PRIMARY KEY, v numeric(10, 2), note text)")
    db.execute("CREATE PUBLICATION pub FOR TABLE prices")
    db.execute("SELECT pg_create_logical_replication_slot('facts', 'pgoutput')")
    db.execute("INSERT INTO prices VALUES (1, 1.25, 'a')")
    db.execute("ALTER TABLE prices ALTER COLUMN v TYPE numeric(10, 0)")  # 1.25 becomes 1
    db.execute("ALTER TABLE prices ALTER COLUMN note SET DEFAULT 'b'")  # no rewrite: quiet
    db.execute("INSERT INTO prices VALUES (2, 2, 'c')")
    end = LSN.parse(db.scalar("SELECT pg_current_wal_lsn()::text"))
    options = ReceiverOptions(db.conninfo(), "facts", publications=("pub",), end_lsn=end)
    with warnings.catch_warnings(record=True) as caught, ChangeLog(tmp_path).writer() as sink:
        warnings.simplefilter("always")
        Receiver(options, sink).run()
    stale = [str(w.message) for w in caught if issubclass(w.category, StaleRowsWarning)]
    assert len(stale) == 1
    assert "public.prices: column(s) ['v'] changed type" in stale[0]
    assert "Re-copy the table" in stale[0]
