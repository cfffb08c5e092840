"""test_decoding lines as bytes: every line form, the formatter, and hypothesis properties
(generated events survive format -> parse; mutated lines raise only DecodeError)."""

from __future__ import annotations

import contextlib
import pickle
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.decoding import Decoder
from pgcdc.decoding.test_decoding import (
    TestDecodingDecoder,
    column_for,
    format_test_decoding,
    quote_identifier,
)
from pgcdc.errors import DecodeError, MissingOutputData
from pgcdc.events import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Commit,
    CommitPrepared,
    Delete,
    EncodedRow,
    Event,
    Insert,
    Message,
    Prepare,
    RawValue,
    Relation,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Table,
    Truncate,
    Update,
)
from pgcdc.lsn import LSN
from tests.conftest import examples

AT = LSN("0/16B3748")


def decode(line: str | bytes, decoder: TestDecodingDecoder | None = None) -> list[Event]:
    data = line.encode() if isinstance(line, str) else line
    return (decoder or TestDecodingDecoder()).decode(data, AT)


def only(line: str, decoder: TestDecodingDecoder | None = None) -> Event:
    events = [e for e in decode(line, decoder) if not isinstance(e, Relation)]
    assert len(events) == 1
    return events[0]


def test_is_a_decoder() -> None:
    decoder: Decoder = TestDecodingDecoder()
    assert decoder.decode(b"BEGIN", AT) == [Begin(AT, None)]


@pytest.mark.parametrize(
    ("line", "xid", "when"),
    [
        ("COMMIT", None, None),
        ("COMMIT 1234", 1234, None),
        (
            "COMMIT 1234 (at 2026-03-01 10:11:12.5+00)",
            1234,
            datetime(2026, 3, 1, 10, 11, 12, 500000, UTC),
        ),
        (
            "COMMIT (at 2026-03-01 10:11:12-05:30)",
            None,
            datetime(2026, 3, 1, 10, 11, 12, tzinfo=timezone(-timedelta(hours=5, minutes=30))),
        ),
    ],
)
def test_commit(line: str, xid: int | None, when: datetime | None) -> None:
    assert decode(line) == [Commit(AT, AT, AT, when, xid)]
    assert format_test_decoding(decode(line)[0]) == line


def test_begin_with_and_without_xid() -> None:
    assert decode("BEGIN 1234") == [Begin(AT, 1234)]
    assert decode("BEGIN") == [Begin(AT, None)]


def test_insert_values_and_types() -> None:
    line = (
        "table public.t: INSERT: id[integer]:1 name[text]:'it''s' n[numeric]:-1.5e+20 "
        "f[double precision]:NaN ok[boolean]:false bits[bit varying]:B'0101' "
        "vc[character varying(10)]:'a b: [c] ''d''' ts[timestamp(3) with time zone]:"
        "'2026-01-01 00:00:00+00' arr[integer[]]:'{1,NULL}' vcs[character varying(5)[]]:'{x}' "
        "iv[interval year to month]:'1 year' nl[text]:'line1\nline2' gone[text]:null "
        "empty[text]:'' mine[\"My Schema\".\"we]ird\"]:'v' q[\"char\"]:'c' j[jsonb]:'{\"a\": 1}'"
    )
    event = only(line)
    assert isinstance(event, Insert)
    assert event.table.qualified_name == "public.t" and event.table.oid == 0
    assert event.new == (
        "1", "it's", "-1.5e+20", "NaN", "f", "0101", "a b: [c] 'd'", "2026-01-01 00:00:00+00",
        "{1,NULL}", "{x}", "1 year", "line1\nline2", None, "", "v", "c", '{"a": 1}',
    )  # fmt: skip
    oids = [(c.name, c.type_oid) for c in event.table.columns]
    assert oids == [
        ("id", 23), ("name", 25), ("n", 1700), ("f", 701), ("ok", 16), ("bits", 1562),
        ("vc", 1043), ("ts", 1184), ("arr", 1007), ("vcs", 1015), ("iv", 1186), ("nl", 25),
        ("gone", 25), ("empty", 25), ("mine", 0), ("q", 18), ("j", 3802),
    ]  # fmt: skip
    assert event.table.columns[14].type_name == '"My Schema"."we]ird"'
    assert event.xid is None
    assert format_test_decoding(event) == line
    # One row form: the row is an EncodedRow, as pgoutput's are, whose bytes read back the same.
    row: object = event.new
    assert isinstance(row, EncodedRow) and EncodedRow(row.data) == row


