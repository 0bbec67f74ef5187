"""Who a Discord member is on the memory page when a channel's archives are long: Discord lists
archived threads 100 an answer, newest first, and the memory page follows its pages (bounded),
so a member still sees the memory of an older archived thread of a hidden channel, or of an
older archived private thread they are in; never of one they are not in. Each private thread
found costs a membership call, asked a few at a time. Past their deadlines, no further page is
asked and no further membership: what was not found or asked stays hidden. Asked of the local
Discord API (tests/support/discord_api.py) with the real discord.py client."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import discord.http
import pytest
from aiohttp import web

from adapters.memory_page.access import (
    MEMBERSHIP_CHECKS,
    Directories,
    DirectoryError,
    DiscordDirectory,
    use_discord_api,
)
from memory.scope import Scope, Visibility
from tests.support.discord_api import BOT_TOKEN, MockDiscordApi, serving_discord_api
from tests.support.memory_seed import say
from tests.test_discord_access import stored
from tests.test_memory_page_powers import sign_in, site

NEWER = 120  # archived threads archived after the one a test looks for: more than one answer


@pytest.fixture
async def api() -> AsyncIterator[MockDiscordApi]:
    async with serving_discord_api() as api:
        yield api


@pytest.fixture
async def directory(api) -> AsyncIterator[DiscordDirectory]:
    directory = DiscordDirectory(BOT_TOKEN)
    yield directory
    await directory.close()


async def test_older_archived_threads_are_still_the_members(api, directory, memory):
    owner, ada, bob, cy = (api.user(n) for n in ("olive", "ada", "bob", "cy"))
    guild = api.guild(owner)
    research_role = guild.role("Research")
    guild.member(ada, research_role)
    guild.member(bob, research_role)
    guild.member(cy)
    general = guild.channel("general")
    research = guild.channel("research", hidden=True, roles=(research_role,))
    # in #research (hidden), a public thread archived long ago, then many archived since
    old_research = api.thread(guild, research, archived=True, archived_minutes_ago=10_000)
    for minutes in range(NEWER):
        api.thread(guild, research, archived=True, archived_minutes_ago=minutes + 1)
    # in #general, Cy's private thread made first (Discord lists the bot's by id, newest first),
    # then many private threads of the bot's that Cy is not in
    old_private = api.thread(guild, general, private=True, archived=True, members=(cy,))
    for _ in range(NEWER):
        api.thread(guild, general, private=True, archived=True)
    tenant = str(guild.id)

    ada_sees = await directory.viewer(tenant, str(ada))
    assert ada_sees.can_see(stored(tenant, old_research))
    assert not ada_sees.can_see(stored(tenant, old_private))  # not in it
    research_asks = [c for c in api.of("archived_public") if str(research) in c.path]
    assert len(research_asks) == 2  # two answers of #research's archives, not one
    cy_sees = await directory.viewer(tenant, str(cy))
    assert cy_sees.can_see(stored(tenant, old_private))
    assert not cy_sees.can_see(stored(tenant, old_research))  # #research is hidden from Cy
    bob_sees = await directory.viewer(tenant, str(bob))
    assert bob_sees.can_see(stored(tenant, old_research))
    assert not bob_sees.can_see(stored(tenant, old_private))
    # Cy's is the one of the 121 private threads Cy is in
    assert sum(a.startswith("private:") for a in cy_sees.audiences) == 1

    # on the page: Cy signs in and finds what was said in the thread, Bob does not
    thread = f"discord:{tenant}:{old_private}"
    place = Scope(tenant, thread, str(old_private), Visibility.PRIVATE, str(cy), "cy")
    await say(memory, place, "user", "Cy's archived plan: the heron survey.", 1e9)
    try:
        async with site(memory, Directories(discord=directory)) as (client, links):
            await sign_in(client, links, tenant, str(cy), "discord")
            assert "the heron survey" in await (await client.get("/memory")).text()
            await sign_in(client, links, tenant, str(bob), "discord")
            assert "heron" not in await (await client.get("/memory")).text()
    finally:
        await memory.drop_tenant(tenant)


async def test_archives_past_the_deadline_are_not_paged_and_their_memory_stays_hidden(api):
    """With no time left (a deadline of 0), each channel's first answer of archives is all
    that is asked: an older thread is not found, so its memory is hidden, not shown."""
    owner, ada, cy = (api.user(n) for n in ("olive", "ada", "cy"))
    guild = api.guild(owner)
    research_role = guild.role("Research")
    guild.member(ada, research_role)
    guild.member(cy)
    general = guild.channel("general")
    research = guild.channel("research", hidden=True, roles=(research_role,))
    old_research = api.thread(guild, research, archived=True, archived_minutes_ago=10_000)
    for minutes in range(NEWER):
        api.thread(guild, research, archived=True, archived_minutes_ago=minutes + 1)
    old_private = api.thread(guild, general, private=True, archived=True, members=(cy,))
    for _ in range(NEWER):
        api.thread(guild, general, private=True, archived=True)
    tenant = str(guild.id)
    hurried = DiscordDirectory(BOT_TOKEN, archived_seconds=0)
    try:
        ada_sees = await hurried.viewer(tenant, str(ada))
        cy_sees = await hurried.viewer(tenant, str(cy))
    finally:
        await hurried.close()
    assert stored(tenant, research) in ada_sees.audiences  # the channel itself: no paging
    assert not ada_sees.can_see(stored(tenant, old_research))
    assert len([c for c in api.of("archived_public") if str(research) in c.path]) == 1
    assert not cy_sees.can_see(stored(tenant, old_private))
    assert not any(a.startswith("private:") for a in cy_sees.audiences)  # none of the first 100
    assert len([c for c in api.of("archived_joined") if str(general) in c.path]) == 2  # 1 each


# How long a held answer waits for others, asked one after another. Asked together, they are
# let go as soon as all are awaited, so it costs a correct run nothing: long, that a loaded
# machine's stalled loop still gets every one of them in before it.
HOLD_SECONDS = 5.0


@dataclass
class HeldMemberships(MockDiscordApi):
    """Holds each thread-membership answer until `MEMBERSHIP_CHECKS` of them are awaited at
    once (asked one after another, the first is let go after `HOLD_SECONDS`, then all are),
    recording the most awaited at once."""

    awaited: int = 0
    most_awaited: int = 0
    released: asyncio.Event = field(default_factory=asyncio.Event)

    async def _thread_member(self, request: web.Request) -> web.Response:
        self.awaited += 1
        self.most_awaited = max(self.most_awaited, self.awaited)
        try:
            if self.awaited >= MEMBERSHIP_CHECKS:
                self.released.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.released.wait(), HOLD_SECONDS)
            self.released.set()
            return await super()._thread_member(request)
        finally:
            self.awaited -= 1


@contextlib.asynccontextmanager
async def serving(api: MockDiscordApi) -> AsyncIterator[MockDiscordApi]:
    """`serving_discord_api`, for a mock of a test's own."""
    await api.start()
    previous = discord.http.Route.BASE
    use_discord_api(api.base_url)
    try:
        yield api
    finally:
        discord.http.Route.BASE = previous
        await api.close()


