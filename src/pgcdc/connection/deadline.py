"""A client-side deadline for queries on an ordinary psycopg connection.

libpq waits for a query's answer for ever: on a network that drops packets without a reset (a
partition, a black-holed route) nothing ever ends the wait, and ``statement_timeout`` cannot
help because the server never hears of it. ``answered_within`` shuts the connection's socket
down when the deadline passes, which wakes libpq with an end of file: the query fails with a
typed ``ConnectionLost`` naming the deadline, and the caller's retry logic takes over.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg

from pgcdc.errors import ConnectionLost


@contextlib.contextmanager
def answered_within(
    conn: psycopg.Connection[Any] | psycopg.AsyncConnection[Any], seconds: float | None, what: str
) -> Iterator[None]:
    """Run the block's queries on ``conn``; if they take over ``seconds`` (None: no deadline),
    the connection is shut down and the block raises ``ConnectionLost`` (the connection is then
    unusable: close it)."""
    if seconds is None:
        yield
        return
    lock = threading.Lock()
    running, fired = True, False
    fileno = conn.fileno()

    def expire() -> None:
        nonlocal fired
        with lock:
            if not running:
                return
            fired = True
            # A duplicate of the descriptor: shutdown acts on the socket both share, and closing
            # the duplicate leaves libpq's descriptor valid (it then reads end of file).
            with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fileno)) as sock:
                sock.shutdown(socket.SHUT_RDWR)

    def disarm() -> bool:
        """Keep the timer from firing from now on; whether it already did."""
        nonlocal running
        with lock:
            running = False
        timer.cancel()
        return fired

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        yield
    except Exception as error:  # psycopg's, or the typed one translated() made of it
        if disarm():
            raise ConnectionLost(
                f"{what} got no answer within {seconds:g} s: the network or the server stopped "
                "answering (the connection was given up; a new session reconnects)"
            ) from error
        raise
    finally:
        disarm()
