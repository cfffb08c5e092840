"""Every TupleData reader is an implementation of ``read_tuple_reference``.

One test generates valid and malformed TupleData (truncated, wrong column counts, unknown
kinds, lengths past the end, trailing bytes, text that is not UTF-8, empty rows, no columns,
NULL and unchanged last columns) and runs it through every reader: the fast ``read_tuple``,
``EncodedRow`` decoding, the pgoutput decoder's rows (Insert, Delete and an Update's old key,
checked when read), the columnar framing (``columnar.frame_rows``), the change log writer's check
(``columnar.first_unreadable_row``, as stored and as strict as a server's text), ``decode_many``
(events, their rows checked when read), ``decode_batch``, ``rows_to_arrow`` from
``EncodedRow``s and the Spark executors' typing of a change log column. Each must give the
reference's values, or refuse with a ``DecodeError`` that carries the reference's message
(typed Arrow paths: the batch, or the error, of the row-by-row path). And a fast path asks
the reference only about rows the reference refuses.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any
from unittest.mock import patch

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pgcdc import tupledata
from pgcdc.decoding import arrow, columnar, pgoutput
from pgcdc.decoding.arrow import rows_to_arrow
from pgcdc.decoding.batch import MIN_COLUMNAR_RUN, DecodedBatch, decode_batch, decode_many
from pgcdc.decoding.pgoutput import PgOutputDecoder
from pgcdc.errors import DecodeError
from pgcdc.events import Column, Delete, EncodedRow, Insert, Table, Update
from pgcdc.lsn import LSN
from pgcdc.spark import changes
from pgcdc.tupledata import (
    RawValue,
    TextErrors,
    decode_tuple_data,
    read_tuple,
    read_tuple_reference,
    trailing_bytes_error,
    tuple_end,
)
from tests.conftest import examples
from tests.decoding.test_fast_paths import TABLE_OID, relation

AT = LSN(0x1_0000_0000)
TEXT_OID = 25


@dataclass(frozen=True)
class Refused:
    """A reader's refusal: the message of its DecodeError (the reference's, for the reference)."""

    message: str


Outcome = tuple[RawValue, ...] | Refused


def reference(data: bytes, text: TextErrors) -> Outcome:
    """The reference's verdict on ``data`` as one whole TupleData."""
    try:
        values, end = read_tuple_reference(data, 0, text)
    except DecodeError as exc:
        return Refused(str(exc))
    if end != len(data):
        return Refused(str(trailing_bytes_error(len(data) - end)))
    return values


def declared_width(data: bytes) -> int | None:
    return struct.unpack_from("!H", data)[0] if len(data) >= 2 else None


def in_message(data: bytes, width: int, text: TextErrors = "strict") -> Outcome:
    """The reference's verdict on ``data`` as the row of a change of a ``width``-column table:
    the decoder checks the column count against the relation first."""
    declared = declared_width(data)
    if declared is not None and declared != width:
        return Refused(f"the row has {declared} columns but the Relation message")
    return reference(data, text)


def outcome(read: Any) -> Outcome:
    try:
        return tuple(read())
    except DecodeError as exc:
        return Refused(str(exc))


def agrees(found: Outcome, expected: Outcome, what: str) -> None:
    """``found`` has the expected values, or refuses with the expected message in its own (a
    decoder names the message around it)."""
    if isinstance(expected, Refused):
        assert isinstance(found, Refused), f"{what}: read {found!r}, the reference refuses"
        assert expected.message in found.message, what
    else:
        assert found == expected, what


# --- generated TupleData -------------------------------------------------------------------------

NOT_UTF8 = (b"\xff", b"\xc3\x28", b"ab\x80", b"\xe2\x82", b"\xed\xa0\x80")  # the last: a surrogate