def test_relation_only_when_columns_change() -> None:
    decoder = TestDecodingDecoder()
    first = decode("table public.t: INSERT: id[integer]:1", decoder)
    again = decode("table public.t: INSERT: id[integer]:2", decoder)
    changed = decode("table public.t: INSERT: id[integer]:3 v[text]:'x'", decoder)
    assert [type(e) for e in first] == [Relation, Insert]
    assert [type(e) for e in again] == [Insert]
    assert [type(e) for e in changed] == [Relation, Insert]
    assert isinstance(changed[0], Relation) and changed[0].table == changed[1].table  # type: ignore[union-attr]


def test_quoted_identifiers() -> None:
    line = (
        'table "My Schema"."we""ird": INSERT: "Col ""A"""[text]:\'x\' "select"[integer]:1 '
        "\"Ünïcode\"[text]:'ü'"
    )
    event = only(line)
    assert isinstance(event, Insert)
    assert (event.table.namespace, event.table.name) == ("My Schema", 'we"ird')
    assert [c.name for c in event.table.columns] == ['Col "A"', "select", "Ünïcode"]
    assert format_test_decoding(event) == line


def test_quote_identifier_follows_the_server_version() -> None:
    assert quote_identifier("plain_1") == "plain_1"
    assert quote_identifier("Mixed") == '"Mixed"'
    assert quote_identifier("order") == '"order"'
    assert quote_identifier("json", server_major=18) == '"json"'
    assert quote_identifier("json", server_major=15) == "json"
    assert quote_identifier("1abc") == '"1abc"'


def test_update_forms() -> None:
    decoder = TestDecodingDecoder()
    decode("table public.t: INSERT: id[integer]:1 a[text]:'x' b[text]:null", decoder)
    plain = only("table public.t: UPDATE: id[integer]:1 a[text]:'y' b[text]:null", decoder)
    assert isinstance(plain, Update) and plain.old is None and not plain.old_is_key
    key = only(
        "table public.t: UPDATE: old-key: id[integer]:1 new-tuple: id[integer]:2 a[text]:'y' "
        "b[text]:unchanged-toast-datum",
        decoder,
    )
    assert isinstance(key, Update)
    assert key.old == ("1", None, None) and key.old_is_key
    assert key.new == ("2", "y", UNCHANGED_TOAST)
    full = only(
        "table public.t: UPDATE: old-key: id[integer]:2 a[text]:'y' b[text]:'z' new-tuple: "
        "id[integer]:2 a[text]:'q' b[text]:'z'",
        decoder,
    )
    assert isinstance(full, Update) and full.old == ("2", "y", "z") and not full.old_is_key
    for event, line in (
        (key, "table public.t: UPDATE: old-key: id[integer]:1 new-tuple: id[integer]:2 "
         "a[text]:'y' b[text]:unchanged-toast-datum"),
    ):  # fmt: skip
        assert format_test_decoding(event) == line
    no_tuple = only("table public.t: UPDATE: (no-tuple-data)", decoder)
    assert isinstance(no_tuple, Update) and no_tuple.new == ()
    assert format_test_decoding(no_tuple) == "table public.t: UPDATE: (no-tuple-data)"


