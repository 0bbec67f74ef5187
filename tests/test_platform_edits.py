"""A message its author edits in Slack or Discord is edited in the bot's memory too: the
adapters queue a durable background task that finds the stored message by its platform id
(`metadata["source"]`) and gives it the new text in its place, in episodic memory and in the
summaries over it; a turn still queued for it runs with the new text. Edits are not answered."""

from __future__ import annotations

import asyncio
import time
from dataclasses import asdict
from typing import Any

import discord

from adapters.platform_ids import discord_source, slack_source
from memory.keys import edited_message_key
from memory.scope import Scope
from tests import test_discord, test_platform_deletions
from tests.support.discord_fakes import FakeDiscord
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, mention, message
from tests.test_discord import back_and_taken, new_adapter, settle, stoppable
from tests.test_governance import all_summary_text, check_invariant
from tests.test_platform_deletions import (
    WAIT,
    deleted,
    discord_walrus_thread,
    found,
    held_model,
    texts,
    walrus_thread,
)
from tests.test_slack import thread, ts

slack = test_platform_deletions.slack  # its fixture: two Slack processes on one Redis
world = test_discord.world  # its fixture: a world whose model echoes the question


def edited(ts_: str, now: str, before: str, thread_ts: str | None = None, channel: str = "C1",
           user: str = "U1", **extra: Any) -> dict:  # fmt: skip
    """Slack's `message_changed` event for a message edited from `before` to `now`."""
    new = {"type": "message", "user": user, "text": now, "ts": ts_,
           "edited": {"user": user, "ts": f"{time.time():.6f}"}, **extra}  # fmt: skip
    old = {"type": "message", "user": user, "text": before, "ts": ts_}
    if thread_ts:
        new["thread_ts"] = old["thread_ts"] = thread_ts
    return {"type": "message", "subtype": "message_changed", "hidden": True, "channel": channel,
            "channel_type": "channel", "message": new, "previous_message": old,
            "event_ts": f"{time.time():.6f}", "ts": f"{time.time():.6f}"}  # fmt: skip


def to_okapi() -> dict:
    """`walrus_thread`'s reply (ts 2), edited."""
    return edited(ts(2), "what about the okapi grant", "what about the zebra budget", ts(1))


def to_seals() -> dict:
    """`walrus_thread`'s mention (ts 1), edited."""
    return edited(ts(1), f"<@{BOT_USER}> when do seals migrate",
                  f"<@{BOT_USER}> when do walruses migrate", ts(1))  # fmt: skip


async def noted(memory, tenant: str, source: str) -> bool:
    """Whether an edit of `source` was taken (noted, and its task queued)."""
    return bool(await memory.redis.exists(edited_message_key(tenant, source)))


# -- Slack ---------------------------------------------------------------------------------------


async def test_slack_edit_is_followed_in_the_thread_episodic_memory_and_summaries(slack):
    team, memory, here = await walrus_thread(slack)
    await slack.world.runtime.harness.consolidator.compact(here)  # a summary over all four
    before = await memory.conversation.all(here)
    assert "zebra" in await all_summary_text(memory, here)
    assert await memory.redis.exists(memory.embedder._key("what about the zebra budget"))

    okapi = to_okapi()
    to_okapi_at = okapi["message"]["edited"]["ts"]
    assert (await slack.a.event(okapi, team=team)).status == 200
    await slack.settle()

    after = await memory.conversation.all(here)
    assert [m.content for m in after] == [
        "when do walruses migrate", "Walruses migrate north.",
        "what about the okapi grant", "The budget is fine.",
    ]  # fmt: skip
    assert [(m.id, m.seq, m.summary_id) for m in after] == [
        (m.id, m.seq, m.summary_id) for m in before
    ]  # same place, same id, still under its summary
    assert after[2].metadata["source"] == slack_source("C1", ts(2))
    assert after[2].metadata["edited_at"] == float(to_okapi_at)
    assert "what about the okapi grant" in await found(memory, here, "okapi grant")
    assert not any("zebra" in hit for hit in await found(memory, here, "zebra budget"))
    summaries = await all_summary_text(memory, here)
    assert "zebra" not in summaries and "okapi" in summaries
    await check_invariant(memory, here)
    assert not await memory.redis.exists(memory.embedder._key("what about the zebra budget"))
    questions = [r.question for r in await memory.turn_records.of_thread(team, here.thread)]
    assert sorted(questions) == ["what about the okapi grant", "when do walruses migrate"]
    assert not await memory.turn_records.edit_question(team, after[3].id, "no")  # an answer's
    questions = [r.question for r in await memory.turn_records.of_thread(team, here.thread)]
    assert "no" not in questions

    # the mention is taken as a new message is: without the bot's mention
    await slack.b.event(to_seals(), team=team)
    await slack.settle()
    assert (await texts(memory, here))[0] == "when do seals migrate"
    assert len(slack.world.model_requests()) == 2  # no edit was answered


