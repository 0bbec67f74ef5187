"""Votes and erasure, and feedback answered in time: a vote landing while its person is erased
goes too; an erased person's only 👎 offers the workflow again and is counted; Discord's
buttons and form are answered while Redis is held (tests/support/gated_world.py); a rolling
summary refused at its marking still counts what its model call cost."""

from __future__ import annotations

import asyncio
import json

import discord
import pytest

from adapters.discord import DiscordAdapter
from adapters.discord_feedback import MAYBE_KEPT
from bot.consolidation import SUMMARY_INSTRUCTIONS
from bot.feedback import SORRY, THANKS, FeedbackService
from memory.keys import turns_by_key
from memory.scope import Scope
from memory.stores.conversation import MarkConflict
from memory.stores.turn_records import VOTER
from tests.agent_world import close_world, open_world
from tests.support import gated_world as world_gate
from tests.support.discord_api import BOT_TOKEN, serving_discord_api, snowflake
from tests.support.discord_fakes import FakeDiscord
from tests.support.scripted_openai import call, text, tool_calls
from tests.test_discord_feedback import DEFERRED, answered, pressed, told
from tests.test_turn_records import scope_of

gated_world = world_gate.gated_world  # its fixture: an agent world reached through a gate


async def test_a_vote_landing_while_its_person_is_erased_goes_too(gated_world, tenant):
    world, gate = gated_world
    memory = world.runtime.memory
    world.model.script(text("one"), text("two"))
    a = await world.agent.run_turn(scope_of(tenant, "ta", "U1"), "first question")
    b = await world.agent.run_turn(scope_of(tenant, "tb", "U1"), "second question")
    await world.runtime.harness.drain()
    feedback = FeedbackService(memory)
    assert await feedback.vote(tenant, a.turn_id, "U2", -1, "Grace") == THANKS
    gate.hold(b"vote:U2")  # the erasure withdrawing the vote it read, on its way to Redis
    erasing = asyncio.create_task(memory.governance.forget_person(tenant, "U2"))
    await gate.held.wait()
    # their 👎 form, submitted meanwhile
    assert await feedback.comment(tenant, b.turn_id, "U2", "my words", [], "Grace") == SORRY
    gate.release.set()
    erasure = await erasing
    for turn in (a, b):
        assert (await memory.turn_records.get(tenant, turn.turn_id)).feedback == {}
    assert not await memory.redis.exists(turns_by_key(tenant, VOTER, "U2"))
    assert erasure.votes == 2


async def test_an_erased_person_s_only_down_vote_is_withdrawn_counted_and_unrejects(
    redis_url, tmp_path, tenant
):
    """They only voted (no message of theirs): the erasure is no "No person", it says how many
    votes went, and the workflow their 👎 rejected is offered again."""
    world = await open_world(redis_url, tmp_path)
    try:
        memory, scope = world.runtime.memory, scope_of(tenant)
        question = "search the knowledge base for virtual context"
        world.model.script(
            tool_calls(call("search_knowledge_base", {"query": "virtual context"})),
            text("nothing saved on that yet"),
        )
        result = await world.agent.run_turn(scope, question)
        await world.runtime.harness.drain()
        vector = (await memory.embedder.embed([question]))[0]
        assert len(await memory.workflows.similar(scope, vector)) == 1
        assert await FeedbackService(memory).vote(tenant, result.turn_id, "U2", -1) == THANKS
        assert await memory.workflows.similar(scope, vector) == []  # rejected

        erasure = await memory.governance.forget_person(tenant, "U2")
        assert erasure.votes == 1
        assert (await memory.turn_records.get(tenant, result.turn_id)).feedback == {}
        assert len(await memory.workflows.similar(scope, vector)) == 1  # offered again
    finally:
        await close_world(world)


