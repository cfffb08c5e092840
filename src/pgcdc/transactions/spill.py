"""Spill files: a large transaction's events on disk until it commits or aborts.

Layout: a shared root (``<tmp>/pgcdc-spill`` unless configured) holds one private directory per
live assembler, ``assembler-XXXX/``, next to a lock file ``assembler-XXXX.lock`` the assembler
holds an exclusive ``flock`` on. A crashed process releases its lock, so the next assembler to
start removes the directories whose lock it can take: a crash leaves files only in that root,
and they are cleaned at the next start.

Format: length-prefixed frames, each a pickled list of tuples, one tuple per event. A ``Table``
is written once per file and referred to by index afterwards (a table's definition is usually
larger than a row). The files are private (mode 0700 directory) and only ever read by the
process that wrote them.

When a spilled transaction is emitted its file is unlinked at once and read through the open
descriptor, so nothing is left behind even if the consumer never closes it; the descriptor is
closed by ``SpilledEvents.close`` or when the object is garbage collected.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import shutil
import stat
import struct
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

from pgcdc.errors import SpillError
from pgcdc.events import Delete, Event, Insert, Relation, Table, Truncate, Update
from pgcdc.lsn import LSN

_LENGTH = struct.Struct("<I")
_READ_CHUNK = 1 << 20
_WRITE_BUFFER = 1 << 16
_FRAME_RECORDS = 256
_FRAME_BYTES = 1 << 20
_PREFIX = "assembler-"
# A lock file younger than this that is unlocked and empty may belong to an assembler that is
# still starting; leave it.
_STARTUP_GRACE_SECONDS = 60.0

# Record tags.
_TABLE, _INSERT, _UPDATE, _DELETE, _TRUNCATE, _RELATION, _OTHER = range(7)


def default_root() -> Path:
    return Path(tempfile.gettempdir()) / "pgcdc-spill"


def clean_stale(root: Path) -> list[Path]:
    """Remove spill directories whose assembler is gone; return what was removed."""
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for lock_path in sorted(root.glob(f"{_PREFIX}*.lock")):
        directory = lock_path.with_suffix("")
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except FileNotFoundError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # its assembler is alive
            info = os.fstat(fd)
            if info.st_size == 0 and time.time() - info.st_mtime < _STARTUP_GRACE_SECONDS:
                continue  # created but not yet locked by a starting assembler
            shutil.rmtree(directory, ignore_errors=True)
            with contextlib.suppress(FileNotFoundError):
                lock_path.unlink()
            removed.append(directory)
        finally:
            os.close(fd)
    for directory in sorted(root.glob(f"{_PREFIX}*")):
        # A directory whose lock file is gone was left between the two removals of a close().
        if directory.is_dir() and not directory.with_suffix(".lock").exists():
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


def check_root(root: Path) -> None:
    """Refuse a spill root another user controls: in a world-writable directory without the
    sticky bit, or one owned by someone else (who pre-created /tmp/pgcdc-spill), that user
    could read, swap or remove the spilled transactions. Root-owned roots (/tmp) are trusted."""
    info = root.stat()
    if info.st_uid not in (os.geteuid(), 0):
        raise SpillError(
            f"the spill directory {root} belongs to another user (uid {info.st_uid}), who could "
            "read or change spilled transactions; set spill_dir to a directory of your own"
        )
    if info.st_mode & stat.S_IWOTH and not info.st_mode & stat.S_ISVTX:
        raise SpillError(
            f"the spill directory {root} is world-writable without the sticky bit, so any user "
            f"could remove or replace spilled transactions; chmod o-w {root} (or chmod +t), or "
            "set spill_dir to a private directory"
        )


class SpillDirectory:
    """One assembler's private spill directory, created on first use, removed on close."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        try:
            self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise SpillError(
                f"cannot create the spill directory {self.root}: {exc}; set spill_dir to a "
                "writable directory"
            ) from exc
        check_root(self.root)
        self.removed_at_start = clean_stale(self.root)
        self._path: Path | None = None
        self._lock_fd: int | None = None
        self._finalizer: weakref.finalize[Any, Any] | None = None

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path, self._lock_fd = self._create()
            self._finalizer = weakref.finalize(self, _remove, self._path, self._lock_fd)
        return self._path

    def _create(self) -> tuple[Path, int]:
        try:
            fd, lock_name = tempfile.mkstemp(prefix=_PREFIX, suffix=".lock", dir=self.root)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, f"{os.getpid()}\n".encode())
            path = Path(lock_name).with_suffix("")
            path.mkdir(mode=0o700)
        except OSError as exc:
            raise SpillError(
                f"cannot create a spill directory in {self.root}: {exc}; set spill_dir to a "
                "writable directory with free space"
            ) from exc
        return path, fd

    def new_file(self) -> SpillWriter:
        return SpillWriter(self.path)

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()
        self._path = None
        self._lock_fd = None
        self._finalizer = None


