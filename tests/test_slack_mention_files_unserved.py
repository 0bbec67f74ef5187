"""Files shared with the bot on Slack where no file service reads them (no Slack end in the
process's file service, or no file service at all): the message's question is answered once,
however Slack sends it (`message` and `app_mention`, to two processes, and their retries, an
edit that adds the mention), the model told in the question that its files were not read and
the person told so once; a share with no question gets FILES_UNREAD once, not silence. Through
the real adapter over real HTTP, a real Redis and the scripted model."""

from __future__ import annotations

import time

import pytest

from adapters.slack_files import FILES_UNREAD, FILES_UNREAD_ANSWERED, UNREAD_NOTE
from bot.turns import TurnHandler
from tests.support.pdfs import make_pdf
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, file_share, mention
from tests.test_slack import slack_world, thread, ts


def without_files(runtime) -> TurnHandler:
    """The runtime's turns, with no file service at all."""
    return TurnHandler(runtime.agent, watches=runtime.watches, files=None)


@pytest.fixture(params=["no slack end", "no file service"])
async def slack(request, redis_url, tmp_path):
    """Two bot processes on one Redis and a mock Slack; no Slack token for files (the world
    has none): a file service without a Slack end, or none at all."""
    handler_of = without_files if request.param == "no file service" else None
    async with slack_world(redis_url, tmp_path, handler_of) as env:
        assert "slack" not in env.world.runtime.files.ends
        yield env


def shared(env, n: int, question: str, **where) -> tuple[dict, dict]:
    """A PDF shared with a mention of the bot, as Slack sends it: the `message` (subtype
    `file_share`) and the `app_mention`, both with the file."""
    pdf = env.api.add_file("notes.pdf", make_pdf())
    said = f"<@{BOT_USER}> {question}".strip()
    return (
        file_share([pdf], ts(n), text=said, **where),
        {**mention(question, ts(n), **where), "text": said, "files": [pdf]},
    )


def edited(before: dict, new_text: str) -> tuple[dict, dict]:
    """What Slack sends for a person's edit of a file share (`before`: the message as it was)
    that has the mention: its `message_changed` (whose `message` is the share as it is now),
    and an `app_mention` (a new event each time), both with the files."""
    at = f"{time.time():.6f}"
    now = {**before, "text": new_text, "edited": {"user": before["user"], "ts": at}}
    changed = {"type": "message", "subtype": "message_changed", "channel": before["channel"],
               "channel_type": "channel", "hidden": True, "ts": at, "event_ts": at,
               "message": now, "previous_message": before}  # fmt: skip
    app_mention = {**now, "type": "app_mention", "event_ts": at}
    app_mention.pop("subtype")
    return changed, app_mention


async def test_a_mention_with_a_pdf_and_a_question_is_answered_once(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("MemGPT pages memory in and out."), text("never asked"))
    message_event, app_mention = shared(slack, 1, "what is MemGPT?")
    assert (await slack.a.event(message_event, team=team, event_id="EvMsg")).status == 200
    assert (await slack.b.event(app_mention, team=team, event_id="EvMention")).status == 200
    await slack.settle()
    # Slack's retries of both, each to the other process
    await slack.b.event(message_event, team=team, event_id="EvMsg", retry=1)
    await slack.a.event(app_mention, team=team, event_id="EvMention", retry=1)
    await slack.settle()
    # the person is told the file was not read, once, beside the answer (from a task of its
    # own, so in either order)
    assert sorted(slack.api.thread_texts("C1", ts(1))) == [
        FILES_UNREAD_ANSWERED, "MemGPT pages memory in and out.",
    ]  # fmt: skip
    # and the model is told in the question, which is kept so: a fact of that moment, true
    # still once a file service reads later shares
    [request] = slack.world.model_requests()
    asked = "what is MemGPT?\n\n(shared with this message: files that were not read)"
    assert asked in request["messages"][-1]["content"]
    stored = await slack.world.runtime.memory.conversation.all(thread(team, ts(1)))
    assert [m.content for m in stored] == [asked, "MemGPT pages memory in and out."]


async def test_a_bare_mention_with_a_pdf_is_told_files_are_not_read(slack):
    team = f"T{time.time_ns()}"
    message_event, app_mention = shared(slack, 2, "")
    await slack.b.event(app_mention, team=team, event_id="EvMention")
    await slack.a.event(message_event, team=team, event_id="EvMsg")
    await slack.b.event(message_event, team=team, event_id="EvMsg", retry=1)  # Slack's retry
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(2)) == [FILES_UNREAD]
    assert slack.world.model_requests() == []


async def test_a_dm_with_only_a_pdf_is_told_files_are_not_read(slack):
    team = f"T{time.time_ns()}"
    pdf = slack.api.add_file("notes.pdf", make_pdf())
    event = file_share([pdf], ts(3), channel="D7", channel_type="im")
    assert (await slack.a.event(event, team=team, event_id="EvDm")).status == 200
    await slack.b.event(event, team=team, event_id="EvDm", retry=1)  # Slack's retry
    await slack.settle()
    assert slack.api.thread_texts("D7", None) == [FILES_UNREAD]
    assert slack.world.model_requests() == []


