"""Spark's streaming source runner for a local session, quiet when Spark stops it.

A streaming query reads the pgcdc source through one Python process, pyspark's
``python_streaming_source_runner``, which waits on a socket for the JVM's next call. Spark stops
it by closing that socket and killing the process. When the runner sees the socket's end first,
pyspark reports the end (an ``EOFError``) back over the closed socket, fails (a broken pipe) and
prints the traceback of both on the JVM's stderr, which for ``pgcdc pipeline run`` is the user's
terminal: a traceback after a clean Ctrl-C. This module runs the same runner and exits as it
would, without the traceback, in that one case; every other error is reported as pyspark reports
it. The wrapper script of ``pgcdc.spark.local_python`` runs it in place of pyspark's.
"""

from __future__ import annotations

import importlib
import sys

# What the wrapper script replaces (Spark starts the runner as ``python -m <this>``).
PYSPARK_MODULE = "pyspark.sql.streaming.python_streaming_source_runner"

_SOCKET_GONE = (BrokenPipeError, ConnectionResetError)


def closed_by_spark(error: BaseException) -> bool:
    """Whether ``error`` is the runner failing to report the end of its socket: broken-pipe
    errors (the report, then the socket's close) back to an ``EOFError`` (the end)."""
    seen: BaseException | None = error
    while isinstance(seen, _SOCKET_GONE):
        seen = seen.__context__
    return seen is not error and isinstance(seen, EOFError)


def main() -> None:
    pyspark_runner = importlib.import_module(PYSPARK_MODULE)
    try:
        with pyspark_runner.get_sock_file_to_executor(timeout=None) as sock_file:
            pyspark_runner.main(sock_file, sock_file)
    except _SOCKET_GONE as error:
        if not closed_by_spark(error):
            raise
        sys.exit(-1)  # as pyspark's runner exits after reporting an error


if __name__ == "__main__":
    main()
