"""The processes a test started, found through /proc: a ``pgcdc`` command's own and Spark's,
whose JVM runs in a session of its own (``pgcdc.spark.pipeline._start_jvm_apart``), so a
signal to the command's process group does not reach it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid``, with their command lines."""
    children: dict[int, list[int]] = {}
    commands: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
            commands[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (ValueError, OSError):
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(proc.name))
    found: dict[int, str] = {}
    pending = list(children.get(pid, []))
    while pending:
        at = pending.pop()
        found[at] = commands.get(at, "")
        pending += children.get(at, [])
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def kill_everything(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL a command started with ``start_new_session=True``: its process group and every
    process below it (Spark's JVM and its workers too, which would otherwise end on their own
    a moment later, still writing meanwhile), as a machine's crash would."""
    below = descendants(child.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(child.pid, signal.SIGKILL)
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    child.wait()
