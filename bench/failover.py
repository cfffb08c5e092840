"""Recovery time after a promotion: seconds from the standby's promotion until the first change
committed on it is in the Delta mirror, next to the same figure for a restart of the primary
(stopped immediate and started again) measured in the same run.

    python3 bench/failover.py [--rounds 2] [--master local[2]]

PostgreSQL 18: a primary and a standby made with pg_basebackup (slot sync on, the standby's
slot in synchronized_standby_slots), ``pipeline run`` with a conninfo naming both and
``target_session_attrs=primary``, a probe row committed every 0.1 s. Each round restarts the
primary once (the baseline: the receiver's reconnection and Spark's next batch) and, in the
last round, promotes the standby. Figures, not assertions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

from common import print_figure, start_cluster
from pgcdc import pipeline
from pgcdc.localpg import LocalCluster, wait_until
from pgcdc.receiver import RetryPolicy
from pgcdc.sinks import SinkKind, read_table
from pgcdc.spark.pipeline import spark_session


class Probes:
    """A probe row every 0.1 s through the multi-host conninfo, riding out the outages; the
    commit time of each."""

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo
        self.committed: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        probe = 0
        while not self.stop.is_set():
            try:
                with psycopg.connect(self.conninfo, autocommit=True, connect_timeout=2) as conn:
                    while not self.stop.is_set():
                        conn.execute("INSERT INTO probe VALUES (%s)", (probe,))
                        self.committed[probe] = time.monotonic()
                        probe += 1
                        time.sleep(0.1)
            except psycopg.OperationalError:
                time.sleep(0.05)


def _first_landed_after(
    probes: Probes, mirror: Path, since: float, timeout: float = 300.0
) -> float:
    """Seconds from ``since`` until the mirror holds a probe committed after ``since``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        later = {p for p, at in list(probes.committed.items()) if at > since}
        if later and (mirror / "_delta_log").exists():
            landed = set(read_table(mirror).column("id").to_pylist())
            if landed & later:
                return time.monotonic() - since
        time.sleep(0.05)
    raise SystemExit(f"no probe committed after the event landed within {timeout} s")


def _synced(primary: LocalCluster, standby: LocalCluster, slot: str) -> bool:
    with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_log_standby_snapshot()")
    with psycopg.connect(standby.conninfo(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT synced AND NOT temporary FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()
    return bool(row and row[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2, help="restarts before the promotion")
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    primary = start_cluster("18")
    standby: LocalCluster | None = None
    work = Path(tempfile.mkdtemp(prefix="pgcdc-bench-failover-"))
    try:
        with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
            conn.execute("CREATE TABLE probe (id int PRIMARY KEY)")
            conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        standby = primary.make_standby("standby")
        with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronized_standby_slots = 'standby'")
        primary.reload()
        conninfo = (
            f"host=127.0.0.1,127.0.0.1 port={primary.port},{standby.port} user=postgres "
            "password=pgcdc-local dbname=postgres target_session_attrs=primary connect_timeout=2"
        )
        settings = pipeline.Settings(
            conninfo=conninfo,
            slot="pgcdc",
            publications=("pub",),
            snapshot="never",
            changelog=str(work / "log"),
            lake=str(work / "lake"),
            checkpoint=str(work / "checkpoint"),
            kinds=(SinkKind.MIRROR,),
            master=args.master,
            trigger_interval=0.5,
            retry=RetryPolicy(initial=0.2, maximum=1.0),
        )
        spark = spark_session(
            args.master, "pgcdc-bench", **{"spark.ui.showConsoleProgress": "false"}
        )
        spark.sparkContext.setLogLevel("ERROR")
        stop = threading.Event()
        runner = threading.Thread(
            target=pipeline.run, args=(settings,), kwargs={"stop": stop, "spark": spark},
            daemon=True,
        )  # fmt: skip
        runner.start()
        probes = Probes(conninfo)
        probes.thread.start()
        mirror = work / "lake" / "public" / "probe" / "mirror"
        _first_landed_after(probes, mirror, time.monotonic())  # the pipeline is up
        restarts = []
        for _ in range(args.rounds):
            primary.stop("immediate")
            primary.start()
            restarts.append(_first_landed_after(probes, mirror, time.monotonic()))
        wait_until(lambda: _synced(primary, standby, "pgcdc"), timeout=120, interval=0.2)
        primary.stop("immediate")
        standby.promote()
        promotion = _first_landed_after(probes, mirror, time.monotonic())
        baseline = statistics.median(restarts)
        print_figure("restart of the primary -> first change in Delta", baseline, "s")
        print_figure("promotion of the standby -> first change in Delta", promotion, "s", baseline)
        probes.stop.set()
        stop.set()
        runner.join(120)
        spark.stop()
    finally:
        primary.destroy()
        if standby is not None:
            standby.destroy()


if __name__ == "__main__":
    main()
