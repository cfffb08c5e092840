"""The receiver's end-to-end rate next to pg_recvlogical's, on the same WAL, in the same run.

Slots are created at the same position, then a workload commits ``--rows`` rows in
transactions of ``--txn-rows``. Half the slots are drained by ``pg_recvlogical`` into /dev/null
(pgoutput, the receiver's options), half by ``pgcdc.receiver.Receiver`` into a change log on
local disk (decoded, assembled, encoded to Arrow, fsync'd every 10 s). Target (issue 4): 0.9 or
better. Both also print their CPU time per row, which other work on a shared machine disturbs
less.

Each side drains the same WAL ``--repeat`` times from its own slot, alternating, and the best
run of each is compared (the machine is shared; one burst of other work then spoils one run).

    python3 bench/receiver.py [--rows 500000] [--txn-rows 100] [--version 18] [--repeat 3]
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

from common import current_lsn, pg_recvlogical_drain, print_figure, start_cluster
from pgcdc.changelog import ChangeLog
from pgcdc.decoding.pgoutput import PgOutputOptions, max_proto_version
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions

SCHEMA = (
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer text, qty int, price numeric(12,2),"
    " at timestamptz)",
    "CREATE PUBLICATION pub FOR ALL TABLES",
)
INSERT = (
    "INSERT INTO orders SELECT g, 'customer ' || (g %% 977), g %% 50, g / 7.0, "
    "'2024-01-01'::timestamptz + g * interval '1 second' "
    "FROM generate_series(%s::bigint, %s::bigint) g"
)


def workload(conn: psycopg.Connection, rows: int, txn_rows: int) -> LSN:
    for first in range(1, rows + 1, txn_rows):
        conn.execute(INSERT, (first, min(first + txn_rows - 1, rows)))
    return current_lsn(conn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--txn-rows", type=int, default=100)
    parser.add_argument("--version", default="18", choices=["15", "18"])
    parser.add_argument(
        "--repeat", type=int, default=3, help="drains of each, alternating; the best counts"
    )
    args = parser.parse_args()

    cluster = start_cluster(args.version)
    recv_runs: list[tuple[float, float]] = []
    pgcdc_runs: list[tuple[float, float]] = []
    try:
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            for sql in SCHEMA:
                conn.execute(sql)
            for number in range(args.repeat):
                for slot in (f"recv{number}", f"pgcdc{number}"):
                    conn.execute(
                        "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,)
                    )
            endpos = workload(conn, args.rows, args.txn_rows)
            server = conn.info.server_version
        proto = max_proto_version(server)
        pairs = PgOutputOptions(
            ["pub"], proto_version=proto, messages=True, streaming="on" if proto >= 2 else "off"
        ).for_server(server)
        # Alternating drains of the same WAL, each from its own slot: a burst of other work on
        # the shared machine then hurts one run, not one side.
        for number in range(args.repeat):
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            seconds = pg_recvlogical_drain(cluster, "postgres", f"recv{number}", endpos, pairs)
            cpu = _cpu(resource.getrusage(resource.RUSAGE_CHILDREN)) - _cpu(children)
            recv_runs.append((seconds, cpu))

            options = ReceiverOptions(
                cluster.conninfo(), f"pgcdc{number}", publications=("pub",), end_lsn=endpos
            )
            with tempfile.TemporaryDirectory(prefix="pgcdc-bench-") as root:
                with ChangeLog(root).writer() as sink:
                    started, cpu = time.perf_counter(), time.process_time()
                    progress = Receiver(options, sink).run()
                    pgcdc_runs.append((time.perf_counter() - started, time.process_time() - cpu))
                logged = sum(1 for _ in ChangeLog(root).read_transactions())
            if progress.changes != args.rows:
                print(
                    f"WARNING: the receiver logged {progress.changes} changes, expected {args.rows}"
                )
    finally:
        cluster.destroy()

    print(f"PostgreSQL {args.version}, pgoutput proto {proto}, {args.rows:,} rows in "
          f"{progress.transactions:,} transactions ({logged:,} in the log), "
          f"{progress.bytes_received / 1e6:,.1f} MB of payload")  # fmt: skip
    print("rates, run by run (pg_recvlogical / pgcdc): " + ", ".join(
        f"{args.rows / r / 1e3:.0f}k / {args.rows / p / 1e3:.0f}k"
        for (r, _), (p, _) in zip(recv_runs, pgcdc_runs, strict=True)
    ))  # fmt: skip
    recv_rate = args.rows / min(seconds for seconds, _ in recv_runs)
    print_figure("pg_recvlogical -> /dev/null (best)", recv_rate, "rows/s")
    pgcdc_rate = args.rows / min(seconds for seconds, _ in pgcdc_runs)
    print_figure("pgcdc receiver -> change log (best)", pgcdc_rate, "rows/s", recv_rate)
    # CPU time, less sensitive to other work on the machine: the receiver process's own, and
    # pg_recvlogical's (the walsender's decoding is on the server, in neither).
    recv_cpu = min(cpu for _, cpu in recv_runs)
    print_figure("pg_recvlogical CPU per row", recv_cpu / args.rows * 1e6, "us")
    pgcdc_cpu = min(cpu for _, cpu in pgcdc_runs)
    print_figure("pgcdc receiver CPU per row", pgcdc_cpu / args.rows * 1e6, "us")


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


if __name__ == "__main__":
    main()
