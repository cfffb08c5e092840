"""Rows checked as a batch: the pgoutput decoder does not walk the rows that end a message
(Insert, Delete, an Update's new row), and their consumer checks many at once
(``first_unreadable_row``, the change log writer's check). Together they refuse what reading
every row with ``read_tuple_reference`` refuses (byte fixtures, garbled payloads, generated
rows), and the writer refuses a bad row with a typed error that names it."""

from __future__ import annotations

import struct
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.changelog import ChangeLog
from pgcdc.decoding.columnar import first_unreadable_row
from pgcdc.decoding.pgoutput import PgOutputDecoder, Streaming
from pgcdc.decoding.state import DecoderState
from pgcdc.errors import DecodeError
from pgcdc.events import (
    Delete,
    EncodedRow,
    Event,
    Insert,
    RawValue,
    Relation,
    Update,
    decode_tuple_data,
)
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction
from pgcdc.tupledata import read_tuple_reference, trailing_bytes_error
from tests.conftest import examples
from tests.decoding.test_fast_paths import TABLE_OID, encode_tuple, relation, rows
from tests.decoding.test_pgoutput_fuzz import CASES, mutate, mutation

AT = LSN(0x16_0000_0000)


def _decoder(proto: int, state: DecoderState) -> PgOutputDecoder:
    streaming: Streaming | None = "parallel" if proto == 4 else None
    return PgOutputDecoder(state.copy(), proto_version=proto, streaming=streaming)


def _rows(events: list[Event]) -> list[EncodedRow]:
    found = []
    for event in events:
        if isinstance(event, Insert | Update | Delete):
            for row in (getattr(event, "new", None), getattr(event, "old", None)):
                if row is not None:
                    assert type(row) is EncodedRow
                    found.append(row)
    return found


def _checked_later(decoder: PgOutputDecoder, payload: bytes) -> list[Event] | type[DecodeError]:
    """Decode, then check the rows as the change log writer does: all at once."""
    try:
        events = decoder.decode(payload, AT)
    except DecodeError:
        return DecodeError
    rows = [row.data for row in _rows(events)]
    if first_unreadable_row(pa.array(rows, pa.binary())) is not None:
        return DecodeError
    return events


def _reference(decoder: PgOutputDecoder, payload: bytes) -> list[Event] | type[DecodeError]:
    """Decode, then read each row with the reference, as a server's UTF-8 (strict)."""
    try:
        events = decoder.decode(payload, AT)
        for row in _rows(events):
            values, end = read_tuple_reference(row.data)
            if end != len(row.data):
                raise trailing_bytes_error(len(row.data) - end)
            assert values == row
    except DecodeError:
        return DecodeError
    return events


def _has_encoded_surrogate(payload: bytes) -> bool:
    # UTF-8 of U+D800..U+DFFF: ED A0..BF xx. EncodedRow reads them (surrogatepass); the
    # checked decoder refuses them. A UTF8 server never sends them.
    return any(
        payload[i] == 0xED and 0xA0 <= payload[i + 1] <= 0xBF for i in range(len(payload) - 1)
    )


def test_fixtures_pass_the_batch_check_as_the_reference() -> None:
    changes = 0
    for proto, state, payload in CASES:
        expected = _reference(_decoder(proto, state), payload)
        got = _checked_later(_decoder(proto, state), payload)
        assert got == expected
        if isinstance(got, list):
            changes += sum(isinstance(e, Insert | Update | Delete) for e in got)
    assert changes > 10


@settings(max_examples=examples(500), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), steps=st.lists(mutation, min_size=1, max_size=4))
def test_garbled_payloads_are_refused_by_the_batch_check_exactly_when_by_the_reference(
    case: tuple[int, DecoderState, bytes], steps: list[tuple[str, int, int]]
) -> None:
    proto, state, payload = case
    garbled = mutate(payload, steps)
    expected = _reference(_decoder(proto, state), garbled)
    got = _checked_later(_decoder(proto, state), garbled)
    if got != expected:
        assert expected is DecodeError and _has_encoded_surrogate(garbled)


