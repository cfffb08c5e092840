"""Assembly rules over hand-built event sequences: exact outputs for each rule."""

from __future__ import annotations

import pytest

from pgcdc.errors import TransactionSequenceError
from pgcdc.events import Event, Insert, Message, Relation, Type
from pgcdc.lsn import LSN
from pgcdc.transactions import (
    AssemblyOptions,
    CommittedTransaction,
    TransactionAssembler,
    TransactionOutcome,
)

from .builders import (
    T,
    at,
    begin,
    begin_prepare,
    commit,
    commit_prepared,
    ins,
    materialised,
    message,
    origin,
    prepare,
    rel,
    rollback_prepared,
    row_ids,
    run,
    sabort,
    scommit,
    sprepare,
    sstart,
    sstop,
    table,
)


def test_plain_transactions_come_out_whole_in_order() -> None:
    out = run(
        [
            begin(100, 700),
            rel(101),
            ins(102, 1),
            ins(103, 2),
            commit(110, 700),
            begin(200, 701),
            ins(201, 3),
            commit(210),
        ]
    )
    assert [(t.xid, t.commit_lsn, t.end_lsn, t.commit_time) for t in out] == [
        (700, LSN(110), LSN(118), at(110)),
        (701, LSN(210), LSN(218), at(210)),
    ]
    assert list(out[0].events) == [rel(101), ins(102, 1), ins(103, 2)]
    assert list(out[1].events) == [ins(201, 3)]
    assert [t.outcome for t in out] == [TransactionOutcome.COMMIT] * 2
    assert all(t.gid is None and t.origin is None for t in out)


def test_emitted_transactions_equal_their_constructors_output() -> None:
    """The assembler builds what it emits slot by slot, without CommittedTransaction's
    __init__: every field must still be the one the constructor would set, the estimated
    size and the two-phase fields included."""
    plain: list[Event] = [
        begin(100, 700),
        origin(101, "node_b"),
        ins(102, 1),
        ins(103, 2),
        commit(110, 700),
    ]
    with TransactionAssembler(AssemblyOptions()) as assembler:
        out = [
            t
            for event, size in zip(plain, (21, 0, 40, 60, 26), strict=True)
            for t in assembler.feed(event, size)
        ]
    assert out == [
        CommittedTransaction(
            700,
            LSN(110),
            LSN(118),
            at(110),
            (ins(102, 1), ins(103, 2)),
            origin="node_b",
            origin_lsn=LSN(0x99),
            size=100,
        )
    ]
    held: list[Event] = [begin_prepare(200, 800, "g1"), ins(201, 3), prepare(210, 800, "g1")]
    out = run([*held, commit_prepared(220, 800, "g1")], emit_at_prepare=True)
    prepared, settled = (materialised(t) for t in out)
    assert prepared == CommittedTransaction(
        800,
        LSN(210),
        LSN(218),
        at(210),
        (ins(201, 3),),
        gid="g1",
        outcome=TransactionOutcome.PREPARE,
        size=prepared.size,
    )
    assert prepared.size > 0
    assert settled == CommittedTransaction(
        800,
        LSN(220),
        LSN(228),
        at(220),
        (),
        gid="g1",
        outcome=TransactionOutcome.COMMIT_PREPARED,
    )


def test_nothing_is_emitted_before_commit() -> None:
    with TransactionAssembler() as assembler:
        assert assembler.feed(begin(100, 700)) == []
        assert assembler.feed(ins(101, 1)) == []
        assert assembler.oldest_pending_lsn == LSN(100)
        assert assembler.pending_transactions == 1
        [txn] = assembler.feed(commit(110))
        assert row_ids(txn) == [1]
        assert assembler.oldest_pending_lsn is None


def test_interleaved_streams_are_delivered_in_commit_order() -> None:
    events: list[Event] = [
        sstart(100, 800),
        ins(101, 1, 800),
        ins(102, 2, 800),
        sstop(103),
        sstart(104, 900),
        ins(105, 10, 900),
        sstop(106),
        # a plain transaction commits between the streamed blocks
        begin(107, 950),
        ins(108, 50),
        commit(109),
        sstart(110, 800, first=False),
        ins(111, 3, 800),
        sstop(112),
        sstart(113, 900, first=False),
        ins(114, 11, 900),
        sstop(115),
        scommit(120, 900),
        scommit(130, 800),
    ]
    out = run(events)
    assert [(t.xid, t.commit_lsn) for t in out] == [(950, 109), (900, 120), (800, 130)]
    assert [row_ids(t) for t in out] == [[50], [10, 11], [1, 2, 3]]
    assert out[1].commit_time == at(120)


