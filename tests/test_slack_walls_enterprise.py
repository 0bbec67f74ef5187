"""Enterprise Grid: a member of a sister workspace of the workspace's own organisation is not of
another organisation (adapters/slack_walls.py `same_organisation`), on the bot and on the memory
page alike; a Slack Connect person of another organisation, or anyone when Slack cannot say
which organisation they or the workspace are of, stays walled.

In an org-shared channel (conversations.info `is_shared` and `is_org_shared`) a sister
workspace's member's event names their own workspace (`user_team`); users.info names their
organisation (`enterprise_user.enterprise_id`), auth.test the workspace's (the bot's token).
Over real HTTP against the mock Web API, a real Redis and the scripted model, as
tests/test_slack_walls.py.
"""

from __future__ import annotations

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from adapters.memory_page.access import DirectoryError, SlackDirectory
from memory.scope import PUBLIC
from tests.support.slack_api import MockSlackApi, mention
from tests.test_slack_walls import (
    QUESTION,
    asks_team_memory,
    sent_to_model,
    stored,
    team_memory,
    ts,
    walled_world,
)

ORG, PARTNER_ORG = "EORG", "EPARTNER"
SISTER, SISTER_TEAM = "U7", "TSISTER"  # a member of a sister workspace of our org
PARTNER, PARTNER_TEAM = "U8", "TPARTNER"  # Slack Connect: another organisation's
LONER, LONER_TEAM = "U9", "TLONER"  # Slack Connect: an organisation in no Grid
ORG_WIDE = "C9"  # shared among the organisation's workspaces only


@pytest.fixture
async def walled(redis_url, tmp_path):
    async with walled_world(redis_url, tmp_path) as env:
        yield env


def grid(api: MockSlackApi, team: str) -> None:
    """The workspace `team` is of the Grid org ORG, with a sister workspace's member, a
    partner organisation's person and a non-Grid organisation's, and an org-wide channel."""
    api.team_id, api.enterprise_id = team, ORG  # the bot's token is this workspace's
    api.users.update({SISTER: "Sis", PARTNER: "Pat", LONER: "Lou"})
    api.homes.update({SISTER: SISTER_TEAM, PARTNER: PARTNER_TEAM, LONER: LONER_TEAM})
    api.enterprises.update({PARTNER: PARTNER_ORG, LONER: ""})
    api.org_shared_channels.add(ORG_WIDE)


async def asks_in_the_org_wide_channel(env, team: str, user: str, home: str, n: int) -> str:
    """`user` (of workspace `home`) mentions the bot in the org-wide channel, with the
    payload Slack sends for them: what the model was sent."""
    before = len(env.world.model_requests())
    event = {**mention(QUESTION, ts(n), channel=ORG_WIDE, user=user), "user_team": home}
    await env.a.event(event, team=team)
    await env.settle()
    return sent_to_model(env, before)


async def test_a_sister_workspace_member_in_an_org_shared_channel_sees_the_team_s_memory(walled):
    team = await team_memory(walled)
    grid(walled.api, team)
    walled.world.model.script(*asks_team_memory())
    seen = await asks_in_the_org_wide_channel(walled, team, SISTER, SISTER_TEAM, 70)
    assert "7 million" in seen and "9 million" in seen
    # their turn is the host workspace's (its tenant), public as a member's would be
    assert await stored(walled, team, ORG_WIDE, ts(70)) == {"public"}


async def test_another_organisation_s_person_with_the_same_payload_is_walled(walled):
    team = await team_memory(walled)
    grid(walled.api, team)
    walled.world.model.script(*asks_team_memory() * 2)
    for n, (user, home) in enumerate(((PARTNER, PARTNER_TEAM), (LONER, LONER_TEAM)), 80):
        seen = await asks_in_the_org_wide_channel(walled, team, user, home, n)
        assert QUESTION in seen  # answered
        assert "7 million" not in seen and "9 million" not in seen
        assert await stored(walled, team, ORG_WIDE, ts(n)) == {f"private:{ORG_WIDE}"}


async def test_when_slack_cannot_say_the_sister_workspace_member_is_walled(walled):
    walled.world.model.script(*asks_team_memory() * 4)

    async def sister_in_a_fresh_workspace(user: str) -> str:
        """A fresh workspace (nothing of it cached) of ORG; `user` is the sister's member."""
        team = await team_memory(walled)
        grid(walled.api, team)
        walled.api.users[user] = "Sis"
        walled.api.homes[user] = SISTER_TEAM
        return team

    team = await sister_in_a_fresh_workspace("U71")
    walled.api.fail("users.info", "internal_error")  # who they are: never said
    seen = await asks_in_the_org_wide_channel(walled, team, "U71", SISTER_TEAM, 90)
    assert "7 million" not in seen

    team = await sister_in_a_fresh_workspace("U72")
    walled.api.fail("auth.test", "internal_error")  # which org the workspace is of: never said
    seen = await asks_in_the_org_wide_channel(walled, team, "U72", SISTER_TEAM, 91)
    assert "7 million" not in seen

    team = await sister_in_a_fresh_workspace("U73")
    walled.api.team_id = "TELSEWHERE"  # the token is another workspace's: not this one's org
    seen = await asks_in_the_org_wide_channel(walled, team, "U73", SISTER_TEAM, 92)
    assert "7 million" not in seen

    team = await sister_in_a_fresh_workspace("U74")  # Slack says both orgs: not walled
    seen = await asks_in_the_org_wide_channel(walled, team, "U74", SISTER_TEAM, 93)
    assert "7 million" in seen


# -- the memory page: the same rule --------------------------------------------------------------


@pytest.fixture
async def grid_api(tenant) -> MockSlackApi:
    api = MockSlackApi()
    await api.start()
    grid(api, tenant)
    api.strangers.update({SISTER, PARTNER, LONER})  # of another workspace, in no shared channel
    yield api
    await api.close()


def directory(api: MockSlackApi) -> SlackDirectory:
    return SlackDirectory(AsyncWebClient(token="xoxb-test", base_url=api.base_url))


async def test_the_memory_page_shows_a_sister_workspace_member_the_team_s_memory(grid_api, tenant):
    assert (await directory(grid_api).viewer(tenant, SISTER)).can_see(PUBLIC)
    for person in (PARTNER, LONER):  # Slack Connect, another org or none: their places only
        assert not (await directory(grid_api).viewer(tenant, person)).can_see(PUBLIC)
    grid_api.guests.add(SISTER)  # a guest is walled, of the organisation or not
    assert not (await directory(grid_api).viewer(tenant, SISTER)).can_see(PUBLIC)


async def test_the_memory_page_fails_closed_when_slack_cannot_say_the_organisation(
    grid_api, tenant
):
    grid_api.fail("auth.test", "internal_error")
    with pytest.raises(DirectoryError):  # no page at all, with a message: nothing shown
        await directory(grid_api).viewer(tenant, SISTER)
    assert (await directory(grid_api).viewer(tenant, "U1")).can_see(PUBLIC)  # a member: not asked
    grid_api.team_id = "TELSEWHERE"  # the token is another workspace's
    assert not (await directory(grid_api).viewer(tenant, SISTER)).can_see(PUBLIC)
    grid_api.team_id, grid_api.enterprise_id = tenant, ""  # a workspace in no Grid
    grid_api.enterprises[SISTER] = ORG  # whatever org the person names
    assert not (await directory(grid_api).viewer(tenant, SISTER)).can_see(PUBLIC)
