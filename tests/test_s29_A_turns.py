"""A turn's model error tells the channel its kind, never the provider's text; a tool call
nested too deep to parse still ends in an answer; a background write run again after its
entities failed leaves its workflow as the memory page left it. Real Redis, scripted model."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.harness import ENTITY_INSTRUCTIONS
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import call, error, text, tool_calls

KEY_TEXT = "Incorrect API key provided: sk-proj-ab12***********************xy9Z."
INTERNAL = "http://llm-gateway.internal.corp:8443/v1"


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        ([error(401, KEY_TEXT, code="invalid_api_key")], "refused the API key (HTTP 401)"),
        ([error(503, f"upstream {INTERNAL} is down")] * 2, "unavailable (HTTP 503)"),
        ([error(429, f"limit reached for {INTERNAL}")] * 2, "rate limited (HTTP 429)"),
        ([error(404, f"no model at {INTERNAL}")], "refused the request (HTTP 404)"),
    ],
)
async def test_a_model_error_tells_the_channel_its_kind_not_the_providers_text(
    world, tenant, failure, said
):
    scope = Scope(tenant, "refused")
    world.model.script(*failure)
    result = await world.agent.run_turn(scope, "What is MemGPT?")
    assert result.stop_reason == "error"
    assert result.answer.startswith("I could not get an answer from the language model: ")
    assert said in result.answer, result.answer
    for secret in ("sk-proj", "Incorrect API key", INTERNAL, "llm-gateway", world.model.base_url):
        assert secret not in result.answer, result.answer
    stored = (await world.runtime.memory.conversation.all(scope))[-1].content
    assert stored == result.answer


async def test_a_tool_call_nested_too_deep_to_parse_still_ends_in_an_answer(world, tenant):
    scope = Scope(tenant, "deep")
    deep = '{"query": ' + "[" * 100_000 + "]" * 100_000 + "}"
    world.model.script(
        tool_calls(call("arxiv_search_candidates", deep)), text("Ask me more simply.")
    )
    result = await world.agent.run_turn(scope, "Find it")
    assert (result.answer, result.stop_reason) == ("Ask me more simply.", "final")
    stored = (await world.runtime.memory.conversation.all(scope))[-1].content
    assert stored == "Ask me more simply."


def failing_once(world) -> dict[str, int]:
    """The model's entity extraction answers no JSON the first time (the task fails and is
    delivered again), then names Kestrel."""
    calls = {"entities": 0}

    def route(body: dict[str, Any]):
        if body["messages"][0]["content"] != ENTITY_INSTRUCTIONS:
            return world.route(body)
        calls["entities"] += 1
        if calls["entities"] == 1:
            return text("I cannot say.")
        entity = {"name": "Kestrel", "type": "system", "description": "A billing service."}
        return text(json.dumps([entity]))

    world.model.router = route
    return calls


async def a_task(world, scope: Scope) -> dict[str, Any]:
    """A turn's background task: a successful tool step (a workflow to write) and a name."""
    question = "Is Kestrel on arXiv?"
    stored = await world.runtime.memory.conversation.append(scope, "user", question)
    return {
        "scope": scope.to_dict(), "question": question, "answer": "Kestrel: no paper.",
        "steps": ['arxiv_search_candidates({"query": "Kestrel"}) -> success'], "turn": "",
        "asked": {"id": stored.id, "seq": stored.seq, "text": question},
    }  # fmt: skip


@pytest.mark.parametrize("change", ["edited", "deleted"])
async def test_a_retried_write_leaves_the_workflow_as_the_memory_page_left_it(
    world, tenant, change
):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "wf", user="U1")
    calls = failing_once(world)
    task = await a_task(world, scope)
    with pytest.raises(Exception, match="no JSON"):
        await harness.write_artifacts([task])  # the workflow written, its entities failed
    [(workflow_id, _)] = await memory.workflows.nearest(
        scope, (await memory.embedder.embed(["Kestrel"]))[0], k=5
    )
    corrected = "QUERY: find a billing system\nSTEPS:\n1. search -> success\nOUTCOME: none"
    if change == "edited":
        await memory.governance.edit_workflow(tenant, workflow_id, corrected)
    else:
        await memory.governance.forget_workflow(tenant, workflow_id)

    await harness.write_artifacts([task])  # delivered again: the entities are learned now
    assert calls["entities"] == 2
    assert [e.name for e in await memory.entities.all(scope)] == ["Kestrel"]
    expected = [corrected] if change == "edited" else []
    assert await memory.workflows.all(scope) == expected


async def test_summarize_with_the_model_refusing_tells_its_kind_not_the_providers_text(
    world, tenant
):
    scope = Scope(tenant, "cli:summarize-refused")
    for i in range(4):
        await world.runtime.memory.conversation.append(scope, "user", f"Point {i} on paging.")
    world.model.router = lambda body: error(401, KEY_TEXT, code="invalid_api_key")
    answer = await world.runtime.turns().summarize(scope)
    assert answer.startswith("Could not summarize this thread: "), answer
    assert "refused the API key (HTTP 401)" in answer, answer
    assert "Try again in a moment" not in answer  # asking again will not help
    for secret in ("sk-proj", "Incorrect API key", world.model.base_url):
        assert secret not in answer, answer


async def test_summarize_with_the_model_busy_says_to_try_again(world, tenant):
    scope = Scope(tenant, "cli:summarize-busy")
    for i in range(4):
        await world.runtime.memory.conversation.append(scope, "user", f"Point {i} on paging.")
    world.model.router = lambda body: error(503, f"upstream {INTERNAL} is down")
    answer = await world.runtime.turns().summarize(scope)
    assert answer == (
        "Could not summarize this thread: the model service is unavailable (HTTP 503). "
        "Try again in a moment."
    ), answer
