"""Edits and deletions on the paths around a turn: Slack's `app_mention` sent again for an
edited mention is no new question (an edit that adds the mention is one, answered once); an
edit takes the old text out of other turns' tool logs; a Discord message edited to mention
the bot is answered; a message deleted after a run died mid-turn leaves no "thinking"
placeholder behind; and a follow-up right after a mention, while Slack is still being asked
who and where, is taken.

Real Redis, the local Slack and Discord fakes, the scripted model.
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from adapters.platform_ids import slack_source
from adapters.slack import thread_id
from adapters.spine import DELETED_UNANSWERED, GAVE_UP, Job
from memory.browse import Browse
from memory.keys import seen_event_key
from memory.scope import PUBLIC, Scope
from memory.stores.episodic import Episode
from memory.stores.tool_log import ToolLogEntry, ToolLogStore
from tests import test_discord, test_slack_calls, test_tool_logs_forgotten
from tests.support.discord_fakes import FakeDiscord
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, file_share, mention, message
from tests.test_discord import history, new_adapter, settle
from tests.test_platform_deletions import texts, walrus_thread
from tests.test_platform_edits import edit, to_seals
from tests.test_shared_pdfs import shared_pdf, shared_world
from tests.test_slack import slack_world, thread, ts
from tests.test_slack_calls import ASKED, calls
from tests.test_slack_walls import walled_world
from tests.test_tool_logs_forgotten import SECRET, logs_holding_the_secret, others_read_ada_s_line
from tests.test_walled_summaries_and_logs import read_log

world = test_tool_logs_forgotten.world  # its fixture: a bot process (scripted model)
discord_world = test_discord.world
cached = test_slack_calls.cached  # its fixture: Slack's answers kept, as in production


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        for instance in env.instances:  # every delta may update: the tests drive the pace
            instance.adapter.pipeline.platform.update_every = 0.0
        yield env


@pytest.fixture
async def pdfs(redis_url, tmp_path):
    """One Slack bot process that reads the files shared with it."""
    async with shared_world(redis_url, tmp_path) as env:
        yield env


@pytest.fixture
async def uncached(redis_url, tmp_path):
    """One bot process that keeps no Slack answer: each event asks Slack who and where."""
    async with walled_world(redis_url, tmp_path) as env:
        yield env


async def until(condition) -> None:
    for _ in range(400):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("timed out")


def mention_edited(question: str, ts_: str, **kw) -> dict:
    """The `app_mention` Slack sends again when a message mentioning the bot is edited: a new
    event id, the same ts, `edited` set."""
    event = mention(question, ts_, **kw)
    event["edited"] = {"user": kw.get("user", "U1"), "ts": f"{time.time():.6f}"}
    return event


# -- 1. Slack's app_mention sent again for an edit ------------------------------------------------


async def test_slack_edit_of_a_mention_is_followed_not_asked_again(slack):
    team, memory, here = await walrus_thread(slack)
    assert len(slack.world.model_requests()) == 2
    await slack.a.event(to_seals(), team=team)  # message_changed
    assert (await slack.b.event(mention_edited("when do seals migrate", ts(1)), team=team)).ok
    await slack.settle()
    expected = [
        "when do seals migrate", "Walruses migrate north.",
        "what about the zebra budget", "The budget is fine.",
    ]  # fmt: skip
    assert await texts(memory, here) == expected
    assert len(slack.world.model_requests()) == 2  # not answered again

    # edited again an hour later (the queue's record of the event gone): still not a question
    await memory.redis.delete(seen_event_key(team, f"C1:{ts(1)}"))
    await slack.a.event(mention_edited("when do seals migrate", ts(1)), team=team)
    await slack.settle()
    assert await texts(memory, here) == expected
    assert len(slack.world.model_requests()) == 2
    await memory.drop_tenant(team)


async def test_slack_edit_of_a_mention_still_queued_is_not_queued_again(slack):
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    slack.world.model.script(text("Walruses migrate north."))
    slack.api.hold("chat.startStream", "chat.postMessage")  # its turn waits to show itself
    await slack.a.event(mention("when do walruses migrate", ts(1)), team=team)
    await until(lambda: bool(slack.api.of("chat.startStream") or slack.api.of("chat.postMessage")))
    await slack.b.event(mention_edited("when do walruses migrate?", ts(1)), team=team)
    slack.api.release()
    await slack.settle()
    assert await texts(memory, thread(team, ts(1))) == [
        "when do walruses migrate", "Walruses migrate north.",
    ]  # fmt: skip
    assert len(slack.world.model_requests()) == 1
    await memory.drop_tenant(team)


async def test_slack_edit_that_adds_a_mention_is_answered_once(slack):
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    await slack.a.event(message("when do seals migrate", ts(5)), team=team)  # not for the bot
    await slack.settle()
    assert slack.world.model_requests() == []
    slack.world.model.script(text("Seals go south."))
    for sender in (slack.a, slack.b):  # edited to mention the bot, then edited once more
        await sender.event(mention_edited("when do seals migrate", ts(5)), team=team)
        await slack.settle()
    assert await texts(memory, thread(team, ts(5))) == ["when do seals migrate", "Seals go south."]
    assert len(slack.world.model_requests()) == 1
    await memory.drop_tenant(team)


# -- 2. an edit's old text in other turns' tool logs ------------------------------------------

SOURCE = "slack:C1:1700000001.000001"


async def said_with_source(memory, scope, role, said, at, searchable=True):
    """`tests/support/memory_seed.say`, the secret's message carrying its platform id."""
    extra = {"source": SOURCE} if SECRET in said else {}
    stored = await memory.conversation.append(scope, role, said, timestamp=at, **extra)
    episode = Episode(stored.id, scope.thread, scope.channel, audience=stored.audience,
                      author=stored.author, author_name=stored.author_name, role=role,
                      text=said, ts=at, seq=stored.seq)  # fmt: skip
    await memory.episodes.add(scope, [episode])
    return stored


