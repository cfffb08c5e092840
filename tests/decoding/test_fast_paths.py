"""The fast paths of decoding agree with the careful ones they shortcut.

pgoutput's tuple reader is compared with the field-by-field checked reader over generated
TupleData (valid and garbled), and over real streams from PG15 and PG18 with values that take
its slower branches (non-ASCII text, lengths whose bytes are not ASCII, NULL and unchanged last
columns, binary mode).
"""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.decoding.pgoutput import (
    PgOutputDecoder,
    PgOutputOptions,
    _read_tuple,
    _read_tuple_checked,
)
from pgcdc.errors import DecodeError
from pgcdc.events import UNCHANGED_TOAST, Delete, Insert, RawValue, Update
from pgcdc.lsn import LSN

TABLE_OID = 16390


def encode_tuple(row: tuple[RawValue, ...]) -> bytes:
    out = struct.pack("!H", len(row))
    for value in row:
        if value is None:
            out += b"n"
        elif value is UNCHANGED_TOAST:
            out += b"u"
        elif isinstance(value, str):
            data = value.encode()
            out += b"t" + struct.pack("!I", len(data)) + data
        else:
            assert isinstance(value, bytes)
            out += b"b" + struct.pack("!I", len(value)) + value
    return out


def relation(width: int) -> bytes:
    body = struct.pack("!I", TABLE_OID) + b"public\0t\0d" + struct.pack("!H", width)
    for i in range(width):
        body += b"\0" + f"c{i}".encode() + b"\0" + struct.pack("!Ii", 25, -1)
    return b"R" + body


values = st.one_of(
    st.none(),
    st.just(UNCHANGED_TOAST),
    st.text(max_size=300),
    st.binary(max_size=300),
)
rows = st.lists(values, min_size=0, max_size=12).map(tuple)


def outcome(read: Any, buf: bytes, pos: int) -> Any:
    try:
        return read(buf, pos)
    except (DecodeError, struct.error, IndexError, UnicodeDecodeError) as exc:
        return type(exc), str(exc)


@settings(max_examples=300, deadline=None)
@given(rows)
def test_tuple_reader_reads_what_was_written(row: tuple[RawValue, ...]) -> None:
    data = b"xyz" + encode_tuple(row)
    assert _read_tuple(data, 3) == (row, len(data))
    assert _read_tuple_checked(data, 3) == (row, len(data))


@settings(max_examples=500, deadline=None)
@given(rows, st.data())
def test_garbled_tuples_fail_or_succeed_like_the_checked_reader(
    row: tuple[RawValue, ...], data: st.DataObject
) -> None:
    buf = bytearray(encode_tuple(row))
    if buf and data.draw(st.booleans()):
        buf = buf[: data.draw(st.integers(0, len(buf) - 1))]  # truncated
    for _ in range(data.draw(st.integers(0, 3))):
        if buf:
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    garbled = bytes(buf)
    assert outcome(_read_tuple, garbled, 0) == outcome(_read_tuple_checked, garbled, 0)


@settings(max_examples=200, deadline=None)
@given(st.lists(rows.filter(lambda r: len(r) == 4), min_size=1, max_size=5))
def test_changes_from_bytes_and_memoryview_equal_constructed_events(
    changes: list[tuple[RawValue, ...]],
) -> None:
    decoders = [PgOutputDecoder(), PgOutputDecoder()]
    for decoder in decoders:
        decoder.decode_one(relation(4), LSN(1))
    table = decoders[0].state.relations[TABLE_OID]
    oid = struct.pack("!I", TABLE_OID)
    for number, row in enumerate(changes):
        lsn = LSN(100 + number)
        tuple_data = encode_tuple(row)
        messages = {
            b"I" + oid + b"N" + tuple_data: Insert(lsn, table, row),
            b"U" + oid + b"O" + tuple_data + b"N" + tuple_data: Update(lsn, table, row, row, False),
            b"U" + oid + b"N" + tuple_data: Update(lsn, table, row),
            b"D" + oid + b"K" + tuple_data: Delete(lsn, table, row, True),
        }
        for payload, expected in messages.items():
            from_bytes = decoders[0].decode_one(payload, lsn)
            from_view = decoders[1].decode_one(memoryview(b"w" + payload)[1:], lsn)
            assert from_bytes == expected
            assert from_view == expected
            assert type(from_bytes) is type(expected)
            assert repr(from_bytes) == repr(expected)


def test_bad_column_kind_names_the_problem() -> None:
    decoder = PgOutputDecoder()
    decoder.decode_one(relation(2), LSN(1))
    payload = b"I" + struct.pack("!I", TABLE_OID) + b"N\0\2nx"
    with pytest.raises(DecodeError, match="unknown column kind"):
        decoder.decode_one(payload, LSN(2))
    long = b"I" + struct.pack("!I", TABLE_OID) + b"N\0\2t\0\0\1\0abc"
    with pytest.raises(DecodeError, match="runs past the message end"):
        decoder.decode_one(long, LSN(2))


# --- real streams -----------------------------------------------------------------------------

SERVER_ROWS = [
    "(1, 'plain', NULL, NULL)",
    "(2, 'grüße ✓ 𝄞', 'x', NULL)",
    "(3, repeat('é', 200), repeat('a', 200), decode(repeat('ff', 300), 'hex'))",
    "(4, '', '', '')",
    "(5, repeat('long ', 100000), NULL, '\\x00'::bytea)",
]
TEXT_FORM = "SELECT id::text, t, v::text, b::text FROM fast ORDER BY id"
BINARY_FORM = "SELECT int4send(id), textsend(t), varcharsend(v), byteasend(b) FROM fast ORDER BY id"


@pytest.mark.parametrize("binary", [False, True])
def test_real_stream_rows_equal_the_servers_output(db: Any, binary: bool) -> None:
    db.execute(
        "CREATE TABLE fast (id int PRIMARY KEY, t text, v varchar, b bytea);"
        "CREATE PUBLICATION pub FOR TABLE fast"
    )
    db.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    db.execute(f"INSERT INTO fast VALUES {', '.join(SERVER_ROWS)}")
    expected = [
        tuple(None if v is None else bytes(v) if binary else v for v in row)
        for row in db.execute(BINARY_FORM if binary else TEXT_FORM)
    ]
    db.execute("UPDATE fast SET v = 'changed' WHERE id = 5")  # t is TOASTed: unchanged
    db.execute("DELETE FROM fast WHERE id = 2")
    with db.connect() as conn:
        version = conn.info.server_version
    options = PgOutputOptions(["pub"], proto_version=1, binary=binary).for_server(version)
    flat = [item for pair in options.items() for item in pair]
    changes = db.execute(
        "SELECT lsn::text, data FROM pg_logical_slot_get_binary_changes('s', NULL, NULL, "
        "VARIADIC %s::text[])",
        (flat,),
    )
    decoder = PgOutputDecoder()
    events = [decoder.decode_one(memoryview(data), LSN.parse(lsn)) for lsn, data in changes]
    assert [e.new for e in events if isinstance(e, Insert)] == expected
    (update,) = [e for e in events if isinstance(e, Update)]
    assert update.new[1] is UNCHANGED_TOAST
    assert update.new[2] == (b"changed" if binary else "changed")
    (delete,) = [e for e in events if isinstance(e, Delete)]
    assert delete.old[0] == expected[1][0]
