"""Appending committed transactions to the change log, durably.

Local files: the active segment is appended to and fsync'd by ``flush()``, which then records
the durable end in ``durable.mark``. On open every segment is verified. A torn tail (a crash
mid-write: bad bytes at the end of the active segment, past the recorded durable end, with no
valid frame after them) is copied aside to ``<segment>.torn-<offset>`` and cut, so the log is
always a prefix of what was appended, made of whole transactions. A failed fsync ends the
writer (``ChangeLogError``): the kernel may have dropped what it could not write, so nothing
is reported durable after it. Any other bad frame is damage
to data that may already be confirmed to the server: opening raises ``CorruptChangeLog`` naming
the file and offset, and cuts nothing.

Other pyarrow filesystems (object stores cannot append, truncate or fsync): each ``flush()``
(or roll) completes one immutable segment. On S3 and GCS it is put under its final name: the
object appears whole when the upload completes (a PUT, or the completion of a multipart
upload, is atomic and durable when it returns) and not before, and ``flush()`` returns the
LSN to confirm only after that. Elsewhere it is written to a temporary name and then moved
into place. The trade-off: every flush makes a new object, so flush in batches (e.g. every
few seconds), not per transaction; a crash loses only what was not flushed, and leaves at
most a temporary object (deleted on the next open) or an unfinished multipart upload (which
the bucket's lifecycle rule should abort). On ``s3://`` only one writer runs at a time: it
holds a lease (``pgcdc.changelog.lease``); other object stores have no writer lock: run one
writer per log.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import IO, Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from pgcdc.changelog import segments as fmt
from pgcdc.changelog.codec import BatchBuilder, LogState, decode_rows, holds_type_rows
from pgcdc.changelog.lease import DEFAULT_LEASE_SECONDS, WriterLease
from pgcdc.errors import ChangeLogError, ChangeLogLocked, CorruptChangeLog, storage_error
from pgcdc.events import Event, Relation, Type
from pgcdc.lsn import LSN
from pgcdc.storage import StorageOptions, is_s3
from pgcdc.transactions import CommittedTransaction

log = logging.getLogger(__name__)

LOCK_NAME: Final = "writer.lock"


def _fsync_dir(path: str, sync: Callable[[int], None] | None = None) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        (sync or os.fsync)(fd)
    finally:
        os.close(fd)


def damaged(path: str, scan: fmt.Scan) -> CorruptChangeLog:
    """The error for a bad frame that cannot be a torn tail (``scan.damage`` is set)."""
    return CorruptChangeLog(
        f"{path}: damaged at offset {scan.bad_offset} ({scan.problem}), where no crash can "
        f"have torn it ({scan.damage}). The changes from there on were durable and may be "
        "confirmed to the server, so they cannot be read from the slot again: restore the "
        "file from a backup, or start a new log from a new snapshot. Nothing was cut."
    )


def _verify_sealed(fs: pafs.FileSystem, path: str) -> None:
    """Check every frame of a segment before the newest: each was sealed and fsync'd whole."""
    with fs.open_input_file(path) as f:
        scan = fmt.scan(f, f.size(), path, verify=True)
    if scan.damage is not None:
        raise damaged(path, scan)
    if scan.problem is not None or not scan.sealed:
        raise CorruptChangeLog(
            f"{path}: damaged at offset {scan.valid_end} "
            f"({scan.problem or 'no seal, but a newer segment follows it'}); restore the file "
            "from a backup, or start a new log from a new snapshot. Nothing was cut."
        )


# Events that set definitions a reader needs (tracked in the segment header state).
_DEFINITIONS: Final = frozenset((Relation, Type))


