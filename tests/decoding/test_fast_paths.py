"""The fast paths of decoding agree with the careful ones they shortcut.

pgoutput's tuple reader reads back what was written (garbled TupleData is
``test_tupledata_equivalence``'s), and real streams from PG15 and PG18 with values that take
its slower branches (non-ASCII text, lengths whose bytes are not ASCII, NULL and unchanged last
columns, binary mode).
"""

from __future__ import annotations

import math
import struct
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.decoding import arrow
from pgcdc.decoding.arrow import rows_to_arrow
from pgcdc.decoding.pgoutput import PgOutputDecoder, PgOutputOptions
from pgcdc.errors import DecodeError
from pgcdc.events import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    Delete,
    EncodedRow,
    Event,
    Insert,
    RawValue,
    Table,
    Update,
)
from pgcdc.lsn import LSN
from pgcdc.tupledata import read_tuple, read_tuple_reference
from tests.conftest import examples

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


@settings(max_examples=examples(300), deadline=None)
@given(rows)
def test_tuple_reader_reads_what_was_written(row: tuple[RawValue, ...]) -> None:
    data = b"xyz" + encode_tuple(row)
    assert read_tuple(data, 3) == (row, len(data))
    assert read_tuple_reference(data, 3) == (row, len(data))


@settings(max_examples=examples(200), deadline=None)
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
        encoded = EncodedRow(tuple_data)  # the row pgoutput decodes to
        messages = {
            b"I" + oid + b"N" + tuple_data: Insert(lsn, table, encoded),
            b"U" + oid + b"O" + tuple_data + b"N" + tuple_data: Update(
                lsn, table, encoded, encoded, False
            ),
            b"U" + oid + b"N" + tuple_data: Update(lsn, table, encoded),
            b"D" + oid + b"K" + tuple_data: Delete(lsn, table, encoded, True),
        }
        for payload, expected in messages.items():
            from_bytes = decoders[0].decode_one(payload, lsn)
            from_view = decoders[1].decode_one(memoryview(b"w" + payload)[1:], lsn)
            assert from_bytes == expected
            assert from_view == expected
            assert type(from_bytes) is type(expected)
            assert repr(from_bytes) == repr(expected)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(rows.filter(lambda r: len(r) == 4), min_size=1, max_size=4),
    st.none() | st.integers(0, (1 << 32) - 1),
)
def test_updates_with_a_new_row_alone_decode_as_constructed(
    changes: list[tuple[RawValue, ...]], stream_xid: int | None
) -> None:
    """An Update with its new row alone, read inline, equals the Update built from its values
    (its row the new row's bytes), in and outside a stream block, as does the same Update
    with an old key before it (read through ``_row`` and ``_last_row``); a wrong width fails
    alike in both."""
    decoders = [
        PgOutputDecoder.for_options(PgOutputOptions(["p"], proto_version=2, streaming="on"))
        for _ in range(2)
    ]
    prefix = b"U"
    for decoder in decoders:
        decoder.decode_one(relation(4), LSN(1))
        if stream_xid is not None:
            decoder.decode_one(b"S" + struct.pack("!IB", stream_xid, 1), LSN(2))
            prefix = b"U" + struct.pack("!I", stream_xid)
    table = decoders[0].state.relations[TABLE_OID]
    oid = struct.pack("!I", TABLE_OID)
    for number, row in enumerate(changes):
        lsn = LSN(100 + number)
        key = encode_tuple((row[0], None, None, None))
        alone = prefix + oid + b"N" + encode_tuple(row)
        keyed = prefix + oid + b"K" + key + b"N" + encode_tuple(row)
        new_only = decoders[0].decode_one(memoryview(alone), lsn)
        assert new_only == Update(lsn, table, row, None, False, stream_xid)
        with_key = decoders[1].decode_one(memoryview(keyed), lsn)
        assert with_key == Update(lsn, table, row, (row[0], None, None, None), True, stream_xid)
        for event in (new_only, with_key):
            assert isinstance(event, Update) and type(event.new) is EncodedRow
            assert event.new.data == encode_tuple(row) and event.xid == stream_xid
        complaints = []
        for decoder, narrow in zip(
            decoders,
            (
                prefix + oid + b"N" + encode_tuple(row[:3]),
                prefix + oid + b"K" + key + b"N" + encode_tuple(row[:3]),
            ),
            strict=True,
        ):
            with pytest.raises(DecodeError) as failed:
                decoder.decode_one(narrow, lsn)
            complaints.append(str(failed.value).rsplit("): ", 1)[1])  # after the message's head
        assert len(set(complaints)) == 1, complaints


