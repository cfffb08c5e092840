"""A receiver process for the memory-cap test: drains slot ``big`` into a change log, then prints
its peak RSS (VmHWM, from /proc) in MiB and how many changes it logged.

``python -m tests.changelog.memory_child CONNINFO END_LSN LOG_DIR CAP_MB``
"""

from __future__ import annotations

import sys
from pathlib import Path

from pgcdc.changelog import ChangeLogWriter
from pgcdc.lsn import LSN
from pgcdc.receiver import Receiver, ReceiverOptions
from pgcdc.transactions import AssemblyOptions


def peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def main(conninfo: str, end: int, root: str, cap_mb: float) -> None:
    # As bench/large_transaction.py: a quarter of the cap for buffered events, an eighth of
    # that for any one transaction before it spills (Python objects outweigh their bytes).
    assembly = AssemblyOptions(
        max_txn_in_memory=cap_mb / 8 / 4, max_reorderbuffer_in_memory=cap_mb / 4 / 4
    )
    options = ReceiverOptions(
        conninfo,
        "big",
        publications=("pub",),
        proto_version=2,
        streaming="on",
        end_lsn=LSN(end),
        assembly=assembly,
    )
    with ChangeLogWriter(root, frame_bytes=1 << 20) as sink:
        progress = Receiver(options, sink).run()
    print("changes", progress.changes, flush=True)
    print("peak", peak_rss_mib(), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4]))
