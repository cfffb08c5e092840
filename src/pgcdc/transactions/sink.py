"""Where committed transactions go: the durable change log, or one of the CLI's output files.

The receiver needs three things of any destination, and nothing more: append a transaction
(refusing one it already holds, since the server may send a transaction again after a
restart), make everything appended durable, and say how far it already got, so that the slot
is confirmed only up to what is safely stored and a restart resumes right after it.
``pgcdc.changelog.ChangeLogWriter`` is one.

The rows of pgoutput changes are ``EncodedRow``s whose bytes the decoder did not check beyond
their column count: whether a row is readable is checked once for the batch that holds it, by
whoever consumes it. A sink that reads values gets a ``DecodeError`` from a malformed row; one
that keeps the bytes must check them before it keeps them, as ``ChangeLogWriter`` does for each
batch it writes (``pgcdc.decoding.columnar.first_unreadable_row``).

A sink that says ``accepts_row_runs = True`` may find ``RowRun`` events among a transaction's
events: each stands for ``len(run)`` consecutive changes (and positions), its rows as bytes.
"""

from __future__ import annotations

from typing import Protocol

from pgcdc.lsn import LSN
from pgcdc.transactions.model import CommittedTransaction


class TransactionSink(Protocol):
    @property
    def last_commit_lsn(self) -> LSN:
        """The highest commit LSN appended so far (durable or not); 0/0 when empty."""
        ...

    def append(self, txn: CommittedTransaction) -> bool:
        """Store ``txn``; False (and nothing stored) when its commit LSN is not above
        ``last_commit_lsn``."""
        ...

    def flush(self) -> LSN:
        """Make every appended transaction durable; return the end LSN of the last durable
        transaction (the position the slot may be confirmed to)."""
        ...
