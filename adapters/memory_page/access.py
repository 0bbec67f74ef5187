"""Who is looking at the memory page: a signed link's person turned into a `Viewer`.

The platform says who may see what, by the same rules the adapters use when they store a
memory's audience (`memory.scope.Scope.audience`):

- Slack: admins, owners and the primary owner of the workspace (users.info) manage the whole
  tenant, never a guest or someone of another organisation (Slack may flag them an admin of
  their own). Everyone sees public-channel memory, the private channels and group DMs they share
  with the bot (users.conversations) and their own DM with the bot (conversations.open), and
  in the public channels they are in what guests and other organisations' people said there
  (stored as the channel's private memory). Guests and other organisations' people see their
  own places only (`adapters.slack_org.outsider`, the bot's own rule: a sister workspace's
  member of the same Enterprise Grid org is not of another organisation).
- Discord: members with Manage Server or Administrator manage the whole server. Everyone sees
  what was said in channels @everyone can view, in the channels hidden from @everyone that
  they can view and those channels' threads, and in the private threads they are in (or may
  manage: Manage Threads) of any channel they can view, hidden or not (a thread is its own
  place: its audience names the thread). A DM's memory is its own tenant (`dm-<user>`), its
  person's alone: they own it (see, fix, erase and export all of it) but are not its admin, so
  they may not import into it (ARXIVSCOUT_ADMINS can make them one). DISCORD_API_URL points
  discord.py elsewhere.
- The terminal (`arxivscout web`'s link): its person is an admin of their own tenant.
- ARXIVSCOUT_ADMINS names more admins: user ids, or `tenant:user` for one tenant only.

What the platform said is cached in Redis for a few minutes (`memory.web_sessions.ViewerCache`).
Its failures (rate limits, a refused token, a person unknown there) are `DirectoryError`s with
a message for the page.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterable
from dataclasses import asdict, replace
from typing import Any, Protocol

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.memory_page.viewer import Viewer
from adapters.slack_org import flagged_admin, outsider, workspace_organisation
from memory.scope import PUBLIC, Scope, TenantKind, Visibility, tenant_kind
from memory.web_sessions import ViewerCache

log = logging.getLogger(__name__)

SLACK_PAGE = 200  # users.conversations page size (Slack allows up to 1,000; suggests 200)
ARCHIVED_PAGE = 100  # archived threads Discord gives in one answer (its most)
ARCHIVED_THREADS = 1_000  # per Discord channel and kind, at most: ten answers, newest first
ARCHIVED_SECONDS = 8.0  # after this, no further page of archives is asked (the first always is)
MEMBERSHIP_SECONDS = 15.0  # after this (from the ask's start), no thread membership is asked
MEMBERSHIP_CHECKS = 5  # private threads' memberships asked at once
ASK_TIMEOUT_SECONDS = 20.0
RATE_LIMIT_WAIT = 30.0  # Discord's rate limits waited out, in seconds (discord.py's least)
PRIVATE_JOINED = {"private": True, "joined": True}
SLACK_PLACES = "public_channel,private_channel,mpim,im"  # users.conversations: all of them
TOKEN_ERRORS = {"invalid_auth", "not_authed", "account_inactive", "token_revoked", "token_expired"}


class DirectoryError(Exception):
    """The platform could not say who someone is: `message` is for the page, `status` its HTTP
    status, `retry_after` (seconds) when trying again later will help."""

    def __init__(self, message: str, status: int = 503, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retry_after = retry_after


class Directory(Protocol):
    async def viewer(self, tenant: str, user: str, platform: str) -> Viewer: ...


# the version of a record's shape and meaning (`viewer_record`): 2, a Discord DM's owner is no
# admin (unless ARXIVSCOUT_ADMINS names them); a record with none was stored before, when they were
VIEWER_RECORD_VERSION = 2


def viewer_record(viewer: Viewer) -> dict[str, Any]:
    return {
        **asdict(viewer), "audiences": sorted(viewer.audiences),
        "version": VIEWER_RECORD_VERSION,
    }  # fmt: skip


def viewer_of(record: dict[str, Any]) -> Viewer:
    """The viewer a cached or session record names. A Discord DM tenant's owner is derived
    again from the tenant and person; its `admin` is read only from a record of today's version
    (then only ARXIVSCOUT_ADMINS made it): an older record's says every DM owner was one."""
    viewer = Viewer(
        tenant=record["tenant"], user=record["user"], platform=record["platform"],
        admin=bool(record.get("admin")), audiences=frozenset(record.get("audiences", [PUBLIC])),
        name=record.get("name") or "", owner=bool(record.get("owner")),
    )  # fmt: skip
    if viewer.platform == "discord" and tenant_kind(viewer.tenant) is TenantKind.DISCORD_DM:
        admin = viewer.admin and record.get("version", 0) >= VIEWER_RECORD_VERSION
        return replace(viewer, admin=admin, owner=viewer.tenant == f"dm-{viewer.user}")
    return viewer


