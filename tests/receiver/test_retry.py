"""The receiver's retry policy, without a server: which failures a new session can get past,
and how long to wait before it (capped exponential backoff with jitter)."""

from __future__ import annotations

import pytest

from pgcdc import errors
from pgcdc.receiver import Backoff, RetryPolicy, retryable, while_slot_busy

LOST = errors.ConnectionLost("server closed the connection unexpectedly")
TERMINATED = errors.ReplicationStreamError(
    "terminating connection due to administrator command", sqlstate="57P01"
)
STARTING = errors.ConnectionFailed("FATAL:  the database system is starting up")

PERMANENT = [
    errors.AuthenticationFailed("password authentication failed for user cdc"),
    errors.PublicationNotFound('publication "pub" does not exist'),
    errors.SlotNotFound('replication slot "s" does not exist'),
    errors.SlotInvalidated('can no longer get changes from replication slot "s"'),
    errors.WalLevelNotLogical("logical decoding requires wal_level >= logical"),
    errors.SlotInUse("slot s is active for PID 7", slot="s", active_pid=7),
    errors.ServerError("syntax error", sqlstate="42601"),
    errors.CorruptChangeLog("segment 3 is damaged"),
    errors.DecodeError("truncated message"),
]


@pytest.mark.parametrize("error", [LOST, TERMINATED, STARTING], ids=repr)
def test_server_faults_are_retried(error: errors.PgcdcError) -> None:
    assert retryable(error)
    assert Backoff(RetryPolicy(), uniform=lambda: 0.0).failed(error, 0.0, 0.1) == 1.0


@pytest.mark.parametrize("error", PERMANENT, ids=lambda e: type(e).__name__)
def test_errors_a_retry_cannot_fix_give_up_at_once(error: errors.PgcdcError) -> None:
    assert not retryable(error)
    backoff = Backoff(RetryPolicy(), uniform=lambda: 0.0)
    assert backoff.failed(LOST, 0.0, 0.1) == 1.0
    assert backoff.failed(error, 1.1, 1.2) is None


def test_delays_double_up_to_the_cap() -> None:
    backoff = Backoff(RetryPolicy(initial=1.0, maximum=10.0, jitter=0.0))
    delays = [backoff.failed(LOST, float(i), float(i) + 0.5) for i in range(6)]
    assert delays == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.failures == 6


def test_a_long_outage_stays_at_the_cap() -> None:
    backoff = Backoff(RetryPolicy(initial=1.0, maximum=60.0, multiplier=1e6, jitter=0.0))
    delays = [backoff.failed(LOST, 0.0, 0.0) for _ in range(5000)]
    assert delays[:2] == [1.0, 60.0] and set(delays[1:]) == {60.0}


def test_jitter_takes_away_up_to_its_share_of_the_delay() -> None:
    draws = iter([0.0, 1.0, 0.5])
    backoff = Backoff(RetryPolicy(initial=4.0, jitter=0.5), uniform=lambda: next(draws))
    assert [backoff.failed(LOST, 0.0, 0.0) for _ in range(3)] == [4.0, 4.0, 12.0]


def test_a_session_that_streamed_long_enough_starts_the_backoff_again() -> None:
    backoff = Backoff(RetryPolicy(initial=1.0, jitter=0.0, reset_after=30.0))
    assert [backoff.failed(LOST, 0.0, 1.0) for _ in range(3)] == [1.0, 2.0, 4.0]
    assert backoff.failed(LOST, 100.0, 129.0) == 8.0  # 29 s: not long enough
    assert backoff.failed(LOST, 200.0, 230.0) == 1.0


def test_attempts_bound_the_retries_in_a_row() -> None:
    backoff = Backoff(RetryPolicy(initial=1.0, jitter=0.0, attempts=2))
    assert [backoff.failed(LOST, 0.0, 0.0) for _ in range(3)] == [1.0, 2.0, None]
    assert Backoff(RetryPolicy(attempts=0)).failed(LOST, 0.0, 0.0) is None


@pytest.mark.parametrize(
    ("changes", "complaint"),
    [
        ({"initial": -1}, "initial must be"),
        ({"initial": 5.0, "maximum": 1.0}, "must not be below initial"),
        ({"multiplier": 0.5}, "multiplier must be >= 1"),
        ({"jitter": 2}, "jitter must be between 0 and 1"),
        ({"attempts": -1}, "attempts must be None"),
    ],
)
def test_bad_policies_are_a_typed_error(changes: dict[str, float], complaint: str) -> None:
    with pytest.raises(errors.InvalidOption, match=complaint):
        RetryPolicy(**changes)  # type: ignore[arg-type]


def test_a_busy_slot_is_tried_again_until_free_or_the_time_is_up() -> None:
    busy = errors.SlotInUse("slot s is active for PID 7", slot="s", active_pid=7)
    tries: list[int] = []

    def attempt() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise busy
        return "read"

    assert while_slot_busy(attempt, 10.0) == "read" and len(tries) == 3
    tries.clear()
    with pytest.raises(errors.SlotInUse):
        while_slot_busy(attempt, 0.0)  # no time to wait: the first refusal is the error
    assert len(tries) == 1
