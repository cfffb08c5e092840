"""openGauss mppdb_decoding: byte fixtures built from openGauss's documentation of the format
(no openGauss server runs here), the options and the white-table-list grammar."""

from __future__ import annotations

import contextlib
import pickle
import struct
from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.decoding import Decoder
from pgcdc.decoding.mppdb import (
    DecodeStyle,
    MppdbDecoder,
    MppdbOptions,
    parse_heartbeat,
    parse_table_patterns,
    split_sending_batch,
)
from pgcdc.errors import DecodeError, InvalidOption, InvalidTablePattern, UnsupportedFeature
from pgcdc.events import (
    Begin,
    Column,
    Commit,
    Delete,
    EncodedRow,
    Heartbeat,
    Insert,
    Relation,
    Table,
    Update,
)
from pgcdc.lsn import LSN
from tests.conftest import examples

AT = LSN("0/5000000")
NULL = None

# --- a byte builder that follows the document, field by field -------------------------------


def u16(n: int) -> bytes:
    return struct.pack(">H", n)


def u32(n: int) -> bytes:
    return struct.pack(">I", n)


def u64(n: int) -> bytes:
    return struct.pack(">Q", n)


def text16(s: str) -> bytes:
    raw = s.encode()
    return u16(len(raw)) + raw


def text32(s: str) -> bytes:
    raw = s.encode()
    return u32(len(raw)) + raw


def record(lsn: int, body: bytes) -> bytes:
    """uint32 length of (LSN + body), uint64 LSN, body; the separator is added by batch()."""
    return u32(8 + len(body)) + u64(lsn) + body


def batch(*records: bytes, end: bytes = b"F") -> bytes:
    return b"P".join(records) + end


def begin(csn: int, first_lsn: int, time: str | None = None, user: str | None = None) -> bytes:
    body = b"B" + u64(csn) + u64(first_lsn)
    if time is not None:
        body += b"T" + text32(time)
    if user is not None:
        body += b"N" + text32(user)
    return body


def commit(xid: int | None = None, time: str | None = None) -> bytes:
    body = b"C"
    if xid is not None:
        body += b"X" + u64(xid)
    if time is not None:
        body += b"T" + text32(time)
    return body


def tuple_(columns: list[tuple[str, int, str | None]]) -> bytes:
    out = u16(len(columns))
    for name, oid, value in columns:
        out += text16(name) + u32(oid)
        out += u32(0xFFFFFFFF) if value is None else text32(value)
    return out


def change(kind: bytes, schema: str, table: str, new: bytes | None, old: bytes | None) -> bytes:
    body = kind + text16(schema) + text16(table)
    if new is not None:
        body += b"N" + new
    if old is not None:
        body += b"O" + old
    return body


ROW = [("id", 23, "1"), ("name", 25, "it's: [x]\n"), ("note", 25, NULL), ("empty", 25, "")]
TABLE = Table("public", "t1", tuple(Column(n, oid) for n, oid, _ in ROW))


def decode(payload: bytes, decoder: MppdbDecoder | None = None) -> list[object]:
    return list((decoder or MppdbDecoder()).decode(payload, AT))


# --- a fixture written out byte by byte from the document, independent of the builder -------


