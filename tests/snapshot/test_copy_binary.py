"""Binary COPY in the snapshot: the stream reader (pure), and on PostgreSQL 15 and 18 a table of
every type and edge value copied in binary and in text format, typed value by value and as the
Arrow batches Spark writes, which must be the same."""

from __future__ import annotations

import itertools
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.changelog import ChangeLog
from pgcdc.changelog.codec import type_info_of
from pgcdc.decoding import arrow, columnar
from pgcdc.decoding.arrow import framed_to_arrow, rows_to_arrow
from pgcdc.decoding.copybinary import (
    COPY_BINARY_SIGNATURE,
    CopyBinaryReader,
    frame_copy,
    splice_tuples,
)
from pgcdc.decoding.pgtypes import BY_OID, TypeInfo
from pgcdc.decoding.values import TypeRegistry
from pgcdc.errors import DecodeError, InvalidOption
from pgcdc.events import Column, EncodedRow, Insert, Row, Table, Type, encode_tuple_data
from pgcdc.receiver import DEFAULT_SESSION_SETTINGS
from pgcdc.snapshot import take_snapshot
from tests.conftest import Database
from tests.decoding.test_columnar import outcome
from tests.decoding.test_registry_walk import BINARY_SAMPLES, REGISTRY

HEADER = COPY_BINARY_SIGNATURE + b"\0\0\0\0" + b"\0\0\0\0"
TRAILER = b"\xff\xff"


def copy_tuple(row: tuple[bytes | None, ...]) -> bytes:
    fields = [struct.pack("!h", len(row))]
    for value in row:
        length = -1 if value is None else len(value)
        fields.append(struct.pack("!i", length) + (value or b""))
    return b"".join(fields)


def read_all(width: int, chunks: list[bytes], batch: int = 0) -> list[EncodedRow]:
    """The rows of ``chunks`` fed one by one, or ``batch`` at a time to ``read_messages``."""
    reader = CopyBinaryReader(width)
    views = [memoryview(chunk) for chunk in chunks]
    if batch:
        groups = [views[i : i + batch] for i in range(0, len(views), batch)]
        rows = [row for group in groups for row in reader.read_messages(group)]
    else:
        rows = [row for view in views for row in reader.feed(view)]
    reader.finish()
    return [EncodedRow(row) for row in rows]


binary_rows = st.integers(0, 5).flatmap(
    lambda width: st.lists(
        st.tuples(*[st.one_of(st.none(), st.binary(max_size=20))] * width), max_size=6
    ).map(lambda rows: (width, rows))
)


@given(binary_rows, st.lists(st.integers(0, 400), max_size=8))
def test_tuples_become_pgoutput_binary_rows_however_the_stream_is_cut(
    table: tuple[int, list[tuple[bytes | None, ...]]], cuts: list[int]
) -> None:
    width, rows = table
    stream = HEADER + b"".join(copy_tuple(r) for r in rows) + TRAILER
    points = sorted({min(c, len(stream)) for c in cuts} | {0, len(stream)})
    chunks = [stream[a:b] for a, b in itertools.pairwise(points)]
    got = read_all(width, chunks)
    assert [r.data for r in got] == [encode_tuple_data(r) for r in rows]
    assert got == rows  # as tuples of raw values: bytes, None for NULL
    # Chunks that are not one tuple each leave read_messages to the general reader.
    assert read_all(width, chunks, batch=3) == got


@given(binary_rows, st.integers(1, 8))
def test_one_tuple_per_message_is_spliced_in_batches_as_one_by_one(
    table: tuple[int, list[tuple[bytes | None, ...]]], batch: int
) -> None:
    """As the server sends them: the header with the first tuple, the trailer alone."""
    width, rows = table
    messages = [copy_tuple(r) for r in rows]
    if messages:
        messages[0] = HEADER + messages[0]
    else:
        messages = [HEADER]
    messages.append(TRAILER)
    expected = [encode_tuple_data(r) for r in rows]
    assert [r.data for r in read_all(width, messages)] == expected
    assert [r.data for r in read_all(width, messages, batch)] == expected
    body = b"".join(messages[1:-1])
    ends = list(itertools.accumulate(len(m) for m in messages[1:-1]))
    assert splice_tuples(body, ends, width) == expected[1:]


@pytest.mark.parametrize("batch", [0, 1, 2])
def test_an_empty_copy_is_its_header_and_trailer_in_one_message(batch: int) -> None:
    assert read_all(3, [HEADER + TRAILER], batch) == []


