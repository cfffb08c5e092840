"""The segment file format: a header with the relation state, then checksummed frames.

Segment ``<BASE>.pgcdcseg`` (BASE: the log's last commit LSN before it, 16 hex digits, so names
sort in log order) holds::

    header  = "PGCDCSEG" u16 version u16 0 u32 json_length u32 crc32(json) json
    frame*  = "PGCF" u8 version u8 flags u16 notes u64 first_commit_lsn u64 last_commit_lsn
              u64 end_lsn u32 rows u32 payload_length u32 crc32(fields before it + payload)
              payload (an Arrow IPC stream of one ``codec.SCHEMA`` batch, or empty)

A *group* of frames ends with a FINAL frame: every transaction in it is then complete. A large
transaction is written as several non-final frames, so it never has to fit in memory; a torn or
abandoned group (no FINAL, or an ABORT frame) is not part of the log. A SEAL frame (no payload)
closes a segment; it repeats the segment's range so listing needs to read only the tail.
All integers are little-endian.

``notes`` say what the payload's rows hold, so readers can skip frames without decoding them:
NOTED (the bits below are recorded) and HOLDS_TYPE_ROWS. Writers before notes existed wrote 0,
which reads as "not recorded", and readers that predate them ignore the field, so it needs no
new version.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs

from pgcdc.changelog.codec import LogState
from pgcdc.errors import CorruptChangeLog, UnloggableInput
from pgcdc.lsn import LSN
from pgcdc.storage import StorageOptions
from pgcdc.storage import filesystem as storage_filesystem

SEGMENT_SUFFIX = ".pgcdcseg"
SEGMENT_NAME = re.compile(r"^([0-9A-F]{16})\.pgcdcseg$")
TEMP_SUFFIX = ".tmp"

SEGMENT_MAGIC = b"PGCDCSEG"
SEGMENT_VERSION = 1
_SEGMENT_HEAD = struct.Struct("<8sHHII")

FRAME_MAGIC = b"PGCF"
FRAME_VERSION = 1
_FRAME_FIELDS = struct.Struct("<4sBBHQQQII")
_CRC = struct.Struct("<I")
FRAME_HEADER_SIZE = _FRAME_FIELDS.size + _CRC.size

FINAL = 1
ABORT = 2
SEAL = 4
_KNOWN_FLAGS = FINAL | ABORT | SEAL

NOTED = 1
HOLDS_TYPE_ROWS = 2

# A header larger than this is damage, not a real relation state.
_MAX_HEADER_JSON = 1 << 30


def segment_name(base_commit_lsn: int) -> str:
    return f"{base_commit_lsn:016X}{SEGMENT_SUFFIX}"


def join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


def resolve(
    root: str | os.PathLike[str],
    filesystem: pafs.FileSystem | None,
    storage: StorageOptions | None = None,
) -> tuple[pafs.FileSystem, str]:
    """A (filesystem, path) pair from a local path, a URI ("s3://bucket/log", reached with
    ``storage``'s settings or the environment's) or an instance."""
    text = os.fspath(root)
    if filesystem is not None:
        fs, path = filesystem, text
    elif "://" in text:
        fs, path = storage_filesystem(text, storage)
    else:
        fs, path = pafs.LocalFileSystem(), os.path.abspath(text)
    if isinstance(fs, pafs.LocalFileSystem):
        path = os.path.abspath(path)
    return fs, path.rstrip("/") or "/"


_PUTS_WHOLE = tuple(
    kind
    for kind in (getattr(pafs, "S3FileSystem", None), getattr(pafs, "GcsFileSystem", None))
    if kind is not None
)


def puts_whole(filesystem: pafs.FileSystem) -> bool:
    """Object stores whose objects appear only whole, when their upload completes: a segment
    needs no temporary name there (a move is a copy and a delete on them)."""
    return isinstance(filesystem, _PUTS_WHOLE)


def is_local(filesystem: pafs.FileSystem) -> bool:
    """Local files can be appended, truncated and fsync'd; other filesystems are write-once."""
    return isinstance(filesystem, pafs.LocalFileSystem)


