"""Slack's notices and the places they change: a channel made private or public (Slack's
`channel_convert_to_private` or `_public` message in it) is asked of Slack again at once, not
when its cached walls expire; Slack's other notices (a pin, a reminder) in a DM are no
question; a guest's own thread in a public channel is listed on their Home tab; a PDF shared
with a question is answered to the person in their own workspace (a streamed reply's recipient
team).

Through the Slack adapter over real HTTP, a real Redis, the scripted model."""

from __future__ import annotations

import json
import time

from slack_sdk.web.async_client import AsyncWebClient

from adapters.memory_page.access import Directories, SlackDirectory
from adapters.memory_page.auth import Links, LinkSigner
from memory.keys import sharing_changed_key
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, MockSlackApi, file_share, mention, message
from tests.test_memory_access import slack_with_page
from tests.test_shared_pdfs import shared_pdf, shared_world
from tests.test_slack_walls import GUEST, stored, ts, walled_world


def notice(subtype: str, said: str, n: int, channel: str, channel_type: str) -> dict:
    """A notice Slack posts as a message of the person who did it (subtype, no question)."""
    return message(said, ts(n), channel=channel, subtype=subtype, channel_type=channel_type)


async def test_a_channel_made_private_is_asked_of_slack_again_at_once(redis_url, tmp_path):
    """Slack's answers cached for 5 minutes, as in production: the notice empties them here and
    leaves a new token for the other processes."""
    async with walled_world(redis_url, tmp_path, cache_seconds=300) as env:
        team = f"T{time.time_ns()}"
        env.world.model.script(text("first"), text("second"))
        await env.a.event(mention("hello", ts(50), channel="C8"), team=team)
        await env.settle()
        assert await stored(env, team, "C8", ts(50)) == {"public"}
        token = await env.memory.redis.hget(sharing_changed_key(), "C8")

        env.api.private_channels.add("C8")  # an admin converts the channel
        converted = notice("channel_convert_to_private", "made this channel *private*. Now, it "
                           "can only be viewed or joined by invitation.", 51, "C8", "group")  # fmt: skip
        assert (await env.a.event(converted, team=team)).status == 200
        await env.settle()
        assert await env.memory.redis.hget(sharing_changed_key(), "C8") not in (None, token)

        await env.a.event(mention("hello again", ts(52), channel="C8"), team=team)
        await env.settle()
        assert await stored(env, team, "C8", ts(52)) == {"private:C8"}
        assert len(env.world.model_requests()) == 2  # the notice is not answered
        await env.memory.drop_tenant(team)


async def test_a_channel_made_public_is_asked_of_slack_again_at_once(redis_url, tmp_path):
    """The other way round: a private channel's cached answer goes with its
    `channel_convert_to_public` notice, so its next turn is stored public."""
    async with walled_world(redis_url, tmp_path, cache_seconds=300) as env:
        team = f"T{time.time_ns()}"
        env.world.model.script(text("first"), text("second"))
        env.api.private_channels.add("C9")
        await env.a.event(mention("hello", ts(55), channel="C9"), team=team)
        await env.settle()
        assert await stored(env, team, "C9", ts(55)) == {"private:C9"}

        env.api.private_channels.discard("C9")  # an admin makes the channel public
        made_public = notice("channel_convert_to_public", "made this channel public.", 56,
                             "C9", "channel")  # fmt: skip
        assert (await env.a.event(made_public, team=team)).status == 200
        await env.settle()
        await env.a.event(mention("hello again", ts(57), channel="C9"), team=team)
        await env.settle()
        assert await stored(env, team, "C9", ts(57)) == {"public"}
        assert len(env.world.model_requests()) == 2  # the notice is not answered
        await env.memory.drop_tenant(team)


async def test_slack_s_notices_in_a_dm_are_not_answered(redis_url, tmp_path):
    async with walled_world(redis_url, tmp_path) as env:
        team = f"T{time.time_ns()}"
        env.world.model.script(text("a wave back"), text("spare"), text("spare"))
        dm = {"channel": "DU1", "channel_type": "im"}
        pinned = notice("pinned_item", "pinned a message to this conversation.", 60, **dm)
        reminder = notice("reminder_add", "set up a reminder “read the paper”.", 61, **dm)
        for event in (pinned, reminder):
            assert (await env.a.event(event, team=team)).status == 200
        await env.settle()
        assert env.world.model_requests() == []
        waves = notice("me_message", "waves at the bot", 62, **dm)  # a person's /me: a message
        await env.a.event(waves, team=team)
        await env.settle()
        [asked] = env.world.model_requests()
        assert "waves at the bot" in json.dumps(asked)
        await env.memory.drop_tenant(team)


async def test_the_app_home_lists_a_guest_s_own_thread_in_a_public_channel(redis_url, tmp_path):
    """A guest's turn in public C1 is stored private to C1 (memory/scope.py): the guest, in
    C1, may see it; once out of C1, not."""
    world = await open_world(redis_url, tmp_path)
    api = MockSlackApi()
    api.users[GUEST] = "Gus"
    api.guests.add(GUEST)
    api.members["C1"] = {"U1", GUEST}
    await api.start()
    team = f"T{time.time_ns()}"
    links = Links(LinkSigner("link-secret"), "http://127.0.0.1")
    directory = SlackDirectory(AsyncWebClient(token="xoxb-test", base_url=api.base_url))
    try:
        async with slack_with_page(world, api, links, Directories(slack=directory)) as (
            _, sender, settle,
        ):  # fmt: skip
            world.model.script(text("hello, guest"))
            await sender.event(mention("hi", ts(70), channel="C1", user=GUEST), team=team)
            await settle()
            await sender.home_opened(GUEST, team=team)
            await settle()
            assert "<#C1>" in json.dumps(api.home_views[GUEST])
            api.members["C1"].discard(GUEST)  # the guest is taken out of C1
            await sender.home_opened(GUEST, team=team)
            await settle()
            assert "<#C1>" not in json.dumps(api.home_views[GUEST])
        await world.runtime.memory.drop_tenant(team)
    finally:
        await api.close()
        await close_world(world)


async def test_a_pdf_with_a_question_is_answered_in_the_sharer_s_workspace(redis_url, tmp_path):
    async with shared_world(redis_url, tmp_path) as env:
        team = f"T{time.time_ns()}"
        env.world.model.script(text("It is about walruses."))
        pdf = env.api.add_file("w.pdf", shared_pdf("Walrus Notes"))
        shared = file_share([pdf], ts(80), text=f"<@{BOT_USER}> what is this about?")
        await env.slack.event({**shared, "user_team": "TPARTNER"}, team=team)  # Slack Connect
        await env.settle(until=lambda: len(env.world.model_requests()) == 1)
        await env.settle()
        [started] = env.api.of("chat.startStream")
        assert (started["recipient_user_id"], started["recipient_team_id"]) == ("U1", "TPARTNER")
        await env.world.runtime.memory.drop_tenant(team)
