"""How fast pgoutput decoding runs next to how fast a walsender streams the same slot.

A mixed-type workload (10 columns: bigint, text, int, numeric, timestamptz, bool, enum, text[],
bytea, uuid) goes through pgoutput. Slots are created at the same WAL position before the
workload, and every baseline is measured in this run on the same WAL:

* walsender: ``pg_recvlogical`` streams a slot over the replication protocol into /dev/null
  (the issue 3 baseline: "the rate at which the server produced that stream");
* pgcdc's own ``ReplicationConnection`` stream drained without decoding;
* the SQL interface (``pg_logical_slot_peek_binary_changes``), whose result is the captured
  stream the decoders then run over, repeatedly.

Decoding is measured to events (``PgOutputDecoder``, from ``bytes`` and from the
``memoryview`` payloads the stream hands out), to typed Python values per value
(``TypeRegistry.row_to_python``) and to typed Arrow batches: ``decode_batch`` (the columnar
path: every message of the captured stream decoded, changes straight to typed Arrow, in
chunks of ARROW_BATCH_ROWS messages), and ``rows_to_arrow`` (the Spark executors' path) from
tuples (row by row, per value) and from the ``EncodedRow``s the change log hands out (column
by column). Rows are ``EncodedRow``s, as the receiver keeps them: the decoder checks their
column count and walks one only to find the row after it; ``decode_many`` gives the same
events, reading the framing of whole runs with numpy.
Target (issue 3): decoding to typed values at 3x the walsender's rate or better.

    python3 bench/decode.py [--rows 200000] [--version 18] [--repeat 3] [--binary]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psycopg

from common import current_lsn, pg_recvlogical_drain, print_figure, start_cluster
from pgcdc.connection.protocol import XLogData
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.decoding.arrow import rows_to_arrow
from pgcdc.decoding.batch import decode_batch, decode_many
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions
from pgcdc.decoding.values import TypeRegistry
from pgcdc.events import Delete, EncodedRow, Event, Insert, Row, Table, Update
from pgcdc.localpg import LocalCluster
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
ARROW_BATCH_ROWS = 10_000

Stream = list[tuple[LSN, bytes]]


def best_of(repeat: int, run: Callable[[], object]) -> float:
    """The shortest of ``repeat`` runs, in seconds: the least disturbed by other load."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times)


def drain_stream(
    conninfo: str,
    slot: str,
    options: dict[str, str],
    messages: int,
    decoder: PgOutputDecoder | None = None,
) -> float:
    """Seconds pgcdc's replication stream takes to deliver ``messages`` XLogData messages of
    ``slot`` (decoding each one when a decoder is given). Nothing is confirmed, so the slot
    can be read again."""
    with ReplicationConnection.connect(conninfo) as connection:
        started = time.perf_counter()
        stream = connection.start_replication(slot, options=options)
        seen = 0
        if decoder is None:
            for _message in stream:
                seen += 1
                if seen == messages:
                    break
        else:
            decode_one = decoder.decode_one
            for message in stream:
                decode_one(message.payload, message.data_start)
                seen += 1
                if seen == messages:
                    break
        elapsed = time.perf_counter() - started
        stream.stop()
    return elapsed


def capture_payload_views(conninfo: str, slot: str, options: dict[str, str], messages: int) -> int:
    """How many payloads the stream hands out as memoryviews (the type decoders must take)."""
    views = 0
    with ReplicationConnection.connect(conninfo) as connection:
        stream = connection.start_replication(slot, options=options)
        for seen, message in enumerate(stream, 1):
            assert type(message) is XLogData
            views += isinstance(message.payload, memoryview)
            if seen == messages:
                break
        stream.stop()
    return views


def change_rows(events: list[Event]) -> list[tuple[Table, Row]]:
    rows: list[tuple[Table, Row]] = []
    for event in events:
        if isinstance(event, (Insert, Update)):
            rows.append((event.table, event.new))
        elif isinstance(event, Delete):
            rows.append((event.table, event.old))
    return rows


