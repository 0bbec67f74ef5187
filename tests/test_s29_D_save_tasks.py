"""A pressed Save's task (bot/watch_saves.py), real Redis and a mock Slack: answered even when
it is dead-lettered unrun (its last run took its process down), and not run when its whole
tenant was erased after it was queued (the paper is not written back)."""

from __future__ import annotations

from bot.watch_saves import GIVEN_UP, SAVE
from memory.dead_letters import dead_letters
from memory.governance_tenants import TenantErasures
from memory.scope import Scope
from memory.tasks import Task
from tests.support.pdfs import make_pdf
from tests.test_watches import ON_TOPIC, T0, entry, watch_world  # noqa: F401 (a fixture)

REPLY = {"channel": "C1", "user": "U1"}


async def a_paper(world) -> str:
    paper = entry(*ON_TOPIC[0], T0 - 3600)
    world.replay.add_feed([paper])
    world.replay.pdfs[paper.arxiv_id] = make_pdf(title=paper.title)
    return paper.arxiv_id


async def queued_unread(world, tenant: str, arxiv_id: str):
    """A Save queued by a process that then stopped reading: nobody has run it yet."""
    pressed = world.process()
    await pressed.stop_reading()
    await pressed.queue_save("slack", tenant, arxiv_id, "U1", REPLY)
    return pressed


async def test_a_save_dead_lettered_unrun_is_answered_once(watch_world, tenant):  # noqa: F811
    world = watch_world
    arxiv_id = await a_paper(world)
    pressed = await queued_unread(world, tenant, arxiv_id)
    stream, most = pressed.stream("slack"), pressed.workers["slack"].max_deliveries
    # delivered `most` times to processes that died, the last run begun (and never ended)
    await stream.ensure_group()
    [(task_id, _)] = await stream.redis.xrange(stream.stream)
    await stream.redis.xreadgroup(stream.group, "dead-0", {stream.stream: ">"})
    for n in range(1, most):
        await stream.redis.xclaim(stream.stream, stream.group, f"dead-{n}", 0, [task_id])
    await stream.mark_started([Task(task_id.decode(), SAVE, {}, most)])

    world.process()
    await world.drain()  # claimed past its last delivery: buried unrun, its hook told
    await world.drain()
    told = [p["text"] for p in world.api.of("chat.postEphemeral")]
    assert told == [GIVEN_UP.format(arxiv_id=arxiv_id)]
    [letter] = await dead_letters(stream)
    assert letter.kind == SAVE and letter.error.startswith("not run")
    assert await stream.pending_count() == 0


async def test_a_save_queued_before_its_tenant_was_erased_saves_nothing(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    arxiv_id = await a_paper(world)
    pressed = await queued_unread(world, tenant, arxiv_id)
    await TenantErasures(world.memory).erase(tenant)

    world.process()
    await world.drain()
    assert await world.memory.knowledge_base.papers(Scope(tenant), everywhere=True) == []
    assert world.api.of("chat.postEphemeral") == []  # nobody left to tell
    assert await pressed.stream("slack").pending_count() == 0  # done with, not retried


async def test_a_save_queued_after_its_tenant_was_erased_is_saved(watch_world, tenant):  # noqa: F811
    world = watch_world
    arxiv_id = await a_paper(world)
    await TenantErasures(world.memory).erase(tenant)  # its note stays a day
    await queued_unread(world, tenant, arxiv_id)  # pressed afterwards: queued after the note

    world.process()
    await world.drain()
    [paper] = await world.memory.knowledge_base.papers(Scope(tenant), everywhere=True)
    assert paper["arxiv_id"] == arxiv_id
    [answer] = [p["text"] for p in world.api.of("chat.postEphemeral")]
    assert answer.startswith("Saved")
