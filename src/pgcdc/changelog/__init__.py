"""The durable change log: append-only segments of committed transactions.

``ChangeLogWriter`` appends and makes transactions durable (``flush()`` returns the end LSN the
receiver may confirm); ``ChangeLog`` lists and reads segments, restores transactions and tracks
consumer acknowledgements so that segments every consumer is past can be released. The file
format is described in ``pgcdc.changelog.segments``, the row schema in ``pgcdc.changelog.codec``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from pgcdc.changelog import segments as _fmt
from pgcdc.changelog.codec import SCHEMA, LogState, decode, encode
from pgcdc.changelog.consumers import Consumers
from pgcdc.changelog.reader import (
    SegmentInfo,
    read_segment,
    read_transactions,
    segment_info,
    segment_paths,
    state_at,
)
from pgcdc.changelog.writer import ChangeLogWriter
from pgcdc.lsn import LSN
from pgcdc.storage import StorageOptions
from pgcdc.transactions import CommittedTransaction


class ChangeLog:
    """A change log at a local path, a URI (reached with ``storage``'s settings, else the
    environment's) or a path on a given ``pyarrow.fs.FileSystem``."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        filesystem: pafs.FileSystem | None = None,
        storage: StorageOptions | None = None,
    ) -> None:
        self.filesystem, self.root = _fmt.resolve(root, filesystem, storage)
        self.consumers = Consumers(self.root, filesystem=self.filesystem)
        self._uri = os.fspath(root) if filesystem is None else None
        self.storage = storage

    def writer(self, **options: Any) -> ChangeLogWriter:
        """Open the log for appending (recovering a torn tail); see ``ChangeLogWriter``."""
        if self._uri is not None:  # the writer resolves the URI itself, to lease it
            return ChangeLogWriter(self._uri, storage=self.storage, **options)
        return ChangeLogWriter(self.root, filesystem=self.filesystem, **options)

    def segments(self) -> list[SegmentInfo]:
        """Every segment holding at least one transaction, oldest first."""
        infos = (
            segment_info(p, filesystem=self.filesystem)
            for p in segment_paths(self.filesystem, self.root)
        )
        return [i for i in infos if i.first_commit_lsn is not None]

    def last_commit_lsn(self) -> LSN:
        """The commit LSN of the newest transaction in the log (LSN 0 when it holds none)."""
        segments = self.segments()
        return segments[-1].last_commit_lsn if segments else LSN(0)

    def read_segment(
        self, path: str, from_lsn: int | None = None, to_lsn: int | None = None
    ) -> Iterator[pa.RecordBatch]:
        return read_segment(path, from_lsn, to_lsn, filesystem=self.filesystem)

    def read_transactions(
        self, from_lsn: int | None = None, to_lsn: int | None = None
    ) -> Iterator[CommittedTransaction]:
        return read_transactions(self.root, from_lsn, to_lsn, filesystem=self.filesystem)

    def state_at(self, segment: SegmentInfo | str) -> LogState:
        path = segment.path if isinstance(segment, SegmentInfo) else segment
        return state_at(path, filesystem=self.filesystem)

    def register_consumer(self, name: str, *, acknowledged_lsn: int = 0) -> LSN:
        return self.consumers.register(name, acknowledged_lsn=acknowledged_lsn)

    def acknowledge(self, consumer: str, lsn: int) -> LSN:
        return self.consumers.acknowledge(consumer, lsn)

    def release(self) -> list[str]:
        return self.consumers.release()


__all__ = [
    "SCHEMA",
    "ChangeLog",
    "ChangeLogWriter",
    "Consumers",
    "LogState",
    "SegmentInfo",
    "decode",
    "encode",
    "read_segment",
    "read_transactions",
    "segment_info",
    "state_at",
]
