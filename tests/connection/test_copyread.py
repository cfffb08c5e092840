"""The stream's CopyData reader in C (``pgcdc.connection._copyread``) against its reference,
the Python path of ``_StreamCore.poll_many``: byte by byte over a libpq stand-in made of ctypes
callbacks (any message, any order, every status libpq can give), then over real walsenders."""

from __future__ import annotations

import ctypes
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from pgcdc import _native
from pgcdc.connection import copyread
from pgcdc.connection.protocol import (
    MAX_SEND_TIME,
    MIN_SEND_TIME,
    XLogData,
    parse_copy_data,
)
from pgcdc.connection.replication import ReplicationConnection
from pgcdc.errors import PgcdcError
from pgcdc.lsn import LSN

from .test_replication import PATIENCE, logical_slot

needs_reader = pytest.mark.skipif(
    copyread._copyread is None, reason="built without C extensions (PGCDC_PURE_PYTHON=1)"
)

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
_libc.free.argtypes = [ctypes.c_void_p]

_GET_COPY_DATA = ctypes.CFUNCTYPE(
    ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int
)
_FREE_MEM = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_CONSUME_INPUT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


class FakeLibpq:
    """libpq's three calls over a script: each ``bytes`` is a message PQgetCopyData returns,
    ``0`` a call that finds nothing buffered, ``-1``/``-2`` the end of COPY or a failure.
    ``"consume-fails"`` makes the next PQConsumeInput fail. Buffers are malloc'ed, as libpq's
    are, and every one must be freed."""

    def __init__(self, script: list[Any]) -> None:
        self.script = list(script)
        self.outstanding: set[int] = set()
        self.consumed = 0
        self.get = _GET_COPY_DATA(self._get)
        self.free = _FREE_MEM(self._free)
        self.consume = _CONSUME_INPUT(self._consume)

    def _get(self, conn: int, buffer: Any, async_: int) -> int:
        assert conn == 1 and async_ == 1
        if not self.script or self.script[0] == "consume-fails":
            return 0
        item = self.script.pop(0)
        if isinstance(item, int):
            return item
        address = _libc.malloc(max(len(item), 1))
        ctypes.memmove(address, item, len(item))
        self.outstanding.add(address)
        buffer[0] = address
        return len(item)

    def _free(self, address: int) -> None:
        self.outstanding.remove(address)
        _libc.free(address)

    def _consume(self, conn: int) -> int:
        self.consumed += 1
        if self.script and self.script[0] == "consume-fails":
            self.script.pop(0)
            return 0
        return 1

    def read(self, limit: int, max_size: int) -> tuple[list[Any], int, int]:
        """What the stream's reader takes, bound to these callbacks as to libpq's."""
        reader = copyread._Reader(
            ctypes.cast(self.get, ctypes.c_void_p).value or 0,
            ctypes.cast(self.free, ctypes.c_void_p).value or 0,
            ctypes.cast(self.consume, ctypes.c_void_p).value or 0,
        )
        return reader(1, limit, max_size)


def xlog(start: int, end: int, sent: int, payload: bytes) -> bytes:
    return struct.pack("!cQQq", b"w", start, end, sent) + payload


def keepalive(end: int, sent: int, reply: int) -> bytes:
    return struct.pack("!cQqB", b"k", end, sent, reply)


_u64 = st.integers(0, (1 << 64) - 1)
_sent = st.one_of(
    st.integers(MIN_SEND_TIME, MAX_SEND_TIME),
    st.sampled_from([MIN_SEND_TIME - 1, MAX_SEND_TIME + 1, -(1 << 63), (1 << 63) - 1]),
)
_message = st.one_of(
    st.builds(xlog, _u64, _u64, _sent, st.binary(max_size=60)),
    st.builds(keepalive, _u64, _sent, st.integers(0, 2)),
    st.binary(min_size=1, max_size=40),  # truncated, unknown kinds, stray bytes
    st.binary(min_size=1, max_size=30).map(lambda tail: b"w" + tail),  # short XLogData
)
_endings: list[list[Any]] = [[], [-1], [-2], ["consume-fails"]]
_script = st.tuples(
    st.lists(st.one_of(_message, st.just(0)), max_size=30), st.sampled_from(_endings)
).map(lambda parts: [*parts[0], *parts[1]])


def _reference(message: bytes, max_size: int) -> Any:
    """What poll_many's Python path makes of one message: its parse, or the error's type and
    text."""
    try:
        return parse_copy_data(message, max_size)
    except PgcdcError as error:
        return (type(error), str(error))


def _statuses(fake: FakeLibpq, limit: int, max_size: int) -> Iterator[tuple[list[Any], int, int]]:
    """Read as the stream does: again after each batch (after a wait on the socket when the
    batch drained libpq), until the script is used up."""
    while True:
        result = fake.read(limit, max_size)
        yield result
        if not fake.script and result[1] != copyread.LIMIT:
            return


