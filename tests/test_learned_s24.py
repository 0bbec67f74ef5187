"""What the bot learns stays as learned, once: an edit on the platform does not undo a memory
page correction, a task run again replaces its own pieces, a failed entity extraction fails the
task (delivered again) instead of learning nothing, null fields are no "None", a long
description loses whole pieces, and a workflow is a procedure that worked, stored once per
question and steps. Real Redis, scripted model (tests/agent_world.py)."""

from __future__ import annotations

import json
import time

import pytest

from bot.harness import ENTITY_INSTRUCTIONS
from bot.llm import LLMError
from bot.spent_tasks import running_delivery
from memory.scope import Scope
from memory.stores.entity_pieces import MAX_DESCRIPTION, bounded, described
from tests import test_governance_learned_retries
from tests.support.scripted_openai import call, error, text, tool_calls
from tests.test_governance_learned import KESTREL, ask, kestrel
from tests.test_governance_learned_retries import pieces, stored_question

world = test_governance_learned_retries.world  # its fixture: an agent world on the test Redis


CUT = '[{"name": "Kestrel", "type": "system", "description": "A launch system."}, {"name": "Ok'


def extraction_replies(world, *replies):
    """The model's entity extraction answers `replies` in turn, then the world's entities."""
    queue = list(replies)

    def route(body):
        if body["messages"][0]["content"] == ENTITY_INSTRUCTIONS and queue:
            return queue.pop(0)
        return world.route(body)

    world.model.router = route


async def test_platform_edit_keeps_a_memory_page_correction(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, "Is Kestrel a zebra?", "A zebra farm.", source="C1:9.1")
    key = memory.entities.key(scope, KESTREL)
    entity_id = key.removeprefix(memory.entities.key_prefix(tenant))
    await memory.governance.edit_entity(tenant, entity_id, "A public tool.")
    await harness.upkeep.message_edited(
        tenant, {"t": "C1"}, "C1:9.1", "Is Kestrel a zebra??", time.time()
    )
    await harness.drain()
    assert await pieces(world, tenant) == ["A public tool."]


async def test_platform_edit_relearns_what_the_question_still_taught(world, tenant):
    harness = world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, "Is Kestrel a zebra?", "A zebra farm.", source="C1:9.1")
    world.entities = [{"name": KESTREL, "type": "system", "description": "A zebra ranch."}]
    await harness.upkeep.message_edited(
        tenant, {"t": "C1"}, "C1:9.1", "Is Kestrel a zebra??", time.time()
    )
    await harness.drain()
    assert await pieces(world, tenant) == ["A zebra ranch."]


async def test_a_task_run_again_before_done_replaces_its_own_pieces(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "ta", user="U1")
    task, _ = await stored_question(world, scope, "Is Kestrel a launch?", "A launch system.")
    learned = memory.governance.learned
    real = learned.written

    async def crash(*args, **kwargs):
        raise ConnectionError("the worker died before marking it done")

    learned.written = crash
    with pytest.raises(ConnectionError):
        await harness.write_artifacts([task])
    learned.written = real
    world.entities = [
        {"name": KESTREL, "type": "system", "description": "Kestrel is a system for launches."}
    ]
    await harness.write_artifacts([task])  # delivered again: the model words it differently
    assert await pieces(world, tenant) == ["Kestrel is a system for launches."]


@pytest.mark.parametrize(
    ("reply", "attempts"),
    [
        (text(CUT, finish_reason="length"), 1),  # its first object parses: not all of it
        (text("I found no entities worth noting."), 1),
        (error(503, "overloaded"), 2),  # the client tries twice (tests/agent_world.py)
    ],
    ids=["cut", "no-json", "unavailable"],
)
async def test_a_failed_extraction_fails_the_task_and_a_retry_learns(
    world, tenant, reply, attempts
):
    harness = world.runtime.harness
    scope = Scope(tenant, "tx", user="U1")
    task, _ = await stored_question(world, scope, "Is Kestrel a launch?", "A launch system.")
    extraction_replies(world, *[reply] * attempts)
    with pytest.raises(LLMError):
        await harness.write_artifacts([task])
    assert await pieces(world, tenant) == []
    await harness.write_artifacts([task])  # the durable task, delivered again
    assert await pieces(world, tenant) == ["A launch system."]


async def test_one_object_is_one_entity_and_null_fields_are_not_none(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "to", user="U1")
    task, _ = await stored_question(world, scope, "Is Kestrel a launch?", "unused")
    single = {"name": KESTREL, "type": None, "description": "A launch system."}
    extraction_replies(world, text(json.dumps(single)))
    await harness.write_artifacts([task])
    assert [(e.type, e.description) for e in await kestrel(world, tenant)] == [
        ("other", "A launch system.")
    ]
    task, _ = await stored_question(world, scope, "Is Okapi a launch?", "unused")
    empty = [{"name": "Okapi", "type": "system", "description": None}]
    extraction_replies(world, text(json.dumps(empty)))
    await harness.write_artifacts([task])
    assert await memory.entities.get(scope, "Okapi") is None


