"""Pieces the high-availability tests share: a conninfo naming several servers, and the
pipeline run in a thread while a test fails servers over under it."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from pgcdc import pipeline


def multi_host(*ports: int) -> str:
    """A conninfo naming every server; libpq picks the one that is primary."""
    return (
        f"host={','.join(['127.0.0.1'] * len(ports))} port={','.join(map(str, ports))} "
        "user=postgres password=pgcdc-local dbname=postgres target_session_attrs=primary "
        "connect_timeout=5"
    )


@contextlib.contextmanager
def pipeline_running(
    settings: pipeline.Settings, spark: Any
) -> Iterator[tuple[threading.Thread, list[BaseException]]]:
    """``pipeline.run`` in a thread for the block's length: the thread and the error it ended
    with (empty while it runs); stopped and joined after the block."""
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            pipeline.run(settings, stop=stop, spark=spark, tick_seconds=0.2)
        except BaseException as error:
            failure.append(error)

    runner = threading.Thread(target=run, name="pipeline")
    runner.start()
    try:
        yield runner, failure
    finally:
        stop.set()
        runner.join(120)
