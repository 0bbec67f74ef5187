"""`/watch` is answered within Slack's 3 s however slowly Slack answers the bot's own questions
(who asks, where, may the bot post there): what Slack has not said in time is "try again",
and no watch is made (adapters/slack_watch.py `on_command`). The mock Web API holds its answers
for Slack's 3 s, then answers; the command's answer must come before that: within the time
Slack waits for it."""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlencode

from adapters.slack_watch import CANNOT_TELL, TOO_SLOW
from tests.test_slack import slack  # noqa: F401  (the fixture)

# seconds Slack holds its answers: past the command's own deadline (ANSWER_SECONDS, 2.5 s, within
# Slack's 3 s), with room for a loaded machine; an answer given after the hold would be Slack's
SLACK_ANSWERS_AFTER = 4.0
# not auth.test: bolt asks it once, before the first request of a process, as Slack would
ASKED = ("conversations.info", "users.info", "users.conversations")


async def watch_while_slack_is_slow(env, team: str, **fields: str) -> dict:
    """Send `/watch state-space models weekly` while Slack holds every answer; the command's
    answer, which must come while Slack still has said nothing."""
    answered = asyncio.Event()

    def slack_answers() -> None:
        answered.set()
        env.api.release()

    env.api.hold(*ASKED)
    later = asyncio.get_running_loop().call_later(SLACK_ANSWERS_AFTER, slack_answers)
    try:
        body = urlencode({
            "token": "legacy", "team_id": team, "channel_id": "C1", "user_id": "U1",
            "command": "/watch", "text": "state-space models weekly", "trigger_id": "trig",
            "response_url": env.api.response_url + "w", "api_app_id": "A1", **fields,
        })  # fmt: skip
        response = await env.a.post(body, "application/x-www-form-urlencoded")
        assert not answered.is_set()  # answered before Slack was (its deadline, not Slack's)
        return json.loads(await response.text())
    finally:
        later.cancel()
        slack_answers()


async def test_watch_is_answered_in_time_when_slack_is_slow(slack):  # noqa: F811
    team = f"T{time.time_ns()}"
    answer = await watch_while_slack_is_slow(slack, team)
    assert answer["response_type"] == "ephemeral"
    assert answer["text"] in (TOO_SLOW, CANNOT_TELL)
    assert await slack.world.runtime.watches.store.all(team) == []


async def test_watch_is_answered_in_time_when_slack_is_slow_on_several_questions(slack):  # noqa: F811
    """A person of another organisation: who they are, and where, asked in turn."""
    team = f"T{time.time_ns()}"
    answer = await watch_while_slack_is_slow(slack, team, user_team="TPARTNER")
    assert answer["response_type"] == "ephemeral"
    assert answer["text"] in (TOO_SLOW, CANNOT_TELL)
    assert await slack.world.runtime.watches.store.all(team) == []
