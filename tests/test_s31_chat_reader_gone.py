"""`arxivscout chat ... | head -1`: once stdout's reader is gone, the chat reads no more input.

A reply that could not be written (the pipe's reader closed it) used to be one more platform
failure the turn pipeline caught, so every remaining input line still ran a full model turn
and the command exited 0. Now the chat stops after that turn (its message is stored by it)
and exits quietly with status 1, as any command whose reader went away.
"""

from __future__ import annotations

import json
import subprocess
import sys

from bot.harness import ENTITY_INSTRUCTIONS
from memory.scope import Scope
from tests.support.scripted_openai import ScriptedOpenAI, text

FIRST, SECOND, THIRD = "First question?", "Second question?", "Third question?"


def answer(body: dict) -> object:
    """Entities: none; a turn: one line (the chat writes each reply whole, then a newline)."""
    if body["messages"][0]["content"] == ENTITY_INSTRUCTIONS:
        return text("[]")
    return text("An answer.")


async def test_a_reader_gone_ends_the_chat_before_the_next_line(cli_env, memory, tenant):
    """The second line is sent only after the reader closed stdout, so its reply is the first
    write to fail: the chat must stop there, never reading (or running) the third line."""
    model = ScriptedOpenAI(responder=answer)
    env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": model.start_in_thread()}
    thread = f"cli:gone-{tenant}"
    chat = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "chat", "--tenant", tenant, "--thread", thread],
        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert chat.stdin is not None and chat.stdout is not None and chat.stderr is not None
        chat.stdin.write(f"{FIRST}\n")
        chat.stdin.flush()
        first_reply = chat.stdout.readline()
        chat.stdout.close()  # `head -1` has its line and is gone
        chat.stdin.write(f"{SECOND}\n{THIRD}\n")
        chat.stdin.close()
        code = chat.wait(timeout=300)  # first: a chat left running fails here, not hangs
        errors = chat.stderr.read()
    finally:
        if chat.poll() is None:
            chat.kill()
            chat.wait()
        model.stop()
    assert first_reply == "An answer.\n", first_reply
    assert code == 1, errors
    assert errors == "", errors
    asked = json.dumps(model.requests)
    assert SECOND in asked and THIRD not in asked  # the third line ran no turn
    stored = [m.content for m in await memory.conversation.all(Scope.local(thread, tenant))]
    assert SECOND in stored and THIRD not in stored, stored