def test_an_insert_row_is_not_walked_but_its_width_is_checked() -> None:
    decoder = PgOutputDecoder()
    decoder.decode(relation(2), AT)
    head = b"I" + struct.pack("!I", TABLE_OID) + b"N"
    with pytest.raises(DecodeError, match="has 3 columns but the Relation"):
        decoder.decode_one(head + encode_tuple(("1", "2", "3")), AT)
    bad = head + b"\x00\x02t\x00\x00\x00\x09x"  # a value running past the end
    event = decoder.decode_one(bad, AT)
    assert isinstance(event, Insert) and type(event.new) is EncodedRow
    with pytest.raises(DecodeError, match="runs past the end"):
        event.new.values  # noqa: B018 - reading it checks it


def _garble(data: bytes, draw: st.DrawFn) -> bytes:
    buf = bytearray(data)
    if buf and draw(st.booleans()):
        del buf[draw(st.integers(0, len(buf) - 1)) :]
    for _ in range(draw(st.integers(0, 2))):
        if buf:
            buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        buf += b"x"
    return bytes(buf)


@st.composite
def row_batches(draw: st.DrawFn) -> list[bytes | None]:
    batch: list[bytes | None] = []
    for row in draw(st.lists(rows, max_size=12)):
        data = encode_tuple(row)
        choice = draw(st.integers(0, 5))
        batch.append(None if choice == 0 else _garble(data, draw) if choice == 1 else data)
    return batch


def _first_bad(batch: list[bytes | None]) -> int | None:
    for index, data in enumerate(batch):
        if data is None:
            continue
        try:
            decode_tuple_data(data)
        except DecodeError:
            return index
    return None


@settings(max_examples=examples(400), deadline=None)
@given(row_batches(), st.integers(0, 3))
def test_first_unreadable_row_is_the_first_row_decoding_refuses(
    batch: list[bytes | None], skip: int
) -> None:
    array = pa.array([b"pad"] * skip + batch, pa.binary()).slice(skip)
    found = first_unreadable_row(array)
    expected = _first_bad(batch)
    assert (found and found[0]) == expected
    if found is not None:
        with pytest.raises(DecodeError) as error:
            decode_tuple_data(batch[found[0]] or b"")
        assert found[1] == str(error.value)


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(rows, min_size=1, max_size=30))
def test_readable_rows_pass_in_one_go(batch: list[tuple[RawValue, ...]]) -> None:
    assert first_unreadable_row(pa.array([encode_tuple(r) for r in batch], pa.binary())) is None


def test_the_change_log_refuses_an_unreadable_row_and_logs_nothing_of_its_batch(
    tmp_path: Path,
) -> None:
    decoder = PgOutputDecoder()
    defined = decoder.decode_one(relation(2), AT)
    assert isinstance(defined, Relation)
    table = defined.table
    head = b"I" + struct.pack("!I", TABLE_OID) + b"N"
    good = decoder.decode_one(head + encode_tuple(("1", "é")), LSN(AT + 1))
    bad = decoder.decode_one(head + b"\x00\x02t\x00\x00\x00\x01\xffn", LSN(AT + 2))

    def txn(commit: int, *events: Event) -> CommittedTransaction:
        return CommittedTransaction(
            7, LSN(AT + commit), LSN(AT + commit + 8), datetime(2026, 1, 1, tzinfo=UTC), events
        )

    log = ChangeLog(tmp_path)
    with log.writer() as writer:
        assert writer.append(txn(0x10, good)) and writer.append(txn(0x20, good, bad))
        with pytest.raises(DecodeError) as error:
            writer.flush()
        message = str(error.value)
        assert f"LSN {LSN(AT + 2)}" in message and f"{table.qualified_name}" in message
        assert "invalid UTF-8" in message or "utf-8" in message.lower()
        with pytest.raises(DecodeError):
            writer.close()
    assert list(log.read_transactions()) == []
