"""The stream's CopyData reader in C, bound to the libpq psycopg uses.

``_StreamCore.poll_many`` takes each message with psycopg's ``get_copy_data`` and parses its
header in Python: about a dozen objects a message, most of what a busy receiver's transport
costs. ``_copyread.read_copy_data`` (C, built with the package) calls libpq's
``PQgetCopyData`` itself and builds only the XLogData objects, so it needs the addresses of
libpq's functions in the copy of libpq psycopg loaded (its ``PGconn`` belongs to that copy).
They are found once per process: the one libpq mapped into it (``/proc/self/maps``), opened
again with ctypes (which returns the loaded copy). Without the extension, with
``PGCDC_PURE_PYTHON`` set, off Linux, or with more than one libpq in the process, there is no
reader and ``poll_many`` takes the Python path: the same messages, more slowly
(``tests/connection/test_copyread.py`` checks the two agree).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from psycopg import pq

from pgcdc._native import PURE_PYTHON_ENV, is_stale
from pgcdc.connection.protocol import MAX_SEND_TIME, MIN_SEND_TIME, XLogData
from pgcdc.lsn import LSN


def _load() -> Any:
    try:
        return importlib.import_module("pgcdc.connection._copyread")
    except ImportError:  # built without a C compiler (PGCDC_PURE_PYTHON=1 at install)
        return None


_copyread = _load()

log = logging.getLogger(__name__)

# read(pgconn_ptr, limit, max_size) -> (messages, status, raw): see _copyread.c.
NativeRead = Callable[[int, int, int], tuple[list[Any], int, int]]

# The statuses read_copy_data returns beside its messages.
DRAINED = 0
LIMIT = 1
COPY_ENDED = -1
COPY_FAILED = -2
CONSUME_FAILED = -3


def _libpq_paths(maps: str = "/proc/self/maps") -> set[str]:
    """The files of every libpq mapped into this process."""
    paths = set()
    try:
        with open(maps) as lines:
            for line in lines:
                _, slash, rest = line.rstrip("\n").partition("/")
                name = os.path.basename(rest)
                if slash and name.startswith("libpq") and ".so" in name:
                    paths.add(slash + rest)
    except OSError:
        return set()
    return paths


def _address(function: Any) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value or 0


class _Reader:
    """read_copy_data with libpq's functions bound: ``reader(conn, limit, max_size)``."""

    def __init__(self, get_copy_data: int, free_mem: int, consume_input: int) -> None:
        self._functions = (get_copy_data, free_mem, consume_input)

    def __call__(self, conn: int, limit: int, max_size: int) -> tuple[list[Any], int, int]:
        get_copy_data, free_mem, consume_input = self._functions
        return _copyread.read_copy_data(  # type: ignore[no-any-return]
            conn,
            get_copy_data,
            free_mem,
            consume_input,
            limit,
            max_size,
            XLogData,
            LSN,
            MIN_SEND_TIME,
            MAX_SEND_TIME,
        )


@functools.cache
def native_reader() -> NativeRead | None:
    """The C reader for this process's libpq, or None: the caller then takes the Python path
    (see the module's docstring).

    The caller passes the connection's current ``pgconn_ptr`` on every call, never a kept one:
    psycopg sets it to None once the connection is closed, and the C code must not touch a
    freed connection."""
    if _copyread is None or os.environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
        return None
    if is_stale(Path(__file__).with_name("_copyread.c"), Path(_copyread.__file__ or "")):
        log.warning(
            "pgcdc/connection/_copyread.c changed after its build: the stream is read in Python "
            "until you run `pip install -e .` again"
        )
        return None
    paths = _libpq_paths()
    if len(paths) != 1:
        log.debug("no native CopyData reader: libpq copies mapped: %s", sorted(paths) or "none")
        return None
    try:
        libpq = ctypes.CDLL(paths.pop())
        functions = [
            _address(libpq.PQgetCopyData),
            _address(libpq.PQfreemem),
            _address(libpq.PQconsumeInput),
        ]
        # The one libpq mapped is psycopg's unless psycopg linked its own statically: then
        # at least its version must be psycopg's (the connection's layout is that version's).
        version = libpq.PQlibVersion()
    except (OSError, AttributeError) as exc:
        log.debug("no native CopyData reader: %s", exc)
        return None
    if version != pq.version():
        log.debug(
            "no native CopyData reader: libpq %s mapped, psycopg's is %s", version, pq.version()
        )
        return None
    if not all(functions):
        return None
    return _Reader(*functions)
