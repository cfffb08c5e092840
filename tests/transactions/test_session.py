"""ReplicationSession without a server: confirms never pass the durable end, the oldest held
transaction or what the stream has shown; idle keepalives, the flush clock and end_lsn."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from pgcdc.lsn import LSN
from pgcdc.transactions.session import (
    END,
    FLUSH,
    NO_END,
    Confirm,
    ReplicationSession,
    Stop,
)
from tests.conftest import examples

WAIT = 0.2


def _session(
    *, fsync_interval: float = 10.0, end_lsn: int | None = None, durable: int = 0
) -> ReplicationSession:
    session = ReplicationSession(
        fsync_interval=fsync_interval,
        end_lsn=None if end_lsn is None else LSN(end_lsn),
        max_wait=WAIT,
    )
    session.resume(LSN(durable))
    session.streaming(0.0)
    return session


def test_confirm_stops_at_the_durable_end() -> None:
    session = _session(durable=100)
    assert session.transaction_stored(LSN(300)) is None
    assert session.confirm(None, LSN(0)) == Confirm(LSN(100))  # 100..300 is not durable yet
    session.flushed(LSN(300), 1.0)
    assert session.confirm(None, LSN(100)) == Confirm(LSN(300))
    assert session.confirm(None, LSN(300)) is None  # nothing new to say


def test_confirm_stops_at_the_oldest_pending_transaction() -> None:
    session = _session(durable=100)
    session.transaction_stored(LSN(500))
    session.flushed(LSN(500), 1.0)
    # A streamed or prepared transaction that began at 250 is still held by the assembler.
    assert session.confirm(LSN(250), LSN(0)) == Confirm(LSN(250))
    assert session.confirm(LSN(250), LSN(250)) is None
    assert session.confirm(None, LSN(250)) == Confirm(LSN(500))


def test_confirm_stops_at_what_the_stream_has_shown() -> None:
    session = _session(durable=800)
    assert session.confirm(None, LSN(0)) is None  # the new stream has shown nothing
    session.transaction_dropped(LSN(300))  # a re-sent duplicate
    assert session.confirm(None, LSN(0)) == Confirm(LSN(300))
    assert session.keepalive(LSN(600), 1, LSN(650), LSN(300)) == ()
    assert session.confirm(None, LSN(300)) == Confirm(LSN(600))


def test_restart_with_the_durable_end_past_a_prepared_unsettled_transaction() -> None:
    # Before the restart: a transaction prepared at 300 was held (confirmed stayed at 250)
    # while a later one, committed at 500, reached the log. After it the log's durable end is
    # 500, the slot's confirmed position 250; the server replays the PREPARE at 300 only while
    # the slot stays before it.
    session = _session(durable=100)
    session.transaction_stored(LSN(500))
    session.flushed(LSN(500), 1.0)
    assert session.confirm(LSN(300), LSN(0)) == Confirm(LSN(300))
    session.resume(LSN(500))  # the restart
    session.streaming(2.0)
    assert session.confirm(None, LSN(250)) is None  # the assembler holds nothing yet
    session.flushed(LSN(500), 3.0)
    assert session.confirm(None, LSN(250)) is None
    # The PREPARE at 300 arrives and is held; the commit at 500 is re-sent and dropped.
    session.transaction_dropped(LSN(520))
    assert session.confirm(LSN(300), LSN(250)) == Confirm(LSN(300))


def test_an_idle_keepalive_is_confirmed_when_nothing_is_unflushed_or_pending() -> None:
    session = _session(durable=100)
    session.transaction_dropped(LSN(100))
    assert session.keepalive(LSN(900), 0, None, LSN(100)) == (Confirm(LSN(900)),)
    assert session.keepalive(LSN(900), 0, None, LSN(900)) == ()  # not past the last one


def test_an_idle_keepalive_waits_for_the_flush() -> None:
    session = _session(durable=100)
    session.transaction_stored(LSN(300))
    assert session.keepalive(LSN(900), 0, None, LSN(0)) == ()  # 100..300 is unflushed
    assert session.confirm(None, LSN(0)) == Confirm(LSN(100))
    session.flushed(LSN(300), 1.0)
    assert session.confirm(None, LSN(100)) == Confirm(LSN(900))  # the idle position, now


def test_a_keepalive_while_a_transaction_is_pending_is_not_idle() -> None:
    session = _session(durable=100)
    session.transaction_dropped(LSN(100))
    assert session.keepalive(LSN(900), 1, LSN(400), LSN(100)) == ()
    assert session.idle_lsn == 0
    assert session.confirm(LSN(400), LSN(100)) is None  # durable 100 is the bound
    session.flushed(LSN(500), 1.0)
    assert session.confirm(LSN(400), LSN(100)) == Confirm(LSN(400))
    assert session.confirm(None, LSN(400)) == Confirm(LSN(500))  # 900 was never idle


def test_the_flush_clock() -> None:
    session = _session(fsync_interval=10.0)
    session.streaming(100.0)
    assert session.tick(100.0) == WAIT  # nothing unflushed: read as long as allowed
    assert session.tick(200.0) == WAIT
    assert session.transaction_stored(LSN(10)) is None
    assert session.tick(105.0) == WAIT
    wait = session.tick(109.9)
    assert isinstance(wait, float)
    assert abs(wait - 0.1) < 1e-9  # wake up for the flush
    assert session.tick(110.0) is FLUSH
    session.flushed(LSN(10), 110.5)
    assert session.tick(110.5) == WAIT
    session.transaction_stored(LSN(20))
    assert session.tick(120.0) == WAIT  # the clock restarted at the flush
    assert session.tick(120.5) is FLUSH


def test_fsync_interval_zero_flushes_every_transaction() -> None:
    session = _session(fsync_interval=0.0)
    assert session.transaction_stored(LSN(10)) is FLUSH
    assert session.tick(0.0) is FLUSH


def test_end_lsn_at_a_message_and_after_it() -> None:
    session = _session(end_lsn=1000)
    assert session.watch_from == 1000
    assert session.message(LSN(999)) is None
    assert session.message(LSN(1000)) is None  # a message at end_lsn is read
    assert session.message(LSN(1001)) == Stop("end_lsn")
    assert session.message_done(LSN(999)) is None
    assert session.message_done(LSN(1000)) is END
    assert session.message_done(LSN(1200)) is END


def test_end_lsn_at_a_keepalive() -> None:
    session = _session(end_lsn=1000, durable=50)
    assert session.keepalive(LSN(999), 1, LSN(60), LSN(0)) == ()
    assert session.keepalive(LSN(1000), 1, LSN(60), LSN(0)) == (END,)
    idle = _session(end_lsn=1000, durable=50)
    assert idle.keepalive(LSN(1500), 0, None, LSN(0)) == (Confirm(LSN(1500)), END)


def test_no_end_lsn_never_stops() -> None:
    session = _session()
    top = LSN((1 << 64) - 1)
    assert session.watch_from == NO_END > top
    assert session.message(top) is None
    assert session.message_done(top) is None
    assert session.keepalive(top, 1, LSN(5), LSN(0)) == ()


_KINDS = ("stored", "dropped", "keepalive", "pending", "flush", "tick", "confirm", "restart")


@settings(max_examples=examples(300), deadline=None)
@given(
    steps=st.lists(st.tuples(st.sampled_from(_KINDS), st.integers(-1, 50)), max_size=60),
    fsync_interval=st.sampled_from([0.0, 5.0]),
)
def test_confirms_never_decrease_nor_pass_the_bounds(
    steps: list[tuple[str, int]], fsync_interval: float
) -> None:
    """Random inputs: each Confirm moves forward, and never past what the stream has shown,
    the oldest pending transaction, or the durable end (the last idle keepalive's wal_end
    instead, when nothing is unflushed or pending)."""
    session = _session(fsync_interval=fsync_interval)
    position = 0  # how far the stream has got (the server's LSNs only grow)
    stored = durable = seen = idle = 0
    flushed_all = True  # nothing stored since the last flush
    oldest: int | None = None  # the oldest transaction the assembler holds
    confirmed = 0
    now = 0.0

    def check(action: Confirm | Stop | None) -> None:
        nonlocal confirmed
        if not isinstance(action, Confirm):
            return
        lsn = int(action.lsn)
        assert lsn > confirmed
        assert lsn <= seen
        if oldest is not None:
            assert lsn <= oldest
        assert lsn <= durable or (flushed_all and oldest is None and lsn <= idle)
        confirmed = lsn

    def flush() -> None:
        nonlocal durable, flushed_all
        durable, flushed_all = max(durable, stored), True
        session.flushed(LSN(durable), now)
        check(session.confirm(None if oldest is None else LSN(oldest), LSN(confirmed)))

    for kind, amount in steps:
        if kind in ("stored", "dropped", "keepalive"):
            position += max(amount, 0)
            seen = max(seen, position)
        if kind == "stored":
            stored, flushed_all = position, False
            if session.transaction_stored(LSN(position)) is FLUSH:
                flush()
        elif kind == "dropped":
            session.transaction_dropped(LSN(position))
        elif kind == "keepalive":
            if oldest is None:
                idle = max(idle, position)
            held = None if oldest is None else LSN(oldest)
            pending = int(oldest is not None)
            for action in session.keepalive(LSN(position), pending, held, LSN(confirmed)):
                check(action)
        elif kind == "pending":  # the assembler starts or stops holding a transaction
            oldest = None if amount < 0 else min(position, amount)
        elif kind == "flush":
            flush()
        elif kind == "tick":
            now += max(amount, 0) / 4
            wait = session.tick(now)
            due = not flushed_all and now >= session.next_flush
            if due:
                assert wait is FLUSH
                flush()
            else:
                assert isinstance(wait, float)
                assert 0 < wait <= WAIT
        elif kind == "confirm":
            check(session.confirm(None if oldest is None else LSN(oldest), LSN(confirmed)))
        else:  # a new replication session: the sink flushed, the server re-sends from confirmed
            durable = max(durable, stored)
            session.resume(LSN(durable))
            session.streaming(now)
            position, seen, oldest = confirmed, 0, None