def test_header_extension_is_skipped() -> None:
    header = COPY_BINARY_SIGNATURE + b"\0\0\0\0" + b"\0\0\0\3abc"
    assert read_all(1, [header + copy_tuple((b"x",)) + TRAILER]) == [(b"x",)]


@pytest.mark.parametrize(
    ("stream", "why"),
    [
        (b"1\t2\n", "not a COPY binary stream"),
        (b"PGCOPY\n\xff\r\n\x01" + bytes(8), "not a COPY binary stream"),
        (COPY_BINARY_SIGNATURE + b"\0\1\0\0" + bytes(4), "carries OIDs"),
        (COPY_BINARY_SIGNATURE + b"\1\0\0\0" + bytes(4), "unknown flags"),
        (COPY_BINARY_SIGNATURE + bytes(4) + b"\xff\xff\xff\xfe", "extension of length -2"),
        (HEADER + copy_tuple((b"a", b"b", b"c")) + TRAILER, "3 fields, expected 2"),
        (HEADER + b"\0\2" + b"\xff\xff\xff\xfe", "length -2"),
        (HEADER + copy_tuple((b"a", b"bc"))[:-1], "ended inside a tuple"),
        (HEADER + copy_tuple((b"a", b"b")), "without its trailer"),
        (HEADER + TRAILER + b"\0", "after the COPY binary trailer"),
        (HEADER + TRAILER + copy_tuple((b"a", b"b")), "after the COPY binary trailer"),
        (COPY_BINARY_SIGNATURE[:5], "ended inside its header"),
    ],
)
@pytest.mark.parametrize("batch", [0, 1, 4])
def test_malformed_streams_are_typed_errors(stream: bytes, why: str, batch: int) -> None:
    with pytest.raises(DecodeError, match=why):
        read_all(2, [stream], batch)
    # Cut at the tuples, as the server sends them.
    header, tuples = stream[: len(HEADER)], stream[len(HEADER) :]
    with pytest.raises(DecodeError, match=why):
        read_all(2, [header + tuples[:8], tuples[8:12], tuples[12:]], batch)


def test_messages_that_are_not_one_tuple_each_are_not_spliced() -> None:
    one, two = copy_tuple((b"a", None)), copy_tuple((None, b"bc"))
    assert splice_tuples(one + two, [len(one + two)], 2) is None  # two in one message
    assert splice_tuples(one + two, [3, len(one + two)], 2) is None  # cut inside a tuple
    assert splice_tuples(one, [len(one)], 3) is None  # another width
    assert splice_tuples(one + two, [len(one), len(one + two)], 2) == [
        encode_tuple_data((b"a", None)),
        encode_tuple_data((None, b"bc")),
    ]


# --- frame_copy: the stream framed where COPY sent it ----------------------------------------


def server_messages(rows: list[tuple[bytes | None, ...]]) -> list[bytes]:
    """As the server sends a binary COPY: the header with the first tuple, the trailer alone."""
    messages = [copy_tuple(r) for r in rows] or [b""]
    messages[0] = HEADER + messages[0]
    return [*messages, TRAILER]


def joined(messages: list[bytes]) -> tuple[bytes, list[int]]:
    return b"".join(messages), list(itertools.accumulate(len(m) for m in messages))


def field_values(framing: columnar.Framing) -> list[list[tuple[int, bytes]]]:
    """Each column's (kind, value bytes) per row: what typing reads of a framing."""
    data = framing.columns[0].buffer.data if framing.columns else b""
    return [
        [
            (kind, data[start : start + length])
            for kind, start, length in zip(
                view.kinds.tolist(), view.starts.tolist(), view.lengths.tolist(), strict=True
            )
        ]
        for view in framing.columns
    ]


def spliced_framing(width: int, messages: list[bytes]) -> columnar.Framing | None:
    """The reference: the reader's TupleData of the stream, framed by ``frame_tuples``; None
    when the reader refuses the stream."""
    try:
        rows = [row.data for row in read_all(width, messages)]
    except DecodeError:
        return None
    bounds = np.array([0, *itertools.accumulate(len(r) for r in rows)], dtype=np.int64)
    framing = columnar.frame_tuples(
        columnar.WireBuffer(b"".join(rows)), bounds[:-1], bounds[1:], width
    )
    assert framing is not None
    return framing