def test_stream_subtransaction_abort_drops_only_its_changes() -> None:
    events: list[Event] = [
        sstart(100, 800),
        rel(101, xid=800),
        ins(102, 1, 800),
        ins(103, 2, 801),  # subtransaction 801
        rel(104, table("u", oid=2), xid=801),
        ins(105, 3, 802),  # subtransaction 802
        sstop(106),
        sabort(107, 800, 801),
        sstart(108, 800, first=False),
        ins(109, 4, 800),
        ins(110, 5, 802),
        sstop(111),
        scommit(120, 800),
    ]
    [txn] = run(events)
    assert row_ids(txn) == [1, 3, 4, 5]
    # The aborted subtransaction's Relation stays: pgoutput will not send it again.
    relations = [e.table.name for e in txn.events if isinstance(e, Relation)]
    assert relations == ["t", "u"]


def test_stream_abort_of_top_level_drops_the_transaction() -> None:
    events: list[Event] = [
        sstart(100, 800),
        ins(101, 1, 800),
        ins(102, 2, 801),
        sstop(103),
        sstart(104, 900),
        ins(105, 9, 900),
        sstop(106),
        sabort(107, 800, 800),
        scommit(110, 900),
    ]
    with TransactionAssembler() as assembler:
        out = list(assembler.feed_all(events))
        assert [(t.xid, row_ids(t)) for t in out] == [(900, [9])]
        assert assembler.pending_transactions == 0
        assert assembler.memory_bytes == 0


def test_subtransaction_abort_named_by_subxid_only() -> None:
    """test_decoding names only the aborted subtransaction's xid."""
    events: list[Event] = [
        sstart(100, 800),
        ins(101, 1, 800),
        ins(102, 2, 801),
        sstop(103),
        sabort(104, 801, 801),
        scommit(110, 800),
    ]
    [txn] = run(events)
    assert row_ids(txn) == [1]


def test_stream_abort_for_unknown_xid_changes_nothing() -> None:
    out = run([sabort(100, 4242, 4242), begin(101, 1), ins(102, 1), commit(103)])
    assert [row_ids(t) for t in out] == [[1]]


def test_changes_without_xid_in_a_stream_belong_to_the_top_level() -> None:
    [txn] = run([sstart(100, 800), ins(101, 1), sstop(102), scommit(110, 800)])
    assert row_ids(txn) == [1]


@pytest.mark.parametrize("streamed", [False, True])
def test_two_phase_commit_holds_until_commit_prepared(streamed: bool) -> None:
    body: list[Event]
    if streamed:
        body = [sstart(100, 800), ins(101, 1, 800), sstop(102), sprepare(110, 800, "g1")]
    else:
        body = [begin_prepare(100, 800, "g1"), ins(101, 1), prepare(110, 800, "g1")]
    with TransactionAssembler() as assembler:
        assert list(assembler.feed_all(body)) == []
        assert assembler.oldest_pending_lsn == LSN(100)
        # another transaction commits while g1 is prepared
        other = list(assembler.feed_all([begin(120, 801), ins(121, 2), commit(122)]))
        assert [row_ids(t) for t in other] == [[2]]
        [txn] = assembler.feed(commit_prepared(130, 800, "g1"))
    assert (txn.xid, txn.commit_lsn, txn.end_lsn, txn.commit_time) == (
        800,
        LSN(130),
        LSN(138),
        at(130),
    )
    assert row_ids(txn) == [1]
    assert txn.gid is None
    assert txn.outcome is TransactionOutcome.COMMIT


@pytest.mark.parametrize("streamed", [False, True])
def test_two_phase_rollback_drops(streamed: bool) -> None:
    body: list[Event]
    if streamed:
        body = [sstart(100, 800), ins(101, 1, 800), sstop(102), sprepare(110, 800, "g1")]
    else:
        body = [begin_prepare(100, 800, "g1"), ins(101, 1), prepare(110, 800, "g1")]
    with TransactionAssembler() as assembler:
        out = list(assembler.feed_all([*body, rollback_prepared(130, 800, "g1")]))
        assert out == []
        assert assembler.pending_transactions == 0


