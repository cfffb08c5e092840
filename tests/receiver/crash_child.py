"""A real receiver process for the crash test: streams slot ``s`` into a change log until killed.

Run as ``python -m tests.receiver.crash_child CONNINFO LOG_DIR DURABLE_FILE [END_LSN]``. After
every flush, and before the receiver may confirm anything, the durable end of the log is written
to DURABLE_FILE, so a reader that samples the slot first and this file second must always find
the slot's confirmed position at or below the file's.
"""

from __future__ import annotations

import os
import sys

from pgcdc.changelog import ChangeLogWriter
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions
from pgcdc.transactions import AssemblyOptions, CommittedTransaction

SEGMENT_BYTES = 2 << 20
FRAME_BYTES = 256 << 10


class RecordingSink:
    """The change log, announcing each durable end before the receiver sees it."""

    def __init__(self, writer: ChangeLogWriter, path: str) -> None:
        self.writer = writer
        self.path = path

    @property
    def last_commit_lsn(self) -> LSN:
        return self.writer.last_commit_lsn

    def append(self, txn: CommittedTransaction) -> bool:
        return self.writer.append(txn)

    def flush(self) -> LSN:
        durable = self.writer.flush()
        temp = f"{self.path}.tmp"
        with open(temp, "w") as out:
            out.write(str(int(durable)))
        os.replace(temp, self.path)
        return durable


def main(conninfo: str, root: str, durable_file: str, end_lsn: str | None) -> None:
    options = ReceiverOptions(
        conninfo,
        "s",
        publications=("pub",),
        proto_version=3,
        streaming="on",
        two_phase=True,
        fsync_interval=0.05,
        status_interval=1.0,
        assembly=AssemblyOptions(max_txn_in_memory=0.5),
        end_lsn=LSN(int(end_lsn)) if end_lsn else None,
    )
    with ChangeLogWriter(root, segment_bytes=SEGMENT_BYTES, frame_bytes=FRAME_BYTES) as writer:
        progress = Receiver(options, RecordingSink(writer, durable_file)).run()
    print("done", progress.transactions, progress.duplicates, flush=True)


if __name__ == "__main__":
    conninfo, root, durable_file = sys.argv[1:4]
    main(conninfo, root, durable_file, sys.argv[4] if len(sys.argv) > 4 else None)
