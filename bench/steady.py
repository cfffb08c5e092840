"""The receiver kept up with a steady workload: CPU per transaction, its own and its walsender's.

``oltp.py`` drains a backlog, where each read finds many messages waiting. A receiver in
production mostly keeps up instead: the server sends each transaction as it commits, and what a
client costs is then dominated by wakeups (its own, and the walsender's sends that wake it) more
than by the messages. Here pgbench runs TPC-B at fixed rates (``-R``) while a consumer streams
the slot live, alternating by run: ``pg_recvlogical`` into /dev/null (pgoutput, the newest
protocol, streaming on) and the ``pgcdc`` command as users run it (``--format changelog``).
For each: the transactions pgbench committed, and the CPU per transaction of the client and of
the walsender serving it (the database server's cost), from pgbench's start until the
walsender has sent everything and the client has had a moment to take it in.

    python3 bench/steady.py [--rates 500,2000,5000] [--seconds 8] [--repeat 2]
        [--before-src OTHER_CHECKOUT/src]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

import pgcdc
from common import current_lsn, print_figure, process_tree_cpu, start_cluster
from oltp import CLIENTS, SHAPES, _build, _compiled_copy, _pgbench, _prepare
from pgcdc.localpg import LocalCluster
from pgcdc.lsn import LSN

DBNAME = "steady"
# After pgbench: the walsender has sent everything; the client gets this long to take it in.
SETTLE_SECONDS = 0.5


def _client(
    cluster: LocalCluster, side: str, slot: str, work: Path, args: argparse.Namespace
) -> subprocess.Popen[bytes]:
    conninfo = cluster.conninfo(DBNAME)
    if side == "pg_recvlogical":
        command = [
            str(cluster.installation.binary("pg_recvlogical")), "-d", conninfo, "-S", slot,
            "--start", "-f", "/dev/null", "-s", "10", "-o", "proto_version=4",
            "-o", "publication_names=pub", "-o", "streaming=on",
        ]  # fmt: skip
        return subprocess.Popen(command)
    source = args.this_src if side == "pgcdc" else args.before_src
    command = [
        sys.executable, "-m", "pgcdc.cli.main", "-d", conninfo, "-S", slot, "--start",
        "--publication", "pub", "--format", "changelog", "--log", str(work / slot),
    ]  # fmt: skip
    return subprocess.Popen(command, env={**os.environ, "PYTHONPATH": source})


def _walsender(conn: psycopg.Connection, slot: str, client: subprocess.Popen[bytes]) -> int:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if client.poll() is not None:
            raise SystemExit(f"{slot}: the client exited with code {client.returncode}")
        row = conn.execute(
            "SELECT active_pid FROM pg_replication_slots WHERE slot_name = %s", (slot,)
        ).fetchone()
        if row and row[0]:
            return int(row[0])
        time.sleep(0.05)
    raise SystemExit(f"{slot}: no walsender after 60 s")


def measure(
    cluster: LocalCluster, side: str, rate: int, *, slot: str, work: Path, args: argparse.Namespace
) -> tuple[int, float, float]:
    """Transactions committed, and the walsender's and the client's CPU seconds for them."""
    with psycopg.connect(cluster.conninfo(DBNAME), autocommit=True) as conn:
        conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        client = _client(cluster, side, slot, work, args)
        try:
            walsender = _walsender(conn, slot, client)
            time.sleep(1.0)  # the client's start-up is not counted
            walsender_before = process_tree_cpu(walsender)
            client_before = process_tree_cpu(client.pid)
            output = subprocess.run(
                [
                    str(cluster.installation.binary("pgbench")), "-n", "-R", str(rate),
                    "-T", str(args.seconds), "-c", str(CLIENTS), "-j", "2",
                    cluster.conninfo(DBNAME),
                ],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            end = current_lsn(conn)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                row = conn.execute(
                    "SELECT sent_lsn::text FROM pg_stat_replication WHERE pid = %s", (walsender,)
                ).fetchone()
                if row and row[0] is not None and LSN.parse(row[0]) >= end:
                    break
                time.sleep(0.05)
            time.sleep(SETTLE_SECONDS)
            walsender_cpu = process_tree_cpu(walsender) - walsender_before
            client_cpu = process_tree_cpu(client.pid) - client_before
        finally:
            client.send_signal(signal.SIGINT)
            client.wait(60)
        conn.execute("SELECT pg_drop_replication_slot(%s)", (slot,))
    line = next(x for x in output.splitlines() if "transactions actually processed" in x)
    transactions = int(line.split(":")[1].split("/")[0])
    return transactions, walsender_cpu, client_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="500,2000,5000", help="pgbench -R, transactions/s")
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--version", default="18", choices=["15", "18"])
    parser.add_argument("--before-src", metavar="DIR", help="also an older pgcdc (see oltp.py)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pgcdc-bench-steady-"))
    os.environ.setdefault("PGAPPNAME", "pgcdc-bench")
    args.this_src = _compiled_copy(Path(pgcdc.__file__).parent, work / "src-this")
    sides = ["pg_recvlogical", "pgcdc"]
    if args.before_src:
        args.before_src = _compiled_copy(Path(args.before_src) / "pgcdc", work / "src-before")
        sides.append("before")
    print(f"pgcdc build: {_build(args.this_src)}"
          + (f"; --before-src: {_build(args.before_src)}" if args.before_src else ""))  # fmt: skip
    cluster = start_cluster(args.version)
    try:
        with psycopg.connect(cluster.conninfo(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {DBNAME}")
        _prepare(cluster, DBNAME, SHAPES["tpcb"], work)
        with psycopg.connect(cluster.conninfo(DBNAME), autocommit=True) as conn:
            conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        _pgbench(cluster, DBNAME, "-n", "-T", "2", "-c", str(CLIENTS))  # warm the server's caches
        for rate in map(int, args.rates.split(",")):
            best: dict[str, tuple[float, float, float]] = {}
            runs: dict[str, list[str]] = {side: [] for side in sides}
            for n in range(args.repeat):
                for side in sides:
                    slot = f"steady_{side}_{rate}_{n}".replace("pg_recvlogical", "recv")
                    transactions, walsender, client = measure(
                        cluster, side, rate, slot=slot, work=work, args=args
                    )
                    per = (transactions / args.seconds, walsender / transactions * 1e6,
                           client / transactions * 1e6)  # fmt: skip
                    runs[side].append(f"{per[1]:.1f}+{per[2]:.1f}")
                    if side not in best or sum(per[1:]) < sum(best[side][1:]):
                        best[side] = per
            print(f"\n== TPC-B at {rate:,} transactions/s for {args.seconds} s "
                  f"(PostgreSQL {args.version}, pgoutput proto 4, {CLIENTS} clients)")  # fmt: skip
            for side in sides:
                print(f"   {side}: walsender+client us/txn run by run: {', '.join(runs[side])}")
            base = best["pg_recvlogical"]
            for side in sides:
                rate_done, walsender, client = best[side]
                label = "pg_recvlogical" if side == "pg_recvlogical" else f"{side} command"
                baseline = None if side == "pg_recvlogical" else base
                print_figure(f"{label} transactions/s", rate_done, "txn/s")
                print_figure(f"{label} walsender CPU per txn", walsender, "us",
                             baseline[1] if baseline else None)  # fmt: skip
                print_figure(f"{label} client CPU per txn", client, "us",
                             baseline[2] if baseline else None)  # fmt: skip
                print_figure(f"{label} both per txn", walsender + client, "us",
                             baseline[1] + baseline[2] if baseline else None)  # fmt: skip
    finally:
        cluster.destroy()
    print("\nratios here are CPU against pg_recvlogical's: below 1 costs less")


if __name__ == "__main__":
    main()