def to_arrow_batches(rows: Sequence[tuple[Table, Row]], registry: TypeRegistry) -> int:
    """Rows grouped into per-table batches of up to ARROW_BATCH_ROWS, as an executor would."""
    batches = 0
    pending: list[Row] = []
    table: Table | None = None
    for row_table, row in rows:
        if row_table is not table or len(pending) >= ARROW_BATCH_ROWS:
            if table is not None and pending:
                rows_to_arrow(table, pending, types=registry)
                batches += 1
            table, pending = row_table, []
        pending.append(row)
    if table is not None and pending:
        rows_to_arrow(table, pending, types=registry)
        batches += 1
    return batches


def prepare(cluster: LocalCluster, rows: int, slots: list[str], binary: bool) -> LSN:
    """Schema, one slot per name at the same position, then the workload; its end position.

    In binary mode the enum column is text: pgoutput sends an enum's value in binary with only
    the type's name, and pgcdc refuses to guess how to read it (see docs/types.md)."""
    with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
        for sql in SCHEMA:
            conn.execute(sql.replace(" m mood,", " m text,") if binary else sql)
        for slot in slots:
            conn.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
        step = 10_000
        for first in range(1, rows + 1, step):
            with conn.transaction():
                conn.execute(BATCH, (first, min(first + step - 1, rows)))
        conn.execute("UPDATE mixed SET qty = qty + 1 WHERE id % 10 = 0")
        conn.execute("DELETE FROM mixed WHERE id % 10 = 5")
        return current_lsn(conn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--version", default="18", choices=["15", "18"])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--binary", action="store_true", help="pgoutput binary mode")
    args = parser.parse_args()
    repeat = args.repeat

    recv_slots = [f"recv_{i}" for i in range(repeat)]
    cluster = start_cluster(args.version)
    try:
        endpos = prepare(cluster, args.rows, ["sql", "stream", *recv_slots], args.binary)
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            options = PgOutputOptions(["pub"], proto_version=2, binary=args.binary)
            pairs = options.for_server(conn.info.server_version)
            flat = [item for pair in pairs.items() for item in pair]
            captured: list[tuple[str, bytes]] = []

            def peek() -> None:
                captured[:] = conn.execute(
                    "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes("
                    "'sql', NULL, NULL, VARIADIC %s::text[])",
                    (flat,),
                ).fetchall()

            sql_seconds = best_of(repeat, peek)
        stream: Stream = [(LSN.parse(lsn), bytes(data)) for lsn, data in captured]
        messages = len(stream)
        recv_seconds = min(
            pg_recvlogical_drain(cluster, "postgres", slot, endpos, pairs) for slot in recv_slots
        )
        conninfo = cluster.conninfo()
        stream_seconds = min(
            drain_stream(conninfo, "stream", pairs, messages) for _ in range(repeat)
        )
        stream_decode_seconds = min(
            drain_stream(conninfo, "stream", pairs, messages, PgOutputDecoder(proto_version=2))
            for _ in range(repeat)
        )
        views = capture_payload_views(conninfo, "stream", pairs, messages)
    finally:
        cluster.destroy()

    size = sum(len(p) for _, p in stream)
    print(
        f"PostgreSQL {args.version}, {args.rows:,} rows, {messages:,} pgoutput messages, "
        f"{size / 2**20:.1f} MiB, {'binary' if args.binary else 'text'} mode, best of {repeat}; "
        f"the stream hands out {views:,} of them as memoryviews"
    )
    walsender = messages / recv_seconds
    print_figure("walsender -> pg_recvlogical -> /dev/null", walsender, "msg/s")
    print_figure(
        "walsender -> pgcdc stream, not decoded", messages / stream_seconds, "msg/s", walsender
    )
    print_figure("SQL interface (peek_binary_changes)", messages / sql_seconds, "msg/s", walsender)
    print_figure(
        "walsender -> pgcdc stream -> decode to events",
        messages / stream_decode_seconds,
        "msg/s",
        walsender,
    )

    events: list[Event] = []
    decoder = PgOutputDecoder(proto_version=2)

    def decode_all(payloads: list[tuple[LSN, bytes]] | list[tuple[LSN, memoryview]]) -> None:
        nonlocal decoder
        decoder = PgOutputDecoder(proto_version=2)
        decode_one = decoder.decode_one
        events[:] = [decode_one(payload, lsn) for lsn, payload in payloads]

    views_stream = [(lsn, memoryview(payload)) for lsn, payload in stream]
    view_seconds = best_of(repeat, lambda: decode_all(views_stream))
    decode_seconds = best_of(repeat, lambda: decode_all(stream))
    print_figure("decode to events (bytes payloads)", messages / decode_seconds, "msg/s", walsender)
    print_figure(
        "decode to events (memoryview payloads)", messages / view_seconds, "msg/s", walsender
    )
    encoded_rows = change_rows(events)

    def many_events() -> None:
        many_decoder = PgOutputDecoder(proto_version=2)
        for first in range(0, messages, ARROW_BATCH_ROWS):
            chunk = views_stream[first : first + ARROW_BATCH_ROWS]
            decode_many(many_decoder, [p for _, p in chunk], [lsn for lsn, _ in chunk])

    many_seconds = best_of(repeat, many_events)
    print_figure("decode to events (decode_many)", messages / many_seconds, "msg/s", walsender)

    registry = TypeRegistry(decoder.state.types)
    # Tuples of raw values: the row-by-row, per-value path.
    rows = [(table, tuple(row)) for table, row in change_rows(events)]

    def typed_python() -> None:
        row_to_python = registry.row_to_python
        for table, row in rows:
            row_to_python(table, row)

    python_seconds = best_of(repeat, typed_python)
    arrow_seconds = best_of(repeat, lambda: to_arrow_batches(rows, registry))

    def columnar_batches() -> int:
        """Every message, ARROW_BATCH_ROWS at a time, to events and typed Arrow batches."""
        batch_decoder = PgOutputDecoder(proto_version=2)
        changes = 0
        for first in range(0, messages, ARROW_BATCH_ROWS):
            chunk = views_stream[first : first + ARROW_BATCH_ROWS]
            decoded = decode_batch(
                batch_decoder, [payload for _, payload in chunk], [lsn for lsn, _ in chunk]
            )
            changes += decoded.change_count
        return changes

    assert columnar_batches() == len(rows)
    columnar_seconds = best_of(repeat, columnar_batches)
    print_figure(
        "decode to typed Arrow, columnar (decode_batch)",
        messages / columnar_seconds,
        "msg/s",
        walsender,
    )
    print_figure(
        "decode + typed Python values (row_to_python)",
        messages / (decode_seconds + python_seconds),
        "msg/s",
        walsender,
    )
    print_figure(
        f"decode + typed Arrow ({ARROW_BATCH_ROWS:,}-row rows_to_arrow, tuples)",
        messages / (decode_seconds + arrow_seconds),
        "msg/s",
        walsender,
    )
    print_figure("  rows_to_arrow alone (tuples, row by row)", len(rows) / arrow_seconds, "rows/s")
    # Fresh EncodedRows each run: what an executor gets from the change log (nothing cached).
    encoded = [(t, EncodedRow(r.data)) for t, r in encoded_rows if isinstance(r, EncodedRow)]
    assert len(encoded) == len(rows)
    fresh: list[tuple[Table, Row]] = []

    def arrow_from_encoded() -> None:
        fresh[:] = [(t, EncodedRow(r.data)) for t, r in encoded]
        to_arrow_batches(fresh, registry)

    encoded_seconds = best_of(repeat, arrow_from_encoded)
    print_figure(
        "  rows_to_arrow from EncodedRows (columnar)",
        len(rows) / encoded_seconds,
        "rows/s",
        len(rows) / arrow_seconds,
    )
    print_figure("  row_to_python alone", len(rows) / python_seconds, "rows/s")


if __name__ == "__main__":
    main()
