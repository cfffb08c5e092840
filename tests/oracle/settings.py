"""Pipeline settings for the oracle's binary run.

``pgcdc pipeline run`` has no flag for pgoutput's binary format yet; the receiver has
(``ReceiverOptions.binary``). This subclass turns it on and is otherwise the real pipeline: it
is pickled into the receiver's child process, which imports it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pgcdc.lsn import LSN
from pgcdc.pipeline import Settings
from pgcdc.receiver import ReceiverOptions


@dataclass(frozen=True)
class BinarySettings(Settings):
    def receiver(self, end_lsn: LSN | None = None) -> ReceiverOptions:
        return replace(super().receiver(end_lsn), binary=True)
