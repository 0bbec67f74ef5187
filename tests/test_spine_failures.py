"""The spine when its lease or its platform fails under a run: a run whose lease another run
took over stops and leaves the job to it (answered once), while a lease the memory forgot with
its data is taken again (the answer still delivered, the job never dropped); a copy of a
job queued while it ran is not answered again; a typing indicator Discord refuses does
not stop the answer; runs a shutdown or memory down ended are not counted as failures; a part
that cannot be sent ends the answer with one notice; a passing failure runs the job again
after a short pause."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from adapters.spine import (
    GAVE_UP,
    MAX_ATTEMPTS,
    MEMORY_DOWN,
    REST_UNSENT,
    Job,
    Pipeline,
    Status,
)
from memory.keys import (
    busy_tenants_key,
    busy_threads_key,
    seen_event_key,
    turn_lock_key,
    turn_queue_key,
    turn_running_key,
)
from memory.redis_server import EmbeddedRedis
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.conftest import free_port
from tests.support.discord_fakes import FakeDiscord
from tests.support.scripted_openai import Reply, call, text, tool_calls
from tests.test_discord import echo, new_adapter, settle
from tests.test_turn_recovery import Board, fast, until


class Parts(Board):
    """A board whose answers come in parts, each recorded with the run that sent it."""

    limit = 30

    def __init__(self) -> None:
        super().__init__()
        self.parts: list[tuple[int, int, str]] = []  # (run, index, part)

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        self.parts.append((job.progress["attempts"], index, part))


class Held:
    """The agent's next model replies, each sent only once the test lets one go: what the test
    does "while the model thinks" lands then however slow the machine, which a delay does not
    promise. The harness's own calls are still answered at once; later ones from the script."""

    def __init__(self, world, *replies: Reply) -> None:
        self._replies, self._go = deque(replies), asyncio.Semaphore(0)
        self._route = world.model.router
        world.model.router = self._answer

    def let_go(self) -> None:
        """Send the reply held (or the next one, as soon as it is asked for)."""
        self._go.release()

    async def _answer(self, body: dict[str, Any]) -> Reply | None:
        routed = self._route(body) if self._route is not None else None
        if inspect.isawaitable(routed):
            routed = await routed
        if routed is not None or not self._replies:
            return routed
        reply = self._replies.popleft()
        await self._go.acquire()
        return reply


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


def stopped_by_its_keeper(caplog: pytest.LogCaptureFixture) -> bool:
    """The run's keeper found its lease lost and stopped it (adapters/spine.py `_keep`)."""
    return any("its run stops" in r.getMessage() for r in caplog.records)


async def delivered(world, scope: Scope, job: Job) -> None:
    turns = world.runtime.memory.turns
    for _ in range(400):
        if await turns.delivered(scope, job.id):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{job.id} was never delivered")


async def test_a_run_whose_lease_was_taken_over_mid_turn_stops_and_the_job_is_answered_once(
    world, tenant, caplog
):
    """Memory was out longer than the lease while the model thought, and another run took the
    job over (it saved its progress): the first run stops there, rather than answer twice."""
    caplog.set_level(logging.WARNING, logger="adapters.spine")
    scope = Scope(tenant, "lapsed")
    first_run = Held(world, tool_calls(call("search_knowledge_base", {"query": "MemGPT"})))
    world.model.script(
        text("second run answer " * 3),
        text("first run answer " * 3),  # had the first run gone on after its tool
    )
    board = Parts()
    pipeline = fast(Pipeline(board, world.runtime.turns()))
    pipeline.start()
    job = Job("turn", scope, "a question", event_id="EvLapsed")
    try:
        assert await pipeline.submit(job)
        await until(lambda: len(world.model_requests()) == 1)  # the model is thinking
        redis, running = world.runtime.memory.redis, turn_running_key(tenant, scope.thread)
        taken_over = Job.from_json((await redis.get(running)).decode())
        taken_over.progress["attempts"] += 1  # as the run taking it over saves it
        await redis.set(running, taken_over.to_json())
        await redis.delete(turn_lock_key(tenant, scope.thread))  # that run died too
        # its tool comes back only once the first run's keeper found the job taken over
        await until(lambda: stopped_by_its_keeper(caplog))
        first_run.let_go()
        await delivered(world, scope, job)
        await pipeline.wait_idle()  # the first run too, had it gone on
    finally:
        await pipeline.close()
    assert [(run, index) for run, index, _ in board.parts] == [(3, 0), (3, 1)]
    assert len(world.model_requests()) == 2  # the first run asked nothing more
    assert "".join(part for *_, part in board.parts).startswith("second run answer")


