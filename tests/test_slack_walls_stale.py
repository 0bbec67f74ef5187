"""How long Slack's last answer stands when Slack cannot say (adapters/slack_walls.py): past
its cache, while Slack is unreachable, rate limited or failing, the last answer stands up to
`STALE_SECONDS`; after that the scope fails closed (the channel private and shared, the person
walled, the membership unknown: refused). Against the mock Web API over real HTTP, with the
walls' own clock moved on by the test (`SlackWalls(clock=...)`), not the process's.
"""

from __future__ import annotations

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack_walls import STALE_SECONDS, UNKNOWN_PLACE, Person, Place, SlackWalls
from memory.scope import Visibility
from tests.support.slack_api import MockSlackApi

TEAM = "T1"
CACHE_SECONDS = 300.0
ASKED = ("conversations.info", "users.info", "users.conversations")


class Clock:
    """A monotonic clock the test moves on."""

    def __init__(self) -> None:
        self.now = 10_000.0

    def __call__(self) -> float:
        return self.now


async def slack_cannot_say(api: MockSlackApi, how: str) -> None:
    """From now on every question the walls ask fails the way `how` says."""
    for method in ASKED:
        if how == "error":
            api.fail(method, "internal_error", times=1_000)
        elif how == "rate limited":
            api.rate_limit(method, times=1_000, retry_after=60)  # seconds of the walls' clock
    if how == "unreachable":
        await api.close()  # nothing listens at its address any more


async def what_slack_said(walls: SlackWalls) -> tuple[Place, Person, bool | None]:
    return (
        await walls.place(TEAM, "C1", "channel"),
        await walls.person(TEAM, "U2"),
        await walls.member_of(TEAM, "U2", "C1"),
    )


@pytest.mark.parametrize("how", ["error", "rate limited", "unreachable"])
async def test_the_last_answer_stands_until_stale_then_the_scope_fails_closed(how):
    api = MockSlackApi(members={"C1": {"U1", "U2"}})
    await api.start()
    clock = Clock()
    walls = SlackWalls(
        AsyncWebClient(token="xoxb-test", base_url=api.base_url), CACHE_SECONDS, clock=clock
    )
    try:
        answered = (Place(Visibility.PUBLIC), Person("Grace"), True)
        started = clock.now
        assert await what_slack_said(walls) == answered  # a member, in a public channel
        asked = len(api.calls)
        await slack_cannot_say(api, how)

        clock.now = started + CACHE_SECONDS + 1  # past the cache: Slack asked, cannot say
        assert await what_slack_said(walls) == answered  # the last answer stands
        if how != "unreachable":
            assert {c.method for c in api.calls[asked:]} == set(ASKED)  # it was asked again

        clock.now = started + STALE_SECONDS - 1
        assert await what_slack_said(walls) == answered  # still under STALE_SECONDS

        clock.now = started + STALE_SECONDS + 1  # too old to trust: fails closed
        place, person, member = await what_slack_said(walls)
        assert place == UNKNOWN_PLACE  # private and shared: walled for everyone
        assert person.outsider  # walled
        assert member is None  # Slack cannot say: the adapter refuses (MEMBERSHIP_UNKNOWN)
        assert (await walls.place(TEAM, "C1", "group")) == UNKNOWN_PLACE
    finally:
        if how != "unreachable":
            await api.close()