class Admins:
    """ARXIVSCOUT_ADMINS: comma-separated user ids (an admin wherever that id signs in) or
    `tenant:user` (an admin of that tenant only)."""

    def __init__(self, setting: str | None = None) -> None:
        entries = [e.strip() for e in (setting or "").split(",") if e.strip()]
        self.anywhere = {e for e in entries if ":" not in e}
        self.in_tenant = {tuple(e.split(":", 1)) for e in entries if ":" in e}

    def named(self, tenant: str, user: str) -> bool:
        return user in self.anywhere or (tenant, user) in self.in_tenant


def _place(tenant: str, channel: str, visibility: Visibility) -> str:
    return Scope(tenant, channel=channel, visibility=visibility).audience


class SlackDirectory:
    """Asks Slack (users.info, users.conversations, conversations.open) with the bot's token:
    private channels are listed only where the bot is a member too, as its memory is."""

    def __init__(self, client: AsyncWebClient) -> None:
        self.client = client

    async def viewer(self, tenant: str, user: str, platform: str = "slack") -> Viewer:
        try:
            async with asyncio.timeout(ASK_TIMEOUT_SECONDS):
                found = (await self.client.users_info(user=user)).get("user") or {}
                places = await self._places(tenant, user)
                # as the bot walls them: guests, and people of another workspace who are not of
                # the workspace's own Enterprise Grid org (auth.test, asked only for them)
                walled = await outsider(found, lambda: workspace_organisation(self.client, tenant))
        except SlackApiError as exc:
            raise self._error(exc) from None
        except (aiohttp.ClientError, TimeoutError, OSError):
            raise DirectoryError("Slack could not be reached: try again in a minute.") from None
        # the bot's `/watch` rule (adapters/slack_org.py `workspace_admin`): never a walled person
        # (Slack may flag someone of another organisation an admin of their own), nor deactivated
        admin = not walled and flagged_admin(found)
        if found.get("deleted"):
            raise DirectoryError("This Slack account is deactivated.", status=403)
        profile = found.get("profile") or {}
        name = profile.get("display_name") or profile.get("real_name") or found.get("name") or user
        # Guests and people of another organisation (Slack Connect) see only the channels they
        # were let into; public memory is the whole workspace's, so they get their own places
        public = set() if walled else {PUBLIC}
        return Viewer(tenant, user, "slack", admin, frozenset({*public, *places}), name)

    async def _places(self, tenant: str, user: str) -> set[str]:
        places: set[str] = set()
        cursor = None
        while True:
            page = await self.client.users_conversations(
                user=user, types=SLACK_PLACES, limit=SLACK_PAGE, cursor=cursor
            )
            for channel in page.get("channels") or []:
                if channel.get("is_im") or channel["id"].startswith("D"):
                    if channel.get("user", user) == user:  # an IM with someone else: not theirs
                        places.add(_place(tenant, channel["id"], Visibility.DM))
                else:  # a private channel or a group DM (the Slack adapter's rule), or a
                    # public channel: what walled people said there is stored as its private
                    # memory (memory/scope.py), and whoever is in the channel can read it
                    places.add(_place(tenant, channel["id"], Visibility.PRIVATE))
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                break
        opened = await self.client.conversations_open(users=user)
        places.add(_place(tenant, opened["channel"]["id"], Visibility.DM))
        return places

    @staticmethod
    def _error(exc: SlackApiError) -> DirectoryError:
        response = exc.response
        error = response.get("error") or "unknown_error"
        if response.status_code == 429 or error == "ratelimited":
            wait = int(response.headers.get("Retry-After") or response.headers.get("retry-after")
                       or 30)  # fmt: skip
            return DirectoryError(
                f"Slack asks ArxivScout to slow down (rate limited): try again in {wait} "
                "seconds.", retry_after=wait,
            )  # fmt: skip
        if error in TOKEN_ERRORS:
            return DirectoryError(
                f"Slack refused ArxivScout's token ({error}): whoever runs ArxivScout should "
                "check SLACK_BOT_TOKEN.", status=502,
            )  # fmt: skip
        if error == "missing_scope":
            needed = f" ({response.get('needed')})" if response.get("needed") else ""
            return DirectoryError(
                f"ArxivScout's Slack app lacks a permission (scope){needed}: whoever runs it "
                "should reinstall it with the scopes of manifest.yml.", status=502,
            )  # fmt: skip
        if error in ("user_not_found", "users_not_found", "user_disabled"):
            return DirectoryError("Slack does not know you in this workspace.", status=403)
        return DirectoryError(f"Slack answered an error ({error}): try again later.", status=502)


