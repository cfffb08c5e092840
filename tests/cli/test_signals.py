"""SIGTERM/SIGINT during --start: flush, confirm what was written, exit 0; reconnection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from pgcdc.cli.common import stop_on_signals
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from tests.cli.helpers import CLI
from tests.conftest import Database


def slot_row(db: Database, slot: str) -> tuple[Any, ...]:
    """(active, active_pid, confirmed_flush_lsn); (False, None, None) when there is no slot."""
    rows = db.execute(
        "SELECT active, active_pid, confirmed_flush_lsn::text FROM pg_replication_slots "
        "WHERE slot_name = %s",
        (slot,),
    )
    return rows[0] if rows else (False, None, None)


def json_lines(path: Path) -> list[Any]:
    text = path.read_text() if path.exists() else ""
    return [json.loads(line) for line in text.splitlines()]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_start_flushes_confirms_and_exits_0(db, tmp_path, signum):
    db.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    out = tmp_path / "changes.jsonl"
    # --create-slot --start in one go; fsync and status intervals far away, so only the
    # signal can make pgcdc flush and confirm what it wrote.
    process = subprocess.Popen(
        [*CLI, "--create-slot", "--start", "-S", "sig", "-P", "test_decoding",
         "--format", "json", "-f", str(out), "-F", "3600", "-s", "3600", "-d", db.conninfo()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        wait_until(lambda: slot_row(db, "sig")[0], timeout=60)
        for i in range(3):
            db.execute("INSERT INTO t VALUES (%s, %s)", (i, f"row {i}"))
        written = wait_until(lambda: len(lines := json_lines(out)) == 3 and lines, timeout=60)
        last_end = LSN.parse(written[-1]["end_lsn"])
        assert LSN.parse(slot_row(db, "sig")[2]) < last_end  # not confirmed before the signal
        process.send_signal(signum)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert [row["new"] for row in json_lines(out)] == [{"id": i, "v": f"row {i}"} for i in range(3)]
    active, _, confirmed = slot_row(db, "sig")
    assert not active
    assert LSN.parse(confirmed) >= last_end


def test_lost_connection_reconnects_without_no_loop(db, tmp_path):
    db.execute("CREATE TABLE t (id integer PRIMARY KEY)")
    db.execute("SELECT pg_create_logical_replication_slot('rc', 'test_decoding')")
    out = tmp_path / "out.txt"
    process = subprocess.Popen(
        [*CLI, "--start", "-S", "rc", "-f", str(out), "-F", "0", "--reconnect-delay", "0.2",
         "-d", db.conninfo()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        first_pid = wait_until(lambda: slot_row(db, "rc")[1], timeout=60)
        db.execute("INSERT INTO t VALUES (1)")
        wait_until(lambda: out.exists() and "id[integer]:1" in out.read_text(), timeout=60)
        db.execute("SELECT pg_terminate_backend(%s)", (first_pid,))
        second_pid = wait_until(
            lambda: (pid := slot_row(db, "rc")[1]) not in (None, first_pid) and pid, timeout=60
        )
        assert second_pid != first_pid
        db.execute("INSERT INTO t VALUES (2)")
        wait_until(lambda: "id[integer]:2" in out.read_text(), timeout=60)
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert b"disconnected" in stderr and b"try again" in stderr
    text = out.read_text()
    assert text.count("id[integer]:1") == 1 and text.count("id[integer]:2") == 1


def test_lost_connection_with_no_loop_is_an_error(db, tmp_path):
    db.execute("SELECT pg_create_logical_replication_slot('nl', 'test_decoding')")
    process = subprocess.Popen(
        [*CLI, "--start", "-S", "nl", "-f", str(tmp_path / "o"), "-n", "-d", db.conninfo()],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        pid = wait_until(lambda: slot_row(db, "nl")[1], timeout=60)
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        _, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 1
    assert stderr.startswith(b"pgcdc: error: ")


def test_a_second_ctrl_c_is_told_apart() -> None:
    """The first SIGINT (or a SIGTERM) asks for a stop; a second SIGINT sets
    ``interrupted_again`` (``pipeline run``: stop without waiting for the batch)."""
    assert threading.current_thread() is threading.main_thread()  # else SIGTERM ends pytest
    stop, again = threading.Event(), threading.Event()
    before = signal.getsignal(signal.SIGINT)
    with stop_on_signals(stop, interrupted_again=again):
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        os.kill(os.getpid(), signal.SIGINT)  # the first Ctrl-C: a stop, already asked for
        time.sleep(0.2)  # a handler runs between bytecodes of the main thread
        assert not again.is_set()
        os.kill(os.getpid(), signal.SIGINT)
        assert again.wait(5)
    assert signal.getsignal(signal.SIGINT) == before
