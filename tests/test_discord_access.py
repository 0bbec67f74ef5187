"""Who a Discord member is on the memory page, asked of a local server that answers as Discord's
REST API does (tests/support/discord_api.py) with the real discord.py client, pointed there by
DISCORD_API_URL: admins, owners, hidden channels and their threads, private threads anywhere,
DMs, rate limits, a refused token and people the server does not know."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

import discord
import pytest
from aiohttp.test_utils import TestClient, TestServer

from adapters.discord_platform import visibility
from adapters.memory_page.access import DirectoryError, DiscordDirectory
from adapters.memory_page.server import SESSION_COOKIE
from adapters.web import build_web_app
from app.commands.web_cmd import page_wiring
from app.settings import Settings
from memory.scope import PUBLIC, Scope, Visibility
from tests.support.discord_api import (
    ADMINISTRATOR,
    BOT_TOKEN,
    MANAGE_GUILD,
    MANAGE_THREADS,
    Guild,
    MockDiscordApi,
    serving_discord_api,
)


@pytest.fixture
async def api() -> AsyncIterator[MockDiscordApi]:
    async with serving_discord_api() as api:
        yield api


@pytest.fixture
async def directory(api) -> AsyncIterator[DiscordDirectory]:
    directory = DiscordDirectory(BOT_TOKEN)
    yield directory
    await directory.close()


@dataclass
class Lab:
    """A server: #general for all; #research hidden but for the Research role; #secret hidden
    but for Dee (a member's own overwrite); #vault hidden from everyone, the bot included.
    #general holds a public thread and two private ones (Cy in the active one, Dee in the
    archived one)."""

    guild: Guild
    tenant: str
    owner: int
    ada: int  # Research, and in the private threads
    bob: int  # Research
    kim: int  # Research, with Manage Threads
    cy: int  # no role
    dee: int  # #secret by a member overwrite
    mo: int  # Manage Server
    al: int  # Administrator
    stranger: int  # a Discord user who is not in the server
    general: int
    research: int
    secret: int
    vault: int
    active: int  # public thread in #research
    private_active: int  # private thread in #research (Ada)
    archived: int  # archived public thread in #research
    private_archived: int  # archived private thread in #research (Ada)
    in_general: int
    in_secret: int
    private_general: int  # private thread in #general (Cy)
    private_general_archived: int  # archived private thread in #general (Dee)


def lab(api: MockDiscordApi) -> Lab:
    owner = api.user("olive")
    guild = api.guild(owner)
    research_role = guild.role("Research")
    keepers = guild.role("Thread keepers", MANAGE_THREADS)
    mods, admins = guild.role("Mods", MANAGE_GUILD), guild.role("Admins", ADMINISTRATOR)
    ada, bob, kim, cy, dee, mo, al = (api.user(n) for n in ("ada", "bob", "kim", "cy", "dee",
                                                            "mo", "al"))  # fmt: skip
    for user, roles in ((ada, [research_role]), (bob, [research_role]),
                        (kim, [research_role, keepers]), (cy, []), (dee, []), (mo, [mods]),
                        (al, [admins])):  # fmt: skip
        guild.member(user, *roles)
    general = guild.channel("general")
    research = guild.channel("research", hidden=True, roles=(research_role,))
    secret = guild.channel("secret", hidden=True, members=(dee,))
    vault = guild.channel("vault", hidden=True)
    api.no_access.add(vault)
    threads = (
        api.thread(guild, research),
        api.thread(guild, research, private=True, members=(ada,)),
        api.thread(guild, research, archived=True, archived_minutes_ago=5),
        api.thread(guild, research, private=True, archived=True, members=(ada,)),
        api.thread(guild, general),
        api.thread(guild, secret),
        api.thread(guild, general, private=True, members=(cy,)),
        api.thread(guild, general, private=True, archived=True, members=(dee,)),
    )
    stranger = api.user("stranger")
    people = (owner, ada, bob, kim, cy, dee, mo, al, stranger)
    return Lab(guild, str(guild.id), *people, general, research, secret, vault, *threads)


def stored(tenant: str, place: int) -> str:
    """The audience the Discord adapter stores for a turn in a hidden channel or its thread, or
    in a private thread (its Scope: the place's id is the channel part)."""
    return Scope(tenant, f"discord:{tenant}:{place}", str(place), Visibility.PRIVATE).audience


async def test_members_see_the_hidden_channels_and_threads_they_can_open(api, directory):
    world = lab(api)
    tenant = world.tenant
    research = {stored(tenant, p) for p in (world.research, world.active, world.archived)}
    private = {stored(tenant, p) for p in (world.private_active, world.private_archived)}
    in_general = {
        stored(tenant, p) for p in (world.private_general, world.private_general_archived)
    }

    ada = await directory.viewer(tenant, str(world.ada))
    assert ada.audiences == {PUBLIC, *research, *private}
    assert not ada.admin and ada.platform == "discord" and ada.name == "ada"
    bob = await directory.viewer(tenant, str(world.bob))
    assert bob.audiences == {PUBLIC, *research}  # not in the private threads
    assert not bob.can_see(stored(tenant, world.private_active))
    kim = await directory.viewer(tenant, str(world.kim))
    assert kim.audiences == {PUBLIC, *research, *private, *in_general}  # Manage Threads: all
    cy = await directory.viewer(tenant, str(world.cy))
    assert cy.audiences == {PUBLIC, stored(tenant, world.private_general)}
    assert not cy.can_see(stored(tenant, world.research))
    dee = await directory.viewer(tenant, str(world.dee))
    assert dee.audiences == {PUBLIC, stored(tenant, world.secret), stored(tenant, world.in_secret),
                             stored(tenant, world.private_general_archived)}  # fmt: skip

    # the audiences are the ones the adapter stores: it calls exactly these channels private
    client = directory.client
    channels = {c.id: c for c in await (await client.fetch_guild(world.guild.id)).fetch_channels()}
    assert visibility(channels[world.general]) is Visibility.PUBLIC
    for hidden in (world.research, world.secret, world.vault):
        assert visibility(channels[hidden]) is Visibility.PRIVATE
    # archived threads: the public ones of the hidden channels only, the bot's private ones of
    # every channel (#vault refuses the bot, and only admins view it: none here)
    asked = {c.path.split("/")[4] for c in api.of("archived_public")}
    assert asked == {str(world.research), str(world.secret)}
    asked = {c.path.split("/")[4] for c in api.of("archived_joined")}
    assert asked == {str(world.general), str(world.research), str(world.secret)}
    assert not api.of("archived_private")  # needs Manage Threads, which the bot is not given
    members_asked = {c.path.rsplit("/", 1)[1] for c in api.of("thread_member")}
    assert str(world.kim) not in members_asked  # Manage Threads: no need to ask


async def test_a_private_thread_of_a_public_channel_is_its_members_and_keepers(api, directory):
    """Issue #12: a private thread is private to itself, whatever its parent."""
    world = lab(api)
    tenant = world.tenant
    cy = await directory.viewer(tenant, str(world.cy))  # in the thread
    assert cy.can_see(stored(tenant, world.private_general))
    bob = await directory.viewer(tenant, str(world.bob))  # views #general, not in the thread
    assert not bob.can_see(stored(tenant, world.private_general))
    assert not bob.can_see(stored(tenant, world.private_general_archived))
    kim = await directory.viewer(tenant, str(world.kim))  # Manage Threads
    assert kim.can_see(stored(tenant, world.private_general))
    assert kim.can_see(stored(tenant, world.private_general_archived))
    assert stored(tenant, world.in_general) not in bob.audiences | kim.audiences  # it is public

    # the adapter stores exactly these audiences: the thread private, its public sibling public
    guild = await directory.client.fetch_guild(world.guild.id)
    active = {t.id: t for t in await guild.active_threads()}
    private, public = active[world.private_general], active[world.in_general]
    assert visibility(private) is Visibility.PRIVATE
    # fetched over REST, the public thread's parent is not cached: nothing says who sees it, so
    # it counts as private (the adapter fetches the parent first: tests/test_discord.py)
    assert public.parent is None and visibility(public) is Visibility.PRIVATE
    turn = Scope(tenant, f"discord:{tenant}:{private.id}", str(private.id), visibility(private))
    assert turn.audience == stored(tenant, world.private_general)

    # bounded: one guild call for the active threads, one archive call per channel in the open
    api.calls.clear()
    await directory.viewer(tenant, str(world.bob))
    assert len(api.of("active_threads")) == 1
    assert {c.path.split("/")[4] for c in api.of("archived_public")} == {str(world.research)}
    joined = [c.path.split("/")[4] for c in api.of("archived_joined")]
    assert sorted(joined) == sorted([str(world.general), str(world.research)])
    # membership asked only for the private threads of channels Bob views
    members_asked = {c.path.split("/")[4] for c in api.of("thread_member")}
    assert members_asked == {str(t) for t in (world.private_active, world.private_archived,
                                              world.private_general,
                                              world.private_general_archived)}  # fmt: skip


async def test_manage_server_administrator_and_the_owner_manage_the_server(api, directory):
    world = lab(api)
    for who in (world.mo, world.al, world.owner):
        viewer = await directory.viewer(world.tenant, str(who))
        assert viewer.admin, who
    # an Administrator views #vault too, whose archives refuse the bot (403 Missing Access):
    # skipped, as the bot keeps no memory there
    assert any(str(world.vault) in c.path for c in api.of("archived_public"))
    assert not (await directory.viewer(world.tenant, str(world.cy))).admin


async def test_a_dm_tenant_is_its_persons_without_asking_discord(api, directory):
    world = lab(api)
    own = await directory.viewer(f"dm-{world.ada}", str(world.ada))
    assert own.owner and not own.admin  # theirs to manage, but no admin: no import
    assert own.tenant == f"dm-{world.ada}" and own.user == str(world.ada)
    with pytest.raises(DirectoryError) as other:
        await directory.viewer(f"dm-{world.ada}", str(world.bob))
    assert other.value.status == 403
    assert api.calls == []


async def test_short_rate_limits_are_waited_out_and_long_ones_say_when_to_come_back(api, directory):
    world = lab(api)
    api.rate_limit("member", retry_after=0.05)
    api.rate_limit("guild", retry_after=0.05, is_global=True)
    viewer = await directory.viewer(world.tenant, str(world.bob))
    assert stored(world.tenant, world.research) in viewer.audiences
    assert len(api.of("member")) == 2 and len(api.of("guild")) == 2  # 429, then the answer

    api.rate_limit("channels", retry_after=64.57)
    with pytest.raises(DirectoryError) as limited:
        await directory.viewer(world.tenant, str(world.ada))
    assert limited.value.status == 503 and limited.value.retry_after == 65
    assert "try again in 65 seconds" in limited.value.message
    assert len(api.of("channels")) == 2  # not retried: discord.py gave up at once
    assert (await directory.viewer(world.tenant, str(world.ada))).audiences >= {
        stored(world.tenant, world.private_active)
    }


async def test_a_refused_token_is_named_for_whoever_runs_arxivscout(api):
    world = lab(api)
    refused = DiscordDirectory("not-the-token")
    with pytest.raises(DirectoryError) as bad:
        await refused.viewer(world.tenant, str(world.ada))
    assert bad.value.status == 502 and "DISCORD_TOKEN" in bad.value.message
    assert refused.client is None  # not kept: the next look tries to log in again
    assert [c.route for c in api.calls] == ["me"]

    directory = DiscordDirectory(BOT_TOKEN)
    try:
        await directory.viewer(world.tenant, str(world.ada))
        api.token = "rotated"  # the token was reset after this process logged in
        with pytest.raises(DirectoryError) as revoked:
            await directory.viewer(world.tenant, str(world.ada))
        assert revoked.value.status == 502 and "DISCORD_TOKEN" in revoked.value.message
    finally:
        await directory.close()


async def test_people_and_servers_discord_does_not_know_are_403(api, directory):
    world = lab(api)
    for tenant, user in ((world.tenant, world.stranger),  # a user, not in this server
                         (world.tenant, 4242424242),  # no such user (Unknown User)
                         ("4343434343", world.ada)):  # a server without the bot  # fmt: skip
        with pytest.raises(DirectoryError) as unknown:
            await directory.viewer(tenant, str(user))
        assert unknown.value.status == 403 and "does not know you" in unknown.value.message
    assert api.of("member")[0].path.endswith(f"/members/{world.stranger}")


async def sign_in(client: TestClient, url: str):
    """Open the link, then press its page's button (the POST that starts the session)."""
    parts = urlsplit(url)
    page = await client.get(f"{parts.path}?{parts.query}", allow_redirects=False)
    assert page.status == 200 and "Open my memory" in await page.text()
    token = parse_qs(parts.query)["token"][0]
    response = await client.post(parts.path, data={"token": token}, allow_redirects=False)
    return response, await response.text()


async def test_the_memory_page_signs_discord_members_in_through_the_settings(memory, api):
    """DISCORD_API_URL and DISCORD_TOKEN, wired as `arxivscout web` wires them."""
    world = lab(api)
    discord.http.Route.BASE = "http://127.0.0.1:9/api/v10"  # the setting, not the fixture
    settings = Settings(discord_token=BOT_TOKEN, discord_api_url=api.base_url)
    wiring = await page_wiring(settings, memory, announce=False)
    assert api.base_url == discord.http.Route.BASE
    app = build_web_app(memory, page=wiring.page(memory))
    links = wiring.links
    try:
        async with TestClient(TestServer(app)) as client:
            response, _ = await sign_in(
                client, links.login(world.tenant, str(world.ada), "discord")
            )
            assert response.status == 303 and SESSION_COOKIE in response.cookies
            page = await client.get("/memory")
            assert page.status == 200 and "private channels you are in" in await page.text()

            login = links.login(world.tenant, str(world.stranger), "discord")
            response, text = await sign_in(client, login)
            assert response.status == 403 and "does not know you in this server" in text

            api.rate_limit("member", retry_after=90)
            response, text = await sign_in(client, links.login(world.tenant, str(world.bob),
                                                               "discord"))  # fmt: skip
            assert response.status == 503 and response.headers["Retry-After"] == "90"
            assert "try again in 90 seconds" in text and "Traceback" not in text

            api.token = "rotated"
            response, text = await sign_in(client, links.login(world.tenant, str(world.cy),
                                                               "discord"))  # fmt: skip
            assert response.status == 502 and "DISCORD_TOKEN" in text
    finally:
        await wiring.discord.close()
        await wiring.directories.cache.forget("discord", world.tenant, str(world.ada))
