"""Erasures reach the dead letters (memory/dead_letters.py `forget_dead_letters`): a task given
up on keeps its payload, people's words among it. A person's erasure, a thread's, a message's
and retention's sweep drop the dead letters that carry what they forgot, and only those:
against the real Redis, dead letters written as `TaskStream.dead_letter` writes them."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict

import pytest

from memory.dead_letters import dead_letters
from memory.keys import erasing_key, task_stream
from memory.scope import Scope, Visibility
from memory.stores.conversation import Message
from memory.tasks import TaskStream
from tests.support.redis_monitor import monitored


@pytest.fixture
async def stream(memory):
    """A task stream of the deployment's naming (its dead letters found by their keys)."""
    stream = TaskStream(memory.redis, task_stream(f"dle-{uuid.uuid4().hex[:10]}"))
    await stream.ensure_group()
    yield stream
    await stream.destroy()


async def bury(stream: TaskStream, kind: str, payload: dict) -> None:
    """Queue a task, read it, and give up on it: a dead letter, as a consumer leaves one."""
    await stream.add(kind, payload)
    [task] = await stream.read(count=1, block_ms=100)
    await stream.dead_letter(task, "boom")


async def left(stream: TaskStream) -> list[str]:
    """The dead letters still there (what `arxivscout tasks dead` prints), by their `tag`."""
    return sorted(str(letter.payload.get("tag")) for letter in await dead_letters(stream))


def episodes(scope: Scope, messages: list[Message], tag: str) -> dict:
    return {"scope": scope.to_dict(), "messages": [asdict(m) for m in messages], "tag": tag}


def artifacts(scope: Scope, question: Message, answer: str, tag: str) -> dict:
    asked = {"id": question.id, "seq": question.seq, "text": question.content}
    return {"scope": scope.to_dict(), "question": question.content, "answer": answer,
            "steps": [], "turn": "", "asked": asked, "tag": tag}  # fmt: skip


async def test_a_persons_erasure_drops_the_dead_letters_that_name_them(memory, tenant, stream):
    u1 = Scope(tenant, "c1", channel="C1", user="U1", user_name="Ann")
    u2 = Scope(tenant, "c2", channel="C1", user="U2", user_name="Bob")
    asked = await memory.conversation.append(u1, "user", "my secret plan")
    answer = await memory.conversation.append(u1, "assistant", "a fine plan")
    theirs = await memory.conversation.append(u2, "user", "my own question")
    await bury(stream, "episodes", episodes(u1, [asked, answer], "episodes-u1"))
    await bury(stream, "artifacts", artifacts(u1, asked, answer.content, "artifacts-u1"))
    await bury(stream, "shared_files", {"platform": "slack", "scope": u2.to_dict(),
                                        "share": "slack:C1:1.2", "sharer": "U1",
                                        "files": [], "turn": None, "tag": "share-u1"})  # fmt: skip
    await bury(stream, "summarize", {"team": tenant, "user": "U1", "tag": "summary-u1"})
    await bury(stream, "episodes", episodes(u2, [theirs], "episodes-u2"))
    await bury(stream, "summarize", {"team": tenant, "user": "U2", "tag": "summary-u2"})
    other = Scope(f"t-{uuid.uuid4().hex[:10]}", "c1", user="U1")  # another workspace's U1
    await bury(stream, "roll", {"scope": other.to_dict(), "tag": "other-tenant"})

    await memory.governance.forget_person(tenant, "U1")

    assert await left(stream) == ["episodes-u2", "other-tenant", "summary-u2"]


async def test_forgetting_a_thread_drops_its_dead_letters(memory, tenant, stream):
    scope = Scope(tenant, "gone", channel="C1", user="U1")
    kept = Scope(tenant, "kept", channel="C1", user="U1")
    said = await memory.conversation.append(scope, "user", "words of the thread")
    other = await memory.conversation.append(kept, "user", "words of another")
    await bury(stream, "episodes", episodes(scope, [said], "episodes-gone"))
    await bury(stream, "roll", {"scope": scope.to_dict(), "tag": "roll-gone"})
    await bury(stream, "edited-message", {"tenant": tenant, "places": {"gone": "C1"},
                                          "source": "slack:C1:9.9", "text": "new words",
                                          "at": time.time(), "tag": "edit-gone"})  # fmt: skip
    await bury(stream, "episodes", episodes(kept, [other], "episodes-kept"))

    await memory.governance.forget_thread(tenant, "gone")

    assert await left(stream) == ["episodes-kept"]


