"""Passwords never leave the conninfo: not in error messages, logs, the change log, consumer
state, the Spark checkpoint or the Delta log. Each case gives a canary password and greps for
it everywhere pgcdc writes."""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from pgcdc.errors import redact
from pgcdc.localpg import free_port
from pgcdc.sinks import SinkKind, read_table
from tests.cli.helpers import assert_one_line_error, pgcdc
from tests.conftest import Database
from tests.spark.helpers import sort_rows


@pytest.fixture
def canary() -> str:
    return f"Canary{secrets.token_hex(6)}"


def assert_clean(result: subprocess.CompletedProcess[bytes], canary: str) -> None:
    assert canary.encode() not in result.stdout
    assert canary.encode() not in result.stderr
    assert b"Traceback" not in result.stderr


def test_redact_covers_keyword_quoted_uri_and_query_forms() -> None:
    for text in (
        "host=h password=S3cret user=u",
        "host=h password = 'two words S3cret' user=u",
        "host=h sslpassword=S3cret",
        "postgresql://u:S3cret@h:5432/db",
        "postgres://u@h/db?password=S3cret&sslmode=require",
        "'host=h PASSWORD=S3cret\\ x'",
    ):
        assert "S3cret" not in redact(text), text
    assert redact('password authentication failed for user "u"') == (
        'password authentication failed for user "u"'
    )


def test_a_bad_conninfo_is_reported_without_its_password(db: Database, canary: str) -> None:
    bad = f"host=127.0.0.1 port={db.cluster.port} password={canary} nosuchkeyword=1"
    result = pgcdc("-d", bad, "slots")
    assert_clean(result, canary)
    assert_one_line_error(result, "nosuchkeyword", "password=********")
    uri = f"postgresql://postgres:{canary}@127.0.0.1:{db.cluster.port}/x?nosuchkeyword=1"
    result = pgcdc("-d", uri, "slots")
    assert_clean(result, canary)
    assert_one_line_error(result, "nosuchkeyword")


def test_wrong_password_and_refused_port_never_echo_the_password(db: Database, canary: str) -> None:
    wrong = db.conninfo(password=canary)
    for argv in (["slots"], ["--start", "-S", "nosuch", "-f", "-"], ["peek", "-S", "nosuch"]):
        result = pgcdc("-d", wrong, *argv)
        assert_clean(result, canary)
        assert_one_line_error(result, "password authentication failed")
    refused = db.conninfo(password=canary, port=free_port())
    result = pgcdc("-d", refused, "slots")
    assert_clean(result, canary)
    assert_one_line_error(result, "refused")
    uri = f"postgresql://postgres:{canary}@127.0.0.1:{db.cluster.port}/{db.name}"
    result = pgcdc("-d", uri, "slots")
    assert_clean(result, canary)
    assert_one_line_error(result, "password authentication failed")


@pytest.fixture
def canary_role(db: Database, canary: str) -> Iterator[str]:
    """A login role with REPLICATION whose password is the canary."""
    role = f"{db.name}_cdc"
    db.execute(f"CREATE ROLE {role} LOGIN REPLICATION PASSWORD '{canary}'")
    db.execute(f'GRANT ALL ON DATABASE "{db.name}" TO {role}')
    yield role
    db.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
    db.execute(
        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
        "WHERE database = %s AND NOT active",
        (db.name,),
    )
    db.execute(f'REVOKE ALL ON DATABASE "{db.name}" FROM {role}')
    db.execute(f"DROP OWNED BY {role}")
    db.execute(f"DROP ROLE {role}")


def _files_holding(root: Path, needle: str) -> list[Path]:
    return [
        path for path in root.rglob("*") if path.is_file() and needle.encode() in path.read_bytes()
    ]


# One server version (suite time): where pgcdc writes and logs the password does not depend
# on the server; the shorter tests above run on both.
@pytest.mark.parametrize("cluster", ["pg15"], indirect=True)
def test_pipeline_run_with_the_password_in_the_config(
    db: Database, canary: str, canary_role: str, tmp_path: Path
) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8, 2))")
    db.execute("INSERT INTO items SELECT g, 'item ' || g, g * 1.5 FROM generate_series(1, 50) g")
    db.execute(f"GRANT SELECT ON items TO {canary_role}")
    db.execute("CREATE PUBLICATION cdc FOR TABLE items")
    work = tmp_path / "work"
    work.mkdir()
    config = tmp_path / "pipeline.toml"  # outside ``work``: it holds the password on purpose
    conninfo = db.conninfo(user=canary_role, password=canary)
    config.write_text(
        f"""
[source]
conninfo = "{conninfo}"
slot = "secret"
publications = ["cdc"]

[paths]
changelog = "{work / "log"}"
lake = "{work / "lake"}"
checkpoint = "{work / "checkpoint"}"

[spark]
master = "local[2]"
"""
    )
    result = pgcdc("pipeline", "run", "--config", str(config), "--once", cwd=work, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    assert_clean(result, canary)
    db.execute("UPDATE items SET price = price * 2 WHERE id % 3 = 0")
    db.execute("DELETE FROM items WHERE id % 7 = 0")
    result = pgcdc("pipeline", "run", "--config", str(config), "--once", cwd=work, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    assert_clean(result, canary)

    with db.connect() as conn:
        cursor = conn.execute("SELECT id, name, price FROM items")
        expected = sort_rows([dict(zip(("id", "name", "price"), r, strict=True)) for r in cursor])
    mirror = read_table(work / "lake" / "public" / "items" / SinkKind.MIRROR.value)
    assert sort_rows(mirror.select(["id", "name", "price"]).to_pylist()) == expected
    assert any((work / "lake").rglob("_delta_log/*.json"))
    assert any((work / "log").rglob("*"))
    assert _files_holding(work, canary) == []

    # The same config with a wrong password: one typed line, still no password.
    config.write_text(config.read_text().replace(canary, canary + "x"))
    result = pgcdc("pipeline", "run", "--config", str(config), "--once", cwd=work, timeout=300)
    assert_clean(result, canary)
    assert_one_line_error(result, "password authentication failed")
    assert _files_holding(work, canary) == []