async def test_a_run_that_cannot_save_does_not_deliver_nor_complete(world, tenant):
    """The lease lapsed and another process holds it before this run's keeper notices: the
    save before the first part is refused, so the answer is left to that process."""
    scope = Scope(tenant, "taken")
    model = Held(world, text("the answer"))
    world.model.script(text("the answer, from its holder"))
    board = Board()
    pipeline = Pipeline(board, world.runtime.turns())  # renews every 5 s: too late here
    job = Job("turn", scope, "a question", event_id="EvTaken")
    redis, lock = world.runtime.memory.redis, turn_lock_key(tenant, scope.thread)
    try:
        assert await pipeline.submit(job)
        await until(lambda: len(world.model_requests()) == 1)
        await redis.set(lock, "another-process", px=60_000)
        model.let_go()
        await pipeline.wait_idle()
        assert board.placeholders == {"p0": "Thinking…"}  # nothing delivered by this run
        assert not await world.runtime.memory.turns.delivered(scope, job.id)
        assert await redis.exists(turn_running_key(tenant, scope.thread))  # still its holder's

        await redis.delete(lock)  # the holder died too: the job is taken over, answered once
        fast(pipeline).start()
        await delivered(world, scope, job)
        await pipeline.wait_idle()
    finally:
        await pipeline.close()
    # the answer this run stored is the one given: the model is not asked again
    assert board.placeholders == {"p0": "the answer"}
    assert len(world.model_requests()) == 1


async def test_a_memory_that_lost_its_data_mid_turn_still_delivers_the_answer(world, tenant):
    """Redis restarted without persistence while the model thought: the lease, the running
    slot and the busy mark are gone, no other run knows of the job; this run takes its lease
    again and delivers the answer, rather than leave the placeholder on "Thinking…"."""
    scope = Scope(tenant, "wiped")
    model = Held(world, text("the answer"))
    world.model.script(text("answered again"))
    board = Board()
    pipeline = fast(Pipeline(board, world.runtime.turns()))
    pipeline.start()
    job = Job("turn", scope, "a question", event_id="EvWiped")
    redis = world.runtime.memory.redis
    try:
        assert await pipeline.submit(job)
        await until(lambda: len(world.model_requests()) == 1)
        await redis.delete(
            turn_lock_key(tenant, scope.thread),
            turn_running_key(tenant, scope.thread),
            busy_threads_key(tenant),
        )
        model.let_go()
        await delivered(world, scope, job)
        await pipeline.wait_idle()
    finally:
        await pipeline.close()
    assert board.placeholders == {"p0": "the answer"}
    assert len(world.model_requests()) == 1
    assert not await redis.exists(turn_lock_key(tenant, scope.thread))  # released at the end


async def test_a_job_the_memory_forgot_while_another_run_took_the_thread_is_queued_again(
    world, tenant
):
    """Redis lost its data while the model thought, and a follow-up's run took the thread's
    lease: that run does not know of the job, so this one gives it back to the queue's head
    (with its answer) rather than drop it; the job is answered once, from that answer."""
    scope = Scope(tenant, "forgotten")
    model = Held(world, text("the answer"))
    world.model.script(text("asked twice"))
    board = Board()
    pipeline = Pipeline(board, world.runtime.turns())  # renews every 5 s: saves first
    job = Job("turn", scope, "a question", event_id="EvForgotten")
    redis, lock = world.runtime.memory.redis, turn_lock_key(tenant, scope.thread)
    try:
        assert await pipeline.submit(job)
        await until(lambda: len(world.model_requests()) == 1)
        await redis.delete(turn_running_key(tenant, scope.thread), busy_threads_key(tenant))
        await redis.set(lock, "a-follow-up's-run", px=60_000)
        model.let_go()
        await pipeline.wait_idle()
        assert board.placeholders == {"p0": "Thinking…"}  # not delivered by this run

        await redis.delete(lock)  # that run is done: the job waits at the head of the queue
        fast(pipeline).start()
        await delivered(world, scope, job)
        await pipeline.wait_idle()
    finally:
        await pipeline.close()
    assert board.placeholders == {"p0": "the answer"}
    assert len(world.model_requests()) == 1


