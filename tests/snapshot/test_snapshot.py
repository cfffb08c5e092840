"""take_snapshot against PostgreSQL 15 and 18: values as pgoutput sends them, Relation equal to
pgoutput's, a consistent cut under concurrent writes (snapshot + streamed changes = the source),
and the slot and exported snapshot handled as the server requires."""

from __future__ import annotations

import itertools
import random
import threading
from collections import Counter
from pathlib import Path

import psycopg
import pytest

from pgcdc import snapshot as snapshot_module
from pgcdc.changelog import ChangeLog
from pgcdc.decoding.values import row_to_python
from pgcdc.errors import PublicationNotFound, SlotAlreadyExists, SnapshotError, SnapshotLost
from pgcdc.events import Insert, Relation, ReplicaIdentity, Table
from pgcdc.localpg import wait_until
from pgcdc.lsn import LSN
from pgcdc.receiver import retryable
from pgcdc.snapshot import (
    SnapshotProgress,
    open_worker,
    plan_chunks,
    snapshot_tables,
    take_snapshot,
)
from tests.conftest import Database

from .helpers import (
    ProbeSink,
    current_lsn,
    replay,
    source_rows,
    source_values,
    stream_to,
    typed,
)

TYPES_TABLE = """
CREATE TABLE types (
    id int PRIMARY KEY, t text, v varchar(12), c char(3), b bytea, i2 smallint, i8 bigint,
    n numeric(20, 5), nn numeric, f4 real, f8 double precision, bo boolean, d date,
    ts timestamp, tstz timestamptz, tm time, tmtz timetz, iv interval, u uuid, j json,
    jb jsonb, ia int[], ta text[], ip inet, big text
);
ALTER TABLE types ALTER COLUMN big SET STORAGE EXTERNAL;
INSERT INTO types VALUES
  (1, E'tab\\there\\nnew line\\\\ back\\rCR \\\\N ünïcødé €😀', 'short', 'ab', '\\x00ff5c0a09',
   -32768, 9223372036854775807, 123456789012345.12345, 'NaN', 'Infinity', -1.5e-300, true,
   '4713-01-01 BC', 'infinity', '-infinity', '24:00:00', '23:59:59.999999+14:59',
   '1 year -2 days 03:00:00.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '{"a": [1, "x\\ty"]}',
   '{"b": null, "a": "é"}', '{1,NULL,-3}', '{"a\\\\b","c d",NULL,"","NULL","q\\"t"}',
   '192.168.0.1/24', repeat('toast ', 4000)),
  (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
   NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
  (3, '', '', '', '', 0, 0, 0, '-0.000000000001', '-Infinity', 'NaN', false, 'infinity',
   '294276-12-31 23:59:59.999999', '2000-01-01 00:00:00+00', '00:00', '00:00+00', '0',
   '00000000-0000-0000-0000-000000000000', '""', '[]', '{}', '{}', '::1', '\\N');
CREATE TABLE types_source AS SELECT * FROM types;
CREATE PUBLICATION pub FOR TABLE types;
"""


def relation_tables(root: Path) -> list[list[Table]]:
    """The tables of the Relation events of each logged transaction."""
    return [
        [e.table for e in txn.events if isinstance(e, Relation)]
        for txn in ChangeLog(root).read_transactions()
    ]


