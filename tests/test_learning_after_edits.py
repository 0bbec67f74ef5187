"""A question edited on the platform is learned as it says now, workflow and entities: edited
while its turn answers it (before the turn saved its record), or followed before the turn's
learning task ran (before or after the edit's relearn), and after edits that bring an old text
back (A, B, back to A); a task that failed half-way runs again whole, under one workflow key for
its turn, and one that died after writing the old text's pieces (edited meanwhile) leaves
none of them; an edit followed again learns its text once. Real Redis (through a gate where a
run must die half-way), scripted model (tests/agent_world.py)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from bot.consolidation import SUMMARY_INSTRUCTIONS
from bot.harness import ENTITY_INSTRUCTIONS
from bot.llm import LLMResponseError
from bot.upkeep import ARTIFACTS, EDITED
from memory.governance_learned import DONE
from memory.scope import Scope
from memory.stores.base import decode
from memory.tasks import Task
from tests import test_governance_learned_retries
from tests.support import gated_world as world_gate
from tests.support.redis_gate import RedisGate
from tests.support.scripted_openai import call, text, tool_calls
from tests.test_governance_learned import KESTREL, ask, workflow_queries
from tests.test_governance_learned_retries import WAIT, pieces, until

world = test_governance_learned_retries.world  # its fixture: an agent world on the test Redis
gated_world = world_gate.gated_world  # its fixture: an agent world reached through a gate

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


async def answered_then_edited(world, tenant: str) -> list[Task]:
    """The zebra question answered (its record saved, its learning task queued) and then edited
    to the okapi text, no task run yet: the queued tasks, for the test to run in the order
    under test."""
    await world.runtime.harness.stop_reading()
    world.model.router = lambda body: (
        taught(body) if body["messages"][0]["content"] == ENTITY_INSTRUCTIONS else world.route(body)
    )
    script_tool_turn(world)
    await world.agent.run_turn(Scope(tenant, "t", "C1", user="U1"), ZEBRA, source=SOURCE)
    await edit_to(world, tenant, OKAPI)
    return await queued(world)


async def test_an_edit_followed_before_the_turns_learning_task_keeps_its_workflow(world, tenant):
    harness = world.runtime.harness
    first = await answered_then_edited(world, tenant)
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


STEPS = ['arxiv_search_candidates({"query": "Kestrel"}) -> success']


async def edited_question(world, scope: Scope, asked: str, now: str) -> dict[str, Any]:
    """A question stored as `asked` and edited to `now` (followed) before its turn saved a
    record (no relearn is queued): its turn's learning task, as the turn queues it."""
    stored = await world.runtime.memory.conversation.append(scope, "user", asked, source=SOURCE)
    await edit_to(world, scope.tenant, now)
    await world.runtime.harness.drain()
    assert await says(world, scope, now)
    return {
        "scope": scope.to_dict(), "question": asked, "answer": "Kestrel: ok.", "steps": STEPS,
        "turn": "", "asked": {"id": stored.id, "seq": stored.seq, "text": asked},
    }  # fmt: skip


def extraction_cut_once(world) -> None:
    """The model's first entity extraction is cut off (its task fails, to be delivered
    again); the others answer as `taught`."""
    cut = [text("[", finish_reason="length")]

    def route(body: dict[str, Any]):
        if body["messages"][0]["content"] != ENTITY_INSTRUCTIONS:
            return world.route(body)
        return cut.pop() if cut else taught(body)

    world.model.router = route


async def failed_once(world, task: dict[str, Any]) -> None:
    """Run the task, its entity extraction failing (as `extraction_cut_once` scripts)."""
    with pytest.raises(LLMResponseError):
        await world.runtime.harness.write_artifacts([task])


async def test_an_edited_questions_task_failing_half_way_learns_it_whole_again(world, tenant):
    scope = Scope(tenant, "t", "C1", user="U1")
    task = await edited_question(world, scope, ZEBRA, OKAPI)
    extraction_cut_once(world)
    await failed_once(world, task)  # the okapi text's workflow written, its entities not
    await world.runtime.harness.write_artifacts([task])  # delivered again
    assert await workflow_queries(world, tenant) == [f"QUERY: {OKAPI}"]
    assert await pieces(world, tenant) == [OKAPI_PIECE]


async def test_a_turn_learned_as_edited_keeps_one_workflow_after_an_edit_back(world, tenant):
    harness = world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    task = await edited_question(world, scope, ZEBRA, OKAPI)
    extraction_cut_once(world)
    await failed_once(world, task)  # the okapi text's workflow written, its entities not
    await edit_to(world, tenant, ZEBRA)  # back to the text the turn was asked as
    await harness.drain()
    await harness.write_artifacts([task])  # delivered again: asked as it says now
    assert await workflow_queries(world, tenant) == [f"QUERY: {ZEBRA}"]
    assert await pieces(world, tenant) == [ZEBRA_PIECE]