def test_hand_written_fixture() -> None:
    # B with CSN 2002, first_lsn 0x1000 and user name "u" ('N', length 1, "u"), then 'P'; an
    # INSERT into s.t of (a int4 = '7', b text NULL), then 'F'.
    payload = bytes.fromhex(
        "0000001f"  # 8 + 1 + 8 + 8 + 1 + 4 + 1 = 31
        "0000000000001000" "42" "00000000000007d2" "0000000000001000"
        "4e" "00000001" "75"
        "50"  # 'P'
        "00000029"  # 8 + 1 + (2+1) + (2+1) + 1 + 2 + (2+1+4+4+1) + (2+1+4+4) = 41
        "0000000000001010" "49"
        "0001" "73" "0001" "74"
        "4e" "0002"
        "0001" "61" "00000017" "00000001" "37"
        "0001" "62" "00000019" "ffffffff"
        "46"  # 'F'
    )  # fmt: skip
    table = Table("s", "t", (Column("a", 23), Column("b", 25)))
    assert decode(payload) == [
        Begin(LSN(0x1000), None, None, None, csn=2002, first_lsn=LSN(0x1000)),
        Relation(LSN(0x1010), table),
        Insert(LSN(0x1010), table, ("7", None)),
    ]
    # The builder used below agrees with the hand count of the length rule.
    assert record(0x1000, begin(2002, 0x1000, user="u"))[:4] == bytes.fromhex("0000001f")


def test_is_a_decoder() -> None:
    decoder: Decoder = MppdbDecoder()
    assert decoder.decode(u32(0), AT) == []


def test_transaction_batch() -> None:
    payload = batch(
        record(0x100, begin(77, 0x100, time="2026-01-02 03:04:05.5+08", user="alice")),
        record(0x120, change(b"I", "public", "t1", tuple_(ROW), None)),
        record(0x200, commit(xid=900, time="2026-01-02 03:04:06+08")),
    )
    tz = timezone(timedelta(hours=8))
    assert decode(payload) == [
        Begin(LSN(0x100), None, None, datetime(2026, 1, 2, 3, 4, 5, 500000, tz), 77, LSN(0x100)),
        Relation(LSN(0x120), TABLE),
        Insert(LSN(0x120), TABLE, ("1", "it's: [x]\n", None, "")),
        Commit(LSN(0x200), LSN(0x200), LSN(0x200), datetime(2026, 1, 2, 3, 4, 6, tzinfo=tz), 900),
    ]


def test_optional_parts_left_out() -> None:
    payload = batch(record(1, begin(5, 1)), record(2, commit()))
    assert decode(payload) == [
        Begin(LSN(1), None, csn=5, first_lsn=LSN(1)),
        Commit(LSN(2), LSN(2), LSN(2), None, None),
    ]


def test_zero_length_ends_a_batch() -> None:
    payload = record(1, begin(5, 1)) + b"P" + u32(0)
    assert decode(payload) == [Begin(LSN(1), None, csn=5, first_lsn=LSN(1))]
    assert decode(batch(record(1, begin(5, 1))) + u32(0)) == decode(payload)


def test_updates_and_deletes() -> None:
    decoder = MppdbDecoder()
    decode(batch(record(1, change(b"I", "public", "t1", tuple_(ROW), None))), decoder)
    new = [("id", 23, "2"), ("name", 25, "n"), ("note", 25, NULL), ("empty", 25, "")]
    key_only = tuple_([("id", 23, "1")])
    events = decode(batch(record(2, change(b"U", "public", "t1", tuple_(new), key_only))), decoder)
    assert events == [Update(LSN(2), TABLE, ("2", "n", None, ""), ("1", None, None, None), True)]
    full_old = tuple_(ROW)
    events = decode(batch(record(3, change(b"U", "public", "t1", tuple_(new), full_old))), decoder)
    assert events == [Update(LSN(3), TABLE, ("2", "n", None, ""), ("1", "it's: [x]\n", None, ""))]
    no_old = decode(batch(record(4, change(b"U", "public", "t1", tuple_(new), None))), decoder)
    assert no_old == [Update(LSN(4), TABLE, ("2", "n", None, ""))]
    events = decode(batch(record(5, change(b"D", "public", "t1", None, key_only))), decoder)
    assert events == [Delete(LSN(5), TABLE, ("1", None, None, None), True)]
    events = decode(batch(record(6, change(b"D", "public", "t1", None, None))), decoder)
    assert events == [Delete(LSN(6), TABLE, ())]
    # One row form: rows are EncodedRows, as pgoutput's are.
    deleted, updated = events[0], no_old[0]
    assert isinstance(deleted, Delete) and isinstance(updated, Update)
    assert type(deleted.old) is EncodedRow and type(updated.new) is EncodedRow
    # A table first seen in a DELETE is described by the columns the old tuple shows.
    events = decode(batch(record(7, change(b"D", "s", "other", None, key_only))))
    assert events == [Delete(LSN(7), Table("s", "other", (Column("id", 23),)), ("1",), True)]


