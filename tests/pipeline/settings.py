"""Pipeline settings for tests that decode two-phase transactions at PREPARE.

``pgcdc pipeline run`` has no key for pgoutput's two-phase decoding yet (``[source] binary`` it
has); the receiver has (``ReceiverOptions.two_phase``). This subclass sets it and is otherwise
the real pipeline: it is pickled into the receiver's child process, which imports it from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pgcdc.lsn import LSN
from pgcdc.pipeline import Settings
from pgcdc.receiver import ReceiverOptions


@dataclass(frozen=True)
class WireSettings(Settings):
    two_phase: bool = False

    def receiver(self, end_lsn: LSN | None = None) -> ReceiverOptions:
        return replace(super().receiver(end_lsn), two_phase=self.two_phase)