@st.composite
def column(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from("nutbtx"))
    if kind in "nu":
        return kind.encode()
    if kind == "t":
        value = draw(st.text(max_size=8) | st.sampled_from(["é", "日本", "a" * 200])).encode()
    elif kind == "b":
        value = draw(st.binary(max_size=8) | st.just(b"\x00" * 200))  # 200: length byte 0xc8
    else:  # text that is not UTF-8
        kind, value = "t", draw(st.sampled_from(NOT_UTF8))
    return kind.encode() + struct.pack("!I", len(value)) + value


@st.composite
def tuple_data(draw: st.DrawFn) -> bytes:
    columns = draw(st.lists(column(), max_size=5))
    count = len(columns)
    faults = ["none", "none", "count", "kind", "length", "cut", "tail", "byte"]
    fault = draw(st.sampled_from(faults))
    if fault == "count":
        count = draw(st.integers(0, 7).filter(lambda n: n != len(columns)))
    elif fault == "kind" and columns:
        index = draw(st.integers(0, len(columns) - 1))
        kind = draw(st.integers(0, 255).filter(lambda k: k not in b"nutb"))
        columns[index] = bytes([kind]) + columns[index][1:]
    elif fault == "length":
        valued = [i for i, c in enumerate(columns) if c[:1] in (b"t", b"b")]
        if valued:
            index = draw(st.sampled_from(valued))
            length = draw(st.sampled_from([0, 1, 9, 0x7FFFFFFF, 0xFFFFFFFF]))
            columns[index] = columns[index][:1] + struct.pack("!I", length) + columns[index][5:]
    data = struct.pack("!H", count) + b"".join(columns)
    if fault == "cut":
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif fault == "tail":
        data += draw(st.binary(min_size=1, max_size=3))
    elif fault == "byte":
        index = draw(st.integers(0, len(data) - 1))
        data = data[:index] + bytes([draw(st.integers(0, 255))]) + data[index + 1 :]
    return data


# --- the readers ---------------------------------------------------------------------------------


def table_of(width: int) -> Table:
    columns = tuple(Column(f"c{i}", TEXT_OID) for i in range(width))
    return Table("public", "t", columns, TABLE_OID)


def decoder(width: int) -> PgOutputDecoder:
    found = PgOutputDecoder()
    found.decode_one(relation(width), AT)
    return found


def insert(data: bytes) -> bytes:
    return b"I" + struct.pack("!I", TABLE_OID) + b"N" + data


def delete(data: bytes) -> bytes:
    return b"D" + struct.pack("!I", TABLE_OID) + b"K" + data


def update_key(data: bytes, width: int) -> bytes:
    """An Update with ``data`` as its old key, then a valid new row of ``width`` NULLs."""
    new = struct.pack("!H", width) + b"n" * width
    return b"U" + struct.pack("!I", TABLE_OID) + b"K" + data + b"N" + new


def decoded_row(decoder: PgOutputDecoder, payload: bytes) -> Outcome:
    def read() -> Any:
        event = decoder.decode_one(payload, AT)
        assert isinstance(event, Insert | Delete | Update)
        return event.new if isinstance(event, Insert) else event.old

    return outcome(read)


def check_one_row(data: bytes, width: int) -> None:
    strict, stored = reference(data, "strict"), reference(data, "surrogatepass")
    # read_tuple: the fast read, at the start of a buffer and inside one.
    agrees(outcome(lambda: _whole(read_tuple(data), data)), strict, "read_tuple")
    shifted = b"xyz" + data
    agrees(outcome(lambda: _whole(read_tuple(shifted, 3), shifted)), strict, "read_tuple at 3")
    # EncodedRow: rows pgcdc keeps (lone surrogates allowed).
    agrees(outcome(lambda: decode_tuple_data(data)), stored, "decode_tuple_data")
    agrees(outcome(lambda: EncodedRow(data).values), stored, "EncodedRow")
    # A fast path asks the reference only about rows it refuses: valid rows never reach it.
    if not isinstance(strict, Refused):
        found_decoder = decoder(width)
        with (
            patch.object(tupledata, "read_tuple_reference", wraps=read_tuple_reference) as asked,
            patch.object(pgoutput, "read_tuple_reference", wraps=read_tuple_reference) as asked_too,
        ):
            read_tuple(data)
            assert tuple_end(data) == len(data)
            decode_tuple_data(data)
            if not isinstance(in_message(data, width), Refused):
                for payload in (insert(data), delete(data), update_key(data, width)):
                    assert decoded_row(found_decoder, payload) == strict
        assert not asked.called, "a fast path fell back on a valid row"
        assert not asked_too.called, "the decoder fell back on a valid row"
    # The decoder's rows: what it must walk (the column count; an old key, to find the new
    # row after it) is checked at decode time, the rest when the row is read (as stored).
    expected = in_message(data, width, "surrogatepass")
    for payload in (insert(data), delete(data)):
        agrees(decoded_row(decoder(width), payload), expected, "decoder")
    found = decoded_row(decoder(width), update_key(data, width))
    if isinstance(expected, Refused):
        # Refused at decode time when the walk finds the framing wrong (bytes after the row
        # then read as the new row's marker), or when read.
        assert isinstance(found, Refused), "decoder (old key)"
    else:
        agrees(found, expected, "decoder (old key)")


