"""``pgcdc pipeline run --once`` with the change log and the lake on S3 (moto's server on
loopback), settings from ``[paths] storage_options`` only: the mirror equals the source, and
the secret key is nowhere in what the command printed or wrote."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pgcdc import pipeline
from pgcdc.errors import CheckpointUnavailable
from pgcdc.sinks import SinkKind, read_table
from tests.cli.helpers import pgcdc
from tests.conftest import Database
from tests.spark.helpers import sort_rows

from .conftest import Bucket


def _config(db: Database, bucket: Bucket, tmp_path: Path, checkpoint: str) -> Path:
    options = ", ".join(f'{key} = "{value}"' for key, value in bucket.options().items())
    config = tmp_path / "pipeline.toml"
    config.write_text(
        f"""
[source]
conninfo = "{db.conninfo()}"
slot = "s3"
publications = ["cdc"]
snapshot_workers = 2

[paths]
changelog = "{bucket.uri("changelog")}"
lake = "{bucket.uri("lake")}"
checkpoint = "{checkpoint}"
storage_options = {{ {options} }}

[tables]
kinds = ["changelog", "mirror"]

[spark]
master = "local[2]"
"""
    )
    return config


def _environment() -> dict[str, str]:
    """No AWS_* settings: everything must come from the config file."""
    return {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}


# The storage code does not depend on the server version: one server keeps CI time small.
@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_pipeline_run_once_on_s3_from_storage_options(
    db: Database, bucket: Bucket, tmp_path: Path
) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, name text, price numeric(8, 2))")
    db.execute("INSERT INTO items SELECT g, 'item ' || g, g * 1.5 FROM generate_series(1, 100) g")
    db.execute("CREATE PUBLICATION cdc FOR TABLE items")
    config = _config(db, bucket, tmp_path, str(tmp_path / "checkpoint"))
    argv = ["pipeline", "run", "--config", str(config), "--once"]
    first = pgcdc(*argv, env=_environment(), timeout=240)
    assert first.returncode == 0, first.stderr.decode()[-3000:]
    db.execute("UPDATE items SET price = price * 2 WHERE id % 3 = 0")
    db.execute("DELETE FROM items WHERE id % 7 = 0")
    db.execute("INSERT INTO items VALUES (1000, 'late', 1)")
    second = pgcdc(*argv, env=_environment(), timeout=240)
    assert second.returncode == 0, second.stderr.decode()[-3000:]

    with db.connect() as conn:
        expected = sort_rows(
            [
                {"id": i, "name": n, "price": p}
                for i, n, p in conn.execute("SELECT id, name, price FROM items")
            ]
        )
    mirror = read_table(
        bucket.uri(f"lake/public/items/{SinkKind.MIRROR.value}"), storage_options=bucket.options()
    )
    assert sort_rows(mirror.select(["id", "name", "price"]).to_pylist()) == expected
    changelog = read_table(
        bucket.uri(f"lake/public/items/{SinkKind.CHANGELOG.value}"),
        storage_options=bucket.options(),
    )
    assert changelog.num_rows == 100 + 33 + 14 + 1  # snapshot, updates, deletes, insert

    objects = bucket.objects()
    assert any(key.startswith("changelog/") and key.endswith(".pgcdcseg") for key in objects)
    canary = bucket.secret_access_key.encode()
    for result in (first, second):
        assert canary not in result.stdout and canary not in result.stderr
    assert not [key for key, body in objects.items() if canary in body]
    for path in (tmp_path / "checkpoint").rglob("*"):
        assert not path.is_file() or canary not in path.read_bytes(), path


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_a_checkpoint_on_s3a_is_a_typed_error(db: Database, bucket: Bucket, tmp_path: Path) -> None:
    """pyspark ships no hadoop-aws: the checkpoint must stay on a filesystem the driver owns."""
    db.execute("CREATE TABLE items (id int PRIMARY KEY)")
    db.execute("CREATE PUBLICATION cdc FOR TABLE items")
    config = _config(db, bucket, tmp_path, f"s3a://{bucket.name}/checkpoint")
    settings = pipeline.load(config, {})
    with pytest.raises(CheckpointUnavailable, match="filesystem the driver owns") as raised:
        pipeline.run(settings, once=True)
    assert "\n" not in str(raised.value) and "s3a://" in str(raised.value)
