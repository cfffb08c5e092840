"""A real writer process for the crash tests: appends the reproducible stream until killed.

Run as ``python -m tests.changelog.crash_child ROOT``; prints "durable <end_lsn>" after each
flush, so the parent knows what the log promised before it sends SIGKILL.
"""

from __future__ import annotations

import sys

from pgcdc.changelog import ChangeLogWriter

from .helpers import crash_rows, number_of, transaction

OPTIONS = {"segment_bytes": 40_000, "frame_bytes": 3_000}


def main(root: str) -> None:
    with ChangeLogWriter(root, **OPTIONS) as writer:  # type: ignore[arg-type]
        number = number_of(writer.last_commit_lsn) + 1 if writer.last_commit_lsn else 1
        while True:
            writer.append(transaction(number, crash_rows(number)))
            if number % 3 == 0:
                print("durable", int(writer.flush()), flush=True)
            number += 1


if __name__ == "__main__":
    main(sys.argv[1])