def test_relation_only_when_columns_change() -> None:
    decoder = MppdbDecoder()
    insert = record(1, change(b"I", "public", "t1", tuple_(ROW), None))
    assert [type(e) for e in decode(batch(insert, insert), decoder)] == [Relation, Insert, Insert]
    wider = record(2, change(b"I", "public", "t1", tuple_([*ROW, ("x", 16, "t")]), None))
    assert [type(e) for e in decode(batch(wider), decoder)] == [Relation, Insert]
    resumed = MppdbDecoder(pickle.loads(pickle.dumps(decoder.state)))
    assert [type(e) for e in decode(batch(wider), resumed)] == [Insert]


def test_heartbeat() -> None:
    stamp = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp()) * 1_000_000 + 250
    payload = b"h" + u64(0x1234) + u64(0x1200) + struct.pack(">q", stamp) + b"F"
    expected = Heartbeat(LSN(0x1234), datetime(2026, 1, 1, 0, 0, 0, 250, UTC))
    assert decode(payload) == [expected]
    seconds = b"h" + u64(1) + u64(1) + struct.pack(">q", 60) + b"F"
    assert MppdbDecoder(heartbeat_time_unit="s").decode(seconds, AT) == [
        Heartbeat(LSN(1), datetime(1970, 1, 1, 0, 1, tzinfo=UTC))
    ]
    unterminated = payload[:-1]
    assert parse_heartbeat(unterminated, terminator=b"") == expected
    with pytest.raises(DecodeError, match="heartbeat"):
        decode(unterminated)
    with pytest.raises(DecodeError, match="out of range"):
        decode(b"h" + u64(1) + u64(1) + struct.pack(">q", 2**62) + b"F")


def test_sending_batch_framing_of_text_and_json() -> None:
    texts = [(LSN(0x10), b"BEGIN 42"), (LSN(0x20), '{"op": "é"}'.encode())]
    payload = b"".join(u32(8 + len(t)) + u64(lsn) + t for lsn, t in texts) + u32(0)
    assert split_sending_batch(payload) == texts
    heartbeat = b"h" + u64(7) + u64(7) + struct.pack(">q", 0) + u32(0)
    assert split_sending_batch(heartbeat) == [Heartbeat(LSN(7), datetime(1970, 1, 1, tzinfo=UTC))]
    with pytest.raises(DecodeError, match="truncated"):
        split_sending_batch(payload[:-4])
    with pytest.raises(DecodeError, match="shorter than its LSN"):
        split_sending_batch(u32(3) + b"abc" + u32(0))
    with pytest.raises(UnsupportedFeature, match="split_sending_batch"):
        MppdbDecoder(decode_style=DecodeStyle.JSON)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "truncated"),
        (record(1, begin(1, 1)), "truncated"),
        (record(1, begin(1, 1)) + b"X", "separator"),
        (record(1, b"Z") + b"F", "record kind"),
        (u32(100) + u64(1) + b"B", "runs past"),
        (u32(8 + 1 + 16 + 1) + u64(1) + begin(1, 1) + b"?F", "its length says"),
        (batch(record(1, begin(1, 1))) + b"junk", "after the batch"),
        (batch(record(1, change(b"I", "s", "t", None, tuple_(ROW)))), "old tuple"),
        (batch(record(1, change(b"D", "s", "t", tuple_(ROW), None))), "new tuple"),
        (batch(record(1, change(b"U", "s", "t", tuple_(ROW + ROW[:1]), None))), "twice"),
        (batch(record(1, begin(1, 1, time="yesterday"))), "timestamp"),
        (batch(record(1, change(b"I", "s", "t", b"\x00\x01\x00\x01a\x00\x00", None))), "truncated"),
        (batch(record(1, b"I" + u16(1) + b"\xff" + text16("t"))), "utf-8"),
    ],
)
def test_malformed_payloads(payload: bytes, reason: str) -> None:
    with pytest.raises(DecodeError, match=reason):
        decode(payload)