@given(binary_rows)
def test_frame_copy_frames_what_the_reader_splices(
    table: tuple[int, list[tuple[bytes | None, ...]]],
) -> None:
    width, rows = table
    data, ends = joined(server_messages(rows))
    framing = frame_copy(data, ends, width)
    if not rows:
        assert framing is None  # nothing to frame: the reader takes the header and trailer
        return
    assert framing is not None, "a stream as the server sends it must take the fast path"
    reference = spliced_framing(width, server_messages(rows))
    assert reference is not None
    assert len(framing.ends) == len(reference.ends) == len(rows)
    assert field_values(framing) == field_values(reference)


@given(binary_rows, st.data())
def test_frame_copy_frames_nothing_the_reader_would_read_otherwise(
    table: tuple[int, list[tuple[bytes | None, ...]]], data: st.DataObject
) -> None:
    """A damaged stream (a byte changed, messages cut elsewhere, another width) is framed as
    the reader reads it, or not at all (the reader then says what is wrong)."""
    width, rows = table
    stream, ends = joined(server_messages(rows))
    damage = data.draw(st.sampled_from(["byte", "cut", "width"]))
    if damage == "byte":
        at = data.draw(st.integers(0, len(stream) - 1))
        stream = stream[:at] + bytes([data.draw(st.integers(0, 255))]) + stream[at + 1 :]
    elif damage == "cut":
        ends = sorted({*data.draw(st.lists(st.integers(1, len(stream)), max_size=4)), *ends})
        ends = data.draw(st.permutations(ends)) if data.draw(st.booleans()) else ends
        ends = [e for e in ends if e != len(stream)] + [len(stream)]
        ends = sorted(set(ends))
        drop = data.draw(st.integers(0, max(len(ends) - 2, 0)))
        ends = [e for i, e in enumerate(ends) if i != drop or e == len(stream)]
    else:
        width = data.draw(st.integers(0, 6))
    messages = [stream[a:b] for a, b in itertools.pairwise([0, *ends])]
    framing = frame_copy(stream, ends, width)
    if framing is not None:
        reference = spliced_framing(width, messages)
        assert reference is not None, "framed a stream the reader refuses"
        assert field_values(framing) == field_values(reference)


def test_frame_copy_refuses_streams_not_as_the_server_sends_them() -> None:
    one, two = copy_tuple((b"a", None)), copy_tuple((None, b"bc"))
    good = [HEADER + one, two, TRAILER]
    assert frame_copy(*joined(good), 2) is not None
    assert frame_copy(*joined([HEADER, one, two, TRAILER]), 2) is None  # the header alone
    assert frame_copy(*joined([HEADER + one + two, TRAILER]), 2) is None  # two in one
    assert frame_copy(*joined([HEADER + one, two + TRAILER]), 2) is None  # no trailer alone
    assert frame_copy(*joined([HEADER + one, two]), 2) is None  # no trailer
    assert frame_copy(*joined(good), 3) is None  # another width
    oids = COPY_BINARY_SIGNATURE + b"\0\1\0\0" + bytes(4)
    assert frame_copy(*joined([oids + one, two, TRAILER]), 2) is None
    negative = copy_tuple((b"a",))[:2] + b"\xff\xff\xff\xfe"
    assert frame_copy(*joined([HEADER + negative, TRAILER]), 1) is None


def registry_samples(oid: int) -> list[bytes]:
    """Binary values of the type: the registry walk's samples where it has them, else bytes
    of every short length (most are not a valid value: both paths must then fail alike)."""
    name = REGISTRY.resolve(oid).name
    found = BINARY_SAMPLES.get(name)
    return list(found) if found else [b"", b"\x00", b"\x00\x01", bytes(4), bytes(8), b"\x01" * 16]


@pytest.mark.parametrize("oid", sorted(BY_OID), ids=lambda oid: BY_OID[oid].name)
def test_every_type_is_typed_alike_from_the_framed_copy_and_the_spliced_rows(oid: int) -> None:
    """Over the whole registry: typing the framed stream gives the batch (or the error) that
    ``rows_to_arrow`` gives for the reader's rows, value by value."""
    samples = registry_samples(oid)
    rows: list[tuple[bytes | None, ...]] = [(v, None) for v in samples] + [(None, samples[0])]
    table = Table("public", "t", (Column("a", oid, -1), Column("b", oid, -1)))
    messages = server_messages(rows)
    framing = frame_copy(*joined(messages), 2)
    assert framing is not None
    strings = columnar.text_columns(framing)
    assert strings is not None
    fast = outcome(lambda: framed_to_arrow(table, framing, strings))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(arrow, "_fast_column", lambda *args: None)
        slow = outcome(lambda: rows_to_arrow(table, read_all(2, messages)))
    assert fast == slow


