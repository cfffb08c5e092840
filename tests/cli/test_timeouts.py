"""A server that never answers, and a catalog query that never ends, fail with a typed line
instead of hanging the command: a default connect_timeout and statement timeout."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest

from pgcdc.connection.conninfo import DEFAULT_CONNECT_TIMEOUT, connect, normalize
from pgcdc.connection.preflight import _check_publications
from pgcdc.connection.server_errors import translated
from pgcdc.errors import StatementTimedOut
from tests.cli.helpers import assert_one_line_error, pgcdc
from tests.conftest import Database

# Far above any timeout used here; only there so a regression fails instead of hanging.
GENEROUS = 90.0


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that accepts TCP connections and never says a word."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not done.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    done.set()
    thread.join()
    for conn in accepted:
        conn.close()
    server.close()


def _env(**changes: str | None) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@pytest.mark.parametrize(
    "argv", [["slots"], ["check"], ["--start", "-S", "s", "-f", "-"], ["peek", "-S", "s"]]
)
def test_a_silent_server_fails_fast_naming_host_port_and_timeout(
    silent_port: int, argv: list[str]
) -> None:
    conninfo = f"host=127.0.0.1 port={silent_port} dbname=x user=u connect_timeout=2"
    started = time.monotonic()
    result = pgcdc("-d", conninfo, *argv, timeout=GENEROUS, env=_env(PGCONNECT_TIMEOUT=None))
    assert time.monotonic() - started < GENEROUS
    assert_one_line_error(result, f"127.0.0.1:{silent_port}", "connect_timeout=2")


def test_pgconnect_timeout_and_the_default_apply_when_the_conninfo_sets_none(
    silent_port: int,
) -> None:
    conninfo = f"host=127.0.0.1 port={silent_port} dbname=x user=u"
    result = pgcdc("-d", conninfo, "slots", timeout=GENEROUS, env=_env(PGCONNECT_TIMEOUT="1"))
    assert_one_line_error(result, f"127.0.0.1:{silent_port}", "connect_timeout=1")
    result = pgcdc("-d", conninfo, "slots", timeout=GENEROUS, env=_env(PGCONNECT_TIMEOUT=None))
    assert_one_line_error(
        result, f"127.0.0.1:{silent_port}", f"connect_timeout={DEFAULT_CONNECT_TIMEOUT}"
    )


def test_normalize_keeps_a_given_connect_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PGCONNECT_TIMEOUT", raising=False)
    assert "connect_timeout=3" in normalize("dbname=x connect_timeout=3")
    assert f"connect_timeout={DEFAULT_CONNECT_TIMEOUT}" in normalize("dbname=x")
    assert "connect_timeout=7" in normalize("postgresql://u@h/x?connect_timeout=7")
    monkeypatch.setenv("PGCONNECT_TIMEOUT", "4")
    assert "connect_timeout" not in normalize("dbname=x")  # libpq reads the variable


def test_default_statement_timeout_unless_the_session_sets_one(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PGCDC_STATEMENT_TIMEOUT", raising=False)
    with connect(db.conninfo()) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("1min",)
    with connect(db.conninfo(options="-c statement_timeout=5s")) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("5s",)
    monkeypatch.setenv("PGCDC_STATEMENT_TIMEOUT", "0")
    with connect(db.conninfo()) as conn:
        assert conn.execute("SHOW statement_timeout").fetchone() == ("0",)


def test_a_blocked_catalog_query_ends_with_a_typed_error(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lock held on pg_publication stalls preflight's publication check forever. (Connected
    first: a new backend may need that catalog while it starts, and would wait on the lock.)"""
    db.execute("CREATE PUBLICATION p FOR ALL TABLES")
    monkeypatch.setenv("PGCDC_STATEMENT_TIMEOUT", "1")
    with connect(db.conninfo()) as conn, psycopg.connect(db.conninfo()) as locker:
        locker.execute("LOCK TABLE pg_catalog.pg_publication IN ACCESS EXCLUSIVE MODE")
        expected = pytest.raises(StatementTimedOut, match="PGCDC_STATEMENT_TIMEOUT")
        with expected as caught, translated():
            _check_publications(conn, db.name, ["p"])
        locker.rollback()
    assert "statement timeout" in str(caught.value).splitlines()[0]


def test_a_bad_statement_timeout_setting_is_one_line(db: Database) -> None:
    bad = pgcdc("-d", db.conninfo(), "slots", env=_env(PGCDC_STATEMENT_TIMEOUT="soon"))
    assert_one_line_error(bad, "PGCDC_STATEMENT_TIMEOUT", "seconds")
