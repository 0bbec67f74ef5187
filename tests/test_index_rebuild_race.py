"""Processes starting together after a change of index layout: one rebuilds the indexes, the
others wait for it, and none fails ("Unknown Index name", when two dropped the same index).
Each store instance below has a connection of its own, as a process's MemoryManager does."""

from __future__ import annotations

import asyncio
import logging
import uuid

from memory.connection import connect
from memory.keys import INDEX_META_KEY
from memory.scope import Scope
from memory.stores.workflow import WorkflowStore

PROCESSES = 3
TENANTS = 6


async def test_stores_opening_together_after_a_layout_change_rebuild_once(
    memory, redis_url, caplog
):
    family = f"test_race_{uuid.uuid4().hex[:8]}"

    class Notes(WorkflowStore):  # a family of its own: rebuilding it disturbs no other test
        SCHEMA = {**WorkflowStore.SCHEMA, "index": {"name": family, "prefix": f"test:{family}"}}

    first = Notes(memory.redis, memory.embedder)
    await first.open()
    tenants = [f"t-{uuid.uuid4().hex[:8]}" for _ in range(TENANTS)]
    vector = await memory.embedder.embed_one("find MemGPT")
    for tenant in tenants:
        await first.add(Scope(tenant, user="u"), "find MemGPT", ["search"], "found", vector)
    # the indexes were built by an older layout
    await memory.redis.hset(INDEX_META_KEY, family, f"{first.signature}#oldlayout")

    clients = [await connect(redis_url, warm=0) for _ in range(PROCESSES)]
    try:
        stores = [Notes(client, memory.embedder) for client in clients]
        with caplog.at_level(logging.WARNING, logger="memory.stores.base"):
            outcomes = await asyncio.gather(*(s.open() for s in stores), return_exceptions=True)
        assert [o for o in outcomes if isinstance(o, BaseException)] == []
        rebuilt = f"rebuilding the {family} indexes for their new layout"
        assert [r.getMessage() for r in caplog.records].count(rebuilt) == 1  # the others waited
        assert await first.existing_indexes() == sorted(f"{family}:{t}" for t in tenants)
        recorded = (await memory.redis.hget(INDEX_META_KEY, family)).decode()
        assert recorded == f"{first.signature}#{first.layout()}"
        for tenant in tenants:  # every tenant's records are found again, from every process
            for store in stores:
                for _ in range(100):  # Redis indexes the existing records in the background
                    found = await store.similar(Scope(tenant, user="u"), vector)
                    if found:
                        break
                    await asyncio.sleep(0.05)
                assert len(found) == 1
    finally:
        for client in clients:
            await client.aclose()
