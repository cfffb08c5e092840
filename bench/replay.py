"""The receiver's loop alone, replayed in process on a captured stream: CPU per transaction.

The ``pgcdc`` command's CPU (``bench/oltp.py``) mixes its start-up, the socket and the loop, on
a machine whose noise hides a change of a few percent. This captures a shape's stream once
(its XLogData messages, from a slot over the replication protocol), then runs
``Receiver._loop`` over them into a change log with no server in the way: the per-message and
per-transaction paths (decoding, assembly, the change log writer, flushes) and nothing else.
Relation messages are taken as they come (pg_attribute's defaults are not looked up).

    python3 bench/replay.py capture --shape mix [--transactions 20000] --out FILE
    python3 bench/replay.py run FILE [--repeat 3] [--profile OUT] [--counting-sink]

``--counting-sink`` also replays into a sink that only counts, alternating with the change log:
what is left is decoding, assembly and the loop, and the difference the change log's share.

Compare two trees by alternating ``run`` under ``PYTHONPATH=OTHER_CHECKOUT/src`` and without,
and the compiled build with its source by alternating ``run`` with ``PGCDC_PURE_PYTHON=1``.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pickle
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

import oltp
from common import current_lsn, start_cluster
from pgcdc import _native, receiver
from pgcdc.changelog import ChangeLog
from pgcdc.connection.protocol import PG_EPOCH, PrimaryKeepalive, XLogData
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions, max_proto_version
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction, TransactionAssembler

BATCH = receiver.BURST_MESSAGES


def capture(shape_name: str, transactions: int, out: Path) -> None:
    """Run the shape's workload on a throwaway server and save its slot's stream."""
    shape = oltp.SHAPES[shape_name]
    cluster = start_cluster()
    work = Path(tempfile.mkdtemp(prefix="pgcdc-bench-replay-"))
    try:
        dbname = f"replay_{shape.name}"
        with psycopg.connect(cluster.conninfo(), autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {dbname}")
        pgbench_args = oltp._prepare(cluster, dbname, shape, work)
        conninfo = cluster.conninfo(dbname)
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
            conn.execute("SELECT pg_create_logical_replication_slot('replay', 'pgoutput')")
        per_client = transactions // oltp.CLIENTS
        oltp._pgbench(cluster, dbname, *pgbench_args, "-c", str(oltp.CLIENTS), "-j", "2",
                      "-t", str(per_client))  # fmt: skip
        with psycopg.connect(conninfo, autocommit=True) as conn:
            end = current_lsn(conn)
        messages: list[tuple[int, bytes]] = []
        with ReplicationConnection.connect(conninfo) as repl:
            version = repl.server_version
            proto = max_proto_version(version)
            options = PgOutputOptions(["pub"], proto_version=proto, messages=True, streaming="on")
            stream = repl.start_replication("replay", LSN(0), options.for_server(version))
            done = False
            while not done:
                for message in stream.read_many(5.0):
                    if type(message) is XLogData:
                        done = message.data_start >= end
                        if not done:
                            messages.append((int(message.data_start), bytes(message.payload)))
                    elif type(message) is PrimaryKeepalive and message.wal_end >= end:
                        done = True
                    if done:
                        break
        saved = {"proto": proto, "messages": messages, "shape": shape.name}
        out.write_bytes(pickle.dumps(saved))
        print(f"{shape.name}: {len(messages):,} messages captured into {out}")
    finally:
        cluster.destroy()
        shutil.rmtree(work, ignore_errors=True)


class _Stream:
    """What the loop reads from a ReplicationStream, served from the captured messages."""

    def __init__(self, batches: list[list[XLogData]]) -> None:
        self._batches = iter(batches)
        self.confirmed_lsn = LSN(0)
        self.server_wal_end: LSN | None = None
        self.ended = False

    def read_many(self, timeout: float | None = None, limit: int = BATCH) -> list[XLogData]:
        batch = next(self._batches, None)
        if batch is None:
            raise _Replayed
        return batch

    def confirm(self, lsn: LSN) -> None:
        self.confirmed_lsn = lsn

    def stop(self) -> None:
        self.ended = True


class _CountingSink:
    """A sink that keeps nothing: the replay's CPU without the change log's."""

    accepts_row_runs = True

    def __init__(self) -> None:
        self.last_commit_lsn = LSN(0)

    def append(self, txn: CommittedTransaction) -> bool:
        self.last_commit_lsn = txn.commit_lsn
        return True

    def flush(self) -> LSN:
        return self.last_commit_lsn

    def close(self) -> None:
        pass


class _Replayed(Exception):
    """Every captured message was handed out."""


def _batches(messages: list[tuple[int, bytes]]) -> list[list[XLogData]]:
    """The messages as the stream hands them out: XLogData with memoryview payloads."""
    out: list[list[XLogData]] = []
    for start in range(0, len(messages), BATCH):
        out.append([
            XLogData(LSN(lsn), LSN(lsn), PG_EPOCH, memoryview(payload))
            for lsn, payload in messages[start : start + BATCH]
        ])  # fmt: skip
    return out


def replay_once(
    saved: dict[str, Any], profile: Path | None, counting: bool = False
) -> tuple[float, int]:
    """CPU seconds of one replay into a new change log (``counting``: a sink that keeps
    nothing), and the transactions it stored."""
    messages: list[tuple[int, bytes]] = saved["messages"]
    work = Path(tempfile.mkdtemp(prefix="pgcdc-bench-replay-"))
    try:
        sink: Any = _CountingSink() if counting else ChangeLog(str(work / "log")).writer()
        options = receiver.ReceiverOptions(
            conninfo="host=127.0.0.1 dbname=unused",
            slot="replay",
            publications=("pub",),
            end_lsn=LSN(messages[-1][0] + 1),
        )
        recv = receiver.Receiver(options, sink)
        recv._types.describe_relation = lambda table: table  # type: ignore[method-assign]
        decoder = PgOutputDecoder.for_options(
            PgOutputOptions(["pub"], proto_version=saved["proto"], messages=True)
        )
        stream = _Stream(_batches(messages))
        recv._policy.resume(sink.flush())
        with TransactionAssembler(options.assembly) as assembler:
            recv._assembler = assembler
            recv._stream = stream  # type: ignore[assignment]
            gc.collect()
            profiler = cProfile.Profile() if profile else None
            started = time.process_time()
            if profiler:
                profiler.enable()
            try:
                with receiver._fewer_collections():
                    recv._loop(stream, decoder, assembler, threading.Event())  # type: ignore[arg-type]
            except _Replayed:
                pass
            recv._flush()
            cpu = time.process_time() - started
            if profiler and profile:
                profiler.disable()
                profiler.dump_stats(str(profile))
        sink.close()
        return cpu, recv.progress.transactions
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    take = commands.add_parser("capture")
    take.add_argument("--shape", choices=sorted(oltp.SHAPES), default="mix")
    take.add_argument("--transactions", type=int, default=20_000)
    take.add_argument("--out", type=Path, required=True)
    run = commands.add_parser("run")
    run.add_argument("file", type=Path)
    run.add_argument("--repeat", type=int, default=3)
    run.add_argument("--profile", type=Path, help="cProfile the first run into this file")
    run.add_argument(
        "--counting-sink", action="store_true", help="also replay into a sink that keeps nothing"
    )
    args = parser.parse_args()
    if args.command == "capture":
        capture(args.shape, args.transactions, args.out)
        return
    saved = pickle.loads(args.file.read_bytes())
    # PGCDC_PURE_PYTHON=1 replays the source, to compare with the compiled build.
    print(f"pgcdc build: {'compiled (mypyc)' if _native.compiled() else 'source'}")
    cpus: dict[str, list[float]] = {"change log": []}
    if args.counting_sink:
        cpus["counting sink"] = []
    for number in range(args.repeat):
        for sink, runs in cpus.items():
            profile = args.profile if number == 0 and sink == "change log" else None
            cpu, transactions = replay_once(saved, profile, counting=sink == "counting sink")
            runs.append(cpu)
            print(f"{saved['shape']} into the {sink}: {transactions:,} transactions, "
                  f"{cpu:.3f} s of CPU, {cpu / transactions * 1e6:.2f} us per transaction",
                  flush=True)  # fmt: skip
    for sink, runs in cpus.items():
        print(f"best into the {sink}: {min(runs) / transactions * 1e6:.2f} us per transaction")


if __name__ == "__main__":
    main()
