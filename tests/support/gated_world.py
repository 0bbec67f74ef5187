"""The `gated_world` fixture: an agent world (tests/agent_world.py) whose Redis is reached through
a `RedisGate`, for tests that hold one command of a turn, a vote or a background task, or cut
Redis while it runs (tests/support/redis_gate.py). The world-sized sibling of the `gated`
memory (tests/support/gated_memory.py); a test module takes it by importing it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.agent_world import World, close_world, open_world
from tests.support.redis_gate import RedisGate


@pytest.fixture
async def gated_world(redis_url: str, tmp_path: Path) -> AsyncIterator[tuple[World, RedisGate]]:
    """A world whose Redis is reached through a gate that can hold, then cut, one command; and
    its gate."""
    gate = RedisGate(redis_url)
    world = await open_world(await gate.start(), tmp_path)
    yield world, gate
    gate.release.set()
    gate.mend()  # after a test that cut Redis, the world closes over a working connection
    await close_world(world)
    await gate.close()