def _whole(read: tuple[tuple[RawValue, ...], int], buf: bytes) -> tuple[RawValue, ...]:
    values, end = read
    if end != len(buf):
        raise trailing_bytes_error(len(buf) - end)
    return values


def check_many_rows(datas: list[bytes], width: int) -> None:
    table = table_of(width)
    strict = [in_message(data, width) for data in datas]
    stored = [reference(data, "surrogatepass") for data in datas]
    all_valid = not any(isinstance(found, Refused) for found in strict)
    # columnar.frame_rows: all rows at once, or none.
    lengths = np.array([len(d) for d in datas], np.int64)
    ends = np.cumsum(lengths)
    buffer = columnar.WireBuffer(b"".join(datas))
    framed = columnar.frame_rows(buffer, ends - lengths, ends, width)
    assert (framed is not None) == all_valid, "frame_rows"
    if framed is not None:
        framing, _ = framed
        for index, expected in enumerate(strict):
            rows = np.array([index], np.int64)
            found = tuple(view.raw_values(rows)[0] for view in framing.columns)
            assert found == expected, "frame_rows values"
    # The change log writer's check: the first row EncodedRow would refuse, and why.
    first_bad = next(
        ((i, found.message) for i, found in enumerate(stored) if isinstance(found, Refused)), None
    )
    assert columnar.first_unreadable_row(pa.array(datas, pa.binary())) == first_bad
    # The same check as strict as a server's text: what decode_batch checks rows with.
    first_strict = next(
        ((i, found.message) for i, found in enumerate(strict) if isinstance(found, Refused)),
        None,
    )
    if all(declared_width(data) == width for data in datas):
        found_strict = columnar.first_unreadable_row(pa.array(datas, pa.binary()), "strict")
        assert found_strict == first_strict, "first_unreadable_row, strict"
    # Many messages: decode_many (framing read with numpy; the rows' own check left to their
    # reader, as decode_one leaves it) and decode_batch (every row checked).
    payloads = [insert(datas[i % len(datas)]) for i in range(MIN_COLUMNAR_RUN)]
    lsns = [LSN(AT + i) for i in range(len(payloads))]
    first_refused = next((found for found in strict if isinstance(found, Refused)), None)
    as_read = [in_message(data, width, "surrogatepass") for data in datas]
    width_refused = next(
        (
            found
            for data, found in zip(datas, as_read, strict=True)
            if declared_width(data) != width
        ),
        None,
    )
    try:
        events = decode_many(decoder(width), payloads, lsns)
    except DecodeError as exc:
        assert isinstance(width_refused, Refused), f"decode_many refused: {exc}"
        assert width_refused.message in str(exc), "decode_many"
    else:
        assert width_refused is None, "decode_many took a row of the wrong width"
        for i, event in enumerate(events):
            assert isinstance(event, Insert)
            agrees(outcome(lambda e=event: e.new), as_read[i % len(datas)], "decode_many rows")
    # Typed Arrow: the batch (or error) rows_to_arrow builds row by row from the same rows.
    if all_valid:
        cycled = [strict[i % len(datas)] for i in range(len(payloads))]
        expected_typed = typed(lambda: rows_to_arrow(table, cycled))  # type: ignore[arg-type]
        found_typed = typed(lambda: decode_batch(decoder(width), payloads, lsns))
        if isinstance(found_typed, DecodedBatch):
            news = pa.Table.from_batches([change.new for change in found_typed.changes])
            found_typed = news.combine_chunks().to_batches()[0]
        same_typed(found_typed, expected_typed, "decode_batch")
    else:
        assert first_refused is not None
        with pytest.raises(DecodeError) as error:
            decode_batch(decoder(width), payloads, lsns)
        assert first_refused.message in str(error.value), "decode_batch"
    row_by_row = typed(lambda: rows_to_arrow(table, [EncodedRow(data) for data in datas]))
    with patch.object(arrow, "COLUMNAR_MIN_ROWS", 1), patch.object(changes, "COLUMNAR_MIN_ROWS", 1):
        column = pa.array(datas, pa.binary())
        readers = {
            "rows_to_arrow(EncodedRow), columnar": lambda: rows_to_arrow(
                table, [EncodedRow(data) for data in datas]
            ),
            "spark typing": lambda: changes.tuples_to_arrow(
                table, column, arrow.DEFAULT_OPTIONS, {}
            ),
        }
        for what, read in readers.items():
            same_typed(typed(read), row_by_row, what)