# --- against the server ----------------------------------------------------------------------

EVERY_TYPE = r"""
CREATE TYPE mood AS ENUM ('sad', 'ok', 'hap"py, "');
CREATE DOMAIN price AS numeric(10, 2) CHECK (VALUE > -1e8);
CREATE DOMAIN ints AS int[];
CREATE TYPE floatrange AS RANGE (subtype = float8);
CREATE TYPE inner_t AS (f float4, t timestamptz, b bytea, a int[], m mood);
CREATE TYPE outer_t AS (
    i int, s text, d double precision, n numeric, ts timestamp, iv interval,
    inner_v inner_t, r int4range, j jsonb, u uuid, dt date, bo bool, mo money
);
CREATE DOMAIN outer_d AS outer_t;
CREATE TABLE every (
    id int PRIMARY KEY, bo bool, i2 smallint, i4 int, i8 bigint, o oid,
    f4 real, f8 double precision, n numeric, n52 numeric(5, 2), mo money,
    t text, vc varchar(10), bp char(4), ch "char", nm name, ba bytea,
    d date, ts timestamp, tstz timestamptz, tm time, tmtz timetz, iv interval,
    u uuid, j json, jb jsonb, ip inet, cd cidr, mac macaddr, mac8 macaddr8,
    bt bit(5), vb varbit, lsn pg_lsn,
    ia int[], ta text[], na numeric[], da date[], tsa timestamptz[], fa float8[],
    ir int4range, nr numrange, tr tsrange, tzr tstzrange, dr daterange, i8r int8range,
    fr floatrange, imr int4multirange,
    mood_v mood, moods mood[], pr price, dom_ints ints, comp outer_t, comps outer_t[],
    comp_d outer_d,
    pt point, ln line, ls lseg, bx box, pa path, pg polygon, ci circle
);
INSERT INTO every VALUES
(1, true, -32768, -2147483648, -9223372036854775808, 4294967295,
 'NaN', 'NaN', 'NaN', -999.99, '-92233720368547758.08',
 E'tab\there\nnew \\ line \\N ünï €😀 "q" ''', 'ten chars!', 'ab', 'x', 'name', '\x00ff5c0a09',
 'infinity', 'infinity', 'infinity', '24:00:00', '24:00:00-15:59', '178000000 years',
 '00000000-0000-0000-0000-000000000000', '{"b": 1,  "a": [1, "x\ty"], "b": 2}',
 '{"b": null, "a": "é", "n": 1.50}', '192.168.0.1/24', '10.0.0.0/8', '08:00:2b:01:02:03',
 '08:00:2b:01:02:03:04:05', B'10101', B'', '0/0',
 '{{1,NULL},{3,4}}', '{"a\\b","c d",NULL,"","NULL","q\"t","{x}"}', '{NaN,Infinity,-1.5}',
 '{infinity,-infinity,4713-01-01 BC}', '{infinity,"2000-01-01 00:00:00+00"}',
 '{NaN,-Infinity,-0,5e-324}',
 'empty', '(,)', '[-infinity,infinity]', '["2000-01-01 10:00:00+05",infinity)', 'empty',
 '[-9223372036854775808,0)', '[-0.0,1e308)', '{[1,3),[5,7)}',
 'hap"py, "', '{sad,NULL,"hap\"py, \""}', 12345678.90, '{1,NULL}',
 ROW(1, E'a,b "c" \\ (d)', 'NaN', 'Infinity', 'infinity', '-1 day 02:00',
     ROW(1.5, '2000-01-01 00:00:00+00', '\x00', '{1,NULL}', 'ok')::inner_t,
     '[1,5)', '{"k": [true]}', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', '4713-01-01 BC', true,
     '1.23')::outer_t,
 ARRAY[ROW(NULL, '', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)::outer_t,
       NULL],
 ROW(2, NULL, -0.0, -1e-20, '4713-01-01 00:00:00 BC', '1 mon -1 day', NULL, 'empty', 'null',
     NULL, 'infinity', false, NULL)::outer_t,
 '(1.5,-0)', '{1,-1,0}', '[(0,0),(1,1)]', '(2,2),(0,0)', '[(0,0),(1,1),(2,0)]',
 '((0,0),(1,1),(2,0))', '<(0,0),1.5>'),
(2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
 NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
(3, false, 32767, 2147483647, 9223372036854775807, 0,
 '-Infinity', '-0', 'Infinity', 0.5, '92233720368547758.07',
 '', '', '', '', '', '',
 '-infinity', '-infinity', '-infinity', '00:00', '00:00+15:59', '-178000000 years -1 us',
 'ffffffff-ffff-ffff-ffff-ffffffffffff', '""', '[]', '::1', '2001:db8::/32',
 'ff:ff:ff:ff:ff:ff', 'ff:ff:ff:ff:ff:ff:ff:ff', B'00000', B'1', 'FFFFFFFF/FFFFFFFF',
 '[0:1]={1,2}', '{}', '{}', '{}', '{}', '{}',
 '[1,2)', '[-1e-1000,1e1000]', '["4713-01-01 00:00:00 BC",)', '(,)', '[5874896-12-31,)',
 '(,)', 'empty', '{}',
 'sad', '{}', -99999999.99, '{}', NULL, '{}', NULL,
 '(-1e308,-0)', '{0,1,0}', '[(-1.5,2.5),(3,-4)]', '(0,0),(0,0)', '((0,0))', '((0,0))',
 '<(1e-300,2),0>'),
(4, true, 0, 0, 0, 1, '1e-45', '5e-324', '-0.0000000000000000000000000001', 0, 0,
 'x', 'y', 'zzzz', E'\\', 'n', '\x', '2000-01-01', '1999-12-31 23:59:59.999999',
 '294276-12-31 23:59:59.999999+00', '23:59:59.999999', '23:59:59.999999+00',
 '1 year -2 days 03:00:00.5', 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11', 'null', '{"a": {}}',
 '0.0.0.0/0', '0.0.0.0/0', '00:00:00:00:00:00', '00:00:00:00:00:00:00:00', B'11111',
 B'0101010101010101010101', '1/0', '{{{1}}}', '{"{}",","}', '{0.00000001}',
 '{2000-02-29}', '{"1999-12-31 23:59:59.999999+00"}', '{3.4028234663852886e+38}',
 '(,5]', '(0.1,0.2)', '[2000-01-01,2000-01-01]', '[2000-01-01 00:00+00,2000-01-02 00:00+00]',
 '[2000-01-01,2000-02-01)', '[1,2]', '(,)', '{(,)}',
 'ok', '{ok,ok}', 0, '{{1,2},{3,4}}', ROW(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
 NULL, NULL, NULL, NULL, NULL)::outer_t, '{}', NULL,
 '(0.1,0.2)', '{0.5,0.25,1e-10}', '[(0,0),(0,0)]', '(1e10,1e10),(-1e10,-1e10)',
 '[(0,0)]', '((0,0),(0,1))', '<(0,0),0>');
-- Enough rows (more than pgcdc.decoding.arrow.COLUMNAR_MIN_ROWS) that Arrow batches of the
-- binary copy are built column by column, as the Spark executors build them.
INSERT INTO every SELECT e.id + 10 * g, bo, i2, i4, i8, o, f4, f8, n, n52, mo, t, vc, bp, ch,
    nm, ba, d, ts, tstz, tm, tmtz, iv, u, j, jb, ip, cd, mac, mac8, bt, vb, lsn, ia, ta, na,
    da, tsa, fa, ir, nr, tr, tzr, dr, i8r, fr, imr, mood_v, moods, pr, dom_ints, comp, comps,
    comp_d, pt, ln, ls, bx, pa, pg, ci
FROM every e, generate_series(1, 40) g;
CREATE TABLE with_tsvector (id int PRIMARY KEY, v tsvector, f float8);
INSERT INTO with_tsvector VALUES (1, 'a fat cat', 0.1), (2, NULL, 'NaN');
CREATE TYPE holds_tsvector AS (v tsvector);
CREATE TABLE with_hidden_tsvector (id int PRIMARY KEY, h holds_tsvector);
INSERT INTO with_hidden_tsvector VALUES (1, ROW('b:1'));
CREATE PUBLICATION pub FOR ALL TABLES;
"""


