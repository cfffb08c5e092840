"""Stand-in for one of a local Spark session's Python processes: asks the session's fork server
(``pgcdc.spark.fork_server``) for a child that runs the process, then waits for it and exits as
it exits. Spark sees this process: its signals reach the child and the child's exit status
becomes its own. When the server is gone or declines, the interpreter starts as it would have.

The local wrapper script (``pgcdc.spark.local_python``) runs this file by path with ``-I -S``,
so it imports the standard library only; the server imports its message format from here.

    python -I -S fork_client.py SOCKET PYTHON ARG...
"""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys
import time

# The standard streams the child takes over: it reads and writes the pipes Spark gave this one.
STREAMS = (0, 1, 2)
DECLINED = b"N"  # run it yourself
STARTED = b"P"  # followed by the child's pid
ENDED = b"S"  # followed by the child's wait status
_INT = struct.Struct("!i")
# What Spark (or a user) may send the process; the child is told instead.
RELAYED_SIGNALS = (
    signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
)  # fmt: skip


def encode_request(python: str, cwd: str, args: list[str], env: dict[bytes, bytes]) -> bytes:
    """The request's body: NUL-separated interpreter, directory, argument count, arguments and
    ``NAME=value`` environment entries (bytes as the OS gives them)."""
    fields = [os.fsencode(python), os.fsencode(cwd), str(len(args)).encode()]
    fields += [os.fsencode(arg) for arg in args]
    fields += [name + b"=" + value for name, value in env.items()]
    return b"\0".join(fields)


def decode_request(body: bytes) -> tuple[str, str, list[str], dict[bytes, bytes]]:
    fields = body.split(b"\0")
    python, cwd, count = os.fsdecode(fields[0]), os.fsdecode(fields[1]), int(fields[2])
    args = [os.fsdecode(arg) for arg in fields[3 : 3 + count]]
    env = dict(entry.split(b"=", 1) for entry in fields[3 + count :] if entry)
    return python, cwd, args, env


def reply(kind: bytes, number: int) -> bytes:
    """A server's reply: ``kind`` and a pid or wait status."""
    return kind + _INT.pack(number)


def receive_exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock``; fewer only if it ends first."""
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _ask(path: str, python: str, args: list[str]) -> tuple[socket.socket, int] | None:
    """The connection and the child's pid, or None when the server declines or is not there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        body = encode_request(python, os.getcwd(), args, dict(os.environb))
        socket.send_fds(sock, [_INT.pack(len(body))], list(STREAMS))
        sock.sendall(body)
        reply = receive_exactly(sock, 1 + _INT.size)
    except OSError:
        sock.close()
        return None
    if len(reply) != 1 + _INT.size or reply[:1] != STARTED:
        sock.close()
        return None
    return sock, _INT.unpack(reply[1:])[0]


def _exit_as(status: int) -> None:
    code = os.waitstatus_to_exitcode(status)  # -N: ended by signal N
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code
    os._exit(code)


def _wait(sock: socket.socket, pid: int) -> None:
    def relay(number: int, _frame: object) -> None:
        try:
            os.kill(pid, number)
        except ProcessLookupError:
            return  # it ended: its status is on the way

    for number in RELAYED_SIGNALS:
        signal.signal(number, relay)
    try:
        reply = receive_exactly(sock, 1 + _INT.size)
    except OSError:
        reply = b""
    if len(reply) == 1 + _INT.size and reply[:1] == ENDED:
        _exit_as(_INT.unpack(reply[1:])[0])
    # The server ended first (its driver is gone): its status cannot be known; outlive it.
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            os._exit(1)
        time.sleep(0.2)


def main(argv: list[str]) -> None:
    path, python, *args = argv
    asked = _ask(path, python, args)
    if asked is None:
        os.execv(python, [python, *args])
    _wait(*asked)


if __name__ == "__main__":
    main(sys.argv[1:])
