"""Transaction assembly: the decoded event stream in, whole committed transactions out."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from pgcdc.events import Event
from pgcdc.lsn import LSN


@dataclass(frozen=True, slots=True)
class CommittedTransaction:
    """One committed (or, when asked, prepared) transaction, in the order it was decoded.

    ``events`` holds its Relation, Type, Insert, Update, Delete, Truncate and transactional
    Message events, in order; their position in it is their sequence within the transaction.
    It may be backed by a spill file, so iterate it rather than index it. A non-transactional
    Message travels alone, as a transaction with ``xid`` None and ``commit_lsn`` at its LSN.
    """

    xid: int | None
    commit_lsn: LSN
    end_lsn: LSN
    commit_time: datetime | None
    events: Iterable[Event]
    origin: str | None = None
    origin_lsn: LSN | None = None
    # Set when emitted at PREPARE (two-phase with emit-at-prepare); None for a plain commit.
    gid: str | None = None
