"""The bot's walls follow the memory page's rules, and Slack is asked at once:

- a person Slack flags an admin is one only when not walled (adapters/slack_walls.py
  `workspace_admin`): a Slack Connect admin of another organisation, or a guest flagged admin,
  cannot manage another channel's watches with `/watch`; a sister workspace's admin can;
- an event of a Slack Connect person asks Slack its three questions (the channel, the person,
  the workspace's organisation) together, not one after another past Slack's 3 s;
- a digest asks Slack afresh whether its channel is shared: another process's `channel_shared`
  emptied only that process's cache;
- Slack unable to say the workspace's organisation is not "no organisation": the person is not
  `said`, and asked again;
- the creator of a watch who is a sister workspace's member is told of its pause.

Over real HTTP against the mock Web API (tests/support/slack_api.py), and a real Redis for the
adapter's.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from redis.asyncio import Redis
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack_walls import ASK_SECONDS, SlackWalls
from adapters.slack_watch import SlackWatches
from memory.sharing import SharingChanges
from memory.stores.watches import Watch, WatchStore
from tests.support.scripted_openai import text
from tests.support.slack_api import MockSlackApi, mention, message
from tests.test_slack import slack  # noqa: F401  (the fixture)
from tests.test_watches_admins import slash

ORG, PARTNER_ORG = "EORG", "EPARTNER"
SISTER, PARTNER, GUEST = "U7", "U8", "U9"
WEEK = 7 * 86400
SLACK_ANSWERS_AFTER = 20.0  # seconds: the held answers come long after any answer


class Clock:
    """A monotonic clock a test moves on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def grid(api: MockSlackApi, team: str) -> None:
    """`team` is of the Grid org ORG (the bot's token is its installation's), with a sister
    workspace's member, another organisation's (Slack Connect) and a guest: all three flagged
    admins by Slack (of their own workspace, or wrongly)."""
    api.team_id, api.enterprise_id = team, ORG
    api.users.update({SISTER: "Sis", PARTNER: "Pat", GUEST: "Gus"})
    api.homes.update({SISTER: "TSISTER", PARTNER: "TPARTNER"})
    api.enterprises[PARTNER] = PARTNER_ORG
    api.strangers.update({SISTER, PARTNER})
    api.guests.add(GUEST)
    api.admins.update({SISTER, PARTNER, GUEST})


@pytest.fixture
async def api():
    api = MockSlackApi()
    await api.start()
    yield api
    await api.close()


def client(api: MockSlackApi) -> AsyncWebClient:
    return AsyncWebClient(token="xoxb-test", base_url=api.base_url)


# -- 1. `/watch`: a walled person is never an admin ----------------------------------------------


async def test_a_walled_person_slack_flags_an_admin_manages_no_other_channel_s_watch(slack):  # noqa: F811
    team = f"T{time.time_ns()}"
    grid(slack.api, team)
    store: WatchStore = slack.world.runtime.watches.store
    try:
        made = await slash(slack, "quokka sleep weekly", team, "C1", "U1")
        assert made.startswith("Watching “quokka sleep”")
        [watch] = await store.all(team)
        for walled in (PARTNER, GUEST):
            for verb in ("pause", "remove"):
                refused = await slash(slack, f"{verb} {watch.id}", team, "C2", walled)
                assert refused.startswith(f"No watch `{watch.id}` posts here"), (walled, verb)
                assert "quokka" not in refused and "<#C1>" not in refused
        assert [w.id for w in await store.all(team)] == [watch.id]
        assert (await store.get(team, watch.id)).paused == ""
        # a sister workspace's admin, of the workspace's own organisation, is one
        paused = await slash(slack, f"pause {watch.id}", team, "C2", SISTER)
        assert paused.startswith("Paused “quokka sleep”, weekly in <#C1>")
    finally:
        for left in await store.all(team):
            await store.remove(team, left.id)


# -- 2. an event asks Slack its questions together ----------------------------------------------


