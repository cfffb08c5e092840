"""The receiver in a child process, so it does not share the Spark driver's GIL.

In one process the receiver's decoding and the ``foreachBatch`` work (Arrow, Delta) take
turns on one GIL; at 2M changes the receiver then ran at a third of its own speed. The child
runs ``pgcdc.pipeline.receive`` and sends back, over one pipe, its log records and at the end
its progress or its error (the same exception type, with the child's traceback as a note).

Stopping: the parent says so on a second pipe; the child ignores SIGINT (a terminal's Ctrl-C
reaches the whole process group, and the parent decides), treats SIGTERM as a stop request,
and stops on its own when the parent dies (that pipe ends): a killed driver must not leave a
receiver holding the slot and the change log's writer lock. A stop flushes and confirms first.
SIGUSR1 makes the child print every thread's stack to its stderr (``dump_stacks``), to see
where a receiver that seems stuck waits.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

import pgcdc
from pgcdc.errors import ReceiverProcessError, portable, storage_error
from pgcdc.lsn import LSN
from pgcdc.receiver import ReceiverProgress
from pgcdc.runtime import freeze_imports, tune_environment

if TYPE_CHECKING:
    from pgcdc.pipeline import Settings

log = logging.getLogger(__name__)

# The child's program: not ``-m`` (the package imports this module first, and what the child
# pickles must name pgcdc.pipeline.process, not __main__).
_CHILD = (
    "import sys; from multiprocessing.connection import Connection; "
    "from pgcdc.pipeline.process import _child; "
    "_child(Connection(int(sys.argv[1])), Connection(int(sys.argv[2])))"
)
# After the parent died, how long the child may take to flush before it exits regardless.
ORPHAN_EXIT_SECONDS = 10.0


class _PipeHandler(logging.Handler):
    """Sends the child's log records to the parent, formatted (their args may not pickle)."""

    def __init__(self, conn: Connection, lock: threading.Lock) -> None:
        super().__init__()
        self._conn = conn
        self._lock = lock

    def emit(self, record: logging.LogRecord) -> None:
        try:
            record.msg = record.getMessage()
            record.args = None
            if record.exc_info:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
                record.exc_info = None
            with self._lock:
                self._conn.send(("log", record))
        except Exception:
            self.handleError(record)


def _child(messages: Connection, control: Connection) -> None:
    """The child: read the arguments, receive, then send ("done", progress) or ("error", ...).
    Anything more on ``control`` (or its end: the parent is gone) is the stop request."""
    from pgcdc.pipeline import receive

    settings, end_lsn, level = control.recv()
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    lock = threading.Lock()
    root = logging.getLogger()
    root.handlers = [_PipeHandler(messages, lock)]
    root.setLevel(level)

    def watch_parent() -> None:
        try:
            control.recv()
        except (EOFError, OSError):
            # The parent died. Flushing now is a courtesy, not a duty: never outlive it long.
            timer = threading.Timer(ORPHAN_EXIT_SECONDS, os._exit, (1,))
            timer.daemon = True
            timer.start()
        stop.set()

    threading.Thread(target=watch_parent, name="pgcdc-stop", daemon=True).start()
    freeze_imports()
    try:
        progress = receive(settings, end_lsn, stop)
    except BaseException as exc:
        text = "".join(traceback.format_exception(exc))
        if isinstance(exc, OSError):  # its filename does not survive the pipe: say it here
            exc = storage_error(exc)
        with lock:
            messages.send(("error", portable(exc), text))
        return
    with lock:
        messages.send(("done", progress))


class ReceiverProcess:
    """``receive(settings, end_lsn, stop)`` in a child process, watched from this one.

    ``error`` holds what the child raised (re-raise it in the caller), ``progress`` what it
    returned; ``stop()`` asks it to flush and exit. The child is a new interpreter running
    ``_child``, not a multiprocessing spawn: that one re-imports the caller's main module in
    the child (a script without a main guard would run again; the bench's main imports Spark).
    """

    def __init__(self, settings: Settings, end_lsn: LSN | None) -> None:
        self._arguments = (settings, end_lsn, logging.getLogger("pgcdc").getEffectiveLevel())
        self._process: subprocess.Popen[bytes] | None = None
        self._control: Connection | None = None
        self._messages: Connection | None = None
        self._collector = threading.Thread(
            target=self._collect, name="pgcdc-receiver-pipe", daemon=True
        )
        self.error: BaseException | None = None
        self.progress: ReceiverProgress | None = None

    def start(self) -> None:
        messages_read, messages_write = os.pipe()
        control_read, control_write = os.pipe()
        package_root = str(Path(pgcdc.__file__).resolve().parents[1])
        env = dict(os.environ)
        tune_environment(env)  # also when the pipeline runs in a caller's process
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-c", _CHILD, str(messages_write), str(control_read)],
                pass_fds=(messages_write, control_read),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        finally:
            os.close(messages_write)
            os.close(control_read)
        self._messages = Connection(messages_read)
        self._control = Connection(control_write)
        self._control.send(self._arguments)
        self._collector.start()

    def _collect(self) -> None:
        assert self._messages is not None and self._process is not None
        while True:
            try:
                message = self._messages.recv()
            except (EOFError, OSError):
                break
            except Exception as exc:  # a message that does not unpickle here
                self.error = ReceiverProcessError(f"a message from the receiver process: {exc}")
                continue
            if message[0] == "log":
                record: logging.LogRecord = message[1]
                logging.getLogger(record.name).handle(record)
            elif message[0] == "done":
                self.progress = message[1]
            else:
                _, (rebuild, args), text = message
                error = rebuild(*args)
                error.add_note(f"raised in the receiver process:\n{text}")
                self.error = error
        self._messages.close()
        code = self._process.wait()
        if self.error is None and self.progress is None:
            self.error = ReceiverProcessError(
                f"the receiver process exited with code {code} before it reported its result"
            )

    def is_alive(self) -> bool:
        return self._collector.is_alive()

    def dump_stacks(self) -> None:
        """Have the child print every thread's stack to its stderr (shared with ours)."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGUSR1)

    def join(self, timeout: float | None = None) -> None:
        self._collector.join(timeout)

    def stop(self) -> None:
        if self._control is not None and not self._control.closed:
            with contextlib.suppress(OSError):
                self._control.send("stop")
            self._control.close()


__all__ = ["ReceiverProcess"]
