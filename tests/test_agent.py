"""The loop's endings, tool failures, offloading, compaction, tool retrieval, background writes."""

from __future__ import annotations

import asyncio

import pytest

from bot.agent import Agent
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.arxiv_replay import MEMGPT_ID
from tests.support.scripted_openai import call, error, text, tool_calls


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


def tool_results(request: dict) -> list[str]:
    return [m["content"] for m in request["messages"] if m["role"] == "tool"]


async def test_failing_tools_and_bad_arguments_go_back_to_the_model(world, tenant):
    world.model.script(
        tool_calls(
            call("expand_summary", {"summary_id": "sum_nope"}),  # the tool raises
            call("search_knowledge_base", '{"query": "memory'),  # not valid JSON
            call("search_knowledge_base", {"k": "many"}),  # does not fit the schema
            call("no_such_tool", {}),
        ),
        text("Sorry, those lookups failed."),
    )
    result = await world.agent.run_turn(Scope(tenant, "t"), "Expand sum_nope please")
    assert result.stop_reason == "final" and result.answer == "Sorry, those lookups failed."
    assert [s.status for s in result.steps] == ["error"] * 4
    results = tool_results(world.model_requests()[-1])
    assert "No summary with id 'sum_nope'" in results[0]
    assert "not valid JSON" in results[1]
    assert "query: required but missing" in results[2]
    assert "unknown tool 'no_such_tool'" in results[3]
    logs = await world.runtime.memory.tool_logs.recent(Scope(tenant, "t"), failed_only=True)
    assert len(logs) == 4 and {entry.iteration for entry in logs} == {1}
    assert any(entry.tool_input == '{"query": "memory' for entry in logs)


async def test_long_tool_output_is_truncated_and_readable_from_the_log(world, tenant):
    world.model.script(
        tool_calls(call("fetch_and_save_paper_to_kb", {"arxiv_id": MEMGPT_ID})),
        # the recorded "testing" search has 100 entries: 20 candidates exceed 3,000 characters
        tool_calls(call("arxiv_search_candidates", {"query": "testing", "max_results": 20})),
        text("done"),
    )
    await world.agent.run_turn(Scope(tenant, "t"), "Save MemGPT and search for testing papers")
    result = tool_results(world.model_requests()[-1])[-1]
    assert result.startswith("1. arXiv:")
    assert "\n\n[Truncated. Full output saved in tool log as log_" in result
    log_id = result.rsplit("tool log as ", 1)[1].split(".")[0]
    entry = await world.runtime.memory.tool_logs.get(Scope(tenant, "t"), log_id)
    assert len(entry.output) > 3000 and entry.output.startswith(result[:3000])
    assert entry.tool_name == "arxiv_search_candidates" and entry.iteration == 2

    world.model.script(
        tool_calls(call("read_tool_log", {"log_id": log_id, "offset": 3000})), text("ok")
    )
    follow_up = await world.agent.run_turn(Scope(tenant, "t"), "Show me the rest of that search")
    assert "read_tool_log" in follow_up.tools_offered
    assert entry.output[3000:3500] in tool_results(world.model_requests()[-1])[-1]


async def test_model_failure_gives_a_useful_reply_and_keeps_the_message(world, tenant):
    world.model.script(error(500), error(503))
    result = await world.agent.run_turn(Scope(tenant, "t"), "What is MemGPT?")
    assert result.stop_reason == "error"
    assert "could not get an answer from the language model" in result.answer
    messages = await world.runtime.memory.conversation.all(Scope(tenant, "t"))
    assert (messages[0].role, messages[0].content) == ("user", "What is MemGPT?")
    assert messages[1].metadata == {"stop_reason": "error"}


async def test_a_failed_turn_teaches_no_workflow_and_no_entity(world, tenant):
    """A turn ended by the model's error (after a tool step, naming a system) or by the
    iteration cap: its steps are no procedure to offer again, its error text no fact."""
    world.entities = [{"name": "MemGPT", "type": "system", "description": "Pages memory."}]
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"})), error(500), error(503)
    )
    result = await world.agent.run_turn(Scope(tenant, "t"), "Find MemGPT")
    assert result.stop_reason == "error" and result.steps
    capped = Agent(world.runtime.harness, max_iterations=1)
    world.model.script(tool_calls(call("search_knowledge_base", {"query": "MemGPT"})))
    assert (await capped.run_turn(Scope(tenant, "t"), "Find MemGPT again")).stop_reason == (
        "max_iterations"
    )
    await world.runtime.harness.drain()
    memory = world.runtime.memory
    assert await memory.workflows.all(Scope(tenant)) == []
    assert await memory.entities.all(Scope(tenant)) == []
    world.model.script(tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"})),
                       text("Found MemGPT."))  # fmt: skip
    await world.agent.run_turn(Scope(tenant, "t"), "Find MemGPT")  # one that ends: it teaches
    await world.runtime.harness.drain()
    assert len(await memory.workflows.all(Scope(tenant))) == 1


