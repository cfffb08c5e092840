"""Preflight checks, each failure provoked for real on PostgreSQL 15 and 18.

Most checks run on the shared ``db`` clusters; the ones that need a server set up badly
(wal_level = replica, one WAL sender, two slots, a tiny max_slot_wal_keep_size) get their own
small clusters, one of each kind per server version.
"""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import psycopg
import pytest

from pgcdc import errors
from pgcdc.connection import server_errors
from pgcdc.connection.commands import Command
from pgcdc.connection.preflight import check
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.connection.sql import (
    advance_slot,
    create_logical_slot,
    drop_slot,
    get_changes,
    get_slot,
    list_slots,
)
from pgcdc.localpg import (
    Installation,
    LocalCluster,
    debian_installation,
    embedded_installation,
    wait_until,
)
from tests.conftest import TEST_SETTINGS, Database

INSTALLATIONS: dict[str, Callable[[], Installation]] = {
    "pg15": lambda: debian_installation(15),
    "pg18": embedded_installation,
}


@contextmanager
def streaming(cluster: LocalCluster, dbname: str, slot: str) -> Iterator[int]:
    """Run pg_recvlogical on ``slot`` until the block ends; yields its walsender's pid."""
    client = subprocess.Popen(
        [
            str(cluster.installation.binary("pg_recvlogical")),
            "--dbname",
            cluster.conninfo(dbname),
            "--slot",
            slot,
            "--start",
            "--file",
            "/dev/null",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        with psycopg.connect(cluster.conninfo(dbname), autocommit=True) as conn:

            def active_pid() -> int | None:
                info = get_slot(conn, slot)
                return info.active_pid if info else None

            pid: int = wait_until(active_pid)
        yield pid
    finally:
        client.terminate()
        client.wait(timeout=30)
    with psycopg.connect(cluster.conninfo(dbname), autocommit=True) as conn:
        wait_until(lambda: not (info := get_slot(conn, slot)) or not info.active)


@pytest.fixture
def role(db: Database) -> Iterator[str]:
    """A login role without REPLICATION (roles are cluster-wide: dropped afterwards)."""
    name = f"plain_{uuid.uuid4().hex[:8]}"
    db.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'secret'")
    yield name
    db.execute(f"DROP ROLE {name}")


def _no_probe_slots_left(conn: psycopg.Connection) -> bool:
    return not [info for info in list_slots(conn) if info.name.startswith("pgcdc_preflight")]


# --- a well set-up server --------------------------------------------------------------------


def test_a_ready_server_passes(db: Database) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION pub FOR TABLE t")
    with db.connect() as conn:
        # No slot yet: the plugin is proven by a temporary slot, which is gone afterwards.
        report = check(db.conninfo(), slot=None, publications=["pub"])
        assert (report.plugin, report.plugin_verified_by, report.slot) == (
            "pgoutput",
            "probe",
            None,
        )
        assert report.database == db.name
        assert report.publications == ("pub",)
        assert report.facts.server_version_num // 10000 == db.major
        assert _no_probe_slots_left(conn)

        report = check(db.conninfo(), slot="later", create_slot=True, publications=["pub"])
        assert report.slot is None and report.plugin_verified_by == "probe"
        assert get_slot(conn, "later") is None

        create_logical_slot(conn, "ready", "pgoutput")
        report = check(db.conninfo(), slot="ready", publications=["pub"])
        assert report.slot is not None and report.slot.name == "ready"
        assert report.plugin_verified_by == "slot"
        assert _no_probe_slots_left(conn)


def test_the_plugin_probe_does_not_wait_for_running_transactions(db: Database) -> None:
    """Creating a slot waits for transactions in progress; the plugin loads before that."""
    with db.connect() as conn, db.connect() as busy, busy.transaction():
        busy.execute("SELECT pg_current_xact_id()")  # holds an xid until the block ends
        report = check(db.conninfo(), slot=None, plugin="test_decoding", probe_timeout=0.5)
        assert report.plugin_verified_by == "probe"
        assert _no_probe_slots_left(conn)
        # An uninstalled plugin still fails before the wait.
        with pytest.raises(errors.PluginNotInstalled):
            check(db.conninfo(), slot=None, plugin="wal2json", probe_timeout=0.5)


# --- failures on the shared clusters ---------------------------------------------------------


def test_an_uninstalled_plugin(db: Database) -> None:
    with pytest.raises(errors.PluginNotInstalled, match="install") as error:
        check(db.conninfo(), slot="new", plugin="wal2json", create_slot=True)
    assert "wal2json" in str(error.value)
    with db.connect() as conn:
        assert _no_probe_slots_left(conn)


def test_a_missing_file_that_is_not_a_plugin(db: Database) -> None:
    """58P01 (undefined_file) means any missing file; only a library the server could not
    load is a missing plugin. The rest stays a plain ServerError with the server's words."""
    with ReplicationConnection.connect(db.conninfo()) as repl:
        # The bare command, without the hint timeline_history() adds: the general mapping.
        bare = Command("TIMELINE_HISTORY 1", lambda result: result)
        with pytest.raises(errors.ServerError) as missing_history:
            repl.run(bare)
    assert type(missing_history.value) is errors.ServerError
    assert missing_history.value.sqlstate == server_errors.UNDEFINED_FILE
    assert "00000001.history" in missing_history.value.server_message

    with (
        db.connect() as conn,
        pytest.raises(errors.ServerError) as missing_file,
        server_errors.translated(),
    ):
        conn.execute("SELECT pg_read_file('no_such_file_here')")
    assert type(missing_file.value) is errors.ServerError
    assert missing_file.value.sqlstate == server_errors.UNDEFINED_FILE

    # The same SQLSTATE from loading a library is still a missing plugin, with the fix.
    with (
        db.connect() as conn,
        pytest.raises(errors.PluginNotInstalled, match="install") as lib,
        server_errors.translated(),
    ):
        conn.execute("LOAD 'pgcdc_no_such_library'")
    assert "pgcdc_no_such_library" in str(lib.value)


def test_a_role_without_replication(db: Database, role: str) -> None:
    conninfo = db.conninfo(user=role, password="secret")
    with pytest.raises(errors.MissingReplicationPrivilege) as error:
        check(conninfo, slot=None)
    assert f'ALTER ROLE "{role}" WITH REPLICATION' in str(error.value)
    db.execute(f"ALTER ROLE {role} WITH REPLICATION")
    assert check(conninfo, slot=None, plugin="test_decoding").facts.role_replication


def test_a_missing_slot(db: Database) -> None:
    with pytest.raises(errors.SlotNotFound) as error:
        check(db.conninfo(), slot="absent")
    assert "pg_create_logical_replication_slot('absent', 'pgoutput')" in str(error.value)


def test_a_slot_that_cannot_serve_this_stream(db: Database) -> None:
    with db.connect() as conn:
        create_logical_slot(conn, "decoder", "test_decoding")
        conn.execute("SELECT pg_create_physical_replication_slot('physical')")
        try:
            with pytest.raises(errors.SlotMismatch, match="plugin 'test_decoding'"):
                check(db.conninfo(), slot="decoder", plugin="pgoutput")
            with pytest.raises(errors.SlotMismatch, match="physical slot"):
                check(db.conninfo(), slot="physical")
            with pytest.raises(errors.SlotMismatch, match=f"connect to '{db.name}'"):
                check(db.cluster.conninfo("postgres"), slot="decoder", plugin="test_decoding")
        finally:
            drop_slot(conn, "physical")


def test_an_active_slot(db: Database) -> None:
    with db.connect() as conn:
        create_logical_slot(conn, "busy", "test_decoding")
    with streaming(db.cluster, db.name, "busy") as pid:
        with pytest.raises(errors.SlotInUse) as error:
            check(db.conninfo(), slot="busy", plugin="test_decoding")
        assert error.value.active_pid == pid
        assert f"pg_terminate_backend({pid})" in str(error.value)
        # The same condition met by a real operation goes through translate.
        with db.connect() as conn, pytest.raises(errors.SlotInUse) as translated:
            get_changes(conn, "busy")
        assert translated.value.active_pid == pid
    assert check(db.conninfo(), slot="busy", plugin="test_decoding").slot is not None


def test_missing_publications(db: Database) -> None:
    db.execute("CREATE PUBLICATION present")
    with pytest.raises(errors.PublicationNotFound) as error:
        check(db.conninfo(), slot=None, publications=["present", "Absent One"])
    message = str(error.value)
    assert "'Absent One'" in message and "'present'" not in message
    assert 'CREATE PUBLICATION "Absent One" FOR ALL TABLES' in message


def test_unreachable_or_refused_connections(db: Database) -> None:
    with pytest.raises(errors.AuthenticationFailed, match="password"):
        check(db.conninfo(password="wrong"), slot=None)
    with pytest.raises(errors.ConnectionFailed, match="server is running"):
        check(db.cluster.conninfo(port=1), slot=None)


# --- failures that need a server of their own ------------------------------------------------


@pytest.fixture(scope="module", params=sorted(INSTALLATIONS))
def installation(request: pytest.FixtureRequest) -> Installation:
    return INSTALLATIONS[request.param]()


@pytest.fixture(scope="module")
def replica_cluster(installation: Installation) -> Iterator[LocalCluster]:
    with LocalCluster(installation, settings={**TEST_SETTINGS, "wal_level": "replica"}) as local:
        yield local


@pytest.fixture(scope="module")
def tight_cluster(installation: Installation) -> Iterator[LocalCluster]:
    """Two replication slots, one WAL sender, and slots may keep at most 1 MB of WAL."""
    settings = {
        **TEST_SETTINGS,
        "max_replication_slots": "2",
        "max_wal_senders": "1",
        "max_slot_wal_keep_size": "1MB",
        "min_wal_size": "32MB",
        "max_wal_size": "64MB",
    }
    with LocalCluster(installation, settings=settings) as local:
        yield local


@pytest.fixture
def tight(tight_cluster: LocalCluster) -> Iterator[LocalCluster]:
    """The tight cluster with no slots left over from the previous test."""
    yield tight_cluster
    with psycopg.connect(tight_cluster.conninfo(), autocommit=True) as conn:
        for info in list_slots(conn):
            drop_slot(conn, info.name)


def test_wal_level_not_logical(replica_cluster: LocalCluster) -> None:
    with pytest.raises(errors.WalLevelNotLogical) as error:
        check(replica_cluster.conninfo(), slot=None)
    assert "wal_level is 'replica'" in str(error.value)
    assert "set wal_level = logical" in str(error.value)
    assert "restart the server" in str(error.value)
    with (
        psycopg.connect(replica_cluster.conninfo(), autocommit=True) as conn,
        pytest.raises(errors.WalLevelNotLogical, match="wal_level = logical"),
    ):
        create_logical_slot(conn, "never", "test_decoding")


def test_no_free_wal_sender(tight: LocalCluster) -> None:
    with psycopg.connect(tight.conninfo(), autocommit=True) as conn:
        create_logical_slot(conn, "only", "test_decoding")
    with streaming(tight, "postgres", "only"):
        with pytest.raises(errors.NoFreeWalSender) as error:
            check(tight.conninfo(), slot=None, plugin="test_decoding")
        assert "1 of max_wal_senders = 1" in str(error.value)
        assert "ALTER SYSTEM SET max_wal_senders = 2" in str(error.value)
        # The server's own refusal, at connection time, translates the same way.
        with pytest.raises(psycopg.OperationalError) as refused:
            psycopg.connect(tight.conninfo(replication="database"))
        translated = server_errors.from_psycopg(refused.value)
        assert isinstance(translated, errors.NoFreeWalSender)
        assert "raise max_wal_senders" in str(translated)


def test_no_free_replication_slot(tight: LocalCluster) -> None:
    with psycopg.connect(tight.conninfo(), autocommit=True) as conn:
        create_logical_slot(conn, "first", "test_decoding")
        create_logical_slot(conn, "second", "test_decoding")
        for slot, create_slot in ((None, False), ("third", True)):
            with pytest.raises(errors.NoFreeReplicationSlot) as error:
                check(tight.conninfo(), slot=slot, plugin="test_decoding", create_slot=create_slot)
            message = str(error.value)
            assert "2 of max_replication_slots = 2" in message
            assert "pg_drop_replication_slot" in message and "first, second" in message
        # An existing slot needs no free one.
        assert check(tight.conninfo(), slot="first", plugin="test_decoding").slot is not None
        with pytest.raises(errors.NoFreeReplicationSlot, match="raise max_replication_slots"):
            create_logical_slot(conn, "third", "test_decoding")


def test_invalidated_slot(tight: LocalCluster) -> None:
    with psycopg.connect(tight.conninfo(), autocommit=True) as conn:
        create_logical_slot(conn, "stale", "test_decoding")
        conn.execute("CREATE TABLE filler (x text)")

        def lost() -> bool:
            conn.execute(
                "INSERT INTO filler SELECT repeat('x', 1000) FROM generate_series(1, 2000)"
            )
            conn.execute("SELECT pg_switch_wal()")
            conn.execute("CHECKPOINT")
            info = get_slot(conn, "stale")
            return info is not None and info.wal_status == "lost"

        wait_until(lost, timeout=120, interval=0)
        info = get_slot(conn, "stale")
        assert info is not None and info.invalidated
        assert info.invalidation_reason == "wal_removed"

        with pytest.raises(errors.SlotInvalidated) as error:
            check(tight.conninfo(), slot="stale", plugin="test_decoding")
        assert "pg_drop_replication_slot('stale')" in str(error.value)
        assert "new initial snapshot" in str(error.value)
        # Reading or advancing it fails the same way through translate.
        with pytest.raises(errors.SlotInvalidated, match="pg_drop_replication_slot"):
            get_changes(conn, "stale")
        assert info.confirmed_flush_lsn is not None
        with pytest.raises(errors.SlotInvalidated, match="recreate it"):
            advance_slot(conn, "stale", info.confirmed_flush_lsn)
