"""The parallel initial snapshot's rate next to a plain COPY of the same table, in the same run.

One table of ``--rows`` rows is copied by ``pgcdc.snapshot.take_snapshot`` with 1, 2 and 4
workers (a new slot each time), once into a sink that only consumes the events (copy + parse)
and once into a change log on local disk, with each ``--copy-format`` asked for (``both``: the
text copy, then the default one, which is binary for this table's types). Baselines: ``psql -c
"\\copy t to /dev/null"``, and ``COPY t TO STDOUT`` (text, and binary format) drained by psycopg
without parsing. The machine's cores bound what more workers can give: parsing runs under the
GIL, the server's COPY in separate processes.

With ``--delta`` the snapshot is landed in Delta instead, as users run it: ``pgcdc pipeline run
--once`` on a new slot, into the mirror only and into all three kinds, with 1 and 2 Spark task
slots (``local[1]``, ``local[2]``), copied where ``--snapshot-in`` says (``executors``: Spark
tasks write the Delta tables; ``receiver``: through the change log; both, comma-separated).
Its baseline is ``COPY orders TO STDOUT (FORMAT binary)`` drained by one psycopg client. The
same command on a one-row table is timed first: that fixed cost (Spark's start, the slot, the
query's set-up) is printed and taken off each run.

    python3 bench/snapshot.py [--rows 1000000] [--version 18] [--chunk-pages 1024] [--delta]
                              [--copy-format auto|text|both] [--workers 1,2,4]
                              [--masters "local[1];local[2]"] [--snapshot-in executors,receiver]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

from common import print_figure, start_cluster
from pgcdc.changelog import ChangeLog
from pgcdc.lsn import LSN
from pgcdc.snapshot import take_snapshot
from pgcdc.transactions import CommittedTransaction

SCHEMA = (
    "CREATE TABLE orders (id bigint PRIMARY KEY, customer text, qty int, price numeric(12,2),"
    " at timestamptz, note text)",
    "CREATE PUBLICATION pub FOR ALL TABLES",
)
FILL = (
    "INSERT INTO orders SELECT g, 'customer ' || (g % 977), g % 50, g / 7.0, "
    "'2024-01-01'::timestamptz + g * interval '1 second', "
    "CASE WHEN g % 10 = 0 THEN E'tab\\there' ELSE 'plain' END "
    "FROM generate_series(1, {rows}) g"
)


class CountingSink:
    """Consumes the snapshot's events and keeps nothing: the cost of copying and parsing."""

    def __init__(self) -> None:
        self.last_commit_lsn = LSN(0)
        self.events = 0

    def append(self, txn: CommittedTransaction) -> bool:
        for _ in txn.events:
            self.events += 1
        self.last_commit_lsn = txn.commit_lsn
        return True

    def flush(self) -> LSN:
        return self.last_commit_lsn


def psql_copy_seconds(psql: Path, conninfo: str) -> float:
    start = time.perf_counter()
    subprocess.run([str(psql), "-X", "-q", "-d", conninfo, "-c", "\\copy orders to /dev/null"],
                   check=True)  # fmt: skip
    return time.perf_counter() - start


def copy_seconds(conninfo: str, options: str = "") -> float:
    """``COPY orders TO STDOUT`` (with ``options``) drained by psycopg, unparsed."""
    start = time.perf_counter()
    with (
        psycopg.connect(conninfo) as conn,
        conn.cursor() as cursor,
        cursor.copy(f"COPY orders TO STDOUT {options}") as copy,
    ):
        while copy.read():
            pass
    return time.perf_counter() - start


