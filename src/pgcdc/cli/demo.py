"""``pgcdc demo``: the whole pipeline on a throwaway PostgreSQL 18 with a live workload."""

from __future__ import annotations

import argparse
from typing import Any

from pgcdc.cli.common import info


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the pipeline on a throwaway PostgreSQL with a live workload",
        description="Start a throwaway PostgreSQL 18 (or use --dsn), run a workload on three "
        "tables and stream it into Delta tables under --lake, showing them fill up in Spark.",
    )
    parser.add_argument(
        "--dsn", metavar="CONNINFO",
        help="use this database instead of a throwaway server (creates schema pgcdc_demo, "
        "publication and slot pgcdc_demo)",
    )  # fmt: skip
    parser.add_argument("--lake", default="./lake", help="where the Delta tables go (./lake)")
    parser.add_argument("--duration", type=float, default=30.0, help="workload seconds (30)")
    parser.add_argument("--rate", type=float, default=50.0, help="transactions per second (50)")
    parser.add_argument("--master", default="local[*]", help="Spark master URL (local[*])")
    parser.add_argument("--interval", type=float, default=3.0, help="seconds between updates")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from pgcdc.pipeline.demo import DemoOptions, run

    options = DemoOptions(
        dsn=args.dsn,
        lake=args.lake,
        duration=args.duration,
        rate=args.rate,
        master=args.master,
        interval=args.interval,
    )
    run(options, say=lambda line: print(line, flush=True))
    info("demo finished")
    return 0
