"""The `gated` fixture: a memory whose Redis connection goes through a `RedisGate`, for tests
that hold one command of the code under test (tests/support/redis_gate.py). Exposed to every
test by tests/conftest.py."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from memory.connection import connect
from memory.embeddings import CachedEmbedder, LocalEmbedder
from memory.manager import MemoryManager
from tests.support.redis_gate import RedisGate


@pytest.fixture
async def gated(
    redis_url: str, local_embedder: LocalEmbedder
) -> AsyncIterator[tuple[MemoryManager, RedisGate]]:
    """A memory whose Redis connection goes through a gate, and its gate."""
    gate = RedisGate(redis_url)
    client = await connect(await gate.start())
    manager = await MemoryManager(client, CachedEmbedder(local_embedder, client)).open()
    yield manager, gate
    gate.release.set()
    await manager.close()
    await gate.close()
