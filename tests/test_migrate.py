"""Keys of the layout before hash tags move to their new names, and the stores read them back."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import redis.asyncio as aredis
from redis.crc import key_slot

from memory.keys import legacy_renames, task_stream, tenant_key, upgrade_key
from memory.migrate import UPGRADE, migrate_to_hash_tags, move_legacy_keys
from memory.scope import Scope
from memory.stores.conversation import Message
from memory.stores.episodic import Episode
from memory.tasks import TaskStream

THREAD = "C42:1700000000.000100"


@pytest.fixture
async def raw(redis_url: str):
    """A plain client, for writing keys the way the older version named them."""
    client = aredis.Redis.from_url(redis_url, decode_responses=True)
    yield client
    await client.aclose()


async def write_legacy_thread(raw: aredis.Redis, tenant: str) -> None:
    """A thread as the older version stored it: two messages, the first summarized."""
    old = f"arxivscout:t:{tenant}"
    first = Message("user", "we chose the Mamba paper", thread_id=THREAD, timestamp=1.0, seq=0)
    first.summary_id = "sum_old"
    second = Message("assistant", "noted, Mamba it is", thread_id=THREAD, timestamp=2.0, seq=1)
    await raw.rpush(f"{old}:thread:{THREAD}:messages", first.to_json(), second.to_json())
    await raw.set(f"{old}:thread:{THREAD}:messages:summarized", 1)
    await raw.zadd(f"{old}:threads", {THREAD: 2.0})
    summary = {
        "thread_id": THREAD, "description": "the team picked a paper", "text": "Mamba chosen",
        "message_ids": json.dumps([first.id]), "id": "sum_old", "created_at": "1.5",
        "audience": "public", "level": "0", "children": "[]", "parent": "",
    }  # fmt: skip
    await raw.hset(f"{old}:summary:sum_old", mapping=summary)
    await raw.zadd(f"{old}:thread:{THREAD}:summaries", {"sum_old": 1.5})
    await raw.hset(f"{old}:papers", "2312.00752", json.dumps({"arxiv_id": "2312.00752"}))
    await raw.set(f"{old}:seen:Ev1", 1, ex=3600)


async def write_legacy_cache_entry(raw: aredis.Redis, model: str, text: str, dims: int) -> None:
    """A vector the older version cached (a constant one, which no model computes)."""
    digest = hashlib.sha1(text.encode()).hexdigest()
    await raw.set(f"arxivscout:embcache:{model}:{digest}", np.full(dims, 0.5, np.float32).tobytes())


async def test_a_thread_of_the_older_layout_reads_back_after_the_move(memory, tenant, raw):
    scope = Scope(tenant, THREAD)
    episode = Episode("msg_ep", THREAD, text="the Mamba paper was chosen", ts=1.0)
    await memory.episodes.add(scope, [episode])  # documents keep their names: nothing to move
    await write_legacy_thread(raw, tenant)
    cached = f"cached before hash tags, {tenant}"
    await write_legacy_cache_entry(raw, memory.embedder.model_name, cached, memory.embedder.dims)

    report = await move_legacy_keys(memory.redis)

    assert report.moved >= 8 and report.kept == 0
    assert [k async for k in raw.scan_iter(match=f"arxivscout:t:{tenant}:*")] == []
    messages = await memory.conversation.all(scope)
    assert [m.content for m in messages] == ["we chose the Mamba paper", "noted, Mamba it is"]
    assert [m.content for m in await memory.conversation.unsummarized(scope)] == [
        "noted, Mamba it is"
    ]
    assert tenant in await memory.conversation.tenants()
    assert await memory.conversation.threads(tenant) == [(THREAD, 2.0)]
    assert await memory.summaries.descriptions(scope) == [("sum_old", "the team picked a paper")]
    assert (await memory.summaries.get(scope, "sum_old")).message_ids == [messages[0].id]
    assert await memory.knowledge_base.has_paper(scope, "2312.00752")
    assert not await memory.events.first_time(tenant, "Ev1")  # the redelivery is still known
    assert 0 < await raw.ttl(tenant_key(tenant, "seen", "Ev1")) <= 3600
    vector = await memory.embedder.embed_one("Mamba paper")
    assert [e.id for e in await memory.episodes.search(scope, "Mamba paper", vector)] == ["msg_ep"]
    assert (await memory.embedder.embed_one(cached) == 0.5).all()  # read from the moved cache

    again = await move_legacy_keys(memory.redis)  # a second run finds nothing to do
    assert (again.moved, again.kept) == (0, 0)
    assert len(await memory.conversation.all(scope)) == 2


async def test_a_taken_new_name_keeps_its_value(memory, tenant, raw):
    old, new = f"arxivscout:t:{tenant}:joined-x", tenant_key(tenant, "joined-x")
    await raw.set(old, "before")
    await raw.set(new, "after")
    report = await move_legacy_keys(memory.redis)
    assert report.kept >= 1
    assert (await raw.get(new), await raw.get(old)) == ("after", "before")  # both kept, logged
    await raw.delete(old)


async def test_a_move_stopped_before_its_del_is_finished(memory, tenant, raw):
    old, new = f"arxivscout:t:{tenant}:joined-y", tenant_key(tenant, "joined-y")
    await raw.set(old, "same")
    await raw.set(new, "same")  # restored, but the process died before deleting the old copy
    await move_legacy_keys(memory.redis)
    assert (await raw.get(new), await raw.exists(old)) == ("same", 0)


async def test_a_stream_moves_with_its_group_and_pending_entries(memory, tenant, raw):
    old, new = f"arxivscout:t:{tenant}:stream", tenant_key(tenant, "stream")
    await raw.xgroup_create(old, "workers", id="0", mkstream=True)
    entry = await raw.xadd(old, {"kind": "x"})
    await raw.xreadgroup("workers", "gone", {old: ">"}, count=1)  # delivered, never acked
    await move_legacy_keys(memory.redis)
    pending = await raw.xpending_range(new, "workers", min="-", max="+", count=10)
    assert [p["message_id"] for p in pending] == [entry]


async def test_the_upgrade_runs_once_per_redis(memory, tenant, raw):
    old, new = f"arxivscout:t:{tenant}:joined-z", tenant_key(tenant, "joined-z")
    await raw.set(old, 1)
    assert (await migrate_to_hash_tags(memory.redis, memory.upgrades)).moved == 0  # done at open
    assert await raw.exists(old) == 1

    await raw.delete(upgrade_key(UPGRADE))  # as on a Redis that never ran this version
    assert (await migrate_to_hash_tags(memory.redis, memory.upgrades)).moved >= 1
    assert (await raw.exists(old), await raw.get(new)) == (0, "1")
    assert await memory.upgrades.done(UPGRADE)


def test_the_task_stream_moves_beside_its_dead_letters():
    stream = TaskStream(None, task_stream())  # type: ignore[arg-type]  # names only
    assert key_slot(stream.stream.encode()) == key_slot(stream.dead_stream.encode())
    assert legacy_renames() == {
        "arxivscout:tasks": stream.stream,
        "arxivscout:tasks:dead": stream.dead_stream,
    }
