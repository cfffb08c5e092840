"""``decode_batch`` (runs of change messages decoded column by column) gives the batches and
events of the reference path, ``decode_one`` per message then ``rows_to_arrow`` value by
value, and raises the same typed errors on bad input."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.decoding import arrow, batch
from pgcdc.decoding.batch import DecodedBatch, decode_batch, decode_many
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions
from pgcdc.errors import DecodeError, UnknownRelation
from pgcdc.events import UNCHANGED_TOAST, Delete, EncodedRow, Insert, RawValue, Update
from pgcdc.lsn import LSN
from tests.conftest import examples

from .test_columnar import comparable

Messages = list[tuple[LSN, bytes]]


def reference(messages: Messages, proto_version: int = 2) -> Any:
    """decode_one for every message, its rows checked at once, and rows_to_arrow value by
    value."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch._Run, "decode", lambda *args: None)
        patch.setattr(arrow, "COLUMNAR_MIN_ROWS", 10**9)
        patch.setattr(arrow, "_fast_column", lambda *args: None)
        return summary(lambda: run(messages, proto_version))


def columnar_path(messages: Messages, proto_version: int = 2) -> Any:
    used: list[bool] = []
    original = batch._Run.decode

    def recording(self: Any, messages: Any) -> Any:
        found = original(self, messages)
        used.append(found is not None)
        return found

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch._Run, "decode", recording)
        patch.setattr(batch, "MIN_COLUMNAR_RUN", 1)
        result = summary(lambda: run(messages, proto_version))
    return result, used


def run(messages: Messages, proto_version: int) -> DecodedBatch:
    decoder = PgOutputDecoder(proto_version=proto_version)
    payloads = [payload for _, payload in messages]
    return decode_batch(decoder, payloads, [lsn for lsn, _ in messages])


def summary(build: Any) -> Any:
    try:
        decoded = build()
    except (DecodeError, UnknownRelation) as exc:
        return (type(exc).__name__, str(exc))
    return (
        [(index, repr(event)) for index, event in decoded.events],
        [
            (
                change.table.qualified_name,
                change.positions.tolist(),
                change.ops.to_pylist(),
                comparable(change.new),
                None if change.old is None else comparable(change.old),
                change.old_is_key.tolist(),
            )
            for change in decoded.changes
        ],
    )


# --- a real server -----------------------------------------------------------------------------


@pytest.mark.parametrize("binary", [False, True])
def test_server_stream_equals_the_reference(db: Any, binary: bool) -> None:
    db.execute(
        "CREATE TABLE a (id bigint PRIMARY KEY, name text, price numeric(10,2), at timestamptz,"
        " d date, flag boolean, tags text[], blob bytea, u uuid, big text);"
        "ALTER TABLE a ALTER big SET STORAGE EXTERNAL;"
        "CREATE TABLE b (k int, v float8) ;"
        "ALTER TABLE b REPLICA IDENTITY FULL;"
        "CREATE PUBLICATION pub FOR ALL TABLES"
    )
    db.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    db.execute(
        "INSERT INTO a SELECT g, 'név ' || g, g / 7.0, '2024-01-01'::timestamptz + g * interval"
        " '1 hour', CASE WHEN g % 5 = 0 THEN 'infinity'::date ELSE '0044-03-15 BC' END,"
        " g % 2 = 0, ARRAY['x' || g, NULL, 'a b'], decode(md5(g::text), 'hex'),"
        " md5(g::text)::uuid, CASE WHEN g % 3 = 0 THEN repeat('long ', 10000) END"
        " FROM generate_series(1, 40) g"
    )
    db.execute("INSERT INTO b SELECT g, g / 3.0 FROM generate_series(1, 20) g")
    db.execute("UPDATE a SET price = 'NaN', flag = NULL WHERE id % 4 = 0")  # big unchanged
    db.execute("UPDATE a SET id = id + 1000 WHERE id % 9 = 0")  # old key sent
    db.execute("UPDATE b SET v = v + 1 WHERE k % 2 = 0")  # old row (FULL)
    db.execute("DELETE FROM a WHERE id % 5 = 1")
    db.execute("DELETE FROM b WHERE k > 15")
    with db.connect() as conn:
        version = conn.info.server_version
    options = PgOutputOptions(["pub"], proto_version=2, binary=binary).for_server(version)
    flat = [item for pair in options.items() for item in pair]
    messages = [
        (LSN.parse(lsn), bytes(data))
        for lsn, data in db.execute(
            "SELECT lsn::text, data FROM pg_logical_slot_peek_binary_changes('s', NULL, NULL, "
            "VARIADIC %s::text[])",
            (flat,),
        )
    ]
    expected = reference(messages)
    found, used = columnar_path(messages)
    assert found == expected
    assert used and all(used)  # every run went the columnar way
    built: list[bool] = []
    original = batch._Run.events

    def recording(self: Any, *args: Any) -> Any:
        events = original(self, *args)
        built.append(events is not None)
        return events

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch, "MIN_COLUMNAR_RUN", 1)
        patch.setattr(batch._Run, "events", recording)
        assert events_outcome(many, messages) == events_outcome(one_by_one, messages)
    assert built and all(built)
    changes = expected[1]
    assert sum(len(c[1]) for c in changes) == 40 + 20 + 10 + 4 + 10 + 8 + 5
    new_of_a = [c[3] for c in changes if c[0] == "public.a"]
    assert any("['big']" in repr(new) for new in new_of_a)  # unchanged TOAST, by name
    assert any("'infinity'" in repr(new) for new in new_of_a)  # kept as text