async def test_a_slack_connect_person_s_mention_waits_for_one_slack_answer_not_three(slack):  # noqa: F811
    team = f"T{time.time_ns()}"
    slack.api.users[PARTNER] = "Pat"
    slack.api.homes[PARTNER] = "TPARTNER"
    slack.api.enterprises[PARTNER] = PARTNER_ORG
    # bolt's own auth.test (once per process, before its first request) is not held
    await slack.a.event(message("just chatting", f"1700000001.{time.time_ns() % 10**6:06d}"))
    slack.world.model.script(text("An answer for Pat."))
    answered = asyncio.Event()

    def slack_answers() -> None:
        answered.set()
        slack.api.release()

    asked = ("users.info", "auth.test", "conversations.info")
    before = len(slack.api.calls)
    slack.api.hold(*asked)
    later = asyncio.get_running_loop().call_later(SLACK_ANSWERS_AFTER, slack_answers)
    try:
        event = {**mention("what is new?", "1700000002.000001", user=PARTNER),
                 "user_team": "TPARTNER"}  # fmt: skip
        response = await slack.a.event(event, team=team)
        assert response.status == 200
        assert not answered.is_set()  # answered while Slack had said nothing
        calls = [c for c in slack.api.calls[before:] if c.method in asked]
        assert sorted({c.method for c in calls}) == sorted(asked)
        # every question was asked before the first one's wait ran out: one wait, not three
        # in turn (each of those waits ASK_SECONDS before the next question is asked)
        arrivals = [c.at for c in calls]
        assert max(arrivals) - min(arrivals) < ASK_SECONDS
    finally:
        later.cancel()
        slack_answers()
    await slack.settle()


# -- 3. a digest asks Slack afresh ---------------------------------------------------------------


async def test_another_process_s_cache_and_digest_follow_slack_sharing_its_channel(api, redis_url):
    """Slack's `channel_shared` reaches one process; the other's cache said the channel is the
    workspace's alone, and drops that at once (the sharing token in Redis); its digest asks
    Slack anyway."""
    team, channel = "T1", f"C5{time.time_ns()}"
    redis = Redis.from_url(redis_url)
    receiving = SlackWalls(client(api), sharing=SharingChanges(redis))
    other = SlackWalls(client(api), sharing=SharingChanges(redis))
    digests = SlackWatches(None, client(api), walls=other)
    watch = Watch(id="w1", tenant=team, query="quokka sleep", period=WEEK, platform="slack",
                  channel=channel)  # fmt: skip
    for walls in (receiving, other):  # both processes have seen the channel, unshared
        assert not (await walls.place(team, channel, "channel")).shared
    assert not await digests.walled(watch)
    api.shared_channels.add(channel)  # another organisation joins
    await receiving.on_sharing_changed({"type": "channel_shared", "channel": channel})
    assert (await receiving.place(team, channel, "channel")).shared  # the event's process
    assert (await other.place(team, channel, "channel")).shared  # and the other, at once
    assert await digests.walled(watch)
    asked = len(api.of("conversations.info"))
    assert (await other.place(team, channel, "channel")).shared  # cached again: not re-asked
    assert len(api.of("conversations.info")) == asked
    api.shared_channels.discard(channel)  # and leaves: the other process follows too
    await receiving.on_sharing_changed({"type": "channel_unshared", "channel": channel})
    assert not (await other.place(team, channel, "channel")).shared
    api.fail("conversations.info", "internal_error")
    api.shared_channels.add(channel)
    assert await digests.walled(watch)  # Slack cannot say: walled
    await redis.aclose()


# -- 5. Slack unable to say the organisation -----------------------------------------------------


async def test_slack_unable_to_say_the_organisation_leaves_the_person_unsaid_and_asked_again(
    api,
):
    team, clock = "TGRID", Clock()
    grid(api, team)
    walls = SlackWalls(client(api), clock=clock)
    api.fail("auth.test", "internal_error")
    person = await walls.person(team, SISTER)
    assert person.outsider and not person.said  # fail closed, not Slack's word
    assert await walls.organisation(team) is None
    clock.now += 60  # past the failure's quiet time, well within the cache's 5 minutes
    person = await walls.person(team, SISTER)
    assert person.said and not person.outsider  # asked again: of the organisation


# -- 6. a sister workspace's member is told of their watch ----------------------------------------


async def test_a_watch_s_creator_of_a_sister_workspace_is_told_and_another_org_s_is_not(api):
    team = "TGRID"
    grid(api, team)
    watches = SlackWatches(None, client(api))
    for creator in (SISTER, PARTNER):
        watch = Watch(id=f"w-{creator}", tenant=team, query="quokka sleep", period=WEEK,
                      platform="slack", channel="C1", created_by=creator)  # fmt: skip
        await watches.tell(watch, f"paused, {creator}")
    told = [p["channel"] for p in api.of("chat.postMessage")]
    assert told == [api.dm_channel(SISTER)]
    assert json.dumps(api.of("conversations.open")).count(PARTNER) == 0