async def test_iteration_cap(world, tenant):
    agent = Agent(world.runtime.harness, max_iterations=3)
    world.model.script(
        *[tool_calls(call("search_knowledge_base", {"query": f"q{i}"})) for i in range(3)]
    )
    result = await agent.run_turn(Scope(tenant, "t"), "Loop forever")
    assert result.stop_reason == "max_iterations" and result.iterations == 3
    assert "within 3 steps" in result.answer and "search_knowledge_base: success" in result.answer


async def test_wall_clock_timeout(world, tenant):
    agent = Agent(world.runtime.harness, timeout_seconds=0.5)
    world.model.script(text("too late", delay=3.0))
    result = await agent.run_turn(Scope(tenant, "t"), "Slow question")
    assert result.stop_reason == "timeout" and "ran out of time" in result.answer
    assert (await world.runtime.memory.conversation.all(Scope(tenant, "t")))[
        -1
    ].content == result.answer


async def test_memory_tools_are_offered_when_the_thread_needs_them(world, tenant):
    world.model.script(text("hello"))
    first = await world.agent.run_turn(
        Scope(tenant, "t"), "Find papers on retrieval augmented generation"
    )
    assert "arxiv_search_candidates" in first.tools_offered
    assert "expand_summary" not in first.tools_offered  # no summaries yet
    await world.runtime.harness.consolidator.compact(Scope(tenant, "t"))
    world.model.script(text("ok"))
    second = await world.agent.run_turn(Scope(tenant, "t"), "What is the weather?")
    assert "expand_summary" in second.tools_offered


async def test_compaction_above_80_percent(redis_url, tmp_path, tenant):
    world = await open_world(redis_url, tmp_path, window=3000)
    try:
        for i in range(6):
            await world.runtime.memory.conversation.append(
                Scope(tenant, "t"), "user", f"question {i} " + "word " * 300
            )
        world.model.script(text("fine"))
        result = await world.agent.run_turn(Scope(tenant, "t"), "And now?")
        assert result.stop_reason == "final"
        summaries = await world.runtime.memory.summaries.for_thread(Scope(tenant, "t"))
        assert len(summaries) == 1 and len(summaries[0].message_ids) == 6
        seen = world.model_requests()[-1]["messages"][1]["content"]
        assert f"[Summary ID: {summaries[0].id}]" in seen and "[user] question 0" not in seen
    finally:
        await close_world(world)


async def test_entities_and_workflow_are_written_after_the_reply(world, tenant):
    world.hold_entities = asyncio.Event()
    world.entities = [{"name": "MemGPT", "type": "system", "description": "Pages memory."}]
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"})), text("Found MemGPT.")
    )
    result = await world.agent.run_turn(Scope(tenant, "t"), "Find MemGPT")
    assert result.answer == "Found MemGPT."
    memory = world.runtime.memory
    assert (
        await memory.entities.all(Scope(tenant)) == []
    )  # extraction still pending: reply not delayed
    world.hold_entities.set()
    await world.runtime.harness.drain()
    assert [e.name for e in await memory.entities.all(Scope(tenant))] == ["MemGPT"]
    workflows = await memory.workflows.all(Scope(tenant))
    assert workflows[0].startswith("QUERY: Find MemGPT\nSTEPS:\n1. arxiv_search_candidates(")

    world.entities = [{"name": "memgpt", "type": "system", "description": "From UC Berkeley."}]
    world.model.script(text("It is from UC Berkeley."))
    await world.agent.run_turn(Scope(tenant, "t"), "Who made MemGPT?")
    await world.runtime.harness.drain()
    (entity,) = await memory.entities.all(Scope(tenant))
    assert entity.description == "Pages memory. From UC Berkeley."
