"""Auto-pipelining: the commands that coroutines issue in the same event-loop tick go to Redis
together, as one pipeline on one connection.

Context assembly runs its reads under `asyncio.gather`, and a burst of turns runs hundreds of
reads at once; sent one by one, each would take a pooled connection, a write and a read of its
own. Batched, they share them, and the caller still awaits an ordinary command. This is what
ioredis calls `enableAutoPipelining`. Commands that block or hold a connection's state are sent
on their own, as before.
"""

from __future__ import annotations

import asyncio
from typing import Any

import redis.asyncio as aredis

# Commands that must keep a connection to themselves: blocking reads, transactions, and
# connection state. Everything else is safe to batch.
UNBATCHED = frozenset(
    {
        "BLPOP", "BRPOP", "BLMOVE", "BRPOPLPUSH", "BLMPOP", "BZPOPMIN", "BZPOPMAX", "BZMPOP",
        "XREAD", "XREADGROUP", "WAIT", "WAITAOF", "SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE",
        "MONITOR", "MULTI", "EXEC", "DISCARD", "WATCH", "UNWATCH", "SELECT", "AUTH", "HELLO",
        "CLIENT", "RESET", "QUIT", "SHUTDOWN",
    }
)  # fmt: skip

Pending = list[tuple[tuple[Any, ...], dict[str, Any], asyncio.Future]]


class AutoPipelineRedis(aredis.Redis):
    """A `redis.asyncio.Redis` whose commands are batched per event-loop tick."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: Pending = []
        self._flushing: set[asyncio.Task] = set()

    async def execute_command(self, *args: Any, **options: Any) -> Any:
        name = args[0].upper() if isinstance(args[0], str) else args[0]
        if name in UNBATCHED or self.single_connection_client:
            return await super().execute_command(*args, **options)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._pending.append((args, options, future))
        if len(self._pending) == 1:
            loop.call_soon(self._flush)
        return await future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.create_task(self._send(batch))
        self._flushing.add(task)
        task.add_done_callback(self._flushing.discard)

    async def _send(self, batch: Pending) -> None:
        if len(batch) == 1:  # nothing to share: the plain path is cheaper than a pipeline
            args, options, future = batch[0]
            try:
                _settle(future, await super().execute_command(*args, **options))
            except BaseException as exc:
                _fail(future, exc)
            return
        pipe = self.pipeline(transaction=False)
        for args, options, _future in batch:
            pipe.execute_command(*args, **options)
        try:
            replies = await pipe.execute(raise_on_error=False)
        except BaseException as exc:
            for _args, _options, future in batch:
                _fail(future, exc)
            return
        for (_args, _options, future), reply in zip(batch, replies, strict=True):
            if isinstance(reply, Exception):
                _fail(future, reply)
            else:
                _settle(future, reply)


def _settle(future: asyncio.Future, value: Any) -> None:
    if not future.done():  # the caller may have been cancelled meanwhile
        future.set_result(value)


def _fail(future: asyncio.Future, exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)