def hidden_channels(channels: Iterable[Any], member: Any) -> set[int]:
    """The channels @everyone cannot view that `member` can (discord.py objects)."""
    from adapters.discord_platform import visibility  # discord.py loads where Discord is asked

    return {
        channel.id
        for channel in channels
        if visibility(channel) is Visibility.PRIVATE
        and channel.permissions_for(member).view_channel
    }


def private_threads(channels: Iterable[Any], member: Any, threads: Iterable[Any]) -> list[Any]:
    """Those of `threads` whose memory is their own (a private thread, or any thread of a channel
    hidden from @everyone: the adapter's `visibility`) in a channel `member` can view. Their
    parents are among `channels`, not necessarily in a cache: looked up here by id."""
    import discord

    channels = list(channels)
    viewed = {c.id for c in channels if c.permissions_for(member).view_channel}
    hidden = hidden_channels(channels, member)
    return [
        t for t in threads
        if t.parent_id in viewed
        and (t.parent_id in hidden or t.type is discord.ChannelType.private_thread)
    ]  # fmt: skip


def discord_viewer(
    tenant: str, member: Any, channels: Iterable[Any], threads: Iterable[Any] = ()
) -> Viewer:
    """The viewer a server's member is, from discord.py objects (fetched, or the gateway's):
    `channels` the server's channels, `threads` those of its threads the member may open."""
    permissions = member.guild_permissions
    admin = bool(permissions.administrator or permissions.manage_guild)
    channels = list(channels)
    hidden = hidden_channels(channels, member)
    own = private_threads(channels, member, threads)
    places = {str(c) for c in hidden} | {str(t.id) for t in own}
    audiences = {PUBLIC, *(_place(tenant, p, Visibility.PRIVATE) for p in places)}
    name = getattr(member, "display_name", "") or str(member.id)
    return Viewer(tenant, str(member.id), "discord", admin, frozenset(audiences), name)


