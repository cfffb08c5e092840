"""A transaction much larger than a frame is streamed to disk, never held in memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pgcdc.changelog import ChangeLog
from pgcdc.changelog.segments import FRAME_HEADER_SIZE, parse_frame_header
from pgcdc.events import decode_tuple_data

from .memory_probe import VALUE

REPO = Path(__file__).resolve().parents[2]
ROWS = 200_000


@pytest.mark.slow
def test_large_transaction_streams_in_bounded_memory(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "tests.changelog.memory_probe", str(tmp_path), str(ROWS)],
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO / "src")},
        capture_output=True,
        text=True,
        check=True,
        timeout=600,
    )
    figures = json.loads(result.stdout)
    assert figures["raw"] > 30 << 20
    # The whole transaction would be raw bytes plus Python objects per value; a bounded writer
    # holds about a frame (1 MiB of values) at a time.
    assert figures["python_peak"] < figures["raw"] / 4, figures
    assert figures["arrow_peak"] < figures["raw"] / 4, figures

    log = ChangeLog(tmp_path)
    (info,) = log.segments()
    frames = []
    with open(info.path, "rb") as f:
        data = f.read()
    offset = data.index(b"PGCF")
    while offset < len(data):
        header = parse_frame_header(data[offset : offset + FRAME_HEADER_SIZE])
        assert header is not None
        frames.append(header)
        offset += FRAME_HEADER_SIZE + header.length
    assert len(frames) > 20
    assert [f.final for f in frames[:-1]] == [False] * (len(frames) - 1) and frames[-1].final
    # Read back batch by batch: every row, in order, exact.
    seen = 0
    for batch in log.read_segment(info.path):
        names = batch.column("new").to_pylist()
        for row in names:
            values = decode_tuple_data(row)  # rows are logged as TupleData bytes
            assert values[0] == str(seen)
            assert values[1] == VALUE
            seen += 1
    assert seen == ROWS