def snapshot_rows(
    db: Database, root: Path, slot: str, **options: Any
) -> tuple[dict[str, Table], dict[str, list[Row]], dict[int, TypeInfo]]:
    """Tables, rows (by table name, in id order) and types of a snapshot into ``root``."""
    with ChangeLog(root).writer() as sink:
        take_snapshot(db.conninfo(), slot=slot, sink=sink, publications=["pub"], **options)
    (txn,) = ChangeLog(root).read_transactions()
    types = {e.oid: type_info_of(e) for e in txn.events if isinstance(e, Type)}
    tables: dict[str, Table] = {}
    rows: dict[str, list[Row]] = {}
    registry = TypeRegistry(types)
    for event in txn.events:
        if isinstance(event, Insert):
            tables[event.table.name] = event.table
            rows.setdefault(event.table.name, []).append(event.new)
    for name, found in rows.items():
        found.sort(key=lambda r, t=tables[name]: registry.row_to_python(t, r)[0])  # type: ignore[misc]
    return tables, rows, types


def formats(rows: list[Row]) -> set[str]:
    return {type(v).__name__ for row in rows for v in row if v is not None}


def test_every_type_lands_the_same_from_binary_and_text_copies(
    db: Database, tmp_path: Path
) -> None:
    db.execute(EVERY_TYPE)
    tables, binary, types = snapshot_rows(db, tmp_path / "binary", "s_binary", workers=2)
    text_tables, text, _ = snapshot_rows(
        db, tmp_path / "text", "s_text", workers=2, copy_format="text"
    )
    assert tables == text_tables
    # Tables whose types all decode from binary were copied in binary, as pgoutput's binary
    # mode sends rows; the tsvector ones (no binary decoder, even inside a composite) in text.
    assert formats(binary["every"]) == {"bytes"}
    assert all(type(row) is EncodedRow for row in binary["every"])
    assert len(binary["every"]) == 4 * 41
    for name in ("with_tsvector", "with_hidden_tsvector"):
        assert formats(binary[name]) == {"str"}
        assert binary[name] == text[name]
    assert formats(text["every"]) == {"str"}
    # Every value typed alike (repr: NaN equals NaN, -0.0 differs from 0.0, types shown).
    registry = TypeRegistry(types)
    for name, table in tables.items():
        for binary_row, text_row in zip(binary[name], text[name], strict=True):
            typed_binary = registry.row_to_python(table, binary_row)
            typed_text = registry.row_to_python(table, text_row)
            for column, b, t in zip(table.columns, typed_binary, typed_text, strict=True):
                assert repr(b) == repr(t), (name, column.name, typed_text[0])
        # And the Arrow batches Spark writes to Delta: the binary rows column by column.
        binary_batch = rows_to_arrow(table, binary[name], types=types)
        text_batch = rows_to_arrow(table, text[name], types=types)
        assert binary_batch.schema == text_batch.schema
        for field, b_column, t_column in zip(
            binary_batch.schema, binary_batch.columns, text_batch.columns, strict=True
        ):
            assert repr(b_column.to_pylist()) == repr(t_column.to_pylist()), (name, field.name)


