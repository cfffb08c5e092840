"""Exactly once through crashes: a receiver process is SIGKILLed at 20 random instants while a
workload of ~200k changes runs (small transactions, large streamed ones with
``logical_decoding_work_mem`` = 64kB, two-phase commits and rollbacks) and restarted after each
kill. Afterwards the change log holds every committed row exactly once, in commit order, and
the slot's confirmed position never passed what the log had made durable.
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

import psycopg
import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.events import Insert
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from tests.conftest import Database

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
