"""The COPY-BOTH sub-protocol of streaming replication, as pure functions over bytes.

Inside START_REPLICATION every CopyData message carries one of these, told apart by the first
byte: from the server XLogData ('w') and the primary keepalive ('k'); from the client the
standby status update ('r') and hot standby feedback ('h'). Integers are big-endian, times are
microseconds since 2000-01-01 00:00 UTC (PostgreSQL's epoch). No IO here: the drivers in
``pgcdc.connection.replication`` move the bytes.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from typing import Final

from pgcdc.errors import InvalidArgument, ProtocolError
from pgcdc.lsn import LSN
from pgcdc.pgtime import from_micros

PG_EPOCH: Final = datetime(2000, 1, 1, tzinfo=UTC)

XLOG_DATA: Final = 0x77  # 'w'
PRIMARY_KEEPALIVE: Final = 0x6B  # 'k'
STANDBY_STATUS_UPDATE: Final = 0x72  # 'r'
HOT_STANDBY_FEEDBACK: Final = 0x68  # 'h'

# PostgreSQL never builds a message larger than MaxAllocHugeSize-ish buffers allow; a 1 GiB
# payload is already beyond what one logical change can produce, so anything larger is corrupt.
DEFAULT_MAX_MESSAGE_SIZE: Final = 1 << 30

# XLogData's header after its 'w' byte: data_start, wal_end, send_time (read inline by
# ReplicationStream.poll_many, the hot path).
XLOG_HEADER: Final = struct.Struct(">QQq")
XLOG_HEADER_SIZE: Final = 25  # a literal, inlined in compiled code
assert 1 + XLOG_HEADER.size == XLOG_HEADER_SIZE
_KEEPALIVE: Final = struct.Struct(">QqB")  # wal_end, send_time, reply_requested
_KEEPALIVE_SIZE: Final = 1 + _KEEPALIVE.size
_STATUS_UPDATE: Final = struct.Struct(">cQQQqB")
_HOT_STANDBY_FEEDBACK: Final = struct.Struct(">cqIIII")

_ONE_MICROSECOND: Final = timedelta(microseconds=1)
# int.__new__ skips LSN's range check: an unsigned 64-bit field is always a valid LSN.
_new_int: Final = int.__new__


def to_pg_timestamp(moment: datetime) -> int:
    """Microseconds since PostgreSQL's epoch; naive datetimes are taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - PG_EPOCH) // _ONE_MICROSECOND


# The send times a datetime can hold (microseconds since 2000-01-01).
MIN_SEND_TIME: Final = (datetime.min.replace(tzinfo=UTC) - PG_EPOCH) // _ONE_MICROSECOND
MAX_SEND_TIME: Final = (datetime.max.replace(tzinfo=UTC) - PG_EPOCH) // _ONE_MICROSECOND


def from_pg_timestamp(microseconds: int) -> datetime:
    """The UTC datetime of a protocol timestamp; ProtocolError when Python cannot hold it."""
    try:
        return from_micros(microseconds)
    except OverflowError:
        raise ProtocolError(
            f"timestamp {microseconds} (microseconds since 2000-01-01) is outside the range "
            "Python datetimes can represent; the message is corrupt"
        ) from None


class _SentAt:
    """A server message's send time, kept as the wire carries it (microseconds since
    2000-01-01 UTC) and made a datetime only when read: messages are the hot path (native
    classes in the compiled build), and few readers look at the time."""

    __slots__ = ("_sent",)

    _sent: int

    @property
    def send_time(self) -> datetime:
        return from_micros(self._sent)

    @property
    def send_time_us(self) -> int:
        """``send_time`` as the server sent it: microseconds since 2000-01-01 UTC."""
        return self._sent


class XLogData(_SentAt):
    """WAL data (for logical replication: one output plugin message) starting at data_start.

    ``wal_end`` is the end of WAL on the server when it was sent, not the end of this message.
    ``payload`` is a view into the received buffer when the input was a memoryview (no copy);
    call ``bytes(payload)`` to keep it independent of that buffer's type. ``wal_end`` becomes
    an LSN only when read, and ``send_time`` may be given as a datetime or as the wire carries
    it (see ``_SentAt``).
    """

    __slots__ = ("_wal_end", "data_start", "payload")

    data_start: LSN
    payload: bytes | memoryview
    _wal_end: int

    def __init__(
        self,
        data_start: LSN,
        wal_end: int,
        send_time: datetime | int,
        payload: bytes | memoryview,
    ) -> None:
        self.data_start = data_start
        self._wal_end = wal_end
        self._sent = send_time if isinstance(send_time, int) else to_pg_timestamp(send_time)
        self.payload = payload

    @property
    def wal_end(self) -> LSN:
        return _new_int(LSN, self._wal_end)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, XLogData):
            return NotImplemented
        return (
            self.data_start == other.data_start
            and self._wal_end == other._wal_end
            and self._sent == other._sent
            and self.payload == other.payload
        )

    __hash__ = None  # type: ignore[assignment]  # mutable payload buffers are not hashable

    def __repr__(self) -> str:
        return (
            f"XLogData(data_start={self.data_start!r}, wal_end={self.wal_end!r}, "
            f"send_time={self.send_time!r}, payload=<{len(self.payload)} bytes>)"
        )