async def test_an_edit_takes_the_old_text_out_of_other_turns_tool_logs(world, tenant, monkeypatch):
    monkeypatch.setattr(test_tool_logs_forgotten, "say", said_with_source)
    where = test_tool_logs_forgotten.places(tenant)
    logs = await others_read_ada_s_line(world, where)
    memory = world.runtime.memory
    await world.runtime.harness.upkeep.message_edited(
        tenant, {where["ta"].thread: "C1"}, SOURCE, "my okapi password is (removed)", time.time()
    )
    await world.runtime.harness.drain()
    assert not any(SECRET in m.content for m in await memory.conversation.all(where["ta"]))
    assert await logs_holding_the_secret(memory, tenant) == []
    page = await Browse(memory).thread(tenant, where["tb"].thread, {PUBLIC})
    assert page is not None and all(SECRET not in e.output for e in page.tool_logs)
    assert SECRET not in await read_log(world, where["td"], logs.search)
    kept = await memory.tool_logs.get(where["td"], logs.kept)  # showed none of it: stays
    assert "lab meeting moved to Thursday" in kept.output


# -- 3. Discord: a message edited to mention the bot ------------------------------------------


async def test_discord_message_edited_to_mention_the_bot_is_answered_once(discord_world):
    fake = FakeDiscord()
    adapter = new_adapter(discord_world, fake)
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    said = fake.message(channel, user, "when do seals migrate")
    await adapter.handle_message(said)  # not for the bot
    await settle(discord_world, adapter)
    assert discord_world.model_requests() == []

    said.mentions = [fake.bot]  # as Discord sends the edited message
    for _ in range(2):  # the gateway may deliver the update twice
        await adapter.client.on_raw_message_edit(
            edit(said, f"<@{fake.bot.id}> when do seals migrate")
        )
    await settle(discord_world, adapter)
    opened = f"discord:{guild.id}:{said.id}"  # the thread opened from it
    assert await history(discord_world, str(guild.id), opened) == [
        ("user", "when do seals migrate"), ("assistant", "Answer: when do seals migrate"),
    ]  # fmt: skip

    # edited once more: followed in memory, not answered again
    await adapter.client.on_raw_message_edit(
        edit(said, f"<@{fake.bot.id}> when do seals really migrate")
    )
    await settle(discord_world, adapter)
    assert await history(discord_world, str(guild.id), opened) == [
        ("user", "when do seals really migrate"), ("assistant", "Answer: when do seals migrate"),
    ]  # fmt: skip
    assert len(discord_world.model_requests()) == 1
    await adapter.pipeline.close()


# -- 4. a message deleted after a run died mid-turn -------------------------------------------


async def test_a_deletion_after_a_run_died_mid_turn_replaces_its_placeholder(slack):
    team = f"T{time.time_ns()}"
    pipeline = slack.instances[0].adapter.pipeline
    scope = Scope(team, thread_id(team, "C1", ts(8)), channel="C1", user="U1")
    source = slack_source("C1", ts(8))
    job = Job("turn", scope, "a question", reply={"channel": "C1", "thread_ts": ts(8)},
              source=source)  # fmt: skip
    slack.api.knows(ts(8))
    slack.world.model.script(text("never seen", delay=30))

    first = asyncio.create_task(pipeline.run(job))  # the process dies mid-turn
    while "placeholder" not in job.progress or not slack.world.model_requests():
        await asyncio.sleep(0.02)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    placeholder = job.progress["placeholder"]
    assert slack.api.messages[placeholder].streaming  # a stream left open

    await slack.world.runtime.memory.governance.note_deleted(team, source)
    await pipeline.run(Job.from_json(job.to_json()))  # another process runs it again
    assert slack.api.thread_texts("C1", ts(8)) == [DELETED_UNANSWERED]
    assert not slack.api.messages[placeholder].streaming
    assert len(slack.world.model_requests()) == 1
    await slack.world.runtime.memory.drop_tenant(team)


