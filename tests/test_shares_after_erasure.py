"""A person's erasure reaches their shares still waiting in the stream (memory/erased_people.py):
one queued before it and run after reads no file and queues no turn, so their words are not
stored again; one they share after it, or another person's, is read as usual."""

from __future__ import annotations

import time

import pytest

from memory.keys import turn_queue_key
from memory.scope import Scope, Visibility
from tests.test_shared_pdfs import StubEnd, share_payload, shared_pdf, stub_files

QUESTION = "what does my secret paper say?"


@pytest.fixture(autouse=True)
async def dropped_after(memory, tenant):
    """The test's tenant goes after it: a turn its shares queued is no later test's pipeline's
    to run (a bot's pipeline recovers every queued Slack turn it finds)."""
    yield
    await memory.drop_tenant(tenant)


def dm_of(tenant: str, user: str) -> Scope:
    return Scope(tenant, f"dm-{user}", channel=f"D-{user}", user=user, visibility=Visibility.DM)


async def nothing_taken(memory, end: StubEnd, scope: Scope) -> bool:
    """No file read or saved, nothing posted, no turn queued."""
    queued = await memory.redis.llen(turn_queue_key(scope.tenant, scope.thread))
    papers = await memory.knowledge_base.papers(scope)
    return (end.posts, end.edits, queued, papers) == ([], [], 0, [])


async def test_a_share_queued_before_its_sharers_erasure_is_not_read(memory, tenant):
    end = StubEnd(shared_pdf("Secret Paper"))
    files = stub_files(memory, end)
    scope = dm_of(tenant, "U1")
    await memory.conversation.append(scope, "user", "earlier words")
    payload = share_payload(scope, f"slack:D-U1:{time.time_ns()}", turn=QUESTION)
    payload.update(queued_at=time.time(), sharer="U1")
    bobs = dm_of(tenant, "U2")
    other = share_payload(bobs, f"slack:D-U2:{time.time_ns()}", turn=QUESTION)
    other.update(queued_at=time.time(), sharer="U2")
    await memory.governance.forget_person(tenant, "U1")
    await files.one(payload)
    assert await nothing_taken(memory, end, scope)

    await files.one(other)  # another person's, queued before the erasure too, is read
    assert len(await memory.knowledge_base.papers(bobs)) == 1
    assert await memory.redis.llen(turn_queue_key(tenant, bobs.thread)) == 1
    again = share_payload(scope, f"slack:D-U1:{time.time_ns()}", turn=QUESTION)
    again.update(queued_at=time.time(), sharer="U1")  # shared anew after the erasure
    await files.one(again)
    [paper] = await memory.knowledge_base.papers(scope)
    assert paper["title"] == "Secret Paper"


async def test_a_share_without_its_queue_time_is_not_read_once_its_sharer_was_erased(
    memory, tenant
):
    """Queued before shares said when: any erasure of the sharer within the note's bound."""
    end = StubEnd(shared_pdf("Older Share"))
    files = stub_files(memory, end)
    scope = dm_of(tenant, "U1")
    await memory.conversation.append(scope, "user", "earlier words")
    await memory.governance.forget_person(tenant, "U1")
    payload = share_payload(scope, f"slack:D-U1:{time.time_ns()}", turn=QUESTION)
    await files.one(payload)
    assert await nothing_taken(memory, end, scope)


async def test_a_given_up_share_of_an_erased_person_says_and_queues_nothing(memory, tenant):
    end = StubEnd(shared_pdf("Given Up"))
    files = stub_files(memory, end)
    scope = dm_of(tenant, "U1")
    await memory.conversation.append(scope, "user", "earlier words")
    payload = share_payload(scope, f"slack:D-U1:{time.time_ns()}", turn=QUESTION)
    payload.update(queued_at=time.time(), sharer="U1")
    await memory.governance.forget_person(tenant, "U1")
    await files.given_up(payload)
    assert await nothing_taken(memory, end, scope)