@pytest.mark.parametrize("copy_format", ["auto", "text"])
def test_values_and_relation_equal_what_pgoutput_sends(
    db: Database, tmp_path: Path, copy_format: str
) -> None:
    with db.connect() as conn:
        conn.execute(TYPES_TABLE)
        toast = conn.execute(
            "SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname = 'types'"
        ).fetchone()
        assert toast is not None
        # The long value is stored out of line (EXTERNAL), in the TOAST table.
        assert conn.execute(f"SELECT count(*) FROM {toast[0]}").fetchone() != (0,)
    with ChangeLog(tmp_path).writer() as sink:
        result = take_snapshot(
            db.conninfo(),
            slot="s",
            sink=sink,
            publications=["pub"],
            workers=2,
            copy_format=copy_format,
        )
    assert result.rows == 3 and result.bytes > 24000
    # The same values again through pgoutput: delete, then insert them from the copy.
    with db.connect() as conn:
        conn.execute("DELETE FROM types")
        conn.execute("INSERT INTO types SELECT * FROM types_source")
    stream_to(db, tmp_path, current_lsn(db))

    txns = list(ChangeLog(tmp_path).read_transactions())
    assert len(txns) == 3
    snapshot, _deleted, inserted = txns
    assert snapshot.end_lsn == result.consistent_point
    assert snapshot.commit_lsn < result.consistent_point <= inserted.commit_lsn
    snap_rows = {
        row_to_python(e.table, e.new)[0]: tuple(e.new)
        for e in snapshot.events
        if isinstance(e, Insert)
    }
    pgoutput_rows = {
        row_to_python(e.table, e.new)[0]: tuple(e.new)
        for e in inserted.events
        if isinstance(e, Insert)
    }
    (table,) = result.tables
    if copy_format == "text":  # what pgoutput's text mode sends, exactly
        assert snap_rows == pgoutput_rows
    else:  # binary: what pgoutput's binary mode sends, the same values once typed
        assert {type(v) for row in snap_rows.values() for v in row} == {bytes, type(None)}
        assert typed(table, snap_rows.values()) == typed(table, pgoutput_rows.values())
    first = row_to_python(table, snap_rows[1])
    assert "tab\there\nnew line\\ back\rCR \\N ünïcødé €😀" in first
    assert first[-1] == "toast " * 4000  # the TOASTed value, whole
    # The snapshot's Table is the one pgoutput sent, as returned and as logged.
    (snap_table,), (streamed_table,), () = relation_tables(tmp_path)
    assert result.tables == (streamed_table,)
    assert snap_table == streamed_table
    assert [c.name for c in snap_table.key_columns] == ["id"]
    # And the values are what the server prints under the same settings, typed alike.
    source = source_rows(db, snap_table)
    if copy_format == "text":
        assert sorted(snap_rows.values(), key=repr) == sorted(source, key=repr)
    assert typed(snap_table, snap_rows.values()) == typed(snap_table, source)


def test_keyless_full_identity_and_index_identity_tables(db: Database, tmp_path: Path) -> None:
    with db.connect() as conn:
        conn.execute(
            "CREATE TABLE nokey (a int, b text);"
            "CREATE TABLE full_t (a int, b text) ;"
            "ALTER TABLE full_t REPLICA IDENTITY FULL;"
            "CREATE TABLE by_index (a int NOT NULL, b int NOT NULL, c text, PRIMARY KEY (c));"
            "CREATE UNIQUE INDEX by_index_ab ON by_index (b, a);"
            "ALTER TABLE by_index REPLICA IDENTITY USING INDEX by_index_ab;"
            "CREATE TABLE dropped (a int, gone text, g int GENERATED ALWAYS AS (a * 2) STORED);"
            "ALTER TABLE dropped DROP COLUMN gone;"
            "INSERT INTO nokey VALUES (1, 'x'), (1, 'x'), (NULL, NULL);"
            "INSERT INTO full_t VALUES (1, 'y'), (2, NULL);"
            "INSERT INTO by_index VALUES (1, 2, 'c');"
            "INSERT INTO dropped VALUES (7);"
            "CREATE PUBLICATION pub FOR ALL TABLES"
        )
    with ChangeLog(tmp_path).writer() as sink:
        result = take_snapshot(db.conninfo(), slot="s", sink=sink, publications=["pub"])
    by_name = {t.name: t for t in result.tables}
    assert set(by_name) == {"nokey", "full_t", "by_index", "dropped"}
    assert by_name["nokey"].key_columns == ()
    assert by_name["full_t"].replica_identity is ReplicaIdentity.FULL
    assert [c.is_key for c in by_name["full_t"].columns] == [True, True]
    assert by_name["by_index"].replica_identity is ReplicaIdentity.INDEX
    assert [c.name for c in by_name["by_index"].key_columns] == ["a", "b"]
    assert [c.name for c in by_name["dropped"].columns] == ["a"]  # generated: not published
    # One change per table after the snapshot, so pgoutput sends each Relation.
    with db.connect() as conn:
        conn.execute(
            "INSERT INTO nokey VALUES (2, 'z'); UPDATE full_t SET b = 'w' WHERE a = 1;"
            "UPDATE by_index SET c = 'd'; INSERT INTO dropped VALUES (8)"
        )
    stream_to(db, tmp_path, current_lsn(db))
    streamed = {t.name: t for ts in relation_tables(tmp_path)[1:] for t in ts}
    assert streamed == by_name
    keyed, bags = replay(tmp_path)
    assert bags["full_t"] == Counter(source_values(db, by_name["full_t"]))
    assert bags["nokey"] == Counter(source_values(db, by_name["nokey"]))
    assert sum(bags["nokey"].values()) == 4
    assert bags["dropped"] == Counter(source_values(db, by_name["dropped"]))
    assert list(keyed["by_index"].values()) == source_values(db, by_name["by_index"])


