"""One 2M-row transaction through the receiver with bounded memory: peak RSS against a cap.

The server streams the transaction in progress (pgoutput protocol 2, ``streaming`` on); the
assembler spills it to disk past ``max_txn_in_memory`` and the change log writes it in frames,
so the receiver's memory should not grow with the transaction. The receiver runs in a child
process so its peak RSS (VmHWM) is its own; the same child's RSS right after imports and
connecting is printed as the baseline.

    python3 bench/large_transaction.py [--rows 2000000] [--cap-mb 256] [--version 18]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

from common import current_lsn, peak_rss_mib, print_figure, start_cluster
from pgcdc.changelog import ChangeLog
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions
from pgcdc.transactions import AssemblyOptions

INSERT = (
    "INSERT INTO big SELECT g, 'row ' || g, g %% 1000, now() FROM generate_series(1, %s::bigint) g"
)


def child(conninfo: str, end: int, root: str, cap_mb: float) -> None:
    """Drain the slot into a change log; print figures as ``name value`` lines."""
    # A quarter of the cap for buffered events (Python objects weigh several times their
    # payload bytes), an eighth for any one transaction before it spills.
    assembly = AssemblyOptions(
        max_txn_in_memory=cap_mb / 8 / 4, max_reorderbuffer_in_memory=cap_mb / 4 / 4
    )
    options = ReceiverOptions(
        conninfo,
        "big",
        publications=("pub",),
        proto_version=2,
        streaming="on",
        end_lsn=LSN(end),
        assembly=assembly,
    )
    with ChangeLog(root).writer(frame_bytes=1 << 20) as sink:
        print("baseline", peak_rss_mib(), flush=True)
        started = time.perf_counter()
        progress = Receiver(options, sink).run()
        seconds = time.perf_counter() - started
    print("changes", progress.changes, flush=True)
    print("seconds", seconds, flush=True)
    print("peak", peak_rss_mib(), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--cap-mb", type=float, default=256.0)
    parser.add_argument("--version", default="18", choices=["15", "18"])
    parser.add_argument("--child", nargs=3, metavar=("CONNINFO", "END", "ROOT"))
    args = parser.parse_args()
    if args.child:
        conninfo, end, root = args.child
        child(conninfo, int(end), root, args.cap_mb)
        return

    cluster = start_cluster(args.version)
    try:
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            conn.execute(
                "CREATE TABLE big (id bigint PRIMARY KEY, note text, n int, at timestamptz)"
            )
            conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
            conn.execute("SELECT pg_create_logical_replication_slot('big', 'pgoutput')")
            conn.execute(INSERT, (args.rows,))
            end = current_lsn(conn)
        with tempfile.TemporaryDirectory(prefix="pgcdc-bench-") as root:
            command = [sys.executable, __file__, "--cap-mb", str(args.cap_mb)]
            command += ["--child", cluster.conninfo(), str(int(end)), root]
            output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            logged = sum(1 for _ in ChangeLog(root).read_transactions())
    finally:
        cluster.destroy()
    figures = {}
    for line in output.splitlines():
        name, _, value = line.partition(" ")
        figures[name] = float(value)
    changes = int(figures["changes"])
    if changes != args.rows:
        print(f"WARNING: the receiver logged {changes:,} changes, expected {args.rows:,}")
    print(
        f"PostgreSQL {args.version}: one transaction of {args.rows:,} rows, streamed "
        f"(protocol 2), {logged} transaction(s) in the log; cap {args.cap_mb:.0f} MB"
    )
    print_figure("receiver peak RSS", figures["peak"], "MB", figures["baseline"])
    print_figure("receiver rate", changes / figures["seconds"], "rows/s")
    verdict = "within" if figures["peak"] <= args.cap_mb else "OVER"
    print(f"peak RSS {figures['peak']:.1f} MB is {verdict} the {args.cap_mb:.0f} MB cap")


if __name__ == "__main__":
    main()
