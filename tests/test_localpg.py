"""The throwaway clusters themselves: right version, logical decoding on, SCRAM over TCP."""

from __future__ import annotations

import psycopg
import pytest

from pgcdc.localpg import SUPERUSER_PASSWORD


def test_cluster_is_ready_for_logical_decoding(db) -> None:
    assert db.scalar("SHOW wal_level") == "logical"
    assert int(db.scalar("SHOW max_prepared_transactions")) > 0
    assert int(db.scalar("SHOW max_replication_slots")) >= 10
    assert int(db.scalar("SHOW server_version_num")) // 10000 == db.major
    assert db.major in (15, 18)


def test_tcp_connections_use_scram(db) -> None:
    with db.connect() as conn:
        assert conn.pgconn.used_password
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(db.conninfo(password=SUPERUSER_PASSWORD + "x")).close()
