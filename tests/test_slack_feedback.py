"""👍 / 👎 in Slack over real HTTP: the buttons under an answer's last part, a `block_actions`
payload in Slack's format recording a vote, 👎 opening the modal (`views.open`) and its
`view_submission` storing the comment."""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import urlencode

import pytest

from adapters.slack_feedback import DOWN, FORM, UP
from bot.feedback import FAILED, GONE, NOT_HERE, SORRY, THANKS
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, mention, sign
from tests.test_slack import SECRET, slack_world, thread, ts


@pytest.fixture
async def slack(redis_url, tmp_path):
    async with slack_world(redis_url, tmp_path) as env:
        yield env


def blocks_of(params: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = params.get("blocks") or []
    return json.loads(blocks) if isinstance(blocks, str) else blocks


def buttons(params: dict[str, Any]) -> list[tuple[str, str]]:
    """(action_id, value) of the message's action buttons."""
    return [
        (e["action_id"], e["value"])
        for b in blocks_of(params)
        if b["type"] == "actions"
        for e in b["elements"]
    ]


def block_actions(team: str, user: str, action_id: str, turn: str, message_ts: str) -> dict:
    """A button press as Slack sends it (interactivity payload of type block_actions)."""
    return {
        "type": "block_actions",
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": team},
        "api_app_id": "A1", "token": "legacy",
        "container": {"type": "message", "message_ts": message_ts, "channel_id": "C1",
                      "is_ephemeral": False, "thread_ts": ts(1)},
        "trigger_id": f"{time.time():.0f}.1234.{user}",
        "team": {"id": team, "domain": "test"}, "enterprise": None,
        "is_enterprise_install": False, "channel": {"id": "C1", "name": "general"},
        "message": {"type": "message", "user": BOT_USER, "ts": message_ts, "thread_ts": ts(1),
                    "text": "an answer"},
        "state": {"values": {}},
        "response_url": "https://hooks.slack.com/actions/T1/1/abc",
        "actions": [{"action_id": action_id, "block_id": "feedback", "value": turn,
                     "type": "button", "action_ts": f"{time.time():.6f}",
                     "text": {"type": "plain_text", "text": "👍", "emoji": True}}],
    }  # fmt: skip


def view_submission(team: str, user: str, modal: dict, comment: str, ticked: list[str]) -> dict:
    """The modal submitted, as Slack sends it (type view_submission, with the view's state)."""
    options = modal["blocks"][1]["element"]["options"]
    return {
        "type": "view_submission",
        "team": {"id": team, "domain": "test"},
        "user": {"id": user, "username": user.lower(), "name": user.lower(), "team_id": team},
        "api_app_id": "A1", "token": "legacy", "trigger_id": "1.2.3",
        "view": {**modal, "id": "VMODAL", "team_id": team, "hash": "1.abc", "state": {"values": {
            "comment": {"comment": {"type": "plain_text_input", "value": comment}},
            "reasons": {"reasons": {"type": "checkboxes", "selected_options": [
                o for o in options if o["value"] in ticked]}},
        }}},
        "response_urls": [], "is_enterprise_install": False, "enterprise": None,
    }  # fmt: skip


async def interact(slack, payload: dict) -> tuple[int, str]:
    """POST an interactivity payload, signed, to the first process; (status, body)."""
    body = urlencode({"payload": json.dumps(payload)})
    headers = {"Content-Type": "application/x-www-form-urlencoded", **sign(SECRET, body)}
    async with slack.a.session.post(slack.a.url, data=body.encode(), headers=headers) as response:
        return response.status, await response.text()


async def test_buttons_under_the_answer_and_votes_and_the_form(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("Hello from ArxivScout"))
    await slack.a.event(mention("hi there", ts(1)), team=team)
    await slack.settle()
    memory = slack.world.runtime.memory
    [turn] = await memory.turn_records.ids(team)
    final = slack.api.of("chat.update")[-1]  # the stream stopped, the answer edited in
    assert blocks_of(final)[0]["type"] == "markdown"
    assert buttons(final) == [(UP, turn), (DOWN, turn)]
    assert slack.api.thread_texts("C1", ts(1)) == ["Hello from ArxivScout"]

    status, _ = await interact(slack, block_actions(team, "U2", UP, turn, final["ts"]))
    assert status == 200
    await slack.settle()
    record = await memory.turn_records.get(team, turn)
    assert {u: v.rating for u, v in record.feedback.items()} == {"U2": 1}
    [thanked] = slack.api.of("chat.postEphemeral")
    assert (thanked["user"], thanked["text"], thanked["thread_ts"]) == ("U2", THANKS, ts(1))

    status, _ = await interact(slack, block_actions(team, "U1", DOWN, turn, final["ts"]))
    assert status == 200
    [opened] = slack.api.of("views.open")
    assert opened["trigger_id"].endswith(".U1")
    [modal] = slack.api.modals
    assert (modal["callback_id"], modal["private_metadata"]) == (FORM, turn)
    assert (await memory.turn_records.get(team, turn)).feedback["U1"].rating == -1

    submitted = view_submission(team, "U1", modal, "It cited the wrong paper", ["wrong"])
    status, body = await interact(slack, submitted)
    answer = json.loads(body)
    assert status == 200 and answer["response_action"] == "update"
    assert SORRY in json.dumps(answer["view"], ensure_ascii=False)
    vote = (await memory.turn_records.get(team, turn)).feedback["U1"]
    assert (vote.rating, vote.comment, vote.reasons) == (-1, "It cited the wrong paper", ["wrong"])
    assert (await memory.turn_records.get(team, turn)).feedback["U2"].rating == 1


async def test_only_the_last_part_of_a_long_answer_has_the_buttons(slack):
    team = f"T{time.time_ns()}"
    long = "\n\n".join(f"Paragraph {i}: " + "word " * 400 for i in range(8))  # over 11,000
    slack.world.model.script(text(long))
    await slack.a.event(mention("tell me everything", ts(1)), team=team)
    await slack.settle()
    [turn] = await slack.world.runtime.memory.turn_records.ids(team)
    assert buttons(slack.api.of("chat.update")[-1]) == []
    posted = [p for p in slack.api.of("chat.postMessage") if p.get("thread_ts") == ts(1)]
    assert [buttons(p) for p in posted] == [[(UP, turn), (DOWN, turn)]]


async def test_a_vote_on_a_forgotten_answer_says_so_and_opens_no_form(slack):
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("An answer"))
    await slack.a.event(mention("a question", ts(1)), team=team)
    await slack.settle()
    memory = slack.world.runtime.memory
    [turn] = await memory.turn_records.ids(team)
    final = slack.api.of("chat.update")[-1]
    await memory.governance.forget_thread(team, thread(team, ts(1)).thread)
    status, _ = await interact(slack, block_actions(team, "U1", DOWN, turn, final["ts"]))
    assert status == 200
    assert slack.api.of("views.open") == [] and slack.api.modals == []
    [told] = slack.api.of("chat.postEphemeral")
    assert told["text"] == GONE and told["user"] == "U1"