def _writer(db: Database, stop: threading.Event, commits: list[int], seed: int) -> None:
    """Small random transactions on both tables until ``stop``; counts its commits."""
    rnd = random.Random(seed)
    next_id = 1_000_000
    with db.connect() as conn:
        while not stop.is_set():
            with conn.transaction():
                for _ in range(rnd.randint(1, 4)):
                    op = rnd.random()
                    target = rnd.randint(1, 20_000)
                    if op < 0.35:
                        next_id += 1
                        conn.execute(
                            "INSERT INTO acct VALUES (%s, %s, %s, repeat('p', 150))",
                            (next_id, rnd.randint(-100, 100), f"new\t{next_id}\\"),
                        )
                    elif op < 0.7:
                        conn.execute(
                            "UPDATE acct SET balance = balance + 1, note = note || 'u' "
                            "WHERE id = %s",
                            (target,),
                        )
                    elif op < 0.85:
                        conn.execute("DELETE FROM acct WHERE id = %s", (target,))
                    elif op < 0.93:
                        conn.execute("INSERT INTO log_full VALUES (%s, 'x')", (target % 50,))
                    else:
                        conn.execute("DELETE FROM log_full WHERE a = %s", (target % 50,))
            commits.append(1)


def test_concurrent_writes_snapshot_plus_stream_equals_source(db: Database, tmp_path: Path) -> None:
    with db.connect() as conn:
        conn.execute(
            "CREATE TABLE acct (id int PRIMARY KEY, balance bigint, note text, pad text);"
            "INSERT INTO acct SELECT g, g % 1000, 'n' || g, repeat('p', 150) "
            "FROM generate_series(1, 20000) g;"
            "CREATE TABLE log_full (a int, b text);"
            "ALTER TABLE log_full REPLICA IDENTITY FULL;"
            "INSERT INTO log_full SELECT g % 50, 'x' FROM generate_series(1, 500) g;"
            "CREATE PUBLICATION pub FOR TABLE acct, log_full"
        )
    stop = threading.Event()
    commits: list[int] = []
    writer = threading.Thread(target=_writer, args=(db, stop, commits, db.major))
    writer.start()
    during: list[int] = []

    def while_copying() -> None:
        # The writer keeps committing while the workers copy: wait for 30 more commits.
        before = len(commits)
        wait_until(lambda: len(commits) >= before + 30)
        during.append(len(commits) - before)

    try:
        wait_until(lambda: len(commits) >= 10)
        with ChangeLog(tmp_path).writer() as log:
            sink = ProbeSink(log, on_first_insert=while_copying)
            result = take_snapshot(
                db.conninfo(), slot="s", sink=sink, publications=["pub"], workers=3, chunk_pages=40
            )
        wait_until(lambda: len(commits) >= 200)
    finally:
        stop.set()
        writer.join()
    assert during and during[0] >= 30
    stream_to(db, tmp_path, current_lsn(db))

    keyed, bags = replay(tmp_path)
    tables = {t.name: t for t in result.tables}
    acct, log_full = tables["acct"], tables["log_full"]
    assert sorted(keyed["acct"].values()) == sorted(source_values(db, acct))
    assert len(keyed["acct"]) == db.scalar("SELECT count(*) FROM acct")
    assert bags["log_full"] == Counter(source_values(db, log_full))
    # The streamed part starts right after the snapshot: every streamed commit is past it.
    streamed = list(ChangeLog(tmp_path).read_transactions())[1:]
    assert streamed and all(t.commit_lsn >= result.consistent_point for t in streamed)


