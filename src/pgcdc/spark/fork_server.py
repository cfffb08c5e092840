"""A fork server for a local Spark session's Python processes: one interpreter that imports
pyspark and pgcdc's read path once, then forks a child for each process Spark starts.

A streaming query makes Spark start Python processes one after the other (the data source's
lookup and creation, read planning, the streaming source runner, the workers' daemon), each a
new interpreter importing pyspark, numpy, pyarrow and pgcdc before doing anything, on the
query's critical path and on the cores the receiver needs. A child forked from this server has
all of that imported already. Spark still starts a process, ``pgcdc.spark.fork_client``, which
hands the server its standard streams and waits for the child in its place.

A child must be the process ``python`` would have been, so the server declines (the client then
starts the interpreter itself) unless the request names this interpreter, ``-m MODULE``, this
directory, and an environment equal to the one this server started with, except for what Spark
sets per process and pyspark reads as it runs (``RUNTIME_VARIABLES``), which the child takes.

    python -m pgcdc.spark.fork_server SOCKET
The server stops taking requests when its standard input (a pipe from the driver) closes, and
exits once the children it started have ended.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import runpy
import selectors
import signal
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from pgcdc.spark import fork_client

# What the processes of a query import: loaded once here, before any fork. Not the modules
# they run (``pyspark.daemon``, which ``pgcdc.spark.daemon`` runs too): Python warns when a
# module it is asked to run as ``__main__`` was imported already.
PRELOADED = (
    "pyspark.worker",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pgcdc.spark.daemon",
    "pgcdc.spark.source",
    "pgcdc.spark.source_runner",
)
# Environment variables Spark sets per process, read by pyspark as it runs, not as it imports:
# a request may differ from the server in these, and its child takes the request's values.
# OMP_NUM_THREADS (set for task workers only) sizes thread pools and ARROW_DEFAULT_MEMORY_POOL
# (``spark.executorEnv``, not given to the data source lookup at session start) picks an
# allocator: a child keeps the server's. The wrapper script's shell keeps its own PWD (and,
# where /bin/sh is bash, SHLVL and _).
RUNTIME_PREFIXES = (b"SPARK_", b"PYSPARK_", b"_PYSPARK_", b"PYTHON_WORKER_FACTORY_",
                    b"PYTHON_UDF_", b"PYTHON_DAEMON_")  # fmt: skip
RUNTIME_VARIABLES = frozenset(
    {b"OMP_NUM_THREADS", b"ARROW_DEFAULT_MEMORY_POOL", b"PWD", b"OLDPWD", b"SHLVL", b"_"}
)
_REQUEST_TIMEOUT = 5.0  # seconds a connected client may take to send its request


def comparable(env: Mapping[bytes, bytes]) -> dict[bytes, bytes]:
    """``env`` without the per-process variables, and ``PYTHONPATH`` as the path it makes:
    without empty entries and repeats (Spark repeats its own entries for the data source
    lookup), absent when nothing is left."""
    kept = {
        name: value
        for name, value in env.items()
        if name not in RUNTIME_VARIABLES and not name.startswith(RUNTIME_PREFIXES)
    }
    entries = dict.fromkeys(e for e in kept.pop(b"PYTHONPATH", b"").split(b":") if e)
    if entries:
        kept[b"PYTHONPATH"] = b":".join(entries)
    return kept


@dataclass(frozen=True)
class Request:
    """A process to start: ``python ARGS`` in ``cwd`` with ``env``, on ``streams`` (fds)."""

    python: str
    cwd: str
    args: list[str]
    env: dict[bytes, bytes]
    streams: list[int]

    def module(self) -> str | None:
        """The module of ``-m MODULE ...``, the only form a child runs."""
        return self.args[1] if len(self.args) >= 2 and self.args[0] == "-m" else None


def accepts(request: Request, env: Mapping[bytes, bytes], cwd: str) -> bool:
    """Whether a child forked from a server with ``env`` in ``cwd`` is the process the request
    would have started."""
    return (
        request.module() is not None
        and request.python == sys.executable
        and request.cwd == cwd
        and len(request.streams) == len(fork_client.STREAMS)
        and comparable(request.env) == comparable(env)
    )


def _receive(conn: socket.socket) -> Request | None:
    """The request a client sent on ``conn``; None (its streams closed) if it is malformed."""
    conn.settimeout(_REQUEST_TIMEOUT)
    fds: list[int] = []
    try:
        head, fds, _flags, _address = socket.recv_fds(conn, 4, len(fork_client.STREAMS))
        size = int.from_bytes(head, "big") if len(head) == 4 else -1
        body = fork_client.receive_exactly(conn, size) if size >= 0 else b""
        if len(body) != size:
            raise ConnectionError("the client sent a short request")
        python, cwd, args, env = fork_client.decode_request(body)
        return Request(python, cwd, args, env, list(fds))
    except (OSError, ValueError, IndexError):
        for fd in fds:
            os.close(fd)
        return None
    finally:
        conn.settimeout(None)


class _Server:
    """The accept-fork-reap loop. Single-threaded, so forking is safe."""

    def __init__(self, path: str) -> None:
        self.env = dict(os.environb)
        self.cwd = os.getcwd()
        self.path = path
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}
        self.reaped, woken = os.pipe()
        os.set_blocking(woken, False)
        self.woken = woken
        signal.set_wakeup_fd(woken)
        signal.signal(signal.SIGCHLD, lambda _number, _frame: None)
        self.listener: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.listener.bind(path)
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ, "accept")
        self.selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "driver")
        self.selector.register(self.reaped, selectors.EVENT_READ, "reap")

    def serve(self) -> Request | None:
        """Serve until done (None), or return in a forked child the request it runs."""
        while self.listener is not None or self.children:
            for key, _events in self.selector.select():
                if key.data == "accept":
                    child = self._accept()
                    if child is not None:
                        return child
                elif key.data == "driver":
                    if not os.read(sys.stdin.fileno(), 512):
                        self._stop_accepting()
                elif key.data == "reap":
                    os.read(self.reaped, 512)
                    self._reap()
                else:  # the client of a running child ended first: so does the child
                    self._client_gone(key.data)
        return None

    def _accept(self) -> Request | None:
        assert self.listener is not None
        conn, _address = self.listener.accept()
        request = _receive(conn)
        if request is None or not accepts(request, self.env, self.cwd):
            with contextlib.suppress(OSError):
                conn.sendall(fork_client.DECLINED)
            conn.close()
            for fd in request.streams if request else ():
                os.close(fd)
            return None
        pid = os.fork()
        if pid == 0:
            self._become_child(conn)
            return request
        for fd in request.streams:
            os.close(fd)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)
        with contextlib.suppress(OSError):
            conn.sendall(fork_client.reply(fork_client.STARTED, pid))
        return None

    def _become_child(self, conn: socket.socket) -> None:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        self.selector.close()
        for sock in (conn, self.listener, *self.children.values()):
            if sock is not None:
                sock.close()
        os.close(self.reaped)
        os.close(self.woken)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(KeyError):  # not when its client went first
                    self.selector.unregister(conn)
                with contextlib.suppress(OSError):
                    conn.sendall(fork_client.reply(fork_client.ENDED, status))
                conn.close()

    def _client_gone(self, pid: int) -> None:
        conn = self.children.get(pid)
        if conn is None:
            return  # reaped in the same round
        with contextlib.suppress(OSError):
            if conn.recv(1):
                return  # clients send nothing after the request: ignore it
        self.selector.unregister(conn)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)

    def _stop_accepting(self) -> None:
        self.selector.unregister(sys.stdin.fileno())
        if self.listener is not None:
            self.selector.unregister(self.listener)
            self.listener.close()
            self.listener = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)


def _run(request: Request) -> None:
    """In a forked child: become ``python -m MODULE ARGS`` on the request's streams."""
    for target, fd in zip(fork_client.STREAMS, request.streams, strict=True):
        if fd != target:
            os.dup2(fd, target)
    for fd in request.streams:
        if fd not in fork_client.STREAMS:
            os.close(fd)
    os.environb.clear()
    os.environb.update(request.env)
    module = request.module()
    assert module is not None
    sys.argv = ["-m", *request.args[2:]]
    sys.modules.pop(module, None)  # run as ``__main__``, not the copy imported here
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def main(argv: list[str]) -> None:
    (path,) = argv
    for name in PRELOADED:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    gc.collect()
    gc.freeze()  # children then leave the imported objects' pages shared
    try:
        server = _Server(path)
    except OSError as error:
        print(f"pgcdc: no fork server on {path} ({error}): Spark's Python processes start "
              "interpreters of their own", file=sys.stderr)  # fmt: skip
        sys.exit(1)
    request = server.serve()
    if request is not None:
        _run(request)


@dataclass
class ForkServer:
    """A running fork server: its pid, and the pipe that is its standard input."""

    pid: int
    control: int | None

    def stop(self) -> None:
        """Stop its taking requests; it exits once the children it started have ended."""
        if self.control is not None:
            os.close(self.control)
            self.control = None


def start(path: str, env: Mapping[str, str]) -> ForkServer:
    """A fork server listening on ``path`` with ``env``, in a session of its own (like the JVM
    whose processes it starts). Spawned rather than a ``subprocess.Popen``: it outlives the
    driver's interpreter by design, until the processes it started end."""
    read, write = os.pipe()
    pid = os.posix_spawn(
        sys.executable,
        [sys.executable, "-m", __name__, path],
        {os.fsencode(k): os.fsencode(v) for k, v in env.items()},
        file_actions=[
            (os.POSIX_SPAWN_DUP2, read, 0),
            (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
        ],
        setsid=True,
    )
    os.close(read)
    return ForkServer(pid, write)


if __name__ == "__main__":
    main(sys.argv[1:])
