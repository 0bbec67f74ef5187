"""The bot writing into a tenant while an import writes it: refused (said as the memory being
restored), so no live message shares a position with the file's nor sinks under them; a marker
a crashed import left does not stop the bot."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis.asyncio as aioredis

from memory.keys import import_lock_key, import_partial_key, messages_key, threads_key
from memory.portability import dumps
from memory.scope import Scope
from memory.stores.conversation import ConversationStore, MemoryRestoring
from tests.agent_world import close_world, open_world

THREAD = "t1"  # one thread per place, as a Discord channel's or a Slack DM's `dm`


@pytest.fixture
def other() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def said_elsewhere(redis_url: str, scope: Scope, text: str) -> BaseException | None:
    """The bot, another process, appends a message to `scope`: what that raised, if anything."""
    client = aioredis.from_url(redis_url)
    try:
        await ConversationStore(client).append(scope, "user", text)
    except Exception as exc:
        return exc
    finally:
        await client.aclose()
    return None


def lines_with_a_live_message(
    records: list[dict], redis_url: str, scope: Scope, raised: list
) -> Callable[[], Iterator[str]]:
    """The export's lines, read twice by the import (a check, then the writes); halfway through
    the writes, a live message is said in the thread the file also holds (its own event loop
    and connection, in a thread: another process, as the import waits on it)."""
    passes = 0

    def lines() -> Iterator[str]:
        nonlocal passes
        passes += 1
        for number, record in enumerate(records):
            if passes == 2 and number == len(records) // 2:
                with ThreadPoolExecutor(1) as pool:
                    said = said_elsewhere(redis_url, scope, "a live question")
                    raised.append(pool.submit(asyncio.run, said).result())
            yield dumps(record) + "\n"

    return lines


async def test_a_live_message_during_an_import_is_refused_and_the_thread_kept_whole(
    memory, tenant, other, redis_url
):
    source = Scope(tenant, THREAD, channel="C1", user="U1", user_name="alice")
    start = time.time() - 3600
    for i, text in enumerate(["Find the quokka paper.", "Here it is.", "Who wrote it?"]):
        role = "user" if i % 2 == 0 else "assistant"
        await memory.conversation.append(source, role, text, timestamp=start + 60 * i)
    records = [json.loads(dumps(r)) async for r in memory.portability.export_tenant(tenant)]
    exported = [r["message"] for r in records if r["kind"] == "message"]
    last_active = next(r["last_active"] for r in records if r["kind"] == "thread")

    raised: list[BaseException | None] = []
    lines = lines_with_a_live_message(records, redis_url, Scope(other, THREAD), raised)
    try:
        await memory.portability.import_lines(other, lines)
        assert len(raised) == 1 and isinstance(raised[0], MemoryRestoring)
        assert "being restored" in str(raised[0]) and "send it again in a minute" in str(raised[0])
        stored = [
            json.loads(r) for r in await memory.redis.lrange(messages_key(other, THREAD), 0, -1)
        ]
        assert [m["seq"] for m in stored] == list(range(len(exported)))  # no position twice
        assert [m["content"] for m in stored] == [m["content"] for m in exported]
        assert await memory.redis.zscore(threads_key(other), THREAD) == last_active
        # the import done, the bot writes there again, after the file's messages
        after = await memory.conversation.append(Scope(other, THREAD), "user", "And now?")
        assert after.seq == len(exported)
    finally:
        await memory.drop_tenant(other)


async def test_a_crashed_imports_marker_does_not_stop_the_bot(memory, tenant):
    """A crash leaves the marker (its import's lock lapses): the bot writes past it, and the
    next import then refuses the tenant rather than wipe what was said since."""
    scope = Scope(tenant, THREAD)
    await memory.redis.set(import_partial_key(tenant), "1234.5")
    stored = await memory.conversation.append(scope, "user", "Still there?")
    assert stored.seq == 0 and not stored.duplicate
    assert [m.content for m in await memory.conversation.all(scope)] == ["Still there?"]

    await memory.redis.set(import_lock_key(tenant), "another-import", px=60_000)
    try:  # an import running (its lock held): refused, nothing stored
        with pytest.raises(MemoryRestoring):
            await memory.conversation.append(scope, "user", "And now?", once="job-2")
        assert [m.content for m in await memory.conversation.all(scope)] == ["Still there?"]
        assert await memory.conversation.appended(scope, "job-2") is None
    finally:
        await memory.redis.delete(import_lock_key(tenant))
        await memory.redis.delete(import_partial_key(tenant))


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def test_a_turn_during_an_import_tells_the_person_to_send_it_again(world, tenant):
    memory = world.runtime.memory
    await memory.redis.set(import_lock_key(tenant), "an-import", px=60_000)
    await memory.redis.set(import_partial_key(tenant), repr(time.time()))
    try:
        scope = Scope(tenant, "dm", user="U1", user_name="alice")
        reply = await world.runtime.turns().handle(scope, "What is MemGPT?", turn_id="job-1")
        assert reply.refused and "my memory is being restored" in reply.text
        assert "please send it again in a minute" in reply.text
        assert world.model_requests() == []  # refused before the model was asked
        assert await memory.conversation.all(scope) == []
        assert not await memory.redis.exists(threads_key(tenant))
    finally:
        await memory.redis.delete(import_lock_key(tenant))
        await memory.redis.delete(import_partial_key(tenant))