@needs_reader
@given(script=_script, limit=st.integers(1, 8), max_size=st.sampled_from([26, 40, 1 << 20]))
@example(script=[xlog(1, 2, MAX_SEND_TIME + 1, b"B")], limit=1, max_size=1 << 20)
@example(script=[xlog(1, 2, 3, b"x" * 20)], limit=1, max_size=40)  # 45 bytes: too large
@example(script=[b"w" + b"\0" * 23], limit=1, max_size=1 << 20)  # one byte short of a header
@example(script=[0, 0, b"k"], limit=4, max_size=1 << 20)  # two empty reads end a batch
def test_the_c_reader_takes_what_the_python_path_takes(script, limit, max_size):
    fake = FakeLibpq(script)
    messages_in = [item for item in script if isinstance(item, bytes)]
    taken: list[Any] = []
    for messages, status, raw in _statuses(fake, limit, max_size):
        assert len(messages) <= limit
        assert status in (copyread.LIMIT, copyread.DRAINED) or status in (
            copyread.COPY_ENDED,
            copyread.COPY_FAILED,
            copyread.CONSUME_FAILED,
        )
        assert status != copyread.LIMIT or len(messages) == limit
        assert raw == sum(type(m) is bytes for m in messages)
        taken += messages
        if status in (copyread.COPY_ENDED, copyread.COPY_FAILED, copyread.CONSUME_FAILED):
            assert status == {"consume-fails": -3}.get(script[-1], script[-1])
            break
    assert not fake.outstanding  # every buffer libpq handed out was freed
    # Every message, in order: an XLogData exactly as the Python path parses it, anything
    # else as its bytes, for the Python path to parse (a keepalive) or refuse.
    assert len(taken) == len(messages_in)
    for message, got in zip(messages_in, taken, strict=True):
        expected = _reference(message, max_size)
        if type(got) is XLogData:
            assert expected == got
            assert type(got.data_start) is LSN and type(got.payload) is bytes
            assert got.wal_end == expected.wal_end
            assert got.send_time_us == expected.send_time_us
        else:
            assert got == message
            assert type(expected) is not XLogData


@needs_reader
def test_a_limit_ends_a_batch_before_the_socket_is_read():
    fake = FakeLibpq([xlog(1, 2, 3, b"a"), xlog(2, 3, 4, b"b"), 0, xlog(3, 4, 5, b"c")])
    messages, status, raw = fake.read(2, 1 << 20)
    assert [m.payload for m in messages] == [b"a", b"b"] and status == copyread.LIMIT
    assert raw == 0
    assert fake.consumed == 0
    messages, status, _ = fake.read(2, 1 << 20)
    # Nothing buffered: the socket is read once (libpq's never blocks), then what came.
    assert [m.payload for m in messages] == [b"c"] and status == copyread.DRAINED
    assert fake.consumed == 1


def test_the_compiled_build_reads_the_stream_in_c(db):
    """The C reader is what the compiled build runs, so the replication and fault tests
    exercise it (and ``test_both_readers_read_the_same_stream`` the Python path beside it)."""
    if not _native.compiled():
        pytest.skip("the source runs (PGCDC_PURE_PYTHON or a stale build): no C reader")
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(logical_slot(db))
        assert stream._core.native_read is not None
        stream.stop()


def _read_all(db: Any, slot: str, native: bool, commits: int) -> list[tuple[LSN, bytes]]:
    with ReplicationConnection.connect(db.conninfo()) as repl:
        stream = repl.start_replication(slot, max_message_size=4000)
        if not native:
            stream._core.native_read = None
        elif stream._core.native_read is None:
            pytest.skip("no C reader in this build")
        taken: list[tuple[LSN, bytes]] = []
        deadline = time.monotonic() + PATIENCE
        try:
            while sum(payload.startswith(b"COMMIT") for _, payload in taken) < commits:
                assert time.monotonic() < deadline, f"only {len(taken)} messages"
                for message in stream.read_many(timeout=1.0, limit=50):
                    if isinstance(message, XLogData):
                        taken.append((message.data_start, bytes(message.payload)))
        except PgcdcError as error:
            taken.append((LSN(0), f"{type(error).__name__}: {error}".encode()))
    return taken


def test_both_readers_read_the_same_stream(db):
    """Two slots over the same WAL (many small transactions, a large one, a message too
    large for the stream's limit), one read in C and one in Python: the same messages, in
    the same batches' order, and the same error at the same place."""
    db.execute("CREATE TABLE c (id int PRIMARY KEY, v text)")
    slots = [logical_slot(db), logical_slot(db)]
    for i in range(200):
        db.execute("INSERT INTO c VALUES (%s, %s)", (i, f"row {i}"))
    db.execute("UPDATE c SET v = v || '!' WHERE id < 150")
    db.execute("INSERT INTO c VALUES (1000, repeat('x', 5000))")  # over max_message_size
    native = _read_all(db, slots[0], native=True, commits=202)
    python = _read_all(db, slots[1], native=False, commits=202)
    assert native == python
    assert native[-1][1].startswith(b"ProtocolError: replication message of")
    assert sum(payload.startswith(b"COMMIT") for _, payload in native) == 201