def test_composites_and_ranges_are_copied_as_text_under_other_session_settings(
    db: Database, tmp_path: Path
) -> None:
    db.execute(
        "CREATE TABLE plain (id int PRIMARY KEY, ts timestamptz);"
        "CREATE TABLE ranged (id int PRIMARY KEY, r tstzrange);"
        "INSERT INTO plain VALUES (1, '2000-01-01 00:00+00');"
        "INSERT INTO ranged VALUES (1, '[2000-01-01 00:00+00,)');"
        "CREATE PUBLICATION pub FOR ALL TABLES"
    )
    # A range's binary form decodes to its text as printed in UTC; under another time zone the
    # server prints another text, so such tables keep the text path.
    settings = {**DEFAULT_SESSION_SETTINGS, "TimeZone": "Asia/Kolkata"}
    _, rows, _ = snapshot_rows(db, tmp_path, "s", session_settings=settings)
    assert formats(rows["plain"]) == {"bytes"}
    assert rows["ranged"] == [("1", '["2000-01-01 05:30:00+05:30",)')]


def test_unknown_copy_format_is_refused_before_a_slot_is_made(db: Database, tmp_path: Path) -> None:
    db.execute("CREATE TABLE t (id int PRIMARY KEY); CREATE PUBLICATION pub FOR TABLE t")
    with ChangeLog(tmp_path).writer() as sink, pytest.raises(InvalidOption, match="copy_format"):
        take_snapshot(db.conninfo(), slot="s", sink=sink, publications=["pub"], copy_format="csv")
    assert db.execute("SELECT slot_name FROM pg_replication_slots") == []
