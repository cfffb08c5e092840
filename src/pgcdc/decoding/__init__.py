"""Decoders: output plugin bytes in, ``pgcdc.events`` out. Pure functions of (state, bytes).

Every decoder has the same shape, so the receiver, the CLI and Spark executors can use any of
them: ``decode(payload, lsn)`` returns the events in one XLogData payload (pgoutput and
test_decoding send one message per payload; openGauss batches several), and ``state`` is the
relation and type knowledge accumulated so far, which can be pickled and handed to another
process to continue decoding from the same point.
"""

from __future__ import annotations

from typing import Any, Protocol

from pgcdc.events import Event
from pgcdc.lsn import LSN


class Decoder(Protocol):
    @property
    def state(self) -> Any: ...

    def decode(self, payload: bytes, lsn: LSN) -> list[Event]: ...
