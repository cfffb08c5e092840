"""A SIGKILL while Spark writes a fresh checkpoint's first offsets leaves only its temporary
file in ``offsets/``: the next start must begin at batch 0 as if it were empty (Spark 4 refused
it: STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY, seen in the killed pipeline run test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pgcdc import pipeline
from pgcdc.errors import CheckpointUnavailable
from pgcdc.spark.pipeline import start
from tests.conftest import Database

from .helpers import mirror_rows, table_rows


def _settings(db: Database, tmp_path: Path, slot: str, checkpoint: str) -> pipeline.Settings:
    return pipeline.Settings(
        conninfo=db.conninfo(),
        slot=slot,
        publications=("pub",),
        changelog=str(tmp_path / "log"),
        lake=str(tmp_path / "lake"),
        checkpoint=checkpoint,
        master="local[2]",
        trigger_interval=0.2,
    )


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_a_first_offsets_write_cut_by_a_kill_does_not_wedge_the_next_start(
    db: Database, tmp_path: Path, spark: Any, caplog: pytest.LogCaptureFixture
) -> None:
    db.execute("CREATE TABLE notes (id int PRIMARY KEY, note text)")
    db.execute("INSERT INTO notes SELECT g, 'note ' || g FROM generate_series(1, 100) g")
    db.execute("CREATE PUBLICATION pub FOR TABLE notes")
    offsets = tmp_path / "checkpoint" / "offsets"
    offsets.mkdir(parents=True)
    # What Hadoop's atomic create leaves when the process dies before its rename.
    leftover = offsets / ".0.5f0c8a1e-0d7e-4c57-9d3a-2b8e1f6c7a90.tmp"
    leftover.write_text("v1\n")
    checksum = offsets / f".{leftover.name}.crc"  # Hadoop's local file system lists it apart
    checksum.write_bytes(b"crc")
    settings = _settings(db, tmp_path, "leftovers", str(tmp_path / "checkpoint"))
    pipeline.run(settings, once=True, spark=spark)
    assert f"removed {leftover.name}" in caplog.text  # said, not silent
    assert not leftover.exists() and not checksum.exists()
    with db.connect() as conn:
        columns, expected = table_rows(conn, "public.notes")
    assert len(expected) == 100
    assert mirror_rows(tmp_path / "lake", "public.notes", columns) == expected


@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_a_query_start_on_an_unusable_checkpoint_is_a_typed_error(
    db: Database, tmp_path: Path, spark: Any
) -> None:
    """The look for leftovers reaches the checkpoint's file system first: on a scheme Spark
    has none for (s3a:// without hadoop-aws), the same typed error as the pipeline's check."""
    settings = _settings(db, tmp_path, "unusable", "s3a://no-bucket/checkpoint")
    with pytest.raises(CheckpointUnavailable, match="filesystem the driver owns"):
        start(spark, settings.pipeline())