async def test_a_lease_the_memory_forgot_is_taken_back_with_its_job_for_recovery_to_find(
    world, tenant
):
    """Redis lost its data while the model thought, and the run's keeper took the lease back:
    the running slot holds the job again and the thread is listed for recovery again, so a
    process that dies now still has its job taken over rather than lost."""
    scope = Scope(tenant, "retaken")
    model = Held(world, text("the answer"))
    board = Board()
    pipeline = fast(Pipeline(board, world.runtime.turns()))
    job = Job("turn", scope, "a question", event_id="EvRetaken")
    redis, lock = world.runtime.memory.redis, turn_lock_key(tenant, scope.thread)
    running = turn_running_key(tenant, scope.thread)
    try:
        assert await pipeline.submit(job)
        await until(lambda: len(world.model_requests()) == 1)
        await redis.srem(busy_tenants_key(), f"{board.name}:{tenant}")
        await redis.delete(lock, running, busy_threads_key(tenant))
        for _ in range(400):  # the keeper renews every second; the model answers after
            if await redis.exists(lock):
                break
            await asyncio.sleep(0.05)
        assert Job.from_json((await redis.get(running)).decode()).id == job.id
        assert scope in await world.runtime.memory.turns.busy(board.name)
        model.let_go()
        await delivered(world, scope, job)
        await pipeline.wait_idle()
    finally:
        await pipeline.close()
    assert board.placeholders == {"p0": "the answer"}


async def test_a_job_the_memory_forgot_while_its_slot_took_another_job_is_queued_again(
    world, tenant, caplog
):
    """Redis lost its data while the model thought, and another job took the running slot
    under a lease that lapsed since (its run died): this run's job goes back to the queue's
    head for the run taking the thread over, rather than be dropped."""
    caplog.set_level(logging.WARNING, logger="adapters.spine")
    scope = Scope(tenant, "displaced")
    first_run = Held(world, text("lost with its lease"))
    world.model.script(text("the other answer"), text("the answer"))
    board = Board()
    pipeline = fast(Pipeline(board, world.runtime.turns()))
    pipeline.start()
    job, other = Job("turn", scope, "a question"), Job("turn", scope, "another question")
    redis = world.runtime.memory.redis
    try:
        assert await pipeline.submit(job)
        await until(lambda: len(world.model_requests()) == 1)
        await redis.srem(busy_tenants_key(), f"{board.name}:{tenant}")
        wipe = redis.pipeline(transaction=True)  # the keeper sees it all at once
        wipe.delete(turn_lock_key(tenant, scope.thread), busy_threads_key(tenant))
        wipe.set(turn_running_key(tenant, scope.thread), other.to_json())
        await wipe.execute()
        # its answer comes only once its keeper gave the job back (as taken, unanswered)
        await until(lambda: stopped_by_its_keeper(caplog))
        first_run.let_go()
        await delivered(world, scope, other)
        await delivered(world, scope, job)
        await pipeline.wait_idle()
    finally:
        await pipeline.close()
    assert board.placeholders == {"p0": "the answer", "p1": "the other answer"}


async def test_a_copy_of_a_job_queued_while_it_ran_is_not_answered_again(world, tenant):
    """A message queued again while its first run went on (its de-duplication lapsed, or a
    run that lost its lease gave it back) is answered once: the copy finds it delivered."""
    scope = Scope(tenant, "copied")
    world.model.script(text("the answer", delay=1.0), text("answered twice"))
    board = Board()
    pipeline = Pipeline(board, world.runtime.turns())
    job = Job("turn", scope, "a question", event_id="EvCopied")
    redis = world.runtime.memory.redis
    try:
        assert await pipeline.submit(job)
        await until(lambda: len(world.model_requests()) == 1)
        await redis.delete(seen_event_key(tenant, job.event_id))
        assert await pipeline.submit(Job.from_json(job.to_json()))
        await delivered(world, scope, job)
        await pipeline.wait_idle()
        assert not await redis.exists(turn_queue_key(tenant, scope.thread))
    finally:
        await pipeline.close()
    assert board.placeholders == {"p0": "the answer"}
    assert len(world.model_requests()) == 1