async def test_slack_bot_updates_and_unfurls_queue_nothing(slack):
    team, memory, here = await walrus_thread(slack)
    own = edited(ts(3), "Walruses migrate north, mostly.", "Walruses migrate north.", ts(1),
                 user=BOT_USER, bot_id="B1")  # fmt: skip
    said = "what about the zebra budget"
    unfurled = edited(ts(2), said, said, ts(1), attachments=[{"from_url": "https://zebra.org"}])
    for event in (own, unfurled):
        assert (await slack.a.event(event, team=team)).status == 200
    await slack.settle()
    assert not await noted(memory, team, slack_source("C1", ts(3)))
    assert not await noted(memory, team, slack_source("C1", ts(2)))

    # a real edit of the same message is followed
    await slack.a.event(to_okapi(), team=team)
    await slack.settle()
    assert (await texts(memory, here))[2] == "what about the okapi grant"


async def test_slack_edits_the_bot_never_kept_are_not_noted(slack):
    """A channel's talk the bot was not asked into: its edits leave nothing in Redis."""
    team, memory, _ = await walrus_thread(slack)
    aside = edited("1700000009.000000", "my salary is 123k", "my salary is 100k")
    reply = edited("1700000010.000000", "lunch at 1?", "lunch at 12?", "1700000008.000000")
    for event in (aside, reply):
        assert (await slack.a.event(event, team=team)).status == 200
    await slack.settle()
    assert not await noted(memory, team, slack_source("C1", "1700000009.000000"))
    assert not await noted(memory, team, slack_source("C1", "1700000010.000000"))


async def test_slack_an_older_edit_arriving_late_does_not_roll_the_text_back(slack):
    team, memory, here = await walrus_thread(slack)
    await slack.a.event(to_okapi(), team=team)
    await slack.settle()
    late = edited(ts(2), "what about the giraffe fund", "what about the zebra budget", ts(1),
                  edited={"user": "U1", "ts": f"{time.time() - 60:.6f}"})  # fmt: skip
    await slack.b.event(late, team=team)  # Slack's retry of an edit made before the okapi one
    await slack.settle()
    assert (await texts(memory, here))[2] == "what about the okapi grant"
    assert not any("giraffe" in hit for hit in await found(memory, here, "giraffe fund"))


async def test_slack_an_edit_to_nothing_forgets_the_message(slack):
    team, memory, here = await walrus_thread(slack)
    emptied = edited(ts(2), f"<@{BOT_USER}>", "what about the zebra budget", ts(1))
    assert (await slack.a.event(emptied, team=team)).status == 200
    await slack.settle()
    assert "what about the zebra budget" not in await texts(memory, here)
    assert not any("zebra" in hit for hit in await found(memory, here, "zebra budget"))


async def test_slack_edit_while_its_turn_is_queued_is_answered_with_the_new_text(slack):
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    here = thread(team, ts(1))
    entered, release = held_model(slack.world, "an answer")
    await slack.a.event(mention("first question", ts(1)), team=team)
    await asyncio.wait_for(entered.wait(), WAIT)  # the first turn is at the model
    # queued behind it, then edited before its turn comes
    await slack.b.event(message("second questoin", ts(2), thread_ts=ts(1)), team=team)
    await slack.a.event(edited(ts(2), "second question", "second questoin", ts(1)), team=team)
    await slack.world.runtime.harness.drain()  # the edit's task runs: nothing stored yet
    release.set()
    await slack.settle()
    assert await texts(memory, here) == [
        "first question", "an answer", "second question", "an answer"
    ]  # fmt: skip
    asked = slack.world.model_requests()[1]["messages"][1]["content"]
    assert asked.startswith("# Question\nsecond question\n")
    # the first text's vector, fetched ahead when the turn was queued, is not kept either
    assert not await memory.redis.exists(memory.embedder._key("second questoin"))


async def test_slack_edit_followed_before_its_turn_stored_the_old_text_is_queued_again(slack):
    """The edit's task ran after the turn read the text and before it stored it: the turn,
    when it ends, finds the newer text noted and queues the edit again."""
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    here = thread(team, ts(1))
    entered, release = held_model(slack.world, "an answer about otters")
    await slack.a.event(mention("tell me about otters", ts(1)), team=team)
    await asyncio.wait_for(entered.wait(), WAIT)  # stored, and being answered
    source = slack_source("C1", ts(1))
    await memory.governance.edits.note(team, source, "tell me about sea otters", time.time())
    release.set()
    await slack.settle()
    assert await texts(memory, here) == ["tell me about sea otters", "an answer about otters"]
    assert "tell me about sea otters" in await found(memory, here, "sea otters")
    assert len(slack.world.model_requests()) == 1