class DiscordDirectory:
    """Asks Discord's REST API (no gateway connection) with the bot's token, or through the
    bot's own logged-in client: the member, the server's channels and their threads.

    Discord's short rate limits discord.py waits out itself; a wait longer than
    `RATE_LIMIT_WAIT` is a page saying when to try again (`Retry-After`)."""

    def __init__(
        self, token: str | None = None, client: Any = None, *,
        archived_seconds: float = ARCHIVED_SECONDS, membership_seconds: float = MEMBERSHIP_SECONDS,
    ) -> None:  # fmt: skip
        self.token = token
        self.client = client  # a logged-in discord.Client, or made on first use from `token`
        # how long from an ask's start archives are paged, and memberships asked: both end
        # before ASK_TIMEOUT_SECONDS, so a huge server gives a page that shows less, not none
        self.archived_seconds = archived_seconds
        self.membership_seconds = membership_seconds
        self._lock = asyncio.Lock()
        self._owned = client is None

    async def viewer(self, tenant: str, user: str, platform: str = "discord") -> Viewer:
        kind = tenant_kind(tenant)
        if kind is TenantKind.DISCORD_DM:  # a person's DMs are a tenant of their own
            if tenant != f"dm-{user}":
                raise DirectoryError("This link is for someone else's direct messages.", 403)
            return Viewer(tenant, user, "discord", name=user, owner=True)
        if kind is not TenantKind.DISCORD_SERVER:
            raise DirectoryError("This link is for no Discord server or direct messages.", 403)
        import discord

        try:
            async with asyncio.timeout(ASK_TIMEOUT_SECONDS):
                return await self._ask(tenant, user)
        except discord.LoginFailure:
            raise _token_refused() from None
        except discord.RateLimited as exc:
            wait = math.ceil(exc.retry_after)
            raise DirectoryError(
                f"Discord asks ArxivScout to slow down (rate limited): try again in {wait} "
                "seconds.", retry_after=wait,
            ) from None  # fmt: skip
        except discord.NotFound:
            raise DirectoryError("Discord does not know you in this server (or ArxivScout is no "
                                 "longer in it).", status=403) from None  # fmt: skip
        except discord.Forbidden:
            raise DirectoryError("ArxivScout may not see this server's members or channels: "
                                 "check the bot's permissions.", status=502) from None  # fmt: skip
        except discord.HTTPException as exc:
            if exc.status == 401:  # a token revoked since this process logged in
                raise _token_refused() from None
            raise DirectoryError("Discord could not be reached: try again in a minute.") from None
        except TimeoutError:
            raise DirectoryError("Discord did not answer in time (it may be rate limiting "
                                 "ArxivScout): try again in a minute.") from None  # fmt: skip
        except (aiohttp.ClientError, OSError):
            raise DirectoryError("Discord could not be reached: try again in a minute.") from None

    async def _login(self) -> Any:
        async with self._lock:
            if self.client is None:
                if not self.token:
                    raise _not_set("discord")
                import discord

                client = discord.Client(
                    intents=discord.Intents.none(), max_ratelimit_timeout=RATE_LIMIT_WAIT
                )
                try:
                    await client.login(self.token)  # REST only: no gateway connection
                except BaseException:
                    await client.close()  # its HTTP session, opened by login
                    raise
                self.client = client
        return self.client

    async def _ask(self, tenant: str, user: str) -> Viewer:
        start = asyncio.get_running_loop().time()
        client = await self._login()
        guild = await client.fetch_guild(int(tenant), with_counts=False)
        member = await guild.fetch_member(int(user))
        channels = await guild.fetch_channels()
        viewed = {c.id: c for c in channels if c.permissions_for(member).view_channel}
        hidden = hidden_channels(channels, member)
        threads = {t.id: t for t in await guild.active_threads()}  # the server's, in one call
        for channel in viewed.values():
            archived = await _archived(channel, channel.id in hidden, start + self.archived_seconds)
            threads.update((t.id, t) for t in archived)
        own = private_threads(channels, member, threads.values())
        opened = await _opened(own, viewed, member, start + self.membership_seconds)
        return discord_viewer(tenant, member, channels, opened)

    async def close(self) -> None:
        if self._owned and self.client is not None:
            await self.client.close()


TOKEN_SETTINGS = {"slack": "SLACK_BOT_TOKEN", "discord": "DISCORD_TOKEN"}


def _not_set(platform: str) -> DirectoryError:
    """No token to ask `platform` with, in the process serving the page: whoever runs ArxivScout
    must set it (a 502, not a 503: trying again will not help)."""
    name = {"slack": "Slack", "discord": "Discord"}.get(platform, platform)
    setting = TOKEN_SETTINGS.get(platform)
    why = (f": {setting} is not set where the memory page runs (whoever runs ArxivScout should "
           "set it)") if setting else ""  # fmt: skip
    return DirectoryError(f"This server cannot check who you are on {name}{why}.", status=502)


def _token_refused() -> DirectoryError:
    return DirectoryError("Discord refused ArxivScout's token: whoever runs ArxivScout should "
                          "check DISCORD_TOKEN.", status=502)  # fmt: skip


async def _archived(channel: Any, hidden: bool, deadline: float) -> list[Any]:
    """A viewed channel's archived threads whose memory is their own: the private ones the bot
    is in (it answers in a private thread only once added, so its memory is there) and, in a
    channel hidden from @everyone, the public ones. One call per channel in the open (none for
    forums and announcement channels, which hold no private threads), two if hidden; more for a
    channel with over `ARCHIVED_PAGE` of a kind (`_all_pages`): a thread left out is one whose
    memory its people cannot see on the page."""
    import discord

    if not isinstance(channel, discord.TextChannel | discord.ForumChannel):
        return []  # no threads
    found: list[Any] = []
    holds_private = isinstance(channel, discord.TextChannel) and not channel.is_news()
    asks = ([{}] if hidden else []) + ([PRIVATE_JOINED] if holds_private else [])
    for ask in asks:
        with contextlib.suppress(discord.Forbidden):  # a channel the bot may not read
            threads = channel.archived_threads(limit=ARCHIVED_THREADS, **ask)
            found += await _all_pages(threads, deadline, channel.id)
    return found


