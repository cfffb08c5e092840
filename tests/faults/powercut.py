"""A simulated power cut for the change log: only what was fsync'd survives.

A process killed by SIGKILL keeps its writes (the page cache survives it), so a crash test
cannot tell whether fsyncs happen. ``install(shadow, root, cut)`` wraps ``os.fsync`` in the
process under test: after each real fsync of a file under ``root`` it records the file's
contents (by inode) in ``shadow``, and after each fsync of ``root`` itself the directory's
entries (name -> inode); at the fsync numbered ``cut`` (counting those under ``root``, from
1) it SIGKILLs the process just before syncing. ``roll_back(shadow, root)`` then puts
``root`` back into the state a power cut would leave: only the names present at the last
directory fsync, each holding its contents as of its inode's last fsync (empty if it never
had one), sometimes followed by part of what was written after it. The recording happens
before the wrapped fsync returns, so anything the process does after an fsync (such as
confirming to the server) happens after its durable state is recorded.

``fail_fsync(shadow, root, failing, code)`` models a failed fsync instead ("fsyncgate"): the
fsync numbered ``failing`` of a regular file under ``root`` rolls that file back to its
contents at its last good fsync (Linux may drop the dirty pages of a failed writeback) and
raises ``OSError(code)``; the process runs on, and later fsyncs succeed.

Only ``root``'s own entries are modelled (not subdirectories): the receiver's change log has
no consumers here.
"""

from __future__ import annotations

import json
import os
import random
import signal
import stat
from collections.abc import Callable
from pathlib import Path

_real_fsync = os.fsync


def _replace(path: Path, data: bytes) -> None:
    temp = path.with_name(path.name + ".part")
    temp.write_bytes(data)
    os.replace(temp, path)  # atomic, so a SIGKILL leaves the old or the new record


def _record_dir(shadow: Path, root: str) -> None:
    entries = {}
    for name in os.listdir(root):
        info = os.lstat(os.path.join(root, name))
        if stat.S_ISREG(info.st_mode):
            entries[name] = info.st_ino
    _replace(shadow / "entries.json", json.dumps(entries).encode())


def _record_file(shadow: Path, fd: int, inode: int) -> None:
    with open(f"/proc/self/fd/{fd}", "rb") as f:  # the same inode, even if write-only
        _replace(shadow / f"inode-{inode}", f.read())


def baseline(shadow: Path, root: str) -> None:
    """Everything in ``root`` when the process starts is durable (it was restored so)."""
    shadow.mkdir(parents=True, exist_ok=True)
    for old in shadow.iterdir():
        old.unlink()
    os.makedirs(root, exist_ok=True)
    for name in os.listdir(root):
        path = os.path.join(root, name)
        info = os.lstat(path)
        if stat.S_ISREG(info.st_mode):
            _replace(shadow / f"inode-{info.st_ino}", Path(path).read_bytes())
    _record_dir(shadow, root)


def _wrap_fsync(
    shadow: Path, root: str, before: Callable[[int, int, os.stat_result], None]
) -> None:
    """Replace ``os.fsync``: ``before(number, fd, stat)`` runs before each fsync under ``root``
    (numbered from 1) and may end it; each one that succeeds is recorded in ``shadow``."""
    baseline(shadow, root)
    count = 0

    def fsync(fd: int) -> None:  # the writer passes file descriptors
        nonlocal count
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path != root and os.path.dirname(path) != root:
            _real_fsync(fd)
            return
        count += 1
        info = os.fstat(fd)
        before(count, fd, info)
        _real_fsync(fd)
        if stat.S_ISDIR(info.st_mode):
            _record_dir(shadow, root)
        else:
            _record_file(shadow, fd, info.st_ino)

    os.fsync = fsync  # type: ignore[assignment]


def install(shadow: Path, root: str, cut: int | None) -> None:
    def power_cut(number: int, fd: int, info: os.stat_result) -> None:
        if number == cut:
            os.kill(os.getpid(), signal.SIGKILL)

    _wrap_fsync(shadow, os.path.abspath(root), power_cut)


def fail_fsync(shadow: Path, root: str, failing: int, code: int) -> None:
    files = 0

    def lose_unsynced(number: int, fd: int, info: os.stat_result) -> None:
        nonlocal files
        if stat.S_ISDIR(info.st_mode):
            return
        files += 1
        if files != failing:
            return
        saved = shadow / f"inode-{info.st_ino}"
        durable = saved.read_bytes() if saved.exists() else b""
        os.ftruncate(fd, 0)
        os.pwrite(fd, durable, 0)
        raise OSError(code, os.strerror(code))

    _wrap_fsync(shadow, os.path.abspath(root), lose_unsynced)


def roll_back(shadow: Path, root: Path, rng: random.Random) -> list[str]:
    """Leave ``root`` as the power cut would; return the names that survived.

    Writes after a file's last fsync may also have reached the disk in part: half the time a
    random prefix of them is kept (a torn tail for the writer to recover)."""
    entries: dict[str, int] = json.loads((shadow / "entries.json").read_text())
    contents = {}
    for name, inode in entries.items():
        saved = shadow / f"inode-{inode}"
        durable = saved.read_bytes() if saved.exists() else b""
        current = root / name
        if current.exists() and current.stat().st_ino == inode and rng.random() < 0.5:
            written = current.read_bytes()
            if written.startswith(durable):
                durable = written[: rng.randint(len(durable), len(written))]
        contents[name] = durable
    for path in root.iterdir():
        assert path.is_file(), f"{path}: only the log's own files are modelled"
        path.unlink()
    for name, data in contents.items():
        (root / name).write_bytes(data)
    return sorted(contents)
