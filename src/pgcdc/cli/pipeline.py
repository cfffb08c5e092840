"""``pgcdc pipeline run``: PostgreSQL -> change log -> Spark -> Delta Lake.

Settings come from ``--config pipeline.toml`` (see ``pgcdc.pipeline``) with flags on top.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

from pgcdc.cli.common import (
    add_connection_arguments,
    add_help_argument,
    conninfo_from,
    info,
    progress_logged,
    stop_on_signals,
)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("pipeline", help="run the Spark pipeline into Delta Lake tables")
    actions = parser.add_subparsers(dest="pipeline_command", metavar="ACTION", required=True)
    run = actions.add_parser(
        "run",
        add_help=False,
        help="stream changes into changelog/mirror/history Delta tables",
        description="Receive changes from a slot into the change log and stream them with "
        "Spark into Delta tables, exactly once. Flags override the config file.",
    )
    add_help_argument(run)
    run.add_argument("--config", metavar="FILE", help="pipeline TOML file (see docs/pipeline.md)")
    add_connection_arguments(run, top_level=False)
    run.add_argument("--slot", "-S", help="replication slot (default pgcdc)")
    run.add_argument(
        "--publication", "-P", action="append", dest="publications", metavar="NAME",
        help="publication to stream (repeat for several; default pgcdc)",
    )  # fmt: skip
    run.add_argument(
        "--no-create-slot", dest="create_slot", action="store_const", const=False, default=None,
        help="fail when the slot does not exist instead of creating it",
    )  # fmt: skip
    run.add_argument(
        "--no-failover", dest="failover", action="store_const", const=False, default=None,
        help="create the slot without FAILOVER (by default a new slot is a failover slot on "
        "PostgreSQL 17+, which standbys with sync_replication_slots keep a copy of)",
    )  # fmt: skip
    run.add_argument(
        "--decode-on-standby", dest="standby", action="store_const", const=True, default=None,
        help="the server may be a hot standby (PostgreSQL 16+; [source] standby = true): "
        "decode there (the initial snapshot too), writing nothing to the source",
    )  # fmt: skip
    run.add_argument(
        "--snapshot", choices=("initial", "never"),
        help="initial (default): a new slot starts with a consistent snapshot of the tables; "
        "never: only changes made after the slot was created",
    )  # fmt: skip
    run.add_argument(
        "--snapshot-in", choices=("auto", "executors", "receiver"),
        help="where the initial snapshot is copied: executors (auto, the default: Spark tasks "
        "write the Delta tables) or receiver (its threads, through the change log)",
    )  # fmt: skip
    run.add_argument(
        "--snapshot-workers", type=_positive_int, metavar="N",
        help="threads of a snapshot in the receiver (default 4)",
    )  # fmt: skip
    run.add_argument("--changelog", metavar="PATH", help="change log root (default ./changelog)")
    run.add_argument("--lake", metavar="PATH", help="Delta tables root (default ./lake)")
    run.add_argument("--checkpoint", metavar="PATH", help="Spark checkpoint (default ./checkpoint)")
    run.add_argument(
        "--umask", metavar="OCTAL",
        help="umask for the change log, lake and checkpoint (default 077: files 0600, "
        "directories 0700; 027 lets the group read)",
    )  # fmt: skip
    run.add_argument(
        "--kinds", type=lambda s: [k for k in s.split(",") if k], metavar="LIST",
        help="table kinds: changelog,mirror,history (default all three)",
    )  # fmt: skip
    run.add_argument("--master", help="Spark master URL (default local[*])")
    run.add_argument("--trigger-interval", type=float, metavar="SECONDS", help="default 5")
    run.add_argument("--max-changes-per-batch", type=_positive_int, metavar="N")
    run.add_argument("--max-bytes-per-batch", type=_positive_int, metavar="N")
    run.add_argument(
        "--recopy", action="append", metavar="SCHEMA.TABLE",
        help="before streaming on, replace the table downstream by a fresh copy of it (after "
        "a change the slot does not stream left rows stale: a volatile ADD COLUMN DEFAULT, "
        "ALTER COLUMN TYPE, a dropped column of a keyless REPLICA IDENTITY FULL table); "
        "repeat for several",
    )  # fmt: skip
    run.add_argument(
        "--once", action="store_true",
        help="drain what the server has now (up to its current WAL position) and exit",
    )  # fmt: skip
    run.add_argument(
        "-v", "--verbose", action="store_true",
        help="log progress on stderr: the initial snapshot, batches written, reconnections",
    )  # fmt: skip
    run.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from pgcdc import pipeline

    given_connection = any(
        getattr(args, name, None) for name in ("dbname", "host", "port", "username")
    )
    settings = pipeline.load(
        args.config,
        {
            "conninfo": conninfo_from(args) if given_connection else None,
            "slot": args.slot,
            "publications": args.publications,
            "create_slot": args.create_slot,
            "failover": args.failover,
            "standby": args.standby,
            "snapshot": args.snapshot,
            "snapshot_in": args.snapshot_in,
            "snapshot_workers": args.snapshot_workers,
            "changelog": args.changelog,
            "lake": args.lake,
            "checkpoint": args.checkpoint,
            "umask": args.umask,
            "kinds": args.kinds,
            "master": args.master,
            "trigger_interval": args.trigger_interval,
            "max_changes_per_batch": args.max_changes_per_batch,
            "max_bytes_per_batch": args.max_bytes_per_batch,
            "recopy": args.recopy,
        },
    )
    stop = threading.Event()
    # Ctrl-C again stops without waiting for the batch being written (up to [spark]
    # stop_timeout): the next start writes it again; 130, as for an interrupted command.
    stop_now = threading.Event()
    with stop_on_signals(stop, interrupted_again=stop_now), progress_logged(args.verbose):
        info(f"pipeline: {settings.changelog} -> {settings.lake} (master {settings.master})")
        pipeline.run(settings, once=args.once, stop=stop, stop_now=stop_now)
    return 130 if stop_now.is_set() else 0
