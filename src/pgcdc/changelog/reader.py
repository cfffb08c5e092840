"""Reading the change log: segment listing, Arrow batches, restored transactions.

Everything here needs only a path and a filesystem spec (a local path, a URI or a picklable
``pyarrow.fs.FileSystem``), so a Spark executor in another process can read one segment alone.
Only whole transactions are ever returned: an unfinished group at the end of the active
segment (being written, or torn by a crash the writer has not yet recovered) is left out. A bad
frame anywhere else (see ``segments.Scan.damage``) raises ``CorruptChangeLog``: a reader never
returns the part of a log before damage as if it were the whole.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from pgcdc.changelog import segments as fmt
from pgcdc.changelog.codec import LogState, decode
from pgcdc.errors import ChangeLogError, CorruptChangeLog
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """One segment and the commit LSNs of the whole transactions in it.

    ``complete``: sealed, never to change again (only the newest segment may be open).
    ``first_commit_lsn`` is None for a segment that holds no transaction yet.
    """

    path: str
    first_commit_lsn: LSN | None
    last_commit_lsn: LSN
    end_lsn: LSN
    size: int
    complete: bool


def _open(fs: pafs.FileSystem, path: str) -> pa.NativeFile:
    try:
        return fs.open_input_file(path)
    except FileNotFoundError:
        raise ChangeLogError(
            f"change log segment {path} does not exist (released after every consumer "
            "acknowledged it, or a wrong path); list the log's segments again"
        ) from None


def segment_paths(fs: pafs.FileSystem, root: str) -> list[str]:
    """The segments under ``root``, oldest first."""
    try:
        infos = fs.get_file_info(pafs.FileSelector(root))
    except FileNotFoundError:
        return []
    names = sorted(i.base_name for i in infos if fmt.SEGMENT_NAME.match(i.base_name))
    return [fmt.join(root, name) for name in names]


def segment_info(
    path: str | os.PathLike[str], *, filesystem: pafs.FileSystem | None = None
) -> SegmentInfo:
    fs, where = fmt.resolve(path, filesystem)
    with _open(fs, where) as f:
        size = f.size()
        seal = fmt.read_seal(f, size)
        if seal is not None:
            return SegmentInfo(
                where, seal.first_commit_lsn, seal.last_commit_lsn, seal.end_lsn, size, True
            )
        scan = _scan(fs, f, where, verify=False)
        return SegmentInfo(
            where, scan.first_commit_lsn, scan.last_commit_lsn, scan.end_lsn, size, scan.sealed
        )


def _scan(fs: pafs.FileSystem, f: pa.NativeFile, where: str, *, verify: bool) -> fmt.Scan:
    """A scan that raises on damage no crash could have left (see ``segments.Scan.damage``).

    An open segment is scanned again before raising: a writer abandoning a failed
    transaction rewrites the end of the file, which a reader may see half old, half new."""
    root, _, name = where.rpartition("/")
    mark = fmt.read_mark(fs, root)
    durable_end = mark.offset if mark is not None and mark.segment == name else 0
    scan = fmt.scan(f, f.size(), where, verify=verify, durable_end=durable_end)
    if scan.damage is not None and not scan.sealed:
        scan = fmt.scan(f, f.size(), where, verify=verify, durable_end=durable_end)
    if scan.damage is not None:
        raise CorruptChangeLog(
            f"{where}: damaged at offset {scan.bad_offset} ({scan.problem}), where no crash "
            f"can have torn it ({scan.damage}); restore the segment from a backup or re-read "
            "the changes from the server"
        )
    return scan


def _checked_scan(fs: pafs.FileSystem, f: pa.NativeFile, where: str) -> fmt.Scan:
    """A scan that fails loudly on damage where no crash could have left it."""
    size = f.size()
    sealed = fmt.read_seal(f, size) is not None
    # The open segment's tail may be mid-write: verify it now so that no transaction is
    # half-returned; sealed segments are verified frame by frame while reading.
    scan = _scan(fs, f, where, verify=not sealed)
    if sealed and scan.problem is not None:
        raise CorruptChangeLog(
            f"{where}: sealed segment is damaged ({scan.problem}); restore it from a backup or "
            "re-read the changes from the server"
        )
    return scan


def state_at(
    path: str | os.PathLike[str], *, filesystem: pafs.FileSystem | None = None
) -> LogState:
    """The relation and type definitions in force at the start of a segment."""
    fs, where = fmt.resolve(path, filesystem)
    with _open(fs, where) as f:
        header, _ = fmt.read_header(f, where)
    return header.state


@dataclass(frozen=True, slots=True)
class FrameInfo:
    """One frame of whole transactions: its row count, commit LSN range and whether it holds
    Type rows (None: not recorded, a frame from an older pgcdc), all from its header."""

    rows: int
    first_commit_lsn: LSN
    last_commit_lsn: LSN
    holds_type_rows: bool | None = None


def segment_frames(
    path: str | os.PathLike[str], *, filesystem: pafs.FileSystem | None = None
) -> list[FrameInfo]:
    """The frames of a segment that hold rows, in order, read from their headers only: what
    splitting a big segment into row ranges (``read_segment(rows=...)``) needs."""
    fs, where = fmt.resolve(path, filesystem)
    with _open(fs, where) as f:
        scan = _scan(fs, f, where, verify=False)
    return [
        FrameInfo(
            ref.header.rows,
            ref.header.first_commit_lsn,
            ref.header.last_commit_lsn,
            ref.header.holds_type_rows,
        )
        for ref in scan.frames
        if ref.header.rows
    ]


def read_segment(
    path: str | os.PathLike[str],
    from_lsn: int | None = None,
    to_lsn: int | None = None,
    *,
    filesystem: pafs.FileSystem | None = None,
    rows: tuple[int, int | None] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The rows of the whole transactions in a segment with ``from_lsn <= commit_lsn <=
    to_lsn`` (both inclusive, either may be None), as ``codec.SCHEMA`` record batches.

    ``rows=(start, stop)``: only the segment's rows ``start <= n < stop`` (numbered from 0
    over all its frames, before the LSN filter; ``stop`` None: to the end), so executors can
    share one big segment by row ranges."""
    fs, where = fmt.resolve(path, filesystem)
    low = 0 if from_lsn is None else int(from_lsn)
    high = (1 << 64) - 1 if to_lsn is None else int(to_lsn)
    first_row, stop_row = rows if rows is not None else (0, None)
    with _open(fs, where) as f:
        scan = _checked_scan(fs, f, where)
        number = 0  # the segment's row number at the start of the frame
        for ref in scan.frames:
            frame = ref.header
            start = number
            number += frame.rows
            if not frame.rows or frame.last_commit_lsn < low or frame.first_commit_lsn > high:
                continue
            if number <= first_row or (stop_row is not None and start >= stop_row):
                continue
            f.seek(ref.offset)
            head = f.read(fmt.FRAME_HEADER_SIZE)
            payload = f.read_buffer(frame.length)
            if payload.size != frame.length or not fmt.frame_crc_ok(head, frame, payload):
                raise CorruptChangeLog(
                    f"{where}: frame at offset {ref.offset} fails its checksum; restore the "
                    "segment from a backup or re-read the changes from the server"
                )
            decoded_batches = fmt.decode_payload(payload, where)
            if sum(b.num_rows for b in decoded_batches) != frame.rows:
                raise CorruptChangeLog(
                    f"{where}: frame at offset {ref.offset} holds a different number of rows "
                    "than its header says; restore the segment from a backup or re-read the "
                    "changes from the server"
                )
            for decoded in decoded_batches:
                batch = decoded
                at, start = start, start + decoded.num_rows
                if at < first_row or (stop_row is not None and start > stop_row):
                    begin = max(first_row - at, 0)
                    end = (
                        decoded.num_rows
                        if stop_row is None
                        else min(stop_row - at, decoded.num_rows)
                    )
                    if end <= begin:
                        continue
                    batch = batch.slice(begin, end - begin)
                if frame.first_commit_lsn < low or frame.last_commit_lsn > high:
                    commits = batch.column("commit_lsn")
                    keep = pc.and_(
                        pc.greater_equal(commits, pa.scalar(low, pa.uint64())),
                        pc.less_equal(commits, pa.scalar(high, pa.uint64())),
                    )
                    batch = batch.filter(keep)
                if batch.num_rows:
                    yield batch


def read_transactions(
    root: str | os.PathLike[str],
    from_lsn: int | None = None,
    to_lsn: int | None = None,
    *,
    filesystem: pafs.FileSystem | None = None,
) -> Iterator[CommittedTransaction]:
    """The logged transactions with ``from_lsn <= commit_lsn <= to_lsn``, in commit order.

    Each transaction's events are restored in memory; read huge ones with ``read_segment``.
    Transactions without events advance the log's position but are not stored, so they are
    not returned.
    """
    fs, where = fmt.resolve(root, filesystem)
    for path in segment_paths(fs, where):
        info = segment_info(path, filesystem=fs)
        if info.first_commit_lsn is None:
            # Found empty without checksums: verify it, so damage is never read as "empty".
            with _open(fs, path) as f:
                _checked_scan(fs, f, path)
            continue
        if from_lsn is not None and info.last_commit_lsn < from_lsn:
            continue
        if to_lsn is not None and info.first_commit_lsn > to_lsn:
            break
        yield from decode(read_segment(path, from_lsn, to_lsn, filesystem=fs))