# --- generated streams -------------------------------------------------------------------------

OID = 16400


def relation(oid: int, width: int) -> bytes:
    body = struct.pack("!I", oid) + b"public\0t" + str(oid).encode() + b"\0f"
    body += struct.pack("!H", width)
    for i in range(width):
        body += b"\1" + f"c{i}".encode() + b"\0" + struct.pack("!Ii", 23 if i == 0 else 25, -1)
    return b"R" + body


def tuple_data(row: tuple[RawValue, ...]) -> bytes:
    return EncodedRow.from_values(row).data


values = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.text(max_size=8),
    st.binary(max_size=8),
)
rows = st.tuples(st.integers(0, 99).map(str), values, values)


@st.composite
def streams(draw: st.DrawFn) -> Messages:
    """Relations, changes of two tables (some inside a stream block, with the xid prefix)
    and, sometimes, a garbled message."""
    payloads = [relation(OID, 3), relation(OID + 1, 3), b"S" + struct.pack("!IB", 77, 1)]
    in_stream = True
    for _ in range(draw(st.integers(0, 30))):
        if draw(st.integers(0, 7)) == 0:  # transaction boundaries: a run goes on across them
            payloads.append(
                draw(st.sampled_from([b"B" + struct.pack("!QqI", 5, 6, 77), b"C" + bytes(25)]))
            )
            continue
        if draw(st.integers(0, 9)) == 0:
            payloads.append(b"E" if in_stream else b"S" + struct.pack("!IB", 77, 0))
            in_stream = not in_stream
            continue
        prefix = struct.pack("!I", 77) if in_stream else b""
        oid = struct.pack("!I", draw(st.sampled_from([OID, OID + 1])))
        new, old = tuple_data(draw(rows)), tuple_data(draw(rows))
        payloads.append(
            draw(
                st.sampled_from(
                    [
                        b"I" + prefix + oid + b"N" + new,
                        b"U" + prefix + oid + b"N" + new,
                        b"U" + prefix + oid + b"K" + old + b"N" + new,
                        b"U" + prefix + oid + b"O" + old + b"N" + new,
                        b"D" + prefix + oid + b"K" + old,
                        b"D" + prefix + oid + b"O" + old,
                    ]
                )
            )
        )
    if draw(st.booleans()) and len(payloads) > 3:
        index = draw(st.integers(3, len(payloads) - 1))
        garbled = bytearray(payloads[index])
        if len(garbled) < 2:
            garbled += b"x"
        if draw(st.booleans()):
            del garbled[draw(st.integers(1, len(garbled))) :]
        else:
            garbled[draw(st.integers(1, len(garbled) - 1))] = draw(st.integers(0, 255))
        payloads[index] = bytes(garbled)
    return [(LSN(100 + i), payload) for i, payload in enumerate(payloads)]


@settings(max_examples=examples(300), deadline=None)
@given(streams())
def test_generated_streams_equal_the_reference(messages: Messages) -> None:
    expected = reference(messages)
    found, _ = columnar_path(messages)
    assert found == expected
    # With the default threshold these short runs go message by message: the same again.
    assert summary(lambda: run(messages, 2)) == expected


def test_a_change_before_its_relation_is_an_unknown_relation() -> None:
    messages = [(LSN(1), b"I" + struct.pack("!I", OID) + b"N" + tuple_data(("1", "a", "b")))]
    found, _ = columnar_path(messages)
    assert found[0] == "UnknownRelation"
    assert found == reference(messages)


# --- decode_many: the events of decode_one -----------------------------------------------------


def events_outcome(decode: Any, messages: Messages) -> Any:
    decoder = PgOutputDecoder(proto_version=2)
    try:
        events = decode(decoder, messages)
    except (DecodeError, UnknownRelation) as exc:
        return (type(exc).__name__, str(exc))
    return [(type(event).__name__, event, described(event)) for event in events]


def described(event: Any) -> Any:
    """An event as its repr, its rows as their bytes: the rows are left unchecked, and a
    malformed one raises when read (compared by equality of bytes, it does not)."""
    if isinstance(event, Insert | Update | Delete):
        rows = [getattr(event, name, None) for name in ("new", "old")]
        assert all(row is None or type(row) is EncodedRow for row in rows)
        data = [None if row is None else row.data for row in rows]
        return (event.lsn, event.table, data, getattr(event, "old_is_key", None), event.xid)
    return repr(event)


def one_by_one(decoder: PgOutputDecoder, messages: Messages) -> list[Any]:
    return [decoder.decode_one(memoryview(payload), lsn) for lsn, payload in messages]


def many(decoder: PgOutputDecoder, messages: Messages) -> list[Any]:
    payloads = [memoryview(payload) for _, payload in messages]
    return decode_many(decoder, payloads, [lsn for lsn, _ in messages])


@settings(max_examples=examples(300), deadline=None)
@given(streams())
def test_decode_many_gives_the_events_of_decode_one(messages: Messages) -> None:
    expected = events_outcome(one_by_one, messages)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(batch, "MIN_COLUMNAR_RUN", 1)
        assert events_outcome(many, messages) == expected
    assert events_outcome(many, messages) == expected