async def test_an_edit_followed_again_does_not_learn_its_text_twice(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    asked = await ask(world, scope, ZEBRA, ZEBRA_PIECE, source=SOURCE)
    world.entities = [{"name": KESTREL, "type": "system", "description": OKAPI_PIECE}]
    await edit_to(world, tenant, OKAPI)
    await harness.drain()
    assert await pieces(world, tenant) == [OKAPI_PIECE]
    world.entities = [{"name": KESTREL, "type": "system", "description": "Okapis, reworded."}]
    await memory.governance.learned.edited(tenant, asked, OKAPI)  # its follow delivered again
    [stored] = [m for m in await memory.conversation.all(scope) if m.id == asked]
    relearn = {  # and its relearn, as bot/upkeep.py `_learn_again` queues it
        "scope": scope.to_dict(), "question": OKAPI, "answer": "Kestrel: ok.", "steps": [],
        "turn": "", "asked": {"id": asked, "seq": stored.seq, "text": OKAPI},
    }  # fmt: skip
    await harness.write_artifacts([relearn])
    assert await pieces(world, tenant) == [OKAPI_PIECE]


async def test_an_edits_relearn_run_before_the_turns_task_keeps_its_workflow(world, tenant):
    first = await answered_then_edited(world, tenant)
    await run(world, [t for t in first if t.kind == EDITED])
    relearns = [t for t in await queued(world) if t.kind == ARTIFACTS]
    assert [t.payload["steps"] for t in relearns] == [[]]
    await run(world, relearns)  # the relearn first: the okapi text's entities learned
    await run(world, [t for t in first if t.kind != EDITED])  # then the turn's own task
    assert await workflow_queries(world, tenant) == [f"QUERY: {OKAPI}"]
    assert await pieces(world, tenant) == [OKAPI_PIECE]
    memory = world.runtime.memory
    [record] = await memory.turn_records.of_thread(tenant, "t")
    said = decode(await memory.redis.hget(record.workflow, "text")) if record.workflow else ""
    assert (said or "").startswith(f"QUERY: {OKAPI}")  # the turn's record points at it


def edited_while_extracting(world, gate: RedisGate, tenant: str):
    """The model's first entity extraction: the question is edited to the okapi text and that
    edit followed (its `edited` finds no entity noted yet) before it answers as `taught`; the
    run's marks (set once all is written) are then held at the gate."""
    first = [True]

    async def route(body: dict[str, Any]):
        if body["messages"][0]["content"] != ENTITY_INSTRUCTIONS:
            return world.route(body)
        if first:
            first.clear()
            await edit_to(world, tenant, OKAPI)
            await run(world, [t for t in await queued(world) if t.kind == EDITED])
            gate.hold(DONE.encode())  # its marks, set once it wrote
        return taught(body)

    return route


async def test_an_edit_while_extracting_then_a_failure_after_writing_leaves_no_old_piece(
    gated_world, tenant
):
    """The run dies after writing the old text's piece, before it marks it written or finds
    the edit: delivered again, it learns the new text and takes the old text's piece out."""
    world, gate = gated_world
    harness = world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    await harness.stop_reading()  # the test runs the turn's task itself
    script_tool_turn(world)
    await world.agent.run_turn(scope, ZEBRA, source=SOURCE)
    [task] = [t.payload for t in await queued(world) if t.kind == ARTIFACTS]
    world.model.router = edited_while_extracting(world, gate, tenant)
    first = asyncio.create_task(harness.write_artifacts([task]))
    async with asyncio.timeout(WAIT):
        await gate.held.wait()  # the zebra piece written, its marks held
    assert await pieces(world, tenant) == [ZEBRA_PIECE]
    gate.cut()  # Redis lost: the run dies there
    with pytest.raises(RedisConnectionError):
        await first
    gate.mend()
    await harness.write_artifacts([task])  # delivered again
    assert await pieces(world, tenant) == [OKAPI_PIECE]
    assert await workflow_queries(world, tenant) == [f"QUERY: {OKAPI}"]


async def test_a_turns_task_delivered_again_keeps_a_workflow_corrected_on_the_memory_page(
    world, tenant
):
    """The turn's TOLD mark: its learning task delivered again (its batch failed elsewhere)
    does not write its workflow over the text a person corrected on the memory page."""
    memory, harness = world.runtime.memory, world.runtime.harness
    await harness.stop_reading()
    world.model.router = lambda body: (
        taught(body) if body["messages"][0]["content"] == ENTITY_INSTRUCTIONS else world.route(body)
    )
    script_tool_turn(world)
    await world.agent.run_turn(Scope(tenant, "t", "C1", user="U1"), ZEBRA, source=SOURCE)
    tasks = [t for t in await queued(world) if t.kind == ARTIFACTS]
    assert tasks
    await run(world, tasks)
    prefix = memory.workflows.key_prefix(tenant)
    [key] = [decode(k) async for k in memory.redis.scan_iter(match=f"{prefix}*")]
    corrected = f"QUERY: {ZEBRA}\n1. Ask the team before searching arXiv."
    await memory.governance.edit_workflow(tenant, key.removeprefix(prefix), corrected)
    await run(world, tasks)  # delivered again
    assert await memory.workflows.all(Scope(tenant)) == [corrected]
