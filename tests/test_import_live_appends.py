"""The bot writing into a tenant while an import runs there: refused (said as the memory being
restored), from right after the import takes its lock (before it looks at the tenant, or clears
what a crashed import left) to its end, so no live message shares a position with the file's nor
sinks under them, nor is wiped by the clearing; a marker a crashed import left neither stops the
bot nor costs its appends a round trip. An import into a tenant in use is refused before it
sets its running key; an answer a restore refuses is tried again, then given unsaved."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
import redis.asyncio as aioredis

from memory.keys import (
    forgetting_key,
    import_partial_key,
    import_running_key,
    messages_key,
    threads_key,
)
from memory.portability import ErasureRunning, Portability, TenantNotEmpty, dumps
from memory.scope import Scope
from memory.stores.conversation import ConversationStore, MemoryRestoring
from memory.stores.turn_records import UnknownTurn
from tests.agent_world import close_world, open_world
from tests.support.redis_monitor import monitored
from tests.support.scripted_openai import TextReply

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
        assert "being restored" in str(raised[0]) and "again in a few minutes" in str(raised[0])
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


async def export_of_a_thread(memory, tenant: str) -> list[dict]:
    source = Scope(tenant, THREAD, channel="C1", user="U1", user_name="alice")
    for i, text in enumerate(["Find the quokka paper.", "Here it is.", "Who wrote it?"]):
        role = "user" if i % 2 == 0 else "assistant"
        await memory.conversation.append(source, role, text, timestamp=time.time() - 60 * (3 - i))
    return [json.loads(dumps(r)) async for r in memory.portability.export_tenant(tenant)]


def marker_write(tenant: str) -> bytes:
    """The import setting its marker, as it goes to Redis: after it found the tenant empty, or
    cleared what a crashed import left."""
    key = import_partial_key(tenant)
    return f"SET\r\n${len(key)}\r\n{key}".encode()


@pytest.mark.parametrize("crashed", [False, True], ids=["empty", "a-crashed-import-cleared"])
async def test_a_live_message_before_the_import_starts_writing_is_refused(
    memory, gated, tenant, other, crashed
):
    """The import has its lock and found the tenant empty (or cleared what a crashed import
    left), and has not set its marker yet: a live message then is refused all the same, not
    stored unseen (positions shared with the file's) nor wiped."""
    through_gate, gate = gated
    records = await export_of_a_thread(memory, tenant)
    if crashed:
        await memory.redis.set(import_partial_key(other), repr(time.time() - 60))
    gate.hold(marker_write(other))
    task = asyncio.create_task(Portability(through_gate).import_records(other, records))
    try:
        await gate.held.wait()
        with pytest.raises(MemoryRestoring):
            await memory.conversation.append(Scope(other, THREAD), "user", "a live question")
        gate.release.set()
        await task
        stored = [m.content for m in await memory.conversation.all(Scope(other, THREAD))]
        assert stored == [r["message"]["content"] for r in records if r["kind"] == "message"]
        assert not await memory.redis.exists(import_running_key(other))  # the import ended
        after = await memory.conversation.append(Scope(other, THREAD), "user", "And now?")
        assert after.seq == len(stored)
    finally:
        gate.release.set()
        await asyncio.gather(task, return_exceptions=True)
        await memory.drop_tenant(other)


class CountingRedis(aioredis.Redis):
    """A client that notes each command it sends (the Redis client's, not ours)."""

    sent: list[str]

    async def execute_command(self, *args, **options):
        self.sent.append(str(args[0]).upper())
        return await super().execute_command(*args, **options)


async def test_a_crashed_imports_marker_neither_stops_the_bot_nor_slows_it(
    memory, tenant, redis_url
):
    """A crash leaves the marker (its running key lapses with its lock): the bot writes past
    it, in the one round trip of any append, and the next import then refuses the tenant
    rather than wipe what was said since. An import running refuses the append."""
    scope = Scope(tenant, THREAD)
    client = CountingRedis.from_url(redis_url)
    client.sent = []
    try:
        store = ConversationStore(client)
        await store.append(Scope(tenant, "warm-up"), "user", "The script, loaded.")
        await memory.redis.set(import_partial_key(tenant), "1234.5")
        client.sent = []
        stored = await store.append(scope, "user", "Still there?")
        assert stored.seq == 0 and not stored.duplicate
        assert client.sent == ["EVALSHA"]
    finally:
        await client.aclose()
    assert [m.content for m in await memory.conversation.all(scope)] == ["Still there?"]

    await memory.redis.set(import_running_key(tenant), "another-import", px=60_000)
    try:  # an import running: refused, nothing stored
        with pytest.raises(MemoryRestoring):
            await memory.conversation.append(scope, "user", "And now?", once="job-2")
        assert [m.content for m in await memory.conversation.all(scope)] == ["Still there?"]
        assert await memory.conversation.appended(scope, "job-2") is None
    finally:
        await memory.redis.delete(import_running_key(tenant), import_partial_key(tenant))


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def test_a_turn_during_an_import_tells_the_person_to_send_it_again(world, tenant):
    memory = world.runtime.memory
    await memory.redis.set(import_running_key(tenant), "an-import", px=60_000)
    try:
        scope = Scope(tenant, "dm", user="U1", user_name="alice")
        reply = await world.runtime.turns().handle(scope, "What is MemGPT?", turn_id="job-1")
        assert reply.refused and "my memory is being restored" in reply.text
        assert "please send it again in a few minutes" in reply.text
        assert world.model_requests() == []  # refused before the model was asked
        assert await memory.conversation.all(scope) == []
        assert not await memory.redis.exists(threads_key(tenant))
    finally:
        await memory.redis.delete(import_running_key(tenant))


async def test_an_import_into_a_tenant_in_use_never_sets_its_running_key(memory, tenant, redis_url):
    """The tenant holds a thread and no crashed import's marker: the import is refused before
    it sets the running key, so the bot's appends there are never refused for it."""
    records = await export_of_a_thread(memory, tenant)

    async def refused() -> None:
        with pytest.raises(TenantNotEmpty, match="already holds memory"):
            await memory.portability.import_records(tenant, records)

    ran = await monitored(redis_url, memory.redis, refused)
    assert not [r for r in ran if import_running_key(tenant) in r.args]
    assert not await memory.redis.exists(import_running_key(tenant))


async def test_an_import_while_an_erasure_runs_says_to_wait_for_it(memory, tenant):
    """Erase, then restore at once: while the erasure still holds the tenant (its keys not all
    gone yet), the import says an erasure is running, not that the memory is in use."""
    records = await export_of_a_thread(memory, tenant)
    await memory.redis.set(forgetting_key(tenant), "an-erasure", px=60_000)
    try:
        with pytest.raises(ErasureRunning):
            await memory.portability.import_records(tenant, records)
    finally:
        await memory.redis.delete(forgetting_key(tenant))


ANSWER = "It pages what it holds between a small context and a large store."


def a_restore_starts_while_the_model_answers(
    redis_url: str, tenant: str, lasting_ms: int
) -> Callable[[dict], TextReply]:
    """The scripted model's responder: an import of the tenant takes its running key (for
    `lasting_ms`) while the model writes the answer, the question stored already."""

    def respond(body: dict) -> TextReply:
        client = redis.Redis.from_url(redis_url)
        try:
            client.set(import_running_key(tenant), "an-import", px=lasting_ms)
        finally:
            client.close()
        return TextReply(ANSWER)

    return respond


async def test_an_answer_a_short_restore_refused_is_stored_once_it_ends(world, tenant, redis_url):
    """The import (refused: the question makes the tenant not empty) holds its key a moment:
    the answer is tried again, then stored with its record, as any answer."""
    memory = world.runtime.memory
    world.model.responder = a_restore_starts_while_the_model_answers(redis_url, tenant, 1500)
    scope = Scope(tenant, "dm", user="U1", user_name="alice")
    try:
        reply = await world.runtime.turns().handle(scope, "how does it remember?", turn_id="j-1")
        assert not reply.refused and reply.text == ANSWER and reply.turn_id == "j-1"
        stored = [(m.role, m.content) for m in await memory.conversation.all(scope)]
        assert stored == [("user", "how does it remember?"), ("assistant", ANSWER)]
        assert (await memory.turn_records.get(tenant, "j-1")).answer == ANSWER
    finally:
        await memory.redis.delete(import_running_key(tenant))


async def test_an_answer_a_restore_keeps_refusing_is_given_unsaved(world, tenant, redis_url):
    """The restore outlasts the harness's wait: the person gets the answer all the same, told
    it could not be saved (not that their message was not: it was), so nothing is sent twice."""
    memory = world.runtime.memory
    world.agent.harness.restore_wait = 0.2
    world.model.responder = a_restore_starts_while_the_model_answers(redis_url, tenant, 60_000)
    scope = Scope(tenant, "dm", user="U1", user_name="alice")
    try:
        reply = await world.runtime.turns().handle(scope, "how does it remember?", turn_id="j-1")
        assert not reply.refused and reply.text.startswith(ANSWER)
        assert "this answer could not be saved" in reply.text and "send it again" not in reply.text
        assert reply.turn_id == ""  # no record: nothing to give feedback on
        stored = [(m.role, m.content) for m in await memory.conversation.all(scope)]
        assert stored == [("user", "how does it remember?")]  # the question, once
        with pytest.raises(UnknownTurn):
            await memory.turn_records.get(tenant, "j-1")
        await memory.redis.delete(import_running_key(tenant))
        await world.agent.harness.drain()  # the question is still indexed for recall
        question = (await memory.conversation.all(scope))[0]
        assert await memory.episodes._stored(tenant, [question.id]) == [question.id]
    finally:
        await memory.redis.delete(import_running_key(tenant))
