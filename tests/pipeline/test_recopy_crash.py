"""A re-copy (``pgcdc pipeline run --recopy``) killed mid-copy, on PG15 and PG18: readers see
no part of its transaction, its temporary slot goes with its connection, and the same
re-copy run again logs it whole, once, after everything the first run drained."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pgcdc.changelog import ChangeLog
from pgcdc.events import Insert, Truncate, Update
from pgcdc.pipeline import current_wal_lsn, load, receive
from tests.conftest import Database

# The receiver of ``pipeline run`` (``pgcdc.pipeline.receive``) in a process of its own.
_CHILD = (
    "import json, sys; from pgcdc.pipeline import load, receive; "
    "receive(load(None, json.loads(sys.argv[1])), None, None)"
)
ROWS = 100_000  # about 10 MB of COPY text: several 4 MB frames of the change log
# What the drain logs (ten updates) is far less: more means frames of the copy were written.
COPY_UNDER_WAY = 1 << 20


def _log_bytes(log: Path) -> int:
    return sum(f.stat().st_size for f in log.rglob("*") if f.is_file())


def test_a_crash_mid_recopy_leaves_no_part_of_it(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
    db.execute("CREATE PUBLICATION cdc FOR TABLE t")
    db.execute(
        "INSERT INTO t SELECT g, md5(g::text) || md5((-g)::text) || md5(g::text || 'x') "
        f"FROM generate_series(1, {ROWS}) g"
    )
    log = tmp_path / "log"
    overrides: dict[str, Any] = {
        "conninfo": db.conninfo(),
        "slot": "crash",
        "publications": ["cdc"],
        "changelog": str(log),
        "snapshot": "never",
        "snapshot_workers": 1,
    }
    receive(load(None, overrides), current_wal_lsn(db.conninfo()), None)  # the slot
    db.execute("UPDATE t SET pad = 'changed' WHERE id <= 10")
    before = _log_bytes(log)

    recopy = {**overrides, "recopy": ["public.t"]}
    child = subprocess.Popen([sys.executable, "-c", _CHILD, json.dumps(recopy)])
    try:
        # Killed once the copy has written frames of its transaction, long before its end.
        while _log_bytes(log) < before + COPY_UNDER_WAY:
            assert child.poll() is None, "the receiver ended before the copy was under way"
            time.sleep(0.005)
    finally:
        child.kill()
        child.wait()

    transactions = list(ChangeLog(str(log)).read_transactions())
    events = [e for txn in transactions for e in txn.events]
    assert not any(isinstance(e, Truncate | Insert) for e in events)  # no part of the copy
    assert sum(isinstance(e, Update) for e in events) == 10  # the drain before it is kept
    deadline = time.monotonic() + 10  # the server notices the closed connection at once
    while db.scalar("SELECT count(*) FROM pg_replication_slots WHERE slot_name <> 'crash'"):
        assert time.monotonic() < deadline, "the re-copy's slot outlived its connection"
        time.sleep(0.05)

    receive(load(None, recopy), current_wal_lsn(db.conninfo()), None)
    transactions = list(ChangeLog(str(log)).read_transactions())
    copies = [t for t in transactions if any(isinstance(e, Truncate) for e in t.events)]
    assert len(copies) == 1
    assert copies[0] is transactions[-1]  # after the drained changes, nothing after it yet
    inserts = [e for e in copies[0].events if isinstance(e, Insert)]
    assert len(inserts) == ROWS
    assert sum(isinstance(e, Update) for t in transactions for e in t.events) == 10
