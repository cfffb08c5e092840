"""Exactly once through crashes: a receiver process is SIGKILLed at 20 random instants while a
workload of ~200k changes runs (small transactions, large streamed ones with
``logical_decoding_work_mem`` = 64kB, two-phase commits and rollbacks) and restarted after each
kill. Afterwards the change log holds every committed row exactly once, in commit order, and
the slot's confirmed position never passed what the log had made durable.

A second test kills it while it streams a mixed workload (key changes, TOAST left unchanged
and rewritten, deletes, TRUNCATE) and compares the log with test_decoding's output of a second
slot over the same WAL, change by change and value by value.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.events import Insert
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from tests.conftest import Database
from tests.oracle.changelog import UNCHANGED, Entry, add_entries, decoded_changes

from .helpers import current_lsn, slot_position

KILLS = 20
SMALL_TXNS = 1500
SMALL_ROWS = 100
LARGE_ROWS = 10_000
LARGE_COMMITTED = 4
PREPARED = 20
ROOT = Path(__file__).resolve().parents[2]
INSERT = "INSERT INTO crash SELECT g, %s, repeat('x', 40) FROM generate_series(%s::bigint, %s) g"


@dataclass
class Workload:
    """What the workload did, in the order the server committed it."""

    committed: list[int] = field(default_factory=list)  # batch numbers, commit order
    rolled_back: list[int] = field(default_factory=list)
    error: BaseException | None = None


def plan(rng: random.Random) -> list[tuple[str, int]]:
    steps = [("small", SMALL_ROWS)] * SMALL_TXNS
    steps += [("large", LARGE_ROWS)] * LARGE_COMMITTED
    steps += [("large-rollback", LARGE_ROWS), ("large-prepared", LARGE_ROWS)]
    steps += [("prepared", SMALL_ROWS)] * (PREPARED - 5) + [("prepared-rollback", SMALL_ROWS)] * 5
    rng.shuffle(steps)
    return steps


def run_workload(conninfo: str, rng: random.Random, record: Workload) -> None:
    try:
        _workload(conninfo, rng, record)
    except BaseException as error:
        record.error = error


def _workload(conninfo: str, rng: random.Random, record: Workload) -> None:
    next_id = 1
    settle: list[tuple[int, str, int, bool]] = []  # (due step, gid, batch, commit?)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for step, (kind, rows) in enumerate(plan(rng)):
            batch = step + 1
            first, last = next_id, next_id + rows - 1
            next_id += rows
            conn.execute("BEGIN")
            conn.execute(INSERT, (batch, first, last))
            if kind in ("small", "large"):
                conn.execute("COMMIT")
                record.committed.append(batch)
            elif kind == "large-rollback":
                conn.execute("ROLLBACK")
                record.rolled_back.append(batch)
            else:
                gid = f"g{batch}"
                conn.execute(f"PREPARE TRANSACTION '{gid}'")
                settle.append((step + rng.randint(1, 5), gid, batch, kind != "prepared-rollback"))
            for due, gid, done_batch, commit in [s for s in settle if s[0] <= step]:
                settle.remove((due, gid, done_batch, commit))
                if commit:
                    conn.execute(f"COMMIT PREPARED '{gid}'")
                    record.committed.append(done_batch)
                else:
                    conn.execute(f"ROLLBACK PREPARED '{gid}'")
                    record.rolled_back.append(done_batch)
            time.sleep(0.01)  # spread the workload over the kills
        for _, gid, done_batch, commit in settle:
            conn.execute(f"{'COMMIT' if commit else 'ROLLBACK'} PREPARED '{gid}'")
            (record.committed if commit else record.rolled_back).append(done_batch)


def start_child(conninfo: str, root: Path, durable: Path, end: LSN | None = None):
    args = [sys.executable, "-m", "tests.receiver.crash_child", conninfo, str(root), str(durable)]
    if end is not None:
        args.append(str(int(end)))
    return subprocess.Popen(
        args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def claimed_durable(path: Path) -> LSN | None:
    try:
        return LSN(int(path.read_text()))
    except (FileNotFoundError, ValueError):
        return None


@pytest.mark.slow
def test_sigkilled_receiver_logs_every_commit_exactly_once(db: Database, tmp_path: Path):
    with db.connect() as conn:
        conn.execute("CREATE TABLE crash (id bigint PRIMARY KEY, batch int, pad text)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, true)")
    conninfo = db.conninfo(options="-c logical_decoding_work_mem=64kB")
    root = tmp_path / "log"
    durable = tmp_path / "durable"
    rng = random.Random(20261122 + db.major)
    record = Workload()
    writer = threading.Thread(target=run_workload, args=(db.conninfo(), rng, record))
    writer.start()
    samples: list[tuple[LSN, LSN]] = []  # (slot confirmed, log durable claimed after it)

    def sample() -> None:
        confirmed, _, _ = slot_position(db, "s")  # the slot first, then what the log claimed
        claim = claimed_durable(durable)
        if confirmed is not None:
            samples.append((confirmed, claim if claim is not None else LSN(0)))

    try:
        for _ in range(KILLS):
            child = start_child(conninfo, root, durable)
            deadline = time.monotonic() + rng.uniform(0.5, 3.0)
            while time.monotonic() < deadline and child.poll() is None:
                sample()
                time.sleep(0.05)
            assert child.poll() is None, child.communicate()
            child.send_signal(signal.SIGKILL)
            child.wait()
            sample()  # what the server kept from the dead receiver
            wait_until(lambda: not slot_position(db, "s")[2], timeout=60)
    finally:
        writer.join(600)
    assert record.error is None, record.error
    with db.connect() as conn:
        end = current_lsn(conn)
    child = start_child(conninfo, root, durable, end)
    out, err = child.communicate(timeout=600)
    assert child.returncode == 0, err
    assert out.startswith("done"), out
    sample()

    # The log against the source: every committed row once, transactions in commit order.
    batches: list[int] = []
    logged_ids: list[int] = []
    positions: list[tuple[LSN, LSN]] = []
    for txn in ChangeLog(root).read_transactions():
        positions.append((txn.commit_lsn, txn.end_lsn))
        rows = [e.new for e in txn.events if isinstance(e, Insert)]
        if not rows:
            continue
        txn_batches = {int(str(row[1])) for row in rows}
        assert len(txn_batches) == 1, txn_batches
        batches.extend(txn_batches)
        logged_ids.extend(int(str(row[0])) for row in rows)
    source_ids = [row[0] for row in db.execute("SELECT id FROM crash ORDER BY id")]
    assert len(logged_ids) == len(set(logged_ids)), "a change was logged twice"
    assert sorted(logged_ids) == source_ids
    assert batches == record.committed
    assert len(source_ids) >= 190_000
    assert not set(record.rolled_back) & set(batches)
    # A confirmation past the durable end is safe only over WAL with nothing to log (the
    # receiver follows keepalives while idle): no transaction may lie between the two.
    assert len(samples) > KILLS
    violations = [
        (confirmed, claim, commit)
        for confirmed, claim in samples
        if confirmed > claim
        for commit, end in positions
        if end > claim and commit < confirmed
    ]
    assert not violations, violations[:5]
    assert any(confirmed > LSN(0) and claim > LSN(0) for confirmed, claim in samples)


# --- a mixed workload, checked value by value -------------------------------------------------

MIXED_KILLS = 6
MIXED_STEPS = 160
# A value stored out of line: 100 md5 digests (3.2 kB of hex) do not compress by the 25%
# pglz requires, so each row's value is TOASTed; distinct per row and per step.
BIG = (
    "(SELECT string_agg(md5(%s::text || ':' || id || ':' || s), '') FROM generate_series(1, 100) s)"
)


def mixed_plan(rng: random.Random) -> list[str]:
    steps = ["insert"] * 50 + ["update"] * 35 + ["rewrite"] * 25 + ["rekey"] * 15
    steps += ["delete"] * 20 + ["truncate"] * 2 + ["large"] * 3
    steps += ["insert"] * (MIXED_STEPS - len(steps))
    rng.shuffle(steps)
    return steps


def _mixed_workload(conninfo: str, rng: random.Random, errors: list[BaseException]) -> None:
    """Each step is one transaction: inserts (half with a TOASTed value), updates leaving the
    TOASTed value unchanged, updates rewriting it, key changes, deletes, TRUNCATE, and a
    transaction larger than logical_decoding_work_mem (streamed) touching the TOASTed rows."""
    next_id = 1
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for step, kind in enumerate(mixed_plan(rng)):
                k, tag = rng.randrange(7), f"s{step}"
                with conn.transaction():
                    if kind in ("insert", "large"):
                        rows = 20 if kind == "insert" else 1500
                        conn.execute(
                            "INSERT INTO mixed SELECT id, 0, CASE WHEN id %% 2 = 0 THEN "
                            f"{BIG} ELSE 'small ' || id END "
                            "FROM generate_series(%s::bigint, %s::bigint) id",
                            (tag, next_id, next_id + rows - 1),
                        )
                        next_id += rows
                        if kind == "large":
                            conn.execute("UPDATE mixed SET n = n + 1 WHERE id %% 3 = %s", (k % 3,))
                    elif kind == "update":
                        conn.execute("UPDATE mixed SET n = n + 1 WHERE id %% 7 = %s", (k,))
                    elif kind == "rewrite":
                        conn.execute(
                            f"UPDATE mixed SET big = {BIG}, n = n + 1 "
                            "WHERE id %% 11 = %s AND id %% 2 = 0",
                            (tag, k),
                        )
                    elif kind == "rekey":
                        conn.execute(
                            "UPDATE mixed SET id = -id WHERE id > 0 AND id %% 13 = %s", (k,)
                        )
                    elif kind == "delete":
                        conn.execute("DELETE FROM mixed WHERE id %% 17 = %s", (k,))
                    else:
                        conn.execute("TRUNCATE mixed")
                time.sleep(0.05)  # spread the workload over the kills
    except BaseException as error:
        errors.append(error)


def _replay(entries: list[Any]) -> dict[str, tuple[str | None, str | None]]:
    """The table the logged changes leave behind: id -> (n, big)."""
    rows: dict[str, tuple[str | None, str | None]] = {}
    for entry in entries:
        if entry.op == "truncate":
            rows.clear()
        elif entry.op == "delete":
            del rows[str(entry.old["id"])]
        else:
            before = rows.pop(str(entry.old.get("id", entry.new["id"])), (None, None))
            values = [entry.new["n"], entry.new["big"]]
            for i, value in enumerate(values):
                if value == UNCHANGED:
                    values[i] = before[i]
            rows[str(entry.new["id"])] = (values[0], values[1])
    return rows


@pytest.mark.slow
def test_sigkilled_receiver_logs_mixed_changes_value_by_value(db: Database, tmp_path: Path):
    """SIGKILLs at seeded instants of a workload of inserts, updates (key changes, TOAST left
    unchanged and rewritten), deletes and TRUNCATE: the change log's changes equal
    test_decoding's over the same WAL one for one, value for value, and replay to the source."""
    with db.connect() as conn:
        conn.execute("CREATE TABLE mixed (id bigint PRIMARY KEY, n int NOT NULL, big text)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput', false, true)")
        conn.execute("SELECT pg_create_logical_replication_slot('oracle', 'test_decoding')")
    conninfo = db.conninfo(options="-c logical_decoding_work_mem=64kB")
    root, durable = tmp_path / "log", tmp_path / "durable"
    rng = random.Random(20261124 + db.major)
    failures: list[BaseException] = []
    writer = threading.Thread(target=_mixed_workload, args=(db.conninfo(), rng, failures))
    writer.start()
    try:
        for _ in range(MIXED_KILLS):
            child = start_child(conninfo, root, durable)
            # Killed while it streams, not while it starts.
            wait_until(lambda c=child: slot_position(db, "s")[2] or c.poll() is not None)
            time.sleep(rng.uniform(0.1, 1.0))
            assert child.poll() is None, child.communicate()
            child.send_signal(signal.SIGKILL)
            child.wait()
            wait_until(lambda: not slot_position(db, "s")[2], timeout=60)
    finally:
        writer.join(600)
    assert not failures, failures
    with db.connect() as conn:
        end = current_lsn(conn)
    child = start_child(conninfo, root, durable, end)
    out, err = child.communicate(timeout=600)
    assert child.returncode == 0, err
    assert out.startswith("done"), out

    logged: dict[tuple[str, str], list[Entry]] = {}
    for txn in ChangeLog(root).read_transactions():
        add_entries(txn.events, logged)
    with db.connect() as conn:
        expected, _ = decoded_changes(conn, "oracle")
        source = {
            str(id_): (str(n), big)
            for id_, n, big in conn.execute("SELECT id, n, big FROM mixed").fetchall()
        }
    got, want = logged[("public", "mixed")], expected[("public", "mixed")]
    ops = {op: sum(e.op == op for e in want) for op in ("insert", "update", "delete", "truncate")}
    assert all(ops.values()), ops
    assert sum(e.new.get("big") == UNCHANGED for e in want) > 0  # TOAST left unchanged
    assert sum(bool(e.old) for e in want if e.op == "update") > 0  # key changes
    assert len(got) == len(want), (len(got), len(want))
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert (g.op, g.new, g.old) == (w.op, w.new, w.old), f"change {i} differs"
    assert _replay(got) == source
