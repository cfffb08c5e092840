"""Byte-level tests of the pgoutput decoder: every message type and version-specific layout,
built by hand from the documented formats ("Logical Replication Message Formats"), a stream
captured from real servers, and truncated/overlong/malformed input.

The small encoder at the top is written from the documentation, independently of the decoder.
"""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pgcdc.decoding import Decoder
from pgcdc.decoding.batch import decode_batch
from pgcdc.decoding.pgoutput import (
    PgOutputDecoder,
    PgOutputOptions,
    Streaming,
    max_proto_version,
)
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.decoding.state import DecoderState
from pgcdc.errors import ConfigurationError, DecodeError, UnknownRelation, UnsupportedFeature
from pgcdc.events import (
    UNCHANGED_TOAST,
    Begin,
    BeginPrepare,
    Commit,
    CommitPrepared,
    Delete,
    Insert,
    Message,
    Origin,
    Prepare,
    RawValue,
    Relation,
    ReplicaIdentity,
    RollbackPrepared,
    StreamAbort,
    StreamCommit,
    StreamPrepare,
    StreamStart,
    StreamStop,
    Truncate,
    Type,
    Update,
)
from pgcdc.lsn import LSN

FIXTURES = Path(__file__).parent / "fixtures" / "pgoutput"

# --- a pgoutput encoder from the documentation --------------------------------------------------

PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


def u8(value: int) -> bytes:
    return struct.pack("!B", value)


def u16(value: int) -> bytes:
    return struct.pack("!H", value)


def u32(value: int) -> bytes:
    return struct.pack("!I", value)


def i32(value: int) -> bytes:
    return struct.pack("!i", value)


def u64(value: int) -> bytes:
    return struct.pack("!Q", value)


def i64(value: int) -> bytes:
    return struct.pack("!q", value)


def cstr(text: str) -> bytes:
    return text.encode() + b"\0"


