"""A share whose read spans an erasure keeps nothing, says so in its message ("Not kept"),
and queues no turn (adapters/shared_files.py `_erased`): its sharer erased (`forget_person`
notes them, then takes their PDFs while nothing is saved yet, so the PDF saved after would stay
with their id and their question be answered), or its channel deleted on the platform
(`forget_place`'s note, also for a thread not in memory yet). The platform end erases while the
file downloads: the end is the test's, no code of ours patched. Real Redis."""

from __future__ import annotations

import time

import pytest

from adapters.shared_files import PERSON_ERASED, PLACE_DELETED, TENANT_ERASED, not_kept
from adapters.slack import thread_id
from memory.governance_places import DeletedPlace
from memory.keys import turn_queue_key
from memory.scope import Scope, Visibility
from memory.stores.knowledge_base import shares_of
from tests.test_shared_pdfs import StubEnd, share_payload, shared_pdf, stub_files
from tests.test_shares_after_erasure import QUESTION, dm_of


@pytest.fixture(autouse=True)
async def dropped_after(memory, tenant):
    yield
    await memory.drop_tenant(tenant)


class ErasingEnd(StubEnd):
    """A platform whose download returns once `erase` ran: the read spans the erasure."""

    def __init__(self, data: bytes, erase) -> None:
        super().__init__(data)
        self.erase, self.erased = erase, 0

    async def fetch(self, file, max_bytes):
        if not self.erased:
            self.erased += 1
            await self.erase()
        return await super().fetch(file, max_bytes)


def channel_of(tenant: str, visibility: Visibility) -> Scope:
    return Scope(tenant, thread_id(tenant, "C1", "1700000000.000100"), channel="C1", user="U1",
                 visibility=visibility)  # fmt: skip


async def kept_nothing(memory, scope: Scope) -> bool:
    queued = await memory.redis.llen(turn_queue_key(scope.tenant, scope.thread))
    return (await memory.knowledge_base.papers(scope, everywhere=True), queued) == ([], 0)


@pytest.mark.parametrize("visibility", [Visibility.DM, Visibility.PUBLIC])
async def test_a_share_read_across_its_sharers_erasure_keeps_nothing(memory, tenant, visibility):
    dm = visibility is Visibility.DM
    scope = dm_of(tenant, "U1") if dm else channel_of(tenant, visibility)
    await memory.conversation.append(scope, "user", "earlier words")  # theirs, to erase
    end = ErasingEnd(shared_pdf("Secret Paper"),
                     lambda: memory.governance.forget_person(tenant, "U1"))  # fmt: skip
    files = stub_files(memory, end)
    payload = share_payload(scope, f"slack:{scope.channel}:{time.time_ns()}", turn=QUESTION)
    payload.update(queued_at=time.time(), sharer="U1")
    await files.one(payload)  # the PDF saved after the erasure took their PDFs
    assert end.erased == 1
    assert await kept_nothing(memory, scope)
    # its message said "Saved" a moment before; it no longer does. In a channel, without why:
    # every member would learn of the sharer's erasure (in their DM, only they read it)
    said = "Not kept: the person who shared it was erased since." if dm else "Not kept."
    assert end.edits[-1][1] == said
    await files.one(payload)  # delivered again: nothing read, nothing queued
    assert await kept_nothing(memory, scope)


async def test_a_share_read_across_its_channels_deletion_keeps_nothing(memory, tenant):
    scope = channel_of(tenant, Visibility.PRIVATE)
    await memory.conversation.append(scope, "user", "earlier words")  # the thread is listed
    place = DeletedPlace(tenant, "slack", "C1")
    end = ErasingEnd(shared_pdf("Walled Paper"), lambda: memory.governance.forget_place(place))
    files = stub_files(memory, end)
    payload = share_payload(scope, f"slack:C1:{time.time_ns()}", turn=QUESTION)
    payload.update(queued_at=time.time(), sharer="U1")
    await files.one(payload)
    assert end.erased == 1
    assert await kept_nothing(memory, scope)
    assert end.edits[-1][1].startswith("Saved")  # its channel is gone: nothing to edit there


