"""A share that runs late (requeued from its dead letter, or queued over LATE_SECONDS ago) may
run after its message's deletion note lapsed (a day). One whose turn was queued (its message
stored when the turn ran) is read only while that message is still stored, not a tombstone, so a
deleted question is neither read nor answered; one first run late is read as usual."""

from __future__ import annotations

import time

import pytest

from adapters.shared_files import LATE_SECONDS
from memory.keys import deleted_message_key, turn_queue_key
from memory.scope import Scope, Visibility
from tests.test_shared_pdfs import StubEnd, share_payload, shared_pdf, stub_files

QUESTION = "what does it say?"


@pytest.fixture(autouse=True)
async def dropped_after(memory, tenant):
    """The test's tenant goes after it: a turn its shares queued is no later test's pipeline's
    to run (a bot's pipeline recovers every queued Slack turn it finds)."""
    yield
    await memory.drop_tenant(tenant)


def scope_of(tenant: str) -> Scope:
    return Scope(tenant, "t", channel="D1", user="U1", visibility=Visibility.DM)


async def answered_then(memory, files, end: StubEnd, scope: Scope, share: str, fate: str) -> dict:
    """A share read on time, its turn queued and run (its message stored), then the message
    deleted on the platform (a tombstone) or gone (its thread forgotten) a day ago, the notes
    lapsed: the share's payload, for a late run. What was posted and queued is cleared."""
    payload = {**share_payload(scope, share, turn=QUESTION), "queued_at": time.time()}
    await files.one(payload)
    await memory.redis.delete(turn_queue_key(scope.tenant, scope.thread))  # its turn ran:
    await memory.conversation.append(scope, "user", QUESTION, source=share)  # stored
    if fate == "tombstone":
        await memory.governance.forget_deleted(scope.tenant, [scope.thread], share)
    else:
        await memory.governance.forget_thread(scope.tenant, scope.thread)
    await memory.redis.delete(deleted_message_key(scope.tenant, share))  # a day: note lapsed
    end.posts.clear()
    end.edits.clear()
    return payload


@pytest.mark.parametrize("fate", ["tombstone", "gone"])
async def test_a_requeued_share_whose_message_went_after_its_turn_is_not_read(memory, tenant, fate):
    end = StubEnd(shared_pdf("Forgotten"))
    files = stub_files(memory, end)
    scope = scope_of(tenant)
    share = f"slack:D1:{time.time_ns()}"
    payload = await answered_then(memory, files, end, scope, share, fate)
    await files.one({**payload, "requeued": "1-0"})
    assert (end.posts, end.edits) == ([], [])
    assert await memory.redis.llen(turn_queue_key(tenant, scope.thread)) == 0


@pytest.mark.parametrize("fate", ["tombstone", "gone"])
async def test_a_late_share_whose_message_went_after_its_turn_is_not_read(memory, tenant, fate):
    end = StubEnd(shared_pdf("Late"))
    files = stub_files(memory, end)
    scope = scope_of(tenant)
    share = f"slack:D1:{time.time_ns()}"
    payload = await answered_then(memory, files, end, scope, share, fate)
    await files.one({**payload, "queued_at": time.time() - LATE_SECONDS - 60})  # redelivered
    assert (end.posts, end.edits) == ([], [])
    assert await memory.redis.llen(turn_queue_key(tenant, scope.thread)) == 0


async def test_a_late_share_never_run_is_read_and_its_question_queued(memory, tenant):
    """The bot down overnight with shares in the stream: their messages are not stored yet
    (their turns come after the files), so they are read as usual, not dropped."""
    end = StubEnd(shared_pdf("Overnight"))
    files = stub_files(memory, end)
    scope = scope_of(tenant)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}", turn=QUESTION)
    payload["queued_at"] = time.time() - LATE_SECONDS - 60
    await files.one(payload)
    [paper] = await memory.knowledge_base.papers(scope)
    assert paper["title"] == "Overnight"
    assert await memory.redis.llen(turn_queue_key(tenant, scope.thread)) == 1


async def test_a_requeued_share_whose_message_is_stored_is_read(memory, tenant):
    end = StubEnd(shared_pdf("Kept"))
    files = stub_files(memory, end)
    scope = scope_of(tenant)
    share = f"slack:D1:{time.time_ns()}"
    await memory.conversation.append(scope, "user", QUESTION, source=share)
    payload = {**share_payload(scope, share, turn=QUESTION), "requeued": "1-0"}
    await files.one(payload)
    [paper] = await memory.knowledge_base.papers(scope)
    assert paper["title"] == "Kept"


async def test_a_fresh_share_is_read_before_its_message_is_stored(memory, tenant):
    """Its turn stores the message after the files are read: a share on time is not held up."""
    end = StubEnd(shared_pdf("Fresh"))
    files = stub_files(memory, end)
    scope = scope_of(tenant)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}", turn=QUESTION)
    payload["queued_at"] = time.time()
    await files.one(payload)
    [paper] = await memory.knowledge_base.papers(scope)
    assert paper["title"] == "Fresh"