def test_delete_forms() -> None:
    decoder = TestDecodingDecoder()
    # Before any full tuple: the table is what the line shows.
    alone = only("table public.t: DELETE: id[integer]:1", decoder)
    assert isinstance(alone, Delete) and alone.old == ("1",)
    assert [c.name for c in alone.table.columns] == ["id"]
    decode("table public.t: INSERT: id[integer]:1 a[text]:'x'", decoder)
    known = only("table public.t: DELETE: id[integer]:1", decoder)
    assert isinstance(known, Delete) and known.old == ("1", None) and known.old_is_key
    nothing = only("table public.t: DELETE: (no-tuple-data)", decoder)
    assert isinstance(nothing, Delete) and nothing.old == ()
    for event, line in (
        (known, "table public.t: DELETE: id[integer]:1"),
        (nothing, "table public.t: DELETE: (no-tuple-data)"),
    ):
        assert format_test_decoding(event) == line


@pytest.mark.parametrize(
    ("flags", "cascade", "restart"),
    [(" (no-flags)", False, False), (" cascade", True, False), (" restart_seqs", False, True),
     (" restart_seqs cascade", True, True)],
)  # fmt: skip
def test_truncate(flags: str, cascade: bool, restart: bool) -> None:
    line = f'table public.a, "S".b: TRUNCATE:{flags}'
    event = only(line)
    assert isinstance(event, Truncate)
    assert [t.qualified_name for t in event.tables] == ["public.a", "S.b"]
    assert (event.cascade, event.restart_identity) == (cascade, restart)
    assert format_test_decoding(event) == line


def test_messages() -> None:
    assert decode(b"message: transactional: 1 prefix: p, sz: 5 content:hello") == [
        Message(AT, True, "p", b"hello")
    ]
    tricky = b"message: transactional: 0 prefix: a, sz: 3 content:b, sz: 4 content:x\n\xff!"
    (event,) = decode(tricky)
    assert event == Message(AT, False, "a, sz: 3 content:b", b"x\n\xff!")
    assert decode(b"message: transactional: 1 prefix: , sz: 0 content:") == [
        Message(AT, True, "", b"")
    ]
    text_line = "message: transactional: 1 prefix: p, sz: 6 content:h\u00e9llo"
    assert format_test_decoding(only(text_line)) == text_line
    with pytest.raises(MissingOutputData, match="stream-changes"):
        decode(b"streaming message: transactional: 1 prefix: p, sz: 5")
    with pytest.raises(DecodeError, match="sz"):
        decode(b"message: transactional: 1 prefix: p, sz: 9 content:hello")


def test_two_phase_lines() -> None:
    decoder = TestDecodingDecoder()
    at = " (at 2026-05-06 07:08:09.123456+00)"
    when = datetime(2026, 5, 6, 7, 8, 9, 123456, UTC)
    prepare = only(f"PREPARE TRANSACTION E'a''b\\\\c', txid 77{at}", decoder)
    assert prepare == Prepare(AT, 77, "a'b\\c", AT, AT, when)
    assert decoder.state.prepared == {"a'b\\c": (AT, when)}
    commit = only(f"COMMIT PREPARED 'g', txid 78{at}", decoder)
    assert commit == CommitPrepared(AT, 78, "g", AT, AT, when)
    later = LSN(int(AT) + 100)
    rollback = decoder.decode(f"ROLLBACK PREPARED E'a''b\\\\c', txid 77{at}".encode(), later)
    assert rollback == [RollbackPrepared(later, 77, "a'b\\c", AT, later, when, when)]
    assert decoder.state.prepared == {}
    for event, line in (
        (prepare, f"PREPARE TRANSACTION E'a''b\\\\c', txid 77{at}"),
        (commit, f"COMMIT PREPARED 'g', txid 78{at}"),
    ):
        assert format_test_decoding(event) == line
    with pytest.raises(MissingOutputData, match="include-xids"):
        decode(f"COMMIT PREPARED 'g'{at}")
    with pytest.raises(MissingOutputData, match="PREPARE"):
        decode(f"ROLLBACK PREPARED 'never', txid 1{at}")


