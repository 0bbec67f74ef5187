"""A Discord watch made by a mention ("watch … weekly", the turn handler's `WatchService.message`)
or resumed (`/watch resume`) where the bot may not read the message history is told what to
grant, as `/watch add` is: without Read Message History Discord answers the history with an
empty list, so a digest task run again after a long outage cannot find the digest it already
posted and may post it twice. The note names where the watch posts and where to grant it (a
thread's parent); a channel the bot may read gets none; a resumed watch's answer stays under
Discord's 2,000 characters, the note whole, as do a paused or removed one's and the answer to
an id that names no watch; `/watch list` shows every watch's id and state (the descriptions
cut; past some 40 watches the paused kept, the rest counted by watch); a note Discord fails to
look up, or never answers, leaves the watch resumed and said so; a refused resume or mention
carries no note. A history read Discord refuses (403) in `find` is
warned of once per channel while it lasts, not on every digest run.

The bot's permissions are the local Discord API's (tests/support/discord_api.py: the server's
roles, the channel's overwrites, `deny_history`), cached as the gateway gives them; the watches
are stored in the real Redis."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import discord
import pytest

from adapters.discord_watch import (
    CANNOT_POST_IN,
    HISTORY_UNREADABLE,
    LIMIT,
    MORE_LISTED,
    DiscordWatches,
)
from bot.watches import WatchPlace, WatchService, created_text, describe
from memory.ingest.arxiv_source import ArxivSource
from memory.keys import task_stream
from memory.scope import Scope, Visibility
from memory.stores.watches import DAY, Watch
from memory.tasks import TaskStream
from memory.tokens import encoding_for
from tests.support.discord_api import (
    EVERYONE,
    READ_MESSAGE_HISTORY,
    SEND_MESSAGES,
    Guild,
    MockDiscordApi,
    serving_discord_api,
    snowflake,
)
from tests.support.discord_fakes import FakeDiscord
from tests.test_s32_discord_history_permission import poster

SEND_IN_THREADS = 1 << 38
FIND_WARNING = "could not read"
LONG_AUTHOR = " ".join(["Quokka Longname"] * 200)  # 3,199 characters: an author option's


def note(channel: int, grant: int) -> str:
    return HISTORY_UNREADABLE.format(channel=channel, grant=grant)


@dataclass
class Server:
    """A server at the local Discord API: a channel whose history the bot may not read (an
    overwrite of its member), a thread the bot opened there and a private one, a channel it
    may read, one it may neither read the history of nor send in (`muted`), a thread whose
    parent the bot's cache lacks (`orphan`: Discord is asked for it); one process's watches
    posting there."""

    api: MockDiscordApi
    guild: Guild
    closed_off: int
    thread: int
    private: int
    readable: int
    muted: int
    orphan: int
    service: WatchService
    poster: DiscordWatches
    person: int

    @property
    def tenant(self) -> str:
        return str(self.guild.id)

    def said_in(self, channel: int) -> Scope:
        """A message or command there, as the adapter scopes it."""
        return Scope(self.tenant, f"discord:{self.tenant}:{channel}", str(channel),
                     Visibility.PUBLIC, str(self.person))  # fmt: skip

    async def made_by_mention(self, channel: int) -> tuple[str, Watch]:
        """ "@bot watch state space models weekly" there: the answer, and the watch."""
        answer = await self.service.message(
            self.said_in(channel), "watch state space models weekly"
        )
        assert answer is not None
        [watch] = await self.service.store.all(self.tenant)
        return answer, watch

    async def made(self, channel: int, **fields: list[str]) -> Watch:
        """A watch of `channel`, stored."""
        return await self.service.store.create(
            self.said_in(channel), "state space models", 7 * DAY, platform="discord",
            channel=str(channel), **fields,
        )  # fmt: skip

    async def paused(
        self, channel: int, why: str = "Discord refused the digest", **fields: list[str]
    ) -> Watch:
        """A watch of `channel`, paused (a digest refused there, since allowed again)."""
        watch = await self.made(channel, **fields)
        assert await self.service.store.pause(watch, why)
        return watch

    async def by_id(self, verb: str, channel: int, watch_id: str) -> str:
        """`/watch <verb> <id>` used in `channel`: its answer."""
        fake = FakeDiscord()
        used_in = self.poster.client.get_channel(channel)
        interaction = fake.interaction(used_in, fake.user())
        await self.poster.callbacks[verb].callback(interaction, watch_id=watch_id)
        return interaction.response.send_message.await_args.args[0]

    async def resume(self, channel: int, watch: Watch) -> str:
        """`/watch resume <id>` used in `channel`: its answer."""
        return await self.by_id("resume", channel, watch.id)

    async def listed(self, channel: int) -> str:
        """`/watch list` used in `channel`: its answer."""
        fake = FakeDiscord()
        interaction = fake.interaction(self.poster.client.get_channel(channel), fake.user())
        await self.poster.callbacks["list"].callback(interaction)
        return interaction.response.send_message.await_args.args[0]


@pytest.fixture
async def api() -> AsyncIterator[MockDiscordApi]:
    async with serving_discord_api() as served:
        yield served


@pytest.fixture
async def server(api, memory) -> AsyncIterator[Server]:
    person = api.user("ada")
    guild = api.guild(person, everyone=EVERYONE | SEND_IN_THREADS)
    closed_off = guild.channel("announcements")
    api.deny_history(guild, closed_off)
    thread = api.thread(guild, closed_off)
    api.no_history.add(thread)  # a thread's permissions are its parent's
    private = api.thread(guild, closed_off, private=True)  # stays itself (`home`)
    api.no_history.add(private)
    readable = guild.channel("papers")
    muted = guild.channel("quiet")
    api.deny_history(guild, muted)
    [listed] = [c for c in guild.channels if c["id"] == str(muted)]
    listed["permission_overwrites"][-1]["deny"] = str(READ_MESSAGE_HISTORY | SEND_MESSAGES)
    orphan = api.thread(guild, snowflake())  # its parent is in no listing the cache has
    watches = await poster(api, guild)
    prefix = f"digests-{uuid.uuid4().hex[:8]}"
    service = WatchService(
        memory, ArxivSource("http://127.0.0.1:9/api/query", 0.0), encoding_for("gpt-5-mini"),
        stream_prefix=prefix,
    )  # fmt: skip
    discord_side = DiscordWatches(service, watches.client, watches.channel_of)
    service.attach("discord", discord_side)
    world = Server(api, guild, closed_off, thread, private, readable, muted, orphan, service,
                   discord_side, person)  # fmt: skip

    async def scope_of(interaction: discord.Interaction) -> Scope:
        return world.said_in(interaction.channel_id)

    discord_side.commands(scope_of)
    yield world
    await service.close()
    await TaskStream(memory.redis, task_stream(f"{prefix}-discord")).destroy()
    for watch in await service.store.all(world.tenant):  # the due index is the suite's
        await service.store.remove(world.tenant, watch.id)
    await watches.client.close()


async def test_a_watch_made_by_a_mention_where_the_history_is_unreadable_says_what_to_grant(
    server,
):
    answer, watch = await server.made_by_mention(server.closed_off)
    assert watch.channel == str(server.closed_off)  # made all the same
    assert answer == f"{created_text(watch)} {note(server.closed_off, server.closed_off)}"


async def test_a_mention_in_the_thread_the_bot_opened_names_the_channel_the_watch_posts_to(
    server,
):
    answer, watch = await server.made_by_mention(server.thread)
    assert watch.channel == str(server.closed_off)  # the thread's channel (`home`)
    expected = note(server.closed_off, server.closed_off)
    assert answer == f"{created_text(watch, elsewhere=True)} {expected}"


async def test_a_watch_made_by_a_mention_where_the_history_is_readable_says_nothing_more(server):
    answer, watch = await server.made_by_mention(server.readable)
    assert answer == created_text(watch)


@pytest.mark.parametrize("readable", [False, True], ids=["with-note", "without-note"])
async def test_a_resumed_watch_says_what_to_grant_where_the_history_is_unreadable(server, readable):
    channel = server.readable if readable else server.closed_off
    watch = await server.paused(channel)
    answer = await server.resume(channel, watch)
    resumed = f"Resumed {describe(watch)} (`{watch.id}`): a digest comes within a few minutes."
    assert answer == (resumed if readable else f"{resumed} {note(channel, channel)}")
    stored = await server.service.store.get(server.tenant, watch.id)
    assert stored is not None and not stored.paused  # resumed all the same


async def test_a_resumed_watch_of_a_thread_is_told_to_grant_in_the_threads_parent(server):
    """A watch made in the thread before it moved to its channel posts to the thread; its
    permissions are its parent's, so that is where to grant."""
    watch = await server.paused(server.thread)
    answer = await server.resume(server.thread, watch)
    assert answer.endswith(f"minutes. {note(server.thread, server.closed_off)}")


