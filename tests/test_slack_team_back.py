"""A Slack team whose memory's erasure is scheduled (it removed the app) is back at its next
event or command (adapters/slack.py `note_team_back`): looked up after `skip_noise`, so the
bot's own posts, each update of a streamed answer and joins cost no Redis call; and at best
effort, so memory down turns no event into a 503 that Slack sends again."""

from __future__ import annotations

import time

from memory.keys import uninstalled_key
from memory.redis_server import EmbeddedRedis
from tests.conftest import free_port, redis_options
from tests.support.redis_monitor import monitored
from tests.support.slack_api import BOT_USER, message
from tests.test_slack import slack, slack_world, ts  # noqa: F401  (`slack`: its fixture)


def bot_post(text: str, at: str) -> dict:
    return message(text, at, user=BOT_USER, bot_id="BBOT")


def bot_update(text: str, at: str) -> dict:
    """Slack's `message_changed` for a chat.update of the bot's message (a streamed answer)."""
    return {"type": "message", "subtype": "message_changed", "channel": "C1",
            "channel_type": "channel", "ts": f"{at}1", "event_ts": f"{at}1", "hidden": True,
            "message": {**bot_post(text, at), "edited": {"user": BOT_USER, "ts": f"{at}1"}},
            "previous_message": bot_post("Thinking…", at)}  # fmt: skip


async def test_only_real_events_look_the_team_up(slack, redis_url):  # noqa: F811
    team, memory = f"T{time.time_ns()}", slack.world.runtime.memory
    scheduled = uninstalled_key()

    async def noise() -> None:
        for event in (bot_post("an answer", ts(1)), bot_update("an answer, longer", ts(1)),
                      message("", ts(2), subtype="channel_join")):  # fmt: skip
            assert (await slack.a.event(event, team=team)).status == 200

    seen = await monitored(redis_url, memory.redis, noise)
    assert [c for c in seen if c.name == "ZMSCORE" and scheduled in c.args] == []

    async def person() -> None:
        assert (await slack.a.event(message("just chatting", ts(3)), team=team)).status == 200

    seen = await monitored(redis_url, memory.redis, person)
    assert len([c for c in seen if c.name == "ZMSCORE" and scheduled in c.args]) == 1


async def test_memory_down_does_not_refuse_an_event_that_needs_none(tmp_path):
    """A person's message not for the bot needs no memory: only the team's lookup did."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port(), **redis_options())
    try:
        async with slack_world(server.ensure_running(), tmp_path) as env:
            server.stop()
            response = await env.a.event(message("just chatting", ts(1)), team="T1")
            assert response.status == 200
            server.ensure_running()
    finally:
        server.stop()
