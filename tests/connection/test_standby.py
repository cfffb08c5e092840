"""``pgcdc check --standby``: a physical standby (pg_basebackup, PostgreSQL 18) that could not
take over a failover slot is reported with every setting to change and where; once they are
set, the check passes and shows the standby's copy of the slot."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from pgcdc.connection.replication import ReplicationConnection
from pgcdc.connection.standby import check_standby
from pgcdc.errors import StandbyNotReady
from pgcdc.localpg import LocalCluster, embedded_installation, wait_until
from tests.cli.helpers import pgcdc
from tests.conftest import TEST_SETTINGS

SLOT = "s"


@pytest.fixture
def servers() -> Iterator[tuple[LocalCluster, LocalCluster]]:
    """A primary with a logical slot that is not a failover slot, and a standby with slot
    synchronization and hot_standby_feedback off."""
    with LocalCluster(embedded_installation(), settings=TEST_SETTINGS) as primary:
        standby = primary.make_standby(
            "standby", settings={"sync_replication_slots": "off", "hot_standby_feedback": "off"}
        )
        try:
            with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
                conn.execute(f"SELECT pg_create_logical_replication_slot('{SLOT}', 'pgoutput')")
            yield primary, standby
        finally:
            standby.destroy()


def _alter_system(cluster: LocalCluster, setting: str) -> None:
    with psycopg.connect(cluster.conninfo(), autocommit=True) as conn:
        conn.execute(f"ALTER SYSTEM SET {setting}")
    cluster.reload()


def test_check_standby_says_what_to_set_then_passes(
    servers: tuple[LocalCluster, LocalCluster],
) -> None:
    primary, standby = servers
    with pytest.raises(StandbyNotReady) as raised:
        check_standby(primary.conninfo(), standby.conninfo(), slot=SLOT)
    message = str(raised.value)
    assert "(4 to fix)" in message
    for fix in (
        "on the standby: ALTER SYSTEM SET sync_replication_slots = on",
        "on the standby: ALTER SYSTEM SET hot_standby_feedback = on",
        "on the primary: ALTER SYSTEM SET synchronized_standby_slots = 'standby'",
        f"ALTER_REPLICATION_SLOT {SLOT} (FAILOVER true)",
    ):
        assert fix in message
    assert "\n" not in message

    _alter_system(standby, "sync_replication_slots = on")
    _alter_system(standby, "hot_standby_feedback = on")
    _alter_system(primary, "synchronized_standby_slots = 'standby'")
    with ReplicationConnection.connect(primary.conninfo()) as conn:
        conn.alter_replication_slot(SLOT, failover=True)
    with psycopg.connect(primary.conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_log_standby_snapshot()")
    result = pgcdc("check", "-d", primary.conninfo(), "-S", SLOT, "--standby", standby.conninfo())
    assert result.returncode == 0, result.stderr.decode()
    output = result.stdout.decode()
    assert "standby: ready for a failover" in output
    assert "through slot standby" in output
    assert f"standby's copy of {SLOT}:" in output
    # Once synchronized, the copy is shown with its position.
    wait_until(
        lambda: check_standby(primary.conninfo(), standby.conninfo(), slot=SLOT).synced_slot,
        timeout=60,
        interval=0.5,
    )