async def test_a_resumed_watch_of_a_long_description_keeps_its_note_whole_under_2000(server):
    author = " ".join(["Quokka Longname"] * 200)  # 3,199 characters
    watch = await server.paused(server.closed_off, authors=[author])
    answer = await server.resume(server.closed_off, watch)
    assert len(answer) <= LIMIT
    assert answer.startswith("Resumed “state space models” author:Quokka Longname")
    assert f"… (`{watch.id}`): a digest comes within a few minutes." in answer
    assert answer.endswith(f" {note(server.closed_off, server.closed_off)}")


async def test_a_refused_history_read_is_warned_of_once_per_channel(server, caplog):
    """Every digest task of a channel the bot may no longer see (403 Missing Access) finds
    none: the first says so, the next do not; once read again, a new refusal is said."""
    channel = server.readable
    watch = Watch("w1", server.tenant, "state space models", 7 * DAY, "discord", str(channel))
    marker = f"{watch.id}:{int(time.time())}"
    server.api.no_access.add(channel)

    def refusals() -> list[str]:
        return [r.getMessage() for r in caplog.records if FIND_WARNING in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="adapters.discord_watch"):
        for _ in range(3):  # a digest run again and again
            assert await server.poster.find(watch, marker, time.time() - 20) is None
        [refused] = refusals()
        assert str(channel) in refused and "Missing Access" in refused
        server.api.no_access.discard(channel)  # seen again: read, nothing warned
        assert await server.poster.find(watch, marker, time.time() - 20) is None
        assert len(refusals()) == 1
        server.api.no_access.add(channel)  # hidden again: said again, once
        for _ in range(2):
            assert await server.poster.find(watch, marker, time.time() - 20) is None
    assert len(refusals()) == 2


