"""s33: Discord's `/watch add` where the bot may not read the message history. Without Read
Message History Discord answers a channel's history with an empty list, so a digest task run
again after a long outage cannot find the digest it already posted (`DiscordWatches.find`) and
may post it twice. The watch is made all the same, and its answer names the channel the watch
posts to and what to grant (from the interaction's `app_permissions`, as Discord resolves
them: in a thread, its parent's, so the grant is named there); with the history readable, or
in a DM, it says nothing more. Without Send Messages or View Channel it is refused. The answer
stays under Discord's 2,000 characters (the local API refuses more, as Discord does), the note
whole and the watch's description cut.

Driven as an INTERACTION_CREATE through discord.py's command tree, answered at the local
Discord API, against the real Redis (the fixtures of tests/test_watches_discord.py)."""

from __future__ import annotations

import discord
import pytest

from adapters.discord_watch import CANNOT_POST, HISTORY_UNREADABLE
from bot.watches import created_text
from tests.support.discord_api import READ_MESSAGE_HISTORY, SEND_MESSAGES, VIEW_CHANNEL
from tests.test_discord_audit_s28 import watch_callback
from tests.test_discord_feedback import answered
from tests.test_watches_discord import api, env, watch_command  # noqa: F401 (fixtures)

SEND_IN_THREADS = 1 << 38


def note(channel: str, grant: str) -> str:
    return HISTORY_UNREADABLE.format(channel=channel, grant=grant)


def text_channel_payload(payload: dict, guild: int, channel: int) -> dict:
    """The interaction's channel as Discord gives it for a server text channel (the helper's
    default is a thread)."""
    payload["channel"] = {
        "id": str(channel), "type": 0, "guild_id": str(guild), "name": "papers", "position": 0,
        "permission_overwrites": [], "nsfw": False, "parent_id": None, "topic": None,
        "last_message_id": None, "rate_limit_per_user": 0, "permissions": "1024",
    }  # fmt: skip
    return payload


async def add_watch(
    env,  # noqa: F811
    perms: int,
    *,
    in_thread: bool,
    bot_thread: bool = False,
    **options: str,
) -> tuple[dict, list, str, str]:
    """`/watch add` with these `app_permissions`, in a server text channel or a thread (a
    person's, or one the bot opened for a mention): its answer, the server's watches, the
    place's id and its parent's (the place's own in a channel)."""
    world, fake, adapter, api_ = env
    guild, user = fake.guild(), fake.snowflake()
    if in_thread:
        place = fake.thread(guild, fake.bot.id if bot_thread else user)
        place.type = discord.ChannelType.public_thread
    else:
        place = fake.text_channel(guild)
    options = {"topic": "state space models", **options}
    payload = watch_command(guild.id, place.id, user, "add", perms, **options)
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
    parent = str(place.parent_id) if in_thread else str(place.id)
    return made, found, str(place.id), parent


@pytest.mark.parametrize("in_thread", [False, True], ids=["channel", "thread"])
async def test_a_watch_made_where_the_history_is_unreadable_says_what_to_grant(env, in_thread):  # noqa: F811
    perms = VIEW_CHANNEL | (SEND_IN_THREADS if in_thread else SEND_MESSAGES)
    made, [watch], place, parent = await add_watch(env, perms, in_thread=in_thread)
    content = made["data"]["content"]
    assert watch.channel == place  # made all the same
    # the history of the watch's place, granted in its channel (a thread's is its parent's)
    assert content == f"{created_text(watch)} {note(place, parent)}"
    assert not made["data"].get("flags", 0) & 64  # public, as every new watch's answer


async def test_in_a_thread_the_bot_opened_the_note_names_its_channel(env):  # noqa: F811
    """The watch posts to the thread's channel (`home`), so the note names it, not "here"."""
    made, [watch], _, parent = await add_watch(
        env, VIEW_CHANNEL | SEND_IN_THREADS, in_thread=True, bot_thread=True
    )
    assert watch.channel == parent
    content = made["data"]["content"]
    assert content == f"{created_text(watch, elsewhere=True)} {note(parent, parent)}"
    assert f"message history of <#{parent}>" in content


@pytest.mark.parametrize("readable", [False, True], ids=["with-note", "without-note"])
async def test_a_long_answer_is_cut_in_the_watch_description_keeping_the_note_whole(
    env,  # noqa: F811
    readable,
):
    """An author field of 3,000 characters: Discord refuses a message over 2,000 (the person
    would see "The application did not respond" though the watch was made), so the watch's
    description is cut, its id, the way to stop it and the note kept whole."""
    author = " ".join(["Quokka Longname"] * 200)
    perms = VIEW_CHANNEL | SEND_MESSAGES | (READ_MESSAGE_HISTORY if readable else 0)
    made, [watch], place, _ = await add_watch(env, perms, in_thread=False, author=author)
    content = made["data"]["content"]
    assert watch.authors == [author]  # made, the author whole
    assert len(content) <= 2000
    assert content.startswith("Watching “state space models” author:Quokka Longname")
    assert f"… here (id `{watch.id}`)." in content and f"`/watch remove {watch.id}`" in content
    assert content.endswith("stops it." if readable else " " + note(place, place))


@pytest.mark.parametrize("in_thread", [False, True], ids=["channel", "thread"])
async def test_a_watch_made_where_the_history_is_readable_says_nothing_more(env, in_thread):  # noqa: F811
    perms = VIEW_CHANNEL | READ_MESSAGE_HISTORY | (SEND_IN_THREADS if in_thread else SEND_MESSAGES)
    made, [watch], place, _ = await add_watch(env, perms, in_thread=in_thread)
    assert watch.channel == place
    assert made["data"]["content"] == created_text(watch)


@pytest.mark.parametrize(
    "perms",
    [VIEW_CHANNEL | READ_MESSAGE_HISTORY, SEND_MESSAGES | READ_MESSAGE_HISTORY],
    ids=["no-send-messages", "no-view-channel"],
)
async def test_without_send_messages_or_view_channel_it_is_refused(env, perms):  # noqa: F811
    """Without View Channel Discord refuses every message too: nothing could be posted."""
    made, found, _, _ = await add_watch(env, perms, in_thread=False)
    assert made["data"]["content"] == CANNOT_POST and made["data"]["flags"] & 64
    assert found == []


async def test_in_a_dm_nothing_is_said_of_the_history(env):  # noqa: F811
    """A DM has no channel permissions to grant: the answer is the watch's alone."""
    world, fake, adapter, _ = env
    user = fake.user()
    dm = fake.dm_channel(user)
    interaction = fake.interaction(dm, user)
    interaction.app_permissions = discord.Permissions(view_channel=True, send_messages=True)
    await watch_callback(adapter, "add")(interaction, topic="state space models")
    store, tenant = world.runtime.watches.store, f"dm-{user.id}"
    [watch] = await store.all(tenant)
    await store.remove(tenant, watch.id)
    assert watch.channel == str(dm.id)
    said = interaction.response.send_message.await_args.args[0]
    assert said == created_text(watch)
