"""``pipeline run`` refuses a config it would otherwise misread: a misspelt key (named with
the closest valid one), and --no-create-slot for a slot that does not exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pgcdc import pipeline
from pgcdc.errors import InvalidOption
from tests.cli.helpers import assert_one_line_error, pgcdc
from tests.conftest import Database


def _slots(db: Database) -> int:
    return int(
        db.scalar("SELECT count(*) FROM pg_replication_slots WHERE database = %s", (db.name,))
    )


@pytest.mark.parametrize("snapshot", ["initial", "never"])
def test_no_create_slot_refuses_a_missing_slot(db: Database, tmp_path: Path, snapshot: str) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY)")
    db.execute("INSERT INTO t VALUES (1)")
    db.execute("CREATE PUBLICATION cdc FOR TABLE t")
    result = pgcdc(
        "pipeline", "run", "-d", db.conninfo(), "--slot", "absent", "--publication", "cdc",
        "--no-create-slot", "--snapshot", snapshot, "--once", "--master", "local[1]",
        "--changelog", str(tmp_path / "log"), "--lake", str(tmp_path / "lake"),
        "--checkpoint", str(tmp_path / "checkpoint"), cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert_one_line_error(result, "'absent'", "does not exist", "pgcdc --create-slot -S absent")
    assert _slots(db) == 0
    assert not (tmp_path / "lake").exists()


@pytest.mark.parametrize(
    ("toml", "needles"),
    [
        ('[source]\nslot_name = "mine"\n', ["'slot_name'", "did you mean 'slot'"]),
        (
            "[spark]\ntriger_interval = 1\n",
            ["'triger_interval'", "did you mean 'trigger_interval'"],
        ),
        ('[paths]\nlakes = "x"\n', ["'lakes'", "did you mean 'lake'"]),
        ('[sorce]\nslot = "x"\n', ["'[sorce]'", "did you mean '[source]'"]),
        ('[source]\nmaster = "local[1]"\n', ["'master' belongs in [spark]"]),
        ('[tables]\nkind = ["mirror"]\n', ["'kind'", "did you mean 'kinds'"]),
        ("[spark]\nmax_changes_per_batch = 0\n", ["max_changes_per_batch", "positive"]),
        ("[source]\nreceive_timeout = -1\n", ["receive_timeout = -1", "positive"]),
        ("[source]\nrecieve_timeout = 5\n", ["'recieve_timeout'", "mean 'receive_timeout'"]),
    ],
)
def test_unknown_or_misplaced_keys_name_the_closest_valid_one(
    db: Database, tmp_path: Path, toml: str, needles: list[str]
) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(toml)
    result = pgcdc(
        "pipeline", "run", "--config", str(config), "-d", db.conninfo(), "--once", cwd=tmp_path
    )
    line = assert_one_line_error(result, *needles)
    assert str(config) in line or "positive" in line
    assert _slots(db) == 0


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        ('[source]\nsnapshot_copy_format = "binary"\n', "snapshot_copy_format = 'binary'"),
        ("[source]\nsnapshot_copy_format = 1\n", "must be a string, not an integer"),
        ('[source]\nsnapshot_format = "text"\n', "did you mean 'snapshot_copy_format'"),
    ],
)
def test_snapshot_copy_format_is_auto_or_text(tmp_path: Path, toml: str, needle: str) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text('[source]\nconninfo = "dbname=x"\n' + toml.removeprefix("[source]\n"))
    with pytest.raises(InvalidOption, match=re.escape(needle)):
        pipeline.load(config, {})
    config.write_text('[source]\nconninfo = "dbname=x"\nsnapshot_copy_format = "text"\n')
    assert pipeline.load(config, {}).snapshot_copy_format == "text"
    assert pipeline.load(None, {"conninfo": "dbname=x"}).snapshot_copy_format == "auto"


@pytest.mark.parametrize(
    ("toml", "needle"),
    [
        (
            '[source]\nconninfo = ["host=db password=hunter2"]\n',
            "conninfo must be a string, not an array",
        ),
        ('[paths]\nstorage_options = "hunter2"\n', "storage_options must be a table, not a string"),
        (
            '[source]\nreceive_timeout = "hunter2"\n',
            "receive_timeout must be a number, not a string",
        ),
        ("[source]\ncreate_slot = 1\n", "create_slot must be true or false, not an integer"),
        ('source = "host=db password=hunter2"\n', "[source] must be a table of keys, not a string"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_not_echoed(
    tmp_path: Path, toml: str, needle: str
) -> None:
    """A value of the wrong type says what the key takes, and is never printed: it may be a
    secret put under the wrong key or in the wrong form."""
    config = tmp_path / "pipeline.toml"
    config.write_text(toml)
    result = pgcdc("pipeline", "run", "--config", str(config), "--once", cwd=tmp_path)
    assert_one_line_error(result, needle)
    assert b"hunter2" not in result.stdout + result.stderr


@pytest.mark.parametrize("value", ["-1", "nan", "true", '"60"'])
def test_stop_timeout_is_seconds_zero_or_more(tmp_path: Path, value: str) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(f'[source]\nconninfo = "dbname=x"\n[spark]\nstop_timeout = {value}\n')
    with pytest.raises(InvalidOption, match="stop_timeout"):
        pipeline.load(config, {})
    config.write_text('[source]\nconninfo = "dbname=x"\n[spark]\nstop_timeout = 0\n')
    assert pipeline.load(config, {}).stop_timeout == 0


@pytest.mark.parametrize("value", ["-1", "1", "2.5", "true", '"200"'])
def test_compact_files_is_a_count_of_two_or_more_or_zero(tmp_path: Path, value: str) -> None:
    config = tmp_path / "pipeline.toml"
    config.write_text(f'[source]\nconninfo = "dbname=x"\n[delta]\ncompact_files = {value}\n')
    with pytest.raises(InvalidOption, match="compact_files"):
        pipeline.load(config, {})
    config.write_text('[source]\nconninfo = "dbname=x"\n')
    assert pipeline.load(config, {}).compact_files == 200
    for count in (0, 50):
        config.write_text(f'[source]\nconninfo = "dbname=x"\n[delta]\ncompact_files = {count}\n')
        settings = pipeline.load(config, {})
        assert settings.pipeline().compact_files == count