# PostgreSQL's timestamps as microseconds since 2000-01-01, within Python's datetime range.
_MICROS_SINCE_2000 = st.integers(-63_082_281_600_000_000, 252_423_993_599_999_999)
_U64 = st.integers(0, (1 << 64) - 1)
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@settings(max_examples=300, deadline=None)
@given(
    first=_U64,
    second=_U64,
    third=_U64,
    micros=_MICROS_SINCE_2000,
    xid=st.integers(0, (1 << 32) - 1),
    flags=st.integers(0, 255),
)
def test_begin_and_commit_decode_as_their_constructors_build_them(
    *, first: int, second: int, third: int, micros: int, xid: int, flags: int
) -> None:
    """Begin and Commit, built field by field with unchecked wire LSNs and the split timestamp,
    equal the events their constructors build from the same fields."""
    decoder = PgOutputDecoder()
    moment = _PG_EPOCH + timedelta(microseconds=micros)
    begin = decoder.decode_one(b"B" + struct.pack("!QqI", first, micros, xid), LSN(7))
    expected: Event = Begin(LSN(7), xid, LSN(first), moment)
    assert begin == expected
    assert repr(begin) == repr(expected)
    assert type(begin.final_lsn) is LSN  # type: ignore[union-attr]
    commit = decoder.decode_one(b"C" + struct.pack("!BQQq", flags, second, third, micros), LSN(8))
    expected = Commit(LSN(8), LSN(second), LSN(third), moment, flags=flags)
    assert commit == expected
    assert repr(commit) == repr(expected)
    assert type(commit.commit_lsn) is LSN and type(commit.end_lsn) is LSN


@pytest.mark.parametrize(
    ("payload", "complaint"),
    [
        (b"B" + struct.pack("!QqI", 1, (1 << 63) - 1, 5), "out of range"),  # infinity
        (b"C" + struct.pack("!BQQq", 0, 1, 2, -(1 << 63)), "out of range"),  # -infinity
        (b"B" + struct.pack("!QqI", 1, 0, 5) + b"x", "1 unexpected trailing bytes"),
        (b"C" + struct.pack("!BQQq", 0, 1, 2, 0) + b"xy", "2 unexpected trailing bytes"),
        (b"C" + struct.pack("!BQQq", 0, 1, 2, 0)[:-1], "truncated"),
    ],
)
def test_bad_begin_and_commit_are_decode_errors(payload: bytes, complaint: str) -> None:
    with pytest.raises(DecodeError, match=complaint):
        PgOutputDecoder().decode_one(payload, LSN(9))


def test_bad_column_kind_names_the_problem() -> None:
    """When the row is read (an Insert's is not walked at decode time), and at decode time when
    the decoder must walk it (an Update's old key)."""
    decoder = PgOutputDecoder()
    decoder.decode_one(relation(2), LSN(1))
    oid = struct.pack("!I", TABLE_OID)
    for row, complaint in (
        (b"\0\2nx", "unknown column kind"),
        (b"\0\2t\0\0\1\0abc", "past the end"),
    ):
        event = decoder.decode_one(b"I" + oid + b"N" + row, LSN(2))
        assert isinstance(event, Insert)
        with pytest.raises(DecodeError, match=complaint):
            tuple(event.new)
        with pytest.raises(DecodeError, match=complaint):
            decoder.decode_one(b"U" + oid + b"K" + row + b"N\0\2nn", LSN(2))


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


# --- vectorised Arrow columns -----------------------------------------------------------------

NUMERIC_10_2 = (10 << 16 | 2) + 4


def per_value_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(arrow, "_fast_column", lambda *args: None)


def both_paths(type_oid: int, type_modifier: int, texts: list[str | None]) -> tuple[Any, Any]:
    """The batch built with the vectorised columns, and built value by value."""
    rows = [(text,) for text in texts]
    fast_table = Table("public", "t", (Column("c", type_oid, type_modifier),))
    fast = _outcome_of(lambda: rows_to_arrow(fast_table, rows))
    with pytest.MonkeyPatch.context() as patch:
        per_value_only(patch)
        slow_table = Table("public", "t", (Column("c", type_oid, type_modifier),))
        slow = _outcome_of(lambda: rows_to_arrow(slow_table, rows))
    return fast, slow


def _outcome_of(build: Any) -> Any:
    try:
        batch = build()
    except DecodeError as exc:
        return ("DecodeError", str(exc))
    # NaN compares unequal to itself, and Arrow holds dates Python cannot: compare the
    # schema and Arrow's own text forms of the values.
    return str(batch.schema), [_comparable(column) for column in batch.columns]


def _comparable(column: pa.Array) -> list[Any]:
    if pa.types.is_map(column.type) or pa.types.is_list(column.type):
        return list(column.to_pylist())
    return list(pc.cast(column, pa.string()).to_pylist())


