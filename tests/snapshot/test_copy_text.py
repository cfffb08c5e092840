"""COPY text format back to raw pgoutput values, and the copy plan: pure, no server."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pgcdc.errors import DecodeError, InvalidOption
from pgcdc.events import Column, Table
from pgcdc.snapshot import Chunk, SnapshotTable, copy_query, parse_copy_text_row, plan_chunks

# What COPY TO writes for a character (CopyAttributeOutText with the default tab delimiter).
_COPY_ESCAPES = {"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r", "\b": "\\b", "\f": "\\f"}
_COPY_ESCAPES["\v"] = "\\v"


def copy_escape(value: str | None) -> str:
    if value is None:
        return "\\N"
    return "".join(_COPY_ESCAPES.get(c, c) for c in value)


def copy_line(row: tuple[str | None, ...]) -> bytes:
    return ("\t".join(copy_escape(v) for v in row) + "\n").encode()


def test_escapes_nulls_and_unicode_come_back_exactly() -> None:
    line = b"1\t\\N\ta\\tb\\nc\\\\d\\re\\bf\\fg\\vh\t\\\\N\t\xc3\xa9\xe2\x82\xac\t\n"
    assert parse_copy_text_row(line, 6) == ("1", None, "a\tb\nc\\d\re\bf\fg\vh", "\\N", "é€", "")


@given(st.lists(st.one_of(st.none(), st.text()), min_size=1, max_size=6))
def test_any_row_round_trips(values: list[str | None]) -> None:
    row = tuple(v.replace("\0", "") if v is not None else None for v in values)
    assert parse_copy_text_row(copy_line(row), len(row)) == row


def test_table_without_columns() -> None:
    assert parse_copy_text_row(b"\n", 0) == ()
    with pytest.raises(DecodeError):
        parse_copy_text_row(b"x\n", 0)


@pytest.mark.parametrize(
    ("line", "width", "why"),
    [
        (b"a\tb\n", 3, "2 fields, expected 3"),
        (b"a\\x41\n", 1, "unexpected escape"),
        (b"a\\\n", 1, "unexpected escape"),
        (b"a\tb", 2, "newline"),
        (b"\xff\n", 1, "UTF-8"),
    ],
)
def test_malformed_rows_are_typed_errors(line: bytes, width: int, why: str) -> None:
    with pytest.raises(DecodeError, match=why):
        parse_copy_text_row(line, width)


def _spec(pages: int, relkind: str = "r", row_filter: str | None = None) -> SnapshotTable:
    table = Table("public", f"t{pages}", (Column("id", 23, -1, True), Column("Mixed", 25)), pages)
    return SnapshotTable(table, relkind, pages, row_filter)


def test_plan_covers_every_page_once_and_ends_open() -> None:
    big, small, root = _spec(1000), _spec(10), _spec(5000, relkind="p")
    chunks = plan_chunks([small, big, root], 300)
    big_chunks = [c for c in chunks if c.table is big]
    assert [(c.first_page, c.end_page) for c in big_chunks] == [
        (0, 300),
        (300, 600),
        (600, 900),
        (900, None),
    ]
    assert [c for c in chunks if c.table is small] == [Chunk(small)]
    assert [c for c in chunks if c.table is root] == [Chunk(root)]  # partitioned: never split
    assert chunks[0].table is root  # biggest first, so the long copies start early


def test_plan_rejects_empty_chunks() -> None:
    with pytest.raises(InvalidOption):
        plan_chunks([_spec(1)], 0)


def test_copy_query_quotes_names_and_adds_ranges_and_filter() -> None:
    text = copy_query(Chunk(_spec(1000, row_filter="id > 5"), 300, 600)).as_string()
    assert text == (
        'COPY (SELECT "id", "Mixed" FROM "public"."t1000" WHERE ctid >= \'(300,0)\'::tid '
        "AND ctid < '(600,0)'::tid AND (id > 5)) TO STDOUT"
    )
    assert copy_query(Chunk(_spec(1))).as_string() == (
        'COPY (SELECT "id", "Mixed" FROM "public"."t1") TO STDOUT'
    )


def test_copy_query_of_keys_on_some_pages() -> None:
    text = copy_query(
        Chunk(_spec(1000), keys=(("1",), ("it's",)), within=((0, 300), (900, None)))
    ).as_string()
    assert text == (
        'COPY (SELECT "id", "Mixed" FROM "public"."t1000" WHERE ("id") IN ((\'1\'), (\'it\'\'s\')) '
        "AND ((ctid >= '(0,0)'::tid AND ctid < '(300,0)'::tid) OR (ctid >= '(900,0)'::tid))) "
        "TO STDOUT"
    )
    nothing = copy_query(Chunk(_spec(1000), keys=(), within=((None, None),))).as_string()
    assert nothing.endswith("WHERE false AND ((true))) TO STDOUT")