async def test_a_queued_indexing_task_with_the_old_text_does_not_index_it(slack):
    team, memory, here = await walrus_thread(slack)
    old = next(m for m in await memory.conversation.all(here) if "zebra" in m.content)
    await slack.a.event(to_okapi(), team=team)
    await slack.settle()

    # the turn's own indexing task, run late (a retry): its copy has the old text
    upkeep = slack.world.runtime.harness.upkeep
    await upkeep.index_episodes([{"scope": here.to_dict(), "messages": [asdict(old)]}])
    await slack.settle()
    assert not any("zebra" in hit for hit in await found(memory, here, "zebra budget"))
    assert "what about the okapi grant" in await found(memory, here, "okapi grant")


async def test_an_edit_run_again_after_failing_half_way_is_finished(slack):
    """The task failed once the message had its new text, before its indexing was queued:
    run again, it finds the old text still noted, and the new text is indexed."""
    team, memory, here = await walrus_thread(slack)
    source, new = slack_source("C1", ts(2)), "what about the okapi grant"
    places = {here.thread: "C1"}
    at = time.time()
    await memory.governance.edits.follow(team, list(places), source, new, at)  # then it failed
    assert (await texts(memory, here))[2] == new
    assert new not in await found(memory, here, "okapi grant")
    assert not any("zebra" in hit for hit in await found(memory, here, "zebra budget"))

    task = {"tenant": team, "places": places, "source": source, "text": new, "at": at}
    await slack.world.runtime.harness.upkeep.follow_edits([task])  # the task, again
    await slack.settle()
    assert new in await found(memory, here, "okapi grant")


async def test_an_edit_followed_after_its_message_was_deleted_changes_nothing(slack):
    """The edit's task runs once the message was deleted on the platform, its erasure still
    queued: the stored message keeps its text (the erasure takes it), no old text is noted."""
    team, memory, here = await walrus_thread(slack)
    source = slack_source("C1", ts(2))
    await memory.governance.note_deleted(team, source)  # as the adapter does first
    followed = await memory.governance.edits.follow(
        team, [here.thread], source, "what about the okapi grant", time.time()
    )
    assert followed.messages == [] and followed.old_fields == []
    assert (await texts(memory, here))[2] == "what about the zebra budget"
    assert not await noted(memory, team, source)


async def test_an_edit_is_taken_where_any_of_its_threads_is_joined(world, tenant):
    """The adapters ask of all the threads an edited message may be stored in at once."""
    memory = world.runtime.memory
    places, threads = memory.governance.places, [f"discord:{tenant}:{i}" for i in (1, 2, 3)]
    assert not await places.any_joined(tenant, [])
    assert not await places.any_joined(tenant, threads)
    await memory.presence.join(Scope(tenant, threads[2]))
    assert await places.any_joined(tenant, threads)
    assert not await places.any_joined(tenant, threads[:2])


async def test_forgotten_and_deleted_messages_stay_forgotten_when_edited(slack):
    team, memory, here = await walrus_thread(slack)
    slack.world.model.script(text("Noted."))
    await slack.a.event(message("my okapi plan", ts(3), thread_ts=ts(1)), team=team)
    await slack.settle()
    first = (await memory.conversation.all(here))[0]
    await memory.governance.forget_message(team, here.thread, first.id)  # the memory page
    await slack.a.event(deleted(ts(3), thread_ts=ts(1)), team=team)  # deleted in Slack
    await slack.settle()

    await slack.a.event(to_seals(), team=team)
    await slack.a.event(edited(ts(3), "my secret okapi plan", "my okapi plan", ts(1)), team=team)
    await slack.a.event(to_okapi(), team=team)
    await slack.settle()
    assert await texts(memory, here) == [
        "Walruses migrate north.", "what about the okapi grant", "The budget is fine.", "Noted."
    ]  # fmt: skip
    assert [m.forgotten for m in await memory.conversation.all(here, forgotten=True)] == [
        True, False, False, False, True, False
    ]  # fmt: skip
    hits = await found(memory, here, "seals okapi plan")
    assert not any("seals" in hit or "plan" in hit for hit in hits)
    assert not await noted(memory, team, slack_source("C1", ts(3)))  # its new text not kept
    assert not await noted(memory, team, slack_source("C1", ts(1)))  # nor the forgotten one's