@pytest.mark.parametrize("verb", ["pause", "remove"])
async def test_a_paused_or_removed_watch_of_a_long_description_answers_under_2000(server, verb):
    """Discord refuses a longer answer: the person would see none, though the watch was
    paused or removed (and asking again then says it is not there)."""
    watch = await server.made(server.readable, authors=[LONG_AUTHOR])
    answer = await server.by_id(verb, server.readable, watch.id)
    assert len(answer) <= LIMIT
    assert "author:Quokka Longname" in answer and f"… (`{watch.id}`)" in answer  # the id whole
    if verb == "pause":
        assert answer.endswith(f"`/watch resume {watch.id}` resumes it.")
    stored = await server.service.store.get(server.tenant, watch.id)
    assert stored is None if verb == "remove" else stored.paused  # done all the same


@pytest.mark.parametrize("verb", ["pause", "remove", "resume"])
async def test_a_long_typed_id_that_names_no_watch_answers_under_2000(server, verb):
    answer = await server.by_id(verb, server.readable, "x" * 3000)
    assert len(answer) <= LIMIT
    assert answer.startswith("No watch `xxx") and "…` posts here" in answer


async def test_thirty_watches_of_long_descriptions_are_all_listed_by_id_under_2000(server):
    """Discord users see, and so may remove, pause or resume, every watch of the channel: the
    descriptions are cut, not the watches left out."""
    watches = [await server.made(server.readable, authors=[LONG_AUTHOR]) for _ in range(30)]
    answer = await server.listed(server.readable)
    assert len(answer) <= LIMIT
    lines = answer.split("\n")
    assert sorted(line.split("`")[1] for line in lines) == sorted(w.id for w in watches)
    assert all(line.startswith("• `") and " UTC" in line for line in lines)  # and its state
    assert all("“state" in line and "…" in line for line in lines)  # a description, cut


async def test_a_listed_paused_watch_of_a_long_author_still_says_how_to_resume_it(server):
    """The description is cut inside the line, so its end (the state) stays."""
    watch = await server.paused(server.readable, authors=[LONG_AUTHOR])
    answer = await server.listed(server.readable)
    assert len(answer) <= LIMIT
    assert answer.startswith(f"• `{watch.id}` “state space models” author:Quokka Longname")
    resume = f"… — *paused* (Discord refused the digest): `/watch resume {watch.id}`"
    assert answer.endswith(resume)


async def test_a_list_too_long_even_for_ids_keeps_the_paused_and_counts_watches_not_lines(
    server,
):
    """Past some 40 watches not even their ids and states fit: the paused are kept, and the
    count is of watches, though an author (a quoted mention option) holds newlines."""
    torn = await server.made(server.readable, authors=["\n".join(["Quokka Longname"] * 50)])
    watches = [torn] + [await server.made(server.readable) for _ in range(56)]
    paused = [await server.paused(server.readable) for _ in range(3)]
    answer = await server.listed(server.readable)
    assert len(answer) <= LIMIT
    *lines, more = answer.split("\n")
    shown = [line.split("`")[1] for line in lines if line.startswith("• `")]  # not its newlines
    assert set(shown) <= {w.id for w in watches + paused} and len(set(shown)) == len(shown)
    assert {w.id for w in paused} <= set(shown)
    assert more == MORE_LISTED.format(count=len(watches) + len(paused) - len(shown))