@pytest.fixture
async def discord_env(gated_world):
    world, gate = gated_world
    async with serving_discord_api() as api:
        fake = FakeDiscord()
        adapter = DiscordAdapter(world.runtime.turns(), sync=False)
        fake.attach(adapter.client)
        await adapter.client._async_setup_hook()
        await adapter.client.http.static_login(BOT_TOKEN)
        yield world, gate, fake, adapter, api
        await adapter.client.http.close()


async def answer_in_a_thread(world, fake, adapter) -> tuple[discord.Thread, list, int, str]:
    world.model.script(text("An answer."))
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    await adapter.handle_message(fake.mention(channel, user, "a question"))
    await adapter.pipeline.wait_idle()
    thread = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    components = thread.send.await_args_list[-1].kwargs["view"].to_components()
    [turn] = await world.runtime.memory.turn_records.ids(str(guild.id))
    return thread, components, guild.id, turn


async def test_discord_buttons_are_answered_while_redis_holds_the_vote(discord_env):
    """Discord wants an answer within 3 s: a 👍 is deferred before its vote is written, and a
    👎 whose vote does not come back in time says it may not be recorded (no form), and is
    still kept after, its workflow rejected."""
    world, gate, fake, adapter, api = discord_env
    thread, components, guild, turn = await answer_in_a_thread(world, fake, adapter)
    state, voter = adapter.client._connection, snowflake()

    gate.hold(f"vote:{voter}".encode())  # the vote's script, on its way to Redis
    state.parse_interaction_create(pressed(guild, thread.id, voter, f"feedback:up:{turn}",
                                           components))  # fmt: skip
    await gate.held.wait()
    [up] = await answered(api, 1)  # while the vote is held
    assert up["type"] == DEFERRED and up["data"]["flags"] & 64
    gate.release.set()
    assert await told(api, 1) == [THANKS]

    memory, scope = world.runtime.memory, Scope(str(guild), str(thread.id))
    steps = ["arxiv_search_candidates(query='x') -> success"]
    workflow = await memory.workflows.add(scope, "a question", steps, "An answer.", turn=turn)
    await memory.turn_records.set_workflow(str(guild), turn, workflow)
    gate.hold(f"vote:{voter}".encode())
    state.parse_interaction_create(pressed(guild, thread.id, voter, f"feedback:down:{turn}",
                                           components))  # fmt: skip
    await gate.held.wait()
    down = (await answered(api, 2))[1]  # while the vote is still held
    assert down["data"]["content"] == MAYBE_KEPT and down["data"]["flags"] & 64
    gate.release.set()  # the vote goes on after its answer: kept, and its workflow rejected
    async with asyncio.timeout(30):  # a guard against hanging, not a timing assert
        while await memory.redis.hget(workflow, "rejected") != b"1":
            await asyncio.sleep(0.05)
    record = await memory.turn_records.get(str(guild), turn)
    assert record.feedback[str(voter)].rating == -1


async def test_a_rolling_summary_refused_at_its_marking_still_counts_its_model_call(
    redis_url, tmp_path, tenant
):
    world = await open_world(redis_url, tmp_path, memory_tokens=200)
    memory, scope = world.runtime.memory, Scope(tenant, "rolled")
    asked, answer = asyncio.Event(), asyncio.Event()

    async def held_summaries(body: dict):
        if body["messages"][0]["content"] != SUMMARY_INSTRUCTIONS:
            return world.route(body)
        asked.set()
        await answer.wait()
        return text(json.dumps({"description": "numbers", "summary": "some numbers"}))

    world.model.router = held_summaries
    try:
        said = [
            await memory.conversation.append(scope, "user", f"secret number {i} is {1000 + i}")
            for i in range(30)
        ]
        rolling = asyncio.create_task(
            world.runtime.harness.upkeep.roll_summaries([{"scope": scope.to_dict()}])
        )
        await asked.wait()
        await memory.governance.forget_message(tenant, scope.thread, said[0].id)
        answer.set()
        with pytest.raises(MarkConflict):  # retried by the background task
            await rolling
        assert (await memory.turn_records.usage(tenant, scope.thread))["model_calls"] == 1
    finally:
        await close_world(world)