def typed(read: Any) -> object:
    """A batch, or the type and message of what was raised instead."""
    try:
        batch: object = read()
    except Exception as exc:
        return type(exc), str(exc)
    return batch


def same_typed(found: object, expected: object, what: str) -> None:
    if isinstance(expected, pa.RecordBatch):
        assert isinstance(found, pa.RecordBatch), f"{what}: {found!r}"
        assert found.equals(expected), what
    else:
        assert found == expected, what


# --- the test ------------------------------------------------------------------------------------


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(tuple_data(), min_size=1, max_size=4), st.sampled_from([0, 0, 0, 1, -1]))
@example([b""], 0)  # empty: no column count
@example([b"\x00"], 0)  # half a column count
@example([b"\x00\x00"], 0)  # no columns
@example([b"\x00\x00", b"\x00\x00x"], 0)  # no columns, then a trailing byte
@example([b"\x00\x01n"], 0)  # a NULL last column
@example([b"\x00\x02t\x00\x00\x00\x01au"], 0)  # an unchanged last column
@example([b"\x00\x02t\x00\x00\x00\x01an", b"\x00\x02nt\x00\x00\x00\x01a"], 0)
@example([b"\x00\x02n"], 0)  # a column count larger than the columns
@example([b"\x00\x01nn"], 0)  # a column count smaller: a trailing byte
@example([b"\x00\x01x"], 0)  # an unknown kind
@example([b"\x00\x01t\x00\x00"], 0)  # a length cut short
@example([b"\x00\x01t\xff\xff\xff\xffab"], 0)  # a length past the end
@example([b"\x00\x01t\x00\x00\x00\x01\xff"], 0)  # text that is not UTF-8
@example([b"\x00\x01t\x00\x00\x00\x03\xed\xa0\x80"], 0)  # an encoded surrogate
@example([b"\x00\x01b\x00\x00\x00\xc8" + b"\x00" * 200], 0)  # a length byte that is not ASCII
@example([b"\x00\x01n"], 1)  # the relation is wider than the row
# Found by random exploration: one column text in a row and binary (not UTF-8) in another.
@example([b"\x00\x02nt\x00\x00\x00\x00", b"\x00\x02nb\x00\x00\x00\x01\x80"], 0)
def test_every_reader_agrees_with_the_reference(datas: list[bytes], shift: int) -> None:
    width = max((declared_width(datas[0]) or 0) + shift, 0)
    for data in datas:
        check_one_row(data, width)
    check_many_rows(datas, width)
