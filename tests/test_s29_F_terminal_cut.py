"""A line longer than the tty keeps (4095 bytes in canonical mode, which the chat's prompt reads
in) is cut as it arrives, silently; pasted, its end marker went with it, so the lines typed next
joined the paste's message. The chat now says the line was cut and ends the paste there (on a
real pseudo-terminal, as a person's paste arrives)."""

from __future__ import annotations

import io
import os

from adapters.terminal import LINE_LIMIT, TerminalChat
from memory.scope import Scope
from tests import test_terminal_paste_s25
from tests.support.scripted_openai import text

START, END = b"\x1b[200~", b"\x1b[201~"
# typed after the paste; two Ctrl-Ds end the chat where the paste swallowed the `/quit`
TYPED_NEXT = b"What is RAG?\n/quit\n\x04\x04"
world, terminal = test_terminal_paste_s25.world, test_terminal_paste_s25.terminal  # fixtures


async def asked_after(
    world, tenant, terminal, typed: bytes, thread: str, later: bytes = TYPED_NEXT
) -> list[str]:
    """The messages the model was asked, `typed` sent at once and `later` typed once the
    first answer comes (as a person types after a paste: not with it)."""
    pending = [later]

    def answer(body):
        if pending:
            os.write(terminal, pending.pop())
        return text("Noted.")

    world.model.responder = answer
    chat = TerminalChat(world.runtime.turns(), Scope.local(thread, tenant), out=io.StringIO())
    os.write(terminal, typed)
    assert await chat.run() == 0
    return [r["messages"][-1]["content"] for r in world.model_requests()]


async def test_a_pasted_line_cut_by_the_tty_ends_the_paste_and_says_so(
    world,
    tenant,
    terminal,
    capfd,
):
    pasted = START + b"a" * 5000 + b" the end" + END + b"\n"
    asked = await asked_after(world, tenant, terminal, pasted, "cli:cut")
    assert len(asked) == 2, [a[-40:] for a in asked]  # the typed line is a message of its own
    assert "a" * 4000 in asked[0] and "What is RAG?" not in asked[0] and "the end" not in asked[0]
    assert "What is RAG?" in asked[1] and "/quit" not in asked[1]
    assert "line cut at the terminal's 4095-byte limit" in capfd.readouterr().err


async def test_a_line_cut_inside_a_character_keeps_its_whole_ones(
    world,
    tenant,
    terminal,
    capfd,
):
    """The tty cuts bytes, not characters: the half character at the cut goes, not the line
    (it was skipped as not UTF-8, and the paste went on into the typed lines)."""
    assert (LINE_LIMIT - len(START)) % 2  # é is 2 bytes: the limit falls inside one
    pasted = START + "é".encode() * 3000 + END + b"\n"
    asked = await asked_after(world, tenant, terminal, pasted, "cli:cut-utf8")
    assert len(asked) == 2, [a[-40:] for a in asked]
    assert "é" * 2000 in asked[0] and "What is RAG?" not in asked[0]
    err = capfd.readouterr().err
    assert "line cut" in err and "not valid UTF-8" not in err, err


async def test_a_paste_with_a_cut_line_inside_stays_one_message(world, tenant, terminal, capfd):
    """Its later lines are there already (a paste arrives whole): the paste goes on to its
    end marker, one message, not one per line after the cut."""
    pasted = START + b"first\n" + b"b" * 5000 + b"\nthird\nfourth" + END + b"\n"
    asked = await asked_after(world, tenant, terminal, pasted, "cli:cut-inside")
    assert len(asked) == 2, [a[-40:] for a in asked]
    assert "first\n" + "b" * 4000 in asked[0] and "b\nthird\nfourth\n" in asked[0]
    assert "What is RAG?" in asked[1]
    assert "line cut at the terminal's 4095-byte limit" in capfd.readouterr().err


async def test_lines_typed_ahead_of_a_cut_paste_are_messages_of_their_own(
    world, tenant, terminal, capfd
):
    """Typed while the chat was busy (there before the paste is read), they do not join the
    cut paste, nor leave the chat waiting for an end marker the tty dropped."""
    pasted = START + b"a" * 5000 + b" the end" + END + b"\n"
    asked = await asked_after(world, tenant, terminal, pasted + TYPED_NEXT, "cli:ahead", b"")
    assert len(asked) == 2, [a[-40:] for a in asked]
    assert "a" * 4000 in asked[0] and "What is RAG?" not in asked[0]
    assert "What is RAG?" in asked[1] and "/quit" not in asked[1]
    assert "line cut at the terminal's 4095-byte limit" in capfd.readouterr().err


async def test_a_paste_typed_ahead_of_a_cut_one_is_a_message_of_its_own(world, tenant, terminal):
    cut = START + b"a" * 5000 + END + b"\n"
    second = START + b"second\nparagraph" + END + b"\n"
    asked = await asked_after(world, tenant, terminal, cut + second + b"/quit\n", "cli:two", b"")
    assert len(asked) == 2, [a[-40:] for a in asked]
    assert "a" * 4000 in asked[0] and "second" not in asked[0]
    assert "second\nparagraph" in asked[1]
