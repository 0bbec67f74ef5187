"""A bare mention of the bot on Slack (sent too early) gets a hint, not a refused turn; the
edit that adds the question is answered once, as a new mention."""

from __future__ import annotations

import time

import pytest

from adapters.slack import EMPTY_DM, EMPTY_MENTION
from adapters.slack_delivery import THREAD_GONE_NOTICE
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, mention, message
from tests.test_slack import slack_world, thread, ts

BARE = f"<@{BOT_USER}>"
QUESTION = f"<@{BOT_USER}> what is MemGPT?"


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        yield env


def bare_mention(n: int, thread_ts: str | None = None) -> dict:
    return {**mention("", ts(n), thread_ts=thread_ts), "text": BARE}


def edits(event: dict, new_text: str, at: str) -> tuple[dict, dict]:
    """What Slack sends for a person's edit of a mention: `message_changed`, and the
    `app_mention` again, marked edited."""
    edited = {"user": event["user"], "ts": at}
    now = {"type": "message", "user": event["user"], "text": new_text, "ts": event["ts"],
           "edited": edited}  # fmt: skip
    previous = {"type": "message", "user": event["user"], "text": event["text"], "ts": event["ts"]}
    if event.get("thread_ts"):
        now["thread_ts"] = previous["thread_ts"] = event["thread_ts"]
    changed = {"type": "message", "subtype": "message_changed", "channel": event["channel"],
               "channel_type": "channel", "hidden": True, "ts": at, "event_ts": at,
               "message": now, "previous_message": previous}  # fmt: skip
    return changed, {**event, "text": new_text, "edited": edited, "event_ts": at}


async def test_a_bare_mention_gets_a_hint_and_its_edit_is_answered_once(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("MemGPT pages memory in and out."), text("never asked"))
    bare = bare_mention(1)
    assert (await slack.a.event(bare, team=team)).status == 200
    await slack.a.event(bare, team=team, retry=1)  # Slack's retry: not hinted twice
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(1)) == [EMPTY_MENTION]  # not "I can't take that"
    assert slack.world.model_requests() == []
    assert await slack.world.runtime.memory.conversation.all(thread(team, ts(1))) == []

    changed, mentioned = edits(bare, QUESTION, ts(2))
    await slack.a.event(changed, team=team)
    assert (await slack.b.event(mentioned, team=team)).status == 200  # another process
    await slack.settle()
    await slack.a.event(mentioned, team=team, retry=1)  # Slack's retry of the edit's mention
    await slack.settle()
    texts = slack.api.thread_texts("C1", ts(1))
    assert texts == [EMPTY_MENTION, "MemGPT pages memory in and out."]
    assert len(slack.world.model_requests()) == 1
    stored = await slack.world.runtime.memory.conversation.all(thread(team, ts(1)))
    assert [m.content for m in stored] == ["what is MemGPT?", "MemGPT pages memory in and out."]


async def test_a_bare_mention_in_a_thread_the_bot_answers_in_gets_the_hint_there(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("Hello."), text("It is a paper on agent memory."))
    await slack.a.event(mention("hi", ts(10)), team=team)
    await slack.settle()
    bare = bare_mention(11, thread_ts=ts(10))
    await slack.a.event(bare, team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(10)) == ["Hello.", EMPTY_MENTION]
    assert len(slack.world.model_requests()) == 1

    changed, mentioned = edits(bare, QUESTION, ts(12))
    await slack.a.event(changed, team=team)
    await slack.a.event(mentioned, team=team)
    await slack.settle()
    texts = slack.api.thread_texts("C1", ts(10))
    assert texts == ["Hello.", EMPTY_MENTION, "It is a paper on agent memory."]
    assert len(slack.world.model_requests()) == 2


async def test_a_bare_mention_in_a_dm_gets_a_hint_and_no_turn(slack):
    team = f"T{time.time_ns()}"
    await slack.a.event(message(BARE, ts(20), channel="D1", channel_type="im"), team=team)
    await slack.settle()
    assert slack.api.thread_texts("D1", None) == [EMPTY_DM]
    assert slack.world.model_requests() == []


async def test_a_reply_in_a_bare_mentions_thread_without_a_mention_is_answered_once(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("Here are papers on RAG."), text("never asked"))
    await slack.a.event(bare_mention(30), team=team)
    await slack.settle()
    await slack.b.event(message("find papers on RAG", ts(31), thread_ts=ts(30)), team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(30)) == [EMPTY_MENTION, "Here are papers on RAG."]
    assert len(slack.world.model_requests()) == 1


async def test_a_bare_mention_delivered_to_two_processes_is_hinted_once(slack):
    team = f"T{time.time_ns()}"
    bare = bare_mention(32)
    await slack.a.event(bare, team=team, event_id="EvBare32")
    await slack.b.event(bare, team=team, event_id="EvBare32")  # no retry header: not a retry
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(32)) == [EMPTY_MENTION]


async def test_a_bare_mention_only_its_retry_reached_is_hinted(slack):
    team = f"T{time.time_ns()}"
    await slack.a.event(bare_mention(33), team=team, retry=1)  # the first delivery was lost
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(33)) == [EMPTY_MENTION]


async def test_a_bare_mention_edited_into_another_is_not_hinted_again(slack):
    team = f"T{time.time_ns()}"
    bare = bare_mention(34)
    await slack.a.event(bare, team=team)
    await slack.settle()
    changed, mentioned = edits(bare, f"{BARE}  ", ts(35))
    await slack.a.event(changed, team=team)
    await slack.a.event(mentioned, team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(34)) == [EMPTY_MENTION]
    assert slack.world.model_requests() == []


async def test_a_hint_for_a_message_deleted_meanwhile_says_nothing_stray(slack):
    """Its own thread gone: nothing said; a thread it replied in gone: the person is named."""
    team = f"T{time.time_ns()}"
    adapter = slack.instances[0].adapter
    await adapter.tell_not_taken(team, bare_mention(36), ts(36))  # never known to Slack
    assert list(slack.api.messages.values()) == []
    await adapter.tell_not_taken(team, bare_mention(38, thread_ts=ts(37)), ts(37))
    assert [m.text for m in slack.api.messages.values()] == [f"<@U1> {THREAD_GONE_NOTICE}"]