def test_two_phase_lines_without_timestamps() -> None:
    """include-timestamp=0 (test_decoding's default): the times are None, nothing else is lost."""
    decoder = TestDecodingDecoder()
    lines = {
        "prepare": "PREPARE TRANSACTION 'g1', txid 77",
        "commit": "COMMIT PREPARED 'g1', txid 77",
        "prepare2": "PREPARE TRANSACTION 'g2', txid 78",
        "rollback": "ROLLBACK PREPARED 'g2', txid 78",
    }
    at = {name: LSN(int(AT) + 10 * i) for i, name in enumerate(lines)}
    events = {name: decoder.decode(line.encode(), at[name]) for name, line in lines.items()}
    assert events == {
        "prepare": [Prepare(at["prepare"], 77, "g1", at["prepare"], at["prepare"], None)],
        "commit": [CommitPrepared(at["commit"], 77, "g1", at["commit"], at["commit"], None)],
        "prepare2": [Prepare(at["prepare2"], 78, "g2", at["prepare2"], at["prepare2"], None)],
        # The prepare's end LSN still comes from the state the PREPARE line left.
        "rollback": [
            RollbackPrepared(at["rollback"], 78, "g2", at["prepare2"], at["rollback"], None, None)
        ],
    }
    assert decoder.state.prepared == {}
    for name, line in lines.items():
        assert format_test_decoding(events[name][0]) == line