# -- 6a. a follow-up while Slack is still asked about the mention --------------------------------


async def test_a_follow_up_while_slack_is_asked_about_the_mention_is_taken(uncached):
    env, team = uncached, f"T{time.time_ns()}"
    env.world.model.script(text("Walruses migrate north."), text("Seals go south."))
    env.api.hold(*ASKED)  # a slow Slack: the mention waits for who and where
    asked = asyncio.create_task(
        env.a.event(mention("when do walruses migrate", ts(200), user="U2"), team=team)
    )
    await until(lambda: calls(env, "users.info") >= 1)
    follow_up = message("and seals?", ts(201), thread_ts=ts(200), user="U2")
    followed = asyncio.create_task(env.a.event(follow_up, team=team))
    # taken: it asks Slack about its person too; dropped: it is answered at once
    await until(lambda: calls(env, "users.info") >= 2 or followed.done())
    env.api.release()
    await asyncio.gather(asked, followed)
    await env.settle()
    here = Scope(team, thread_id(team, "C1", ts(200)))
    assert [m.content for m in await env.memory.conversation.all(here)] == [
        "when do walruses migrate", "Walruses migrate north.", "and seals?", "Seals go south.",
    ]  # fmt: skip
    await env.memory.drop_tenant(team)


# -- 5. review s24: an edit again before the turn, a follow-up's order, a deleted placeholder ----


async def test_discord_edit_again_before_the_turn_stores_it_is_followed(discord_world):
    fake = FakeDiscord()
    adapter = new_adapter(discord_world, fake)
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.user()
    said = fake.message(channel, user, "when do seals migrate")
    await adapter.handle_message(said)  # not for the bot
    await settle(discord_world, adapter)

    said.mentions = [fake.bot]
    await adapter.client.on_raw_message_edit(edit(said, f"<@{fake.bot.id}> when do seals go"))
    await adapter.client.on_raw_message_edit(  # corrected at once, before the turn runs
        edit(said, f"<@{fake.bot.id}> when do seals migrate south")
    )
    await settle(discord_world, adapter)
    opened = f"discord:{guild.id}:{said.id}"
    assert (await history(discord_world, str(guild.id), opened))[0] == (
        "user", "when do seals migrate south",
    )  # fmt: skip
    assert len(discord_world.model_requests()) == 1
    await adapter.pipeline.close()


async def test_a_follow_up_by_a_known_person_comes_after_the_mention(cached):
    env, team = cached, f"T{time.time_ns()}"
    env.world.model.script(text("Hello."), text("Walruses migrate north."), text("Seals go south."))
    await env.a.event(mention("hello", ts(300), user="U3"), team=team)  # U3 and C1 known now
    await env.settle()
    env.api.hold("users.info")  # U2 is not: the mention waits for Slack
    asked = asyncio.create_task(
        env.a.event(mention("when do walruses migrate", ts(310), user="U2"), team=team)
    )
    await until(lambda: calls(env, "users.info") >= 2)
    followed = asyncio.create_task(  # U3 asks nothing of Slack: at once
        env.a.event(message("and seals?", ts(311), thread_ts=ts(310), user="U3"), team=team)
    )
    # queued before the mention, unless it waits (a few ms when it does not; the hold stays
    # well within the adapter's 2 s per ask even on a stalled event loop)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(followed), 0.2)
    env.api.release()
    await asyncio.gather(asked, followed)
    await env.settle()
    here = Scope(team, thread_id(team, "C1", ts(310)))
    assert [m.content for m in await env.memory.conversation.all(here)] == [
        "when do walruses migrate", "Walruses migrate north.", "and seals?", "Seals go south.",
    ]  # fmt: skip
    await env.memory.drop_tenant(team)