class PrimaryKeepalive(_SentAt):
    """The server is alive; everything before ``wal_end`` has been sent.

    A walsender that has caught up sends one each time it waits for WAL while the client has
    not confirmed all it sent, which on a busy stream is about once per transaction: like
    ``XLogData``'s, its ``send_time`` is a datetime only when read (see ``_SentAt``)."""

    __slots__ = ("reply_requested", "wal_end")

    wal_end: LSN
    reply_requested: bool

    def __init__(self, wal_end: LSN, send_time: datetime | int, reply_requested: bool) -> None:
        self.wal_end = wal_end
        self._sent = send_time if isinstance(send_time, int) else to_pg_timestamp(send_time)
        self.reply_requested = reply_requested

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PrimaryKeepalive):
            return NotImplemented
        return (
            self.wal_end == other.wal_end
            and self._sent == other._sent
            and self.reply_requested == other.reply_requested
        )

    def __hash__(self) -> int:
        return hash((self.wal_end, self._sent, self.reply_requested))

    def __repr__(self) -> str:
        return (
            f"PrimaryKeepalive(wal_end={self.wal_end!r}, send_time={self.send_time!r}, "
            f"reply_requested={self.reply_requested!r})"
        )


def parse_copy_data(
    buf: bytes | memoryview, max_size: int = DEFAULT_MAX_MESSAGE_SIZE
) -> XLogData | PrimaryKeepalive:
    """Parse one server-to-client CopyData payload of a replication stream.

    Raises ProtocolError for an empty, truncated, oversized or unknown message.
    """
    size = len(buf)
    if size > max_size:
        raise ProtocolError(
            f"replication message of {size} bytes exceeds the {max_size}-byte limit; "
            "the stream is corrupt or the limit (max_size) is too low"
        )
    if size == 0:
        raise ProtocolError("empty CopyData message in replication stream")
    kind = buf[0]
    if kind == XLOG_DATA:
        return parse_xlog_data(buf)
    if kind == PRIMARY_KEEPALIVE:
        if size != _KEEPALIVE_SIZE:
            raise ProtocolError(
                f"primary keepalive must be {_KEEPALIVE_SIZE} bytes, got {size} "
                f"({'truncated' if size < _KEEPALIVE_SIZE else 'oversized'})"
            )
        end, sent, reply = _KEEPALIVE.unpack_from(buf, 1)
        if reply > 1:
            raise ProtocolError(f"primary keepalive reply flag must be 0 or 1, got {reply}")
        if not MIN_SEND_TIME <= sent <= MAX_SEND_TIME:
            from_pg_timestamp(sent)  # raises the ProtocolError that explains it
        return PrimaryKeepalive(_new_int(LSN, end), sent, reply == 1)
    raise ProtocolError(
        f"unknown replication message type {chr(kind)!r} (0x{kind:02x}); expected XLogData "
        "'w' or primary keepalive 'k'"
    )


def parse_xlog_data(buf: bytes | memoryview) -> XLogData:
    """Parse one CopyData payload already known to start with 'w' (the stream's hot path;
    ``parse_copy_data`` does the other checks). ``payload`` is a view of ``buf`` past the
    header when ``buf`` is a memoryview."""
    try:
        start, end, sent = XLOG_HEADER.unpack_from(buf, 1)
    except struct.error:
        raise ProtocolError(
            f"truncated XLogData: {len(buf)} bytes, the header alone needs {XLOG_HEADER_SIZE}"
        ) from None
    if not MIN_SEND_TIME <= sent <= MAX_SEND_TIME:
        from_pg_timestamp(sent)  # raises the ProtocolError that explains it
    # wal_end is made an LSN when read: rarely, and not per message.
    return XLogData(_new_int(LSN, start), end, sent, buf[XLOG_HEADER_SIZE:])


def _now_microseconds(now: datetime | None) -> int:
    return to_pg_timestamp(now if now is not None else datetime.now(UTC))


def standby_status_update(
    write: LSN,
    flush: LSN,
    apply: LSN,
    now: datetime | None = None,
    reply_requested: bool = False,
) -> bytes:
    """The 'r' message: positions received, durably stored and applied by this client.

    For a logical slot the server takes ``flush`` as the new confirmed_flush_lsn, so it must
    never exceed what the consumer has made durable.
    """
    return _STATUS_UPDATE.pack(
        b"r", write, flush, apply, _now_microseconds(now), 1 if reply_requested else 0
    )


def hot_standby_feedback(
    xmin: int,
    xmin_epoch: int,
    catalog_xmin: int = 0,
    catalog_xmin_epoch: int = 0,
    now: datetime | None = None,
) -> bytes:
    """The 'h' message: the oldest transaction a physical standby still needs (0 = none)."""
    for name, value in (
        ("xmin", xmin),
        ("xmin_epoch", xmin_epoch),
        ("catalog_xmin", catalog_xmin),
        ("catalog_xmin_epoch", catalog_xmin_epoch),
    ):
        if not 0 <= value <= 0xFFFFFFFF:
            raise InvalidArgument(f"{name} must fit in 32 unsigned bits, got {value}")
    return _HOT_STANDBY_FEEDBACK.pack(
        b"h", _now_microseconds(now), xmin, xmin_epoch, catalog_xmin, catalog_xmin_epoch
    )
