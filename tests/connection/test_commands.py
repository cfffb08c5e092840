"""Replication commands: their text for each server version, and each one run on PG15 and PG18."""

from __future__ import annotations

import contextlib
import itertools
import os
from typing import Any

import psycopg
import pytest

from pgcdc.connection import commands
from pgcdc.connection.commands import ResultSet
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.errors import (
    InvalidArgument,
    ProtocolError,
    ServerError,
    SlotAlreadyExists,
    SlotInUse,
    SlotNotFound,
    UnsupportedFeature,
)
from pgcdc.localpg import LocalCluster, wait_until
from pgcdc.lsn import LSN
from tests.conftest import TEST_SETTINGS

PG14, PG15, PG16, PG17, PG18 = 140011, 150004, 160002, 170000, 180001
_slot_numbers = itertools.count()


def slot_name(prefix: str = "slot") -> str:
    return f"{prefix}_{os.getpid()}_{next(_slot_numbers)}"


@pytest.fixture
def repl(db):
    with ReplicationConnection.connect(db.conninfo()) as connection:
        yield connection


def slot_row(db, name: str) -> dict[str, Any] | None:
    with db.connect() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cursor:
        cursor.execute("SELECT * FROM pg_replication_slots WHERE slot_name = %s", (name,))
        row: dict[str, Any] | None = cursor.fetchone()
        return row


def slot_info(db, name: str) -> dict[str, Any]:
    row = slot_row(db, name)
    assert row is not None, f"slot {name} does not exist"
    return row


# --- command text ----------------------------------------------------------------------------


def test_create_slot_text_new_syntax():
    command = commands.create_replication_slot(
        PG15, 'we"ird', "test_decoding", temporary=True, snapshot="export", two_phase=True
    )
    assert command.text == (
        'CREATE_REPLICATION_SLOT "we""ird" TEMPORARY LOGICAL "test_decoding" '
        "(SNAPSHOT 'export', TWO_PHASE true)"
    )
    plain = commands.create_replication_slot(PG18, "s", "pgoutput", failover=True)
    assert plain.text == 'CREATE_REPLICATION_SLOT "s" LOGICAL "pgoutput" (FAILOVER true)'
    assert commands.create_replication_slot(PG15, "s", "p").text == (
        'CREATE_REPLICATION_SLOT "s" LOGICAL "p"'
    )


@pytest.mark.parametrize(
    ("snapshot", "keyword"),
    [("export", "EXPORT_SNAPSHOT"), ("use", "USE_SNAPSHOT"), ("nothing", "NOEXPORT_SNAPSHOT")],
)
def test_create_slot_text_old_syntax(snapshot, keyword):
    command = commands.create_replication_slot(PG14, "s", "test_decoding", snapshot=snapshot)
    assert command.text == f'CREATE_REPLICATION_SLOT "s" LOGICAL "test_decoding" {keyword}'


def test_features_the_version_lacks():
    with pytest.raises(UnsupportedFeature, match=r"PostgreSQL 15 or later; this server is .* 14"):
        commands.create_replication_slot(PG14, "s", "p", two_phase=True)
    with pytest.raises(UnsupportedFeature, match=r"PostgreSQL 17 or later; this server is .* 16"):
        commands.create_replication_slot(PG16, "s", "p", failover=True)
    with pytest.raises(UnsupportedFeature, match="READ_REPLICATION_SLOT needs PostgreSQL 15"):
        commands.read_replication_slot(PG14, "s")
    with pytest.raises(UnsupportedFeature, match="ALTER_REPLICATION_SLOT needs PostgreSQL 17"):
        commands.alter_replication_slot(PG16, "s", failover=True)
    with pytest.raises(UnsupportedFeature, match=r"two_phase of an existing slot needs .* 18"):
        commands.alter_replication_slot(PG17, "s", two_phase=True)
    with pytest.raises(UnsupportedFeature, match=r"PostgreSQL 15 or later; this server is .* 9"):
        commands.read_replication_slot(90624, "s")  # pre-10 numbering