async def test_paused_watches_of_long_reasons_are_listed_each_with_how_to_resume_it(server):
    """A digest Discord refused pauses its watch with Discord's error text, unbounded and
    perhaps of newlines: a list line shows the reason cut to one line, so the paused do not
    crowd the active out of the list, and each keeps its `/watch resume id` whole."""
    refused = f"Discord refused the digest in {server.readable}: 403 Forbidden (error code: 50013)"
    why = refused + ":\n" + "Missing Permissions " * 11  # some 300 characters
    paused = [await server.paused(server.readable, why) for _ in range(12)]
    active = [await server.made(server.readable) for _ in range(10)]
    answer = await server.listed(server.readable)
    assert len(answer) <= LIMIT and "more, not shown" not in answer
    lines = answer.split("\n")
    assert all(line.startswith("• `") for line in lines)  # a line each: the newline collapsed
    assert sorted(line.split("`")[1] for line in lines) == sorted(w.id for w in paused + active)
    for watch in paused:
        [listed] = [line for line in lines if line.startswith(f"• `{watch.id}`")]
        assert f"*paused* ({refused[:20]}" in listed
        assert listed.endswith(f"…): `/watch resume {watch.id}`")


async def test_a_list_with_an_author_of_newlines_counts_its_watches_right(server):
    """A watch's description holding newlines is one watch, however many lines it shows."""
    torn = await server.made(server.readable, authors=["\n".join(["Quokka Longname"] * 200)])
    others = [await server.made(server.readable) for _ in range(3)]
    answer = await server.listed(server.readable)
    assert len(answer) <= LIMIT
    assert answer.count("• `") == 1 + len(others)  # every watch, none said to be "more"
    assert "more, not shown" not in answer
    assert f"• `{torn.id}` “state space models” author:Quokka Longname\nQuokka" in answer


async def test_a_note_discord_fails_to_look_up_leaves_the_resume_said(server):
    """The note's lookup of the thread's parent loses its connection (an aiohttp error, not
    an HTTPException): the watch is resumed, and its answer says so without a note rather
    than "nothing was changed"."""
    watch = await server.paused(server.orphan)
    # `can_post`'s fetch of the parent is answered (404); the note's is cut, and so is the
    # one retry aiohttp makes of a GET whose kept-alive connection dropped
    server.api.cut("unknown", times=2, after=1)
    answer = await server.resume(server.orphan, watch)
    resumed = f"Resumed {describe(watch)} (`{watch.id}`): a digest comes within a few minutes."
    assert answer == resumed
    assert len(server.api.of("unknown")) == 3  # the note did ask, and lost its connection
    stored = await server.service.store.get(server.tenant, watch.id)
    assert stored is not None and not stored.paused


async def test_a_refused_resume_or_mention_carries_no_note(server):
    """The bot may neither send nor read the history in the channel: the refusal says to let
    it post, and nothing on a watch that was not made or resumed."""
    refused = CANNOT_POST_IN.format(channel=server.muted, permission="Send Messages")
    watch = await server.paused(server.muted)
    assert await server.resume(server.muted, watch) == refused
    await server.service.store.remove(server.tenant, watch.id)
    answer = await server.service.message(server.said_in(server.muted), "watch ssm weekly")
    assert answer == refused
    assert await server.service.store.all(server.tenant) == []


async def test_a_mention_in_a_private_thread_names_its_parent_as_where_to_grant(server):
    """A private thread stays the watch's place (`home`), its permissions its parent's."""
    answer, watch = await server.made_by_mention(server.private)
    assert watch.channel == str(server.private)
    assert answer == f"{created_text(watch)} {note(server.private, server.closed_off)}"


class Unanswering(DiscordWatches):
    """Test support: a Discord poster whose note never answers (the local Discord API cannot
    hold a request), as a lookup Discord leaves hanging."""

    given_up = False

    async def note(self, place: WatchPlace) -> str:
        try:
            await asyncio.Event().wait()
        finally:
            self.given_up = True
        return ""


async def test_a_note_that_never_answers_is_given_up_and_the_resume_said(server):
    """The note is bounded (NOTE_SECONDS): the answer comes without it, within Discord's
    window, the watch resumed. (The outer bound only turns a hang into a failure.)"""
    hanging = Unanswering(server.service, server.poster.client, server.poster.channel_of)
    server.service.attach("discord", hanging)
    watch = await server.paused(server.closed_off)
    async with asyncio.timeout(30):
        answer = await server.service.resume_text(
            server.said_in(server.closed_off),
            watch.id,
            WatchPlace("discord", str(server.closed_off)),
        )
    assert hanging.given_up
    assert (
        answer == f"Resumed {describe(watch)} (`{watch.id}`): a digest comes within a few minutes."
    )
    stored = await server.service.store.get(server.tenant, watch.id)
    assert stored is not None and not stored.paused
