"""The COPY-BOTH codec against hand-written byte fixtures (big-endian, PostgreSQL's epoch)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.connection.protocol import (
    PG_EPOCH,
    PrimaryKeepalive,
    XLogData,
    from_pg_timestamp,
    hot_standby_feedback,
    parse_copy_data,
    standby_status_update,
    to_pg_timestamp,
)
from pgcdc.errors import InvalidArgument, ProtocolError
from pgcdc.lsn import LSN

# 2000-01-02 00:00:00 UTC is 86_400_000_000 microseconds after the epoch = 0x141DD76000.
ONE_DAY = b"\x00\x00\x00\x14\x1d\xd7\x60\x00"
XLOG_DATA = (
    b"w"
    + b"\x00\x00\x00\x01\x00\x00\x00\x28"  # data_start 1/28
    + b"\x00\x00\x00\x01\x00\x00\x00\x30"  # wal_end 1/30
    + ONE_DAY
    + b"BEGIN 42"
)
KEEPALIVE = b"k" + b"\x00\x00\x00\x02\xff\xff\xff\xf0" + ONE_DAY + b"\x01"


def test_xlogdata_fields():
    message = parse_copy_data(XLOG_DATA)
    assert message == XLogData(
        data_start=LSN("1/28"),
        wal_end=LSN("1/30"),
        send_time=datetime(2000, 1, 2, tzinfo=UTC),
        payload=b"BEGIN 42",
    )
    assert isinstance(message, XLogData)
    assert type(message.data_start) is LSN
    assert type(message.wal_end) is LSN
    assert message.send_time_us == 86_400_000_000
    assert "payload=<8 bytes>" in repr(message)


def test_xlogdata_from_memoryview_keeps_a_view_of_the_buffer():
    buffer = bytearray(XLOG_DATA)
    message = parse_copy_data(memoryview(buffer))
    assert isinstance(message, XLogData)
    assert isinstance(message.payload, memoryview)
    assert message.payload.obj is buffer
    assert bytes(message.payload) == b"BEGIN 42"


def test_xlogdata_with_empty_payload():
    message = parse_copy_data(XLOG_DATA[:25])
    assert isinstance(message, XLogData)
    assert bytes(message.payload) == b""


def test_keepalive_fields():
    assert parse_copy_data(KEEPALIVE) == PrimaryKeepalive(
        wal_end=LSN("2/FFFFFFF0"),
        send_time=datetime(2000, 1, 2, tzinfo=UTC),
        reply_requested=True,
    )
    no_reply = parse_copy_data(KEEPALIVE[:-1] + b"\x00")
    assert isinstance(no_reply, PrimaryKeepalive)
    assert no_reply.reply_requested is False


def test_timestamps_before_the_epoch():
    # -1 microsecond: 1999-12-31 23:59:59.999999
    message = parse_copy_data(KEEPALIVE[:9] + b"\xff" * 8 + b"\x00")
    assert isinstance(message, PrimaryKeepalive)
    assert message.send_time == datetime(1999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC)


@pytest.mark.parametrize("length", range(25))
def test_truncated_xlogdata(length):
    with pytest.raises(ProtocolError, match=r"truncated XLogData|empty"):
        parse_copy_data(XLOG_DATA[:length])


@pytest.mark.parametrize("length", range(1, 18))
def test_truncated_keepalive(length):
    with pytest.raises(ProtocolError, match="truncated"):
        parse_copy_data(KEEPALIVE[:length])


def test_oversized_keepalive():
    with pytest.raises(ProtocolError, match="oversized"):
        parse_copy_data(KEEPALIVE + b"\x00")


def test_oversized_xlogdata():
    parse_copy_data(XLOG_DATA, max_size=len(XLOG_DATA))
    with pytest.raises(ProtocolError, match="exceeds"):
        parse_copy_data(XLOG_DATA, max_size=len(XLOG_DATA) - 1)


def test_unknown_message_type():
    with pytest.raises(ProtocolError, match="unknown replication message type 'r'"):
        parse_copy_data(b"r" + XLOG_DATA[1:])


def test_keepalive_reply_flag_must_be_boolean():
    with pytest.raises(ProtocolError, match="reply flag"):
        parse_copy_data(KEEPALIVE[:-1] + b"\x02")


def test_timestamp_beyond_datetime_range():
    with pytest.raises(ProtocolError, match="outside the range"):
        parse_copy_data(XLOG_DATA[:17] + b"\x7f" + b"\xff" * 7)
    # A keepalive's send time is made a datetime only when read, but checked when parsed.
    with pytest.raises(ProtocolError, match="outside the range"):
        parse_copy_data(KEEPALIVE[:9] + b"\x7f" + b"\xff" * 7 + b"\x00")


def test_a_keepalive_keeps_its_send_time_as_sent():
    message = parse_copy_data(KEEPALIVE)
    assert isinstance(message, PrimaryKeepalive)
    assert message.send_time_us == 86_400_000_000
    assert type(message.wal_end) is LSN
    # Given as microseconds or as a datetime: the same keepalive.
    assert message == PrimaryKeepalive(LSN("2/FFFFFFF0"), 86_400_000_000, True)
    assert hash(message) == hash(PrimaryKeepalive(LSN("2/FFFFFFF0"), 86_400_000_000, True))
    assert message != PrimaryKeepalive(LSN("2/FFFFFFF0"), 86_400_000_001, True)
    assert message != PrimaryKeepalive(LSN("2/FFFFFFF0"), 86_400_000_000, False)
    assert repr(message) == (
        "PrimaryKeepalive(wal_end=LSN('2/FFFFFFF0'), send_time=datetime.datetime(2000, 1, 2, 0, "
        "0, tzinfo=datetime.timezone.utc), reply_requested=True)"
    )


@given(st.binary(max_size=64))
def test_arbitrary_bytes_parse_or_raise_protocol_error(data):
    try:
        message = parse_copy_data(data)
    except ProtocolError:
        return
    assert isinstance(message, XLogData | PrimaryKeepalive)
    assert data[:1] in (b"w", b"k")


def test_standby_status_update_bytes():
    message = standby_status_update(
        LSN("1/28"), LSN("1/20"), LSN("1/18"), now=datetime(2000, 1, 2, tzinfo=UTC)
    )
    assert message == (
        b"r"
        + b"\x00\x00\x00\x01\x00\x00\x00\x28"
        + b"\x00\x00\x00\x01\x00\x00\x00\x20"
        + b"\x00\x00\x00\x01\x00\x00\x00\x18"
        + ONE_DAY
        + b"\x00"
    )
    asking = standby_status_update(LSN(0), LSN(0), LSN(0), now=PG_EPOCH, reply_requested=True)
    assert asking == b"r" + b"\x00" * 32 + b"\x01"


def test_standby_status_update_defaults_to_now():
    before = to_pg_timestamp(datetime.now(UTC))
    message = standby_status_update(LSN(1), LSN(1), LSN(1))
    after = to_pg_timestamp(datetime.now(UTC))
    sent = int.from_bytes(message[25:33], "big", signed=True)
    assert before <= sent <= after


def test_hot_standby_feedback_bytes():
    message = hot_standby_feedback(
        xmin=0x01020304,
        xmin_epoch=5,
        catalog_xmin=0xFFFFFFFF,
        catalog_xmin_epoch=6,
        now=datetime(2000, 1, 2, tzinfo=UTC),
    )
    assert message == (
        b"h"
        + ONE_DAY
        + b"\x01\x02\x03\x04"
        + b"\x00\x00\x00\x05"
        + b"\xff\xff\xff\xff"
        + b"\x00\x00\x00\x06"
    )


@pytest.mark.parametrize("field", ["xmin", "xmin_epoch", "catalog_xmin", "catalog_xmin_epoch"])
def test_hot_standby_feedback_rejects_out_of_range(field):
    values: dict[str, Any] = {
        "xmin": 1,
        "xmin_epoch": 0,
        "catalog_xmin": 0,
        "catalog_xmin_epoch": 0,
    }
    with pytest.raises(InvalidArgument, match=field):
        hot_standby_feedback(**{**values, field: 1 << 32})
    with pytest.raises(InvalidArgument, match=field):
        hot_standby_feedback(**{**values, field: -1})


def test_timestamp_helpers():
    assert to_pg_timestamp(PG_EPOCH) == 0
    assert to_pg_timestamp(datetime(2000, 1, 2)) == 86_400_000_000  # naive means UTC
    assert from_pg_timestamp(86_400_000_001) == datetime(2000, 1, 2, 0, 0, 0, 1, tzinfo=UTC)
    with pytest.raises(ProtocolError):
        from_pg_timestamp(-(1 << 63))


@given(st.datetimes(timezones=st.just(UTC)))
def test_timestamp_round_trip(moment):
    assert from_pg_timestamp(to_pg_timestamp(moment)) == moment


@given(st.integers(min_value=-(10**15), max_value=10**16))
def test_microseconds_round_trip(microseconds):
    moment = from_pg_timestamp(microseconds)
    assert moment - PG_EPOCH == timedelta(microseconds=microseconds)
    assert to_pg_timestamp(moment) == microseconds