def test_alter_and_drop_text():
    assert commands.alter_replication_slot(PG17, "s", failover=False).text == (
        'ALTER_REPLICATION_SLOT "s" (FAILOVER false)'
    )
    assert commands.alter_replication_slot(PG18, "s", failover=True, two_phase=True).text == (
        'ALTER_REPLICATION_SLOT "s" (FAILOVER true, TWO_PHASE true)'
    )
    with pytest.raises(InvalidArgument, match="needs two_phase or failover"):
        commands.alter_replication_slot(PG18, "s")
    assert commands.drop_replication_slot("s").text == 'DROP_REPLICATION_SLOT "s"'
    assert commands.drop_replication_slot("s", wait=True).text == 'DROP_REPLICATION_SLOT "s" WAIT'


def test_start_replication_quotes_names_and_values():
    text = commands.start_replication(
        'sl"ot',
        LSN("16/B374D848"),
        {"publication_names": '"it\'s",b\\c', "proto_version": 4, "binary": True, "flag": None},
    )
    assert text == (
        'START_REPLICATION SLOT "sl""ot" LOGICAL 16/B374D848 ('
        "\"publication_names\" '\"it''s\",b\\c', \"proto_version\" '4', "
        '"binary" \'true\', "flag")'
    )
    assert commands.start_replication("s", LSN(0)) == 'START_REPLICATION SLOT "s" LOGICAL 0/0'
    pairs = commands.start_replication("s", LSN(1), [("a", "x"), ("a", "y")])
    assert pairs.endswith("(\"a\" 'x', \"a\" 'y')")


@pytest.mark.parametrize(
    "build",
    [
        lambda: commands.drop_replication_slot("a\x00b"),
        lambda: commands.start_replication("s", LSN(0), {"opt": "a\x00b"}),
        lambda: commands.start_replication("s", LSN(0), {"": "x"}),
        lambda: commands.create_replication_slot(PG15, "s", "plug\x00in"),
        lambda: commands.show("wal_sender_timeout; DROP"),
        lambda: commands.timeline_history(0),
        lambda: commands.create_replication_slot(PG15, "s", "p", snapshot="all"),  # type: ignore[arg-type]
    ],
)
def test_unsendable_arguments(build):
    with pytest.raises(InvalidArgument):
        build()


def test_result_parsing_rejects_malformed_rows():
    identify = commands.identify_system().parse
    columns = ("systemid", "timeline", "xlogpos", "dbname")
    good = identify(ResultSet(columns, ((b"7", b"1", b"0/16B3748", None),)))
    assert good == commands.SystemIdentity(7, 1, LSN("0/16B3748"), None)
    with pytest.raises(ProtocolError, match="invalid LSN"):
        identify(ResultSet(columns, ((b"7", b"1", b"zz", b"db"),)))
    with pytest.raises(ProtocolError, match="number"):
        identify(ResultSet(columns, ((b"x", b"1", b"0/0", b"db"),)))
    with pytest.raises(ProtocolError, match="NULL"):
        identify(ResultSet(columns, ((b"7", None, b"0/0", b"db"),)))
    with pytest.raises(ProtocolError, match="0 rows"):
        identify(ResultSet(columns, ()))


# --- on the server ---------------------------------------------------------------------------


def test_identify_system(db, repl):
    identity = repl.identify_system()
    system_id, timeline = db.execute(
        "SELECT system_identifier, timeline_id FROM pg_control_system(), pg_control_checkpoint()"
    )[0]
    assert identity.system_id == system_id
    assert identity.timeline == timeline
    assert identity.dbname == db.name
    assert identity.xlogpos <= LSN(db.scalar("SELECT pg_current_wal_flush_lsn()::text"))
    assert identity.xlogpos > LSN(0)


def test_show(db):
    with ReplicationConnection.connect(db.conninfo(), options="-c wal_sender_timeout=2s") as repl:
        assert repl.show("wal_sender_timeout") == "2s"
        assert repl.show("server_version_num") == str(repl.server_version)
        assert repl.server_version // 10000 == db.major
        with pytest.raises(ServerError, match="unrecognized configuration parameter"):
            repl.show("no_such_setting")
        assert repl.show("wal_level") == "logical"  # the connection is still usable