def test_test_decoding_prepare_starts_with_plain_begin() -> None:
    events: list[Event] = [begin(100, 800), ins(101, 1), prepare(110, 800, "g1")]
    out = run([*events, commit_prepared(130, 800, "g1")])
    assert [(t.xid, row_ids(t)) for t in out] == [(800, [1])]


def test_emit_at_prepare_emits_prepare_then_decision() -> None:
    events: list[Event] = [
        begin_prepare(100, 800, "g1"),
        ins(101, 1),
        prepare(110, 800, "g1"),
        begin_prepare(200, 801, "g2"),
        ins(201, 2),
        prepare(210, 801, "g2"),
        commit_prepared(220, 800, "g1"),
        rollback_prepared(230, 801, "g2"),
    ]
    out = run(events, emit_at_prepare=True)
    assert [(t.outcome, t.gid, t.xid, t.commit_lsn, row_ids(t)) for t in out] == [
        (TransactionOutcome.PREPARE, "g1", 800, LSN(110), [1]),
        (TransactionOutcome.PREPARE, "g2", 801, LSN(210), [2]),
        (TransactionOutcome.COMMIT_PREPARED, "g1", 800, LSN(220), []),
        (TransactionOutcome.ROLLBACK_PREPARED, "g2", 801, LSN(230), []),
    ]
    assert out[0].commit_time == at(110)


def test_emit_at_prepare_settles_prepares_from_before_a_restart() -> None:
    """After a restart the server sends only COMMIT PREPARED for a confirmed PREPARE."""
    [txn] = run([commit_prepared(220, 800, "g-old")], emit_at_prepare=True)
    assert (txn.outcome, txn.gid, list(txn.events)) == (
        TransactionOutcome.COMMIT_PREPARED,
        "g-old",
        [],
    )


def test_commit_prepared_for_unseen_prepare_is_an_error_when_holding() -> None:
    with pytest.raises(TransactionSequenceError, match="oldest_pending_lsn"):
        run([commit_prepared(220, 800, "g-old")])


def test_commit_prepared_already_stored_before_a_restart_is_a_duplicate() -> None:
    """The log stored g-old's commit at 220, and the slot was then confirmed past its PREPARE
    (while another transaction was held); after a restart only the decision comes again."""
    events: list[Event] = [commit_prepared(220, 800, "g-old"), begin(300, 801), ins(301, 1)]
    with TransactionAssembler(AssemblyOptions(), stored_through=LSN(220)) as assembler:
        out = list(assembler.feed_all([*events, commit(310)]))
    assert [row_ids(materialised(t)) for t in out] == [[1]]
    with (
        TransactionAssembler(AssemblyOptions(), stored_through=LSN(219)) as assembler,
        pytest.raises(TransactionSequenceError, match="oldest_pending_lsn"),
    ):
        list(assembler.feed_all(events))


def test_origin_is_reported_and_filterable() -> None:
    events: list[Event] = [
        begin(100, 700),
        origin(101, "node_b"),
        ins(102, 1),
        commit(110),
        begin(200, 701),
        ins(201, 2),
        commit(210),
    ]
    out = run(events)
    assert [(t.origin, t.origin_lsn, row_ids(t)) for t in out] == [
        ("node_b", LSN(0x99), [1]),
        (None, None, [2]),
    ]
    out = run(events, origin_filter="none")
    assert [(t.xid, row_ids(t)) for t in out] == [(701, [2])]


def test_origin_filtered_transaction_passes_its_relations_on() -> None:
    events: list[Event] = [
        begin(100, 700),
        origin(101),
        rel(102),
        ins(103, 1),
        commit(110),
        begin(200, 701),
        ins(201, 2),
        commit(210),
    ]
    [txn] = run(events, origin_filter="none")
    assert list(txn.events) == [rel(102), ins(201, 2)]


