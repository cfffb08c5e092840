"""Shared pieces of the benchmarks: a throwaway server, workloads, and the pg_recvlogical baseline.

Every benchmark measures its baseline in the same run, on the same WAL, so ratios stay
meaningful on a shared, noisy machine.
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psycopg

from pgcdc.localpg import LocalCluster, debian_installation, embedded_installation
from pgcdc.lsn import LSN

BENCH_SETTINGS = {"fsync": "off", "full_page_writes": "off", "max_wal_size": "4GB"}


def start_cluster(version: str = "18", **settings: str) -> LocalCluster:
    installation = embedded_installation() if version == "18" else debian_installation(15)
    return LocalCluster(installation, settings={**BENCH_SETTINGS, **settings}).start()


def current_lsn(conn: psycopg.Connection) -> LSN:
    row = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()
    assert row is not None
    return LSN.parse(row[0])


def create_slots(conn: psycopg.Connection, plugin: str, names: Sequence[str]) -> None:
    for name in names:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (name, plugin))


def pg_recvlogical_drain(
    cluster: LocalCluster,
    dbname: str,
    slot: str,
    endpos: LSN,
    options: dict[str, str] | None = None,
) -> float:
    """Seconds pg_recvlogical takes to stream ``slot`` up to ``endpos`` into /dev/null."""
    command = [
        str(cluster.installation.binary("pg_recvlogical")),
        "-d", cluster.conninfo(dbname),
        "-S", slot,
        "--start",
        "-E", str(endpos),
        "-f", "/dev/null",
        "--no-loop",
        "-s", "10",
    ]  # fmt: skip
    for name, value in (options or {}).items():
        command += ["-o", f"{name}={value}"]
    started = time.perf_counter()
    subprocess.run(command, check=True, env={**os.environ, "PGAPPNAME": "pg_recvlogical-bench"})
    return time.perf_counter() - started


def peak_rss_mib(pid: int | None = None) -> float:
    """Peak resident set size of a process (this one by default), from /proc."""
    status = Path(f"/proc/{pid or os.getpid()}/status").read_text()
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def process_tree_cpu(pid: int | None = None) -> float:
    """CPU seconds of a process (this one by default) and every process below it, including
    children that exited and were waited for (Linux /proc): a pipeline's whole cost, which
    noise from other work on a shared machine disturbs less than its wall time."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        children.setdefault(int(fields[1]), []).append(int(entry))
        ticks[int(entry)] = sum(map(int, fields[11:15]))  # utime stime cutime cstime
    total, todo = 0, [pid or os.getpid()]
    while todo:
        process = todo.pop()
        total += ticks.get(process, 0)
        todo.extend(children.get(process, ()))
    return total / os.sysconf("SC_CLK_TCK")


class WalsenderCpu:
    """CPU seconds of the walsender that serves ``slot`` while the block runs: whether the
    server, not the client, sets a drain's pace. A thread finds the walsender (the slot's
    active_pid) and samples its /proc stat until it exits; the last sample counts, so up to
    one interval (``every``) of its CPU may be missed: a lower bound. Needs a server on this
    machine."""

    def __init__(self, conninfo: str, slot: str, every: float = 0.02) -> None:
        self.conninfo = conninfo
        self.slot = slot
        self.every = every
        self.seconds = 0.0  # CPU seconds seen
        self.wall = 0.0  # seconds from when the walsender was first seen to when it was gone
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="walsender-cpu", daemon=True)

    def __enter__(self) -> WalsenderCpu:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(30)

    @property
    def busy(self) -> float:
        """The share of its life the walsender spent on a CPU (1.0: one core, saturated)."""
        return self.seconds / self.wall if self.wall else float("nan")

    def _watch(self) -> None:
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            pid = None
            while pid is None and not self._done.is_set():
                row = conn.execute(
                    "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s",
                    (self.slot,),
                ).fetchone()
                pid = row[0] if row else None
                if pid is None:
                    time.sleep(self.every)
        if pid is None:
            return
        started = time.perf_counter()
        clock = os.sysconf("SC_CLK_TCK")
        while True:
            try:
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                break  # it exited: the drain is over
            fields = stat[stat.rindex(")") + 2 :].split()
            self.seconds = (int(fields[11]) + int(fields[12])) / clock  # utime + stime
            self.wall = time.perf_counter() - started
            if self._done.is_set():
                break
            time.sleep(self.every)


def print_figure(name: str, value: float, unit: str, baseline: float | None = None) -> None:
    line = f"{name:<48} {value:>14,.1f} {unit}"
    if baseline:
        line += f"   (baseline {baseline:,.1f} {unit}, ratio {value / baseline:.2f})"
    print(line, flush=True)
