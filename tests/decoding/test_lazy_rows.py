"""EncodedRow, the one row form of pgoutput changes: the wire bytes behave as the tuple of their
values, hold exactly the row's TupleData, and bad input fails with a DecodeError at decode time
(what the decoder must walk: column counts, an Update's old row) or when the row is first read
or checked as part of a batch (byte fixtures, generated rows, real PG15/PG18 streams)."""

from __future__ import annotations

import pickle
import struct
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.decoding.arrow import rows_to_arrow
from pgcdc.decoding.columnar import first_unreadable_row
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions, Streaming
from pgcdc.decoding.values import row_to_python
from pgcdc.errors import DecodeError, InvalidRowValue
from pgcdc.events import (
    UNCHANGED_TOAST,
    Delete,
    EncodedRow,
    Insert,
    RawValue,
    Update,
    encode_tuple_data,
)
from pgcdc.lsn import LSN
from pgcdc.tupledata import read_tuple_reference
from tests.conftest import examples
from tests.decoding.test_fast_paths import TABLE_OID, encode_tuple, relation, rows
from tests.decoding.test_pgoutput_fuzz import CASES

AT = LSN(0x16_0000_0000)


# --- EncodedRow behaves as its tuple -------------------------------------------------------


@settings(max_examples=examples(300), deadline=None)
@given(rows)
def test_encoded_row_is_its_tuple(row: tuple[RawValue, ...]) -> None:
    data = encode_tuple_data(row)
    assert data == encode_tuple(row)  # the same bytes pgoutput sends
    encoded = EncodedRow(data)
    assert len(encoded) == len(row)
    assert encoded == row and row == encoded
    assert (encoded != row) is False
    assert tuple(encoded) == row and list(encoded) == list(row)
    assert [encoded[i] for i in range(len(row))] == list(row)
    assert encoded[1:3] == row[1:3] and encoded[-1:] == row[-1:]
    assert hash(encoded) == hash(row)
    assert repr(encoded) == f"EncodedRow({row!r})"
    assert encoded == EncodedRow.from_values(row) == EncodedRow.from_values(list(row))
    restored = pickle.loads(pickle.dumps(encoded))
    assert type(restored) is EncodedRow and restored.data == data and restored == row


@settings(max_examples=examples(200), deadline=None)
@given(rows, rows)
def test_encoded_rows_differ_when_values_differ(a: tuple[RawValue, ...], b: Any) -> None:
    assert (EncodedRow.from_values(a) == EncodedRow.from_values(b)) == (a == b)
    assert (EncodedRow.from_values(a) == b) == (a == b)


def test_encoded_row_is_immutable_and_not_a_list() -> None:
    row = EncodedRow.from_values(("1", None))
    with pytest.raises(AttributeError, match="immutable"):
        row._data = b""
    assert row != ["1", None]
    keyed: dict[Any, int] = {row: 1}
    assert keyed[("1", None)] == 1  # usable as the key a tuple would be


def test_lone_surrogates_round_trip_as_stored() -> None:
    row = ("text é \udcff", b"\xff")
    assert EncodedRow(encode_tuple_data(row)) == row


def test_values_that_are_not_raw_are_a_typed_error() -> None:
    with pytest.raises(InvalidRowValue, match="row value 5 of type int"):
        EncodedRow.from_values(("1", 5))  # type: ignore[arg-type]


# --- pgoutput rows are EncodedRows, checked by their consumer ------------------------------


def _decoder(width: int) -> PgOutputDecoder:
    decoder = PgOutputDecoder()
    decoder.decode(relation(width), AT)
    return decoder


def test_fixture_rows_are_encoded_rows_the_reference_reads_alike() -> None:
    """Every row of the byte fixtures is an EncodedRow holding exactly one TupleData: the
    reference reads it to its end, to the values the row gives."""
    rows_seen = 0
    for proto, state, payload in CASES:
        streaming: Streaming | None = "parallel" if proto == 4 else None
        decoder = PgOutputDecoder(state.copy(), proto_version=proto, streaming=streaming)
        try:
            events = decoder.decode(payload, AT)
        except DecodeError:
            continue
        for event in events:
            for row in (getattr(event, "new", None), getattr(event, "old", None)):
                if row is None:
                    continue
                assert type(row) is EncodedRow
                try:
                    values, end = read_tuple_reference(row.data)
                except DecodeError:
                    with pytest.raises(DecodeError):
                        tuple(row)
                    continue
                if end == len(row.data):
                    assert row == values
                    rows_seen += 1
                else:
                    with pytest.raises(DecodeError, match="unexpected trailing bytes"):
                        tuple(row)
    assert rows_seen > 10


def test_ascii_rows_stay_undecoded_until_read() -> None:
    decoder = _decoder(3)
    payload = b"I" + struct.pack("!I", TABLE_OID) + b"N" + encode_tuple(("1", None, "abc"))
    event = decoder.decode_one(memoryview(payload), AT)
    assert isinstance(event, Insert) and type(event.new) is EncodedRow
    assert event.new._values is None  # nothing decoded yet
    assert event.new == ("1", None, "abc")
    assert event.new._values == ("1", None, "abc")