# --- header ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SegmentHeader:
    base_commit_lsn: LSN
    base_end_lsn: LSN
    state: LogState = field(compare=False)

    def encode(self) -> bytes:
        body = json.dumps(
            {
                "base_commit_lsn": int(self.base_commit_lsn),
                "base_end_lsn": int(self.base_end_lsn),
                "state": self.state.to_dict(),
            },
            separators=(",", ":"),
        ).encode()
        return _SEGMENT_HEAD.pack(
            SEGMENT_MAGIC, SEGMENT_VERSION, 0, len(body), zlib.crc32(body)
        ) + (body)


class _Readable(Protocol):
    def read(self, nbytes: int, /) -> Any: ...
    def seek(self, position: int, /) -> Any: ...


def read_header(file: _Readable, where: str) -> tuple[SegmentHeader, int]:
    """The segment's header and the offset of its first frame."""
    head = bytes(file.read(_SEGMENT_HEAD.size))
    if len(head) < _SEGMENT_HEAD.size:
        raise CorruptChangeLog(f"{where}: segment header is truncated")
    magic, version, _, length, crc = _SEGMENT_HEAD.unpack(head)
    if magic != SEGMENT_MAGIC:
        raise CorruptChangeLog(f"{where} is not a pgcdc change log segment (bad magic)")
    if version != SEGMENT_VERSION:
        raise CorruptChangeLog(
            f"{where}: segment format version {version} is not supported (this pgcdc reads "
            f"{SEGMENT_VERSION}); read it with the pgcdc version that wrote it"
        )
    if length > _MAX_HEADER_JSON:
        raise CorruptChangeLog(f"{where}: segment header length {length} is damaged")
    body = bytes(file.read(length))
    if len(body) < length or zlib.crc32(body) != crc:
        raise CorruptChangeLog(f"{where}: segment header fails its checksum")
    try:
        data = json.loads(body)
        header = SegmentHeader(
            LSN(data["base_commit_lsn"]),
            LSN(data["base_end_lsn"]),
            LogState.from_dict(data["state"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptChangeLog(f"{where}: damaged segment header: {exc!r}") from None
    return header, _SEGMENT_HEAD.size + length


# --- frames ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrameHeader:
    flags: int
    first_commit_lsn: LSN
    last_commit_lsn: LSN
    end_lsn: LSN
    rows: int
    length: int
    crc: int
    notes: int = 0

    @property
    def final(self) -> bool:
        return bool(self.flags & FINAL)

    @property
    def holds_type_rows(self) -> bool | None:
        """Whether the payload has Type rows; None when the writer did not record it."""
        return bool(self.notes & HOLDS_TYPE_ROWS) if self.notes & NOTED else None


def encode_frame(
    flags: int,
    first_commit_lsn: int,
    last_commit_lsn: int,
    end_lsn: int,
    *,
    rows: int,
    payload: Any,
    holds_type_rows: bool,
) -> bytes:
    """The frame header for ``payload`` (any buffer); the caller writes both."""
    length = memoryview(payload).nbytes
    if length >= 1 << 32:
        raise UnloggableInput(
            f"a frame of {length} bytes is too large; lower frame_bytes (one row must fit 4 GiB)"
        )
    fields = _FRAME_FIELDS.pack(
        FRAME_MAGIC,
        FRAME_VERSION,
        flags,
        NOTED | (HOLDS_TYPE_ROWS if holds_type_rows else 0),
        first_commit_lsn,
        last_commit_lsn,
        end_lsn,
        rows,
        length,
    )
    return fields + _CRC.pack(zlib.crc32(payload, zlib.crc32(fields)))


def parse_frame_header(data: bytes) -> FrameHeader | None:
    """The frame header in ``data``, or None when it is not one (short, bad magic or flags)."""
    if len(data) < FRAME_HEADER_SIZE:
        return None
    magic, version, flags, notes, first, last, end, rows, length = _FRAME_FIELDS.unpack_from(data)
    if magic != FRAME_MAGIC or version != FRAME_VERSION or flags & ~_KNOWN_FLAGS:
        return None
    (crc,) = _CRC.unpack_from(data, _FRAME_FIELDS.size)
    return FrameHeader(flags, LSN(first), LSN(last), LSN(end), rows, length, crc, notes)


def frame_crc_ok(data: bytes, header: FrameHeader, payload: Any) -> bool:
    return zlib.crc32(payload, zlib.crc32(data[: _FRAME_FIELDS.size])) == header.crc


def encode_payload(batch: pa.RecordBatch | None, compression: str | None) -> pa.Buffer:
    if batch is None or batch.num_rows == 0:
        return pa.py_buffer(b"")
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression=compression)
    with pa.ipc.new_stream(sink, batch.schema, options=options) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def decode_payload(payload: pa.Buffer, where: str) -> list[pa.RecordBatch]:
    if payload.size == 0:
        return []
    try:
        return list(pa.ipc.open_stream(payload))
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptChangeLog(
            f"{where}: frame payload is not an Arrow IPC stream: {exc}"
        ) from None


# --- scanning --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FrameRef:
    offset: int
    header: FrameHeader


@dataclass
class Scan:
    """What a segment holds: the frames of complete groups, and where its valid part ends.

    ``damage`` says why a bad frame cannot be a torn tail (None when it can be, or when there
    is none): a crash tears only what was written after the last fsync, at the end of the
    file, so a bad frame inside a sealed segment, before the writer's recorded durable end, or
    followed by a valid frame is damage to data that may already be confirmed to the server.
    """

    header: SegmentHeader
    header_end: int
    frames: list[FrameRef]
    # Offset just past the last FINAL, ABORT or SEAL frame: where a writer may append.
    valid_end: int
    sealed: bool
    # Why scanning stopped before the end of the file (a torn or damaged tail), or None.
    problem: str | None
    damage: str | None = None
    # Where scanning stopped on a bad frame (None: it reached the end or a seal).
    bad_offset: int | None = None

    @property
    def first_commit_lsn(self) -> LSN | None:
        return self.frames[0].header.first_commit_lsn if self.frames else None

    @property
    def last_commit_lsn(self) -> LSN:
        return (
            self.frames[-1].header.last_commit_lsn if self.frames else self.header.base_commit_lsn
        )

    @property
    def end_lsn(self) -> LSN:
        return self.frames[-1].header.end_lsn if self.frames else self.header.base_end_lsn


def scan(file: _Readable, size: int, where: str, *, verify: bool, durable_end: int = 0) -> Scan:
    """Walk the frames of a segment; with ``verify``, check every payload's checksum too.

    Stops at the first frame that is short, malformed or (verifying) fails its checksum, then
    judges whether that can be a torn tail (see ``Scan.damage``); ``durable_end`` is the offset
    up to which the writer recorded the segment as fsync'd (0: unknown).
    """
    file.seek(0)
    header, offset = read_header(file, where)
    header_end = offset
    committed: list[FrameRef] = []
    pending: list[FrameRef] = []
    valid_end = offset
    sealed = False
    problem: str | None = None
    while offset < size:
        file.seek(offset)
        data = bytes(file.read(FRAME_HEADER_SIZE))
        frame = parse_frame_header(data)
        if frame is None:
            problem = f"no valid frame header at offset {offset}"
            break
        end = offset + FRAME_HEADER_SIZE + frame.length
        if end > size:
            problem = f"frame at offset {offset} runs past the end of the file"
            break
        if verify or frame.length == 0:
            payload = file.read(frame.length) if frame.length else b""
            if not frame_crc_ok(data, frame, payload):
                problem = f"frame at offset {offset} fails its checksum"
                break
        ref = FrameRef(offset, frame)
        offset = end
        if frame.flags & SEAL:
            committed.extend(pending)
            pending = []
            valid_end = offset
            sealed = True
            if offset < size:
                problem = f"{size - offset} bytes follow the seal at offset {offset}"
            break
        pending.append(ref)
        if frame.flags & ABORT:
            pending = []
            valid_end = offset
        elif frame.flags & FINAL:
            committed.extend(pending)
            pending = []
            valid_end = offset
    damage: str | None = None
    bad_offset: int | None = None
    if problem is not None and not sealed:
        bad_offset = offset
        damage = _damage(file, size, offset, durable_end)
    elif durable_end > size:
        bad_offset = size
        problem = "the file is shorter than its durable end"
        damage = f"the writer recorded it as durable up to offset {durable_end}"
    if pending and problem is None:
        problem = f"the transaction starting at offset {pending[0].offset} has no final frame"
    return Scan(header, header_end, committed, valid_end, sealed, problem, damage, bad_offset)


def _damage(file: _Readable, size: int, bad: int, durable_end: int) -> str | None:
    """Why the bad frame at offset ``bad`` is not a torn tail, or None if it may be one."""
    if read_seal(file, size) is not None:
        return "the segment was sealed and fsync'd"
    if bad < durable_end:
        return f"it lies before the segment's recorded durable end {durable_end}"
    found = next_valid_frame(file, size, bad + 1)
    if found is not None:
        return f"a valid frame follows at offset {found} (a crash tears only the end)"
    return None


def next_valid_frame(file: _Readable, size: int, start: int) -> int | None:
    """The offset of the first whole frame with a good checksum at or after ``start``."""
    chunk = 1 << 20
    position = start
    while position < size:
        file.seek(position)
        data = bytes(file.read(min(chunk, size - position)))
        if not data:
            return None
        at = data.find(FRAME_MAGIC)
        while at != -1:
            offset = position + at
            file.seek(offset)
            head = bytes(file.read(FRAME_HEADER_SIZE))
            frame = parse_frame_header(head)
            if frame is not None and offset + FRAME_HEADER_SIZE + frame.length <= size:
                payload = file.read(frame.length) if frame.length else b""
                if frame_crc_ok(head, frame, payload):
                    return offset
            at = data.find(FRAME_MAGIC, at + 1)
        # Keep the last bytes: a magic may straddle two chunks.
        position += max(len(data) - (len(FRAME_MAGIC) - 1), 1)
    return None


# --- the durable mark ------------------------------------------------------------------------

MARK_NAME = "durable.mark"
_MARK_MAGIC = b"PGCDCDUR"
_MARK = struct.Struct("<8s16sQQQ")


@dataclass(frozen=True, slots=True)
class DurableMark:
    """Where the writer last fsync'd the log: a segment's name and the offset it was durable to.

    Written after each fsync and never fsync'd itself, so it never claims more than was
    durable: exact after a process crash, possibly older after a power cut (then the rule that
    a valid frame after a bad one is damage still applies).
    """

    segment: str
    offset: int
    commit_lsn: LSN
    end_lsn: LSN

    def encode(self) -> bytes:
        base = self.segment[: -len(SEGMENT_SUFFIX)].encode()
        fields = _MARK.pack(_MARK_MAGIC, base, self.offset, self.commit_lsn, self.end_lsn)
        return fields + _CRC.pack(zlib.crc32(fields))

    @classmethod
    def decode(cls, data: bytes) -> DurableMark | None:
        """The mark in ``data``; None when it is missing or torn (then it tells nothing)."""
        if len(data) != _MARK.size + _CRC.size:
            return None
        (crc,) = _CRC.unpack_from(data, _MARK.size)
        if zlib.crc32(data[: _MARK.size]) != crc:
            return None
        magic, base, offset, commit, end = _MARK.unpack_from(data)
        name = base.decode("ascii", "replace") + SEGMENT_SUFFIX
        if magic != _MARK_MAGIC or not SEGMENT_NAME.match(name):
            return None
        return cls(name, offset, LSN(commit), LSN(end))


def read_mark(fs: pafs.FileSystem, root: str) -> DurableMark | None:
    """The log's durable mark (local logs only; None when there is none or it is torn)."""
    if not is_local(fs):
        return None
    try:
        with open(join(root, MARK_NAME), "rb") as f:
            return DurableMark.decode(f.read())
    except FileNotFoundError:
        return None


def read_seal(file: _Readable, size: int) -> FrameHeader | None:
    """The SEAL frame at the end of a sealed segment, or None when the segment is not sealed."""
    if size < FRAME_HEADER_SIZE:
        return None
    file.seek(size - FRAME_HEADER_SIZE)
    data = bytes(file.read(FRAME_HEADER_SIZE))
    frame = parse_frame_header(data)
    if frame is None or not frame.flags & SEAL or frame.length != 0:
        return None
    return frame if frame_crc_ok(data, frame, b"") else None