async def test_forgetting_a_message_drops_the_dead_letters_carrying_it(memory, tenant, stream):
    scope = Scope(tenant, "t", channel="C1", user="U1")
    asked = await memory.conversation.append(scope, "user", "what about X?", source="slack:C1:1.1")
    answer = await memory.conversation.append(scope, "assistant", "X is a thing")
    later = await memory.conversation.append(scope, "user", "and Y?")
    await bury(stream, "episodes", episodes(scope, [asked, answer], "episodes-asked"))
    await bury(stream, "edited-message", {"tenant": tenant, "places": {"t": "C1"},
                                          "source": "slack:C1:1.1", "text": "what about Z?",
                                          "at": time.time(), "tag": "edit-asked"})  # fmt: skip
    await bury(stream, "artifacts", artifacts(scope, later, "Y is another", "artifacts-later"))
    await bury(stream, "episodes", episodes(scope, [later], "episodes-later"))

    await memory.governance.forget_message(tenant, "t", asked.id)
    assert await left(stream) == ["artifacts-later", "episodes-later"]

    # the answer alone: the turn's artifacts carry its text
    said = await memory.conversation.append(scope, "assistant", "Y is another")
    await memory.governance.forget_message(tenant, "t", said.id)
    assert await left(stream) == ["episodes-later"]


async def test_retention_drops_the_dead_letters_older_than_its_cutoff(memory, tenant, stream):
    scope = Scope(tenant, "t", channel="D1", user="U1", visibility=Visibility.DM)
    now = time.time()
    old = Message("user", "said long ago", thread_id="t", timestamp=now - 10 * 86400,
                  author="U1", audience=scope.audience)  # fmt: skip
    recent = await memory.conversation.append(scope, "user", "said today")
    await bury(stream, "episodes", episodes(scope, [old], "episodes-old"))  # queued again today
    await bury(stream, "episodes", episodes(scope, [recent], "episodes-recent"))
    await memory.governance.sweep_retention(tenant, now - 86400)
    assert await left(stream) == ["episodes-recent"]

    # the sweep: every task queued before its cutoff (a day before `now`) goes
    await memory.retention.set(tenant, 1)
    await memory.retention.sweep(tenant, now=time.time() + 2 * 86400)
    assert await left(stream) == []


# -- how often the dead letters are read: each pass reads every one of the deployment ------------


async def commands(redis_url: str, memory, run: Callable[[], Awaitable[object]]) -> list[str]:
    """The commands Redis ran while `run` ran, as "NAME key", in order."""
    seen = await monitored(redis_url, memory.redis, run)
    return [" ".join([c.name, *c.args[:1]]) for c in seen]


async def test_an_erasure_reads_the_dead_letters_once_after_hiding_what_went(
    memory, tenant, stream, redis_url
):
    """A person's erasure (a DM thread whole, their messages elsewhere, the person) makes one
    pass over the dead letters, once their messages are out of episodic search (the pass
    takes seconds on a big deployment); a message's too."""
    dm = Scope(tenant, "dm", channel="D1", user="U1", visibility=Visibility.DM)
    channel = Scope(tenant, "c", channel="C1", user="U1")
    await memory.conversation.append(dm, "user", "my private words")
    said = await memory.conversation.append(channel, "user", "my public words")
    await bury(stream, "episodes", episodes(channel, [said], "episodes-said"))
    hide, read = f"HSET {erasing_key(tenant)}", f"XRANGE {stream.dead_stream}"

    seen = await commands(redis_url, memory, lambda: memory.governance.forget_person(tenant, "U1"))
    assert seen.count(read) == 1
    assert seen.index(hide) < seen.index(read)
    assert await left(stream) == []

    again = await memory.conversation.append(channel, "user", "more words")
    forget = memory.governance.forget_message
    seen = await commands(redis_url, memory, lambda: forget(tenant, "c", again.id))
    assert seen.count(read) == 1
    assert seen.index(hide) < seen.index(read)


async def test_a_retention_sweep_reads_the_dead_letters_once(memory, tenant, stream, redis_url):
    """Nothing old to forget in the threads: the sweep still drops the tasks queued before its
    cutoff, in one pass."""
    scope = Scope(tenant, "t", channel="C1", user="U1")
    await memory.conversation.append(scope, "user", "said today")
    await bury(stream, "roll", {"scope": scope.to_dict(), "tag": "roll"})
    sweep = memory.governance.sweep_retention

    seen = await commands(redis_url, memory, lambda: sweep(tenant, time.time() - 86400))
    assert seen.count(f"XRANGE {stream.dead_stream}") == 1
    assert await left(stream) == ["roll"]