class BrokenPart(Parts):
    """A platform that refuses part 1 of every answer for good (no passing failure)."""

    async def deliver(self, job: Job, status: Status, index: int, part: str) -> None:
        if index == 1:
            raise RuntimeError("the platform refused this part")
        await super().deliver(job, status, index, part)


async def test_a_part_that_cannot_be_sent_ends_the_answer_with_one_notice(world, tenant):
    scope = Scope(tenant, "holed")
    world.model.script(text("first part of it. " * 2 + "second part. " * 3 + "third. " * 4))
    board = BrokenPart()
    pipeline = Pipeline(board, world.runtime.turns())
    job = Job("turn", scope, "a question", event_id="EvHoled")
    try:
        assert await pipeline.submit(job)
        await delivered(world, scope, job)
        await pipeline.wait_idle()
    finally:
        await pipeline.close()
    assert [index for _, index, _ in board.parts] == [0]  # nothing after the hole
    assert board.notices == [REST_UNSENT]


class RefusingOnce(Board):
    """A platform whose first placeholder fails in passing (its server did not answer)."""

    def __init__(self) -> None:
        super().__init__()
        self.refused = 0

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        if not self.refused:
            self.refused += 1
            raise ConnectionResetError("the platform did not answer")
        async with super().working(job) as status:
            yield status


async def test_a_passing_failure_runs_the_job_again_after_a_pause_not_a_lapsed_lease(world, tenant):
    """With a lease of a minute, a job left for its lease to lapse would wait that long."""
    scope = Scope(tenant, "paused")
    world.model.script(text("the answer"))
    board = RefusingOnce()
    pipeline = Pipeline(board, world.runtime.turns(), lease_ms=60_000)
    job = Job("turn", scope, "a question", event_id="EvPaused")
    try:
        assert await pipeline.submit(job)
        await delivered(world, scope, job)  # within 20 s
        await pipeline.wait_idle()
    finally:
        await pipeline.close()
    assert board.refused == 1 and board.placeholders == {"p0": "the answer"}


class RefusingAsMemoryForgets(RefusingOnce):
    """The platform fails in passing, and Redis loses its data during the pause that follows
    (after the run saved its progress)."""

    def __init__(self, redis, *keys: str) -> None:
        super().__init__()
        self.redis, self.keys = redis, keys

    @contextlib.asynccontextmanager
    async def working(self, job: Job) -> AsyncIterator[Status]:
        if not self.refused:
            asyncio.get_running_loop().call_later(0.3, self._forget)
        async with super().working(job) as status:
            yield status

    def _forget(self) -> None:
        self.forgetting = asyncio.create_task(self.redis.delete(*self.keys))


async def test_a_job_the_memory_forgot_during_the_pause_after_a_passing_failure_is_answered(
    world, tenant
):
    """The lease (of a minute: not renewed during the pause), the running slot and the busy
    mark are gone when the pause ends: the run takes its job back and answers it."""
    scope = Scope(tenant, "forgotten-paused")
    world.model.script(text("the answer"))
    keys = turn_lock_key(tenant, scope.thread), turn_running_key(tenant, scope.thread)
    board = RefusingAsMemoryForgets(world.runtime.memory.redis, *keys, busy_threads_key(tenant))
    pipeline = Pipeline(board, world.runtime.turns(), lease_ms=60_000)
    pipeline.retry_pause = 1.0
    job = Job("turn", scope, "a question", event_id="EvForgottenPaused")
    try:
        assert await pipeline.submit(job)
        await delivered(world, scope, job)
        await pipeline.wait_idle()
    finally:
        await pipeline.close()
    assert board.refused == 1 and board.placeholders == {"p0": "the answer"}


class RefusedTyping:
    """`channel.typing()` when Discord cannot be reached."""

    async def __aenter__(self) -> None:
        raise aiohttp.ServerDisconnectedError()

    async def __aexit__(self, *exc: object) -> None:
        return None


