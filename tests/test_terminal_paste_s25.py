"""A question pasted in several lines at the interactive prompt is one message: each line was
sent as its own turn. A terminal (here a real pseudo-terminal) hands input() one line at a
time; the rest of the paste, already waiting, now joins it."""

from __future__ import annotations

import io
import os
import sys

import pytest

from adapters.terminal import TerminalChat
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import text

PASTE = b"Compare MemGPT with RAG:\n- how each keeps memory\n- which scales better\n"


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    try:
        yield world
    finally:
        await close_world(world)


@pytest.fixture
def terminal(monkeypatch):
    """stdin on a pseudo-terminal; yields the fd a test types into."""
    typist, screen = os.openpty()
    stdin = open(screen, encoding="utf-8", closefd=False)  # noqa: SIM115 (closed below)
    monkeypatch.setattr(sys, "stdin", stdin)
    try:
        yield typist
    finally:
        stdin.close()
        os.close(typist)
        os.close(screen)


async def test_a_pasted_block_of_lines_is_one_turn(world, tenant, terminal):
    def answer_then_quit(body):
        os.write(terminal, b"/quit\n")  # typed after the answer: a message of its own
        return text("MemGPT pages its memory; RAG retrieves.")

    world.model.responder = answer_then_quit
    out = io.StringIO()
    chat = TerminalChat(world.runtime.turns(), Scope.local("cli:paste", tenant), out=out)
    assert chat.interactive
    os.write(terminal, PASTE)  # all of it is waiting before the first line is read
    assert await chat.run() == 0
    asked = world.model_requests()
    assert len(asked) == 1, [r["messages"][-1]["content"] for r in asked]
    question = asked[0]["messages"][-1]["content"]
    assert "Compare MemGPT with RAG:\n- how each keeps memory\n- which scales better" in question
    assert out.getvalue().count("MemGPT pages its memory; RAG retrieves.") == 1


async def test_a_line_of_a_paste_that_is_not_utf8_is_skipped_alone(world, tenant, terminal, capfd):
    """The garbled line is skipped with a warning; the lines around it still make the message."""

    def answer_then_quit(body):
        os.write(terminal, b"/quit\n")
        return text("Both page.")

    world.model.responder = answer_then_quit
    out = io.StringIO()
    chat = TerminalChat(world.runtime.turns(), Scope.local("cli:garbled", tenant), out=out)
    os.write(terminal, b"Compare MemGPT with RAG:\n- how each \xff keeps memory\n- which scales\n")
    assert await chat.run() == 0
    asked = [r["messages"][-1]["content"] for r in world.model_requests()]
    assert len(asked) == 1, asked
    assert "Compare MemGPT with RAG:\n- which scales" in asked[0], asked[0]
    assert "warning: skipped input line 2: not valid UTF-8" in capfd.readouterr().err
