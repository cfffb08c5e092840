"""Named consumers of the change log and their durable acknowledgements.

A consumer acknowledges LSN X when it has durably processed every transaction with
commit_lsn <= X. Segments are released (deleted) only when every registered consumer has
acknowledged all of their transactions, and never the newest segment, which holds the log's
position (what the writer recovers ``last_commit_lsn`` from to drop replayed duplicates).
"""

from __future__ import annotations

import json
import os
import re
import uuid

import pyarrow.fs as pafs

from pgcdc.changelog import segments as fmt
from pgcdc.changelog.reader import segment_info, segment_paths
from pgcdc.errors import CorruptChangeLog, UnknownConsumer, UnloggableInput
from pgcdc.lsn import LSN

CONSUMERS_DIR = "consumers"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


def _check_name(name: str) -> str:
    if not _NAME.match(name):
        raise UnloggableInput(
            f"consumer name {name!r} is not allowed: use 1-128 letters, digits, '_', '.' or '-', "
            "starting with a letter or digit"
        )
    return name


class Consumers:
    """The consumer registry of one change log (``<root>/consumers/<name>.json``)."""

    def __init__(
        self, root: str | os.PathLike[str], *, filesystem: pafs.FileSystem | None = None
    ) -> None:
        self._fs, self._root = fmt.resolve(root, filesystem)
        self._dir = fmt.join(self._root, CONSUMERS_DIR)
        self._local = fmt.is_local(self._fs)

    def _path(self, name: str) -> str:
        return fmt.join(self._dir, f"{_check_name(name)}.json")

    def _write(self, name: str, lsn: LSN) -> None:
        """Replace the consumer's file atomically: a crash leaves the old or the new one."""
        data = json.dumps({"name": name, "acknowledged_lsn": int(lsn)}).encode()
        path = self._path(name)
        temp = f"{path}.{uuid.uuid4().hex}{fmt.TEMP_SUFFIX}"
        if self._local:
            os.makedirs(self._dir, exist_ok=True)
            with open(temp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, path)
            fd = os.open(self._dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elif fmt.puts_whole(self._fs):  # the object appears whole when the PUT returns
            with self._fs.open_output_stream(path) as out:
                out.write(data)
        else:
            self._fs.create_dir(self._dir, recursive=True)
            with self._fs.open_output_stream(temp) as out:
                out.write(data)
            self._fs.move(temp, path)

    def _read(self, path: str) -> tuple[str, LSN]:
        try:
            with self._fs.open_input_stream(path) as f:
                data = json.loads(f.read())
            return str(data["name"]), LSN(data["acknowledged_lsn"])
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptChangeLog(
                f"consumer file {path} is damaged ({exc!r}); re-register the consumer"
            ) from None

    def register(self, name: str, *, acknowledged_lsn: int = 0) -> LSN:
        """Add a consumer (kept if it exists); return its acknowledged LSN.

        A new consumer holds back release until it acknowledges: by default it needs every
        segment still in the log.
        """
        current = self.all().get(_check_name(name))
        if current is not None:
            return current
        self._write(name, LSN(acknowledged_lsn))
        return LSN(acknowledged_lsn)

    def unregister(self, name: str) -> None:
        try:
            self._fs.delete_file(self._path(name))
        except FileNotFoundError:
            raise UnknownConsumer(f"no change log consumer named {name!r}") from None

    def acknowledge(self, name: str, lsn: int) -> LSN:
        """Record that ``name`` processed every transaction with commit_lsn <= ``lsn``.

        Acknowledgements only move forward (a restarted consumer may repeat an older one);
        returns the consumer's acknowledged LSN after the call.
        """
        current = self.all().get(_check_name(name))
        if current is None:
            raise UnknownConsumer(
                f"no change log consumer named {name!r}; register it before acknowledging"
            )
        if lsn <= current:
            return current
        self._write(name, LSN(lsn))
        return LSN(lsn)

    def acknowledged(self, name: str) -> LSN:
        current = self.all().get(_check_name(name))
        if current is None:
            raise UnknownConsumer(f"no change log consumer named {name!r}")
        return current

    def all(self) -> dict[str, LSN]:
        """Every registered consumer and its acknowledged LSN."""
        try:
            infos = self._fs.get_file_info(pafs.FileSelector(self._dir))
        except FileNotFoundError:
            return {}
        found = {}
        for info in infos:
            if info.base_name.endswith(".json"):
                name, lsn = self._read(info.path)
                found[name] = lsn
        return found

    def release(self) -> list[str]:
        """Delete the segments every consumer is past; return their paths.

        Deletes nothing while no consumer is registered: nobody has said the data is safe.
        """
        acknowledged = self.all()
        if not acknowledged:
            return []
        horizon = min(acknowledged.values())
        released = []
        # Never the newest segment: it carries the log's position.
        for path in segment_paths(self._fs, self._root)[:-1]:
            info = segment_info(path, filesystem=self._fs)
            if not info.complete or info.last_commit_lsn > horizon:
                break
            self._fs.delete_file(path)
            released.append(path)
        return released