async def test_a_typing_indicator_discord_refuses_does_not_stop_the_answer(world):
    world.model.responder = echo
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    guild = fake.guild()
    thread = fake.thread(guild, owner_id=fake.snowflake())
    thread.typing.side_effect = RefusedTyping
    await adapter.handle_message(fake.mention(thread, fake.user(), "hello"))
    await settle(world, adapter)  # in the same run: no lease to lapse first
    assert fake.texts(thread.id) == ["Answer: hello"]


async def test_runs_handed_back_at_shutdown_are_not_counted_towards_giving_up(world, tenant):
    """Processes stopping one after another (a rolling deploy, a flapping host) hand the job
    back each time: the next run answers it, rather than give it up as failing."""
    scope = Scope(tenant, "deploys")
    handed_back = MAX_ATTEMPTS
    world.model.script(*[text("slow", delay=30.0)] * handed_back, text("the answer"))
    board = Board()
    job = Job("turn", scope, "a question", event_id="EvDeploys")
    stopping = fast(Pipeline(board, world.runtime.turns()))
    assert await stopping.submit(job)
    for run in range(1, handed_back + 1):
        await until(lambda run=run: len(world.model_requests()) == run)  # the model thinks
        await stopping.shutdown(grace=0.05)
        stopping = fast(Pipeline(board, world.runtime.turns()))
        stopping.start()  # the next process takes the handed back job over
    try:
        await delivered(world, scope, job)
        await stopping.wait_idle()
    finally:
        await stopping.close()
    assert list(board.placeholders.values()) == ["the answer"]
    assert len(world.model_requests()) == handed_back + 1


async def test_runs_memory_ended_are_not_counted_towards_giving_up(tmp_path, tenant):
    """Memory goes away in the middle of the turn again and again (a flapping Redis): each
    time the person is told and the job waits; once memory stays, the turn is answered."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port())
    world = await open_world(server.ensure_running(), tmp_path)
    scope, outages = Scope(tenant, "flapping"), MAX_ATTEMPTS
    model = Held(world, *[text("lost in an outage")] * outages)
    world.model.script(text("the answer"))
    board = Board()
    pipeline = fast(Pipeline(board, world.runtime.turns()))
    job = Job("turn", scope, "a question", event_id="EvFlapping")
    try:
        assert await pipeline.submit(job)
        for outage in range(1, outages + 1):
            await until(lambda outage=outage: len(world.model_requests()) == outage)
            server.stop()
            model.let_go()
            await pipeline.wait_idle()
            assert board.placeholders["p0"] == MEMORY_DOWN
            server.ensure_running()  # back, with its data: the job runs again
        await delivered(world, scope, job)
        await pipeline.wait_idle()
        assert board.placeholders == {"p0": "the answer"}
    finally:
        await pipeline.close()
        await close_world(world)
        server.stop()


async def test_runs_a_full_redis_ended_count_towards_giving_up(tmp_path, tenant):
    """A full Redis (maxmemory, noeviction) still reads, and takes a lease while it is just
    under its limit: each run calls the model, then cannot store the answer. Those runs count,
    so the job ends in GAVE_UP rather than call the model again at every recovery."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port())
    world = await open_world(server.ensure_running(), tmp_path)
    admin = world.runtime.memory.redis
    await admin.config_set("maxmemory-policy", "noeviction")
    scope = Scope(tenant, "full")
    model = Held(world, *[text("not stored")] * MAX_ATTEMPTS)
    world.model.script(text("not stored"))  # had it been asked again
    board = Board()
    pipeline = fast(Pipeline(board, world.runtime.turns()))
    job = Job("turn", scope, "a question", event_id="EvFull")
    try:
        assert await pipeline.submit(job)
        for run in range(1, MAX_ATTEMPTS + 1):
            await until(lambda run=run: len(world.model_requests()) == run)
            await admin.config_set("maxmemory", 1)  # full while the model thinks
            model.let_go()
            await pipeline.wait_idle()
            assert board.placeholders["p0"] == MEMORY_DOWN
            await admin.config_set("maxmemory", 0)  # room again, for a while
        await delivered(world, scope, job)
        await pipeline.wait_idle()
        assert board.placeholders == {"p0": GAVE_UP}
        assert len(world.model_requests()) == MAX_ATTEMPTS
    finally:
        await admin.config_set("maxmemory", 0)
        await pipeline.close()
        await close_world(world)
        server.stop()