async def test_thread_memberships_are_asked_a_few_at_a_time():
    """One call per private thread, asked `MEMBERSHIP_CHECKS` at once, not one after another:
    a server with many archived private threads still answers within ASK_TIMEOUT_SECONDS."""
    async with serving(HeldMemberships()) as api:
        owner, cy = api.user("olive"), api.user("cy")
        guild = api.guild(owner)
        guild.member(cy)
        general = guild.channel("general")
        threads = [api.thread(guild, general, private=True, archived=True,
                              members=(cy,) if n % 4 == 0 else ())
                   for n in range(3 * MEMBERSHIP_CHECKS)]  # fmt: skip
        tenant = str(guild.id)
        directory = DiscordDirectory(BOT_TOKEN)
        try:
            cy_sees = await directory.viewer(tenant, str(cy))
            assert api.most_awaited == MEMBERSHIP_CHECKS
            assert len(api.of("thread_member")) == len(threads)  # every one asked, once
            theirs = {stored(tenant, t) for n, t in enumerate(threads) if n % 4 == 0}
            assert {a for a in cy_sees.audiences if a.startswith("private:")} == theirs

            # Discord's error while asking is the page's, as before (not a group of them)
            api.rate_limit("thread_member", retry_after=64.57)
            with pytest.raises(DirectoryError) as limited:
                await directory.viewer(tenant, str(cy))
            assert limited.value.retry_after == 65
        finally:
            await directory.close()


async def test_memberships_not_asked_in_time_hide_their_threads(api):
    """With no time left to ask (a deadline of 0), a private thread is not the member's: its
    memory is hidden, never shown; what needs no asking is still theirs."""
    owner, cy = api.user("olive"), api.user("cy")
    guild = api.guild(owner)
    research_role = guild.role("Research")
    guild.member(cy, research_role)
    general = guild.channel("general")
    research = guild.channel("research", hidden=True, roles=(research_role,))
    in_research = api.thread(guild, research, archived=True)  # public: no asking
    cys = api.thread(guild, general, private=True, members=(cy,))
    cys_archived = api.thread(guild, general, private=True, archived=True, members=(cy,))
    tenant = str(guild.id)
    hurried = DiscordDirectory(BOT_TOKEN, membership_seconds=0)
    try:
        cy_sees = await hurried.viewer(tenant, str(cy))
    finally:
        await hurried.close()
    assert cy_sees.can_see(stored(tenant, in_research))
    assert not cy_sees.can_see(stored(tenant, cys))
    assert not cy_sees.can_see(stored(tenant, cys_archived))
    assert api.of("thread_member") == []
