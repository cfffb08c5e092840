"""The receiver's decisions, free of IO: when to flush, what to confirm, when to stop.

``ReplicationSession`` takes what happened (a transaction stored or dropped, a keepalive, a
message's LSN, the clock, the sink's durable end) and answers with what to do (``Flush``,
``Confirm(lsn)``, ``Stop(reason)``) or None. It reads no socket, sink or clock, so the rules
that make the pipeline lose nothing (never confirm past what is durable, past the oldest
transaction still held, or past what the stream has shown) are tested without a server, and
the receiver's loop only performs what it is told.

The hot path stays cheap: answers are None or shared constants (``FLUSH``, ``END``) except a
``Confirm``, which comes at most once per flush or keepalive; and ``watch_from`` lets the loop
skip ``message`` and ``message_done`` for LSNs before ``end_lsn``, where they never stop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from pgcdc.lsn import INVALID_LSN, LSN

__all__ = ["END", "FLUSH", "NO_END", "Confirm", "Flush", "ReplicationSession", "Stop"]

# Above every LSN: ``watch_from`` without an ``end_lsn``.
NO_END: Final = 1 << 64


@dataclass(frozen=True, slots=True)
class Flush:
    """Make the sink durable (``sink.flush()``), then report it with ``flushed``."""


@dataclass(frozen=True, slots=True)
class Confirm:
    """Tell the server the slot may move to ``lsn`` (standby status update)."""

    lsn: LSN


@dataclass(frozen=True, slots=True)
class Stop:
    """Stop streaming; ``reason`` becomes ``ReceiverProgress.stopped_by``."""

    reason: str


FLUSH: Final = Flush()
END: Final = Stop("end_lsn")
_NOTHING: Final[tuple[Confirm | Stop, ...]] = ()


class ReplicationSession:
    """Flush clock, confirm targets and ``end_lsn`` for one receiver, across its reconnects.

    It outlives a replication session (``resume`` starts the next one), as the receiver's
    state always has: what is unflushed and the last idle keepalive carry over."""

    __slots__ = (
        "durable_lsn",
        "end_lsn",
        "fsync_interval",
        "idle_lsn",
        "max_wait",
        "next_flush",
        "seen_lsn",
        "unflushed",
        "watch_from",
    )

    def __init__(self, *, fsync_interval: float, end_lsn: LSN | None, max_wait: float) -> None:
        self.fsync_interval = fsync_interval  # 0: flush after every stored transaction
        self.end_lsn = end_lsn
        # The longest a read may block (the loop looks at its stop event between reads).
        self.max_wait = max_wait
        # LSNs below this never stop the stream, so the loop need not ask about them.
        self.watch_from = NO_END if end_lsn is None else int(end_lsn)
        self.durable_lsn = INVALID_LSN  # the sink's durable end
        self.unflushed = False  # a transaction was stored since the last flush
        # Keepalive wal_end seen while the assembler held nothing: every transaction that
        # commits before it has been received.
        self.idle_lsn = INVALID_LSN
        # How far this session's stream has demonstrably got: the end of every transaction it
        # completed and every keepalive's wal_end. Confirms never pass it (see ``confirm``).
        self.seen_lsn = INVALID_LSN
        self.next_flush = 0.0

    # --- inputs ------------------------------------------------------------------------------

    def resume(self, durable: LSN) -> None:
        """A new replication session: the sink's durable end, flushed before streaming; its
        stream has shown nothing yet."""
        self.durable_lsn = durable
        self.seen_lsn = INVALID_LSN

    def streaming(self, now: float) -> None:
        """Streaming has started: the flush clock runs from ``now``."""
        self.next_flush = now + self.fsync_interval

    def tick(self, now: float) -> Flush | float:
        """Between bursts of messages: ``FLUSH`` when unflushed data is due, else how long the
        next read may block (until the flush is due, at most ``max_wait``)."""
        if self.unflushed:
            if now >= self.next_flush:
                return FLUSH
            return min(self.max_wait, self.next_flush - now)
        return self.max_wait

    def flushed(self, durable: LSN, now: float) -> None:
        """The sink flushed up to ``durable`` at ``now``; ask ``confirm`` next."""
        self.durable_lsn = durable
        self.unflushed = False
        self.next_flush = now + self.fsync_interval

    def message(self, lsn: LSN) -> Stop | None:
        """Before an XLogData starting at ``lsn`` is read: commits after ``end_lsn`` start
        past it, so they are left unread."""
        end_lsn = self.end_lsn
        return END if end_lsn is not None and lsn > end_lsn else None

    def message_done(self, lsn: LSN) -> Stop | None:
        """After the XLogData starting at ``lsn`` was handled: ``end_lsn`` is reached."""
        end_lsn = self.end_lsn
        return END if end_lsn is not None and lsn >= end_lsn else None

    def transaction_stored(self, end_lsn: LSN) -> Flush | None:
        """A completed transaction ending at ``end_lsn`` reached the sink: ``FLUSH`` at once
        with ``fsync_interval=0`` (synchronous replication waits for it)."""
        self.seen_lsn = max(self.seen_lsn, end_lsn)
        self.unflushed = True
        return FLUSH if self.fsync_interval == 0 else None

    def transaction_dropped(self, end_lsn: LSN) -> None:
        """A completed transaction the sink did not take (a duplicate it already holds, or
        the sink failed on it): the stream has still shown everything up to its end."""
        self.seen_lsn = max(self.seen_lsn, end_lsn)

    def keepalive(
        self,
        wal_end: LSN,
        pending_transactions: int,
        oldest_pending_lsn: LSN | None,
        confirmed: LSN,
    ) -> tuple[Confirm | Stop, ...]:
        """The server has sent everything before ``wal_end``. With nothing held by the
        assembler it becomes the idle position, confirmed at once if nothing is unflushed (an
        idle database must not hold WAL); at ``end_lsn`` the stream stops."""
        self.seen_lsn = max(self.seen_lsn, wal_end)
        confirm = None
        if pending_transactions == 0 and wal_end > self.idle_lsn:
            self.idle_lsn = wal_end
            if not self.unflushed:
                confirm = self.confirm(oldest_pending_lsn, confirmed)
        end_lsn = self.end_lsn
        if end_lsn is not None and wal_end >= end_lsn:
            return (END,) if confirm is None else (confirm, END)
        return _NOTHING if confirm is None else (confirm,)

    # --- outputs -----------------------------------------------------------------------------

    def confirm(self, oldest_pending_lsn: LSN | None, confirmed: LSN) -> Confirm | None:
        """What to confirm now, given the oldest transaction the assembler holds and what the
        server was last told (``confirmed``); None when that would not move forward."""
        target = self.durable_lsn
        if oldest_pending_lsn is not None:
            target = min(target, oldest_pending_lsn)
        elif not self.unflushed and self.idle_lsn > target:
            target = self.idle_lsn
        # After a restart the log's durable end can lie past a transaction prepared before it
        # and settled after it, which the server replays only while the slot is confirmed
        # before its PREPARE. Until the stream has passed that end again the transaction may
        # not have arrived (and be held) yet, so never confirm beyond what the stream has shown.
        target = min(target, self.seen_lsn)
        if target > confirmed:
            return Confirm(LSN(target))
        return None
