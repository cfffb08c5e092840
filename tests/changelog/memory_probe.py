"""Measures the memory one large streamed transaction costs the writer (run in its own process).

``python -m tests.changelog.memory_probe ROOT ROWS`` prints JSON: the transaction's raw size,
the Python heap peak (tracemalloc) and the Arrow pool peak while appending and flushing it.
"""

from __future__ import annotations

import json
import sys
import tracemalloc
from collections.abc import Iterator

import pyarrow as pa

from pgcdc.changelog import ChangeLogWriter
from pgcdc.events import Event, Insert
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction

from .helpers import TABLE

VALUE = "x" * 150


def events(rows: int) -> Iterator[Event]:
    """Rows made on the fly, as a spill file would hand them out."""
    for i in range(rows):
        yield Insert(LSN(0x1000 + i), TABLE, (str(i), VALUE, f"{i:08d}".encode()))


def main(root: str, rows: int) -> None:
    raw = rows * (len(VALUE) + 8 + len(str(rows)))
    txn = CommittedTransaction(7, LSN(1 << 32), LSN((1 << 32) + 8), None, events(rows))
    tracemalloc.start()
    with ChangeLogWriter(root, frame_bytes=1 << 20) as writer:
        writer.append(txn)
        writer.flush()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(
        json.dumps(
            {"raw": raw, "python_peak": peak, "arrow_peak": pa.default_memory_pool().max_memory()}
        )
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
