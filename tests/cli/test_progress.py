"""Progress on stderr when it is a terminal; silence when it is not."""

from __future__ import annotations

import os
import pty
import subprocess

from pgcdc.cli.recvlogical import format_progress, human_bytes
from pgcdc.lsn import LSN
from pgcdc.receiver import ReceiverProgress
from tests.cli.helpers import CLI, current_lsn, pgcdc
from tests.conftest import Database


def workload(db: Database) -> str:
    db.execute("CREATE TABLE t (id integer PRIMARY KEY)")
    db.execute("SELECT pg_create_logical_replication_slot('pr', 'test_decoding')")
    db.execute("INSERT INTO t SELECT generate_series(1, 50)")
    return current_lsn(db)


def test_progress_on_a_terminal(db: Database) -> None:
    end = workload(db)
    controller, terminal = pty.openpty()
    try:
        process = subprocess.Popen(
            [*CLI, "--start", "-S", "pr", "-f", os.devnull, "-E", end, "-d", db.conninfo()],
            stdout=subprocess.DEVNULL, stderr=terminal,
        )  # fmt: skip
        os.close(terminal)
        assert process.wait(timeout=120) == 0
        shown = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the terminal's other end is closed and drained
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(controller)
    assert b"transactions" in shown and b"changes" in shown and b"received" in shown


def test_quiet_when_stderr_is_not_a_terminal(db: Database) -> None:
    end = workload(db)
    result = pgcdc("--start", "-S", "pr", "-f", os.devnull, "-E", end, "-d", db.conninfo())
    assert result.returncode == 0
    assert result.stderr == b""


def test_progress_line() -> None:
    progress = ReceiverProgress(
        transactions=3, changes=50, bytes_received=2048, durable_lsn=LSN(0x10),
        confirmed_lsn=LSN(0x10), server_wal_end=LSN(0x10 + 3 * 1024 * 1024),
    )  # fmt: skip
    assert format_progress(progress) == (
        "3 transactions, 50 changes, 2.0 kB received, durable 0/10, lag 3.0 MB"
    )
    assert human_bytes(5) == "5 B" and human_bytes(None) == "-"