async def died_mid_turn(slack, n: int) -> tuple[str, Job, str]:
    """A turn whose run died with its stream open, its message then deleted: (team, the job
    as saved, its placeholder's ts)."""
    team = f"T{time.time_ns()}"
    pipeline = slack.instances[0].adapter.pipeline
    scope = Scope(team, thread_id(team, "C1", ts(n)), channel="C1", user="U1")
    source = slack_source("C1", ts(n))
    job = Job("turn", scope, "a question", reply={"channel": "C1", "thread_ts": ts(n)},
              source=source)  # fmt: skip
    slack.api.knows(ts(n))
    slack.world.model.script(text("never seen", delay=30))
    first = asyncio.create_task(pipeline.run(job))
    while "placeholder" not in job.progress or not slack.world.model_requests():
        await asyncio.sleep(0.02)
    first.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await first
    await slack.world.runtime.memory.governance.note_deleted(team, source)
    return team, Job.from_json(job.to_json()), job.progress["placeholder"]


async def test_no_give_up_notice_for_a_deleted_message_slack_keeps_failing_on(slack):
    team, job, _ = await died_mid_turn(slack, 20)
    slack.api.fail("chat.update", "service_unavailable", times=20)  # passing, every run
    await slack.instances[0].adapter.pipeline.run(job)  # its last run (nothing saves it)
    assert GAVE_UP not in slack.api.thread_texts("C1", ts(20))
    assert slack.api.of("chat.postMessage") == []
    await slack.world.runtime.memory.drop_tenant(team)


async def test_a_deleted_message_s_placeholder_already_gone_is_not_posted_anew(slack):
    team, job, placeholder = await died_mid_turn(slack, 21)
    del slack.api.messages[placeholder]  # deleted in Slack (by the person, or an admin)
    await slack.instances[0].adapter.pipeline.run(job)
    assert slack.api.thread_texts("C1", ts(21)) == []
    assert slack.api.of("chat.postMessage") == []
    assert slack.api.of("chat.update")  # tried, found gone
    await slack.world.runtime.memory.drop_tenant(team)


async def test_a_message_with_a_pdf_edited_to_mention_the_bot_is_taken_once(pdfs):
    team = f"T{time.time_ns()}"
    pdf = pdfs.api.add_file("x.pdf", shared_pdf("Seal Migration"))
    shared = file_share([pdf], ts(70), text="what does this say")  # not for the bot
    await pdfs.slack.event(shared, team=team)
    await pdfs.settle()
    assert pdfs.api.downloads == []
    pdfs.world.model.script(text("It is about seals."))
    edited = {**shared, "type": "app_mention", "text": f"<@{BOT_USER}> what does this say",
              "edited": {"user": "U1", "ts": f"{time.time():.6f}"}}  # fmt: skip
    edited.pop("subtype")
    await pdfs.slack.event(edited, team=team)  # edited to mention the bot
    await pdfs.settle(until=lambda: len(pdfs.world.model_requests()) == 1)
    await pdfs.settle()
    await pdfs.slack.event(edited, team=team)  # and once more: its own event id
    await pdfs.settle()
    replies = pdfs.api.thread_texts("C1", ts(70))
    assert pdfs.api.downloads == [pdf["id"]]
    assert replies[0].startswith("Saved *Seal Migration*") and replies[-1] == "It is about seals."
    assert len(pdfs.world.model_requests()) == 1
    await pdfs.world.runtime.memory.drop_tenant(team)


async def test_a_log_indexed_while_its_message_is_forgotten_stays_findable(memory, client, tenant):
    """A turn's log indexed under a message just after `forget_showing` read its index (an
    edit, which forgets the old text's logs, while another turn runs): the index keeps it,
    so the message's erasure later finds that log too. The interleaving is made at the
    Redis client's pipeline (a log written right after the first one replies)."""
    scope = Scope(tenant, "slack:T1:C1:1700000001.000001")

    def shown() -> ToolLogEntry:
        return ToolLogEntry(scope.thread, "search_memory", {}, "the zebra budget", "success",
                            message_ids=["m1"])  # fmt: skip

    await memory.tool_logs.write(scope, shown())
    late, pipeline, writes = shown(), client.pipeline, []

    def pipeline_then_a_log(*args, **kwargs):
        pipe = pipeline(*args, **kwargs)
        execute = pipe.execute

        async def executed(*a, **kw):
            replies = await execute(*a, **kw)
            if not writes:  # after the index was read: another turn writes its log
                writes.append(await memory.tool_logs.write(scope, late))
            return replies

        pipe.execute = executed
        return pipe

    client.pipeline = pipeline_then_a_log
    assert await ToolLogStore(client).forget_showing(tenant, ["m1"]) == 1  # the first
    assert writes == [late.id]
    assert await memory.tool_logs.forget_showing(tenant, ["m1"]) == 1  # the late one, found
    assert not await memory.redis.exists(memory.tool_logs.key(tenant, late.id))