def pg_offset(seconds: int) -> str:
    sign = "-" if seconds < 0 else "+"
    minutes, sec = divmod(abs(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return (
        f"{sign}{hours:02d}"
        + (f":{minute:02d}" if minute or sec else "")
        + (f":{sec:02d}" if sec else "")
    )


def pg_timestamp(value: datetime, offset: int | None) -> str:
    text = value.isoformat(sep=" ")
    return text if offset is None else text + pg_offset(offset)


specials = st.sampled_from(["infinity", "-infinity"])
timestamps = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30))
offsets = st.one_of(st.integers(-15 * 3600, 15 * 3600), st.sampled_from([0, 19800, -28800]))
TEXT_FORMS: dict[str, tuple[int, int, st.SearchStrategy[str]]] = {
    "bool": (16, -1, st.sampled_from(["t", "f"])),
    "int2": (21, -1, st.integers(-(2**15), 2**15 - 1).map(str)),
    "int4": (23, -1, st.integers(-(2**31), 2**31 - 1).map(str)),
    "int8": (20, -1, st.integers(-(2**63), 2**63 - 1).map(str)),
    "int4 out of range": (23, -1, st.integers(2**31, 2**40).map(str)),
    "float8": (
        701,
        -1,
        st.one_of(
            st.floats(allow_nan=False).map(
                lambda f: (
                    "Infinity" if f == math.inf else "-Infinity" if f == -math.inf else repr(f)
                )
            ),
            st.just("NaN"),
        ),
    ),
    "numeric(10,2)": (
        1700,
        NUMERIC_10_2,
        st.one_of(
            st.decimals(min_value=-(10**8), max_value=10**8, places=2, allow_nan=False).map(
                lambda d: format(d, "f")
            ),
            st.sampled_from(["NaN", "Infinity", "-Infinity", "12345678901.00", "1.234"]),
        ),
    ),
    "numeric": (1700, -1, st.decimals(allow_nan=False, allow_infinity=False).map(str)),
    "date": (
        1082,
        -1,
        st.one_of(
            st.dates().map(lambda d: d.isoformat()),
            specials,
            st.sampled_from(["0001-01-01 BC", "10000-01-01", "4713-11-24 BC"]),
        ),
    ),
    "timestamp": (
        1114,
        -1,
        st.one_of(
            timestamps.map(lambda v: pg_timestamp(v, None)),
            specials,
            st.just("0044-03-15 12:00:00 BC"),
        ),
    ),
    "timestamptz": (
        1184,
        -1,
        st.one_of(
            st.tuples(timestamps, offsets).map(lambda p: pg_timestamp(*p)),
            specials,
            st.sampled_from(["2024-01-01 00:00:00+05:53:28", "0044-03-15 12:00:00+00 BC"]),
        ),
    ),
    "uuid": (2950, -1, st.uuids().map(str)),
    "text": (25, -1, st.text()),
    "jsonb": (3802, -1, st.sampled_from(['{"a": 1}', "[]", '"x"'])),
}


@pytest.mark.parametrize("name", sorted(TEXT_FORMS))
@settings(max_examples=examples(60), deadline=None)
@given(data=st.data())
def test_vectorised_columns_equal_the_per_value_path(name: str, data: st.DataObject) -> None:
    type_oid, type_modifier, forms = TEXT_FORMS[name]
    texts = data.draw(st.lists(st.one_of(st.none(), forms), max_size=20), label="texts")
    fast, slow = both_paths(type_oid, type_modifier, texts)
    assert fast == slow


def test_vectorised_columns_are_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """The batches above did go through Arrow compute (else the comparison proves nothing)."""
    built: list[pa.Array | None] = []
    original = arrow._fast_column

    def recording(*args: Any) -> pa.Array | None:
        built.append(original(*args))
        return built[-1]

    monkeypatch.setattr(arrow, "_fast_column", recording)
    table = Table("public", "t", tuple(Column(f"c{o}", o) for o in (16, 20, 1184, 2950, 25)))
    row = ("t", "42", "2024-01-01 10:00:00+02", "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "x")
    rows_to_arrow(table, [row, row])
    assert len(built) == 5 and all(array is not None for array in built)


EDGE_VALUES = """
SELECT b::text, i::text, n::text, d::text, ts::text, tz::text, u::text, f::text FROM (VALUES
  (true, 1::int8, 1.5::numeric(10,2), '2024-02-29'::date, '2024-01-01 00:00:00.5'::timestamp,
   '2024-01-01 00:00:00.123456+00'::timestamptz, gen_random_uuid(), 1.5::float8),
  (NULL, -9223372036854775808, 'NaN', 'infinity', '-infinity', 'infinity', NULL, 'NaN'),
  (false, NULL, -99999999.99, '0044-03-15 BC', '0044-03-15 12:00:00 BC',
   '1900-01-01 00:00:00+00', NULL, '-Infinity')
) v(b, i, n, d, ts, tz, u, f)
"""


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "Europe/Amsterdam"])
def test_server_text_forms_build_the_same_batch(db: Any, zone: str) -> None:
    with db.connect() as conn:
        conn.execute(f"SET TimeZone = '{zone}'")
        rows = conn.execute(EDGE_VALUES).fetchall()
    oids = (16, 20, 1700, 1082, 1114, 1184, 2950, 701)
    mods = (-1, -1, NUMERIC_10_2, -1, -1, -1, -1, -1)
    columns = tuple(
        Column(f"c{i}", oid, mod) for i, (oid, mod) in enumerate(zip(oids, mods, strict=True))
    )
    fast = rows_to_arrow(Table("public", "t", columns), rows)
    with pytest.MonkeyPatch.context() as patch:
        per_value_only(patch)
        slow = rows_to_arrow(Table("public", "t", columns), rows)
    assert _outcome_of(lambda: fast) == _outcome_of(lambda: slow)
    assert fast.column("_pgcdc_text").to_pylist()[1] is not None  # NaN, infinity kept as text
