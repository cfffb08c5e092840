"""``pgcdc --start -P test_decoding -f -`` writes exactly the bytes pg_recvlogical writes."""

from __future__ import annotations

import re
import subprocess

from tests.cli.helpers import current_lsn, pgcdc

WORKLOAD = [
    "CREATE TABLE items (id integer PRIMARY KEY, name text, note varchar(20), price numeric, "
    "flag boolean, data bytea, tags text[])",
    "CREATE TABLE everything (a integer, b text)",
    "ALTER TABLE everything REPLICA IDENTITY FULL",
    # several transactions, NULLs, quotes, newlines, backslashes, non-ASCII
    "INSERT INTO items VALUES (1, 'it''s', NULL, 1.50, true, '\\x00ff', '{a,\"b c\"}'), "
    "(2, E'two\\nlines', 'tab\\there', NULL, false, NULL, NULL)",
    "INSERT INTO items VALUES (3, E'back\\\\slash', 'ünïcödé', -0.0001, NULL, '', '{}')",
    # an empty transaction: an xid and a commit record, no decoded change
    "SELECT txid_current()",
    "UPDATE items SET name = 'renamed', price = price * 2 WHERE id = 1",
    "UPDATE items SET id = 10 WHERE id = 2",
    "DELETE FROM items WHERE id = 3",
    "INSERT INTO everything VALUES (1, NULL), (2, 'x')",
    "DELETE FROM everything WHERE a = 1",
    "SELECT pg_logical_emit_message(false, 'plain', E'not in a transaction\\nsecond line')",
    "TRUNCATE everything",
]
TRANSACTION = [
    "BEGIN",
    "INSERT INTO items VALUES (20, 'in a block', NULL, 3, true, NULL, NULL)",
    "SELECT pg_logical_emit_message(true, 'tx', 'inside')",
    "UPDATE items SET note = 'q''uote' WHERE id = 20",
    "COMMIT",
]


def test_text_output_is_byte_identical_to_pg_recvlogical(db):
    db.execute("SELECT pg_create_logical_replication_slot('theirs', 'test_decoding')")
    db.execute("SELECT pg_create_logical_replication_slot('ours', 'test_decoding')")
    for statement in WORKLOAD:
        db.execute(statement)
    with db.connect() as conn:
        for statement in TRANSACTION:
            conn.execute(statement)
    end = current_lsn(db)

    pg_recvlogical = db.cluster.installation.binary("pg_recvlogical")
    theirs = subprocess.run(
        [str(pg_recvlogical), "-d", db.conninfo(), "-S", "theirs", "--start", "-f", "-",
         "-E", end, "-n"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert theirs.returncode == 0, theirs.stderr
    ours = pgcdc("--start", "-d", db.conninfo(), "-S", "ours", "-f", "-", "-E", end, "-n")
    assert ours.returncode == 0, ours.stderr

    assert ours.stdout == theirs.stdout
    # The workload really is in there (the comparison above is not of two empty outputs).
    expected = [
        b"table public.items: INSERT: id[integer]:1 name[text]:'it''s' "
        b"note[character varying]:null price[numeric]:1.50",
        b"name[text]:'two\nlines'",
        b"table public.items: DELETE: id[integer]:3",
        b"table public.everything: TRUNCATE: (no-flags)",
        b"message: transactional: 0 prefix: plain, sz: 32 content:not in a transaction\nsecond",
        b"message: transactional: 1 prefix: tx, sz: 6 content:inside",
        b"old-key: id[integer]:2 new-tuple: id[integer]:10",
    ]
    for fragment in expected:
        assert fragment in ours.stdout
    assert ours.stdout.count(b"BEGIN ") == ours.stdout.count(b"COMMIT ") >= 10
    # empty transactions (DDL, txid_current()) are printed, as skip-empty-xacts is off
    assert re.search(rb"^BEGIN (\d+)\nCOMMIT \1\n", ours.stdout, re.MULTILINE)
    assert b"(at " not in ours.stdout  # test_decoding's default: no timestamps


def test_text_output_with_timestamps_and_no_xids_matches(db):
    """-o options reach test_decoding as pg_recvlogical sends them."""
    db.execute("CREATE TABLE t (id integer PRIMARY KEY, v text)")
    db.execute("SELECT pg_create_logical_replication_slot('theirs', 'test_decoding')")
    db.execute("SELECT pg_create_logical_replication_slot('ours', 'test_decoding')")
    db.execute("INSERT INTO t VALUES (1, 'a')")
    db.execute("SELECT txid_current()")
    db.execute("INSERT INTO t VALUES (2, NULL)")
    end = current_lsn(db)
    options = ["-o", "include-timestamp", "-o", "include-xids=0", "-o", "skip-empty-xacts=1"]
    pg_recvlogical = db.cluster.installation.binary("pg_recvlogical")
    theirs = subprocess.run(
        [str(pg_recvlogical), "-d", db.conninfo(), "-S", "theirs", "--start", "-f", "-",
         "-E", end, "-n", *options],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert theirs.returncode == 0, theirs.stderr
    ours = pgcdc("--start", "-d", db.conninfo(), "-S", "ours", "-f", "-", "-E", end, *options)
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout
    assert ours.stdout.count(b"BEGIN\n") == 2  # the empty transaction skipped, no xids
    assert ours.stdout.count(b"(at ") == 2


def test_text_output_keeps_the_servers_time_zone_and_date_style(db):
    """Text output is the server's text under its own settings (here a database default of
    Asia/Tokyo and German dates), as pg_recvlogical prints it, not pgcdc's ISO/UTC."""
    name = db.scalar("SELECT current_database()")
    db.execute(f"ALTER DATABASE \"{name}\" SET TimeZone = 'Asia/Tokyo'")
    db.execute(f"ALTER DATABASE \"{name}\" SET DateStyle = 'German, DMY'")
    db.execute("CREATE TABLE t (id integer PRIMARY KEY, at timestamptz, d date, i interval)")
    db.execute("SELECT pg_create_logical_replication_slot('theirs', 'test_decoding')")
    db.execute("SELECT pg_create_logical_replication_slot('ours', 'test_decoding')")
    db.execute("INSERT INTO t VALUES (1, '2024-02-29 23:30:00+00', '2024-02-29', '1 day 02:03:04')")
    end = current_lsn(db)
    pg_recvlogical = db.cluster.installation.binary("pg_recvlogical")
    theirs = subprocess.run(
        [str(pg_recvlogical), "-d", db.conninfo(), "-S", "theirs", "--start", "-f", "-",
         "-E", end, "-n"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert theirs.returncode == 0, theirs.stderr
    ours = pgcdc("--start", "-d", db.conninfo(), "-S", "ours", "-f", "-", "-E", end, "-n")
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == theirs.stdout
    # In Tokyo (UTC+9) that instant is the next day; German style prints day.month.year.
    assert b"at[timestamp with time zone]:'01.03.2024 08:30:00 JST'" in ours.stdout
    assert b"d[date]:'29.02.2024'" in ours.stdout