def test_a_long_description_loses_whole_pieces():
    old = ("q1", "Kestrel " + "launches rockets " * 40)
    new = [(f"q{i}", f"Kestrel fact number {i} " + "word " * 40) for i in range(2, 6)]
    kept = bounded([old, *new])
    description = described(kept)
    assert len(description) <= MAX_DESCRIPTION
    assert description.startswith("Kestrel fact number")
    assert all(piece in description for _, piece in kept)
    assert kept[-1] == new[-1]


async def test_failed_steps_store_no_workflow_and_a_repeat_overwrites(world, tenant):
    memory = world.runtime.memory
    scope = Scope(tenant, "C9", "C9", user="U1")
    world.model.script(
        tool_calls(call("no_such_tool", {"query": "x"})), text("I couldn't reach arXiv.")
    )
    await world.agent.run_turn(scope, "Find MemGPT")
    await world.runtime.harness.drain()
    assert await memory.workflows.all(scope) == []
    for answer in ("Found it: MemGPT.", "MemGPT is 2310.08560."):
        world.model.script(
            tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"})), text(answer)
        )
        await world.agent.run_turn(scope, "Find MemGPT")
        await world.runtime.harness.drain()
    workflows = await memory.workflows.all(scope)
    assert len(workflows) == 1 and workflows[0].endswith("MemGPT is 2310.08560.")


def prose_for(world, question: str):
    """The model answers the extraction of `question`'s exchange once in prose (no JSON), and
    every other extraction as the world's entities."""
    left = [question]

    def route(body):
        exchange = body["messages"][-1]["content"]
        if body["messages"][0]["content"] == ENTITY_INSTRUCTIONS and left[0] in exchange:
            left.clear()
            left.append("\0")  # once
            return text("I found no entities worth noting.")
        return world.route(body)

    world.model.router = route


async def test_a_failed_extraction_on_the_last_delivery_gives_up_its_entities(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "tl", user="U1")
    task, _ = await stored_question(world, scope, "Is Kestrel a launch?", "A launch system.")
    prose_for(world, "Is Kestrel a launch?")
    running_delivery(5, 5)  # no run comes after this one
    try:
        await harness.write_artifacts([task])
    finally:
        running_delivery(1, 0)
    assert await pieces(world, tenant) == []
    assert (await memory.turn_records.usage(tenant, "tl"))["model_calls"] == 1


async def test_a_batch_mates_failure_neither_reruns_nor_recounts_a_task(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "tb", user="U1")
    done, _ = await stored_question(world, scope, "Is Kestrel a launch?", "A launch system.")
    failing, _ = await stored_question(world, scope, "Is Kestrel a rocket?", "A launch system.")
    world.entities = []  # nothing learned: the task that ran is known by its mark alone
    prose_for(world, "Is Kestrel a rocket?")
    with pytest.raises(LLMError):
        await harness.write_artifacts([done, failing])
    assert (await memory.turn_records.usage(tenant, "tb"))["model_calls"] == 2  # the failed too
    await harness.write_artifacts([done, failing])  # the batch, delivered again
    assert (await memory.turn_records.usage(tenant, "tb"))["model_calls"] == 3


async def test_a_shared_workflow_stays_rejected_by_another_turns_thumbs_down(world, tenant):
    workflows = world.runtime.memory.workflows
    scope = Scope(tenant, "tw", user="U1")
    steps = ["arxiv_search_candidates(query='MemGPT') -> success"]

    async def rejected(key: str) -> bool:
        return await world.runtime.memory.redis.hget(key, "rejected") == b"1"

    key = await workflows.add(scope, "Find MemGPT", steps, "Found it.", turn="A")
    await workflows.reject(key, True, "A")  # A's 👎
    assert await workflows.add(scope, "Find MemGPT", steps, "It is 2310.08560.", turn="B") == key
    assert await rejected(key)  # B's turn, asked again, does not clear A's 👎
    await workflows.reject(key, False, "A")  # A's 👎 withdrawn: the record is B's now
    assert await rejected(key)
    await workflows.reject(key, True, "B")
    await workflows.reject(key, False, "B")
    assert not await rejected(key)


def test_a_piece_covered_only_by_a_dropped_older_one_is_kept():
    older = ("q1", "Kestrel is a launch system built by Foo. " + "x" * 700)
    covered = ("q2", "Kestrel is a launch system")
    newer = ("q3", "Kestrel flew in 2024. " + "y" * 400)
    kept = bounded([older, covered, newer])
    assert kept == [covered, newer]
    assert described(kept).startswith("Kestrel is a launch system Kestrel flew in 2024.")
