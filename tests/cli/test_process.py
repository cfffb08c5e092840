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

# The memory pool Arrow allocates from in a process that imported the command's modules.
_POOL = "import pgcdc.cli.main, pyarrow; print(pyarrow.default_memory_pool().backend_name)"
_CHOSEN = ("OPENBLAS_NUM_THREADS", "ARROW_DEFAULT_MEMORY_POOL")


def _threads(**env: str) -> int:
    return int(_run(_THREADS, **env))


def _run(code: str, **env: str) -> str:
    """What ``code`` prints, run with this environment less the settings pgcdc chooses."""
    base = {k: v for k, v in os.environ.items() if k not in _CHOSEN}
    shown = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr
    return shown.stdout.strip()


def test_the_command_starts_no_openblas_threads() -> None:
    """They would spin on a core the receiver needs; a user's own setting is kept."""
    assert _threads() == _threads(OPENBLAS_NUM_THREADS="1")
    if (os.cpu_count() or 1) > 1:
        assert _threads(OPENBLAS_NUM_THREADS="2") > _threads()


def test_the_command_allocates_arrow_buffers_with_malloc() -> None:
    """Arrow's default pool (mimalloc) faulted fresh pages in for every change log frame; a
    user's own choice is kept."""
    assert _run(_POOL) == "system"
    assert _run(_POOL, ARROW_DEFAULT_MEMORY_POOL="mimalloc") == "mimalloc"
