"""Topic watches through the Slack adapter over real HTTP: `/watch` and a mention "watch …" make
watches, a digest is posted with Block Kit Save buttons, and a pressed button (Slack's own
`block_actions` payload) saves the paper and answers where it was pressed."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from urllib.parse import urlencode

from adapters.slack_digest import SAVE_ACTION, SAVE_LABEL
from memory.scope import Scope
from tests.support.arxiv_replay import MEMGPT_ID, MEMGPT_TITLE, memgpt_entry
from tests.support.slack_api import mention
from tests.test_slack import slack, ts  # noqa: F401  (the fixture)


def iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


def button_press(posted: dict, arxiv_id: str, team: str, response_url: str) -> str:
    """A `block_actions` payload as Slack sends it when a button of a posted message is
    pressed (form-encoded `payload`)."""
    blocks = (
        posted["blocks"] if isinstance(posted["blocks"], list) else json.loads(posted["blocks"])
    )
    block = next(b for b in blocks if b.get("accessory", {}).get("value") == arxiv_id)
    button = block["accessory"]
    payload = {
        "type": "block_actions",
        "user": {"id": "U1", "username": "ada", "name": "ada", "team_id": team},
        "api_app_id": "A1", "token": "legacy", "trigger_id": "13345224609.738474920.8088930838d88f008e0",
        "container": {"type": "message", "message_ts": posted["_ts"], "channel_id": posted["channel"],
                      "is_ephemeral": False},
        "team": {"id": team, "domain": "research"}, "enterprise": None,
        "is_enterprise_install": False, "channel": {"id": posted["channel"], "name": "papers"},
        "message": {"type": "message", "user": "UBOT", "ts": posted["_ts"], "bot_id": "BBOT",
                    "app_id": "A1", "text": posted["text"], "team": team, "blocks": blocks},
        "state": {"values": {}}, "response_url": response_url,
        "actions": [{"action_id": button["action_id"], "block_id": block["block_id"],
                     "text": {**button["text"], "emoji": True}, "value": button["value"],
                     "type": "button", "action_ts": f"{time.time():.6f}"}],
    }  # fmt: skip
    return urlencode({"payload": json.dumps(payload)})


async def until(check, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_watch_command_digest_and_save_button(slack):  # noqa: F811
    team = f"T{time.time_ns()}"
    watches = slack.world.runtime.watches
    fresh = replace(memgpt_entry(), published=iso(time.time() - 3600))  # new on arXiv
    slack.world.arxiv.add_feed([fresh])
    try:
        response = await slack.a.command(
            "/watch", "operating systems memory weekly cat:cs.AI", slack.api.response_url + "w1",
            team=team,
        )  # fmt: skip
        answer = json.loads(await response.text())
        assert answer["response_type"] == "in_channel"
        assert answer["text"].startswith("Watching “operating systems memory” cat:cs.AI, weekly")
        [watch] = await watches.store.all(team)
        assert (watch.platform, watch.channel, watch.categories) == ("slack", "C1", ["cs.AI"])
        listed = json.loads(await (await slack.b.command(
            "/watch", "list", slack.api.response_url + "w2", team=team
        )).text())  # fmt: skip
        assert listed["response_type"] == "ephemeral" and watch.id in listed["text"]

        # the scheduler's tick: the digest is posted once, with a Save button per paper
        assert await watches.check() == [(team, watch.id)]
        await watches.workers["slack"].drain()
        [posted] = [p for p in slack.api.of("chat.postMessage") if "New papers" in p["text"]]
        assert posted["channel"] == "C1" and MEMGPT_TITLE in posted["text"]
        blocks = posted["blocks"]
        button = next(b["accessory"] for b in blocks if "accessory" in b)
        assert button == {"type": "button", "action_id": SAVE_ACTION, "value": MEMGPT_ID,
                          "text": {"type": "plain_text", "text": SAVE_LABEL}}  # fmt: skip
        assert posted["metadata"]["event_payload"]["digest"] == f"{watch.id}:{watch.next_due}"

        # someone presses Save: "Saving …" at once, then "Saved … (N passages)", to them only
        body = button_press(posted, MEMGPT_ID, team, slack.api.response_url + "s1")
        response = await slack.a.post(body, "application/x-www-form-urlencoded")
        assert response.status == 200
        await until(lambda: _answered(slack.api, "s1", 2))
        saving, saved = slack.api.responded["s1"]
        assert saving["text"] == f"Saving arXiv:{MEMGPT_ID} to the team knowledge base…"
        assert saved["text"].startswith(f"Saved “{MEMGPT_TITLE}” to the team knowledge base (")
        assert saved["response_type"] == "ephemeral" and saved["replace_original"] is False
        assert await slack.world.runtime.memory.knowledge_base.has_paper(Scope(team), MEMGPT_ID)

        removed = json.loads(await (await slack.a.command(
            "/watch", f"remove {watch.id}", slack.api.response_url + "w3", team=team
        )).text())  # fmt: skip
        assert removed["text"].startswith("Stopped watching")
        assert await watches.store.all(team) == []
    finally:
        for watch in await watches.store.all(team):
            await watches.store.remove(team, watch.id)


async def _answered(api, response_id: str, count: int) -> bool:
    return len(api.responded.get(response_id, [])) >= count


async def test_a_mention_starting_with_watch_makes_a_watch_without_the_model(slack):  # noqa: F811
    team = f"T{time.time_ns()}"
    watches = slack.world.runtime.watches
    try:
        await slack.a.event(mention("watch state-space models weekly", ts(900)), team=team)
        await slack.settle()
        [reply] = slack.api.thread_texts("C1", ts(900))
        assert reply.startswith("Watching “state-space models”, weekly here")
        assert slack.world.model_requests() == []
        [watch] = await watches.store.all(team)
        assert (watch.channel, watch.thread, watch.created_by) == ("C1", "", "U1")
    finally:
        for watch in await watches.store.all(team):
            await watches.store.remove(team, watch.id)