def pipeline_seconds(
    conninfo: str,
    publication: str,
    master: str,
    kinds: str,
    tmp: str,
    *,
    copy_format: str = "auto",
    snapshot_in: str = "executors",
) -> float:
    """``pgcdc pipeline run --once`` of a new slot (the snapshot of ``publication``), timed."""
    config = Path(tmp) / "pipeline.toml"
    config.write_text(
        f"""
[source]
conninfo = "{conninfo}"
slot = "{Path(tmp).name.replace("-", "_")}"
publications = ["{publication}"]
snapshot_copy_format = "{copy_format}"
snapshot_in = "{snapshot_in}"

[paths]
changelog = "{tmp}/log"
lake = "{tmp}/lake"
checkpoint = "{tmp}/checkpoint"

[tables]
kinds = {kinds}

[spark]
master = "{master}"
"""
    )
    start = time.perf_counter()
    command = [sys.executable, "-m", "pgcdc.cli.main", "pipeline", "run", "--config", str(config)]
    subprocess.run([*command, "--once"], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


MIRROR_ONLY = '["mirror"]'


def fixed_cost(conninfo: str, master: str, kinds: str, snapshot_in: str) -> float:
    with tempfile.TemporaryDirectory(prefix="pgcdc-bench-fixed-") as tmp:
        return pipeline_seconds(conninfo, "tiny_pub", master, kinds, tmp, snapshot_in=snapshot_in)


def delta_runs(
    conninfo: str,
    rows: int,
    heap_bytes: int,
    copy_formats: tuple[str, ...],
    masters: list[str],
    *,
    places: list[str],
) -> None:
    """The snapshot landed in Delta against a binary COPY drained by one client."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE tiny (id int PRIMARY KEY)")
        conn.execute("INSERT INTO tiny VALUES (1)")
        conn.execute("CREATE PUBLICATION tiny_pub FOR TABLE tiny")
        conn.execute("CREATE PUBLICATION orders_pub FOR TABLE orders")
    copy_rate = rows / copy_seconds(conninfo, "(FORMAT binary)")
    print_figure("baseline: COPY orders TO STDOUT (FORMAT binary), one client", copy_rate, "rows/s")
    all_kinds = '["changelog", "mirror", "history"]'
    rates: dict[tuple[str, str], float] = {}
    runs = [(k, f, p) for k in (MIRROR_ONLY, all_kinds) for f in copy_formats for p in places]
    for master in masters:
        fixed = min(fixed_cost(conninfo, master, all_kinds, places[0]) for _ in range(2))
        print(f"  fixed cost of a run ({master}, one-row table): {fixed:.1f} s", flush=True)
        for kinds, copy_format, place in runs:
            with tempfile.TemporaryDirectory(prefix="pgcdc-bench-delta-") as tmp:
                seconds = pipeline_seconds(
                    conninfo,
                    "orders_pub",
                    master,
                    kinds,
                    tmp,
                    copy_format=copy_format,
                    snapshot_in=place,
                )
            name = (
                f"{master}, {'mirror' if kinds == MIRROR_ONLY else 'all three kinds'}, "
                f"copy {copy_format}, snapshot in {place}"
            )
            print_figure(f"snapshot into Delta, {name}, whole run", rows / seconds, "rows/s",
                         copy_rate)  # fmt: skip
            landing = seconds - fixed
            if landing < 0.25 * seconds:
                print("    without the fixed cost: not measurable (the run is mostly fixed cost)")
                continue
            rate = rates[(master, kinds + copy_format + place)] = rows / landing
            print_figure(f"snapshot into Delta, {name}, without the fixed cost", rate, "rows/s",
                         copy_rate)  # fmt: skip
            print(f"    {heap_bytes / landing / 2**20:.1f} MB/s of heap; {seconds:.1f} s in all")
    for kinds, copy_format, place in runs:
        key = kinds + copy_format + place
        if ("local[1]", key) in rates and ("local[2]", key) in rates:
            ratio = rates[("local[2]", key)] / rates[("local[1]", key)]
            print(
                f"  2 task slots / 1, {kinds}, copy {copy_format}, snapshot in {place}: "
                f"{ratio:.2f}x",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--version", default="18", choices=["15", "18"])
    parser.add_argument("--chunk-pages", type=int, default=1024)
    parser.add_argument("--delta", action="store_true", help="land the snapshot in Delta")
    parser.add_argument(
        "--copy-format", choices=["auto", "text", "both"], default="both",
        help="the snapshot's copy_format; both (default): text, then auto",
    )  # fmt: skip
    parser.add_argument(
        "--workers", default="1,2,4", help="worker counts to run, comma-separated (default 1,2,4)"
    )
    parser.add_argument(
        "--masters", default="local[1];local[2]", help="with --delta: Spark masters, ';'-separated"
    )
    parser.add_argument(
        "--snapshot-in",
        default="executors",
        help="with --delta: where the snapshot is copied (executors, receiver; comma-separated)",
    )
    args = parser.parse_args()
    copy_formats = ("text", "auto") if args.copy_format == "both" else (args.copy_format,)
    worker_counts = [int(w) for w in args.workers.split(",")]

    cluster = start_cluster(args.version)
    conninfo = cluster.conninfo()
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            for statement in SCHEMA:
                conn.execute(statement)
            conn.execute(FILL.format(rows=int(args.rows)))
            conn.execute("VACUUM ANALYZE orders")
            pages = conn.execute("SELECT pg_relation_size('orders') / 8192").fetchone()
        print(f"{args.rows:,} rows, {pages[0] if pages else '?'} pages, PostgreSQL "
              f"{args.version}, {os.cpu_count()} cores", flush=True)  # fmt: skip
        if args.delta:
            heap_bytes = (pages[0] if pages else 0) * 8192
            places = args.snapshot_in.split(",")
            delta_runs(
                conninfo,
                args.rows,
                heap_bytes,
                copy_formats,
                args.masters.split(";"),
                places=places,
            )
            return

        psql = cluster.installation.binary("psql")
        baselines = []
        if psql.exists():
            psql_rate = args.rows / psql_copy_seconds(psql, conninfo)
            print_figure("baseline: psql \\copy orders to /dev/null", psql_rate, "rows/s")
            baselines.append(psql_rate)
        drain_rate = args.rows / copy_seconds(conninfo)
        print_figure("baseline: COPY TO STDOUT drained by psycopg", drain_rate, "rows/s")
        binary_rate = args.rows / copy_seconds(conninfo, "(FORMAT binary)")
        print_figure("baseline: COPY TO STDOUT (FORMAT binary) drained", binary_rate, "rows/s")
        baseline = drain_rate

        runs = [
            (w, t, f)
            for w in worker_counts
            for t in ("events only", "change log")
            for f in copy_formats
        ]
        for run, (workers, target, copy_format) in enumerate(runs, 1):
            with tempfile.TemporaryDirectory(prefix="pgcdc-bench-snapshot-") as tmp:
                start = time.perf_counter()
                if target == "change log":
                    with ChangeLog(tmp).writer() as log:
                        result = take_snapshot(conninfo, slot=f"s{run}", sink=log,
                                               publications=["pub"], workers=workers,
                                               chunk_pages=args.chunk_pages,
                                               copy_format=copy_format)  # fmt: skip
                else:
                    result = take_snapshot(conninfo, slot=f"s{run}", sink=CountingSink(),
                                           publications=["pub"], workers=workers,
                                           chunk_pages=args.chunk_pages,
                                           copy_format=copy_format)  # fmt: skip
                seconds = time.perf_counter() - start
            assert result.rows == args.rows, result
            print_figure(
                f"snapshot, {workers} worker(s), {target}, copy {copy_format}",
                args.rows / seconds, "rows/s", baseline,
            )  # fmt: skip
            with psycopg.connect(conninfo, autocommit=True) as conn:
                conn.execute("SELECT pg_drop_replication_slot(%s)", (f"s{run}",))
    finally:
        cluster.destroy()


if __name__ == "__main__":
    main()
