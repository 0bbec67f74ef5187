"""A TCP proxy in front of the real Redis that can hold one command on its way: for tests of
another client's write landing between two commands of a piece of code that makes no outside
call in between (no model request to hold), with no patching of the code.

    gate = RedisGate(redis_url)
    url = await gate.start()          # give `url` to the code under test
    gate.hold(b"some bytes of the command")
    ... await gate.held.wait(); <the other write>; gate.release.set() ...
    gate.cut() ... gate.mend()        # Redis unreachable meanwhile (a held command is lost)
    await gate.close()
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit


class RedisGate:
    """Forwards bytes both ways; the first client-to-Redis chunk containing the held pattern
    waits for `release` (its connection only: other connections go on)."""

    def __init__(self, redis_url: str) -> None:
        self.redis_url = redis_url
        parts = urlsplit(redis_url)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 6379)
        self.pattern: bytes | None = None
        self.held, self.release = asyncio.Event(), asyncio.Event()
        self.refusing = False
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> str:
        """Listen on a free local port; the Redis URL through the gate."""
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        parts = urlsplit(self.redis_url)
        netloc = parts.netloc.rsplit("@", 1)
        host = f"127.0.0.1:{port}"
        netloc = f"{netloc[0]}@{host}" if len(netloc) == 2 else host
        return urlunsplit(parts._replace(netloc=netloc))

    def hold(self, pattern: bytes) -> None:
        """Hold the next command whose bytes contain `pattern` until `release` is set."""
        self.pattern = pattern
        self.held.clear()
        self.release.clear()

    def cut(self) -> None:
        """Redis unreachable: every connection closed, new ones closed at once, a held command
        dropped, until `mend`."""
        self.refusing = True
        for writer in list(self._writers):
            writer.close()
        self.release.set()

    def mend(self) -> None:
        self.refusing = False

    async def close(self) -> None:
        self.release.set()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await task

    async def _connection(
        self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        if self.refusing:
            client_writer.close()
            return
        redis_reader, redis_writer = await asyncio.open_connection(*self.upstream)
        self._writers.update((client_writer, redis_writer))
        pumps = [
            asyncio.create_task(self._pump(client_reader, redis_writer, gated=True)),
            asyncio.create_task(self._pump(redis_reader, client_writer, gated=False)),
        ]
        self._tasks.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
                self._tasks.discard(pump)
            for writer in (client_writer, redis_writer):
                self._writers.discard(writer)
                writer.close()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, gated: bool
    ) -> None:
        tail = b""
        while chunk := await reader.read(65536):
            if gated and self.pattern is not None and self.pattern in tail + chunk:
                self.pattern = None
                self.held.set()
                await self.release.wait()
                if self.refusing:
                    return
            tail = chunk[-256:]
            writer.write(chunk)
            await writer.drain()
