"""The Arrow codec: every event kind round-trips exactly; bad input is a typed error."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.changelog.codec import SCHEMA, BatchBuilder, LogState, decode, encode, type_info_of
from pgcdc.decoding.pgtypes import TypeInfo
from pgcdc.errors import UnloggableInput
from pgcdc.events import (
    UNCHANGED_TOAST,
    Begin,
    Column,
    Delete,
    EncodedRow,
    Insert,
    Message,
    Relation,
    ReplicaIdentity,
    Table,
    Truncate,
    Type,
    Update,
)
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction, TransactionOutcome
from tests.conftest import examples

from .helpers import START, TABLE, events, lsns, rows, tables, transaction_lists, xids

OTHER = Table(
    "sales",
    "orders",
    (Column("id", 20, is_key=True), Column("note", 1043, 68, type_name="character varying(64)")),
    oid=0,
    replica_identity=ReplicaIdentity.FULL,
)


def txn(commit: int, *events, **fields) -> CommittedTransaction:
    return CommittedTransaction(
        xid=fields.pop("xid", 7),
        commit_lsn=LSN(commit),
        end_lsn=LSN(commit + 8),
        commit_time=fields.pop("commit_time", START),
        events=tuple(events),
        **fields,
    )


EVERY_KIND = [
    txn(
        0x100,
        Type(LSN(0x10), 90000, "public", "mood", 7),
        Type(LSN(0x10), 90001, "public", "price", 7, "d", 1700, 0, 655366),
        Type(LSN(0x10), 90002, "public", "_price", 7, "b", 0, 90001),
        Relation(LSN(0x11), TABLE, 7),
        Insert(LSN(0x12), TABLE, ("1", "text é \udcff", b"\x00\x01bin"), 7),
        Update(LSN(0x13), TABLE, ("1", UNCHANGED_TOAST, None), ("1",), True),
        Update(LSN(0x14), OTHER, ("2", "x"), ("2", "old"), False),
        Update(LSN(0x15), OTHER, ("3", ""), None),
        Delete(LSN(0x16), TABLE, ("1", None, None), True),
        Truncate(LSN(0x17), (TABLE, OTHER), cascade=True, restart_identity=True),
        Truncate(LSN(0x18), ()),
        Message(LSN(0x19), True, "prefix", b"\x00\xffbinary\x80"),
        Insert(LSN(0x1A), TABLE, (), 7),
        Insert(LSN(0x1B), TABLE, ("", b"", "")),
        origin="upstream",
        origin_lsn=LSN(0x99),
    ),
    txn(0x200, Message(LSN(0x1F0), False, "", b""), xid=None, commit_time=None),
    txn(0x300, gid="gid-1", outcome=TransactionOutcome.PREPARE, size=123),
    txn(0x400, gid="gid-1", outcome=TransactionOutcome.ROLLBACK_PREPARED),
    txn(0x500),
]


def test_every_event_kind_round_trips_exactly():
    batch = encode(EVERY_KIND)
    assert batch.schema.equals(SCHEMA, check_metadata=True)
    restored = list(decode([batch]))
    assert restored == EVERY_KIND
    inserts = [e for e in restored[0].events if isinstance(e, Insert)]
    assert [type(v) for v in inserts[0].new] == [str, str, bytes]
    empty = inserts[-1].new
    assert [type(v) for v in empty] == [str, bytes, str]


def test_type_facts_are_logged_and_logs_without_them_still_read():
    """What pg_type says of a type reaches readers (LogState, Spark's TypeInfos); a log written
    before those columns existed reads its Type rows as names only."""
    batch = encode(EVERY_KIND[:1])
    state = LogState()
    for event in next(decode([batch])).events:
        state.observe(event)
    assert state.types[90001] == TypeInfo(90001, "public", "price", "d", 1700, 0, 655366)
    assert state.types[90002] == TypeInfo(90002, "public", "_price", "b", 0, 90001)
    assert LogState.from_dict(state.to_dict()) == state
    old_columns = [n for n in SCHEMA.names if n not in _TYPE_FACTS]
    old = pa.RecordBatch.from_arrays([batch.column(n) for n in old_columns], names=old_columns)
    [restored] = decode([old])
    types = [e for e in restored.events if isinstance(e, Type)]
    assert [(t.oid, t.name, t.kind, t.base_oid, t.base_modifier) for t in types] == [
        (90000, "mood", "", 0, -1),
        (90001, "price", "", 0, -1),
        (90002, "_price", "", 0, -1),
    ]
    assert type_info_of(types[1]) == TypeInfo(90001, "public", "price")
    assert list(restored.events)[len(types) :] == list(EVERY_KIND[0].events)[len(types) :]
    # A segment header's state written before base_modifier was recorded.
    data = state.to_dict()
    for info in data["types"]:
        del info["base_modifier"]
    assert LogState.from_dict(data).types[90001].base_modifier == -1


_TYPE_FACTS = ("type_kind", "type_base_oid", "type_element_oid", "type_base_modifier")


def test_rows_are_readable_as_arrow():
    """The Spark side reads raw columns; they hold what the events hold."""
    batch = encode(EVERY_KIND[:1])
    rows = batch.to_pylist()
    assert [r["kind"] for r in rows[:6]] == ["type"] * 3 + ["relation", "insert", "update"]
    assert (rows[1]["type_kind"], rows[1]["type_base_oid"]) == ("d", 1700)
    assert rows[1]["type_base_modifier"] == 655366 and rows[2]["type_element_oid"] == 90001
    insert = rows[4]
    assert insert["relation_oid"] == TABLE.oid and insert["name"] == "accounts"
    # Rows are pgoutput TupleData: int16 ncols, then kind (+ int32 length + bytes).
    text = "text é \udcff".encode("utf-8", "surrogatepass")
    assert insert["new"] == (
        b"\x00\x03"
        + b"t\x00\x00\x00\x011"
        + b"t" + len(text).to_bytes(4, "big") + text
        + b"b\x00\x00\x00\x05\x00\x01bin"
    )  # fmt: skip
    assert rows[5]["new"] == b"\x00\x03t\x00\x00\x00\x011un"
    assert rows[5]["old_is_key"] is True
    assert rows[9]["truncate_relations"] == [TABLE.oid, OTHER.oid]
    assert [r["seq"] for r in rows] == list(range(len(rows)))
    # One table definition per distinct table, however many rows refer to it.
    assert len(batch.column("table").dictionary) == 2


def test_empty_transaction_keeps_its_row():
    batch = encode(EVERY_KIND[3:])
    assert batch.column("kind").to_pylist() == ["transaction", "transaction"]
    assert list(decode([batch])) == EVERY_KIND[3:]


@settings(max_examples=examples(150), deadline=None)
@given(transaction_lists())
def test_random_transactions_round_trip(transactions):
    batch = encode(transactions)
    assert list(decode([batch])) == transactions
    # Split anywhere between rows: regrouping across batches gives the same transactions.
    if batch.num_rows > 1:
        middle = batch.num_rows // 2
        assert list(decode([batch.slice(0, middle), batch.slice(middle)])) == transactions


@pytest.mark.parametrize(
    ("transaction", "complaint"),
    [
        (txn(1, Insert(LSN(1), TABLE, (1,))), "row value 1 of type int"),  # type: ignore[arg-type]
        (txn(1, Begin(LSN(1), 5)), "Begin events do not belong"),
        (txn(1, commit_time=datetime(2024, 1, 1)), "has no time zone"),
        (txn(1, Message(LSN(1), True, "p", "text")), "message content must be bytes"),  # type: ignore[arg-type]
    ],
)
def test_bad_input_is_a_typed_error(transaction, complaint):
    with pytest.raises(UnloggableInput, match=complaint):
        encode([transaction])


@pytest.mark.parametrize(
    "transaction",
    [
        txn(1, xid=-1),
        txn(1, Insert(LSN(1), Table("s", "t", (), oid=1 << 32), ())),
        txn(1, Type(LSN(1), -5, "s", "t")),
    ],
)
def test_numbers_out_of_range_are_a_typed_error(transaction):
    with pytest.raises(UnloggableInput, match="does not fit"):
        encode([transaction])


def test_names_that_are_not_unicode_are_a_typed_error():
    with pytest.raises(UnloggableInput, match="lone surrogates"):
        encode([txn(1, Insert(LSN(1), Table("s", "bad\udcff", ()), ()))])


def test_a_rejected_event_leaves_the_builder_consistent():
    builder = BatchBuilder()
    good = txn(5, Insert(LSN(1), TABLE, ("1", "x", b"y")))
    builder.add(good, 0, next(iter(good.events)))
    with pytest.raises(UnloggableInput):
        builder.add(good, 1, Insert(LSN(2), TABLE, ("1", 2, "late failure")))  # type: ignore[arg-type]
    assert list(decode([builder.build()])) == [good]


def test_schema_is_fixed():
    assert SCHEMA.field("kind").type == pa.dictionary(pa.int8(), pa.string())
    assert SCHEMA.field("commit_lsn").type == pa.uint64()
    assert SCHEMA.field("commit_time").type == pa.timestamp("us", tz="UTC")


# --- the fast paths against the checked ones --------------------------------------------------


@st.composite
def oltp_transactions(draw: st.DrawFn) -> list[CommittedTransaction]:
    """Transactions whose row changes share a few tables and carry decoder rows (``EncodedRow``),
    the shape ``BatchBuilder.add``'s fast path takes, mixed with every other kind of event."""
    shared = st.sampled_from(draw(st.lists(tables, min_size=1, max_size=3)))
    encoded = rows.map(EncodedRow.from_values)
    changes = st.one_of(
        st.builds(Insert, lsn=lsns, table=shared, new=encoded, xid=xids),
        st.builds(
            Update,
            lsn=lsns,
            table=shared,
            new=encoded,
            old=st.none() | encoded,
            old_is_key=st.booleans(),
            xid=xids,
        ),
        st.builds(Delete, lsn=lsns, table=shared, old=encoded, old_is_key=st.booleans(), xid=xids),
    )
    transactions = []
    for transaction in draw(transaction_lists()):
        some = replace(transaction, events=tuple(draw(st.lists(changes | events, max_size=6))))
        if draw(st.booleans()):  # as a receiver's plain commit: no origin, gid, other outcome
            some = replace(some, origin=None, origin_lsn=None, gid=None)
            some = replace(some, outcome=TransactionOutcome.COMMIT)
        transactions.append(some)
    return transactions


def _checked(transaction: CommittedTransaction) -> CommittedTransaction:
    """The transaction with a plain-int commit LSN, which ``_txn_index`` checks field by field."""
    return replace(transaction, commit_lsn=int(transaction.commit_lsn))  # type: ignore[arg-type]


@settings(max_examples=100, deadline=None)
@given(oltp_transactions())
def test_add_builds_and_sizes_what_the_checked_add_does(transactions):
    """``add`` (row changes of a known table, first of a transaction or not, and a receiver's
    commit fields) is ``_add`` without its checks: the same batch, the same sizes."""
    fast, checked = BatchBuilder(), BatchBuilder()
    for transaction in transactions:
        for seq, event in enumerate(tuple(transaction.events) or (None,)):
            assert fast.add(transaction, seq, event) == checked._add(
                _checked(transaction), seq, event
            )
    assert fast.build().equals(checked.build())


@settings(max_examples=100, deadline=None)
@given(oltp_transactions())
def test_encode_in_runs_builds_what_event_by_event_does(transactions):
    """``encode`` (``add_run``: one event straight to ``add``, runs column by column) builds
    the batch ``_add`` builds event by event."""
    checked = BatchBuilder()
    for transaction in transactions:
        for seq, event in enumerate(tuple(transaction.events) or (None,)):
            checked._add(_checked(transaction), seq, event)
    batch = encode(transactions)
    assert batch.equals(checked.build())
    assert list(decode([batch])) == transactions


@settings(max_examples=100, deadline=None)
@given(oltp_transactions(), st.integers(-100, 400))
def test_add_run_takes_an_event_at_least_however_little_room_is_left(transactions, room):
    """Each ``add_run`` takes at least one event (a frame of one), so a writer filling frames
    always moves on; taking the events in turns builds what ``_add`` builds event by event."""
    builder, checked = BatchBuilder(), BatchBuilder()
    for transaction in transactions:
        events = tuple(transaction.events)
        position = seq = 0
        while position < len(events):
            _, end, seq = builder.add_run(
                transaction, events, position, seq, room=room, definitions=[]
            )
            assert end > position
            position = end
        for seq, event in enumerate(events):
            checked._add(_checked(transaction), seq, event)
    assert builder.build().equals(checked.build())


def test_a_commit_outside_the_fast_check_is_still_refused():
    """Fields the fast check does not take go through the checks, which refuse bad ones."""
    builder = BatchBuilder()
    good = Insert(LSN(1), TABLE, EncodedRow.from_values(("1", "x", b"y")))
    builder.add(txn(5, good), 0, good)
    for bad, complaint in (
        (txn(6, good, commit_time=datetime(2024, 1, 1)), "has no time zone"),
        (txn(7, good, xid=-1), "does not fit"),
        (replace(txn(8, good), size=1 << 64), "does not fit"),
    ):
        with pytest.raises(UnloggableInput, match=complaint):
            builder.add(bad, 0, good)


@pytest.mark.parametrize(
    "change",
    [
        Insert(LSN(2), TABLE, None),  # type: ignore[arg-type]
        Update(LSN(2), TABLE, None),  # type: ignore[arg-type]
        Delete(LSN(2), TABLE, None, True),  # type: ignore[arg-type]
    ],
    ids=["insert", "update", "delete"],
)
def test_a_change_without_its_row_is_refused_on_every_path(change):
    """Also where ``add`` takes the fast path (a table already in the batch)."""
    first = Insert(LSN(1), TABLE, EncodedRow.from_values(("1", "x", b"y")))
    for add in ("add", "_add"):
        builder = BatchBuilder()
        builder.add(txn(5, first), 0, first)
        with pytest.raises(UnloggableInput, match="without its row"):
            getattr(builder, add)(txn(5, first, change), 1, change)
    with pytest.raises(UnloggableInput, match="without its row"):
        encode([txn(5, first, change)])