def test_big_table_is_split_and_every_worker_imports_the_snapshot(
    db: Database, tmp_path: Path
) -> None:
    with db.connect() as conn:
        conn.execute(
            "CREATE TABLE big (id bigint PRIMARY KEY, pad text);"
            "INSERT INTO big SELECT g, repeat(md5(g::text), 12) FROM generate_series(1, 40000) g;"
            "CREATE PUBLICATION pub FOR TABLE big"
        )
        pages = conn.execute("SELECT pg_relation_size('big') / 8192").fetchone()
        assert pages is not None and pages[0] >= 2000
        specs = snapshot_tables(conn, publications=["pub"])
    chunks = plan_chunks(specs, 100)
    assert len(chunks) >= 20
    workers = 4
    backends: list[list[tuple[object, ...]]] = []
    while_flushing: list[tuple[object, ...]] = []

    def copying() -> list[tuple[object, ...]]:
        return db.execute(
            "SELECT pid, backend_xmin::text FROM pg_stat_activity WHERE application_name = "
            "'pgcdc snapshot' AND backend_type = 'client backend' AND backend_xmin IS NOT NULL"
        )  # A worker between BEGIN and its first query has no xmin yet: wait for it.

    def on_first_insert() -> None:
        # The consumer holds back: workers fill the queue and wait, each in its transaction.
        backends.append(wait_until(lambda: len(rows := copying()) == workers and rows))

    def on_flush() -> None:
        while_flushing.extend(
            db.execute(
                "SELECT backend_type FROM pg_stat_activity "
                "WHERE application_name = 'pgcdc snapshot' AND backend_type = 'walsender'"
            )
        )

    with ChangeLog(tmp_path).writer() as log:
        sink = ProbeSink(log, on_first_insert=on_first_insert, on_flush=on_flush)
        result = take_snapshot(
            db.conninfo(), slot="s", sink=sink, publications=["pub"], workers=workers,
            chunk_pages=100,
        )  # fmt: skip
    # All workers ran at once, each with the one exported snapshot (same xmin).
    assert len(backends[0]) == workers and len({xmin for _, xmin in backends[0]}) == 1
    # The exporting walsender (keeping the snapshot alive) was still there when the sink
    # flushed; afterwards it is gone, and the snapshot with it.
    assert while_flushing == [("walsender",)]
    with db.connect() as conn, pytest.raises(psycopg.Error, match="snapshot"):
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute(f"SET TRANSACTION SNAPSHOT '{result.snapshot_name}'")
    assert result.rows == 40000
    (txn,) = ChangeLog(tmp_path).read_transactions()
    ids = [row_to_python(e.table, e.new)[0] for e in txn.events if isinstance(e, Insert)]
    assert sorted(ids) == list(range(1, 40001))


def test_existing_slot_is_refused_and_failures_drop_the_new_slot(
    db: Database, tmp_path: Path
) -> None:
    with db.connect() as conn:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
        conn.execute("SELECT pg_create_logical_replication_slot('taken', 'pgoutput')")
    with ChangeLog(tmp_path).writer() as sink:
        with pytest.raises(SlotAlreadyExists, match="needs a new slot"):
            take_snapshot(db.conninfo(), slot="taken", sink=sink, publications=["pub"])
        with pytest.raises(SnapshotError, match="'missing' does not exist") as missing:
            take_snapshot(db.conninfo(), slot="s", sink=sink, tables=["missing"])
        assert "dropped again" in "".join(missing.value.__notes__)
        with pytest.raises(PublicationNotFound, match="nopub"):
            take_snapshot(db.conninfo(), slot="s", sink=sink, publications=["nopub"])
        with pytest.raises(SnapshotError, match="not in publication"):
            db.execute("CREATE TABLE other (x int)")
            take_snapshot(
                db.conninfo(), slot="s", sink=sink, publications=["pub"], tables=["other"]
            )
    assert db.execute("SELECT slot_name FROM pg_replication_slots") == [("taken",)]
    assert list(ChangeLog(tmp_path).read_transactions()) == []


def test_column_list_and_row_filter_as_pgoutput_applies_them(db: Database, tmp_path: Path) -> None:
    with db.connect() as conn:
        conn.execute(
            "CREATE TABLE parts (id int PRIMARY KEY, name text, secret text, qty int);"
            "INSERT INTO parts SELECT g, 'p' || g, 's' || g, g FROM generate_series(1, 100) g;"
            "CREATE PUBLICATION pub FOR TABLE parts (id, name, qty) WHERE (qty > 90);"
            "CREATE PUBLICATION pub2 FOR TABLE parts (id, name, qty) WHERE (qty <= 2)"
        )
    with ChangeLog(tmp_path).writer() as sink:
        result = take_snapshot(
            db.conninfo(), slot="s", sink=sink, publications=["pub", "pub2"], chunk_pages=1
        )
    (table,) = result.tables
    assert [c.name for c in table.columns] == ["id", "name", "qty"]
    db.execute("INSERT INTO parts VALUES (101, 'p101', 'hidden', 101), (102, 'x', 'y', 50)")
    stream_to(db, tmp_path, current_lsn(db))
    snapshot, streamed = ChangeLog(tmp_path).read_transactions()
    rows = sorted(row_to_python(e.table, e.new) for e in snapshot.events if isinstance(e, Insert))
    assert rows == [(g, f"p{g}", g) for g in [1, 2, *range(91, 101)]]
    (relation,) = [e.table for e in streamed.events if isinstance(e, Relation)]
    assert relation == table
    assert [tuple(e.new) for e in streamed.events if isinstance(e, Insert)] == [
        ("101", "p101", "101")
    ]


