"""The pgcdc command with failing fsyncs in its change log, for the fsync-failure test.

``python -m tests.faults.fsync_failure_child SHADOW LOG_DIR FAILING ERRNO PGCDC_ARGS...``: the
FAILING-th fsync of a file under LOG_DIR loses what was written since that file's last good
fsync and raises ``OSError(ERRNO)`` (see ``tests.faults.powercut.fail_fsync``); FAILING 0 runs
plainly. Segments are small, so that they are sealed and new ones started, both fsync'd.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pgcdc.changelog import ChangeLog, ChangeLogWriter
from pgcdc.cli.main import main

from .powercut import fail_fsync
from .powercut_child import SEGMENT_BYTES

if __name__ == "__main__":
    shadow, root, failing, code, *argv = sys.argv[1:]
    if int(failing):
        fail_fsync(Path(shadow), root, int(failing), int(code))
    # Small segments for the command's log (the writer may be compiled: its defaults are fixed).
    opened = ChangeLog.writer

    def small_segments(log: ChangeLog, **options: Any) -> ChangeLogWriter:
        return opened(log, **{"segment_bytes": SEGMENT_BYTES, **options})

    ChangeLog.writer = small_segments  # type: ignore[method-assign,assignment]
    sys.exit(main(argv))
