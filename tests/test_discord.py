"""The Discord adapter against spec'd discord.py fakes and the real agent (scripted model)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import Any

import discord
import pytest

from adapters.discord import EMPTY_MENTION, DiscordAdapter, intents, thread_name
from adapters.discord_platform import DISCORD_LIMIT, visibility
from adapters.spine import NOT_TAKEN
from adapters.text import split_message
from app import cli
from app.commands import discord_cmd
from app.settings import Settings
from bot.errors import ConfigError
from memory.redis_server import EmbeddedRedis
from memory.scope import Scope, Visibility
from tests.agent_world import close_world, open_world
from tests.conftest import free_port, redis_options
from tests.support.arxiv_replay import MEMGPT_ID
from tests.support.discord_fakes import FakeDiscord
from tests.support.scripted_openai import call, text, tool_calls


def echo(body: dict):
    """Answer every question with itself; a question containing "slow" takes a while."""
    question = re.match(r"# Question\n(.*?)\n\n", body["messages"][1]["content"], re.S)[1]
    return text(f"Answer: {question}", delay=0.3 if "slow" in question else 0.0)


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    world.model.responder = echo
    yield world
    await close_world(world)


@pytest.fixture
def fake() -> FakeDiscord:
    return FakeDiscord()


def new_adapter(world, fake: FakeDiscord) -> DiscordAdapter:
    adapter = DiscordAdapter(world.runtime.turns(), sync=False)
    fake.attach(adapter.client)
    return adapter


@pytest.fixture
def adapter(world, fake) -> DiscordAdapter:
    return new_adapter(world, fake)


async def settle(world, *adapters: DiscordAdapter) -> None:
    for adapter in adapters:
        await adapter.pipeline.wait_idle()
    await world.runtime.harness.drain()


async def history(world, tenant: str, thread_id: str) -> list[tuple[str, str]]:
    messages = await world.runtime.memory.conversation.all(Scope(tenant, thread_id))
    return [(m.role, m.content) for m in messages]


async def test_mention_opens_a_thread_and_answers_there(world, fake, adapter):
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    message = fake.mention(channel, user, "find the MemGPT paper\nplease")
    await adapter.handle_message(message)
    await settle(world, adapter)

    message.create_thread.assert_awaited_once_with(name="find the MemGPT paper")
    thread = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    assert fake.texts(thread.id) == ["Answer: find the MemGPT paper\nplease"]
    assert fake.texts(channel.id) == []  # nothing in the channel itself
    assert fake.typing == [thread.id]
    thread_id = f"discord:{guild.id}:{thread.id}"
    assert await history(world, str(guild.id), thread_id) == [
        ("user", "find the MemGPT paper\nplease"),
        ("assistant", "Answer: find the MemGPT paper\nplease"),
    ]

    # a follow-up in the thread needs no mention
    await adapter.handle_message(fake.message(thread, user, "and its authors?"))
    await settle(world, adapter)
    assert fake.texts(thread.id)[-1] == "Answer: and its authors?"
    assert (await history(world, str(guild.id), thread_id))[-2] == ("user", "and its authors?")


async def test_bots_self_and_unmentioned_channel_messages_are_ignored(world, fake, adapter):
    guild = fake.guild()
    channel = fake.text_channel(guild)
    own_thread = fake.thread(guild, owner_id=fake.bot.id)
    strangers_thread = fake.thread(guild, owner_id=fake.snowflake())
    ignored = [
        fake.mention(channel, fake.user(bot=True), "another bot asks"),
        fake.message(own_thread, fake.bot, "my own answer"),
        fake.message(channel, fake.user(), "no mention, just chatting"),
        fake.message(strangers_thread, fake.user(), "a thread I was never in"),
    ]
    system = fake.mention(channel, fake.user(), "pinned")
    system.type = discord.MessageType.pins_add
    for message in [*ignored, system]:
        await adapter.handle_message(message)
    await settle(world, adapter)
    assert fake.sent == []
    for message in [*ignored, system]:
        message.create_thread.assert_not_awaited()
    assert world.model_requests() == []


async def test_redelivered_message_is_answered_once(world, fake, adapter):
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    message_id = fake.snowflake()
    for _ in range(3):  # the gateway resumes and delivers the same message again
        await adapter.handle_message(fake.mention(channel, user, "hello", message_id=message_id))
    await settle(world, adapter)
    assert [s.text for s in fake.sent] == ["Answer: hello"]
    assert len(world.model_requests()) == 1

    bare_id = fake.snowflake()  # a bare mention gets a hint, once, and no thread
    for _ in range(2):
        bare = fake.mention(channel, user, "", message_id=bare_id)
        await adapter.handle_message(bare)
        bare.create_thread.assert_not_awaited()
    assert [s.text for s in fake.sent][1:] == [EMPTY_MENTION]


async def test_one_thread_runs_in_order_across_processes(world, fake, adapter):
    """Two bot processes share Redis: the second learns the thread from it, and the turns of
    one thread run one at a time in arrival order, even when the first is slow."""
    other = new_adapter(world, fake)
    guild = fake.guild()
    thread = fake.thread(guild, owner_id=fake.snowflake())  # a user's thread, not the bot's
    user = fake.user()
    await adapter.handle_message(fake.mention(thread, user, "slow first question"))
    await other.handle_message(fake.message(thread, user, "second question"))
    await settle(world, adapter, other)

    assert fake.texts(thread.id) == ["Answer: slow first question", "Answer: second question"]
    assert await history(world, str(guild.id), f"discord:{guild.id}:{thread.id}") == [
        ("user", "slow first question"),
        ("assistant", "Answer: slow first question"),
        ("user", "second question"),
        ("assistant", "Answer: second question"),
    ]


async def test_direct_messages_use_the_users_own_memory(world, fake, adapter):
    user = fake.user()
    dm = fake.dm_channel(user)
    await adapter.handle_message(fake.message(dm, user, "hi in private"))
    await settle(world, adapter)
    assert fake.texts(dm.id) == ["Answer: hi in private"]
    assert await history(world, f"dm-{user.id}", f"discord:dm:{dm.id}") == [
        ("user", "hi in private"),
        ("assistant", "Answer: hi in private"),
    ]


async def test_who_spoke_and_who_may_see_it_are_stored(world, fake, adapter):
    guild = fake.guild()
    hidden = fake.text_channel(guild, private=True)  # @everyone cannot view it
    user = fake.user(name="Ada")
    await adapter.handle_message(fake.mention(hidden, user, "a private question"))
    await settle(world, adapter)
    thread = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
    assert thread.parent_id == hidden.id
    await adapter.handle_message(fake.message(thread, user, "a follow-up"))
    await settle(world, adapter)

    scope = Scope(str(guild.id), f"discord:{guild.id}:{thread.id}")
    stored = await world.runtime.memory.conversation.all(scope)
    assert [m.content for m in stored if m.role == "user"] == ["a private question", "a follow-up"]
    assert {(m.author, m.author_name) for m in stored if m.role == "user"} == {
        (str(user.id), "Ada")
    }
    # one thread, one audience: what the first turn learned is visible to the follow-ups
    audiences = {m.audience for m in stored}
    assert len(audiences) == 1, audiences
    assert audiences.pop().startswith("private:")


async def test_a_private_thread_of_a_public_channel_is_private_to_itself(world, fake, adapter):
    """Issue #12: a private thread's turns are its own (`private:<thread>`), never the team's
    because its parent channel is public; a public thread there stays public."""
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user(name="Ada")
    private = fake.thread(guild, owner_id=user.id, parent_id=channel.id)
    private.type = discord.ChannelType.private_thread
    public = fake.thread(guild, owner_id=user.id, parent_id=channel.id)
    public.type = discord.ChannelType.public_thread
    hidden = fake.text_channel(guild, private=True)
    in_hidden = fake.thread(guild, owner_id=user.id, parent_id=hidden.id)
    in_hidden.type = discord.ChannelType.public_thread
    assert visibility(channel) is Visibility.PUBLIC
    assert visibility(private) is Visibility.PRIVATE
    assert visibility(public) is Visibility.PUBLIC
    assert visibility(in_hidden) is Visibility.PRIVATE

    for thread in (private, public):
        await adapter.handle_message(fake.mention(thread, user, "a question among us"))
    await settle(world, adapter)
    for thread, audience in ((private, f"private:{private.id}"), (public, "public")):
        scope = Scope(str(guild.id), f"discord:{guild.id}:{thread.id}")
        stored = await world.runtime.memory.conversation.all(scope)
        assert len(stored) == 2 and {m.audience for m in stored} == {audience}


async def test_a_thread_whose_parent_is_not_cached_is_asked_of_discord(world, fake, adapter):
    """A thread's parent missing from the cache is fetched before the thread's memory gets an
    audience; when Discord cannot say (no access, gone), the thread is private: a cache miss
    never makes a hidden channel's thread team-wide. The same for a command's channel."""
    guild = fake.guild()
    user = fake.user(name="Ada")
    public_parent, hidden_parent = fake.text_channel(guild), fake.text_channel(guild, private=True)
    threads = {}
    for name, parent_id in (("public", public_parent.id), ("hidden", hidden_parent.id),
                            ("gone", fake.snowflake())):  # fmt: skip
        thread = fake.thread(guild, owner_id=user.id, parent_id=public_parent.id)
        thread.type, thread.parent, thread.parent_id = (
            discord.ChannelType.public_thread,
            None,
            parent_id,
        )
        threads[name] = thread
    assert visibility(threads["public"]) is Visibility.PRIVATE  # the cache alone cannot tell

    for thread in threads.values():
        await adapter.handle_message(fake.mention(thread, user, "what do we know?"))
    await settle(world, adapter)
    expected = {"public": "public", "hidden": f"private:{threads['hidden'].id}",
                "gone": f"private:{threads['gone'].id}"}  # fmt: skip
    for name, thread in threads.items():
        scope = Scope(str(guild.id), f"discord:{guild.id}:{thread.id}")
        stored = await world.runtime.memory.conversation.all(scope)
        assert len(stored) == 2 and {m.audience for m in stored} == {expected[name]}, name
    asked = [c.args[0] for c in adapter.client.fetch_channel.call_args_list]
    assert {public_parent.id, hidden_parent.id} <= set(asked)

    # a command whose channel comes uncached: the channel is fetched, then its parent
    for name, thread in threads.items():
        interaction = fake.interaction(thread, user)
        interaction.channel = None
        scope = await adapter.commands.scope(interaction)
        assert scope.audience == expected[name], name

    # a command's channel built from the interaction's partial data (not in the cache) may
    # lack its overwrites, so look public: the channel is fetched instead
    hidden = fake.text_channel(guild, private=True)
    partial = fake.text_channel(guild)  # what the payload alone shows: nothing hidden
    partial.id = hidden.id
    adapter.client.get_channel.side_effect = lambda channel_id: None  # nothing cached
    interaction = fake.interaction(hidden, user)
    interaction.channel = partial
    assert (await adapter.commands.scope(interaction)).audience == f"private:{hidden.id}"

    # the network failing (not an HTTP answer) is "cannot tell" too: private, no exception
    adapter.client.fetch_channel.side_effect = ConnectionResetError("gone")
    interaction = fake.interaction(threads["public"], user)
    interaction.channel = None
    scope = await adapter.commands.scope(interaction)
    assert scope.audience == f"private:{threads['public'].id}"


async def test_summarize_and_expand_commands(world, fake, adapter):
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    await adapter.handle_message(fake.mention(channel, user, "Can you get me the paper MemGPT"))
    await settle(world, adapter)
    thread = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))

    summarize = adapter.tree.get_command("summarize")
    interaction = fake.interaction(thread, user)
    await summarize.callback(interaction)
    interaction.response.defer.assert_awaited_once_with(thinking=True)
    stored = re.search(r"Stored as \[Summary ID: (sum_\w+)\]", fake.texts(thread.id)[-1])
    assert stored, fake.texts(thread.id)

    expand = adapter.tree.get_command("expand")
    assert [p.name for p in expand.parameters] == ["summary_id"]
    interaction = fake.interaction(thread, user)
    await expand.callback(interaction, stored[1])
    interaction.response.defer.assert_awaited_once_with(thinking=True)
    assert "Can you get me the paper MemGPT" in fake.texts(thread.id)[-1]

    interaction = fake.interaction(thread, user)
    await expand.callback(interaction, "sum_missing")  # a miss: only to the person
    (missed,), kwargs = interaction.response.send_message.await_args
    assert "No summary with id 'sum_missing'" in missed and kwargs == {"ephemeral": True}


async def test_summarize_outside_a_known_thread_explains_itself(world, fake, adapter):
    guild = fake.guild()
    channel = fake.text_channel(guild)
    interaction = fake.interaction(channel, fake.user())
    await adapter.commands.summarize(interaction)
    interaction.response.defer.assert_not_awaited()
    interaction.response.send_message.assert_awaited_once()
    args, kwargs = interaction.response.send_message.await_args
    assert "inside a thread" in args[0] and kwargs == {"ephemeral": True}


async def test_long_answer_with_code_is_split_under_the_limit(world, fake, adapter):
    code = "\n".join(f"print('line {i:03d} of a long example')" for i in range(90))
    answer = "Here is the script.\n\n```python\n" + code + "\n```\n\n" + "Notes. " * 300
    assert len(answer) > 2 * DISCORD_LIMIT
    world.model.script(text(answer))
    guild = fake.guild()
    await adapter.handle_message(fake.mention(fake.text_channel(guild), fake.user(), "code?"))
    await settle(world, adapter)

    parts = [s.text for s in fake.sent]
    assert len(parts) >= 3 and all(len(p) <= DISCORD_LIMIT for p in parts)
    assert all(p.count("```") % 2 == 0 for p in parts)  # every part renders its code
    assert parts[0].startswith("Here is the script.")
    assert sum(p.count("of a long example") for p in parts) == 90


async def test_tool_steps_show_in_a_status_message(world, fake, adapter):
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"})),
        text(f"Found MemGPT (arXiv:{MEMGPT_ID})."),
    )
    guild = fake.guild()
    await adapter.handle_message(fake.mention(fake.text_channel(guild), fake.user(), "MemGPT?"))
    await settle(world, adapter)
    status, answer = fake.sent
    assert status.text == "⏳ searching arXiv…"
    assert status.edits == ["✅ searching arXiv (success)"]
    assert answer.text.startswith(f"Found MemGPT (arXiv:{MEMGPT_ID})")


async def test_servers_do_not_see_each_others_memory(world, fake, adapter):
    world.entities = [{"name": "MemGPT", "type": "system", "description": "An LLM OS."}]
    guild_a, guild_b = fake.guild(), fake.guild()
    user = fake.user()
    await adapter.handle_message(fake.mention(fake.text_channel(guild_a), user, "MemGPT?"))
    await settle(world, adapter)
    world.entities = []
    await adapter.handle_message(fake.mention(fake.text_channel(guild_b), user, "MemGPT?"))
    await settle(world, adapter)

    entities = world.runtime.memory.entities
    assert [e.name for e in await entities.all(Scope(str(guild_a.id)))] == ["MemGPT"]
    assert await entities.all(Scope(str(guild_b.id))) == []
    assert "An LLM OS." not in world.model_requests()[-1]["messages"][1]["content"]
    in_a = await adapter.handler.context(Scope(str(guild_a.id), "discord:x:1"), "MemGPT")
    in_b = await adapter.handler.context(Scope(str(guild_b.id), "discord:x:1"), "MemGPT")
    assert "An LLM OS." in in_a.memory_text() and "An LLM OS." not in in_b.memory_text()


async def test_rejected_token_is_a_config_error(world, adapter, monkeypatch):
    async def refuse(token: str, *, reconnect: bool = True) -> None:
        raise discord.LoginFailure("Improper token has been passed.")

    monkeypatch.setattr(adapter.client, "start", refuse)
    with pytest.raises(ConfigError, match="DISCORD_TOKEN"):
        await adapter.start("not-a-token")


def test_missing_token_is_one_clear_line(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("DISCORD_TOKEN", "")  # empty counts as unset
    monkeypatch.chdir(tmp_path)  # and no .env file can fill it in
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    if discord_cmd not in cli.COMMANDS:
        monkeypatch.setattr(cli, "COMMANDS", [*cli.COMMANDS, discord_cmd])
    assert cli.main(["discord"]) == 2
    err = capsys.readouterr().err
    assert "DISCORD_TOKEN is not set" in err and "Traceback" not in err
    with pytest.raises(ConfigError, match="DISCORD_TOKEN"):
        Settings.from_env().require("discord_token", discord_cmd.TOKEN_WHY)


def test_client_setup():
    wanted = intents()
    assert wanted.message_content and wanted.guilds and wanted.guild_messages
    assert wanted.dm_messages and not wanted.members and not wanted.presences
    assert thread_name("  \n" + "x" * 300) == "x" * 99 + "…"
    assert thread_name("") == "ArxivScout"


# -- split_message ---------------------------------------------------------------------------


def test_short_text_is_one_part():
    assert split_message("hello") == ["hello"]
    assert split_message("  \n ") == []


def test_split_prefers_paragraph_boundaries():
    paragraphs = [f"Paragraph {i}. " + "word " * 60 for i in range(20)]
    parts = split_message("\n\n".join(p.strip() for p in paragraphs), 1000)
    assert all(len(p) <= 1000 for p in parts)
    assert all(p.startswith("Paragraph") and p.endswith("word") for p in parts)
    assert sum(p.count("Paragraph") for p in parts) == 20


def test_code_block_is_moved_whole_rather_than_broken():
    block = "```python\n" + "\n".join(f"x_{i} = {i}" for i in range(40)) + "\n```"
    text = "intro " * 120 + "\n\n" + block + "\n\nafter"
    parts = split_message(text, 1000)
    assert len(text) < 2000 and len(parts) == 2
    assert parts[0] == ("intro " * 120).strip() and parts[1] == block + "\n\nafter"


def test_long_code_block_is_closed_and_reopened():
    code = "\n".join(f"value_{i} = compute({i})" for i in range(300))
    parts = split_message(f"```python\n{code}\n```", 500)
    assert len(parts) > 1
    assert all(len(p) <= 500 for p in parts)
    assert all(p.startswith("```python\n") and p.endswith("\n```") for p in parts)
    body = [line for p in parts for line in p.splitlines() if not line.startswith("```")]
    assert body == code.splitlines()


def test_unbreakable_text_is_cut_anywhere():
    parts = split_message("x" * 4500, 2000)
    assert [len(p) for p in parts] == [2000, 2000, 500]
    parts = split_message("```\n" + "y" * 4500 + "\n```", 2000)
    assert all(len(p) <= 2000 and p.count("```") == 2 for p in parts)
    assert "".join(p.replace("```", "").replace("\n", "") for p in parts) == "y" * 4500


@contextlib.asynccontextmanager
async def stoppable(tmp_path, fake: FakeDiscord) -> AsyncIterator[tuple[EmbeddedRedis, Any, Any]]:
    """(server, world, adapter): a Discord adapter on a Redis of its own, which the test stops
    and starts again; the model echoes the question."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port(), **redis_options())
    world = await open_world(server.ensure_running(), tmp_path)
    world.model.responder = echo
    adapter = new_adapter(world, fake)
    try:
        yield server, world, adapter
    finally:
        for task in adapter._waiting:
            task.cancel()
        await adapter.pipeline.close()
        await close_world(world)
        server.stop()