def _remove(path: Path, lock_fd: int) -> None:
    shutil.rmtree(path, ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        path.with_suffix(".lock").unlink()
    os.close(lock_fd)


class SpillWriter:
    """Appends one transaction's events to a file in a spill directory."""

    def __init__(self, directory: Path) -> None:
        try:
            fd, name = tempfile.mkstemp(suffix=".spill", dir=directory)
        except OSError as exc:
            raise _write_error(directory, exc) from exc
        self.path = Path(name)
        self._file: BinaryIO = os.fdopen(fd, "w+b", buffering=_WRITE_BUFFER)
        self._table_index: dict[int, int] = {}
        self._tables: list[Table] = []  # keeps id()s in _table_index valid
        self._pending: list[tuple[Any, ...]] = []
        self._pending_bytes = 0
        self.count = 0

    def append(self, event: Event, size: int = 0) -> None:
        """Queue an event; records are pickled in frames of up to ``_FRAME_RECORDS`` records or
        ``_FRAME_BYTES`` estimated bytes, since one pickle call per event costs more than the
        event's own bytes."""
        self._pending.append(self._record(event))
        self._pending_bytes += size
        self.count += 1
        if len(self._pending) >= _FRAME_RECORDS or self._pending_bytes >= _FRAME_BYTES:
            self._write_frame()

    def _write_frame(self) -> None:
        if not self._pending:
            return
        data = pickle.dumps(self._pending, protocol=pickle.HIGHEST_PROTOCOL)
        self._pending = []
        self._pending_bytes = 0
        try:
            self._file.write(_LENGTH.pack(len(data)))
            self._file.write(data)
        except OSError as exc:
            raise _write_error(self.path.parent, exc) from exc

    def _table(self, table: Table) -> int:
        index = self._table_index.get(id(table))
        if index is None:
            index = len(self._tables)
            self._tables.append(table)
            self._table_index[id(table)] = index
            self._pending.append((_TABLE, table))
        return index

    def _record(self, event: Event) -> tuple[Any, ...]:
        kind = type(event)
        if kind is Insert:
            assert isinstance(event, Insert)
            return (_INSERT, int(event.lsn), self._table(event.table), event.new, event.xid)
        if kind is Update:
            assert isinstance(event, Update)
            return (
                _UPDATE,
                int(event.lsn),
                self._table(event.table),
                event.new,
                event.old,
                event.old_is_key,
                event.xid,
            )
        if kind is Delete:
            assert isinstance(event, Delete)
            return (
                _DELETE,
                int(event.lsn),
                self._table(event.table),
                event.old,
                event.old_is_key,
                event.xid,
            )
        if kind is Truncate:
            assert isinstance(event, Truncate)
            return (
                _TRUNCATE,
                int(event.lsn),
                tuple(self._table(t) for t in event.tables),
                event.cascade,
                event.restart_identity,
                event.xid,
            )
        if kind is Relation:
            assert isinstance(event, Relation)
            return (_RELATION, int(event.lsn), self._table(event.table), event.xid)
        return (_OTHER, event)

    def finish(
        self,
        *,
        keep: Callable[[Event], bool] | None = None,
        strip_xids: bool = False,
        prefix: tuple[Event, ...] = (),
    ) -> SpilledEvents:
        """Hand the file over for reading; it is unlinked now and lives on as a descriptor."""
        self._write_frame()
        try:
            self._file.flush()
        except OSError as exc:
            raise _write_error(self.path.parent, exc) from exc
        length = self._file.tell()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        return SpilledEvents(self._file, length, keep=keep, strip_xids=strip_xids, prefix=prefix)

    def discard(self) -> None:
        """Drop the events: close and delete the file."""
        with contextlib.suppress(OSError):
            self._file.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def _write_error(directory: Path, exc: OSError) -> SpillError:
    return SpillError(
        f"cannot write a spill file in {directory}: {exc}; free space there, point spill_dir "
        "at a larger disk, or raise max_txn_in_memory / max_reorderbuffer_in_memory"
    )


class SpilledEvents:
    """A spilled transaction's events, read back from disk each time it is iterated.

    ``prefix`` events (already in memory) come first; ``keep`` drops events on the way out
    (those of aborted subtransactions); ``strip_xids`` clears their ``xid`` (include-xids off).
    """

    def __init__(
        self,
        file: BinaryIO,
        length: int,
        *,
        keep: Callable[[Event], bool] | None = None,
        strip_xids: bool = False,
        prefix: tuple[Event, ...] = (),
    ) -> None:
        self._file = file
        self._prefix = prefix
        self._length = length
        self._keep = keep
        self._strip_xids = strip_xids
        self._finalizer = weakref.finalize(self, file.close)

    def close(self) -> None:
        self._finalizer()

    def __enter__(self) -> SpilledEvents:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __iter__(self) -> Iterator[Event]:
        keep = self._keep
        strip = self._strip_xids
        yield from self._prefix
        for event in self._events():
            if keep is None or keep(event):
                yield without_xid(event) if strip else event

    def _events(self) -> Iterator[Event]:
        if not self._finalizer.alive:
            raise SpillError("the spilled transaction was closed; its events are gone")
        fd = self._file.fileno()
        tables: list[Table] = []
        buffer = b""
        offset = 0
        while offset < self._length or buffer:
            if offset < self._length:
                chunk = os.pread(fd, min(_READ_CHUNK, self._length - offset), offset)
                if not chunk:
                    raise SpillError(f"spill file ended at byte {offset} of {self._length}")
                offset += len(chunk)
                buffer += chunk
            position = 0
            while position + _LENGTH.size <= len(buffer):
                (size,) = _LENGTH.unpack_from(buffer, position)
                end = position + _LENGTH.size + size
                if end > len(buffer):
                    break
                records = pickle.loads(buffer[position + _LENGTH.size : end])
                position = end
                for record in records:
                    event = _event(record, tables)
                    if event is not None:
                        yield event
            buffer = buffer[position:]
            if offset >= self._length and buffer:
                raise SpillError(f"spill file has a torn record at its end ({len(buffer)} bytes)")


def without_xid(event: Event) -> Event:
    """The event without its transaction id (include-xids off)."""
    if getattr(event, "xid", None) is None:
        return event
    return replace(event, xid=None)  # type: ignore[arg-type]


def _event(record: tuple[Any, ...], tables: list[Table]) -> Event | None:
    tag = record[0]
    if tag == _INSERT:
        _, lsn, table, new, xid = record
        return Insert(LSN(lsn), tables[table], new, xid)
    if tag == _UPDATE:
        _, lsn, table, new, old, old_is_key, xid = record
        return Update(LSN(lsn), tables[table], new, old, old_is_key, xid)
    if tag == _DELETE:
        _, lsn, table, old, old_is_key, xid = record
        return Delete(LSN(lsn), tables[table], old, old_is_key, xid)
    if tag == _TRUNCATE:
        _, lsn, indexes, cascade, restart, xid = record
        return Truncate(LSN(lsn), tuple(tables[i] for i in indexes), cascade, restart, xid)
    if tag == _RELATION:
        _, lsn, table, xid = record
        return Relation(LSN(lsn), tables[table], xid)
    if tag == _TABLE:
        tables.append(record[1])
        return None
    if tag == _OTHER:
        event: Event = record[1]
        return event
    raise SpillError(f"spill file holds an unknown record tag {tag!r}")
