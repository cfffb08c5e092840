"""Durability: a failed fsync of the change log is never confirmed ("fsyncgate").

The pgcdc command streams slot ``s`` into a change log while a workload commits; at its N-th
fsync of a log file the fsync fails (EIO or ENOSPC) and the file loses what was written since
its last good fsync, as Linux may drop the pages of a failed writeback, while the process
runs on (``tests.faults.powercut.fail_fsync``). The command must end with one typed error
line and leave the slot confirmed no further than the log holds; a plain rerun then logs every
committed row exactly once with the source's values. A writer that swallows the failed fsync,
or retries it and takes the retry's success as durable, fails this test.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from tests.cli.helpers import assert_one_line_error
from tests.conftest import Database

from .test_powercut import (
    ROOT,
    Workload,
    assert_logged_once,
    log_end,
    run_workload,
    slot_state,
)

# (the failing fsync's number among the log's file fsyncs, its error): the first ones hit the
# first segment's header, later ones flushes, seals and new segments.
FAILURES = [(1, errno.EIO), (2, errno.ENOSPC), (3, errno.EIO), (6, errno.EIO), (11, errno.ENOSPC)]


def run_pgcdc(
    db: Database, root: Path, shadow: Path, failing: int, code: int, *extra: str
) -> subprocess.CompletedProcess[bytes]:
    args = [sys.executable, "-m", "tests.faults.fsync_failure_child", str(shadow), str(root)]
    args += [str(failing), str(code), "--start", "-d", db.conninfo(), "-S", "s"]
    args += ["--format", "changelog", "--log", str(root), "--publication", "pub", "-F", "0.02"]
    # A receiver that goes on after the failure never ends by itself: the timeout fails it.
    return subprocess.run([*args, *extra], cwd=ROOT, capture_output=True, timeout=60, check=False)


@pytest.mark.slow
def test_a_failed_fsync_is_never_confirmed(db: Database, tmp_path: Path) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE pc (id bigint PRIMARY KEY, batch int, pad text)")
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        conn.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    root, shadow = tmp_path / "log", tmp_path / "shadow"
    root.mkdir()
    record, stop = Workload(), threading.Event()
    workload = threading.Thread(target=run_workload, args=(db.conninfo(), record, stop))
    workload.start()
    failures: list[tuple[LSN, LSN]] = []  # (slot confirmed after the failure, log end)
    try:
        for failing, code in FAILURES:
            result = run_pgcdc(db, root, shadow, failing, code)
            assert_one_line_error(result, "fsync failed", os.strerror(code), str(root))
            wait_until(lambda: not slot_state(db)[1], timeout=60)
            failures.append((slot_state(db)[0], log_end(root)))
    finally:
        stop.set()
        workload.join(600)
    assert record.error is None, record.error
    end = db.scalar("SELECT pg_current_wal_lsn()::text")
    rerun = run_pgcdc(db, root, shadow, 0, 0, "-E", end)
    assert rerun.returncode == 0, rerun.stderr.decode()

    assert_logged_once(db, root, record.committed, failures)
    # The later failures came after transactions were durably logged.
    assert failures[-1][1] > LSN(0)
