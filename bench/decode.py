"""How fast the pgoutput decoder turns a real stream into events, next to how fast the server
produced that stream.

A 200k-row mixed-type workload goes through a pgoutput slot; the server's time to produce the
stream through ``pg_logical_slot_peek_binary_changes`` (binary protocol, so no hex/escape
overhead) is the walsender-rate baseline, measured in this run. The captured payloads are then
decoded repeatedly: to events (``PgOutputDecoder``), and to typed Python values
(``pgcdc.decoding.values``). Target: decode-to-events at 3x the server's rate or better.

    python3 bench/decode.py [--rows 200000] [--version 18] [--repeat 3] [--binary]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

from common import print_figure, start_cluster
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions
from pgcdc.events import Delete, Insert, Update
from pgcdc.lsn import LSN

SCHEMA = (
    "CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')",
    "CREATE TABLE mixed (id bigint PRIMARY KEY, name text, qty int, price numeric(12,2),"
    " at timestamptz, flag boolean, m mood, tags text[], blob bytea, u uuid)",
    "CREATE PUBLICATION pub FOR ALL TABLES",
)
# 10k-row transactions: inserts, then an update and a delete of a tenth of them.
BATCH = (
    "INSERT INTO mixed SELECT g, 'name ' || g, g %% 1000, g / 7.0, "
    "'2024-01-01'::timestamptz + g * interval '1 second', g %% 2 = 0, "
    "(ARRAY['sad','ok','happy'])[g %% 3 + 1]::mood, ARRAY['a' || g, 'b'], "
    "decode(md5(g::text), 'hex'), md5(g::text)::uuid FROM generate_series(%s::int, %s::int) g"
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--version", default="18", choices=["15", "18"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--binary", action="store_true", help="pgoutput binary mode")
    args = parser.parse_args()

    cluster = start_cluster(args.version)
    try:
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            for sql in SCHEMA:
                conn.execute(sql)
            conn.execute("SELECT pg_create_logical_replication_slot('bench', 'pgoutput')")
            step = 10_000
            for first in range(1, args.rows + 1, step):
                last = min(first + step - 1, args.rows)
                with conn.transaction():
                    conn.execute(BATCH, (first, last))
            conn.execute("UPDATE mixed SET qty = qty + 1 WHERE id % 10 = 0")
            conn.execute("DELETE FROM mixed WHERE id % 10 = 5")
            options = PgOutputOptions(["pub"], proto_version=2, binary=args.binary)
            pairs = options.for_server(conn.info.server_version)
            flat = [item for pair in pairs.items() for item in pair]
            produce = []
            rows: list[tuple[str, bytes]] = []
            for _ in range(args.repeat):
                started = time.perf_counter()
                rows = conn.execute(
                    "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
                    "'bench', NULL, NULL, VARIADIC %s::text[])",
                    (flat,),
                ).fetchall()
                produce.append(time.perf_counter() - started)
    finally:
        cluster.destroy()

    stream = [(LSN.parse(lsn), bytes(data)) for lsn, data in rows]
    messages = len(stream)
    size = sum(len(p) for _, p in stream)
    server_rate = messages / min(produce)
    print(
        f"PostgreSQL {args.version}, {args.rows:,} rows, {messages:,} pgoutput messages, "
        f"{size / 2**20:.1f} MiB, {'binary' if args.binary else 'text'} mode"
    )
    print_figure("server: produce the stream (SQL interface)", server_rate, "msg/s")

    decode_times = []
    events = []
    for _ in range(args.repeat):
        decoder = PgOutputDecoder(proto_version=2)
        decode_one = decoder.decode_one
        started = time.perf_counter()
        events = [decode_one(payload, lsn) for lsn, payload in stream]
        decode_times.append(time.perf_counter() - started)
    print_figure("decode to events", messages / min(decode_times), "msg/s", server_rate)

    try:
        from pgcdc.decoding.values import TypeRegistry
    except ImportError:
        print("to typed values: pgcdc.decoding.values is not available")
        return
    registry = TypeRegistry(decoder.state.types)
    typed_times = []
    for _ in range(args.repeat):
        started = time.perf_counter()
        for event in events:
            if isinstance(event, (Insert, Update)):
                registry.row_to_python(event.table, event.new)
            elif isinstance(event, Delete):
                registry.row_to_python(event.table, event.old)
        typed_times.append(time.perf_counter() - started)
    best = min(decode_times) + min(typed_times)
    print_figure("decode to events + typed values", messages / best, "msg/s", server_rate)


if __name__ == "__main__":
    main()