# --- options ---------------------------------------------------------------------------------


def test_options_defaults_send_nothing_and_changes_are_named() -> None:
    assert MppdbOptions().to_pairs() == []
    options = MppdbOptions(
        include_xids=False,
        include_timestamp=True,
        skip_empty_xacts=True,
        white_table_list="public.t1,*.t3,my_schema.*",
        max_txn_in_memory=100,
        max_reorderbuffer_in_memory=1,
        include_user=True,
        exclude_users=("etl", "backup"),
        enable_heartbeat=True,
        sender_timeout=0,
        parallel_decode_num=4,
        sending_batch=1,
        decode_style=DecodeStyle.TEXT,
        standby_connection=True,
    )
    assert options.to_pairs() == [
        ("include-xids", "0"),
        ("skip-empty-xacts", "1"),
        ("include-timestamp", "1"),
        ("white-table-list", "public.t1,*.t3,my_schema.*"),
        ("max-txn-in-memory", "100"),
        ("max-reorderbuffer-in-memory", "1"),
        ("include-user", "1"),
        ("exclude-users", "etl,backup"),
        ("standby-connection", "true"),
        ("sender-timeout", "0"),
        ("enable-heartbeat", "true"),
        ("parallel-decode-num", "4"),
        ("sending-batch", "1"),
        ("decode-style", "t"),
    ]
    assert options.white_table_patterns is not None
    assert options.white_table_patterns.matches("anything", "t3")
    csn = MppdbOptions(output_order=1, logical_receiver_num=20, slice_id=0)
    assert csn.to_pairs() == [
        ("output-order", "1"),
        ("logical-receiver-num", "20"),
        ("slice-id", "0"),
    ]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_txn_in_memory": 101}, "max_txn_in_memory=101.*0 to 100"),
        ({"max_txn_in_memory": -1}, "0 to 100"),
        ({"max_reorderbuffer_in_memory": 101}, "0 to 100"),
        ({"sender_timeout": 2_147_483_648}, "0 to 2147483647"),
        ({"sender_timeout": -1}, "sender_timeout"),
        ({"parallel_decode_num": 0}, "parallel_decode_num"),
        ({"output_order": 2}, "output_order"),
        ({"include_xids": 1}, "true or false"),
        ({"sending_batch": 1}, "parallel_decode_num > 1"),
        ({"decode_style": DecodeStyle.JSON}, "parallel_decode_num > 1"),
        ({"parallel_decode_num": 2, "sending_batch": 2}, "sending_batch"),
        ({"parallel_decode_num": 2, "decode_style": "j"}, "decode_style"),
        ({"logical_receiver_num": 2}, "output_order=1"),
        ({"output_order": 1, "logical_receiver_num": 21}, "1 to 20"),
        ({"output_order": 1, "slice_id": 8193}, "0 to 8192"),
        ({"exclude_users": ("a,b",)}, "exclude_users"),
        ({"exclude_userids": (-1,)}, "exclude_userids"),
        ({"white_table_list": "public. t1"}, "whitespace"),
    ],
)
def test_invalid_options(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidOption, match=message):
        MppdbOptions(**kwargs)  # type: ignore[arg-type]


# --- white-table-list ------------------------------------------------------------------------