def ts(moment: datetime) -> bytes:
    delta = moment - PG_EPOCH
    return i64((delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds)


def xid_prefix(xid: int | None) -> bytes:
    return b"" if xid is None else u32(xid)


def begin(final_lsn: int, commit_time: datetime, xid: int) -> bytes:
    return b"B" + u64(final_lsn) + ts(commit_time) + u32(xid)


def commit(commit_lsn: int, end_lsn: int, commit_time: datetime, flags: int = 0) -> bytes:
    return b"C" + u8(flags) + u64(commit_lsn) + u64(end_lsn) + ts(commit_time)


def origin(origin_lsn: int, name: str) -> bytes:
    return b"O" + u64(origin_lsn) + cstr(name)


def relation(
    oid: int,
    namespace: str,
    name: str,
    identity: str,
    columns: Sequence[tuple[bool, str, int, int]],
    *,
    xid: int | None = None,
) -> bytes:
    body = b"".join(
        u8(1 if key else 0) + cstr(col) + u32(type_oid) + i32(typmod)
        for key, col, type_oid, typmod in columns
    )
    return (
        b"R"
        + xid_prefix(xid)
        + u32(oid)
        + cstr(namespace)
        + cstr(name)
        + identity.encode()
        + u16(len(columns))
        + body
    )


def type_message(oid: int, namespace: str, name: str, xid: int | None = None) -> bytes:
    return b"Y" + xid_prefix(xid) + u32(oid) + cstr(namespace) + cstr(name)


def tuple_data(values: Sequence[RawValue]) -> bytes:
    out = [u16(len(values))]
    for value in values:
        if value is None:
            out.append(b"n")
        elif value is UNCHANGED_TOAST:
            out.append(b"u")
        elif isinstance(value, str):
            data = value.encode()
            out.append(b"t" + i32(len(data)) + data)
        else:
            assert isinstance(value, bytes)
            out.append(b"b" + i32(len(value)) + value)
    return b"".join(out)


def insert(oid: int, new: Sequence[RawValue], xid: int | None = None) -> bytes:
    return b"I" + xid_prefix(xid) + u32(oid) + b"N" + tuple_data(new)


def update(
    oid: int,
    new: Sequence[RawValue],
    old: Sequence[RawValue] | None = None,
    old_kind: str = "K",
    xid: int | None = None,
) -> bytes:
    old_part = b"" if old is None else old_kind.encode() + tuple_data(old)
    return b"U" + xid_prefix(xid) + u32(oid) + old_part + b"N" + tuple_data(new)


def delete(oid: int, old: Sequence[RawValue], kind: str = "K", xid: int | None = None) -> bytes:
    return b"D" + xid_prefix(xid) + u32(oid) + kind.encode() + tuple_data(old)


def truncate(oids: Sequence[int], cascade: bool, restart: bool, xid: int | None = None) -> bytes:
    flags = (1 if cascade else 0) | (2 if restart else 0)
    return b"T" + xid_prefix(xid) + u32(len(oids)) + u8(flags) + b"".join(u32(o) for o in oids)


def message(
    transactional: bool, lsn: int, prefix: str, content: bytes, xid: int | None = None
) -> bytes:
    return (
        b"M"
        + xid_prefix(xid)
        + u8(1 if transactional else 0)
        + u64(lsn)
        + cstr(prefix)
        + i32(len(content))
        + content
    )


def stream_start(xid: int, first: bool) -> bytes:
    return b"S" + u32(xid) + u8(1 if first else 0)


def stream_stop() -> bytes:
    return b"E"


def stream_commit(xid: int, commit_lsn: int, end_lsn: int, when: datetime) -> bytes:
    return b"c" + u32(xid) + u8(0) + u64(commit_lsn) + u64(end_lsn) + ts(when)


def stream_abort(
    xid: int, subxid: int, abort_lsn: int | None = None, when: datetime | None = None
) -> bytes:
    info = b"" if abort_lsn is None or when is None else u64(abort_lsn) + ts(when)
    return b"A" + u32(xid) + u32(subxid) + info


def begin_prepare(prepare_lsn: int, end_lsn: int, when: datetime, xid: int, gid: str) -> bytes:
    return b"b" + u64(prepare_lsn) + u64(end_lsn) + ts(when) + u32(xid) + cstr(gid)


def prepare(
    prepare_lsn: int, end_lsn: int, when: datetime, xid: int, gid: str, *, kind: bytes = b"P"
) -> bytes:
    return kind + u8(0) + u64(prepare_lsn) + u64(end_lsn) + ts(when) + u32(xid) + cstr(gid)


def commit_prepared(commit_lsn: int, end_lsn: int, when: datetime, xid: int, gid: str) -> bytes:
    return b"K" + u8(0) + u64(commit_lsn) + u64(end_lsn) + ts(when) + u32(xid) + cstr(gid)


def rollback_prepared(  # noqa: PLR0917 - the fields of the message, in wire order
    prepare_end: int,
    rollback_end: int,
    prepare_time: datetime,
    rollback_time: datetime,
    xid: int,
    gid: str,
) -> bytes:
    return (
        b"r"
        + u8(0)
        + u64(prepare_end)
        + u64(rollback_end)
        + ts(prepare_time)
        + ts(rollback_time)
        + u32(xid)
        + cstr(gid)
    )


# --- the tests ---------------------------------------------------------------------------------

AT = LSN(0x1_0000_0000)
T1 = datetime(2024, 2, 29, 23, 59, 59, 123456, tzinfo=UTC)
T2 = datetime(1999, 12, 31, 0, 0, 0, 1, tzinfo=UTC)  # before the PostgreSQL epoch
USERS = relation(
    16384,
    "public",
    "users",
    "d",
    [(True, "id", 23, -1), (False, "name", 1043, 104), (False, "photo", 17, -1)],
)


def decoder(
    proto: int = 1, *messages: bytes, streaming: Streaming | None = None
) -> PgOutputDecoder:
    """A decoder that has already seen ``messages`` (Relation, Type...)."""
    d = PgOutputDecoder(proto_version=proto, streaming=streaming)
    for m in messages:
        d.decode(m, AT)
    return d


def one(d: PgOutputDecoder, payload: bytes, lsn: LSN = AT) -> object:
    events = d.decode(payload, lsn)
    assert len(events) == 1
    return events[0]


def test_decoder_satisfies_the_decoder_protocol() -> None:
    d: Decoder = PgOutputDecoder()
    assert isinstance(d.state, DecoderState)


def test_begin_and_commit() -> None:
    d = decoder()
    assert one(d, begin(0xAB_0000_0010, T1, 4242)) == Begin(AT, 4242, LSN(0xAB_0000_0010), T1)
    event = one(d, commit(0xAB_0000_0010, 0xAB_0000_0040, T1))
    assert event == Commit(AT, LSN(0xAB_0000_0010), LSN(0xAB_0000_0040), T1)


def test_commit_time_is_its_own_when_it_differs_from_the_begin() -> None:
    """The decoder reuses the Begin's converted commit time for the Commit that carries the
    same timestamp; a Commit with another one (or a Begin before 2000, whose microseconds are
    negative) still gets its own."""
    d = decoder()
    one(d, begin(0x10, T1, 7))
    assert one(d, commit(0x10, 0x40, T2)) == Commit(AT, LSN(0x10), LSN(0x40), T2)
    one(d, begin(0x50, T2, 8))
    assert one(d, commit(0x50, 0x60, T2)) == Commit(AT, LSN(0x50), LSN(0x60), T2)
    assert one(d, commit(0x70, 0x80, T1)) == Commit(AT, LSN(0x70), LSN(0x80), T1)


def test_timestamps_before_2000_and_max_values() -> None:
    d = decoder()
    assert one(d, begin(1, T2, 0xFFFFFFFF)) == Begin(AT, 0xFFFFFFFF, LSN(1), T2)
    event = one(d, commit(2**64 - 1, 2**64 - 1, T2, flags=0))
    assert isinstance(event, Commit)
    assert event.end_lsn == LSN(2**64 - 1)


def test_origin() -> None:
    assert one(decoder(), origin(0x55, "pg_16400")) == Origin(AT, "pg_16400", LSN(0x55))


def test_relation_is_cached_and_refers_to_builtin_types() -> None:
    d = decoder()
    event = one(d, USERS)
    assert isinstance(event, Relation)
    table = event.table
    assert (table.namespace, table.name, table.oid) == ("public", "users", 16384)
    assert table.replica_identity is ReplicaIdentity.DEFAULT
    assert [(c.name, c.type_oid, c.type_modifier, c.is_key) for c in table.columns] == [
        ("id", 23, -1, True),
        ("name", 1043, 104, False),
        ("photo", 17, -1, False),
    ]
    assert d.state.relations[16384] is table
    # The same definition again keeps the cached object; changes share it.
    assert one(d, USERS).table is table  # type: ignore[attr-defined]
    assert one(d, insert(16384, ["1", "a", None])).table is table  # type: ignore[attr-defined]


def test_relation_empty_namespace_means_pg_catalog() -> None:
    event = one(decoder(), relation(1259, "", "pg_class", "n", []))
    assert isinstance(event, Relation)
    assert event.table.namespace == "pg_catalog"
    assert event.table.replica_identity is ReplicaIdentity.NOTHING


@pytest.mark.parametrize("identity", ["d", "n", "f", "i"])
def test_relation_replica_identities(identity: str) -> None:
    event = one(decoder(), relation(1, "s", "t", identity, [(True, "a", 25, -1)]))
    assert isinstance(event, Relation)
    assert event.table.replica_identity is ReplicaIdentity(identity)


def test_changed_relation_replaces_old_definition() -> None:
    d = decoder(1, USERS)
    before = one(d, insert(16384, ["1", "a", None]))
    widened = relation(
        16384,
        "public",
        "users",
        "f",
        [
            (True, "id", 23, -1),
            (True, "name", 1043, 104),
            (True, "photo", 17, -1),
            (True, "age", 21, -1),
        ],
    )
    one(d, widened)
    after = one(d, insert(16384, ["2", "b", None, "7"]))
    assert isinstance(before, Insert)
    assert isinstance(after, Insert)
    assert len(before.table.columns) == 3  # earlier events keep the definition they had
    assert [c.name for c in after.table.columns] == ["id", "name", "photo", "age"]
    assert after.table.replica_identity is ReplicaIdentity.FULL
    # A row of the old width no longer fits: misaligned data is refused, not guessed at.
    with pytest.raises(DecodeError, match="3 columns but the Relation"):
        d.decode(insert(16384, ["3", "c", None]), AT)


def test_type_message_and_domain_detection() -> None:
    d = decoder()
    assert one(d, type_message(16390, "public", "mood")) == Type(AT, 16390, "public", "mood")
    assert d.state.types[16390] == TypeInfo(16390, "public", "mood")
    # pgoutput names a domain by its base type: pg_catalog.int4 on a non-built-in OID.
    assert one(d, type_message(16400, "", "int4")) == Type(AT, 16400, "pg_catalog", "int4")
    assert d.state.types[16400] == TypeInfo(16400, "pg_catalog", "int4", kind="d", base_oid=23)


def test_insert_tuple_kinds() -> None:
    d = decoder(1, USERS)
    event = one(d, insert(16384, ["42", "Zoë ☃", b"\x00\xff\x10"]))
    assert isinstance(event, Insert)
    assert event.new == ("42", "Zoë ☃", b"\x00\xff\x10")
    assert event.xid is None
    event = one(d, insert(16384, [None, "", b""]))
    assert isinstance(event, Insert)
    assert event.new == (None, "", b"")


def test_update_variants() -> None:
    d = decoder(1, USERS)
    plain = one(d, update(16384, ["1", "b", UNCHANGED_TOAST]))
    assert plain == Update(AT, d.state.relations[16384], ("1", "b", UNCHANGED_TOAST))
    keyed = one(d, update(16384, ["2", "b", None], old=["1", None, None], old_kind="K"))
    assert isinstance(keyed, Update)
    assert (keyed.old, keyed.old_is_key) == (("1", None, None), True)
    full = one(d, update(16384, ["1", "c", None], old=["1", "b", b"x"], old_kind="O"))
    assert isinstance(full, Update)
    assert (full.old, full.old_is_key, full.new) == (("1", "b", b"x"), False, ("1", "c", None))


def test_delete_key_and_full() -> None:
    d = decoder(1, USERS)
    key = one(d, delete(16384, ["1", None, None], "K"))
    assert key == Delete(AT, d.state.relations[16384], ("1", None, None), True)
    full = one(d, delete(16384, ["1", "x", b"y"], "O"))
    assert isinstance(full, Delete)
    assert (full.old, full.old_is_key) == (("1", "x", b"y"), False)


@pytest.mark.parametrize(("cascade", "restart"), [(False, False), (True, False), (True, True)])
def test_truncate_several_relations(cascade: bool, restart: bool) -> None:
    other = relation(16390, "public", "orders", "d", [(True, "id", 20, -1)])
    d = decoder(1, USERS, other)
    event = one(d, truncate([16390, 16384], cascade, restart))
    assert isinstance(event, Truncate)
    assert [t.name for t in event.tables] == ["orders", "users"]
    assert (event.cascade, event.restart_identity) == (cascade, restart)


def test_truncate_restart_identity_without_cascade() -> None:
    event = one(decoder(1, USERS), truncate([16384], False, True))
    assert isinstance(event, Truncate)
    assert (event.cascade, event.restart_identity) == (False, True)


def test_message_transactional_and_not() -> None:
    d = decoder()
    assert one(d, message(True, 0x99, "app", b"\x00payload")) == Message(
        AT, True, "app", b"\x00payload"
    )
    assert one(d, message(False, 0x99, "", b"")) == Message(AT, False, "", b"")


def test_unknown_relation_is_a_typed_error_with_the_fix() -> None:
    d = decoder()
    for payload in (
        insert(777, ["1"]),
        update(777, ["1"]),
        delete(777, ["1"]),
        truncate([777], False, False),
    ):
        with pytest.raises(UnknownRelation, match="slot's start") as caught:
            d.decode(payload, AT)
        assert caught.value.relation_oid == 777


# --- streaming (protocol 2+) ------------------------------------------------------------------


def test_stream_block_carries_xids() -> None:
    d = decoder(2, USERS)
    assert one(d, stream_start(900, True)) == StreamStart(AT, 900, True)
    assert d.state.stream_xid == 900
    rel = one(d, relation(16384, "public", "users", "d", [(True, "id", 23, -1)], xid=900))
    assert isinstance(rel, Relation)
    assert rel.xid == 900
    assert one(d, type_message(16500, "public", "e", xid=900)) == Type(
        AT, 16500, "public", "e", 900
    )
    ins = one(d, insert(16384, ["1"], xid=901))
    assert isinstance(ins, Insert)
    assert (ins.xid, ins.new) == (901, ("1",))
    upd = one(d, update(16384, ["2"], old=["1"], xid=901))
    assert isinstance(upd, Update)
    assert (upd.xid, upd.old, upd.new) == (901, ("1",), ("2",))
    dele = one(d, delete(16384, ["2"], xid=901))
    assert isinstance(dele, Delete)
    assert dele.xid == 901
    tru = one(d, truncate([16384], True, False, xid=900))
    assert isinstance(tru, Truncate)
    assert (tru.xid, tru.cascade) == (900, True)
    assert one(d, message(True, 5, "p", b"c", xid=900)) == Message(AT, True, "p", b"c", 900)
    assert one(d, stream_stop()) == StreamStop(AT)
    assert d.state.stream_xid is None
    # Outside the block the same message types have no xid again.
    ins = one(d, insert(16384, ["3"]))
    assert isinstance(ins, Insert)
    assert (ins.xid, ins.new) == (None, ("3",))
    assert one(d, stream_start(900, False)) == StreamStart(AT, 900, False)


def test_stream_commit_and_abort() -> None:
    d = decoder(2)
    assert one(d, stream_commit(900, 0x10, 0x20, T1)) == StreamCommit(
        AT, 900, LSN(0x10), LSN(0x20), T1
    )
    assert one(d, stream_abort(900, 901)) == StreamAbort(AT, 900, 901)


def test_stream_abort_with_parallel_info_needs_protocol_4() -> None:
    payload = stream_abort(900, 900, 0x1234, T1)
    expected = StreamAbort(AT, 900, 900, LSN(0x1234), T1)
    assert one(decoder(4), payload) == expected
    assert one(decoder(4, streaming="parallel"), payload) == expected
    assert one(decoder(4), stream_abort(900, 901)) == StreamAbort(AT, 900, 901)
    assert one(decoder(4, streaming="on"), stream_abort(900, 901)) == StreamAbort(AT, 900, 901)
    with pytest.raises(DecodeError, match="trailing"):
        decoder(2).decode(payload, AT)
    with pytest.raises(DecodeError, match="trailing"):
        decoder(4, streaming="on").decode(payload, AT)
    with pytest.raises(DecodeError, match="has 25"):
        decoder(4, streaming="parallel").decode(stream_abort(900, 901), AT)


def test_decoder_for_options() -> None:
    options = PgOutputOptions(["pub"], proto_version=4, streaming="parallel")
    d = PgOutputDecoder.for_options(options)
    assert (d.proto_version, d.streaming) == (4, "parallel")


def test_stream_block_nesting_errors() -> None:
    d = decoder(2)
    with pytest.raises(DecodeError, match="outside a stream block"):
        d.decode(stream_stop(), AT)
    d.decode(stream_start(1, True), AT)
    with pytest.raises(DecodeError, match="inside the stream block"):
        d.decode(stream_start(2, True), AT)
    with pytest.raises(DecodeError, match="Begin inside a stream block"):
        d.decode(begin(1, T1, 3), AT)


# --- two-phase (protocol 3+) ------------------------------------------------------------------


def test_two_phase_messages() -> None:
    d = decoder(3)
    assert one(d, begin_prepare(0x10, 0x20, T1, 77, "gid-1")) == BeginPrepare(
        AT, 77, "gid-1", LSN(0x10), LSN(0x20), T1
    )
    assert one(d, prepare(0x10, 0x20, T1, 77, "gid-1")) == Prepare(
        AT, 77, "gid-1", LSN(0x10), LSN(0x20), T1
    )
    assert one(d, prepare(0x10, 0x20, T1, 78, "g", kind=b"p")) == StreamPrepare(
        AT, 78, "g", LSN(0x10), LSN(0x20), T1
    )
    assert one(d, commit_prepared(0x30, 0x40, T2, 77, "gid-1")) == CommitPrepared(
        AT, 77, "gid-1", LSN(0x30), LSN(0x40), T2
    )
    assert one(d, rollback_prepared(0x20, 0x50, T1, T2, 79, "é")) == RollbackPrepared(
        AT, 79, "é", LSN(0x20), LSN(0x50), T1, T2
    )


@pytest.mark.parametrize(
    ("proto", "payload", "needs"),
    [
        (1, stream_start(1, True), 2),
        (1, stream_stop(), 2),
        (1, stream_abort(1, 1), 2),
        (1, stream_commit(1, 1, 1, T1), 2),
        (2, begin_prepare(1, 1, T1, 1, "g"), 3),
        (2, prepare(1, 1, T1, 1, "g"), 3),
        (2, prepare(1, 1, T1, 1, "g", kind=b"p"), 3),
        (2, commit_prepared(1, 1, T1, 1, "g"), 3),
        (2, rollback_prepared(1, 1, T1, T1, 1, "g"), 3),
    ],
)
def test_newer_messages_are_refused_by_older_protocols(
    proto: int, payload: bytes, needs: int
) -> None:
    with pytest.raises(DecodeError, match=f"needs protocol {needs}.*proto_version {proto}"):
        decoder(proto).decode(payload, AT)


def test_unknown_and_empty_messages() -> None:
    with pytest.raises(DecodeError, match="unknown pgoutput message type 'Z'"):
        decoder(4).decode(b"Z\x00\x00", AT)
    with pytest.raises(DecodeError, match="empty"):
        decoder(4).decode(b"", AT)


def test_unsupported_decoder_protocol() -> None:
    with pytest.raises(UnsupportedFeature):
        PgOutputDecoder(proto_version=5)
    with pytest.raises(UnsupportedFeature):
        PgOutputDecoder(proto_version=0)


# --- truncated, overlong and malformed input ---------------------------------------------------

STREAM_REL = relation(16384, "public", "users", "d", [(True, "id", 23, -1)], xid=5)
SAMPLES: list[tuple[int, Sequence[bytes], bytes]] = [
    # (protocol, messages that set the state up, the message under test)
    (1, [], begin(1, T1, 2)),
    (1, [], commit(1, 2, T1)),
    (1, [], origin(3, "origin")),
    (1, [], USERS),
    (1, [], type_message(1, "public", "t")),
    (1, [USERS], insert(16384, ["1", "n", b"p"])),
    (1, [USERS], update(16384, ["1", "n", UNCHANGED_TOAST], old=["0", None, None])),
    (1, [USERS], update(16384, ["1", "n", None], old=["0", "m", b""], old_kind="O")),
    (1, [USERS], delete(16384, ["1", None, None])),
    (1, [USERS], truncate([16384, 16384], True, True)),
    (1, [], message(True, 9, "prefix", b"content")),
    (2, [], stream_start(5, True)),
    (2, [stream_start(5, True)], stream_stop()),
    (2, [stream_start(5, True)], STREAM_REL),
    (2, [stream_start(5, True), STREAM_REL], insert(16384, ["1"], xid=5)),
    (2, [stream_start(5, True)], message(True, 9, "p", b"c", xid=5)),
    (2, [], stream_commit(5, 1, 2, T1)),
    (2, [], stream_abort(5, 6)),
    (4, [], stream_abort(5, 6, 7, T1)),
    (3, [], begin_prepare(1, 2, T1, 3, "g")),
    (3, [], prepare(1, 2, T1, 3, "g")),
    (3, [], prepare(1, 2, T1, 3, "g", kind=b"p")),
    (3, [], commit_prepared(1, 2, T1, 3, "g")),
    (3, [], rollback_prepared(1, 2, T1, T1, 3, "g")),
]


def decoded_and_read(d: PgOutputDecoder, payload: bytes) -> None:
    """Decode, then read every row: the decoder leaves a row's check (beyond its column count
    and framing it must walk) to the row's consumer, here its first use."""
    for event in d.decode(payload, AT):
        for row in (getattr(event, "new", None), getattr(event, "old", None)):
            if row is not None:
                tuple(row)


@pytest.mark.parametrize(("proto", "setup", "payload"), SAMPLES, ids=lambda v: repr(v)[:20])
def test_every_truncation_is_a_decode_error(
    proto: int, setup: Sequence[bytes], payload: bytes
) -> None:
    streaming: Streaming | None = "parallel" if proto == 4 else None
    decoder(proto, *setup, streaming=streaming).decode(payload, AT)  # the whole message decodes
    for cut in range(len(payload)):
        d = decoder(proto, *setup, streaming=streaming)
        with pytest.raises(DecodeError):
            decoded_and_read(d, payload[:cut])


@pytest.mark.parametrize(("proto", "setup", "payload"), SAMPLES, ids=lambda v: repr(v)[:20])
def test_trailing_bytes_are_a_decode_error(
    proto: int, setup: Sequence[bytes], payload: bytes
) -> None:
    for extra in (b"\x00", b"garbage"):
        with pytest.raises(DecodeError):
            decoded_and_read(decoder(proto, *setup), payload + extra)


@pytest.mark.parametrize(
    ("payload", "match"),
    [
        (b"I" + u32(16384) + b"X" + tuple_data(["1", "n", None]), "expected 'N'"),
        (b"U" + u32(16384) + b"Q" + tuple_data(["1", "n", None]), "expected 'K', 'O' or 'N'"),
        (b"D" + u32(16384) + b"N" + tuple_data(["1", "n", None]), "expected 'K'"),
        (b"I" + u32(16384) + b"N" + u16(3) + b"t" + i32(-1) + b"nn", "runs past"),
        (b"I" + u32(16384) + b"N" + u16(3) + b"t" + i32(1000) + b"abc", "runs past"),
        (b"I" + u32(16384) + b"N" + u16(3) + b"x" + b"nn", "unknown column kind"),
        (b"I" + u32(16384) + b"N" + u16(3) + b"t" + i32(2) + b"\xff\xfe" + b"nn", "utf-8"),
        (b"T" + i32(-1) + u8(0), "relation OIDs announced"),
        (b"T" + i32(3) + u8(0) + u32(16384), "relation OIDs announced"),
        (b"M" + u8(1) + u64(1) + b"p\0" + i32(-5), "content of -5 bytes"),
        (b"M" + u8(1) + u64(1) + b"p\0" + i32(10) + b"short", "content of 10 bytes"),
        (b"R" + u32(1) + b"s\0t\0" + b"z" + u16(0), "unknown replica identity"),
        (b"O" + u64(1) + b"no-terminator", "NUL"),
    ],
)
def test_malformed_messages_say_what_is_wrong(payload: bytes, match: str) -> None:
    """At decode time, or (a row the decoder does not walk) when the batch holding the row is
    checked, naming the message; and when the row is first read."""
    with pytest.raises(DecodeError, match=match) as caught:
        decode_batch(decoder(1, USERS), [payload], [AT])
    assert f"LSN {AT}" in str(caught.value)
    with pytest.raises(DecodeError, match=match):
        decoded_and_read(decoder(1, USERS), payload)


def test_out_of_range_timestamp_is_a_decode_error() -> None:
    huge = b"B" + u64(1) + i64(2**63 - 1) + u32(1)
    with pytest.raises(DecodeError):
        decoder().decode(huge, AT)


def test_bytes_like_payloads_are_accepted() -> None:
    d = decoder(1, USERS)
    payload = insert(16384, ["1", "n", None])
    for view in (bytearray(payload), memoryview(payload)):
        event = one(d, view)  # type: ignore[arg-type]
        assert isinstance(event, Insert)
        assert event.new == ("1", "n", None)


# --- state ------------------------------------------------------------------------------------


def test_state_copy_pickle_and_dict_round_trip() -> None:
    d = decoder(2, USERS, type_message(16400, "", "text"), stream_start(12, True))
    state = d.state
    for restored in (
        state.copy(),
        pickle.loads(pickle.dumps(state)),
        DecoderState.from_dict(json.loads(json.dumps(state.to_dict()))),
    ):
        assert restored == state
        assert restored is not state
        # The restored state continues decoding where the original stopped (inside a stream).
        event = one(PgOutputDecoder(restored, proto_version=2), insert(16384, ["1", "a", None], 12))
        assert isinstance(event, Insert)
        assert (event.xid, event.new) == (12, ("1", "a", None))
    # A copy is independent of the original.
    copy = state.copy()
    copy.relations.clear()
    assert 16384 in state.relations


def test_decoder_pickles_with_its_state() -> None:
    d = decoder(3, USERS)
    clone = pickle.loads(pickle.dumps(d))
    assert clone.proto_version == 3
    assert clone.state == d.state
    event = one(clone, insert(16384, ["9", None, None]))
    assert isinstance(event, Insert)
    assert event.new == ("9", None, None)


@pytest.mark.parametrize(
    "damage",
    [
        lambda s: s.pop("relations"),
        lambda s: s.update(format=99),
        lambda s: s["relations"][0].update(replica_identity="?"),
        lambda s: s["relations"][0]["columns"][0].update(type_oid="23"),
        lambda s: s["types"][0].update(name=None),
        lambda s: s.update(stream_xid="x"),
    ],
)
def test_damaged_state_dict_is_a_decode_error(damage: object) -> None:
    data = decoder(1, USERS, type_message(1, "a", "b")).state.to_dict()
    damage(data)  # type: ignore[operator]
    with pytest.raises(DecodeError):
        DecoderState.from_dict(data)


def test_add_type_enriches_the_cache() -> None:
    state = DecoderState()
    state.add_type(TypeInfo(16400, "public", "d", kind="d", base_oid=25))
    assert state.types[16400].base_oid == 25


# --- captured from real servers ----------------------------------------------------------------


def _captured(name: str) -> list[tuple[LSN, bytes]]:
    rows = json.loads((FIXTURES / name).read_text())
    return [(LSN.parse(lsn), bytes.fromhex(data)) for lsn, data in rows]


CAPTURED_TEXT = [
    ("1", "one", "sad", "\\x00ff"),
    ("2", "two", None, "\\x"),
    ("3", "Zoë", "happy", None),
]
CAPTURED_BINARY = [
    (struct.pack("!i", 1), b"one", b"sad", b"\x00\xff"),
    (struct.pack("!i", 2), b"two", None, b""),
    (struct.pack("!i", 3), "Zoë".encode(), b"happy", None),
]


@pytest.mark.parametrize("name", sorted(p.name for p in FIXTURES.glob("*.json")))
def test_captured_streams_decode(name: str) -> None:
    """Streams captured from PG15 (proto 3, text, streaming) and PG18 (proto 4, binary,
    parallel streaming) by the workload in fixtures/pgoutput/README.md."""
    binary = "binary" in name
    proto = int(name.split("proto")[1][0])
    d = PgOutputDecoder(proto_version=proto)
    events = [e for lsn, data in _captured(name) for e in d.decode(data, lsn)]
    rows = [e.new for e in events if isinstance(e, Insert) and e.table.name == "captured"]
    assert rows == (CAPTURED_BINARY if binary else CAPTURED_TEXT)
    (update_event,) = [e for e in events if isinstance(e, Update)]
    assert update_event.new[1] == (b"deux" if binary else "deux")
    assert update_event.old is None
    (delete_event,) = [e for e in events if isinstance(e, Delete)]
    assert delete_event.old == ((struct.pack("!i", 3) if binary else "3"), None, None, None)
    assert delete_event.old_is_key
    assert [(e.namespace, e.name) for e in events if isinstance(e, Type)] == [("public", "mood")]
    # The 600-row transaction exceeded logical_decoding_work_mem and was streamed.
    starts = [e for e in events if isinstance(e, StreamStart)]
    assert starts
    assert starts[0].first_segment
    streamed = [e for e in events if isinstance(e, Insert) and e.table.name == "bulk"]
    assert len(streamed) == 600
    assert {e.xid for e in streamed} == {starts[0].xid}
    (stream_commit_event,) = [e for e in events if isinstance(e, StreamCommit)]
    assert stream_commit_event.xid == starts[0].xid
    assert d.state.stream_xid is None


# --- options ----------------------------------------------------------------------------------


def test_options_for_each_server_version() -> None:
    assert PgOutputOptions(["pub"]).for_server(100023) == {
        "proto_version": "1",
        "publication_names": "pub",
    }
    full = PgOutputOptions(
        ["pub", "Other", "a,b", 'q"t'],
        proto_version=4,
        binary=True,
        messages=True,
        streaming="parallel",
        two_phase=True,
        origin="none",
    ).for_server(180001)
    assert full == {
        "proto_version": "4",
        "publication_names": 'pub,"Other","a,b","q""t"',
        "binary": "true",
        "messages": "true",
        "streaming": "parallel",
        "two_phase": "true",
        "origin": "none",
    }
    assert PgOutputOptions(["p"], 2, streaming="on").for_server(140000)["streaming"] == "on"


@pytest.mark.parametrize(
    ("options", "server", "match"),
    [
        ({"proto_version": 2}, 130000, "protocol 1 at most"),
        ({"proto_version": 3}, 140005, "protocol 2 at most"),
        ({"proto_version": 4}, 150000, "protocol 3 at most"),
        ({"proto_version": 2, "streaming": "on"}, 130000, "protocol 1 at most"),
        ({"binary": True}, 130011, "binary=True needs PostgreSQL 14"),
        ({"messages": True}, 130011, "messages=True needs PostgreSQL 14"),
        ({"origin": "any"}, 150004, "origin='any' needs PostgreSQL 16"),
        ({"proto_version": 1}, 90624, "PostgreSQL 9.6 has no pgoutput"),
    ],
)
def test_options_refused_by_older_servers(options: dict, server: int, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(UnsupportedFeature, match=match):
        PgOutputOptions(["pub"], **options).for_server(server)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"streaming": "on"}, "streaming='on' needs proto_version 2"),
        ({"proto_version": 3, "streaming": "parallel"}, "needs proto_version 4"),
        ({"proto_version": 2, "two_phase": True}, "two_phase needs proto_version 3"),
        ({"proto_version": 5}, "proto_version 5 is not supported"),
    ],
)
def test_inconsistent_options(options: dict, match: str) -> None:  # type: ignore[type-arg]
    with pytest.raises(UnsupportedFeature, match=match):
        PgOutputOptions(["pub"], **options)


@pytest.mark.parametrize(
    ("names", "extra"),
    [
        ([], {}),
        ("pub", {}),
        ([""], {}),
        (["x" * 64], {}),
        (["pub"], {"streaming": "maybe"}),
        (["pub"], {"origin": "local"}),
    ],
)
def test_invalid_options(names: Sequence[str], extra: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(ConfigurationError):
        PgOutputOptions(names, **extra)


def test_max_proto_version() -> None:
    assert [max_proto_version(v) for v in (100000, 130000, 140000, 150000, 160000, 180000)] == [
        1,
        1,
        2,
        3,
        4,
        4,
    ]