def test_streamed_origin_filter() -> None:
    events: list[Event] = [
        sstart(100, 800),
        origin(101),
        ins(102, 1, 800),
        sstop(103),
        sstart(104, 900),
        ins(105, 2, 900),
        sstop(106),
        scommit(110, 800),
        scommit(120, 900),
    ]
    assert [t.xid for t in run(events, origin_filter="none")] == [900]
    assert [t.origin for t in run(events)] == ["upstream", None]


def test_messages_transactional_and_not() -> None:
    events: list[Event] = [
        message(50, transactional=False, content=b"alone"),
        begin(100, 700),
        ins(101, 1),
        message(102, transactional=True, content=b"inside"),
        commit(110),
    ]
    out = run(events)
    assert len(out) == 2
    alone, txn = out
    assert (alone.xid, alone.commit_lsn, alone.end_lsn) == (None, LSN(50), LSN(50))
    assert list(alone.events) == [message(50, False, b"alone")]
    assert list(txn.events) == [ins(101, 1), message(102, True, b"inside")]


def test_non_transactional_message_inside_a_stream_is_emitted_at_once() -> None:
    with TransactionAssembler() as assembler:
        assembler.feed(sstart(100, 800))
        assembler.feed(ins(101, 1, 800))
        [alone] = assembler.feed(message(102, False, b"now"))
        assert [type(e) for e in alone.events] == [Message]
        assembler.feed(sstop(103))
        [txn] = assembler.feed(scommit(110, 800))
        assert row_ids(txn) == [1]


def test_streamed_transactional_message_of_aborted_subtransaction_is_dropped() -> None:
    events: list[Event] = [
        sstart(100, 800),
        message(101, True, b"keep", xid=800),
        message(102, True, b"drop", xid=801),
        sstop(103),
        sabort(104, 800, 801),
        scommit(110, 800),
    ]
    [txn] = run(events)
    assert [e.content for e in txn.events if isinstance(e, Message)] == [b"keep"]


def test_relation_and_type_events_stay_in_their_transaction() -> None:
    from pgcdc.events import Type as TypeEvent

    events: list[Event] = [
        begin(100, 700),
        TypeEvent(LSN(101), 90000, "public", "mood"),
        rel(102),
        ins(103, 1),
        commit(110),
    ]
    [txn] = run(events)
    assert [type(e) for e in txn.events] == [Type, Relation, Insert]


def test_include_xids_and_timestamp_off_strip_them() -> None:
    events: list[Event] = [sstart(100, 800), ins(101, 1, 800), sstop(102), scommit(110, 800)]
    [txn] = run(events, include_xids=False, include_timestamp=False)
    assert (txn.xid, txn.commit_time) == (None, None)
    assert [e.xid for e in txn.events if isinstance(e, Insert)] == [None]
    [txn] = run(events)
    assert (txn.xid, txn.commit_time) == (800, at(110))
    assert [e.xid for e in txn.events if isinstance(e, Insert)] == [800]


@pytest.mark.parametrize(
    ("events", "error"),
    [
        ([ins(1, 1)], "outside any transaction"),
        ([commit(1)], "without a Begin"),
        ([begin(1, 7), begin(2, 8)], "inside a transaction"),
        ([sstart(1, 7), sstart(2, 8)], "inside an unfinished"),
        ([sstop(1)], "without a StreamStart"),
        ([scommit(1, 7)], "no change of that streamed"),
        ([sstart(1, 7, first=False)], "first segment"),
        ([sstart(1, 7), scommit(2, 7)], "StreamStop before it is missing"),
        ([begin(1, 7), ins(2, 1), commit(3, 8)], "ends the transaction begun as xid 7"),
        ([begin_prepare(1, 7, "g"), commit(2)], "expected Prepare"),
        (
            [
                begin_prepare(1, 7, "g"),
                prepare(2, 7, "g"),
                begin_prepare(3, 8, "g"),
                prepare(4, 8, "g"),
            ],
            "second transaction was prepared",
        ),
    ],
)
def test_broken_sequences_raise_typed_errors(events: list[Event], error: str) -> None:
    with pytest.raises(TransactionSequenceError, match=error):
        run(events)


def test_feeding_a_non_event_is_a_typed_error() -> None:
    with TransactionAssembler() as assembler, pytest.raises(TransactionSequenceError):
        assembler.feed(T)  # type: ignore[arg-type]
