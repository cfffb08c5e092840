"""--format json parsed back against the source rows, --format changelog read back."""

from __future__ import annotations

import json
import math
from datetime import UTC, date, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.cli.outputs import UNCHANGED_TOAST_MARKER
from pgcdc.events import Delete, Insert, Update
from pgcdc.lsn import LSN
from tests.cli.helpers import current_lsn, pgcdc
from tests.conftest import Database

TABLE = """
CREATE TABLE typed (
    id bigint PRIMARY KEY, name text, amount numeric, ratio float8, raw bytea, happened timestamptz,
    day date, ok boolean, doc jsonb, nums integer[], big text
)
"""


def source_rows(db: Database) -> dict[int, dict[str, Any]]:
    """The table as psycopg reads it; values psycopg cannot hold (infinite timestamps, jsonb)
    as the server's text."""
    with db.connect() as conn:
        cursor = conn.execute(
            "SELECT id, name, amount, ratio, raw, "
            "CASE WHEN isfinite(happened) THEN happened END AS happened, "
            "happened::text AS happened_text, day, ok, doc::text AS doc, nums, big "
            "FROM typed ORDER BY id"
        )
        names = [column.name for column in cursor.description or ()]
        rows = {}
        for row in cursor.fetchall():
            values = dict(zip(names, row, strict=True))
            text = values.pop("happened_text")
            if values["happened"] is None:
                values["happened"] = text
            rows[row[0]] = values
        return rows


def as_json(value: Any) -> Any:
    """What the JSON output must hold for a value psycopg read from the table."""
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, float) and not math.isfinite(value):
        return {math.inf: "Infinity", -math.inf: "-Infinity"}.get(value, "NaN")
    if isinstance(value, bytes):
        return "\\x" + value.hex()
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat()
    if isinstance(value, date):
        return value.isoformat()
    return value


@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_json_output_matches_the_source_rows(db: Database, tmp_path: Path, binary: bool) -> None:
    db.execute(TABLE)
    db.execute("ALTER TABLE typed ALTER COLUMN big SET STORAGE EXTERNAL")
    db.execute("CREATE PUBLICATION pub FOR TABLE typed")
    db.execute("SELECT pg_create_logical_replication_slot('j', 'pgoutput')")
    big = "".join(f"{i:05d}" for i in range(3000))  # 15 kB, stored out of line
    db.execute(
        "INSERT INTO typed VALUES "
        "(1, 'it''s \"q\"\n', 12.50, 0.1, '\\x00ff10', '2024-02-29 12:34:56.789+05:30', "
        " '2024-01-02', true, '{\"a\": [1, 2]}', '{1,NULL,3}', %s), "
        "(2, NULL, 'NaN', 'NaN', '', '-infinity', '1999-12-31', false, 'null', '{}', NULL), "
        "(3, 'x', -0.000001, 'Infinity', NULL, NULL, NULL, NULL, NULL, NULL, 'small')",
        (big,),
    )
    before_update = source_rows(db)
    db.execute("UPDATE typed SET name = 'updated', amount = amount + 1 WHERE id = 1")
    db.execute("DELETE FROM typed WHERE id = 3")
    db.execute("SELECT pg_logical_emit_message(true, 'app', '\\xdeadbeef'::bytea)")
    db.execute("TRUNCATE typed")
    end = current_lsn(db)

    out = tmp_path / "out.jsonl"
    extra = ["-o", "binary=true"] if binary else []
    result = pgcdc(
        "--start", "-S", "j", "-P", "pgoutput", "--publication", "pub", "-f", str(out),
        "-E", end, "-d", db.conninfo(), *extra,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    records = [json.loads(line) for line in out.read_text().splitlines()]
    by_operation: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_operation.setdefault(record["operation"], []).append(record)

    inserts = by_operation["insert"]
    assert len(inserts) == 3
    for record in inserts:
        row = before_update[record["new"]["id"]]
        assert record["new"] == {name: as_json(value) for name, value in row.items()}
        assert record["key"] == {"id": row["id"]}
        assert record["schema"] == "public" and record["table"] == "typed"
        assert record["old"] is None

    (update,) = by_operation["update"]
    after = dict(before_update[1], name="updated", amount=before_update[1]["amount"] + 1)
    expected = {name: as_json(value) for name, value in after.items()}
    expected["big"] = UNCHANGED_TOAST_MARKER  # not sent: unchanged and out of line
    assert update["new"] == expected
    assert update["key"] == {"id": 1}

    (delete,) = by_operation["delete"]
    assert delete["old"] == {"id": 3} and delete["key"] == {"id": 3} and delete["new"] is None

    (message,) = by_operation["message"]
    assert message["content"] == "\\xdeadbeef" and message["prefix"] == "app"
    assert message["transactional"] is True
    (truncate,) = by_operation["truncate"]
    assert truncate["tables"] == [{"schema": "public", "table": "typed"}]

    commit_lsns = [record["commit_lsn"] for record in records]
    assert len(set(commit_lsns)) == 5  # one insert transaction, then four more
    for record in records:
        assert record["lsn"].count("/") == 1 and isinstance(record["xid"], int)
        assert datetime.fromisoformat(record["commit_time"]).utcoffset() is not None


def test_changelog_output_reads_back(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    db.execute("CREATE PUBLICATION pub FOR ALL TABLES")
    db.execute("SELECT pg_create_logical_replication_slot('c', 'pgoutput')")
    db.execute("INSERT INTO t SELECT i, 'v' || i FROM generate_series(1, 5) i")
    db.execute("UPDATE t SET v = 'changed' WHERE id = 2")
    db.execute("DELETE FROM t WHERE id = 5")
    end = current_lsn(db)
    log = tmp_path / "log"
    result = pgcdc(
        "--start", "-S", "c", "-P", "pgoutput", "--publication", "pub",
        "--format", "changelog", "--log", str(log), "-E", end, "-d", db.conninfo(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    transactions = list(ChangeLog(log).read_transactions())
    assert len(transactions) == 3
    changes = [
        e for txn in transactions for e in txn.events if isinstance(e, Insert | Update | Delete)
    ]
    assert [type(e).__name__ for e in changes] == ["Insert"] * 5 + ["Update", "Delete"]
    assert [e.new for e in changes[:5] if isinstance(e, Insert)] == [
        (str(i), f"v{i}") for i in range(1, 6)
    ]
    confirmed = db.scalar(
        "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = 'c'"
    )
    assert LSN.parse(confirmed) >= transactions[-1].end_lsn  # confirmed what the log holds
