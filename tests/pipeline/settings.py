"""Pipeline settings for tests that choose pgoutput's wire options.

``pgcdc pipeline run`` has no keys for pgoutput's binary format or two-phase decoding yet; the
receiver has (``ReceiverOptions.binary``, ``.two_phase``). This subclass sets them and is
otherwise the real pipeline: it is pickled into the receiver's child process, which imports it
from here.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pgcdc.lsn import LSN
from pgcdc.pipeline import Settings
from pgcdc.receiver import ReceiverOptions


@dataclass(frozen=True)
class WireSettings(Settings):
    binary: bool = False
    two_phase: bool = False

    def receiver(self, end_lsn: LSN | None = None) -> ReceiverOptions:
        return replace(super().receiver(end_lsn), binary=self.binary, two_phase=self.two_phase)