async def test_an_edit_that_adds_a_mention_and_a_question_to_a_share_is_answered_once(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("MemGPT pages memory in and out."), text("never asked"))
    share = file_share([slack.api.add_file("notes.pdf", make_pdf())], ts(4), text="see this")
    await slack.a.event(share, team=team)  # not for the bot
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(4)) == []
    changed, app_mention = edited(share, f"<@{BOT_USER}> what is MemGPT?")
    await slack.a.event(changed, team=team)
    await slack.b.event(app_mention, team=team, event_id="EvEdit")
    await slack.a.event(app_mention, team=team, event_id="EvEdit", retry=1)  # Slack's retry
    await slack.settle()
    changed, app_mention = edited(changed["message"], f"<@{BOT_USER}> what is MemGPT, then?")
    await slack.a.event(changed, team=team)
    await slack.b.event(app_mention, team=team)
    await slack.settle()
    assert sorted(slack.api.thread_texts("C1", ts(4))) == [
        FILES_UNREAD_ANSWERED, "MemGPT pages memory in and out.",
    ]  # fmt: skip
    assert len(slack.world.model_requests()) == 1
    # the edited question keeps its note: the model still knows its files were not read
    stored = await slack.world.runtime.memory.conversation.all(thread(team, ts(4)))
    assert stored[0].content == f"what is MemGPT, then?\n\n{UNREAD_NOTE}"


async def test_an_edit_that_adds_a_bare_mention_to_a_share_is_told_files_are_not_read(slack):
    team = f"T{time.time_ns()}"
    share = file_share([slack.api.add_file("notes.pdf", make_pdf())], ts(5))  # not for the bot
    await slack.a.event(share, team=team)
    changed, app_mention = edited(share, f"<@{BOT_USER}>")
    await slack.a.event(changed, team=team)
    await slack.b.event(app_mention, team=team, event_id="EvEdit")
    await slack.a.event(app_mention, team=team, event_id="EvEdit", retry=1)  # Slack's retry
    await slack.settle()
    changed, app_mention = edited(changed["message"], f"<@{BOT_USER}> ")  # edited again
    await slack.a.event(changed, team=team)
    await slack.b.event(app_mention, team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(5)) == [FILES_UNREAD]
    assert slack.world.model_requests() == []


async def test_a_share_with_a_mention_in_a_thread_the_bot_answers_in_is_answered_there(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("Walruses migrate north."), text("MemGPT pages memory."))
    await slack.a.event(mention("when do walruses migrate", ts(6)), team=team)
    await slack.settle()
    message_event, app_mention = shared(slack, 7, "what is MemGPT?", thread_ts=ts(6))
    await slack.b.event(message_event, team=team)
    await slack.a.event(app_mention, team=team)
    await slack.settle()
    walruses, *then = slack.api.thread_texts("C1", ts(6))
    assert walruses == "Walruses migrate north."
    assert sorted(then) == [FILES_UNREAD_ANSWERED, "MemGPT pages memory."]
    stored = await slack.world.runtime.memory.conversation.all(thread(team, ts(6)))
    assert stored[-2].content == f"what is MemGPT?\n\n{UNREAD_NOTE}"


async def test_a_bare_share_then_its_edit_with_a_question_is_told_files_are_not_read_once(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("MemGPT pages memory in and out."), text("never asked"))
    message_event, app_mention = shared(slack, 8, "")
    await slack.a.event(message_event, team=team)
    await slack.b.event(app_mention, team=team)
    await slack.settle()
    assert slack.api.thread_texts("C1", ts(8)) == [FILES_UNREAD]
    changed, app_mention = edited(message_event, f"<@{BOT_USER}> what is MemGPT?")
    await slack.a.event(changed, team=team)
    await slack.b.event(app_mention, team=team)
    await slack.settle()
    # told once that the files are not read: not FILES_UNREAD_ANSWERED too
    assert slack.api.thread_texts("C1", ts(8)) == [FILES_UNREAD, "MemGPT pages memory in and out."]
    assert len(slack.world.model_requests()) == 1


async def test_an_answered_share_edited_down_to_a_bare_mention_is_not_told_again(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("MemGPT pages memory in and out."), text("never asked"))
    message_event, app_mention = shared(slack, 9, "what is MemGPT?")
    await slack.a.event(message_event, team=team)
    await slack.b.event(app_mention, team=team)
    await slack.settle()
    changed, app_mention = edited(message_event, f"<@{BOT_USER}>")
    await slack.a.event(changed, team=team)  # the question is erased
    await slack.settle()
    await slack.b.event(app_mention, team=team)
    await slack.settle()
    # told once that the files are not read: not FILES_UNREAD after the answer
    assert sorted(slack.api.thread_texts("C1", ts(9))) == [
        FILES_UNREAD_ANSWERED, "MemGPT pages memory in and out.",
    ]  # fmt: skip
    # the question erased first, so its edit's `app_mention` reached the bare-mention path
    stored = await slack.world.runtime.memory.conversation.all(thread(team, ts(9)))
    assert [m.content for m in stored] == ["MemGPT pages memory in and out."]
