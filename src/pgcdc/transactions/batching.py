"""sending-batch: group committed transactions into batches by size or age.

Writing a change log segment or a Delta commit per transaction costs a round of IO each; a
batch amortises it. Sans-IO like the rest: the caller passes the current time.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pgcdc.lsn import LSN
from pgcdc.transactions.model import CommittedTransaction
from pgcdc.transactions.options import AssemblyOptions


@dataclass(frozen=True, slots=True)
class Batch:
    """Consecutive committed transactions, in commit order."""

    transactions: tuple[CommittedTransaction, ...]
    size: int

    @property
    def end_lsn(self) -> LSN:
        """Where a consumer that stored this batch may confirm up to."""
        return self.transactions[-1].end_lsn


class TransactionBatcher:
    """Closes a batch when it reaches ``batch_max_bytes`` or has been open
    ``batch_max_seconds``. With ``sending_batch`` off every transaction is its own batch.

    A transaction larger than the byte limit travels alone; a batch never exceeds the limit
    otherwise, because a transaction that would overflow it starts the next batch.
    """

    def __init__(self, options: AssemblyOptions | None = None) -> None:
        options = options if options is not None else AssemblyOptions()
        self._enabled = options.sending_batch
        self._max_bytes = options.batch_max_bytes
        self._max_seconds = options.batch_max_seconds
        self._pending: list[CommittedTransaction] = []
        self._size = 0
        self._opened: datetime | None = None

    def add(self, txn: CommittedTransaction, now: datetime) -> list[Batch]:
        """Add a transaction; return the batches that are now complete."""
        if not self._enabled:
            return [Batch((txn,), txn.size)]
        done: list[Batch] = []
        expired = self.poll(now)
        if expired is not None:
            done.append(expired)
        if self._pending and self._size + txn.size > self._max_bytes:
            done.append(self._close())
        if not self._pending:
            self._opened = now
        self._pending.append(txn)
        self._size += txn.size
        if self._size >= self._max_bytes:
            done.append(self._close())
        return done

    def poll(self, now: datetime) -> Batch | None:
        """The open batch, if it has been open for ``batch_max_seconds``."""
        if (
            self._pending
            and self._opened is not None
            and (now - self._opened).total_seconds() >= self._max_seconds
        ):
            return self._close()
        return None

    def flush(self) -> Batch | None:
        """The open batch regardless of size or age (at shutdown)."""
        return self._close() if self._pending else None

    @property
    def pending_bytes(self) -> int:
        return self._size

    def _close(self) -> Batch:
        batch = Batch(tuple(self._pending), self._size)
        self._pending = []
        self._size = 0
        self._opened = None
        return batch
