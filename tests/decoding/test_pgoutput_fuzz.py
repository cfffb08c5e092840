"""Property tests: mutated or truncated real pgoutput payloads decode to events or raise
``DecodeError``, never any other exception, and never corrupt the state for what follows; the
receiver's inlined ``decode_one`` decodes and fails exactly as ``decode_one``."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pgcdc.decoding.pgoutput import PgOutputDecoder, Streaming
from pgcdc.decoding.state import DecoderState
from pgcdc.errors import DecodeError
from pgcdc.events import Event
from pgcdc.lsn import LSN
from tests.conftest import examples
from tests.decoding.test_pgoutput_bytes import FIXTURES, SAMPLES

AT = LSN(0x16_0000_0000)


def _captured() -> list[tuple[int, DecoderState, bytes]]:
    """(protocol, the state just before the payload, the payload) for each captured message
    of a distinct layout (the first few of each message type, to keep the pool small)."""
    cases = []
    for path in sorted(FIXTURES.glob("*.json")):
        proto = int(path.name.split("proto")[1][0])
        decoder = PgOutputDecoder(proto_version=proto)
        seen: dict[int, int] = {}
        for lsn, data in json.loads(path.read_text()):
            payload = bytes.fromhex(data)
            if seen.get(payload[0], 0) < 3:
                seen[payload[0]] = seen.get(payload[0], 0) + 1
                cases.append((proto, decoder.state.copy(), payload))
            decoder.decode(payload, LSN.parse(lsn))
    return cases


def _handmade() -> list[tuple[int, DecoderState, bytes]]:
    cases = []
    for proto, setup, payload in SAMPLES:
        decoder = PgOutputDecoder(proto_version=proto)
        for message in setup:
            decoder.decode(message, AT)
        cases.append((proto, decoder.state, payload))
    return cases


CASES = _captured() + _handmade()


def decode_or_decode_error(proto: int, state: DecoderState, payload: bytes) -> list[Event] | None:
    # The protocol 4 cases (captured and hand-made) come from streams with streaming=parallel.
    streaming: Streaming | None = "parallel" if proto == 4 else None
    decoder = PgOutputDecoder(state.copy(), proto_version=proto, streaming=streaming)
    try:
        events = decoder.decode(payload, AT)
        for event in events:  # rows are checked by their consumer: here, on first use
            for row in (getattr(event, "new", None), getattr(event, "old", None)):
                if row is not None:
                    tuple(row)
        return events
    except DecodeError as exc:
        assert str(exc)  # every error says something
        return None


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    st.tuples(st.just("cut"), st.integers(0, 10_000), st.just(0)),
    st.tuples(st.just("insert"), st.integers(0, 10_000), st.integers(0, 255)),
    st.tuples(st.just("delete"), st.integers(0, 10_000), st.just(0)),
)


def mutate(payload: bytes, steps: list[tuple[str, int, int]]) -> bytes:
    data = bytearray(payload)
    for kind, where, value in steps:
        at = where % (len(data) + 1)
        if kind == "flip" and data:
            data[at % len(data)] ^= value
        elif kind == "cut":
            del data[at:]
        elif kind == "insert":
            data[at:at] = bytes([value])
        elif kind == "delete" and data:
            del data[at % len(data)]
    return bytes(data)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=st.sampled_from(CASES), steps=st.lists(mutation, min_size=1, max_size=4))
def test_mutated_payloads_raise_only_decode_error(
    case: tuple[int, DecoderState, bytes], steps: list[tuple[str, int, int]]
) -> None:
    proto, state, payload = case
    decode_or_decode_error(proto, state, mutate(payload, steps))


@settings(max_examples=examples(200), deadline=None)
@given(case=st.sampled_from(CASES), data=st.data())
def test_truncated_payloads_raise_decode_error(
    case: tuple[int, DecoderState, bytes], data: st.DataObject
) -> None:
    proto, state, payload = case
    cut = data.draw(st.integers(0, len(payload) - 1))
    assert decode_or_decode_error(proto, state, payload[:cut]) is None


@settings(max_examples=examples(200), deadline=None)
@given(payload=st.binary(max_size=64), proto=st.integers(1, 4))
def test_random_bytes_raise_only_decode_error(payload: bytes, proto: int) -> None:
    decode_or_decode_error(proto, CASES[-1][1], payload)


def _inlined(decoder: PgOutputDecoder, payload: bytes) -> Event:
    """``decode_one`` as the receiver's loop inlines it: the handler by message type, and on
    an exception ``reraise``."""
    try:
        return decoder.handlers[payload[0]](payload, AT)
    except Exception as exc:
        decoder.reraise(exc, payload, AT)


def _outcome(decode: Callable[[PgOutputDecoder], Event], proto: int, state: DecoderState) -> Any:
    streaming: Streaming | None = "parallel" if proto == 4 else None
    decoder = PgOutputDecoder(state.copy(), proto_version=proto, streaming=streaming)
    try:
        event = decode(decoder)
    except Exception as exc:
        return type(exc), str(exc), exc.__suppress_context__
    return pickle.dumps(event), pickle.dumps(decoder.state)


@settings(max_examples=examples(400), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=st.sampled_from(CASES),
    steps=st.lists(mutation, max_size=4),
    payload=st.binary(max_size=8),
    random=st.booleans(),
)
def test_the_inlined_decode_one_decodes_and_fails_as_decode_one(
    case: tuple[int, DecoderState, bytes],
    steps: list[tuple[str, int, int]],
    payload: bytes,
    random: bool,
) -> None:
    proto, state, captured = case
    data = payload if random else mutate(captured, steps)
    reference = _outcome(lambda decoder: decoder.decode_one(data, AT), proto, state)
    assert _outcome(lambda decoder: _inlined(decoder, data), proto, state) == reference