def _promoted_cluster(installation) -> LocalCluster:
    """A cluster that ended an archive recovery, so it runs on timeline 2 with a history file."""
    cluster = LocalCluster(installation, settings={**TEST_SETTINGS, "restore_command": "false"})
    cluster.start()
    cluster.stop()
    signal = cluster.data_dir / "recovery.signal"
    signal.touch()
    owner = cluster.data_dir.stat()
    os.chown(signal, owner.st_uid, owner.st_gid)
    cluster.start()  # returns once read-only connections are accepted: recovery may go on

    def promoted() -> bool:
        with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
            row = conn.execute("SELECT NOT pg_is_in_recovery()").fetchone()
        return bool(row and row[0])

    wait_until(promoted, timeout=60)
    return cluster


def test_timeline_history(db):
    cluster = _promoted_cluster(db.cluster.installation)
    try:
        with ReplicationConnection.connect(cluster.conninfo()) as repl:
            timeline = repl.identify_system().timeline
            assert timeline == 2, cluster.server_log()[-3000:]
            history = repl.timeline_history(2)
            assert history.filename == "00000002.history"
            assert isinstance(history.content, bytes)
            parent, switchpoint, *_ = history.content.decode().splitlines()[0].split("\t")
            assert parent == "1"
            assert LSN(switchpoint) > LSN(0)
            assert history.switchpoints() == {1: LSN(switchpoint)}
            with pytest.raises(ServerError, match="timeline 1 has no history file") as missing:
                repl.timeline_history(1)
            assert missing.value.sqlstate == "58P01"
    finally:
        cluster.destroy()


def test_create_slot_exports_a_usable_snapshot(db, repl):
    db.execute("CREATE TABLE t (id int)")
    db.execute("INSERT INTO t VALUES (1)")
    name = slot_name()
    slot = repl.create_replication_slot(name, "test_decoding", snapshot="export")
    assert slot.slot_name == name
    assert slot.output_plugin == "test_decoding"
    assert slot.snapshot_name
    row = slot_row(db, name)
    assert row is not None
    assert row["plugin"] == "test_decoding"
    assert LSN(str(row["confirmed_flush_lsn"])) == slot.consistent_point
    db.execute("INSERT INTO t VALUES (2)")  # after the snapshot: must not be visible in it
    with db.connect() as conn:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        conn.execute(f"SET TRANSACTION SNAPSHOT '{slot.snapshot_name}'")
        assert conn.execute("SELECT array_agg(id) FROM t").fetchone() == ([1],)
        conn.execute("COMMIT")


def test_create_slot_using_the_transaction_snapshot(db, repl):
    db.execute("CREATE TABLE t (id int)")
    db.execute("INSERT INTO t VALUES (1)")
    repl.execute("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY")  # PG18 insists
    slot = repl.create_replication_slot(slot_name(), "test_decoding", snapshot="use")
    assert slot.snapshot_name is None
    db.execute("INSERT INTO t VALUES (2)")
    rows = repl.execute("SELECT count(*) FROM t")
    assert rows.text(0, 0) == "1"
    repl.execute("COMMIT")
    assert repl.execute("SELECT count(*) FROM t").text(0, 0) == "2"


def test_create_temporary_two_phase_slot_without_snapshot(db):
    name = slot_name()
    with ReplicationConnection.connect(db.conninfo()) as repl:
        slot = repl.create_replication_slot(
            name, "test_decoding", temporary=True, snapshot="nothing", two_phase=True
        )
        assert slot.snapshot_name is None
        row = slot_row(db, name)
        assert row is not None
        assert row["temporary"] is True
        assert row["two_phase"] is True
    # A temporary slot goes with its connection (released asynchronously by the server).
    from pgcdc.localpg import wait_until

    wait_until(lambda: slot_row(db, name) is None, timeout=30)


def test_create_failover_slot(db, repl):
    name = slot_name()
    if db.major < 17:
        with pytest.raises(UnsupportedFeature, match="PostgreSQL 17"):
            repl.create_replication_slot(name, "test_decoding", failover=True)
        assert slot_row(db, name) is None
        return
    repl.create_replication_slot(name, "test_decoding", snapshot="nothing", failover=True)
    row = slot_row(db, name)
    assert row is not None
    assert row["failover"] is True


def test_create_existing_slot(db, repl):
    name = slot_name()
    repl.create_replication_slot(name, "test_decoding", snapshot="nothing")
    with pytest.raises(SlotAlreadyExists, match=name):
        repl.create_replication_slot(name, "test_decoding", snapshot="nothing")
    # The server checks the name it received: quoting kept it intact, so it is rejected.
    with pytest.raises(ServerError, match="invalid character") as invalid:
        repl.create_replication_slot("Bad'Name", "test_decoding", snapshot="nothing")
    assert invalid.value.sqlstate == "42602"