async def _all_pages(threads: Any, deadline: float, channel: int) -> list[Any]:
    """discord.py's pages of archived threads (it asks the next while Discord says `has_more`),
    up to `ARCHIVED_THREADS`: the first page always, a next one only before `deadline` (loop
    time), so a server with huge archives still answers in time. Stopping early only hides
    memory (a thread not found is not the member's), never shows more."""
    found: list[Any] = []
    async with contextlib.aclosing(threads):
        async for thread in threads:
            found.append(thread)
            full_page = len(found) % ARCHIVED_PAGE == 0
            if full_page and asyncio.get_running_loop().time() >= deadline:
                log.warning("Discord channel %s: archived threads listed only to %d (no time "
                            "left)", channel, len(found))  # fmt: skip
                break
    return found


async def _opened(
    threads: list[Any], parents: dict[int, Any], member: Any, deadline: float
) -> list[Any]:
    """Those of `threads` (of channels in `parents`, which `member` views) that they may open: a
    public thread, or a private thread they may manage (Manage Threads shows every private
    thread) or are in. Being in one is one call per thread, so those are asked
    `MEMBERSHIP_CHECKS` at a time (active threads first, then each channel's archives newest
    first) until `deadline` (loop time): a server with many would otherwise pass
    ASK_TIMEOUT_SECONDS. A thread not asked by then is not opened: hidden, never shown."""
    opened: list[Any] = []
    waiting: list[Any] = []  # private threads whose membership is asked
    for thread in threads:
        seen = _opens_unasked(thread, parents[thread.parent_id], member)
        (opened if seen else waiting).append(thread)
    loop = asyncio.get_running_loop()
    unasked = iter(waiting)  # shared by the workers: each thread is taken by one of them
    answered = 0

    async def ask() -> None:
        nonlocal answered
        for thread in unasked:
            if loop.time() >= deadline:
                return
            if await _in_thread(thread, member):
                opened.append(thread)
            answered += 1

    try:
        async with asyncio.timeout_at(deadline), asyncio.TaskGroup() as workers:
            for _ in range(min(MEMBERSHIP_CHECKS, len(waiting))):
                workers.create_task(ask())
    except TimeoutError:  # the answers still awaited are dropped: those threads stay hidden
        pass
    except BaseExceptionGroup as failed:  # Discord's error, as `viewer` tells it to the page
        raise failed.exceptions[0] from None
    if answered < len(waiting):
        log.warning("Discord: membership of %d private threads not asked in time: their memory "
                    "is hidden", len(waiting) - answered)  # fmt: skip
    return opened


def _opens_unasked(thread: Any, parent: Any, member: Any) -> bool:
    """A public thread, or one of a channel where `member` has Manage Threads: no call."""
    return not thread.is_private() or parent.permissions_for(member).manage_threads


async def _in_thread(thread: Any, member: Any) -> bool:
    import discord

    try:
        await thread.fetch_member(member.id)
        return True
    except discord.NotFound:
        return False


def use_discord_api(base_url: str) -> None:
    """DISCORD_API_URL: where discord.py sends REST calls, e.g. a proxy or a test's server
    (`http://127.0.0.1:8123/api/v10`). discord.py keeps one base per process
    (`discord.http.Route.BASE`), so this process's bot client goes there too."""
    import discord.http

    discord.http.Route.BASE = base_url.rstrip("/")


class LocalDirectory:
    """The terminal's person (a link printed by `arxivscout web`): an admin of their tenant."""

    async def viewer(self, tenant: str, user: str, platform: str = "local") -> Viewer:
        return Viewer(tenant, user, "local", admin=True, name=user)


class Directories:
    """The directory of each platform, their answers cached in Redis for minutes, and
    ARXIVSCOUT_ADMINS on top (applied after the cache, so a changed setting counts at once)."""

    def __init__(
        self, cache: ViewerCache | None = None, admins: Admins | None = None, *,
        slack: Directory | None = None, discord: Directory | None = None,
        local: Directory | None = None,
    ) -> None:  # fmt: skip
        self.cache = cache
        self.admins = admins or Admins()
        self.by_platform: dict[str, Directory | None] = {
            "slack": slack, "discord": discord, "local": local or LocalDirectory(),
        }  # fmt: skip

    async def viewer(self, tenant: str, user: str, platform: str) -> Viewer:
        directory = self.by_platform.get(platform)
        if directory is None:
            raise _not_set(platform)
        found = await self.cache.get(platform, tenant, user) if self.cache else None
        if found is not None:
            viewer = viewer_of(found)
        else:
            viewer = await directory.viewer(tenant, user, platform)
            if self.cache is not None:
                await self.cache.put(platform, tenant, user, viewer_record(viewer))
        if not viewer.admin and self.admins.named(tenant, user):
            viewer = replace(viewer, admin=True)
        return viewer
