"""Shared pieces of the benchmarks: a throwaway server, workloads, and the pg_recvlogical baseline.

Every benchmark measures its baseline in the same run, on the same WAL, so ratios stay
meaningful on a shared, noisy machine.
"""

from __future__ import annotations

import os
import subprocess
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


def print_figure(name: str, value: float, unit: str, baseline: float | None = None) -> None:
    line = f"{name:<48} {value:>14,.1f} {unit}"
    if baseline:
        line += f"   (baseline {baseline:,.1f} {unit}, ratio {value / baseline:.2f})"
    print(line, flush=True)
