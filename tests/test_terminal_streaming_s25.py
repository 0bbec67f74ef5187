"""The interactive terminal chat shows a streamed answer once. The model's words before a tool
step ("Let me search.") were kept with the answer's, so the delivered answer (the last reply
alone, stripped) no longer began with what was shown, and was printed a second time."""

from __future__ import annotations

import io

import pytest

from adapters.terminal import TerminalChat
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import call, text, tool_calls

ANSWER = "MemGPT pages memory between a main context and an archival store."


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    world.model.stream_chunk_chars = 5
    try:
        yield world
    finally:
        await close_world(world)


def interactive_chat(world, tenant: str) -> tuple[TerminalChat, io.StringIO]:
    """A chat as on a terminal (stdin is no terminal under pytest): its answers stream."""
    out = io.StringIO()
    chat = TerminalChat(world.runtime.turns(), Scope.local("cli:stream", tenant), out=out)
    chat.interactive = True
    chat.pipeline.platform.streams = True
    return chat, out


async def test_words_before_a_tool_step_do_not_print_the_answer_twice(world, tenant):
    world.model.script(
        tool_calls(call("search_knowledge_base", {"query": "MemGPT"}), content="Let me search."),
        text(f"  {ANSWER}\n"),  # the answer is delivered stripped
    )
    chat, out = interactive_chat(world, tenant)
    await chat.turn("What is MemGPT?")
    shown = out.getvalue()
    assert shown.count(ANSWER) == 1, shown
    assert shown.count("Let me search.") == 1, shown
    lines = shown.splitlines()
    assert lines[0] == "scout> Let me search.", shown  # the tool step starts on its own line
    assert lines[1].startswith("  → search_knowledge_base"), shown
    assert any(line.startswith("scout> ") and ANSWER in line for line in lines[2:]), shown


async def test_an_answer_without_a_tool_step_is_shown_once(world, tenant):
    world.model.script(text(f"\n{ANSWER}  "))
    chat, out = interactive_chat(world, tenant)
    await chat.turn("What is MemGPT?")
    assert out.getvalue().count(ANSWER) == 1, out.getvalue()
