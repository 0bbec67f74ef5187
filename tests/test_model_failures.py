"""How a turn ends when the model refuses or cuts its answer: a context too long for the
model's window, a refused request, an answer cut at the output limit or by a content filter, a
stream that ends unfinished. Over the scripted OpenAI-compatible server and a real Redis."""

from __future__ import annotations

import pytest

from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import call, error, text, tool_calls

VLLM_TOO_LONG = (
    "This model's maximum context length is 8192 tokens. However, you requested 9120 tokens "
    "(8096 in the messages, 1024 in the completion). Please reduce the length of the messages."
)


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def long_thread(world, scope: Scope) -> None:
    for i in range(6):
        await world.runtime.memory.conversation.append(
            scope, "user", f"question {i} " + "word " * 120
        )


async def stored_answer(world, scope: Scope) -> str:
    return (await world.runtime.memory.conversation.all(scope))[-1].content


async def test_a_context_too_long_is_sent_again_shrunk_once(world, tenant):
    scope = Scope(tenant, "long")
    await long_thread(world, scope)
    world.model.script(error(400, VLLM_TOO_LONG), text("It fits now."))
    result = await world.agent.run_turn(scope, "And now?")
    assert (result.answer, result.stop_reason) == ("It fits now.", "final")
    first, second = (r["messages"][1]["content"] for r in world.model_requests())
    assert len(second) < len(first)
    assert "question 5" in second and "question 0" not in second  # the oldest went
    assert "And now?" in second  # the question is never cut


async def test_a_context_still_too_long_says_which_setting_fixes_it(world, tenant):
    scope = Scope(tenant, "longer")
    await long_thread(world, scope)
    world.model.script(*[error(400, "too long", code="context_length_exceeded")] * 2)
    result = await world.agent.run_turn(scope, "And now?")
    assert result.stop_reason == "error" and len(world.model_requests()) == 2
    assert "ARXIVSCOUT_CONTEXT_WINDOW" in result.answer and "try again" not in result.answer
    assert await stored_answer(world, scope) == result.answer


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_refused_request_does_not_ask_to_try_again(world, tenant, status):
    world.model.script(error(status, "The model `nope` does not exist or you lack access"))
    result = await world.agent.run_turn(Scope(tenant, "refused"), "What is MemGPT?")
    assert result.stop_reason == "error" and "try again" not in result.answer
    assert "will not help until this is fixed" in result.answer


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_answer_cut_at_the_output_limit_is_kept_with_a_note(world, tenant, streamed):
    scope = Scope(tenant, f"cut-{streamed}")
    world.model.script(text("MemGPT pages memory between", finish_reason="length"))
    shown: list[str] = []
    result = await world.agent.run_turn(
        scope, "What is MemGPT?", on_delta=shown.append if streamed else None
    )
    assert result.stop_reason == "length"
    assert result.answer.startswith("MemGPT pages memory between")
    assert "output limit" in result.answer
    assert await stored_answer(world, scope) == result.answer


async def test_an_output_limit_after_tool_steps_says_what_was_done(world, tenant):
    scope = Scope(tenant, "cut-after-steps")
    world.model.script(tool_calls(call("search_knowledge_base", {"query": "MemGPT"})),
                       text("", finish_reason="length"))  # fmt: skip
    result = await world.agent.run_turn(scope, "What is MemGPT?")
    assert result.stop_reason == "length" and "output limit" in result.answer
    assert "What I did so far:\n- search_knowledge_base: success" in result.answer


async def test_a_filtered_answer_says_so(world, tenant):
    scope = Scope(tenant, "filtered")
    world.model.script(text("Something the filter", finish_reason="content_filter"))
    result = await world.agent.run_turn(scope, "What is MemGPT?")
    assert result.stop_reason == "filtered"
    assert "content filter" in result.answer and "Something" not in result.answer


async def test_a_stream_that_ends_unfinished_is_not_a_complete_answer(world, tenant):
    scope = Scope(tenant, "unfinished")
    world.model.script(text("Hello world, the", finish_reason=None))
    shown: list[str] = []
    result = await world.agent.run_turn(scope, "Say hello", on_delta=shown.append)
    assert "".join(shown)  # the start was shown: it cannot be taken back, so no retry
    assert result.stop_reason == "error" and "cut off" in result.answer
    assert await stored_answer(world, scope) == result.answer
    assert len(world.model_requests()) == 1


async def test_a_stream_that_ends_before_any_text_is_asked_again(world, tenant):
    world.model.script(text("", finish_reason=None), text("Hello there."))
    shown: list[str] = []
    result = await world.agent.run_turn(Scope(tenant, "empty"), "Say hello", on_delta=shown.append)
    assert (result.answer, result.stop_reason) == ("Hello there.", "final")
