"""Running the pgcdc command as a subprocess, as users run it."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

CLI = [sys.executable, "-m", "pgcdc.cli.main"]


def pgcdc(*args: str, timeout: float = 120, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """Run ``pgcdc ARGS``; stdout and stderr captured as bytes."""
    return subprocess.run(
        [*CLI, *args], capture_output=True, timeout=timeout, check=False, **kwargs
    )


def current_lsn(db: Any) -> str:
    return str(db.scalar("SELECT pg_current_wal_lsn()::text"))


def assert_one_line_error(result: subprocess.CompletedProcess[bytes], *needles: str) -> str:
    """Exit 1, no traceback, and exactly one "pgcdc: error: ..." line, the last, holding every
    needle; returns that line. (Lines before it may be progress, or Spark's start-up log.)"""
    text = result.stderr.decode()
    assert result.returncode == 1, text
    assert "Traceback" not in text, text
    lines = text.splitlines()
    errors = [line for line in lines if line.startswith("pgcdc: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], text
    for needle in needles:
        assert needle in errors[0], text
    return errors[0]
