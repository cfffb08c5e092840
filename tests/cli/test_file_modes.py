"""What pgcdc writes is private by default: after ``pipeline run --once`` under umask 022, no
file or directory of the change log, consumer state, lake or checkpoint has group or other
bits; ``--umask`` opens it up on purpose. A spill root another user controls is refused."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from pgcdc.errors import SpillError
from pgcdc.sinks import SinkKind, read_table
from pgcdc.transactions.spill import SpillDirectory
from tests.cli.helpers import pgcdc
from tests.conftest import Database
from tests.spark.helpers import sort_rows


def _modes(root: Path) -> dict[Path, int]:
    paths = [root, *root.rglob("*")]
    return {path: stat.S_IMODE(path.lstat().st_mode) for path in paths if not path.is_symlink()}


def _run(db: Database, work: Path, *extra: str) -> None:
    result = pgcdc(
        "pipeline", "run", "-d", db.conninfo(), "--slot", "modes", "--publication", "cdc",
        "--kinds", "changelog,mirror", "--master", "local[1]", "--once",
        "--changelog", str(work / "log"), "--lake", str(work / "lake"),
        "--checkpoint", str(work / "checkpoint"), *extra,
        cwd=work, timeout=400, umask=0o022,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr.decode()[-3000:]


# One server version (suite time): the files are pgcdc's, the same against either server.
@pytest.mark.parametrize("cluster", ["pg18"], indirect=True)
def test_pipeline_files_are_private_unless_configured(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE items (id int PRIMARY KEY, body text)")
    db.execute("INSERT INTO items SELECT g, 'row ' || g FROM generate_series(1, 100) g")
    db.execute("CREATE PUBLICATION cdc FOR TABLE items")
    private = tmp_path / "private"
    private.mkdir()
    _run(db, private)
    db.execute("UPDATE items SET body = body || '!' WHERE id % 2 = 0")
    _run(db, private)

    with db.connect() as conn:
        expected = sort_rows(
            [{"id": r[0], "body": r[1]} for r in conn.execute("SELECT id, body FROM items")]
        )
    mirror = read_table(private / "lake" / "public" / "items" / SinkKind.MIRROR.value)
    assert sort_rows(mirror.select(["id", "body"]).to_pylist()) == expected

    for part in ("log", "lake", "checkpoint"):
        modes = _modes(private / part)
        assert len(modes) > 2, part
        assert any(p.name.endswith(".json") for p in modes) or part != "lake"
        leaky = {str(p): oct(m) for p, m in modes.items() if m & 0o077}
        assert leaky == {}, part

    db.execute("SELECT pg_drop_replication_slot('modes')")
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    _run(db, shared, "--umask", "027")
    for part in ("log", "lake", "checkpoint"):
        modes = _modes(shared / part)
        assert {str(p): oct(m) for p, m in modes.items() if m & 0o007} == {}, part
        assert any(m & 0o040 for m in modes.values()), part  # the group may read


def test_a_bad_umask_is_a_typed_error(db: Database, tmp_path: Path) -> None:
    result = pgcdc("pipeline", "run", "-d", db.conninfo(), "--umask", "999", "--once")
    assert result.returncode == 1
    assert result.stderr.decode().splitlines()[-1].startswith("pgcdc: error: umask = '999'")


def test_a_spill_root_another_user_controls_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("giving a directory to another user needs root")
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 65534, 65534)
    with pytest.raises(SpillError, match="another user"):
        SpillDirectory(foreign)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    with pytest.raises(SpillError, match="sticky"):
        SpillDirectory(open_dir)
    open_dir.chmod(0o1777)  # as /tmp: others cannot remove what is ours
    spill = SpillDirectory(open_dir)
    spill.new_file().discard()
    assert stat.S_IMODE(spill.path.stat().st_mode) == 0o700
    spill.close()