def test_read_replication_slot(db, repl):
    name = slot_name("phys")
    if db.major < 15:
        pytest.fail("the test servers are PG15 and PG18")
    db.execute("SELECT pg_create_physical_replication_slot(%s, true)", (name,))
    try:
        position = repl.read_replication_slot(name)
        row = slot_row(db, name)
        assert row is not None
        assert position.slot_type == "physical"
        assert position.restart_lsn == LSN(str(row["restart_lsn"]))
        assert position.restart_tli == repl.identify_system().timeline
    finally:
        db.execute("SELECT pg_drop_replication_slot(%s)", (name,))
    with pytest.raises(SlotNotFound, match=name):
        repl.read_replication_slot(name)
    logical = slot_name()
    repl.create_replication_slot(logical, "test_decoding", snapshot="nothing")
    with pytest.raises(ServerError, match="logical replication slot"):
        repl.read_replication_slot(logical)


def test_alter_replication_slot(db, repl):
    name = slot_name()
    repl.create_replication_slot(name, "test_decoding", snapshot="nothing")
    if db.major < 17:
        with pytest.raises(UnsupportedFeature, match="ALTER_REPLICATION_SLOT needs PostgreSQL 17"):
            repl.alter_replication_slot(name, failover=True)
        return
    repl.alter_replication_slot(name, failover=True)
    assert slot_info(db, name)["failover"] is True
    repl.alter_replication_slot(name, failover=False)
    assert slot_info(db, name)["failover"] is False
    if db.major < 18:
        with pytest.raises(UnsupportedFeature, match="18"):
            repl.alter_replication_slot(name, two_phase=True)
        return
    repl.alter_replication_slot(name, two_phase=True)
    assert slot_info(db, name)["two_phase"] is True
    with pytest.raises(SlotNotFound):
        repl.alter_replication_slot(slot_name(), failover=True)


def test_drop_replication_slot(db, repl):
    name = slot_name()
    repl.create_replication_slot(name, "test_decoding", snapshot="nothing")
    repl.drop_replication_slot(name)
    assert slot_row(db, name) is None
    with pytest.raises(SlotNotFound, match=name):
        repl.drop_replication_slot(name)
    repl.create_replication_slot(name, "test_decoding", snapshot="nothing")
    repl.drop_replication_slot(name, wait=True)
    assert slot_row(db, name) is None


def test_drop_active_slot_without_wait(db, repl):
    name = slot_name()
    repl.create_replication_slot(name, "test_decoding", snapshot="nothing")
    with ReplicationConnection.connect(db.conninfo()) as streaming:
        stream = streaming.start_replication(name)
        pid = slot_info(db, name)["active_pid"]
        with pytest.raises(SlotInUse) as in_use:
            repl.drop_replication_slot(name)
        assert in_use.value.active_pid == pid
        stream.stop()
    repl.drop_replication_slot(name, wait=True)
    assert slot_row(db, name) is None


def test_commands_refused_while_streaming(db, repl):
    name = slot_name()
    repl.create_replication_slot(name, "test_decoding", snapshot="nothing")
    stream = repl.start_replication(name)
    with pytest.raises(InvalidArgument, match="stop"):
        repl.identify_system()
    stream.stop()
    assert repl.identify_system().dbname == db.name
    with contextlib.suppress(SlotNotFound):
        repl.drop_replication_slot(name)


def test_timeline_history_switchpoints() -> None:
    """Each earlier timeline and where it ended, comments and blank lines skipped; a line
    of another form is a ProtocolError, never a guess."""
    content = b"# a comment\n1\t0/30D5E28\tno recovery target specified\n\n2\t1/A0\tbefore x\n"
    history = commands.TimelineHistory("00000003.history", content)
    assert history.switchpoints() == {1: LSN.parse("0/30D5E28"), 2: LSN.parse("1/A0")}
    with pytest.raises(ProtocolError, match=r"00000002\.history"):
        commands.TimelineHistory("00000002.history", b"1\tnot-an-lsn\tx\n").switchpoints()
