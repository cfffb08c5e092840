"""The compiled build (mypyc, ``setup.py``) is the source's program: same change log, same errors.

``pgcdc._native.COMPILED_MODULES`` are compiled from their source, which stays the reference. CI
runs the suite on the compiled build (what ``pip install`` gives users); these tests check that
it is the one running there, that the source runs when asked or when the build is stale, and that
both log the same bytes' worth of rows for the same WAL, run as users run the command.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc import _native
from pgcdc.decoding.pgoutput import PgOutputOptions
from pgcdc.errors import InvalidOption
from pgcdc.receiver import ReceiverOptions
from tests.changelog.helpers import log_rows
from tests.cli.helpers import current_lsn, pgcdc
from tests.conftest import Database
from tests.oracle.specs import tables as oracle_tables
from tests.oracle.workload import Workload, create_schema

requires_build = pytest.mark.skipif(
    not _native.compiled(),
    reason="no compiled build here (PGCDC_PURE_PYTHON set, or not built with setup.py)",
)


def _source_env() -> dict[str, str]:
    return {**os.environ, _native.PURE_PYTHON_ENV: "1"}


def _build_of(env: dict[str, str], path: str | None = None) -> str:
    """Which build a fresh interpreter runs under ``env`` (``path``: on PYTHONPATH), and what
    it warned on stderr."""
    if path is not None:
        env = {**env, "PYTHONPATH": path}
    result = subprocess.run(
        [sys.executable, "-W", "always", "-c",
         "from pgcdc import _native; print('compiled' if _native.compiled() else 'source')"],
        capture_output=True, text=True, env=env, check=True, timeout=60,
    )  # fmt: skip
    return result.stdout.strip() + "\n" + result.stderr


def test_ci_runs_the_compiled_build() -> None:
    """CI tests what users install: a build that failed to compile would otherwise leave the
    whole suite running the source, unnoticed."""
    if not os.environ.get("CI"):
        pytest.skip("checked in CI (CI=true), where scripts/setup must have compiled the build")
    assert _native.compiled(), "CI runs the source: scripts/setup built no compiled modules"
    assert not _native.stale_modules()


@requires_build
def test_pure_python_runs_the_source() -> None:
    assert _build_of(_source_env()).startswith("source\n")
    assert _build_of(dict(os.environ)).startswith("compiled\n")


@requires_build
def test_a_stale_build_runs_the_source_and_says_so(tmp_path: Path) -> None:
    """In a source checkout, a compiled module older than its source (edited, or another commit
    checked out) is not run: the whole group runs from source, with a warning to rebuild."""
    src = Path(_native.__file__).resolve().parent.parent
    copy = tmp_path / "checkout"
    shutil.copytree(src, copy / "src", ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "setup.py").write_text("# a source checkout\n")
    assert _build_of(dict(os.environ), str(copy / "src")).startswith("compiled\n")
    edited = copy / "src" / "pgcdc" / "changelog" / "codec.py"
    built = os.stat(next(edited.parent.glob("codec.*.so")))
    os.utime(edited, (built.st_atime, built.st_mtime + 10))
    said = _build_of(dict(os.environ), str(copy / "src"))
    assert said.startswith("source\n"), said
    assert "pgcdc.changelog.codec changed after the compiled build" in said


@requires_build
@pytest.mark.parametrize("binary", [False, True], ids=["text", "binary"])
def test_source_and_build_log_the_same_rows(db: Database, tmp_path: Path, binary: bool) -> None:
    """The oracle's random workload (every core type's edge values, TOAST, ADD/DROP COLUMN,
    streamed and prepared transactions) drained by the ``pgcdc`` command from two slots, once
    on each build: the two change logs hold the same rows, column for column."""
    tables = oracle_tables()
    with db.connect() as conn:
        create_schema(conn, tables, db.major)
        conn.execute("CREATE PUBLICATION pub FOR ALL TABLES")
        for slot in ("source", "build"):
            conn.execute(
                "SELECT pg_create_logical_replication_slot(%s, 'pgoutput', false, true)", (slot,)
            )
    with db.connect() as a, db.connect() as b:
        workload = Workload(
            random.Random(20 + db.major),
            (a, b),
            tables,
            db.major,
            on_add_column=lambda ddl: None,
            on_drop_column=lambda ddl: None,
        )
        workload.run(150, 200)
    end = current_lsn(db)
    # Decoding spills and streams at the walsender's setting: small, so big transactions stream.
    conninfo = db.conninfo(options="-c logical_decoding_work_mem=64kB")
    for slot, env in (("source", _source_env()), ("build", dict(os.environ))):
        result = pgcdc(
            "-d", conninfo, "-S", slot, "--start", "--publication", "pub",
            "--format", "changelog", "--log", str(tmp_path / slot), "-E", end, "--no-loop",
            *(["-o", "binary=true"] if binary else []), env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr.decode()
    from_source, from_build = log_rows(tmp_path / "source"), log_rows(tmp_path / "build")
    assert from_source.num_rows > 1000
    assert from_build.equals(from_source)


def test_options_take_what_callers_pass() -> None:
    """Options classes check and normalise their arguments in ``__post_init__``; the compiled
    build keeps them plain classes, so a list is taken there (a native class would refuse it
    before the check) and a wrong type gets the typed error, not a TypeError."""
    options = ReceiverOptions("dbname=x", "s", publications=["p"])  # type: ignore[arg-type]
    assert options.publications == ("p",)
    assert PgOutputOptions(["p"]).publication_names == ("p",)
    settings: dict[str, object] = {"TimeZone": 1}
    with pytest.raises(InvalidOption, match="must be a string"):
        ReceiverOptions("dbname=x", "s", publications=("p",), session_settings=settings)  # type: ignore[arg-type]
