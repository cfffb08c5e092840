"""The receiver (and the pipeline) on OLTP shapes next to pg_recvlogical, same WAL, same run.

The bulk benchmarks (``receiver.py``, ``pipeline.py``) commit long runs of one table's rows; real
workloads commit small transactions across many tables, where per-transaction and per-table
costs dominate. Three shapes, each driven by ``pgbench`` (shipped with PostgreSQL):

tpcb
    pgbench's built-in TPC-B-like script: 3 UPDATEs on three tables and 1 INSERT into a fourth.
tiny
    one UPDATE per transaction (1 change each).
mix
    eight wide tables (20 columns and a TOASTed ``doc``); each transaction updates one row
    leaving ``doc`` untouched (unchanged TOAST), rewrites another row's ``doc`` (out of line),
    and inserts a wide row into the next table: 3 changes over 2 tables.

Each shape's WAL is drained ``--repeat`` times from separate slots, alternating: by
``pg_recvlogical`` into /dev/null (pgoutput, the newest protocol, streaming on) and by the
``pgcdc`` command as users run it (``--format changelog --log DIR -E END --no-loop``); the best
of each counts. Rows/s, transactions/s and CPU per change and per transaction are printed for
both, and how busy each drain kept its walsender (the share of a core it used, and its CPU
per transaction): near 100%, the server set the pace and no client could drain faster. With
``--pipeline``, ``pgcdc pipeline run --once`` (changelog, mirror and history) also
drains the tpcb WAL: its rate counts from the first change to the last landed (the Spark
session's start is printed separately), and the mirror is checked against the source for every
account the workload touched.

    python3 bench/oltp.py [--shapes tpcb,tiny,mix] [--transactions 40000] [--repeat 3] [--pipeline]
        [--before-src OTHER_CHECKOUT/src] [--binary]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

import pgcdc
from common import (
    WalsenderCpu,
    current_lsn,
    pg_recvlogical_drain,
    print_figure,
    process_tree_cpu,
    start_cluster,
)
from pgcdc.changelog import ChangeLog
from pgcdc.decoding.pgoutput import PgOutputOptions, max_proto_version
from pgcdc.events import Delete, Insert, Update
from pgcdc.localpg import LocalCluster
from pgcdc.lsn import LSN

CLIENTS = 4
MIX_TABLES = 8
MIX_ROWS = 2_000


@dataclass(frozen=True)
class Shape:
    name: str
    changes_per_transaction: int


SHAPES = {s.name: s for s in (Shape("tpcb", 4), Shape("tiny", 1), Shape("mix", 3))}


def _pgbench(cluster: LocalCluster, dbname: str, *args: str) -> None:
    command = [str(cluster.installation.binary("pgbench")), *args, cluster.conninfo(dbname)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _mix_schema(conn: psycopg.Connection) -> None:
    conn.execute("CREATE SEQUENCE mix_ids START 1000000")
    for k in range(1, MIX_TABLES + 1):
        conn.execute(
            f"CREATE TABLE mix{k} (id bigint PRIMARY KEY, n int, "
            + ", ".join(f"c{i} text" for i in range(8))
            + ", "
            + ", ".join(f"d{i} numeric(12,2)" for i in range(5))
            + ", at timestamptz, flag bool, f float8, doc text)"
        )
        conn.execute(f"ALTER TABLE mix{k} ALTER COLUMN doc SET STORAGE EXTERNAL")
        conn.execute(
            f"INSERT INTO mix{k} SELECT g, 0, "
            + ", ".join(f"md5((g + {i})::text)" for i in range(8))
            + ", "
            + ", ".join(f"g / {i + 3}.0" for i in range(5))
            + ", now(), g % 2 = 0, g / 7.0, repeat(md5(g::text), 100) "
            f"FROM generate_series(1, {MIX_ROWS}) g"
        )


def _mix_script(path: Path) -> None:
    """One pgbench script: a random table k, 3 changes over tables k and k+1."""
    lines = [f"\\set k random(1, {MIX_TABLES})", f"\\set a random(1, {MIX_ROWS})",
             f"\\set b random(1, {MIX_ROWS})", "BEGIN;"]  # fmt: skip
    for k in range(1, MIX_TABLES + 1):
        following = k % MIX_TABLES + 1
        lines += [
            f"\\{'if' if k == 1 else 'elif'} :k = {k}",
            f"UPDATE mix{k} SET n = n + 1, c0 = md5(random()::text) WHERE id = :a;",
            f"UPDATE mix{k} SET doc = repeat(md5(random()::text), 100) WHERE id = :b;",
            f"INSERT INTO mix{following} (id, n, c0, c1, c2, c3, d0, d1, at, flag, f, doc) "
            "VALUES (nextval('mix_ids'), 1, md5(random()::text), 'x', 'y', 'z', 1.5, 2.25, "
            "now(), true, random(), 'short');",
        ]
    lines += ["\\endif", "END;"]
    path.write_text("\n".join(lines) + "\n")


def _prepare(cluster: LocalCluster, dbname: str, shape: Shape, work: Path) -> list[str]:
    """Create the shape's tables; return pgbench's arguments for its workload."""
    with psycopg.connect(cluster.conninfo(dbname), autocommit=True) as conn:
        if shape.name == "tpcb":
            _pgbench(cluster, dbname, "-i", "-q", "-s", "10")
            return ["-n"]
        if shape.name == "tiny":
            conn.execute("CREATE TABLE tiny (id int PRIMARY KEY, v int)")
            conn.execute("INSERT INTO tiny SELECT g, 0 FROM generate_series(1, 100000) g")
            script = work / "tiny.sql"
            script.write_text(
                "\\set id random(1, 100000)\nUPDATE tiny SET v = v + 1 WHERE id = :id;\n"
            )
            return ["-n", "-f", str(script)]
        _mix_schema(conn)
        script = work / "mix.sql"
        _mix_script(script)
        return ["-n", "-f", str(script)]


def _cpu_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _pgcdc_drain(
    conninfo: str,
    slot: str,
    endpos: LSN,
    log: Path,
    source: str | None = None,
    *,
    binary: bool = False,
) -> tuple[float, float]:
    """Seconds and CPU seconds of the ``pgcdc`` command draining ``slot`` into a change log;
    ``source``: run the pgcdc package found in that directory instead of this one; ``binary``:
    ask pgoutput for binary values (the walsender then skips the types' output functions)."""
    env = None if source is None else {**os.environ, "PYTHONPATH": source}
    command = [
        sys.executable, "-m", "pgcdc.cli.main", "-d", conninfo, "-S", slot, "--start",
        "--publication", "pub", "--format", "changelog", "--log", str(log),
        "-E", str(endpos), "--no-loop", *(["-o", "binary=true"] if binary else []),
    ]  # fmt: skip
    cpu, started = _cpu_children(), time.perf_counter()
    subprocess.run(command, check=True, env=env)
    return time.perf_counter() - started, _cpu_children() - cpu


def _logged(log: Path) -> tuple[int, int]:
    transactions = changes = 0
    for transaction in ChangeLog(str(log)).read_transactions():
        transactions += 1
        changes += sum(1 for e in transaction.events if isinstance(e, Insert | Update | Delete))
    return transactions, changes


def run_shape(cluster: LocalCluster, shape: Shape, args: argparse.Namespace, work: Path) -> None:
    dbname = f"oltp_{shape.name}"
    with psycopg.connect(cluster.conninfo(), autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {dbname}")
    pgbench_args = _prepare(cluster, dbname, shape, work)
    conninfo = cluster.conninfo(dbname)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        sides = ("recv", "pgcdc", "before") if args.before_src else ("recv", "pgcdc")
        slots = [f"{shape.name}_{side}{n}" for n in range(args.repeat) for side in sides]
        if args.pipeline and shape.name == "tpcb":
            slots.append("pipeline")
        for slot in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        server = conn.info.server_version
    per_client = args.transactions // CLIENTS
    transactions = per_client * CLIENTS
    _pgbench(cluster, dbname, *pgbench_args, "-c", str(CLIENTS), "-j", "2", "-t", str(per_client))
    with psycopg.connect(conninfo, autocommit=True) as conn:
        endpos = current_lsn(conn)
        # The command's fixed start-up: a slot whose only content is one logical message.
        conn.execute(
            "SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (f"{shape.name}_startup",)
        )
        conn.execute("SELECT pg_logical_emit_message(false, 'pgcdc-bench', 'start-up')")
        startup_endpos = current_lsn(conn)
    changes = transactions * shape.changes_per_transaction
    proto = max_proto_version(server)
    options = PgOutputOptions(
        ["pub"], proto_version=proto, messages=True, streaming="on" if proto >= 2 else "off"
    ).for_server(server)

    # How busy each drain kept its walsender: near 1.0, the server set the pace.
    walsender: dict[str, list[WalsenderCpu]] = {"pg_recvlogical": []}

    def drain(side: str, number: int, source: str | None) -> tuple[float, float]:
        log = work / f"{shape.name}-{side}-log{number}"
        slot = f"{shape.name}_{side}{number}"
        with WalsenderCpu(conninfo, slot) as sender:
            run = _pgcdc_drain(conninfo, slot, endpos, log, source, binary=args.binary)
        walsender.setdefault(side, []).append(sender)
        logged = _logged(log)
        if logged != (transactions, changes):
            raise SystemExit(
                f"{shape.name}: the change log holds {logged} (transactions, changes), expected "
                f"{(transactions, changes)}: the rate is void"
            )
        return run

    recv_runs: list[tuple[float, float]] = []
    # "pgcdc": this tree; "before": the tree given by --before-src, drained alternately with it.
    runs: dict[str, list[tuple[float, float]]] = {"pgcdc": []}
    if args.before_src:
        runs["before"] = []
    for number in range(args.repeat):
        cpu = _cpu_children()
        slot = f"{shape.name}_recv{number}"
        with WalsenderCpu(conninfo, slot) as sender:
            seconds = pg_recvlogical_drain(cluster, dbname, slot, endpos, options)
        recv_runs.append((seconds, _cpu_children() - cpu))
        walsender["pg_recvlogical"].append(sender)
        runs["pgcdc"].append(drain("pgcdc", number, args.this_src))
        if args.before_src:
            runs["before"].append(drain("before", number, args.before_src))
    _, startup_cpu = _pgcdc_drain(
        conninfo,
        f"{shape.name}_startup",
        startup_endpos,
        work / f"{shape.name}-startup-log",
        args.this_src,
    )

    print(f"\n== {shape.name}: {transactions:,} transactions, {changes:,} changes "
          f"(PostgreSQL {server // 10000}, pgoutput proto {proto}, {CLIENTS} clients"
          f"{'; pgcdc in binary format' if args.binary else ''})")  # fmt: skip
    print(f"   rates run by run ({' / '.join(['pg_recvlogical', *runs])}, changes/s): " + ", ".join(
        " / ".join(f"{changes / r[number][0] / 1e3:.0f}k" for r in (recv_runs, *runs.values()))
        for number in range(args.repeat)
    ))  # fmt: skip
    recv_best = min(s for s, _ in recv_runs)
    print_figure("pg_recvlogical -> /dev/null (best)", changes / recv_best, "changes/s")
    print_figure("pg_recvlogical transactions/s", transactions / recv_best, "txn/s")
    cpu = min(c for _, c in recv_runs)
    print_figure("pg_recvlogical CPU per change", cpu / changes * 1e6, "us")
    print_figure("pg_recvlogical CPU per transaction", cpu / transactions * 1e6, "us")
    for name, side_runs in runs.items():
        best = min(s for s, _ in side_runs)
        cpus = sorted(c for _, c in side_runs)
        print_figure(f"{name} -> change log (best)", changes / best, "changes/s",
                     changes / recv_best)  # fmt: skip
        print_figure(f"{name} transactions/s", transactions / best, "txn/s",
                     transactions / recv_best)  # fmt: skip
        print_figure(f"{name} CPU per change", cpus[0] / changes * 1e6, "us")
        print_figure(f"{name} CPU per transaction", cpus[0] / transactions * 1e6, "us")
        print("   its CPU per transaction run by run: "
              + ", ".join(f"{c / transactions * 1e6:.1f}" for c in cpus) + " us")  # fmt: skip
    for name, servers in walsender.items():
        print(f"   walsender busy while {name} drained, run by run: "
              + ", ".join(f"{w.busy:.0%} ({w.seconds / transactions * 1e6:.1f} us/txn)"
                          for w in servers))  # fmt: skip
    # What the command costs before its first change (imports, connections, the log opened),
    # and its CPU per transaction without it: the share a longer drain would spread thinner.
    print_figure("pgcdc start-up CPU (a drain of one message)", startup_cpu * 1e3, "ms")
    steady = min(c for _, c in runs["pgcdc"]) - startup_cpu
    print_figure("pgcdc CPU per transaction after start-up", steady / transactions * 1e6, "us")
    if args.pipeline and shape.name == "tpcb":
        _pipeline(conninfo, work, changes, changes / recv_best)


def _pipeline(conninfo: str, work: Path, changes: int, recv_rate: float) -> None:
    """``pipeline run --once`` over the tpcb WAL into all three kinds, checked with the source."""
    from pgcdc import pipeline
    from pgcdc.sinks import read_table
    from pgcdc.spark.pipeline import parse_kinds, spark_session

    settings = pipeline.Settings(
        conninfo=conninfo,
        slot="pipeline",
        publications=("pub",),
        changelog=str(work / "pipeline-log"),
        lake=str(work / "lake"),
        checkpoint=str(work / "checkpoint"),
        kinds=parse_kinds(["changelog", "mirror", "history"]),
        master="local[*]",
        trigger_interval=1.0,
    )
    started = time.perf_counter()
    spark = spark_session(
        "local[*]", "pgcdc-bench-oltp", **{"spark.ui.showConsoleProgress": "false"}
    )
    spark.sparkContext.setLogLevel("ERROR")
    print_figure("pipeline: Spark session start", time.perf_counter() - started, "s")
    cpu, started = process_tree_cpu(), time.perf_counter()
    pipeline.run(settings, once=True, spark=spark)
    took, cpu = time.perf_counter() - started, process_tree_cpu() - cpu
    spark.stop()
    mirror = read_table(Path(settings.lake) / "public" / "pgbench_accounts" / "mirror")
    landed = dict(zip(mirror.column("aid").to_pylist(), mirror.column("abalance").to_pylist(),
                      strict=True))  # fmt: skip
    with psycopg.connect(conninfo) as conn:
        query = "SELECT aid, abalance FROM pgbench_accounts WHERE aid = ANY(%s)"
        source: dict[int, int] = dict(conn.execute(query, (list(landed),)).fetchall())
    if not landed or landed != source:
        differ = sum(landed[aid] != source.get(aid) for aid in landed)
        raise SystemExit(f"pipeline: {differ} of {len(landed)} mirror rows differ from the source: "
                         "the rate is void")  # fmt: skip
    print(f"   checked: {len(landed):,} touched accounts in the mirror equal the source")
    print_figure("pipeline run --once (3 kinds)", changes / took, "changes/s", recv_rate)
    print_figure("pipeline CPU per change (all processes)", cpu / changes * 1e6, "us")


def _compiled_copy(package: Path, target: Path) -> str:
    """A copy of the pgcdc ``package`` under ``target``, byte-compiled, with its mypyc build
    when it has one (the compiled modules and their shared library beside the package); the
    directory to put on PYTHONPATH. An installed pgcdc runs from the bytecode pip compiled,
    while a source tree run with PYTHONDONTWRITEBYTECODE set (as on the shared machines)
    compiles every module at each start, which would count as the command's start-up."""
    shutil.copytree(package, target / "pgcdc", ignore=shutil.ignore_patterns("__pycache__"))
    for library in package.parent.glob("*__mypyc*"):
        shutil.copy2(library, target)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(target)], check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    return str(target)


def _build(source: str) -> str:
    """Which build of pgcdc the command runs from ``source``: compiled (mypyc) or the source."""
    probe = (
        "import pgcdc.receiver as r; print('source' if r.__file__.endswith('.py') else 'compiled')"
    )
    return subprocess.run(
        [sys.executable, "-c", probe], env={**os.environ, "PYTHONPATH": source},
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="tpcb,tiny,mix")
    parser.add_argument("--transactions", type=int, default=40_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--version", default="18", choices=["15", "18"])
    parser.add_argument("--pipeline", action="store_true", help="also pipeline run on tpcb")
    parser.add_argument(
        "--binary",
        action="store_true",
        help="the pgcdc command asks for pgoutput's binary format (pg_recvlogical stays text)",
    )
    parser.add_argument(
        "--before-src",
        metavar="DIR",
        help="also drain with the pgcdc package in DIR (e.g. a worktree of main's src), "
        "alternating with this one: before/after figures from the same run",
    )
    args = parser.parse_args()
    shapes = [SHAPES[name] for name in args.shapes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="pgcdc-bench-oltp-"))
    os.environ.setdefault("PGAPPNAME", "pgcdc-bench")
    args.this_src = _compiled_copy(Path(pgcdc.__file__).parent, work / "src-this")
    if args.before_src:
        args.before_src = _compiled_copy(Path(args.before_src) / "pgcdc", work / "src-before")
    print(f"pgcdc build: {_build(args.this_src)}"
          + (f"; --before-src: {_build(args.before_src)}" if args.before_src else ""))  # fmt: skip
    cluster = start_cluster(args.version)
    try:
        for shape in shapes:
            run_shape(cluster, shape, args, work)
    finally:
        cluster.destroy()
    print("\ntargets (issue 12): receiver >= 1.3x on tpcb, tiny and bulk; pipeline >= 0.9x on tpcb")


if __name__ == "__main__":
    main()
