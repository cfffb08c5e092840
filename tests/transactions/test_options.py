"""Client-side decoding options: validation, table filters, skip-empty, heartbeats, batches."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from pgcdc.errors import InvalidOption, InvalidTablePattern, PgcdcError
from pgcdc.events import Event, Heartbeat, Insert, Relation, Truncate
from pgcdc.lsn import LSN
from pgcdc.transactions import (
    AssemblyOptions,
    CommittedTransaction,
    TransactionAssembler,
    TransactionBatcher,
)
from pgcdc.transactions.filters import TableFilter, TablePatterns, parse_table_patterns

from .builders import EPOCH, at, begin, commit, ins, message, rel, row_ids, run, table

T1 = table("t1")
T2 = table("t2")
T3_OTHER = table("t3", schema="other")
APP_X = table("x", schema="app")


def test_table_filter_uses_the_opengauss_grammar() -> None:
    patterns = parse_table_patterns("public.t1,public.t2,*.t3,my_schema.*")
    assert patterns == TablePatterns(
        (("public", "t1"), ("public", "t2"), (None, "t3"), ("my_schema", None))
    )
    table_filter = TableFilter(patterns)
    assert [table_filter.matches(t) for t in (T1, T2, T3_OTHER, APP_X)] == [
        True,
        True,
        True,
        False,
    ]
    assert table_filter.matches(table("anything", schema="my_schema"))
    assert not table_filter.matches(table("T1"))  # names compare exactly


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("public.t1, public.t2", "whitespace"),
        ("public", "not schema.table"),
        ("a.b.c", "not schema.table"),
        ("public.", "not schema.table"),
        (".t1", "not schema.table"),
        ("public.t1,", "not schema.table"),
        ("public.t*", "inside a name"),
    ],
)
def test_bad_table_patterns_raise(text: str, why: str) -> None:
    with pytest.raises(InvalidTablePattern, match=why) as info:
        AssemblyOptions(white_table_list=text)
    assert isinstance(info.value, PgcdcError)


def test_white_table_list_filters_changes_relations_and_truncates() -> None:
    events: list[Event] = [
        begin(100, 700),
        rel(101, T1),
        rel(102, T3_OTHER),
        rel(103, APP_X),
        ins(104, 1, tbl=T1),
        ins(105, 2, tbl=T2),
        ins(106, 3, tbl=T3_OTHER),
        ins(107, 4, tbl=APP_X),
        Truncate(LSN(108), (T1, T2)),
        Truncate(LSN(109), (T2,)),
        commit(110),
    ]
    [txn] = run(events, white_table_list="public.t1,*.t3")
    assert [(type(e).__name__, getattr(e, "lsn", None)) for e in txn.events] == [
        ("Relation", LSN(101)),
        ("Relation", LSN(102)),
        ("Insert", LSN(104)),
        ("Insert", LSN(106)),
        ("Truncate", LSN(108)),
    ]
    truncate = next(e for e in txn.events if isinstance(e, Truncate))
    assert truncate.tables == (T1,)
    [txn] = run(events, white_table_list="app.*")
    assert row_ids(txn) == [4]


def test_skip_empty_xacts_with_table_filter() -> None:
    events: list[Event] = [
        begin(100, 700),
        ins(101, 1, tbl=T2),  # filtered away: the transaction is empty
        commit(102),
        begin(200, 701),
        commit(201),  # empty to begin with
        begin(300, 702),
        message(301, True),  # a message is content
        commit(302),
        begin(400, 703),
        ins(401, 2, tbl=T1),
        commit(402),
    ]
    kept = run(events, white_table_list="public.t1", skip_empty_xacts=True)
    assert [t.xid for t in kept] == [702, 703]
    kept = run(events, white_table_list="public.t1")
    assert [t.xid for t in kept] == [700, 701, 702, 703]
    assert [list(t.events) for t in kept[:2]] == [[], []]


def test_skipped_transaction_passes_its_relations_to_the_next() -> None:
    events: list[Event] = [
        begin(100, 700),
        rel(101, T1),
        commit(102),
        begin(200, 701),
        ins(201, 1, tbl=T1),
        commit(202),
    ]
    [txn] = run(events, skip_empty_xacts=True)
    assert [type(e) for e in txn.events] == [Relation, Insert]
    assert txn.xid == 701


def test_origin_filter_value_is_checked() -> None:
    with pytest.raises(InvalidOption, match="origin_filter"):
        AssemblyOptions(origin_filter="local")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"include_xids": 1}, "include_xids"),
        ({"skip_empty_xacts": "1"}, "skip_empty_xacts"),
        ({"max_txn_in_memory": -1}, "max_txn_in_memory"),
        ({"max_reorderbuffer_in_memory": float("nan")}, "max_reorderbuffer_in_memory"),
        ({"heartbeat_interval": 0}, "heartbeat_interval"),
        ({"batch_max_seconds": -2}, "batch_max_seconds"),
        ({"batch_max_bytes": 0}, "batch_max_bytes"),
        ({"spill_dir": ""}, "spill_dir"),
        ({"white_table_list": 5}, "white_table_list"),
    ],
)
def test_bad_option_values_raise(kwargs: dict[str, Any], name: str) -> None:
    with pytest.raises(InvalidOption, match=name):
        AssemblyOptions(**kwargs)


def test_from_plugin_options_reads_opengauss_names() -> None:
    options = AssemblyOptions.from_plugin_options(
        {
            "include-xids": "0",
            "include-timestamp": "1",
            "skip-empty-xacts": "on",
            "white-table-list": "public.*",
            "max-txn-in-memory": "10",
            "max-reorderbuffer-in-memory": "0.5",
            "enable-heartbeat": "true",
            "heartbeat-interval": "2.5",
            "sending-batch": "1",
            "batch-max-bytes": "4096",
            "origin-filter": "none",
        }
    )
    assert options == AssemblyOptions(
        include_xids=False,
        include_timestamp=True,
        skip_empty_xacts=True,
        white_table_list="public.*",
        max_txn_in_memory=10.0,
        max_reorderbuffer_in_memory=0.5,
        enable_heartbeat=True,
        heartbeat_interval=2.5,
        sending_batch=True,
        batch_max_bytes=4096,
        origin_filter="none",
    )
    assert options.max_txn_bytes == 10 * 1024 * 1024


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"include-xid": "1"}, "unknown decoding option 'include-xid'"),
        ({"include-xids": "2"}, "takes 0 or 1"),
        ({"max-txn-in-memory": "lots"}, "takes a number"),
        ({"batch-max-bytes": "1.5"}, "whole number"),
        ({"white-table-list": "a b"}, "whitespace"),
    ],
)
def test_from_plugin_options_rejects_bad_text(options: dict[str, str], message: str) -> None:
    with pytest.raises(InvalidOption, match=message):
        AssemblyOptions.from_plugin_options(options)


def test_heartbeat_when_idle() -> None:
    options = AssemblyOptions(enable_heartbeat=True, heartbeat_interval=10)
    with TransactionAssembler(options) as assembler:
        t0 = EPOCH
        assert assembler.idle(t0, LSN(500)) is None  # starts the clock
        assert assembler.idle(t0 + timedelta(seconds=9), LSN(500)) is None
        beat = assembler.idle(t0 + timedelta(seconds=10), LSN(600))
        assert beat == Heartbeat(LSN(600), t0 + timedelta(seconds=10))
        assert assembler.idle(t0 + timedelta(seconds=15), LSN(600)) is None
        assert assembler.idle(t0 + timedelta(seconds=20), LSN(700)) == Heartbeat(
            LSN(700), t0 + timedelta(seconds=20)
        )
        # Output resets the clock.
        list(assembler.feed_all([begin(800, 7), ins(801, 1), commit(802)]))
        assert assembler.idle(t0 + timedelta(seconds=31), LSN(900)) is None
        assert assembler.idle(t0 + timedelta(seconds=40), LSN(900)) is None
        assert assembler.idle(t0 + timedelta(seconds=41), LSN(900)) == Heartbeat(
            LSN(900), t0 + timedelta(seconds=41)
        )
        # A transaction still buffered caps the heartbeat's LSN at its start.
        assembler.feed(begin(950, 8))
        assert assembler.idle(t0 + timedelta(seconds=60), LSN(2000)) == Heartbeat(
            LSN(950), t0 + timedelta(seconds=60)
        )


def test_heartbeat_off_by_default() -> None:
    with TransactionAssembler() as assembler:
        assert assembler.idle(EPOCH, LSN(1)) is None
        assert assembler.idle(EPOCH + timedelta(days=1), LSN(1)) is None


def _txn(n: int, size: int) -> CommittedTransaction:
    return CommittedTransaction(n, LSN(n * 10), LSN(n * 10 + 8), at(n), (), size=size)


def test_batching_by_size() -> None:
    batcher = TransactionBatcher(AssemblyOptions(sending_batch=True, batch_max_bytes=1000))
    now = EPOCH
    assert batcher.add(_txn(1, 400), now) == []
    assert batcher.add(_txn(2, 400), now) == []
    # 3 would overflow: the batch of 1 and 2 closes, 3 starts the next.
    [first] = batcher.add(_txn(3, 300), now)
    assert [t.xid for t in first.transactions] == [1, 2]
    assert (first.size, first.end_lsn) == (800, LSN(28))
    # Reaching the limit exactly closes the batch.
    [second] = batcher.add(_txn(4, 700), now)
    assert [t.xid for t in second.transactions] == [3, 4]
    # A transaction above the limit travels alone.
    [alone] = batcher.add(_txn(5, 5000), now)
    assert [t.xid for t in alone.transactions] == [5]
    assert batcher.pending_bytes == 0
    assert batcher.flush() is None


def test_batching_by_time() -> None:
    options = AssemblyOptions(sending_batch=True, batch_max_bytes=10**6, batch_max_seconds=2)
    batcher = TransactionBatcher(options)
    assert batcher.add(_txn(1, 10), EPOCH) == []
    assert batcher.poll(EPOCH + timedelta(seconds=1)) is None
    assert batcher.add(_txn(2, 10), EPOCH + timedelta(seconds=1.5)) == []
    batch = batcher.poll(EPOCH + timedelta(seconds=2))
    assert batch is not None
    assert [t.xid for t in batch.transactions] == [1, 2]
    assert batcher.poll(EPOCH + timedelta(seconds=10)) is None
    # An expired batch is closed before the new transaction joins a fresh one.
    batcher.add(_txn(3, 10), EPOCH + timedelta(seconds=20))
    [expired] = batcher.add(_txn(4, 10), EPOCH + timedelta(seconds=23))
    assert [t.xid for t in expired.transactions] == [3]
    final = batcher.flush()
    assert final is not None
    assert [t.xid for t in final.transactions] == [4]


def test_batching_off_passes_each_transaction_alone() -> None:
    batcher = TransactionBatcher()
    [batch] = batcher.add(_txn(1, 10), EPOCH)
    assert [t.xid for t in batch.transactions] == [1]
    assert batcher.flush() is None


def test_assembler_sizes_feed_the_batcher() -> None:
    events: list[Event] = [begin(100, 7), ins(101, 1), ins(102, 2), commit(103)]
    [txn] = run(events)
    assert txn.size > 0
    [single] = run([*events[:2], commit(103)])
    assert 0 < single.size < txn.size