def test_bad_utf8_fails_at_first_use_and_in_the_batch_check() -> None:
    decoder = _decoder(2)
    bad = b"I" + struct.pack("!I", TABLE_OID) + b"N\x00\x02t\x00\x00\x00\x02\xc3\x28n"
    event = decoder.decode_one(bad, AT)
    assert isinstance(event, Insert) and type(event.new) is EncodedRow
    with pytest.raises(DecodeError, match="text value of column 1 of 2 is not UTF-8"):
        tuple(event.new)
    found = first_unreadable_row(pa.array([encode_tuple(("a", "b")), event.new.data]))
    assert found is not None and found[0] == 1 and "not UTF-8" in found[1]


def test_width_mismatch_fails_at_decode_time_and_trailing_bytes_at_first_use() -> None:
    decoder = _decoder(2)
    head = b"I" + struct.pack("!I", TABLE_OID) + b"N"
    with pytest.raises(DecodeError, match="has 3 columns but the Relation"):
        decoder.decode_one(head + encode_tuple(("1", "2", "3")), AT)
    trailing = decoder.decode_one(head + encode_tuple(("1", "2")) + b"x", AT)
    assert isinstance(trailing, Insert)
    with pytest.raises(DecodeError, match="1 unexpected trailing bytes"):
        tuple(trailing.new)
    # An Update's old row is walked to find the new one: a cut one fails at decode time.
    update = b"U" + struct.pack("!I", TABLE_OID) + b"K" + encode_tuple(("1", None))[:-1]
    with pytest.raises(DecodeError, match="malformed pgoutput Update"):
        decoder.decode_one(update + b"N" + encode_tuple(("1", "2")), AT)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(rows.filter(lambda r: len(r) == 4), min_size=2, max_size=2))
def test_update_old_and_new_rows_split_where_they_end(pair: list[tuple[RawValue, ...]]) -> None:
    decoder = _decoder(4)
    table = decoder.state.relations[TABLE_OID]
    old, new = pair
    payload = b"U" + struct.pack("!I", TABLE_OID)
    payload += b"O" + encode_tuple(old) + b"N" + encode_tuple(new)
    event = decoder.decode_one(payload, AT)
    assert event == Update(AT, table, new, old, False)
    assert isinstance(event, Update) and event.old is not None
    assert event.old.data == encode_tuple(old)  # type: ignore[attr-defined]
    assert event.new.data == encode_tuple(new)  # type: ignore[attr-defined]


@pytest.mark.parametrize("binary", [False, True])
def test_real_streams_decode_lazily_to_the_same_events(db: Any, binary: bool) -> None:
    db.execute(
        "CREATE TABLE lazy (id int PRIMARY KEY, t text, n numeric, b bytea, j jsonb);"
        "ALTER TABLE lazy REPLICA IDENTITY FULL;"
        "CREATE PUBLICATION pub FOR TABLE lazy"
    )
    db.execute("SELECT pg_create_logical_replication_slot('s', 'pgoutput')")
    db.execute(
        "INSERT INTO lazy VALUES (1, 'plain', 1.5, '\\x00ff', '{\"a\": 1}'),"
        "(2, 'grüße ✓ 𝄞', NULL, NULL, NULL), (3, repeat('é', 3000), -0.001, '', '[]')"
    )
    db.execute("UPDATE lazy SET t = 'changed ✓' WHERE id = 2")
    db.execute("DELETE FROM lazy WHERE id = 1")
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
    changed = [e for e in events if isinstance(e, Insert | Update | Delete)]
    assert [type(e).__name__ for e in changed] == ["Insert"] * 3 + ["Update", "Delete"]
    for event in changed:
        for row in (getattr(event, "new", None), getattr(event, "old", None)):
            assert row is None or type(row) is EncodedRow
    update = changed[3]
    assert isinstance(update, Update) and update.old is not None
    assert update.new[1] == (b"changed \xe2\x9c\x93" if binary else "changed ✓")
    assert update.old[1] == (
        b"gr\xc3\xbc\xc3\x9fe \xe2\x9c\x93 \xf0\x9d\x84\x9e" if binary else "grüße ✓ 𝄞"
    )
    assert UNCHANGED_TOAST not in update.new
    # Typed values: the same from EncodedRows as from tuples of their values, per value and
    # as Arrow.
    table = changed[0].table
    encoded = [e.new for e in changed if isinstance(e, Insert | Update)]
    tuples = [tuple(row) for row in encoded]
    typed = [row_to_python(table, row) for row in tuples]
    assert [row_to_python(table, row) for row in encoded] == typed
    assert typed[0][:3] == (1, "plain", Decimal("1.5"))
    batch = rows_to_arrow(table, encoded)
    assert batch.equals(rows_to_arrow(table, tuples))
    assert batch.column(0).to_pylist() == [1, 2, 3, 2]