def test_only_a_persons_erasure_goes_unsaid_in_a_channel():
    """`not_kept` hides why in a channel only for the sharer's erasure, which every member
    would learn of; the workspace's erasure or a deletion is no one's secret."""
    channel = channel_of("T1", Visibility.PUBLIC)
    assert not_kept(PERSON_ERASED, channel) == "Not kept."
    for why in (TENANT_ERASED, PLACE_DELETED):
        assert not_kept(why, channel) == f"Not kept: {why}."
        assert not_kept(why, dm_of("T1", "U1")) == f"Not kept: {why}."


async def test_a_new_threads_share_read_across_its_channels_deletion_keeps_nothing(memory, tenant):
    """A top-level mention with a PDF starts its thread: nothing of it is stored, nor busy,
    until this share queues its turn, and the channel holds nothing else: its deletion finds no
    thread to note, the channel's own note says it."""
    scope = channel_of(tenant, Visibility.PUBLIC)
    place = DeletedPlace(tenant, "slack", "C1")
    end = ErasingEnd(shared_pdf("Unseen Paper"), lambda: memory.governance.forget_place(place))
    files = stub_files(memory, end)
    payload = share_payload(scope, f"slack:C1:{time.time_ns()}", turn=QUESTION)
    payload.update(queued_at=time.time(), sharer="U1")
    await files.one(payload)
    assert end.erased == 1
    assert await kept_nothing(memory, scope)
    other = Scope(tenant, thread_id(tenant, "C2", "1700000000.000200"), channel="C2")
    assert await memory.governance.places.deleted(tenant, [scope.thread, other.thread]) == [
        scope.thread
    ]  # another channel's thread is not taken for deleted


async def test_another_persons_share_read_meanwhile_is_kept(memory, tenant):
    """The check is the sharer's: someone else erased during the read changes nothing."""
    other = dm_of(tenant, "U2")
    await memory.conversation.append(other, "user", "their words")
    scope = dm_of(tenant, "U1")
    end = ErasingEnd(
        shared_pdf("Kept Paper"), lambda: memory.governance.forget_person(tenant, "U2")
    )
    files = stub_files(memory, end)
    payload = share_payload(scope, f"slack:D-U1:{time.time_ns()}", turn=QUESTION)
    payload.update(queued_at=time.time(), sharer="U1")
    await files.one(payload)
    [paper] = await memory.knowledge_base.papers(scope)
    assert paper["title"] == "Kept Paper"
    assert await memory.redis.llen(turn_queue_key(tenant, scope.thread)) == 1


async def test_a_share_read_across_its_sharers_erasure_leaves_the_copy_another_share_holds(
    memory, tenant
):
    """U2 shares again, in a private channel, a PDF U1 shared there: U2's share, read across
    U2's erasure, joined U1's copy. It leaves that copy (without U2's thread or id), which
    stays U1's, rather than staying listed, or taking U1's copy with it."""
    first = Scope(tenant, thread_id(tenant, "G1", "1700000000.000100"), channel="G1", user="U1",
                  visibility=Visibility.PRIVATE)  # fmt: skip
    second = Scope(tenant, thread_id(tenant, "G1", "1700000000.000200"), channel="G1", user="U2",
                   visibility=Visibility.PRIVATE)  # fmt: skip
    for scope in (first, second):
        await memory.conversation.append(scope, "user", "a paper for you")
    data = shared_pdf("Held Paper")
    payload = share_payload(first, f"slack:G1:{time.time_ns()}")
    payload.update(queued_at=time.time(), sharer="U1")
    await stub_files(memory, StubEnd(data)).one(payload)
    [paper] = await memory.knowledge_base.papers(first)

    end = ErasingEnd(data, lambda: memory.governance.forget_person(tenant, "U2"))
    payload = share_payload(second, f"slack:G1:{time.time_ns()}", turn=QUESTION)
    payload.update(queued_at=time.time(), sharer="U2")
    await stub_files(memory, end).one(payload)

    assert end.erased == 1
    assert end.edits[-1][1] == "Not kept."
    [kept] = await memory.knowledge_base.papers(first)
    assert kept["arxiv_id"] == paper["arxiv_id"]
    assert [(s["sharer"], s["thread"]) for s in shares_of(kept)] == [("U1", first.thread)]
    assert await memory.redis.llen(turn_queue_key(tenant, second.thread)) == 0
