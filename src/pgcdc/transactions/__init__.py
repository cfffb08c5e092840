"""Transaction assembly: the decoded event stream in, whole committed transactions out."""

from __future__ import annotations

from pgcdc.transactions.assembler import TransactionAssembler
from pgcdc.transactions.batching import Batch, TransactionBatcher
from pgcdc.transactions.model import CommittedTransaction, TransactionOutcome
from pgcdc.transactions.options import AssemblyOptions
from pgcdc.transactions.session import ReplicationSession
from pgcdc.transactions.sink import TransactionSink
from pgcdc.transactions.spill import SpilledEvents

__all__ = [
    "AssemblyOptions",
    "Batch",
    "CommittedTransaction",
    "ReplicationSession",
    "SpilledEvents",
    "TransactionAssembler",
    "TransactionBatcher",
    "TransactionOutcome",
    "TransactionSink",
]