async def test_an_erasure_drops_the_notes_of_edits_under_way(slack):
    """An edit noted (its turn still to come, or its task half-way) of a message then
    forgotten: the note, which holds its texts, goes with it."""
    team, memory, here = await walrus_thread(slack)
    edits, source = memory.governance.edits, slack_source("C1", ts(2))
    await edits.note(team, source, "what about the secret okapi grant", time.time())
    assert await noted(memory, team, source)
    await memory.governance.forget_thread(team, here.thread)
    assert not await noted(memory, team, source)
    assert not await edits.note(team, source, "again", time.time())  # nothing kept later


# -- Discord -------------------------------------------------------------------------------------


def edit(message_: Any, content: str | None, edited: bool = True) -> discord.RawMessageUpdateEvent:
    """Discord's MESSAGE_UPDATE for `message_` (a fake), now saying `content`; None: an update
    without content (an embed added); not `edited`: an update that is no edit (a pin)."""
    channel = message_.channel
    data: dict[str, Any] = {"id": str(message_.id), "channel_id": str(channel.id)}
    if message_.guild is not None:
        data["guild_id"] = str(message_.guild.id)
    if content is not None:
        data["content"] = message_.content = content
    message_.edited_at = discord.utils.utcnow() if edited else None  # as Discord stamps one
    return discord.RawMessageUpdateEvent(data, message_)  # type: ignore[arg-type]


async def test_discord_edits_are_followed_in_a_server_and_a_dm(world):
    fake = FakeDiscord()
    adapter = new_adapter(world, fake)
    memory = world.runtime.memory
    w = await discord_walrus_thread(world, fake, adapter)

    # an embed added (no content), a pin (no edit), and the bot's own status message: nothing
    await adapter.client.on_raw_message_edit(edit(w.follow_up, None))
    await adapter.client.on_raw_message_edit(edit(w.follow_up, "pinned text", edited=False))
    own = fake.message(w.opened, fake.bot, "⏳ searching…")
    await adapter.client.on_raw_message_edit(edit(own, "✅ searching (success)"))
    await settle(world, adapter)
    assert not await noted(memory, str(w.guild.id), discord_source(w.follow_up.id))
    assert not await noted(memory, str(w.guild.id), discord_source(own.id))
    # the channel's talk the bot was not asked into: nothing kept
    aside = fake.message(w.channel, w.user, "my salary is 100k")
    await adapter.client.on_raw_message_edit(edit(aside, "my salary is 123k"))
    await settle(world, adapter)
    assert not await noted(memory, str(w.guild.id), discord_source(aside.id))

    await adapter.client.on_raw_message_edit(edit(w.follow_up, "what about the okapi grant"))
    # the mention, in the channel: its turn is in the thread opened from it
    await adapter.client.on_raw_message_edit(
        edit(w.asked, f"<@{fake.bot.id}> when do seals migrate")
    )
    await settle(world, adapter)
    assert await texts(memory, w.here) == [
        "when do seals migrate", "Answer: when do walruses migrate",
        "what about the okapi grant", "Answer: what about the zebra budget",
    ]  # fmt: skip
    assert "what about the okapi grant" in await found(memory, w.here, "okapi grant")
    assert "what about the zebra budget" not in await found(memory, w.here, "zebra budget")

    dm = fake.dm_channel(w.user)
    said = fake.message(dm, w.user, "my secret plan")
    await adapter.handle_message(said)
    await settle(world, adapter)
    await adapter.client.on_raw_message_edit(edit(said, "my public plan"))
    await settle(world, adapter)
    mine = Scope(f"dm-{w.user.id}", f"discord:dm:{dm.id}")
    assert await texts(memory, mine) == ["my public plan", "Answer: my secret plan"]
    assert len(world.model_requests()) == 3  # no edit was answered

    # edited down to a bare mention: the message is forgotten, as a deletion
    await adapter.client.on_raw_message_edit(edit(w.follow_up, f"<@{fake.bot.id}>"))
    await settle(world, adapter)
    assert "what about the okapi grant" not in await texts(memory, w.here)


async def test_discord_edit_while_memory_is_down_is_kept_and_followed_when_back(tmp_path):
    """Discord sends an edit once: the adapter keeps it until Redis is back, the check that
    the bot may hold the message (a thread it answers in) included."""
    fake = FakeDiscord()
    async with stoppable(tmp_path, fake) as (server, world, adapter):
        w = await discord_walrus_thread(world, fake, adapter)
        server.stop()
        await adapter.client.on_raw_message_edit(edit(w.follow_up, "what about the okapi grant"))
        await back_and_taken(server, world, adapter)
        assert (await texts(world.runtime.memory, w.here))[2] == "what about the okapi grant"
