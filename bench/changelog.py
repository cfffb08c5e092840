"""Change log throughput: rows/s appended and flushed, next to a baseline from the same run.

Baseline: encoding the same transactions into one Arrow batch in memory (codec only, no
framing, compression, files or fsync), so the figure shows what durability and framing cost.
Rows are tuples (encoded to TupleData once) and, as the receiver logs them, ``EncodedRow``s
(whose bytes are stored as they are).

    python3 bench/changelog.py [transactions] [rows per transaction] [flush every]
"""

from __future__ import annotations

import sys
import tempfile
import time

from pgcdc.changelog import ChangeLog, encode
from pgcdc.events import Column, EncodedRow, Insert, Table
from pgcdc.lsn import LSN
from pgcdc.transactions import CommittedTransaction

TABLE = Table("public", "bench", (Column("id", 23, is_key=True), Column("pad", 25)), oid=1)


def transactions(count: int, rows: int, encoded: bool = False) -> list[CommittedTransaction]:
    row = EncodedRow.from_values if encoded else tuple
    return [
        CommittedTransaction(
            n,
            LSN(1000 + n * 1000),
            LSN(1000 + n * 1000 + 8),
            None,
            tuple(Insert(LSN(n * 1000 + i), TABLE, row((str(i), "x" * 100))) for i in range(rows)),
        )
        for n in range(count)
    ]


def measure(txns: list[CommittedTransaction], total: int, every: int) -> tuple[float, ...]:
    """(encode-only rows/s, append+flush rows/s, read rows/s, bytes per row)."""
    start = time.perf_counter()
    encode(txns)
    baseline = total / (time.perf_counter() - start)
    with tempfile.TemporaryDirectory() as root:
        log = ChangeLog(root)
        start = time.perf_counter()
        with log.writer() as writer:
            for i, txn in enumerate(txns, 1):
                writer.append(txn)
                if i % every == 0:
                    writer.flush()
        logged = total / (time.perf_counter() - start)
        size = sum(s.size for s in log.segments())
        start = time.perf_counter()
        read = sum(b.num_rows for s in log.segments() for b in log.read_segment(s.path))
        reading = read / (time.perf_counter() - start)
    return baseline, logged, reading, size / total


def main() -> None:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 2000
    rows = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    every = int(sys.argv[3]) if len(sys.argv) > 3 else 100
    total = count * rows
    print(f"{count} transactions x {rows} rows, flush every {every}")
    for name, encoded in (("tuple rows", False), ("EncodedRows", True)):
        baseline, logged, reading, per_row = measure(
            transactions(count, rows, encoded), total, every
        )
        print(f"{name}: {per_row:.1f} B/row")
        print(f"  baseline encode only        : {baseline:12,.0f} rows/s")
        print(f"  append + flush (fsync)      : {logged:12,.0f} rows/s ({logged / baseline:.2f}x)")
        print(f"  read_segment (Arrow batches): {reading:12,.0f} rows/s")


if __name__ == "__main__":
    main()
