"""What the ``pgcdc`` command's process holds besides its own work."""

from __future__ import annotations

import os
import subprocess
import sys

# The threads of a process that imported what the command's receiver imports (numpy among them).
_THREADS = (
    "import os, pgcdc.cli.main, pgcdc.changelog.writer, numpy; "
    "print(len(os.listdir('/proc/self/task')))"
)


def _threads(**env: str) -> int:
    base = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    shown = subprocess.run(
        [sys.executable, "-c", _THREADS],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    return int(shown.stdout)


def test_the_command_starts_no_openblas_threads() -> None:
    """They would spin on a core the receiver needs; a user's own setting is kept."""
    assert _threads() == _threads(OPENBLAS_NUM_THREADS="1")
    if (os.cpu_count() or 1) > 1:
        assert _threads(OPENBLAS_NUM_THREADS="2") > _threads()
