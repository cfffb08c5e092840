"""A receiver process for the power-cut test: streams slot ``s`` into a change log.

``python -m tests.faults.powercut_child CONNINFO LOG_DIR SHADOW CUT [END_LSN]``: with CUT > 0
the fsyncs under LOG_DIR are recorded in SHADOW and the process kills itself just before the
CUT-th one (see ``tests.faults.powercut``); CUT 0 runs plainly. Small segments and frames, so
that segments are created, sealed and rolled, and large transactions span several frames.
"""

from __future__ import annotations

import sys
from pathlib import Path

from pgcdc.changelog import ChangeLogWriter
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions

from .powercut import install

SEGMENT_BYTES = 48 << 10
FRAME_BYTES = 16 << 10


def main(conninfo: str, root: str, shadow: str, cut: int, end_lsn: str | None) -> None:
    if cut:
        install(Path(shadow), root, cut)
    options = ReceiverOptions(
        conninfo,
        "s",
        publications=("pub",),
        fsync_interval=0.02,
        status_interval=1.0,
        end_lsn=LSN(int(end_lsn)) if end_lsn else None,
    )
    with ChangeLogWriter(
        root, segment_bytes=SEGMENT_BYTES, frame_bytes=FRAME_BYTES, compression=None
    ) as writer:
        progress = Receiver(options, writer).run()
    print("done", progress.transactions, progress.duplicates, flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0], args[1], args[2], int(args[3]), args[4] if len(args) > 4 else None)
