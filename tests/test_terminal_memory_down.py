"""The terminal chat with Redis unreachable: it says to send the message again (it keeps no
queue, nothing runs it again), and a slash command says Redis is down instead of ending the
chat with a traceback. Redis is made unreachable by a proxy in front of the real one."""

from __future__ import annotations

import io

import pytest

from adapters.terminal import TerminalChat
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import text
from tests.test_redis_timeouts import redis_proxy


@pytest.fixture
async def chat_and_proxy(redis_url, tmp_path, tenant):
    async with redis_proxy(redis_url) as proxy:
        world = await open_world(proxy.url_for(redis_url), tmp_path)
        out = io.StringIO()
        chat = TerminalChat(world.runtime.turns(), Scope.local("cli:down", tenant), out=out)
        chat.interactive = False
        try:
            yield chat, proxy, world, out
        finally:
            proxy.restore()
            await close_world(world)


async def test_a_message_with_redis_down_is_to_be_sent_again(chat_and_proxy):
    chat, proxy, world, out = chat_and_proxy
    proxy.cut()
    await chat.turn("What is MemGPT?")
    said = out.getvalue()
    assert said.count("send it again once Redis is back") == 1, said
    assert "I will answer here" not in said  # no queue here: nothing would
    proxy.restore()
    world.model.script(text("MemGPT pages memory."))
    await chat.turn("What is MemGPT?")  # the chat went on
    assert "MemGPT pages memory." in out.getvalue()


@pytest.mark.parametrize("line", ["/summarize", "/expand sum_1", "/context papers"])
async def test_a_command_with_redis_down_says_so_and_the_chat_goes_on(chat_and_proxy, line):
    chat, proxy, _world, out = chat_and_proxy
    proxy.cut()
    assert await chat.command(line) is True
    command = line.split()[0]
    assert f"unreachable right now, so {command} could not run" in out.getvalue()