def test_table_patterns_match() -> None:
    patterns = parse_table_patterns("public.t1,public.t2,*.t3,my_schema.*")
    assert str(patterns) == "public.t1,public.t2,*.t3,my_schema.*"
    assert patterns.matches("public", "t1") and patterns.matches("public", "t2")
    assert patterns.matches("other", "t3") and patterns.matches("my_schema", "anything")
    assert not patterns.matches("public", "t4")
    assert not patterns.matches("Public", "t1")
    assert not patterns.matches("my_schema2", "x")
    assert parse_table_patterns("*.*").matches("a", "b")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("public.t1, public.t2", "whitespace"),
        ("public.t1\t", "whitespace"),
        ("public", "not schema.table"),
        ("public.t1,", "not schema.table"),
        (",public.t1", "not schema.table"),
        ("a.b.c", "not schema.table"),
        (".t1", "not schema.table"),
        ("public.", "not schema.table"),
        ("public.t*", "inside a name"),
        ("p*b.t", "inside a name"),
    ],
)
def test_invalid_table_patterns(text: str, reason: str) -> None:
    with pytest.raises(InvalidTablePattern, match=reason):
        parse_table_patterns(text)


@given(st.lists(st.tuples(st.from_regex(r"[a-z_][a-z0-9_]{0,8}|\*", fullmatch=True),
                          st.from_regex(r"[a-z_][a-z0-9_]{0,8}|\*", fullmatch=True)),
                min_size=1, max_size=5))  # fmt: skip
def test_table_patterns_round_trip(entries: list[tuple[str, str]]) -> None:
    text = ",".join(f"{s}.{t}" for s, t in entries)
    patterns = parse_table_patterns(text)
    assert str(patterns) == text
    for s, t in entries:
        assert patterns.matches("x" if s == "*" else s, "y" if t == "*" else t)


# --- properties ------------------------------------------------------------------------------

values = st.one_of(st.none(), st.text(max_size=20))
columns = st.lists(
    st.tuples(st.text(min_size=1, max_size=8), st.integers(0, 2**32 - 1), values),
    min_size=1,
    max_size=5,
    unique_by=lambda c: c[0],
)


@st.composite
def batches(draw: st.DrawFn) -> tuple[bytes, list[object]]:
    schema, name = draw(st.text(min_size=1, max_size=8)), draw(st.text(min_size=1, max_size=8))
    cols = draw(columns)
    table = Table(schema, name, tuple(Column(n, oid) for n, oid, _ in cols))
    row = tuple(v for _, _, v in cols)
    csn, xid = draw(st.integers(0, 2**64 - 1)), draw(st.integers(0, 2**64 - 1))
    records = [
        record(10, begin(csn, 10)),
        record(11, change(b"I", schema, name, tuple_(cols), None)),
        record(12, change(b"D", schema, name, None, tuple_(cols))),
        record(13, commit(xid)),
    ]
    expected: list[object] = [
        Begin(LSN(10), None, csn=csn, first_lsn=LSN(10)),
        Relation(LSN(11), table),
        Insert(LSN(11), table, row),
        Delete(LSN(12), table, row, False),
        Commit(LSN(13), LSN(13), LSN(13), None, xid),
    ]
    return batch(*records), expected


@settings(max_examples=examples(200), deadline=None)
@given(batches())
def test_generated_batches_decode(generated: tuple[bytes, list[object]]) -> None:
    payload, expected = generated
    assert decode(payload) == expected


@settings(max_examples=examples(500), deadline=None)
@given(batches(), st.integers(0, 10_000), st.binary(max_size=4), st.integers(0, 4))
def test_truncated_or_mutated_payloads_raise_only_decode_error(
    generated: tuple[bytes, list[object]], position: int, insert: bytes, delete: int
) -> None:
    payload = generated[0]
    cut = position % (len(payload) + 1)
    flipped = bytearray(payload)
    if flipped:
        flipped[cut % len(flipped)] ^= 0xFF
    for mutated in (payload[:cut], payload[:cut] + insert + payload[cut + delete :], flipped):
        with contextlib.suppress(DecodeError):
            decode(bytes(mutated))
