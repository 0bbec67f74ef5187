"""The seed's five-call session in thread "50000", asserted call by call."""

from __future__ import annotations

import json

import pytest

from memory.scope import Scope
from tests.agent_world import MEMGPT_SENTENCE, close_world, open_world
from tests.support.arxiv_replay import MEMGPT_ID
from tests.support.scripted_openai import call, text, tool_calls

THREAD = "50000"


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


def user_context(request: dict) -> str:
    return request["messages"][1]["content"]


def tool_names(request: dict) -> list[str]:
    return [t["function"]["name"] for t in request.get("tools", [])]


async def test_five_call_session(world, tenant):
    agent = world.agent
    world.entities = [
        {"name": "MemGPT", "type": "system", "description": "An LLM operating system."}
    ]

    # Call 1: not in memory -> arxiv_search_candidates, then the answer. Two iterations.
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"})),
        text(f"I found it: MemGPT: Towards LLMs as Operating Systems (arXiv:{MEMGPT_ID})."),
    )
    first = await agent.run_turn(Scope(tenant, THREAD), "Can you get me the paper MemGPT")
    await world.runtime.harness.drain()
    requests = world.model_requests()
    assert first.stop_reason == "final" and first.iterations == 2
    assert [(s.name, s.status) for s in first.steps] == [("arxiv_search_candidates", "success")]
    assert user_context(requests[0]).startswith("# Question\nCan you get me the paper MemGPT\n\n")
    assert "## Conversation Memory" in user_context(requests[0])
    assert "arxiv_search_candidates" in tool_names(requests[0])
    tool_reply = requests[1]["messages"][-1]
    assert tool_reply["role"] == "tool" and f"arXiv:{MEMGPT_ID}" in tool_reply["content"]

    # Call 2: "the paper" resolved from conversation memory; the text goes straight to the KB.
    world.model.script(
        tool_calls(call("fetch_and_save_paper_to_kb", {"arxiv_id": MEMGPT_ID})),
        text("Saved MemGPT to the knowledge base."),
    )
    second = await agent.run_turn(Scope(tenant, THREAD), "Can you save the content of the paper")
    await world.runtime.harness.drain()
    requests = world.model_requests()
    seen = user_context(requests[2])
    assert "[user] Can you get me the paper MemGPT" in seen
    assert "QUERY: Can you get me the paper MemGPT" in seen  # workflow memory of call 1
    assert "MemGPT (system): An LLM operating system." in seen  # entity memory of call 1
    assert [(s.name, s.status) for s in second.steps] == [("fetch_and_save_paper_to_kb", "success")]
    assert second.iterations == 2
    assert await world.runtime.memory.knowledge_base.chunk_count(Scope(tenant), MEMGPT_ID) > 0
    assert all(MEMGPT_SENTENCE not in json.dumps(r) for r in world.model.requests)

    # Call 3: answered from the knowledge base in one iteration, no tool.
    world.model.script(text("MemGPT treats the context window like RAM and pages memory tiers."))
    third = await agent.run_turn(
        Scope(tenant, THREAD), "What are the main key takeaways from the paper"
    )
    await world.runtime.harness.drain()
    requests = world.model_requests()
    assert third.iterations == 1 and third.steps == []
    kb_segment = (
        user_context(requests[4]).split("## Knowledge Base Memory")[1].split("## Workflow")[0]
    )
    assert "main context and an archival store" in kb_segment
    assert f"[arXiv:{MEMGPT_ID}] MemGPT: Towards LLMs as Operating Systems" in kb_segment
    assert f"arxiv.org/abs/{MEMGPT_ID}" in third.answer  # cited with its link

    # Call 4: summarize with the tool; every earlier message carries the summary id.
    world.model.script(
        tool_calls(call("summarize_and_store", {"thread_id": THREAD})),
        text("I summarized our conversation."),
    )
    fourth = await agent.run_turn(
        Scope(tenant, THREAD), "Summarize the conversation so far using your tool"
    )
    await world.runtime.harness.drain()
    assert [(s.name, s.status) for s in fourth.steps] == [("summarize_and_store", "success")]
    summaries = await world.runtime.memory.summaries.for_thread(Scope(tenant, THREAD))
    assert len(summaries) == 1
    summary_id = summaries[0].id
    messages = await world.runtime.memory.conversation.all(Scope(tenant, THREAD))
    assert [m.summary_id for m in messages[:-1]] == [summary_id] * 7
    assert messages[-1].summary_id == "" and messages[-1].role == "assistant"
    assert "Stored as [Summary ID: " in world.model_requests()[-1]["messages"][-1]["content"]

    # Call 5: the context shows the summary id; the model expands it and finds the question.
    world.model.script(
        tool_calls(call("expand_summary", {"summary_id": summary_id})),
        text("Your first question was: Can you get me the paper MemGPT"),
    )
    fifth = await agent.run_turn(Scope(tenant, THREAD), "What was my first question?")
    requests = world.model_requests()
    seen = user_context(requests[-2])
    assert f"[Summary ID: {summary_id}] User asked for MemGPT" in seen
    assert "[user] Can you get me the paper MemGPT" not in seen  # summarized away
    assert "expand_summary" in tool_names(requests[-2])
    assert [(s.name, s.status) for s in fifth.steps] == [("expand_summary", "success")]
    expanded = requests[-1]["messages"][-1]
    assert expanded["role"] == "tool" and "Can you get me the paper MemGPT" in expanded["content"]
    assert fifth.answer == "Your first question was: Can you get me the paper MemGPT"
