"""Which workspace a Slack payload is of (adapters/platform_ids.py `slack_team`): the
installation's, as bolt's `context.team_id`. In a shared channel another workspace created, an
event's envelope `team_id` names that workspace; only `authorizations[0].team_id` is ours. Our
member asking there is of our tenant (its memory, its walls), not walled as a stranger; a
channel shared with another organisation stays walled. Over real HTTP against the mock Web
API, a real Redis and the scripted model, as tests/test_slack_walls.py.
"""

from __future__ import annotations

import time

import pytest

from adapters.platform_ids import slack_team
from adapters.slack import thread_id
from memory.scope import Scope
from tests.support.slack_api import mention
from tests.test_platform_deletions import deleted
from tests.test_slack_walls import (
    QUESTION,
    asks_team_memory,
    sent_to_model,
    stored,
    team_memory,
    ts,
    walled_world,
)
from tests.test_slack_walls_enterprise import ORG, SISTER_TEAM

PARTNER_TEAM = "TPARTNER"  # Slack Connect: another organisation's workspace
ORG_WIDE, CONNECTED = "C9", "C8"  # shared among our org's workspaces / with another org


@pytest.fixture
async def walled(redis_url, tmp_path):
    async with walled_world(redis_url, tmp_path) as env:
        yield env


async def ours(env) -> str:
    """Our workspace (the bot's token is its installation), of the Grid org ORG, with its
    public memory; C9 shared with a sister workspace, C8 with another organisation."""
    team = await team_memory(env)
    env.api.team_id, env.api.enterprise_id = team, ORG
    env.api.org_shared_channels.add(ORG_WIDE)
    env.api.shared_channels.add(CONNECTED)
    return team


async def member_asks(env, team: str, channel: str, creator: str, n: int) -> str:
    """Our member U1 mentions the bot in `channel`, which the workspace `creator` created:
    Slack's envelope names `creator`, its authorization us. What the model was sent."""
    before = len(env.world.model_requests())
    event = {**mention(QUESTION, ts(n), channel=channel), "user_team": team, "team": team}
    await env.a.event(event, team=creator, installed=team)
    await env.settle()
    return sent_to_model(env, before)


async def test_our_member_in_a_channel_a_sister_workspace_created_is_of_our_tenant(walled):
    team = await ours(walled)
    walled.world.model.script(*asks_team_memory())
    sister = f"{SISTER_TEAM}{time.time_ns()}"  # of no other test's memory
    seen = await member_asks(walled, team, ORG_WIDE, sister, 20)
    assert "7 million" in seen and "9 million" in seen  # our memory, not walled
    assert await stored(walled, team, ORG_WIDE, ts(20)) == {"public"}
    assert await stored(walled, sister, ORG_WIDE, ts(20)) == set()  # not split off

    # deleted there, it is forgotten from our tenant: the envelope names the sister again
    await walled.a.event(deleted(ts(20), channel=ORG_WIDE, user="U1"), team=sister,
                         installed=team)  # fmt: skip
    await walled.settle()
    thread = Scope(team, thread_id(team, ORG_WIDE, ts(20)), ORG_WIDE)
    said = [m.content for m in await walled.memory.conversation.all(thread)]
    assert said and not any(QUESTION in text for text in said)  # the answer stays


async def test_a_channel_another_organisation_created_is_ours_and_still_walled(walled):
    team = await ours(walled)
    walled.world.model.script(*asks_team_memory())
    partner = f"{PARTNER_TEAM}{time.time_ns()}"
    seen = await member_asks(walled, team, CONNECTED, partner, 30)
    assert QUESTION in seen  # answered, of our tenant
    assert "7 million" not in seen and "9 million" not in seen  # the other org reads it too
    assert await stored(walled, team, CONNECTED, ts(30)) == {f"private:{CONNECTED}"}
    assert await stored(walled, partner, CONNECTED, ts(30)) == set()
    # our member is not the wall there: the channel is
    assert not await walled.adapter.walls.foreign(team, "U1", {"user_team": team})
    assert not (await walled.adapter.walls.person(team, "U1")).outsider


async def test_an_ordinary_event_is_of_its_team_as_before(walled):
    team = await ours(walled)
    walled.world.model.script(*asks_team_memory())
    before = len(walled.world.model_requests())
    await walled.a.event(mention(QUESTION, ts(40)), team=team)  # team_id and authorization agree
    await walled.settle()
    assert "7 million" in sent_to_model(walled, before)
    assert await stored(walled, team, "C1", ts(40)) == {"public"}


# -- each payload's workspace, as bolt's context.team_id ------------------------------------


OURS, THEIRS = "TOURS", "TTHEIRS"


@pytest.mark.parametrize(
    ("payload", "team"),
    [
        # an event in a channel another workspace created: the authorization is ours
        ({"type": "event_callback", "team_id": THEIRS, "event": {"team": THEIRS},
          "authorizations": [{"team_id": OURS}]}, OURS),
        # an ordinary event; one without authorizations; an org-wide install's (none named)
        ({"type": "event_callback", "team_id": OURS, "authorizations": [{"team_id": OURS}]}, OURS),
        ({"type": "event_callback", "team_id": OURS, "event": {"team": THEIRS}}, OURS),
        ({"type": "event_callback", "team_id": OURS,
          "authorizations": [{"team_id": None, "is_enterprise_install": True}]}, OURS),
        # a slash command: its team_id, not the person's user_team
        ({"command": "/summarize", "team_id": OURS, "user_team": THEIRS}, OURS),
        # a shortcut, a button: team.id, not the person's user.team_id
        ({"type": "message_action", "team": {"id": OURS}, "user": {"team_id": THEIRS}}, OURS),
        ({"type": "block_actions", "team": {"id": OURS}, "user": {"team_id": THEIRS}}, OURS),
        # a modal submitted from the other workspace of a Slack Connect channel
        ({"type": "view_submission", "team": {"id": THEIRS}, "user": {"team_id": THEIRS},
          "view": {"team_id": THEIRS, "app_installed_team_id": OURS}}, OURS),
        # an org-wide install's button names no team: the person's
        ({"type": "block_actions", "team": None, "user": {"team_id": OURS}}, OURS),
    ],
)  # fmt: skip
def test_a_payload_is_of_the_installation_s_workspace(payload, team):
    assert slack_team(payload) == team
