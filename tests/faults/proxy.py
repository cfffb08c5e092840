"""A TCP proxy on loopback that fails like a network: ``cut()`` resets every connection it
carries, ``black_hole()`` keeps them (and new ones) open but forwards nothing, as a partition
or a firewall dropping state does, so each side sees only silence. Point a conninfo at
``proxy.port`` instead of the server's; the tests' own SQL goes to the server directly.
``black_hole_on(marker)`` makes the partition start as a client sends a given command, so it
strikes a connection that is open and authenticated, waiting for an answer.

One asyncio loop in a daemon thread carries every connection; the methods are called from
the test's thread and return once the loop has applied them.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

_T = TypeVar("_T")
_CHUNK = 1 << 16


class _Link:
    """One client connection and, unless it was black-holed from the start, its upstream."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.writers = [client]
        self.silenced = False
        self.closed = asyncio.Event()

    def close(self, reset: bool) -> None:
        for writer in self.writers:
            sock = writer.get_extra_info("socket")
            if reset and sock is not None:
                # Linger 0: close sends RST, as a dropped route or a killed middlebox does.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            writer.transport.abort()
        self.closed.set()


class TcpProxy:
    """Forwards 127.0.0.1:``port`` to ``host``:``target_port`` until told to fail."""

    def __init__(self, host: str, target_port: int) -> None:
        self.target = (host, target_port)
        self.port = 0
        self.connections = 0  # accepted so far
        self._links: set[_Link] = set()
        self._black_hole = False
        self._trigger: bytes | None = None  # black-hole once a client sends this
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tcp-proxy", daemon=True
        )
        self._server: asyncio.Server | None = None

    def __enter__(self) -> TcpProxy:
        self._thread.start()
        self._server = self._call(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc: object) -> None:
        async def close() -> None:
            assert self._server is not None
            self._server.close()
            for link in list(self._links):
                link.close(reset=False)
            # Let every connection's task see its link closed before the loop stops.
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if others:
                await asyncio.wait(others, timeout=5)

        self._call(close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def cut(self) -> int:
        """Reset every connection now (new ones are forwarded); how many were cut."""

        async def cut() -> int:
            links = list(self._links)
            for link in links:
                link.close(reset=True)
            return len(links)

        return self._call(cut())

    def black_hole(self) -> None:
        """From now on forward nothing, on open connections and on new ones (accepted, then
        left silent): a partition. The connections silenced stay so after ``restore()``."""

        async def silence() -> None:
            self._black_hole = True
            for link in self._links:
                link.silenced = True

        self._call(silence())

    @property
    def silent(self) -> bool:
        """Whether new connections are black-holed now."""
        return self._black_hole

    def black_hole_on(self, marker: bytes) -> None:
        """Black-hole (as ``black_hole``) from the moment a client sends bytes holding
        ``marker`` (a command's text): that chunk is not forwarded either."""

        async def arm() -> None:
            self._trigger = marker

        self._call(arm())

    def _watch(self, data: bytes) -> None:
        """Start the armed black hole if ``data``, from a client, holds its marker."""
        if self._trigger is None or self._trigger not in data:
            return
        self._trigger = None
        self._black_hole = True
        for link in self._links:
            link.silenced = True

    def restore(self) -> None:
        """New connections are forwarded again."""

        async def restore() -> None:
            self._black_hole = False

        self._call(restore())

    def _call(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        self._links.add(link)
        self.connections += 1
        try:
            if self._black_hole:
                link.silenced = True
                await link.closed.wait()
                return
            try:
                upstream_reader, upstream = await asyncio.open_connection(*self.target)
            except OSError:
                link.close(reset=True)
                return
            link.writers.append(upstream)
            await asyncio.gather(
                self._pump(reader, upstream, link, from_client=True),
                self._pump(upstream_reader, writer, link, from_client=False),
            )
        finally:
            self._links.discard(link)

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        link: _Link,
        *,
        from_client: bool,
    ) -> None:
        """Copy one direction until either side closes (then close both); once the link is
        silenced, stop reading and writing until it is closed."""
        try:
            while not link.closed.is_set():
                data = await reader.read(_CHUNK)
                if from_client:
                    self._watch(data)
                if link.silenced:
                    await link.closed.wait()
                    return
                if not data:
                    break
                writer.write(data)
                await writer.drain()
        except OSError:
            pass
        if not link.closed.is_set():
            link.close(reset=False)