async def test_the_workspace_and_channel_of_the_press_decide(slack):
    """A Slack Connect member (home team elsewhere) votes in the workspace the payload's `team`
    names; a press whose channel is not the answer's is refused; a payload without any team
    gets a clear message, not silence."""
    team = f"T{time.time_ns()}"
    slack.world.model.script(text("An answer"))
    await slack.a.event(mention("a question", ts(1)), team=team)
    await slack.settle()
    memory = slack.world.runtime.memory
    [turn] = await memory.turn_records.ids(team)
    final = slack.api.of("chat.update")[-1]

    guest = block_actions(team, "W9", UP, turn, final["ts"])
    guest["user"]["team_id"] = "E0OTHERORG"  # their own organisation's id
    assert (await interact(slack, guest))[0] == 200
    await slack.settle()
    assert (await memory.turn_records.get(team, turn)).feedback["W9"].rating == 1

    moved = block_actions(team, "U2", UP, turn, final["ts"])
    moved["container"]["channel_id"] = moved["channel"]["id"] = "C2"
    assert (await interact(slack, moved))[0] == 200
    nameless = block_actions(team, "U3", UP, turn, final["ts"])
    nameless["team"], nameless["user"]["team_id"] = None, ""
    assert (await interact(slack, nameless))[0] == 200
    await slack.settle()
    told = [(p["user"], p["text"]) for p in slack.api.of("chat.postEphemeral")]
    assert told == [("W9", THANKS), ("U2", NOT_HERE), ("U3", FAILED)]
    assert set((await memory.turn_records.get(team, turn)).feedback) == {"W9"}
