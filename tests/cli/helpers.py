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
