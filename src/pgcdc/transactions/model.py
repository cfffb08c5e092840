"""What transaction assembly produces: whole transactions, and batches of them."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from pgcdc.events import Event
from pgcdc.lsn import LSN


class TransactionOutcome(enum.Enum):
    """What a CommittedTransaction records. Only COMMIT occurs unless ``emit_at_prepare`` is on."""

    COMMIT = "commit"
    # Prepared (two-phase) and emitted at PREPARE: its changes, not yet decided.
    PREPARE = "prepare"
    # The transaction emitted earlier at PREPARE under ``gid`` committed; no events.
    COMMIT_PREPARED = "commit-prepared"
    # The transaction emitted earlier at PREPARE under ``gid`` rolled back: discard it; no events.
    ROLLBACK_PREPARED = "rollback-prepared"


@dataclass(frozen=True, slots=True)
class CommittedTransaction:
    """One committed (or, when asked, prepared) transaction, in the order it was decoded.

    ``events`` holds its Relation, Type, Insert, Update, Delete, Truncate and transactional
    Message events, in order; their position in it is their sequence within the transaction.
    For a sink that accepts them (``TransactionSink``), RowRun events stand for several changes
    and as many positions. It may be backed by a spill file, so iterate it rather than index
    it. A non-transactional Message travels alone, as a transaction with ``xid`` None and
    ``commit_lsn`` at its LSN.
    """

    xid: int | None
    commit_lsn: LSN
    end_lsn: LSN
    commit_time: datetime | None
    events: Iterable[Event]
    origin: str | None = None
    origin_lsn: LSN | None = None
    # Set when emitted at PREPARE (two-phase with emit-at-prepare), and on the COMMIT_PREPARED /
    # ROLLBACK_PREPARED that later settles it; None for a plain commit.
    gid: str | None = None
    outcome: TransactionOutcome = TransactionOutcome.COMMIT
    # Estimated payload bytes of the events (pgcdc.transactions.sizing), for batching.
    size: int = 0
