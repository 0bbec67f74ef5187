"""A question pasted in several lines at the interactive prompt is one message: each line was
sent as its own turn. The chat turns the terminal's bracketed paste on, and the lines between
its markers (sent here on a real pseudo-terminal) make one message; lines typed ahead while the
bot answers stay messages of their own (a `/quit` among them runs), and a line that is not UTF-8
is skipped alone."""

from __future__ import annotations

import asyncio
import io
import os
import select
import sys

import pytest

from adapters.terminal import TerminalChat
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import text

PASTE = b"\x1b[200~Compare MemGPT with RAG:\n- how each keeps memory\n- which scales better\n\x1b[201~\n"


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
    os.write(
        terminal,
        b"\x1b[200~Compare MemGPT with RAG:\n- how each \xff keeps memory\n"
        b"- which scales\x1b[201~\n",
    )
    assert await chat.run() == 0
    asked = [r["messages"][-1]["content"] for r in world.model_requests()]
    assert len(asked) == 1, asked
    assert "Compare MemGPT with RAG:\n- which scales" in asked[0], asked[0]
    assert "warning: skipped input line 2: not valid UTF-8" in capfd.readouterr().err


async def test_a_paste_after_typed_text_continues_its_line(world, tenant, terminal):
    """`explain: ` typed, then a paste: the start marker mid-line begins the paste, the typed
    text begins the message, and no marker reaches the model as raw ESC."""
    world.model.responder = lambda body: text("Explained.")
    out = io.StringIO()
    chat = TerminalChat(world.runtime.turns(), Scope.local("cli:midline", tenant), out=out)
    os.write(terminal, b"explain: \x1b[200~line one\nline two\x1b[201~\n/quit\n")
    assert await chat.run() == 0
    asked = [r["messages"][-1]["content"] for r in world.model_requests()]
    assert len(asked) == 1, asked
    assert "explain: line one\nline two" in asked[0], asked[0]
    assert "\x1b" not in asked[0], asked[0]


async def test_lines_typed_ahead_stay_messages_of_their_own(world, tenant, terminal):
    """Typed while the bot answered the first (here: all waiting before it is read): each line
    is its own message, and the `/quit` after them ends the chat."""
    world.model.responder = lambda body: text("Noted.")
    out = io.StringIO()
    chat = TerminalChat(world.runtime.turns(), Scope.local("cli:ahead", tenant), out=out)
    os.write(terminal, b"What is MemGPT?\nWhat is RAG?\n/quit\nNot asked.\n")
    assert await chat.run() == 0
    asked = [r["messages"][-1]["content"] for r in world.model_requests()]
    assert len(asked) == 2, asked
    assert "What is MemGPT?" in asked[0] and "RAG" not in asked[0], asked[0]
    assert "What is RAG?" in asked[1] and "/quit" not in asked[1], asked[1]


async def test_the_chat_turns_bracketed_paste_on_and_off_again(world, tenant, terminal):
    """Written to the terminal (stdout one here): on before the first prompt, off at the end."""
    os.write(terminal, b"/quit\n")
    with open(os.ttyname(sys.stdin.fileno()), "w", encoding="utf-8") as screen:
        chat = TerminalChat(world.runtime.turns(), Scope.local("cli:on", tenant), out=screen)
        assert await chat.run() == 0
    shown = b""
    # what the terminal was sent, read in as many pieces (a guard, not a timing: it is all sent)
    while b"\x1b[?2004l" not in shown and select.select([terminal], [], [], 10)[0]:
        shown += os.read(terminal, 65536)
    assert shown.index(b"\x1b[?2004h") < shown.index(b"\x1b[?2004l"), shown


async def test_a_pastes_markers_are_not_echoed_as_text(world, tenant, terminal):
    """The tty echoes what is typed; with ECHOCTL it would show the markers as `^[[200~`. The
    chat turns that off while it runs (the paste is typed once it has), and back on after."""
    import termios

    fd = sys.stdin.fileno()
    assert termios.tcgetattr(fd)[3] & termios.ECHOCTL  # a pty's default: control chars shown
    world.model.script(text("Noted."))
    with open(os.ttyname(fd), "w", encoding="utf-8") as screen:
        chat = TerminalChat(world.runtime.turns(), Scope.local("cli:echo", tenant), out=screen)
        running = asyncio.create_task(chat.run())
        for _ in range(2000):  # until the chat has set the terminal up (a guard, not a timing)
            if not termios.tcgetattr(fd)[3] & termios.ECHOCTL:
                break
            await asyncio.sleep(0.01)
        os.write(terminal, b"\x1b[200~one\ntwo\x1b[201~\n/quit\n")
        assert await asyncio.wait_for(running, 120) == 0
    shown = b""
    while select.select([terminal], [], [], 0.5)[0]:  # what the screen was sent
        shown += os.read(terminal, 65536)
    assert b"^[[200~" not in shown and b"one" in shown, shown
    assert termios.tcgetattr(fd)[3] & termios.ECHOCTL  # the terminal as it was
