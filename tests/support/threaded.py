"""Run a test server's event loop in a daemon thread, so it does not share the loop under test."""

from __future__ import annotations

import asyncio
import threading


class ThreadedServer:
    """Mixin for servers with `async start() -> str` and `async close()`."""

    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None

    async def start(self) -> str:
        raise NotImplementedError

    async def close(self) -> None:
        raise NotImplementedError

    def start_in_thread(self, timeout: float = 10.0) -> str:
        """Serve from a daemon thread with its own loop; returns what `start` returns."""
        started = threading.Event()
        result: list = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            try:
                result.append(loop.run_until_complete(self.start()))
            except BaseException as exc:  # surfaced to the caller below
                result.append(exc)
                started.set()
                loop.close()
                return
            started.set()
            loop.run_forever()
            loop.run_until_complete(self.close())
            loop.close()

        self._thread = threading.Thread(target=run, name=type(self).__name__, daemon=True)
        self._thread.start()
        if not started.wait(timeout):
            raise RuntimeError(f"{type(self).__name__} did not start in time")
        if isinstance(result[0], BaseException):
            raise result[0]
        return result[0]

    def stop(self, timeout: float = 10.0) -> None:
        """Stop a server started with `start_in_thread`."""
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)
            self._thread = None
            self._loop = None

    def __enter__(self):
        self.start_in_thread()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
