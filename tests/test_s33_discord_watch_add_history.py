"""s33: Discord's `/watch add` where the bot may not read the message history. Without Read
Message History Discord answers a channel's history with an empty list, so a digest task run
again after a long outage cannot find the digest it already posted (`DiscordWatches.find`) and
may post it twice. The watch is made all the same, and its answer says what to grant (from the
interaction's `app_permissions`, as Discord resolves them: in a thread, its parent's); with
the history readable it says nothing more. The refusal without Send Messages is unchanged.

Driven as an INTERACTION_CREATE through discord.py's command tree, answered at the local
Discord API, against the real Redis (the fixtures of tests/test_watches_discord.py)."""

from __future__ import annotations

import pytest

from adapters.discord_watch import CANNOT_POST
from bot.watches import created_text
from tests.support.discord_api import READ_MESSAGE_HISTORY, SEND_MESSAGES, VIEW_CHANNEL
from tests.test_discord_feedback import answered
from tests.test_watches_discord import api, env, watch_command  # noqa: F401 (fixtures)

SEND_IN_THREADS = 1 << 38
NOTE = "I cannot read the message history here"


def text_channel_payload(payload: dict, guild: int, channel: int) -> dict:
    """The interaction's channel as Discord gives it for a server text channel (the helper's
    default is a thread)."""
    payload["channel"] = {
        "id": str(channel), "type": 0, "guild_id": str(guild), "name": "papers", "position": 0,
        "permission_overwrites": [], "nsfw": False, "parent_id": None, "topic": None,
        "last_message_id": None, "rate_limit_per_user": 0, "permissions": "1024",
    }  # fmt: skip
    return payload


async def add_watch(env, perms: int, *, in_thread: bool) -> tuple[dict, list, str]:  # noqa: F811
    """`/watch add` with these `app_permissions`, in a server text channel or a thread: its
    answer, the server's watches, and the place's id."""
    world, fake, adapter, api_ = env
    guild, user = fake.guild(), fake.snowflake()
    place = fake.thread(guild, user) if in_thread else fake.text_channel(guild)
    payload = watch_command(guild.id, place.id, user, "add", perms, topic="state space models")
    if in_thread:
        payload["channel"]["parent_id"] = str(place.parent_id)
    else:
        text_channel_payload(payload, guild.id, place.id)
    adapter.client._connection.parse_interaction_create(payload)
    [made] = await answered(api_, 1)
    store = world.runtime.watches.store
    found = await store.all(str(guild.id))
    for watch in found:  # the suite's Redis is shared: leave no watch due
        await store.remove(str(guild.id), watch.id)
    return made, found, str(place.id)


@pytest.mark.parametrize(
    ("perms", "in_thread", "missing"),
    [
        (VIEW_CHANNEL | SEND_MESSAGES, False, "Read Message History"),
        (SEND_MESSAGES, False, "View Channel and Read Message History"),
        (VIEW_CHANNEL | SEND_IN_THREADS, True, "Read Message History"),  # the parent's, given
    ],
    ids=["channel", "channel-unseen", "thread"],
)
async def test_a_watch_made_where_the_history_is_unreadable_says_what_to_grant(
    env,  # noqa: F811
    perms,
    in_thread,
    missing,
):
    made, [watch], place = await add_watch(env, perms, in_thread=in_thread)
    content = made["data"]["content"]
    assert watch.channel == place  # made all the same
    assert content.startswith(created_text(watch) + " ")
    assert NOTE in content and "a digest may be posted twice" in content
    assert content.endswith(f"(the channel's permissions: {missing}).")
    assert not made["data"].get("flags", 0) & 64  # public, as every new watch's answer


@pytest.mark.parametrize("in_thread", [False, True], ids=["channel", "thread"])
async def test_a_watch_made_where_the_history_is_readable_says_nothing_more(env, in_thread):  # noqa: F811
    perms = VIEW_CHANNEL | READ_MESSAGE_HISTORY | (SEND_IN_THREADS if in_thread else SEND_MESSAGES)
    made, [watch], place = await add_watch(env, perms, in_thread=in_thread)
    assert watch.channel == place
    assert made["data"]["content"] == created_text(watch)


async def test_without_send_messages_the_refusal_is_unchanged(env):  # noqa: F811
    made, found, _ = await add_watch(env, VIEW_CHANNEL, in_thread=False)
    assert made["data"]["content"] == CANNOT_POST and made["data"]["flags"] & 64
    assert found == []
