"""The two thin loops that drive the protocol generators of ``pgcdc.connection.replication``.

A protocol step is a generator that yields ``(events, timeout)``: "wake me when the socket is
readable and/or writable, or after ``timeout`` seconds (None: no limit)". It is sent back the
events that are ready (0 when the timeout expired) and finally returns its result. All protocol
and timing decisions live in the generators; these loops only wait, so the blocking and the
asyncio connection share one implementation (the design of psycopg 3's generators/waiting).
"""

from __future__ import annotations

import asyncio
import select
import selectors
from collections.abc import Callable, Generator
from typing import TypeAlias, TypeVar

READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE

T = TypeVar("T")
WaitRequest: TypeAlias = tuple[int, float | None]
PQGen: TypeAlias = Generator[WaitRequest, int, T]


def held_to(
    gen: PQGen[T],
    deadline: float | None,
    clock: Callable[[], float],
    expired: Callable[[], Exception],
) -> PQGen[T]:
    """``gen`` with every wait cut off at ``deadline`` (on ``clock``; None: no limit): once it
    passes with the step unfinished, the step is closed and ``expired()`` is raised. A step
    whose own waits have no limit (a reply the protocol waits for) cannot then hang on a
    silent network."""
    if deadline is None:
        return (yield from gen)
    try:
        events, timeout = next(gen)
        while True:
            left = deadline - clock()
            if left <= 0:
                gen.close()
                raise expired()
            ready = yield events, left if timeout is None else min(timeout, left)
            events, timeout = gen.send(ready)
    except StopIteration as done:
        result: T = done.value
        return result


def readable_now(fileno: int) -> bool:
    """Whether the socket ``fileno`` has bytes to read at once (a poll that does not wait)."""
    poller = select.poll()
    poller.register(fileno, select.POLLIN)
    return bool(poller.poll(0))


class SyncWaiter:
    """Drives generators with a selector kept for the life of the connection's socket."""

    def __init__(self, fileno: int) -> None:
        self._fileno = fileno
        self._selector = selectors.DefaultSelector()
        self._events = 0

    @property
    def fileno(self) -> int:
        return self._fileno

    def run(self, gen: PQGen[T]) -> T:
        try:
            events, timeout = next(gen)
            while True:
                events, timeout = gen.send(self._wait(events, timeout))
        except StopIteration as done:
            result: T = done.value
            return result

    def _wait(self, events: int, timeout: float | None) -> int:
        if events != self._events:
            if self._events:
                self._selector.modify(self._fileno, events)
            else:
                self._selector.register(self._fileno, events)
            self._events = events
        ready = 0
        for _key, mask in self._selector.select(timeout):
            ready |= mask
        return ready

    def close(self) -> None:
        self._selector.close()


async def run_async(gen: PQGen[T], fileno: int) -> T:
    """Drive ``gen`` on the running asyncio loop (add_reader/add_writer, no threads).

    Cancelling the awaiting task leaves the generator at a wait: no message is lost, because
    messages are only taken from libpq's buffer in the same step that returns them.
    """
    loop = asyncio.get_running_loop()
    try:
        events, timeout = next(gen)
        while True:
            future: asyncio.Future[int] = loop.create_future()

            def wake(ready: int, future: asyncio.Future[int] = future) -> None:
                if not future.done():
                    future.set_result(ready)

            if events & READ:
                loop.add_reader(fileno, wake, READ)
            if events & WRITE:
                loop.add_writer(fileno, wake, WRITE)
            timer = None if timeout is None else loop.call_later(max(timeout, 0.0), wake, 0)
            try:
                ready = await future
            finally:
                if events & READ:
                    loop.remove_reader(fileno)
                if events & WRITE:
                    loop.remove_writer(fileno)
                if timer is not None:
                    timer.cancel()
            events, timeout = gen.send(ready)
    except StopIteration as done:
        result: T = done.value
        return result
