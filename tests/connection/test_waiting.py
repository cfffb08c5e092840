"""``held_to``: a deadline over a protocol step, driven by hand (no socket, a fake clock)."""

from __future__ import annotations

import pytest

from pgcdc.connection.waiting import READ, WRITE, PQGen, held_to
from pgcdc.errors import ConnectionLost


def _waits_for_a_reply(closed: list[bool]) -> PQGen[str]:
    """A step that waits without a limit until the socket is readable."""
    try:
        yield WRITE, 0.5  # a wait with its own limit
        while not (yield READ, None):
            pass
        return "answered"
    finally:
        closed.append(True)


def test_waits_are_cut_at_the_deadline_and_the_step_is_closed() -> None:
    now = [100.0]
    closed: list[bool] = []
    step = held_to(_waits_for_a_reply(closed), 103.0, lambda: now[0], lambda: ConnectionLost("x"))
    assert next(step) == (WRITE, 0.5)  # the step's own limit, shorter than the deadline
    now[0] = 101.0
    assert step.send(WRITE) == (READ, 2.0)  # no limit of its own: the time left
    now[0] = 103.0
    with pytest.raises(ConnectionLost):
        step.send(0)  # the wait ran out, and so did the deadline
    assert closed == [True]


def test_a_step_that_finishes_in_time_returns_its_result() -> None:
    now = [0.0]
    step = held_to(_waits_for_a_reply([]), 10.0, lambda: now[0], lambda: ConnectionLost("x"))
    next(step)
    step.send(WRITE)
    with pytest.raises(StopIteration) as done:
        step.send(READ)
    assert done.value.value == "answered"


def test_no_deadline_leaves_the_step_as_it_is() -> None:
    step = held_to(_waits_for_a_reply([]), None, lambda: 0.0, lambda: ConnectionLost("x"))
    assert next(step) == (WRITE, 0.5)
    assert step.send(WRITE) == (READ, None)
