"""Transactions for the change log tests: hypothesis strategies and a deterministic generator."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pyarrow as pa
from hypothesis import strategies as st

from pgcdc.changelog import ChangeLog, read_segment
from pgcdc.events import (
    UNCHANGED_TOAST,
    Column,
    Delete,
    Event,
    Insert,
    Message,
    RawValue,
    Relation,
    ReplicaIdentity,
    Table,
    Truncate,
    Type,
    Update,
)
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction, TransactionOutcome

# --- hypothesis strategies -------------------------------------------------------------------

texts = st.text(max_size=20)
# Values may hold lone surrogates (what surrogateescape-decoded SQL_ASCII text holds).
value_texts = st.text(
    st.characters() | st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=20
)
names = st.text(min_size=1, max_size=12)
lsns = st.integers(0, (1 << 64) - 1).map(LSN)
oids = st.integers(0, (1 << 32) - 1)
xids = st.none() | st.integers(0, (1 << 64) - 1)
values: st.SearchStrategy[RawValue] = st.one_of(
    st.none(), st.just(UNCHANGED_TOAST), value_texts, st.binary(max_size=20)
)
rows = st.lists(values, max_size=5).map(tuple)
columns = st.builds(
    Column,
    name=names,
    type_oid=oids,
    type_modifier=st.integers(-1, 1 << 20),
    is_key=st.booleans(),
    type_name=st.none() | names,
)
tables = st.builds(
    Table,
    namespace=names,
    name=names,
    columns=st.lists(columns, max_size=4).map(tuple),
    oid=oids,
    replica_identity=st.sampled_from(ReplicaIdentity),
)
events: st.SearchStrategy[Event] = st.one_of(
    st.builds(Insert, lsn=lsns, table=tables, new=rows, xid=xids),
    st.builds(
        Update,
        lsn=lsns,
        table=tables,
        new=rows,
        old=st.none() | rows,
        old_is_key=st.booleans(),
        xid=xids,
    ),
    st.builds(Delete, lsn=lsns, table=tables, old=rows, old_is_key=st.booleans(), xid=xids),
    st.builds(
        Truncate,
        lsn=lsns,
        tables=st.lists(tables, max_size=3).map(tuple),
        cascade=st.booleans(),
        restart_identity=st.booleans(),
        xid=xids,
    ),
    st.builds(
        Message,
        lsn=lsns,
        transactional=st.booleans(),
        prefix=texts,
        content=st.binary(max_size=30),
        xid=xids,
    ),
    st.builds(Relation, lsn=lsns, table=tables, xid=xids),
    st.builds(Type, lsn=lsns, oid=oids, namespace=names, name=names, xid=xids),
)
times = st.none() | st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(9999, 1, 1), timezones=st.just(UTC)
)


@st.composite
def transaction_lists(draw: st.DrawFn, max_size: int = 6) -> list[CommittedTransaction]:
    """Transactions in increasing commit LSN order, as transaction assembly emits them."""
    count = draw(st.integers(0, max_size))
    commits = sorted(draw(st.sets(st.integers(1, 1 << 40), min_size=count, max_size=count)))
    return [
        CommittedTransaction(
            xid=draw(xids),
            commit_lsn=LSN(commit),
            end_lsn=LSN(commit + draw(st.integers(0, 100))),
            commit_time=draw(times),
            events=tuple(draw(st.lists(events, max_size=5))),
            origin=draw(st.none() | texts),
            origin_lsn=draw(st.none() | lsns),
            gid=draw(st.none() | texts),
            outcome=draw(st.sampled_from(TransactionOutcome)),
            size=draw(st.integers(0, 1 << 40)),
        )
        for commit in commits
    ]


# --- deterministic transactions --------------------------------------------------------------

TABLE = Table(
    "public",
    "accounts",
    (Column("id", 23, is_key=True), Column("name", 25), Column("blob", 17)),
    oid=16384,
)
START = datetime(2024, 5, 1, tzinfo=UTC)


def transaction(number: int, rows: int = 3) -> CommittedTransaction:
    """Transaction ``number`` of a reproducible stream (commit LSN grows with the number)."""
    commit = LSN(0x1000000 + number * 0x1000)
    events: list[Event] = []
    if number % 7 == 0:
        events.append(Relation(commit - 0x900, TABLE, number))
    for i in range(rows):
        key = str(number * 1000 + i)
        if (number + i) % 3 == 0:
            events.append(Update(commit - 0x800 + i, TABLE, (key, UNCHANGED_TOAST, None), (key,)))
        else:
            blob = bytes([number % 256, i % 256]) * 8
            events.append(Insert(commit - 0x800 + i, TABLE, (key, f"name {key} é", blob), number))
    if number % 5 == 0:
        events.append(Message(commit - 0x10, True, "pgcdc", b"\x00\xff" * number))
    return CommittedTransaction(
        xid=number,
        commit_lsn=commit,
        end_lsn=commit + 0x30,
        commit_time=START + timedelta(seconds=number),
        events=tuple(events),
    )


def transactions(start: int, stop: int, rows: int = 3) -> Iterator[CommittedTransaction]:
    for number in range(start, stop):
        yield transaction(number, rows)


def number_of(commit_lsn: int) -> int:
    """The ``transaction`` number that has this commit LSN."""
    return (commit_lsn - 0x1000000) // 0x1000


def crash_rows(number: int) -> int:
    """Row counts for the crash tests: mostly small, now and then a multi-frame transaction."""
    return 200 if number % 11 == 0 else 1 + (number * 37) % 25


def log_rows(root: Any) -> pa.Table:
    """Every row of the change log at ``root``, in log order, as one Arrow table: two logs of
    the same transactions compare column for column."""
    log = ChangeLog(root)
    return pa.Table.from_batches([b for s in log.segments() for b in read_segment(s.path)])