def test_a_failing_sink_leaves_no_slot_no_rows_and_no_workers(db: Database, tmp_path: Path) -> None:
    db.execute(
        "CREATE TABLE big (id bigint PRIMARY KEY, pad text);"
        "INSERT INTO big SELECT g, repeat('x', 300) FROM generate_series(1, 20000) g;"
        "CREATE PUBLICATION pub FOR TABLE big"
    )

    def fail() -> None:
        raise OSError("disk full")

    with ChangeLog(tmp_path).writer() as log:
        sink = ProbeSink(log, on_first_insert=fail)
        with pytest.raises(OSError, match="disk full") as failed:
            take_snapshot(
                db.conninfo(), slot="s", sink=sink, publications=["pub"], workers=3, chunk_pages=20
            )
    assert "dropped again" in "".join(failed.value.__notes__)
    assert db.execute("SELECT slot_name FROM pg_replication_slots") == []
    assert list(ChangeLog(tmp_path).read_transactions()) == []
    # Every worker connection ended with the snapshot (cancelled mid-COPY or finished).
    wait_until(
        lambda: (
            not db.execute(
                "SELECT pid FROM pg_stat_activity WHERE application_name = 'pgcdc snapshot'"
            )
        )
    )


def test_progress_is_reported_while_copying_and_at_the_end(
    db: Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long copy says how far it has got (rows, bytes, chunks, pages, time left) as it goes,
    and where it ended."""
    with db.connect() as conn:
        conn.execute(
            "CREATE TABLE big (id bigint PRIMARY KEY, pad text);"
            "INSERT INTO big SELECT g, repeat(md5(g::text), 12) FROM generate_series(1, 20000) g;"
            "CREATE PUBLICATION pub FOR TABLE big"
        )
    db.execute("VACUUM ANALYZE big")  # relpages, which the plan counts pages by
    monkeypatch.setattr(snapshot_module, "PROGRESS_SECONDS", 0.0)  # a report at every batch
    reports: list[SnapshotProgress] = []
    with ChangeLog(tmp_path).writer() as log:
        take_snapshot(
            db.conninfo(), slot="s", sink=log, publications=["pub"], workers=2, chunk_pages=100,
            on_progress=reports.append,
        )  # fmt: skip
    final = reports[-1]
    assert final.rows == 20000 and final.chunks_done == final.chunks >= 10
    assert final.pages_done == final.pages >= 1000
    assert final.bytes > 20000 * 12 * 32  # each row's pad alone is 384 bytes
    during = reports[:-1]
    assert during and any(0 < r.chunks_done < r.chunks for r in during), during
    for before, after in itertools.pairwise(reports):
        assert (before.rows, before.bytes, before.chunks_done, before.pages_done) <= (
            after.rows, after.bytes, after.chunks_done, after.pages_done
        )  # fmt: skip
    halfway = next(r for r in during if 0 < r.chunks_done < r.chunks)
    assert halfway.remaining_seconds is not None and halfway.remaining_seconds >= 0
    assert "about" in str(halfway) and "s left" in str(halfway)
    assert str(final).startswith("20,000 rows (") and "left" not in str(final)


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_a_copy_the_server_ends_with_an_error_raises_it(db: Database) -> None:
    """A COPY the server cuts short with an error (here its statement timeout, after rows
    went out) is that error, never a short copy taken for the whole: ``copy_out`` checks the
    COPY's end, however it is reached."""
    query = psycopg.sql.SQL(
        "COPY (SELECT g, pg_sleep(0.0005) FROM generate_series(1, 1000000) g) TO STDOUT"
    )
    with db.connect() as conn:
        conn.execute("SET statement_timeout = '300ms'")
        received = 0
        with pytest.raises(psycopg.errors.QueryCanceled, match="statement timeout"):
            for _data, ends in snapshot_module.copy_out(conn, query, batch_rows=100):
                received += len(ends)
        assert received > 0  # rows went out before the error did


def test_the_window_says_which_tables_only_had_inserts_and_their_keys_fetch_the_rows(
    db: Database,
) -> None:
    """``window_changes`` reads, without moving the slot, what a resumed snapshot must know of
    the changes since its kept chunks: per table, the keys INSERTs wrote (as text that reads
    back as the same value, however awkward) or that anything else happened; a chunk of those
    keys fetches exactly those rows, on the pages asked for."""
    db.execute(
        "CREATE TABLE ins (id int PRIMARY KEY, v text);"
        "CREATE TABLE two (k text, at timestamptz, v int, PRIMARY KEY (k, at));"
        "CREATE TABLE upd (id int PRIMARY KEY, v text);"
        "CREATE TABLE gone (id int PRIMARY KEY);"
        "INSERT INTO upd VALUES (1, 'a'); INSERT INTO gone VALUES (1);"
        "CREATE PUBLICATION pub FOR TABLE ins, two, upd, gone"
    )
    db.execute("SELECT pg_create_logical_replication_slot('win', 'pgoutput')")
    start = LSN.parse(db.scalar("SELECT confirmed_flush_lsn::text FROM pg_replication_slots"))
    awkward = "it's a \\ tab\there ünï 😀"
    db.execute("INSERT INTO ins SELECT g, 'x' FROM generate_series(1, 5) g")
    db.execute("INSERT INTO two VALUES (%s, '2024-02-29 23:59:59.999999+14', 1)", (awkward,))
    db.execute("UPDATE upd SET v = 'b'")
    db.execute("UPDATE upd SET id = 2")  # the key changes: both keys count as changed
    middle = current_lsn(db)
    db.execute("INSERT INTO ins VALUES (6, 'y')")
    db.execute("DELETE FROM upd")
    db.execute("TRUNCATE gone")
    end = current_lsn(db)
    db.execute("INSERT INTO ins VALUES (7, 'after the window')")

    windows = snapshot_module.window_changes(db.conninfo(), "win", ["pub"], end)
    assert windows is not None
    oids = dict(db.execute("SELECT relname::text, oid::bigint FROM pg_class WHERE relkind = 'r'"))
    assert windows[oids["ins"]].since(start) == (tuple((str(i),) for i in range(1, 7)), ())
    assert windows[oids["ins"]].since(middle) == ((("6",),), ())
    assert windows[oids["upd"]].since(start) == ((), (("1",), ("2",)))
    assert windows[oids["upd"]].since(middle) == ((), (("2",),))
    assert windows[oids["gone"]].since(start) is None
    since = windows[oids["two"]].since(start)
    assert since is not None and len(since[0]) == 1
    [(key, at)] = since[0]
    assert key == awkward
    # The slot did not move.
    assert db.scalar("SELECT confirmed_flush_lsn::text FROM pg_replication_slots") == str(start)

    with db.connect() as conn:
        specs = {s.table.name: s for s in snapshot_tables(conn, None, ["pub"])}
        fetched = snapshot_module.copy_query(
            snapshot_module.Chunk(specs["two"], keys=((awkward, at), ("absent", at)))
        )
        with conn.cursor().copy(fetched) as copy:
            rows = list(copy.rows())
        assert rows == [(awkward, db.scalar("SELECT at::text FROM two"), "1")]
        ids = sorted(r[0] for r in db.execute("SELECT id FROM ins"))
        on_no_page = snapshot_module.Chunk(
            specs["ins"], keys=tuple((str(i),) for i in ids), within=((1, None),)
        )
        with conn.cursor().copy(snapshot_module.copy_query(on_no_page)) as copy:
            assert list(copy.rows()) == []  # every row is on page 0


def test_a_snapshot_whose_exporter_ended_is_lost_and_retried(db: Database) -> None:
    """Once the exporting transaction ends (a server restart, a lost connection, a dead
    driver), joining its snapshot fails with a code that differs by version (22023 on 15,
    42704 on 18): either is SnapshotLost, which a retry takes again, not a plain ServerError
    that ended the pipeline (seen when Spark tasks joined after a server crash)."""
    with db.connect() as exporter:
        exporter.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        name = exporter.execute("SELECT pg_export_snapshot()").fetchone()[0]  # type: ignore[index]
        with open_worker(db.conninfo(), name):
            pass  # joined while the exporter's transaction lives
        exporter.execute("COMMIT")
    with pytest.raises(SnapshotLost, match=f"the exported snapshot {name} is gone") as lost:
        open_worker(db.conninfo(), name)
    assert retryable(lost.value)