async def back_and_taken(server: EmbeddedRedis, world, adapter) -> None:
    """Redis comes back: what the adapter kept meanwhile is queued (it tries every few
    seconds), and the background work it made is done."""
    assert adapter._waiting  # kept, to be queued again
    server.ensure_running()
    for _ in range(200):
        if not adapter._waiting:
            break
        await asyncio.sleep(0.1)
    await world.runtime.harness.drain()


async def test_a_message_while_memory_is_down_is_said_and_answered_when_back(tmp_path, fake):
    """Discord does not redeliver: the adapter keeps the message and queues it once Redis is
    back, after telling the person."""
    async with stoppable(tmp_path, fake) as (server, world, adapter):
        await adapter.handle_message(
            fake.mention(fake.text_channel(fake.guild()), fake.user(), "hi")
        )
        await settle(world, adapter)  # the bot is in a thread now; its follow-ups need no mention
        thread = next(c for c in fake.channels.values() if isinstance(c, discord.Thread))
        server.stop()
        await adapter.handle_message(fake.message(thread, fake.user(), "still there?"))
        assert fake.texts(thread.id)[-1] == NOT_TAKEN
        await back_and_taken(server, world, adapter)
        for _ in range(200):
            if fake.texts(thread.id)[-1] == "Answer: still there?":
                break
            await asyncio.sleep(0.1)
        assert fake.texts(thread.id) == ["Answer: hi", NOT_TAKEN, "Answer: still there?"]
