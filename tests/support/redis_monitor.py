"""What Redis ran while a piece of code ran (its MONITOR): for tests of how often, or in what
order, an erasure reads and writes, which no result shows."""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import redis.asyncio as aredis

# a MONITOR line: `<time> [<db> <client>] "NAME" "arg" ...` (client "lua" inside a script; a
# module's own calls name no address, which redis-py's parser refuses)
_LINE = re.compile(r"^\S+ \[\d+ ?([^\]]*)\] (.*)$", re.S)
_ARG = re.compile(r'"((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Ran:
    """One command: its name and arguments, and whether a script ran it."""

    name: str
    args: list[str]
    in_script: bool


async def monitored(
    redis_url: str, redis: aredis.Redis, run: Callable[[], Awaitable[object]]
) -> list[Ran]:
    """The commands Redis ran while `run` ran, in order (scripts' too). `redis` is the client
    `run` uses: a marker sent on it ends the record."""
    marker = f"end-{uuid.uuid4().hex}"
    client = aredis.Redis.from_url(redis_url)
    seen: list[Ran] = []
    try:
        async with client.monitor() as monitor:
            await run()
            await redis.echo(marker)
            while True:
                line = await monitor.connection.read_response()
                line = line.decode("utf-8", "replace") if isinstance(line, bytes) else str(line)
                if marker in line:
                    return seen
                if parsed := _LINE.match(line):
                    words = _ARG.findall(parsed.group(2))
                    if words:
                        in_script = parsed.group(1) == "lua"
                        seen.append(Ran(words[0].upper(), words[1:], in_script))
    finally:
        await client.aclose()
