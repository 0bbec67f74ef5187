"""The platform spine and the scope: what every platform shares, tested once."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import pytest

from adapters.spine import MEMORY_DOWN, Job, Pipeline, Platform, Status
from memory.errors import memory_unavailable
from memory.keys import InvalidName
from memory.redis_server import EmbeddedRedis
from memory.scope import PUBLIC, Scope, Visibility
from tests.agent_world import close_world, open_world
from tests.conftest import free_port
from tests.support.scripted_openai import error, text


class Recording(Platform):
    """A platform that shows nothing and records what it was asked to send."""

    name = "recording"
    limit = 40

    def __init__(self) -> None:
        self.sent: list[tuple[Job, list[str]]] = []
        self.working_for: list[str] = []
        self.notices: list[str] = []

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        self.working_for.append(job.scope.thread)
        yield Status()

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        if index == 0:
            self.sent.append((job, []))
        self.sent[-1][1].append(part)

    async def notice(self, job: Job, text: str) -> None:
        self.notices.append(text)


def test_scope_privacy_rules():
    public = Scope("team", "t1", "C1", Visibility.PUBLIC, "U1")
    other_public = Scope("team", "t2", "C2", Visibility.PUBLIC, "U2")
    private = Scope("team", "t3", "G1", Visibility.PRIVATE, "U1")
    dm = Scope("team", "t4", "D1", Visibility.DM, "U1")
    other_dm = Scope("team", "t5", "D2", Visibility.DM, "U2")
    assert public.audience == other_public.audience == PUBLIC
    assert private.audience == "private:G1" and dm.audience == "dm:D1"
    for here in (public, other_public, private, dm, other_dm):
        assert here.can_see(PUBLIC) and here.can_see(here.audience)
    assert not public.can_see(private.audience) and not public.can_see(dm.audience)
    assert not other_dm.can_see(dm.audience) and not dm.can_see(private.audience)
    assert private.in_thread("t9").audience == private.audience  # the place, not the thread
    with pytest.raises(InvalidName):
        Scope("no spaces allowed")
    assert Scope.from_dict(dm.to_dict()) == dm


def test_jobs_survive_the_queue_as_json():
    job = Job("turn", Scope("team", "t", "C1", Visibility.PRIVATE, "U1", "Ada"), "hi é",
              event_id="Ev1", reply={"channel": "C1", "thread_ts": "1.2"})  # fmt: skip
    assert Job.from_json(job.to_json()) == job


def test_a_job_from_a_newer_process_is_read_without_its_new_fields():
    """During a rolling deploy a newer process may queue fields this version does not know:
    the job still runs (a TypeError here would stall the thread's queue)."""
    job = Job("turn", Scope("team", "t", "C1"), "hi", source="slack:C1:1.2")
    newer = json.dumps({**json.loads(job.to_json()), "priority": "high"})
    assert Job.from_json(newer) == job


async def test_answers_are_split_to_the_platform_size(redis_url, tmp_path, tenant):
    world = await open_world(redis_url, tmp_path)
    try:
        world.model.script(text("word " * 30))
        platform = Recording()
        pipeline = Pipeline(platform, world.runtime.turns())
        await pipeline.run(Job("turn", Scope(tenant, "t"), "a long answer please"))
        ((_, parts),) = platform.sent
        assert len(parts) > 1 and all(len(p) <= Recording.limit for p in parts)
        assert " ".join(parts).split() == ["word"] * 30
    finally:
        await close_world(world)


async def test_a_failing_turn_ends_in_the_failure_reply(redis_url, tmp_path, tenant):
    world = await open_world(redis_url, tmp_path)
    try:
        world.model.script(error(500), error(500))  # the model fails, retried once
        platform = Recording()
        pipeline = Pipeline(platform, world.runtime.turns())
        await pipeline.run(Job("turn", Scope(tenant, "t"), "anyone there?"))
        ((_, parts),) = platform.sent
        assert "language model" in " ".join(parts)
    finally:
        await close_world(world)


async def test_memory_going_away_is_said_and_the_job_kept(tmp_path, tenant):
    """Redis goes away after the bot started: the person hears why, not silence, and the
    run raises so the job stays queued for when Redis is back."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port())
    world = await open_world(server.ensure_running(), tmp_path)
    try:
        platform = Recording()
        pipeline = Pipeline(platform, world.runtime.turns())
        server.stop()
        with pytest.raises(Exception) as raised:
            await pipeline.run(Job("turn", Scope(tenant, "t"), "anyone there?"))
        assert memory_unavailable(raised.value)
        assert platform.working_for == ["t"]
        ((_, parts),) = platform.sent
        assert parts == [MEMORY_DOWN]
        assert world.model_requests() == []
    finally:
        server.stop()
        with contextlib.suppress(Exception):
            await close_world(world)