class ChangeLogWriter:
    """The single appender of a change log. Use as a context manager, or call ``close()``."""

    # Every row is checked when a frame is built, before it is written (see TransactionSink),
    # and RowRuns are logged row by row as their bytes.
    accepts_row_runs = True

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        filesystem: pafs.FileSystem | None = None,
        storage: StorageOptions | None = None,
        lease_seconds: float = DEFAULT_LEASE_SECONDS,
        lease_wait: bool = False,
        segment_bytes: int = 256 << 20,
        frame_bytes: int = 4 << 20,
        compression: str | None = "zstd",
    ) -> None:
        self._fs, self._root = fmt.resolve(root, filesystem, storage)
        self._local = fmt.is_local(self._fs)
        self._puts_whole = fmt.puts_whole(self._fs)
        self._lease: WriterLease | None = None
        uri = os.fspath(root)
        if filesystem is None and is_s3(uri):
            self._lease = WriterLease(uri, storage, seconds=lease_seconds)
        elif not self._local:
            log.warning("change log %s: no writer lease on this filesystem, run one writer", uri)
        self._segment_bytes = segment_bytes
        self._frame_bytes = frame_bytes
        self._compression = compression
        self._builder = BatchBuilder()
        self._buffer_bytes = 0
        self._state = LogState()
        self._next_state = LogState()
        # Last appended complete transaction; last one written in a FINAL frame; last durable.
        self._done = (LSN(0), LSN(0))
        self._written = (LSN(0), LSN(0))
        self._durable = (LSN(0), LSN(0))
        self._group_first: LSN | None = None
        self._lock: IO[bytes] | None = None
        self._mark_fd: int | None = None
        # The open segment: a local file (on other filesystems, a local temporary file that
        # is uploaded whole when the segment is finished).
        self._file: Any = None
        self._segment_path: str | None = None
        self._segment_size = 0
        self._segment_first_lsn: LSN | None = None
        self._closed = False
        # Set by a failed fsync: what was written since the last good one may be gone from the
        # page cache while a retried fsync succeeds ("fsyncgate"), so nothing is durable after.
        self._sync_failed: ChangeLogError | None = None
        if self._lease is not None:
            self._lease.acquire(wait=lease_wait)
        try:
            self._open()
        except BaseException:
            if self._lease is not None:
                self._lease.release()
            raise

    # --- positions ---------------------------------------------------------------------------

    @property
    def last_commit_lsn(self) -> LSN:
        """Commit LSN of the last transaction appended (recovered from the log on open)."""
        return self._done[0]

    @property
    def durable_lsn(self) -> LSN:
        """End LSN of the last transaction known to be on stable storage."""
        return self._durable[1]

    @property
    def durable_commit_lsn(self) -> LSN:
        return self._durable[0]

    # --- opening and recovery ----------------------------------------------------------------

    def _open(self) -> None:
        if self._local:
            os.makedirs(self._root, exist_ok=True)
            lock = open(fmt.join(self._root, LOCK_NAME), "ab")  # noqa: SIM115
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                lock.close()
                raise ChangeLogLocked(
                    f"another process is writing the change log at {self._root}; stop it "
                    "first (only one writer may append to a log)"
                ) from None
            self._lock = lock
        else:
            self._fs.create_dir(self._root, recursive=True)
        names = []
        for info in self._fs.get_file_info(pafs.FileSelector(self._root)):
            if info.base_name.endswith(fmt.TEMP_SUFFIX):
                self._fs.delete_file(info.path)  # an unfinished segment of a crashed writer
            elif fmt.SEGMENT_NAME.match(info.base_name):
                names.append(info.base_name)
        names.sort()
        mark = fmt.read_mark(self._fs, self._root)
        if mark is not None and (not names or mark.segment > names[-1]):
            raise CorruptChangeLog(
                f"{fmt.join(self._root, mark.segment)} is missing, but the change log recorded "
                f"it as durable up to offset {mark.offset} (end LSN {mark.end_lsn}): its changes "
                "may be confirmed to the server and cannot be read from the slot again; restore "
                "the file from a backup, or start a new log from a new snapshot"
            )
        if not names:
            return
        if self._local:  # an object store's segments were written whole, then moved in place
            for name in names[:-1]:
                _verify_sealed(self._fs, fmt.join(self._root, name))
        path = fmt.join(self._root, names[-1])
        if self._local:
            durable_end = mark.offset if mark is not None and mark.segment == names[-1] else 0
            self._recover_local(path, durable_end)
        else:
            with self._fs.open_input_file(path) as f:
                scan = fmt.scan(f, f.size(), path, verify=True)
                if scan.problem is not None or not scan.sealed:
                    raise CorruptChangeLog(
                        f"{path}: an immutable segment is damaged ({scan.problem or 'no seal'})"
                    )
                self._load_state(scan, f, path)
            self._next_state = self._state.copy()
        position = (self._last_scan.last_commit_lsn, self._last_scan.end_lsn)
        self._done = self._written = self._durable = position

    def _recover_local(self, path: str, durable_end: int) -> None:
        with open(path, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            scan = fmt.scan(f, size, path, verify=True, durable_end=durable_end)
            if scan.damage is not None:
                raise damaged(path, scan)
            if scan.valid_end < size:
                f.seek(scan.valid_end)
                tail = f.read()
                aside = f"{path}.torn-{scan.valid_end}"
                with open(aside, "wb") as out:
                    out.write(tail)
                    out.flush()
                    os.fsync(out.fileno())
                log.warning(
                    "change log %s: cut %d bytes at offset %d (%s); they are kept in %s",
                    path,
                    size - scan.valid_end,
                    scan.valid_end,
                    scan.problem,
                    aside,
                )
                f.truncate(scan.valid_end)
                f.flush()
                os.fsync(f.fileno())
                _fsync_dir(self._root)
            self._load_state(scan, f, path)
        if scan.sealed:
            self._next_state = self._state.copy()
        else:
            self._file = open(path, "r+b")  # noqa: SIM115
            self._file.seek(scan.valid_end)
            self._segment_path = path
            self._segment_size = scan.valid_end
            self._segment_first_lsn = scan.first_commit_lsn

    def _load_state(self, scan: fmt.Scan, file: Any, path: str) -> None:
        """The state at the end of the last segment: its header's plus its definitions."""
        self._last_scan = scan
        state = scan.header.state.copy()
        for ref in scan.frames:
            if not ref.header.rows:
                continue
            file.seek(ref.offset + fmt.FRAME_HEADER_SIZE)
            payload = pa.py_buffer(file.read(ref.header.length))
            for batch in fmt.decode_payload(payload, path):
                kinds = batch.column("kind").cast(pa.string())
                chosen = batch.filter(pc.is_in(kinds, pa.array(["relation", "type"])))
                for row in decode_rows(chosen):
                    if row.event is not None:
                        state.observe(row.event)
        self._state = state
        self._next_state = scan.header.state.copy()

    # --- appending ---------------------------------------------------------------------------

    def append(self, txn: CommittedTransaction) -> bool:
        """Log ``txn``; False (and nothing logged) when its commit LSN is not past the log's.

        ``txn.events`` is consumed once, as an iterator, so a transaction spilled to disk is
        streamed into frames without being held in memory. If it raises, nothing of ``txn``
        stays in the log and the error propagates.
        """
        self._check_open()
        if txn.commit_lsn <= self._done[0]:
            return False
        events = txn.events
        if (type(events) is tuple or type(events) is list) and events:
            # Most transactions are small and fit in the frame being filled: one ``add_run``
            # takes them whole, without the frame-cutting machinery of ``_append_cut``.
            builder = self._builder
            start_rows = builder.rows
            definitions: list[Event] = []
            try:
                size, end, seq = builder.add_run(
                    txn,
                    events,
                    0,
                    0,
                    room=self._frame_bytes - self._buffer_bytes,
                    definitions=definitions,
                )
            except BaseException:
                self._abandon(start_rows, None, self._segment_first_lsn)
                raise
            self._buffer_bytes += size
            if end == len(events) and self._buffer_bytes < self._frame_bytes:
                self._appended(txn, definitions)
                return True
            return self._append_cut(txn, start_rows, definitions, end, seq)
        return self._append_cut(txn, self._builder.rows, [], 0, 0)

    def _append_cut(
        self,
        txn: CommittedTransaction,
        start_rows: int,
        definitions: list[Event],
        added: int,
        seq: int,
    ) -> bool:
        """``append`` for a transaction that fills frames (large, or crossing the frame being
        filled) or arrives as an iterator: its events go in until a frame is full, which is
        then written; ``added`` events (at positions up to ``seq``) are already in."""
        spilled_from: int | None = None
        first_before = self._segment_first_lsn
        builder = self._builder
        frame_bytes = self._frame_bytes
        taken = 0
        try:
            for count in self._add_events(txn, definitions, added, seq):
                taken += count
                if self._buffer_bytes < frame_bytes:
                    continue
                batch = builder.build()
                self._buffer_bytes = 0
                if spilled_from is None:
                    # The first frame of a large transaction: first write the complete ones.
                    if self._done > self._written:
                        self._write_batch(
                            batch.slice(0, start_rows), fmt.FINAL, self._group_first, *self._done
                        )
                        self._written = self._done
                        self._group_first = None
                    self._ensure_segment()
                    spilled_from = self._segment_size
                    first_before = self._segment_first_lsn
                    batch = batch.slice(start_rows)
                    start_rows = 0
                self._write_batch(batch, 0, txn.commit_lsn, txn.commit_lsn, txn.end_lsn)
            if taken == 0:
                self._buffer_bytes += builder.add(txn, 0, None)
        except BaseException:
            self._abandon(start_rows, spilled_from, first_before)
            raise
        self._appended(txn, definitions)
        return True

    def _appended(self, txn: CommittedTransaction, definitions: list[Event]) -> None:
        """``txn`` is wholly in the builder or written: it becomes the log's last."""
        for event in definitions:
            self._state.observe(event)
        if self._group_first is None:
            self._group_first = txn.commit_lsn
        self._done = (txn.commit_lsn, txn.end_lsn)
        if self._segment_size + self._buffer_bytes >= self._segment_bytes:
            self._finish_segment()

    def _add_events(
        self, txn: CommittedTransaction, definitions: list[Event], added: int, seq: int
    ) -> Iterator[int]:
        """Add ``txn``'s events to the builder, yielding how many went in each time the
        buffer grew, so ``append`` can cut a frame once it reaches ``frame_bytes``. The first
        ``added`` events (positions below ``seq``) are already in: they are yielded first.

        Events already in memory (a tuple or list) go in runs (``BatchBuilder.add_run``
        stops at the event that fills the frame); events streamed from a spill file one at a
        time, so only one of them is held at once."""
        builder = self._builder
        events = txn.events
        if added:
            yield added
        if type(events) is tuple or type(events) is list:
            position, count = added, len(events)
            while position < count:
                room = self._frame_bytes - self._buffer_bytes
                size, end, seq = builder.add_run(
                    txn, events, position, seq, room=room, definitions=definitions
                )
                self._buffer_bytes += size
                yield end - position
                position = end
            return
        for seq, event in enumerate(events):
            self._buffer_bytes += builder.add(txn, seq, event)
            if type(event) in _DEFINITIONS:
                definitions.append(event)
            yield 1

    def _write_batch(
        self, batch: pa.RecordBatch | None, flags: int, first: LSN | None, last: LSN, end: LSN
    ) -> None:
        payload = fmt.encode_payload(batch, self._compression)
        rows = 0 if batch is None else batch.num_rows
        first = first if first is not None else last
        header = fmt.encode_frame(
            flags,
            first,
            last,
            end,
            rows=rows,
            payload=payload,
            holds_type_rows=batch is not None and holds_type_rows(batch),
        )
        self._ensure_segment()
        self._file.write(header)
        self._file.write(payload)
        self._segment_size += len(header) + payload.size
        if self._segment_first_lsn is None and not flags & fmt.ABORT:
            self._segment_first_lsn = first

    def _abandon(self, start_rows: int, spilled_from: int | None, first_before: LSN | None) -> None:
        """Remove every trace of the transaction that failed; keep the ones before it."""
        batch = self._builder.build()
        self._buffer_bytes = 0
        if spilled_from is None:
            if self._done > self._written:
                self._write_batch(
                    batch.slice(0, start_rows), fmt.FINAL, self._group_first, *self._done
                )
                self._written = self._done
                self._group_first = None
        elif self._local:
            self._file.flush()
            self._file.truncate(spilled_from)
            self._file.seek(spilled_from)
            self._segment_size = spilled_from
            self._segment_first_lsn = first_before
        else:
            self._write_batch(None, fmt.ABORT, None, *self._written)

    # --- segments ----------------------------------------------------------------------------

    def _ensure_segment(self) -> None:
        if self._file is not None:
            return
        header = fmt.SegmentHeader(self._written[0], self._written[1], self._next_state)
        name = fmt.segment_name(self._written[0])
        path = fmt.join(self._root, name)
        data = header.encode()
        if self._local:
            temp = f"{path}.{uuid.uuid4().hex}{fmt.TEMP_SUFFIX}"
            with open(temp, "wb") as f:
                f.write(data)
                f.flush()
                self._sync(f.fileno(), temp)
            os.replace(temp, path)
            _fsync_dir(self._root, lambda fd: self._sync(fd, self._root))
            self._file = open(path, "r+b")  # noqa: SIM115
            self._file.seek(len(data))
        else:
            # Not a stream to the store: an unfinished upload would be completed (made visible)
            # when pyarrow drops it, by a writer that may have lost its lease meanwhile.
            self._file = tempfile.TemporaryFile()  # noqa: SIM115
            self._file.write(data)
        self._segment_path = path
        self._segment_size = len(data)
        self._segment_first_lsn = None

    def _write_pending(self) -> None:
        """Write the buffered complete transactions as a FINAL frame."""
        if self._done > self._written:
            self._write_batch(self._builder.build(), fmt.FINAL, self._group_first, *self._done)
            self._buffer_bytes = 0
            self._written = self._done
            self._group_first = None

    def _finish_segment(self) -> None:
        """Seal the open segment: it becomes immutable and the next append starts another."""
        self._write_pending()
        if self._file is None:
            return
        seal = fmt.encode_frame(
            fmt.SEAL,
            self._segment_first_lsn or self._written[0],
            *self._written,
            rows=0,
            payload=b"",
            holds_type_rows=False,
        )
        self._file.write(seal)
        if self._local:
            self._file.flush()
            self._sync(self._file.fileno(), self._segment_path)
            self._file.close()
        else:
            self._upload()
        self._file = None
        self._segment_path = None
        self._durable = self._written
        self._next_state = self._state.copy()
        self._segment_size = 0

    def _upload(self) -> None:
        """Put the finished segment on the store; it is visible, whole, once this returns."""
        assert self._segment_path is not None
        if self._lease is not None:
            self._lease.check()  # before the segment can become visible
        path = self._segment_path
        target = path if self._puts_whole else f"{path}.{uuid.uuid4().hex}{fmt.TEMP_SUFFIX}"
        self._file.seek(0)
        # pyarrow's streams have no abort: an error raised mid-copy may let the close complete
        # a short object. It has no seal, so the next writer refuses it (CorruptChangeLog)
        # rather than take it for the log's end; nothing in it was confirmed.
        with self._fs.open_output_stream(target) as out:
            shutil.copyfileobj(self._file, out, 8 << 20)
        if target != path:
            self._fs.move(target, path)
        self._file.close()

    # --- durability --------------------------------------------------------------------------

    def flush(self) -> LSN:
        """Make every appended transaction durable; return the end LSN of the last one.

        That LSN is what the receiver may confirm to the server as flushed.
        """
        self._check_open()
        if self._local:
            self._write_pending()
            if self._file is not None:
                self._file.flush()
                self._sync(self._file.fileno(), self._segment_path)
                if self._durable != self._written:
                    self._mark()
            self._durable = self._written
        else:
            self._finish_segment()
        return self._durable[1]

    def _sync(self, fd: int, path: str | None) -> None:
        """fsync ``fd``; if that fails, the writer is poisoned: after a failed fsync the kernel
        may have dropped the unsynced pages and a later fsync may still succeed, so no flush
        may ever report anything durable again (the slot then re-sends it to a new writer)."""
        try:
            os.fsync(fd)
        except OSError as error:
            cause = storage_error(OSError(error.errno, error.strerror, path))
            self._sync_failed = ChangeLogError(
                f"the change log could not be made durable past {self._durable[1]}, so pgcdc "
                f"stopped (the slot still holds every change after that): fsync failed: {cause}"
            )
            raise self._sync_failed from error

    def _mark(self) -> None:
        """Record where the active segment is durable to, after its fsync (see DurableMark)."""
        assert self._segment_path is not None
        mark = fmt.DurableMark(
            os.path.basename(self._segment_path), self._segment_size, *self._written
        )
        if self._mark_fd is None:
            path = fmt.join(self._root, fmt.MARK_NAME)
            self._mark_fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.pwrite(self._mark_fd, mark.encode(), 0)

    def close(self) -> None:
        """Flush and release the log (sealing nothing: a reopened writer continues the segment)."""
        if self._closed:
            return
        try:
            if self._sync_failed is None:
                self.flush()
        finally:
            if self._file is not None:  # local: reopened later; else: never uploaded
                self._file.close()
                self._file = None
            self._closed = True
            if self._mark_fd is not None:
                os.close(self._mark_fd)
                self._mark_fd = None
            if self._lock is not None:
                self._lock.close()
                self._lock = None
            if self._lease is not None:
                self._lease.release()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError("the change log writer is closed")
        if self._sync_failed is not None:
            raise self._sync_failed

    def __enter__(self) -> ChangeLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