def test_streaming_lines() -> None:
    decoder = TestDecodingDecoder()
    at = " (at 2026-05-06 07:08:09+02)"
    when = datetime(2026, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    assert decode("opening a streamed block for transaction TXN 9", decoder) == [
        StreamStart(AT, 9, True)
    ]
    with pytest.raises(MissingOutputData, match="stream-changes"):
        decode("streaming change for TXN 9", decoder)
    with pytest.raises(MissingOutputData):
        decode("streaming truncate for TXN 9", decoder)
    assert decode("closing a streamed block for transaction TXN 9", decoder) == [StreamStop(AT, 9)]
    assert decode("opening a streamed block for transaction TXN 9", decoder) == [
        StreamStart(AT, 9, False)
    ]
    assert decode("aborting streamed (sub)transaction TXN 10", decoder) == [StreamAbort(AT, 9, 10)]
    assert decode(f"committing streamed transaction TXN 9{at}", decoder) == [
        StreamCommit(AT, 9, AT, AT, when)
    ]
    assert decoder.state.open_streams == set()
    assert decode(f"preparing streamed transaction TXN 'g', txid 11{at}", decoder) == [
        StreamPrepare(AT, 11, "g", AT, AT, when)
    ]
    line = "closing a streamed block for transaction TXN 9"
    # The event's own xid wins; stream_xid only fills in for pgoutput's xid-less StreamStop.
    assert format_test_decoding(StreamStop(AT, 9)) == line
    assert format_test_decoding(StreamStop(AT, 9), stream_xid=8) == line
    assert format_test_decoding(StreamStop(AT), stream_xid=9) == line
    assert format_test_decoding(StreamStop(AT)) == "closing a streamed block for transaction"
    assert decode("closing a streamed block for transaction") == [StreamStop(AT, None)]
    assert (
        format_test_decoding(StreamAbort(AT, 9, 10)) == "aborting streamed (sub)transaction TXN 10"
    )
    with pytest.raises(MissingOutputData, match="include-xids"):
        decode("opening a streamed block for transaction")
    # Without include-timestamp the commit and prepare times are None.
    untimed = decoder.decode(b"opening a streamed block for transaction TXN 12", AT)
    assert untimed == [StreamStart(AT, 12, True)]
    assert decode("committing streamed transaction TXN 12", decoder) == [
        StreamCommit(AT, 12, AT, AT, None)
    ]
    assert decoder.state.open_streams == set()
    assert decode("preparing streamed transaction TXN 'g', txid 11", decoder) == [
        StreamPrepare(AT, 11, "g", AT, AT, None)
    ]
    for line in (
        "committing streamed transaction TXN 12",
        "preparing streamed transaction TXN 'g', txid 11",
    ):
        assert format_test_decoding(only(line)) == line
    with pytest.raises(MissingOutputData, match="which transaction"):
        decode("aborting streamed (sub)transaction TXN 10")


@pytest.mark.parametrize(
    "line",
    [
        "",
        "BEGIN x",
        "COMMIT 12 (at yesterday)",
        "COMMIT 12 (at 2026-13-01 00:00:00+00)",
        "table public.t: INSERT: id[integer]:'1'",
        "table public.t: INSERT: id[integer]:",
        "table public.t: INSERT: ok[boolean]:yes",
        "table public.t: INSERT: v[text]:'unterminated",
        "table public.t: INSERT: v[text]:'x'trailing",
        "table public.t INSERT: v[text]:'x'",
        "table Public.t: INSERT: v[text]:'x'",
        "table \"\".t: INSERT: v[text]:'x'",
        "table public.t: UPSERT: v[text]:'x'",
        "table public.t: INSERT: v[text:'x'",
        "table public.t: INSERT: old-key: v[text]:'x' new-tuple: v[text]:'y'",
        "table public.t: UPDATE: old-key: v[text]:'x'",
        "table public.t: TRUNCATE:",
        "table public.t: TRUNCATE: cascade restart_seqs",
        "PREPARE TRANSACTION 'a\\b', txid 1 (at 2026-01-01 00:00:00+00)",
    ],
)
def test_malformed_lines_raise_decode_error(line: str) -> None:
    with pytest.raises(DecodeError):
        decode(line)


def test_invalid_encoding() -> None:
    with pytest.raises(DecodeError, match="utf-8"):
        decode(b"table public.t: INSERT: v[text]:'\xff'")
    latin = TestDecodingDecoder(encoding="latin-1")
    event = latin.decode(b"table public.t: INSERT: v[text]:'\xff'", AT)
    assert isinstance(event[1], Insert) and event[1].new == ("\u00ff",)


def test_state_pickles_and_resumes() -> None:
    decoder = TestDecodingDecoder()
    decode("table public.t: INSERT: id[integer]:1 a[text]:'x'", decoder)
    decode("opening a streamed block for transaction TXN 5", decoder)
    resumed = TestDecodingDecoder(pickle.loads(pickle.dumps(decoder.state)))
    line = "table public.t: DELETE: id[integer]:1"
    assert decode(line, resumed) == decode(line, decoder)
    assert resumed.state.open_streams == {5}


def test_formatter_refuses_what_test_decoding_cannot_print() -> None:
    table = Table("public", "t", (Column("id", 23),))
    assert (
        format_test_decoding(Insert(AT, table, ("1",))) == "table public.t: INSERT: id[integer]:1"
    )
    with pytest.raises(ValueError, match="Relation"):
        format_test_decoding(Relation(AT, table))
    with pytest.raises(ValueError, match="text"):
        format_test_decoding(Insert(AT, table, (b"\x01",)))
    with pytest.raises(ValueError, match="columns"):
        format_test_decoding(Insert(AT, table, ("1", "2")))


# --- properties ------------------------------------------------------------------------------

identifiers = st.one_of(
    st.from_regex(r"[a-z_][a-z0-9_]{0,10}", fullmatch=True),
    st.text(min_size=1, max_size=12).filter(lambda s: "\x00" not in s),
)
TYPES: dict[str, st.SearchStrategy[str]] = {
    "integer": st.integers(-(2**31), 2**31 - 1).map(str),
    "numeric": st.decimals(allow_nan=False, allow_infinity=False).map(str),
    "double precision": st.sampled_from(["NaN", "Infinity", "-Infinity", "1.5", "-0"]),
    "boolean": st.sampled_from(["t", "f"]),
    "bit varying": st.text(alphabet="01", max_size=8),
    "text": st.text().filter(lambda s: "\x00" not in s),
    "integer[]": st.sampled_from(["{}", "{1,NULL}", "{{1,2},{3,4}}"]),
    "character varying(10)": st.text(max_size=10).filter(lambda s: "\x00" not in s),
    '"My Schema"."we""ird type"[]': st.text(max_size=5).filter(lambda s: "\x00" not in s),
}


@st.composite
def tables_and_rows(draw: st.DrawFn) -> tuple[Table, tuple[RawValue, ...]]:
    names = draw(st.lists(identifiers, min_size=1, max_size=6, unique=True))
    type_names = [draw(st.sampled_from(sorted(TYPES))) for _ in names]
    columns = tuple(
        column_for(name, type_name) for name, type_name in zip(names, type_names, strict=True)
    )
    values = tuple(
        draw(st.one_of(st.none(), st.just(UNCHANGED_TOAST), TYPES[type_name]))
        for type_name in type_names
    )
    table = Table(draw(identifiers), draw(identifiers), columns)
    return table, values


@settings(max_examples=examples(300), deadline=None)
@given(tables_and_rows())
def test_generated_inserts_round_trip(table_and_row: tuple[Table, tuple[RawValue, ...]]) -> None:
    table, row = table_and_row
    line = format_test_decoding(Insert(AT, table, row))
    events = decode(line)
    assert events == [Relation(AT, table), Insert(AT, table, row)]
    assert format_test_decoding(events[1]) == line


@settings(max_examples=examples(200), deadline=None)
@given(tables_and_rows(), st.data())
def test_generated_updates_and_deletes_round_trip(
    table_and_row: tuple[Table, tuple[RawValue, ...]], data: st.DataObject
) -> None:
    table, row = table_and_row
    old = tuple(None if data.draw(st.booleans()) or v is UNCHANGED_TOAST else v for v in row)
    decoder = TestDecodingDecoder()
    decode(format_test_decoding(Insert(AT, table, row)), decoder)
    for event in (Update(AT, table, row, old), Delete(AT, table, old)):
        line = format_test_decoding(event)
        (parsed,) = decode(line, decoder)
        assert format_test_decoding(parsed) == line
        assert isinstance(parsed, Update | Delete) and parsed.old == old


VALID_LINES = [
    b"BEGIN 1234",
    b"COMMIT 1234 (at 2026-03-01 10:11:12.5+00)",
    b"table public.t: INSERT: id[integer]:1 name[text]:'it''s' b[boolean]:true "
    b"x[bit]:B'01' n[numeric]:null t[text]:unchanged-toast-datum",
    b'table "S"."t": UPDATE: old-key: id[integer]:1 new-tuple: id[integer]:2 a[integer[]]:\'{1}\'',
    b"table public.t: DELETE: id[integer]:1",
    b"table public.a, public.b: TRUNCATE: restart_seqs cascade",
    b"message: transactional: 1 prefix: p, sz: 5 content:hello",
    b"PREPARE TRANSACTION E'a''\\\\', txid 5 (at 2026-03-01 10:11:12+05:30)",
    b"committing streamed transaction TXN 9 (at 2026-03-01 10:11:12+00)",
    b"opening a streamed block for transaction TXN 9",
    b"closing a streamed block for transaction TXN 9",
    b"PREPARE TRANSACTION 'g', txid 5",
    b"committing streamed transaction TXN 9",
]


@settings(max_examples=examples(500), deadline=None)
@given(
    st.sampled_from(VALID_LINES),
    st.integers(0, 200),
    st.binary(max_size=3),
    st.integers(0, 3),
)
def test_mutated_lines_raise_only_decode_error(
    line: bytes, position: int, insert: bytes, delete: int
) -> None:
    cut = position % (len(line) + 1)
    for mutated in (line[:cut], line[:cut] + insert + line[cut + delete :]):
        with contextlib.suppress(DecodeError):
            decode(mutated)
