"""A question edited on the platform is learned as it says now, workflow and entities: edited
while its turn answers it (before the turn saved its record), or followed before the turn's
learning task ran, and after edits that bring an old text back (A, B, back to A). Real Redis,
scripted model (tests/agent_world.py)."""

from __future__ import annotations

import json
import time
from typing import Any

from bot.consolidation import SUMMARY_INSTRUCTIONS
from bot.harness import ENTITY_INSTRUCTIONS
from bot.upkeep import ARTIFACTS, EDITED
from memory.scope import Scope
from memory.tasks import Task
from tests import test_governance_learned_retries
from tests.support.scripted_openai import call, text, tool_calls
from tests.test_governance_learned import KESTREL, ask, workflow_queries
from tests.test_governance_learned_retries import pieces, until

world = test_governance_learned_retries.world  # its fixture: an agent world on the test Redis

SOURCE = "C1:9.1"  # the question's message on the platform
ZEBRA, OKAPI = "Is Kestrel a zebra?", "Is Kestrel an okapi grant?"
ZEBRA_PIECE, OKAPI_PIECE = "A zebra farm.", "An okapi grant."


def taught(body: dict[str, Any]):
    """The entity extraction's answer: an okapi piece for an exchange asking of the okapi,
    else a zebra one."""
    piece = OKAPI_PIECE if "okapi" in body["messages"][-1]["content"] else ZEBRA_PIECE
    return text(json.dumps([{"name": KESTREL, "type": "system", "description": piece}]))


def script_tool_turn(world) -> None:
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": KESTREL})), text("Kestrel: ok.")
    )


async def edit_to(world, tenant: str, new: str) -> None:
    await world.runtime.harness.upkeep.message_edited(tenant, {"t": "C1"}, SOURCE, new, time.time())


async def says(world, scope: Scope, question: str) -> bool:
    stored = await world.runtime.memory.conversation.all(scope)
    return [m.content for m in stored if m.role == "user"] == [question]


def edited_while_answered(world, scope: Scope):
    """The model: the agent's first call waits until the question was edited to the okapi text
    and that edit followed (its task done) before it answers; extraction as `taught`."""
    first = [True]

    async def route(body: dict[str, Any]):
        system = body["messages"][0]["content"]
        if system == ENTITY_INSTRUCTIONS:
            return taught(body)
        if system != SUMMARY_INSTRUCTIONS and first:
            first.clear()
            await edit_to(world, scope.tenant, OKAPI)
            await until(lambda: says(world, scope, OKAPI))  # the edit's task is running
            await world.runtime.harness.drain()  # and done: no record then, no relearn queued
        return world.route(body)

    return route


async def test_a_question_edited_while_it_is_answered_is_learned_as_edited(world, tenant):
    scope = Scope(tenant, "t", "C1", user="U1")
    world.model.router = edited_while_answered(world, scope)
    script_tool_turn(world)
    await world.agent.run_turn(scope, ZEBRA, source=SOURCE)
    assert await world.runtime.turns().changed_meanwhile(scope, SOURCE)  # as a turn's caller does
    await world.runtime.harness.drain()
    assert await workflow_queries(world, tenant) == [f"QUERY: {OKAPI}"]
    assert await pieces(world, tenant) == [OKAPI_PIECE]


async def queued(world) -> list[Task]:
    """Every task on the stream not read yet (the background reads no more)."""
    return await world.runtime.harness.background.stream.read(count=100, block_ms=100)


async def run(world, tasks: list[Task]) -> None:
    """Run each task's handler, in this order, and acknowledge it."""
    background = world.runtime.harness.background
    for task in tasks:
        await background.handlers[task.kind]([task.payload])
        await background.stream.ack([task])


async def test_an_edit_followed_before_the_turns_learning_task_keeps_its_workflow(world, tenant):
    harness = world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    await harness.stop_reading()  # the test runs the queued tasks, in the order under test
    world.model.router = lambda body: (
        taught(body) if body["messages"][0]["content"] == ENTITY_INSTRUCTIONS else world.route(body)
    )
    script_tool_turn(world)
    await world.agent.run_turn(scope, ZEBRA, source=SOURCE)  # its record saved, its task queued
    await edit_to(world, tenant, OKAPI)
    first = await queued(world)
    edits = [t for t in first if t.kind == EDITED]
    assert edits and any(t.kind == ARTIFACTS for t in first)
    await run(world, edits)  # followed first: the relearn (no steps) is queued after the turn's
    await run(world, [t for t in first if t.kind != EDITED])  # the turn's task, then the rest
    relearns = await queued(world)
    assert [t.kind for t in relearns].count(ARTIFACTS) == 1
    await run(world, relearns)
    assert await queued(world) == [] and await harness.background.stream.pending_count() == 0
    assert await workflow_queries(world, tenant) == [f"QUERY: {OKAPI}"]
    assert await pieces(world, tenant) == [OKAPI_PIECE]


async def test_an_edit_back_to_an_old_text_learns_it_again(world, tenant):
    harness = world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, ZEBRA, ZEBRA_PIECE, source=SOURCE)
    world.entities = [{"name": KESTREL, "type": "system", "description": OKAPI_PIECE}]
    await edit_to(world, tenant, OKAPI)
    await harness.drain()
    assert await pieces(world, tenant) == [OKAPI_PIECE]
    world.entities = [{"name": KESTREL, "type": "system", "description": ZEBRA_PIECE}]
    await edit_to(world, tenant, ZEBRA)  # back to the first text
    await harness.drain()
    assert await says(world, scope, ZEBRA)
    assert await pieces(world, tenant) == [ZEBRA_PIECE]
    assert await workflow_queries(world, tenant) == [f"QUERY: {ZEBRA}"]
