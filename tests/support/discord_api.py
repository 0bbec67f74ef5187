"""A local stand-in for Discord's REST API (v10): the endpoints the memory page asks who someone
is with, answering in Discord's JSON shapes, with its errors and rate-limit headers.

The real discord.py client is pointed here (`DISCORD_API_URL`, i.e. `discord.http.Route.BASE`),
so every call is real HTTP, recorded for assertions. What it models, as Discord documents it:

- `Authorization: Bot <token>`; anything else is 401 `{"message": "401: Unauthorized"}`.
- A guild with its roles (`permissions` a decimal string of bits) and `owner_id`; members with
  role ids; channels with `permission_overwrites` (type 0 a role, 1 a member).
- Threads (type 11 public, 12 private) with `thread_metadata`; active threads per guild,
  archived ones per channel (public, and private ones the bot joined), paged by `before` and
  `limit`; thread members (404 Unknown Member for someone not in the thread).
- 404 `{"code": 10007, "message": "Unknown Member"}`, 10013 Unknown User, 10004 Unknown Guild;
  403 50001 Missing Access for a channel the bot cannot read, 50013 Missing Permissions for
  every private thread archive (the bot is not given Manage Threads).
- Every answer carries `X-RateLimit-*` headers and `Via` (Discord answers through Google's
  front end; discord.py treats a 429 without `Via` as a Cloudflare ban). `rate_limit` makes
  a route answer 429 with `retry_after` in the body, `Retry-After`, `X-RateLimit-Scope` and,
  for a global limit, `X-RateLimit-Global`; `fail` makes it answer a server error (e.g. 503),
  before or (`created`) after doing what was asked; `cut` drops the connection of a call
  without an answer (after letting `after` calls through), so the client raises an aiohttp
  error (ServerDisconnectedError), not an HTTP one.
- A message posted with `nonce` and `enforce_nonce` whose nonce the bot already used: the first
  message is returned, none created (Discord checks this for a few minutes; here, always,
  unless `nonce_seconds` says how long: 0 for an outage longer than Discord keeps a nonce).
- A channel's history (GET messages), as Discord pages it: `limit` 1 to 100 (default 50);
  with `after` the `limit` messages just after that id, else (`before`, or neither) the
  `limit` newest before it; every page newest first. The bot's REST posts and the messages
  `said` there (a person's, or the bot's from before) are in it. 404 10003 Unknown Channel
  for a channel the mock does not know, 403 50001 Missing Access for one in `no_access`;
  without Read Message History (`no_history`) Discord answers an empty list, not an error
  (discord/discord-api-docs#455).

Buckets never run dry here (`X-RateLimit-Remaining` stays above 0), so nothing sleeps unless
a test asks for a 429.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import discord
from aiohttp import web

from adapters.memory_page.access import use_discord_api
from tests.support.threaded import ThreadedServer

BOT_TOKEN = "discord-test-token"
DISCORD_EPOCH_MS = 1_420_070_400_000

# permission bits (https://discord.com/developers/docs/topics/permissions)
ADMINISTRATOR = 1 << 3
MANAGE_GUILD = 1 << 5
VIEW_CHANNEL = 1 << 10
SEND_MESSAGES = 1 << 11
READ_MESSAGE_HISTORY = 1 << 16
MANAGE_THREADS = 1 << 34
EVERYONE = VIEW_CHANNEL | SEND_MESSAGES | READ_MESSAGE_HISTORY

TEXT, CATEGORY, PUBLIC_THREAD, PRIVATE_THREAD = 0, 4, 11, 12
ROLE, MEMBER = 0, 1  # permission overwrite types

_ids = itertools.count(1)


def snowflake(at: float | None = None) -> int:
    """A new id shaped like Discord's: milliseconds since 2015 (now, or at the Unix time
    `at`) above 22 bits of counter."""
    moment = time.time() if at is None else at
    return ((int(moment * 1000) - DISCORD_EPOCH_MS) << 22) | (next(_ids) % (1 << 22))


def snowflake_time(snowflake_id: int) -> str:
    """The moment (ISO 8601) a snowflake was made, as a message's `timestamp` says it."""
    ms = (snowflake_id >> 22) + DISCORD_EPOCH_MS
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC).isoformat()


def stamp(seconds_ago: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=seconds_ago)
    return moment.isoformat()


class DiscordError(Exception):
    """An error answer, as Discord gives it: `{"message": ..., "code": ...}`."""

    def __init__(self, status: int, code: int, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


UNKNOWN_MEMBER = (404, 10007, "Unknown Member")


@dataclass
class Call:
    route: str  # the route's name below, e.g. "member"
    path: str
    query: dict[str, str]


@dataclass
class Posted:
    """A message the bot posted over REST (or, in `said`, one already in a channel's history),
    as it shows now."""

    id: int
    channel_id: int
    content: str
    edits: int = 0
    author: int = 0  # a user's id; 0: the bot


@dataclass
class Thread:
    id: int
    guild_id: int
    parent_id: int
    private: bool
    archived: bool
    members: set[int]
    archived_at: str = ""  # ISO 8601, as `thread_metadata.archive_timestamp`


@dataclass
class Guild:
    """One server: roles by id (the @everyone role's id is the guild's), members' role ids,
    channels as Discord lists them."""

    id: int
    owner_id: int
    name: str = "Research Lab"
    roles: dict[int, dict[str, Any]] = field(default_factory=dict)
    members: dict[int, list[int]] = field(default_factory=dict)
    channels: list[dict[str, Any]] = field(default_factory=list)

    def role(self, name: str, permissions: int = 0) -> int:
        role_id = snowflake()
        self.roles[role_id] = _role(role_id, name, permissions, len(self.roles))
        return role_id

    def member(self, user: int, *roles: int) -> int:
        self.members[user] = list(roles)
        return user

    def channel(
        self, name: str, *, hidden: bool = False, roles: tuple[int, ...] = (),
        members: tuple[int, ...] = (), kind: int = TEXT,
    ) -> int:  # fmt: skip
        """A channel: `hidden` denies @everyone View Channel; `roles` and `members` are allowed
        it (and Read Message History) by overwrites of their own."""
        overwrites = [{"id": str(self.id), "type": ROLE, "allow": "0", "deny": str(VIEW_CHANNEL)}]
        allowed = str(VIEW_CHANNEL | READ_MESSAGE_HISTORY)
        overwrites = (overwrites if hidden else []) + [
            {"id": str(target), "type": kind_, "allow": allowed, "deny": "0"}
            for kind_, targets in ((ROLE, roles), (MEMBER, members))
            for target in targets
        ]
        channel_id = snowflake()
        self.channels.append({
            "id": str(channel_id), "type": kind, "guild_id": str(self.id), "name": name,
            "position": len(self.channels), "permission_overwrites": overwrites,
            "parent_id": None, "nsfw": False, "topic": None, "last_message_id": None,
            "rate_limit_per_user": 0, "default_auto_archive_duration": 1440, "flags": 0,
        })  # fmt: skip
        return channel_id


def _role(role_id: int, name: str, permissions: int, position: int) -> dict[str, Any]:
    return {
        "id": str(role_id), "name": name, "color": 0,
        "colors": {"primary_color": 0, "secondary_color": None, "tertiary_color": None},
        "hoist": False, "icon": None, "unicode_emoji": None, "position": position,
        "permissions": str(permissions), "managed": False, "mentionable": False, "flags": 0,
    }  # fmt: skip


@dataclass
class MockDiscordApi(ThreadedServer):
    token: str = BOT_TOKEN
    bot_id: int = field(default_factory=snowflake)
    users: dict[int, str] = field(default_factory=dict)  # id -> username
    guilds: dict[int, Guild] = field(default_factory=dict)
    threads: dict[int, Thread] = field(default_factory=dict)
    no_access: set[int] = field(default_factory=set)  # channels the bot may not read
    no_history: set[int] = field(default_factory=set)  # ... nor read the history of (no error)
    calls: list[Call] = field(default_factory=list)
    callbacks: list[dict[str, Any]] = field(default_factory=list)  # interaction responses
    followups: list[dict[str, Any]] = field(default_factory=list)  # interaction follow-ups
    base_url: str = ""
    _limits: dict[str, list[Any]] = field(default_factory=dict)  # route -> [times, wait, global]
    _failures: dict[str, list[Any]] = field(default_factory=dict)  # -> [times, status, created]
    _cuts: dict[str, list[int]] = field(default_factory=dict)  # route -> [after, times]
    _nonces: dict[str, tuple[int, float]] = field(default_factory=dict)  # -> (id, when used)
    nonce_seconds: float = math.inf  # how long an enforced nonce holds (Discord: minutes)
    posted: dict[int, Posted] = field(default_factory=dict)  # the bot's messages, by id
    said: dict[int, Posted] = field(default_factory=dict)  # others already in a history
    attachments: dict[str, bytes] = field(default_factory=dict)  # CDN path -> bytes
    dms: dict[int, int] = field(default_factory=dict)  # person -> the bot's DM channel
    cdn_url: str = ""

    async def start(self) -> str:
        app = web.Application(middlewares=[self._discord])
        v10 = "/api/v10"
        app.router.add_get(f"{v10}/users/@me", self._me, name="me")
        app.router.add_get(f"{v10}/oauth2/applications/@me", self._application, name="application")
        app.router.add_get(f"{v10}/guilds/{{guild}}", self._guild, name="guild")
        app.router.add_get(f"{v10}/guilds/{{guild}}/members/{{user}}", self._member, name="member")
        app.router.add_get(f"{v10}/guilds/{{guild}}/channels", self._channels, name="channels")
        app.router.add_get(f"{v10}/guilds/{{guild}}/threads/active", self._active,
                           name="active_threads")  # fmt: skip
        app.router.add_get(f"{v10}/channels/{{channel}}/threads/archived/public",
                           self._archived_public, name="archived_public")  # fmt: skip
        app.router.add_get(f"{v10}/channels/{{channel}}/threads/archived/private",
                           self._archived_private, name="archived_private")  # fmt: skip
        app.router.add_get(f"{v10}/channels/{{channel}}/users/@me/threads/archived/private",
                           self._archived_joined, name="archived_joined")  # fmt: skip
        app.router.add_get(f"{v10}/channels/{{channel}}/thread-members/{{user}}",
                           self._thread_member, name="thread_member")  # fmt: skip
        app.router.add_post(f"{v10}/interactions/{{interaction}}/{{token}}/callback",
                            self._interaction_callback, name="interaction_callback")  # fmt: skip
        app.router.add_post(f"{v10}/webhooks/{{application}}/{{token}}", self._followup,
                            name="followup")  # fmt: skip
        app.router.add_post(f"{v10}/channels/{{channel}}/messages", self._post, name="post")
        app.router.add_get(f"{v10}/channels/{{channel}}/messages", self._history, name="history")
        app.router.add_post(f"{v10}/users/@me/channels", self._open_dm, name="open_dm")
        app.router.add_patch(f"{v10}/channels/{{channel}}/messages/{{message}}", self._edit,
                             name="edit")  # fmt: skip
        app.router.add_get("/attachments/{channel}/{id}/{name}", self._cdn, name="cdn")
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}{v10}"
        self.cdn_url = f"http://127.0.0.1:{port}/attachments/"
        self.users.setdefault(self.bot_id, "arxivscout")
        return self.base_url

    async def close(self) -> None:
        await self._runner.cleanup()

    # -- what a test sets up ----------------------------------------------------------------

    def user(self, name: str) -> int:
        user_id = snowflake()
        self.users[user_id] = name
        return user_id

    def guild(self, owner: int, everyone: int = EVERYONE) -> Guild:
        guild = Guild(snowflake(), owner)
        guild.roles[guild.id] = _role(guild.id, "@everyone", everyone, 0)
        guild.members[owner] = []
        guild.members[self.bot_id] = []
        self.guilds[guild.id] = guild
        return guild

    def thread(
        self, guild: Guild, parent: int, *, private: bool = False, archived: bool = False,
        members: tuple[int, ...] = (), archived_minutes_ago: float = 1.0,
    ) -> int:  # fmt: skip
        """A thread under `parent`; the bot is in it (it answered there)."""
        thread_id = snowflake()
        self.threads[thread_id] = Thread(thread_id, guild.id, parent, private, archived,
                                         {self.bot_id, *members},
                                         stamp(archived_minutes_ago * 60))  # fmt: skip
        return thread_id

    def deny_history(
        self, guild: Guild, channel: int, target: int | None = None, kind: int = MEMBER
    ) -> None:
        """A server admin denies Read Message History in `channel` by an overwrite of
        `target`'s: by default the bot's member; `kind` ROLE for a role the bot has (the
        guild's id: @everyone). The bot's client sees it in the channel's overwrites, and
        Discord answers the bot's history reads there with an empty list (`no_history`)."""
        [listed] = [c for c in guild.channels if c["id"] == str(channel)]
        listed["permission_overwrites"].append({
            "id": str(target or self.bot_id), "type": kind, "allow": "0",
            "deny": str(READ_MESSAGE_HISTORY),
        })  # fmt: skip
        self.no_history.add(channel)

    def rate_limit(
        self, route: str, retry_after: float, times: int = 1, is_global: bool = False
    ) -> None:
        """Answer the next `times` calls of `route` (a name above, e.g. "member") with 429."""
        self._limits[route] = [times, retry_after, is_global]

    def fail(self, route: str, status: int = 503, times: int = 1, created: bool = False) -> None:
        """Answer the next `times` calls of `route` with a server error (Discord's 5xx);
        `created`: after doing what was asked (the answer lost on the way back)."""
        self._failures[route] = [times, status, created]

    def cut(self, route: str, times: int = 1, after: int = 0) -> None:
        """Drop the connection of `times` calls of `route`, after letting the next `after`
        through: no answer at all (a network fault), which discord.py does not turn into an
        HTTPException. aiohttp sends an idempotent call (a GET) once more on a new connection
        when a kept-alive one drops: cut that one too (`times=2`) for the error to surface."""
        self._cuts[route] = [after, times]

    def attachment(self, channel: int, name: str, data: bytes) -> str:
        """An attached file served by the CDN (no token needed): its URL."""
        path = f"{channel}/{snowflake()}/{name}"
        self.attachments[path] = data
        return f"{self.cdn_url}{path}"

    def say(
        self, channel: int, content: str, author: int | None = None, seconds_ago: float = 0.0
    ) -> int:
        """A message already in `channel`'s history (not a REST post of this test): a person's
        (`author`), or the bot's from before (no `author`), made `seconds_ago`. Its id."""
        message = Posted(snowflake(time.time() - seconds_ago), channel, content,
                         author=author or 0)  # fmt: skip
        self.said[message.id] = message
        return message.id

    def texts(self, channel: int) -> list[str]:
        """What the bot's messages posted over REST in `channel` show now, in order."""
        return [p.content for p in self.posted.values() if p.channel_id == channel]

    def of(self, route: str) -> list[Call]:
        return [c for c in self.calls if c.route == route]

    # -- the server ---------------------------------------------------------------------------

    @web.middleware
    async def _discord(self, request: web.Request, handler: Any) -> web.StreamResponse:
        route = request.match_info.route.name or "unknown"
        self.calls.append(Call(route, request.path, dict(request.query)))
        bucket = {"Via": "1.1 google", "X-RateLimit-Bucket": f"b-{route}"}
        if route == "cdn":  # cdn.discordapp.com takes no token (its addresses are signed)
            return await handler(request)
        # an interaction's callback is authorised by its token in the path, not the bot's
        if (
            route not in ("interaction_callback", "followup")
            and request.headers.get("Authorization") != f"Bot {self.token}"
        ):
            return self._error(401, 0, "401: Unauthorized", {"Via": "1.1 google"})
        limit = self._limits.get(route)
        if limit and limit[0] > 0:
            limit[0] -= 1
            return self._limited(limit[1], limit[2], bucket)
        cut = self._cuts.get(route)
        if cut and cut[0] > 0:
            cut[0] -= 1
        elif cut and cut[1] > 0:
            cut[1] -= 1
            request.transport.close()  # the client sees the server disconnect
            return web.Response(status=500)
        failure = self._failures.get(route)
        if failure and failure[0] > 0:
            failure[0] -= 1
            if failure[2]:
                await handler(request)
            return self._error(failure[1], 0, f"{failure[1]}: Server Error", bucket)
        try:
            response = await handler(request)
        except DiscordError as exc:
            response = self._error(exc.status, exc.code, exc.message, {})
        except web.HTTPNotFound:
            response = self._error(404, 0, "404: Not Found", {})
        reset = time.time() + 1
        response.headers.update({
            **bucket, "X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4",
            "X-RateLimit-Reset": f"{reset:.3f}", "X-RateLimit-Reset-After": "1.000",
        })  # fmt: skip
        return response

    @staticmethod
    def _error(status: int, code: int, message: str, headers: dict[str, str]) -> web.Response:
        return _json({"message": message, "code": code}, status=status,
                                 headers={"Via": "1.1 google", **headers})  # fmt: skip

    @staticmethod
    def _limited(wait: float, is_global: bool, bucket: dict[str, str]) -> web.Response:
        headers = {"Via": "1.1 google", "Retry-After": str(math.ceil(wait))}
        if is_global:
            headers.update({"X-RateLimit-Global": "true", "X-RateLimit-Scope": "global"})
        else:
            headers.update({
                **bucket, "X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "0",
                "X-RateLimit-Reset": f"{time.time() + wait:.3f}",
                "X-RateLimit-Reset-After": f"{wait:.3f}", "X-RateLimit-Scope": "user",
            })  # fmt: skip
        body = {"message": "You are being rate limited.", "retry_after": wait,
                "global": is_global}  # fmt: skip
        if not is_global:
            body["code"] = 0
        return _json(body, status=429, headers=headers)

    def _user(self, user_id: int) -> dict[str, Any]:
        name = self.users[user_id]
        return {"id": str(user_id), "username": name, "discriminator": "0", "global_name": name,
                "avatar": None, "bot": user_id == self.bot_id, "public_flags": 0}  # fmt: skip

    def _the_guild(self, request: web.Request) -> Guild:
        guild = self.guilds.get(_id(request, "guild"))
        if guild is None:
            raise DiscordError(404, 10004, "Unknown Guild")
        return guild

    def _channel(self, request: web.Request) -> int:
        channel_id = _id(request, "channel")
        if channel_id in self.no_access:
            raise DiscordError(403, 50001, "Missing Access")
        return channel_id

    def _thread(self, thread: Thread) -> dict[str, Any]:
        return {
            "id": str(thread.id), "guild_id": str(thread.guild_id),
            "parent_id": str(thread.parent_id), "owner_id": str(self.bot_id),
            "type": PRIVATE_THREAD if thread.private else PUBLIC_THREAD, "name": "a question",
            "last_message_id": None, "rate_limit_per_user": 0, "flags": 0,
            "message_count": 3, "member_count": len(thread.members), "total_message_sent": 3,
            "thread_metadata": {
                "archived": thread.archived, "archive_timestamp": thread.archived_at,
                "auto_archive_duration": 1440, "locked": False, "create_timestamp": stamp(7200),
                **({"invitable": False} if thread.private else {}),
            },
        }  # fmt: skip

    @staticmethod
    def _member_of_thread(thread: Thread, user: int) -> dict[str, Any]:
        return {"id": str(thread.id), "user_id": str(user), "join_timestamp": stamp(600),
                "flags": 1}  # fmt: skip

    async def _followup(self, request: web.Request) -> web.Response:
        """A follow-up message to an interaction (its webhook, authorised by the token in the
        path): recorded, with its ids."""
        body = await _read_body(request)
        self.followups.append({"application": request.match_info["application"],
                               "token": request.match_info["token"], **body})  # fmt: skip
        message = Posted(snowflake(), 0, body.get("content") or "")
        return _json(self._message(message))

    async def _interaction_callback(self, request: web.Request) -> web.Response:
        """An interaction answered (type 4 a message, 9 a modal): recorded, with its ids. A
        message over 2,000 characters is refused, as Discord does (and as `_read_body`)."""
        body = await request.json()
        if len((body.get("data") or {}).get("content") or "") > 2000:
            raise DiscordError(400, 50035, "Invalid Form Body")
        self.callbacks.append({"interaction": request.match_info["interaction"],
                               "token": request.match_info["token"], **body})  # fmt: skip
        flags = (body.get("data") or {}).get("flags") or 0
        return _json({"interaction": {"id": request.match_info["interaction"], "type": 3,
                                      "response_message_ephemeral": bool(flags & 64)}})  # fmt: skip

    async def _me(self, request: web.Request) -> web.Response:
        return _json({**self._user(self.bot_id), "verified": True, "flags": 0,
                                  "mfa_enabled": False, "locale": "en-US"})  # fmt: skip

    async def _application(self, request: web.Request) -> web.Response:
        owner = self._user(self.bot_id)
        return _json({
            "id": str(self.bot_id), "name": "ArxivScout", "icon": None, "description": "",
            "summary": "", "bot_public": True, "bot_require_code_grant": False,
            "verify_key": "0" * 64, "owner": owner, "team": None, "flags": 0,
            "bot": owner, "redirect_uris": [], "interactions_endpoint_url": None,
        })  # fmt: skip

    async def _guild(self, request: web.Request) -> web.Response:
        guild = self._the_guild(request)
        return _json({
            "id": str(guild.id), "name": guild.name, "icon": None, "splash": None,
            "discovery_splash": None, "owner_id": str(guild.owner_id), "afk_channel_id": None,
            "afk_timeout": 300, "verification_level": 1, "default_message_notifications": 1,
            "explicit_content_filter": 0, "roles": list(guild.roles.values()), "emojis": [],
            "features": [], "mfa_level": 0, "application_id": None, "system_channel_id": None,
            "system_channel_flags": 0, "rules_channel_id": None, "vanity_url_code": None,
            "description": None, "banner": None, "premium_tier": 0, "stickers": [],
            "premium_subscription_count": 0, "preferred_locale": "en-US", "nsfw_level": 0,
            "public_updates_channel_id": None, "premium_progress_bar_enabled": False,
            "safety_alerts_channel_id": None,
        })  # fmt: skip

    async def _member(self, request: web.Request) -> web.Response:
        guild = self._the_guild(request)
        user = _id(request, "user")
        if user not in self.users:
            raise DiscordError(404, 10013, "Unknown User")
        if user not in guild.members:
            raise DiscordError(*UNKNOWN_MEMBER)
        return _json({
            "user": self._user(user), "nick": None, "avatar": None,
            "roles": [str(r) for r in guild.members[user]], "joined_at": stamp(86400),
            "premium_since": None, "deaf": False, "mute": False, "flags": 0, "pending": False,
            "communication_disabled_until": None,
        })  # fmt: skip

    async def _channels(self, request: web.Request) -> web.Response:
        return _json(self._the_guild(request).channels)

    async def _active(self, request: web.Request) -> web.Response:
        guild = self._the_guild(request)
        active = [t for t in self.threads.values() if t.guild_id == guild.id and not t.archived]
        return _json({
            "threads": [self._thread(t) for t in active],
            "members": [self._member_of_thread(t, self.bot_id) for t in active],
        })  # fmt: skip

    def _archive(self, request: web.Request, private: bool, by_id: bool = False) -> web.Response:
        """One page of a channel's archived threads, newest first; `before` a timestamp (or a
        thread id for the bot's joined private threads), `limit` 2 to 100."""
        channel = self._channel(request)
        try:
            limit = int(request.query.get("limit", "50"))
        except ValueError:
            limit = 0
        if not 2 <= limit <= 100:
            raise DiscordError(400, 50035, "Invalid Form Body")
        found = [t for t in self.threads.values() if t.parent_id == channel and t.archived
                 and t.private == private and (not private or self.bot_id in t.members)]  # fmt: skip
        if by_id:
            found.sort(key=lambda t: -t.id)
            before = int(request.query.get("before") or 1 << 63)
            found = [t for t in found if t.id < before]
        else:
            found.sort(key=lambda t: datetime.datetime.fromisoformat(t.archived_at), reverse=True)
            if before := request.query.get("before"):
                cut = datetime.datetime.fromisoformat(before)
                found = [t for t in found if datetime.datetime.fromisoformat(t.archived_at) < cut]
        page = found[:limit]
        return _json({
            "threads": [self._thread(t) for t in page],
            "members": [self._member_of_thread(t, self.bot_id) for t in page],
            "has_more": len(found) > limit,
        })  # fmt: skip

    async def _archived_public(self, request: web.Request) -> web.Response:
        return self._archive(request, private=False)

    async def _archived_private(self, request: web.Request) -> web.Response:
        self._channel(request)
        raise DiscordError(403, 50013, "Missing Permissions")  # needs Manage Threads

    async def _archived_joined(self, request: web.Request) -> web.Response:
        return self._archive(request, private=True, by_id=True)

    async def _post(self, request: web.Request) -> web.Response:
        """POST a message (REST): recorded, answered with the message object."""
        channel, body = self._channel_id(request), await _read_body(request)
        nonce = str(body["nonce"]) if body.get("enforce_nonce") and body.get("nonce") else ""
        first, used = self._nonces.get(nonce, (0, 0.0))
        if first and time.time() - used < self.nonce_seconds:
            return _json(self._message(self.posted[first]))
        message = Posted(snowflake(), channel, body.get("content") or "")
        self.posted[message.id] = message
        if nonce:
            self._nonces[nonce] = (message.id, time.time())
        return _json(self._message(message))

    def _known_channels(self) -> set[int]:
        """The channels the mock knows: its servers', threads, DMs, and any a message is in."""
        listed = {int(c["id"]) for g in self.guilds.values() for c in g.channels}
        written = {m.channel_id for m in [*self.posted.values(), *self.said.values()]}
        return listed | set(self.threads) | set(self.dms.values()) | written

    async def _history(self, request: web.Request) -> web.Response:
        """GET a channel's messages, as Discord answers (see the module's docstring): one page,
        newest first; `after` the messages just after it, else the newest before `before`."""
        channel = _id(request, "channel")
        if channel not in self._known_channels():
            raise DiscordError(404, 10003, "Unknown Channel")
        if channel in self.no_access:
            raise DiscordError(403, 50001, "Missing Access")
        query = request.query
        try:
            limit = int(query.get("limit", "50"))
            after, before = (int(query.get(k) or 0) for k in ("after", "before"))
        except ValueError:
            raise DiscordError(400, 50035, "Invalid Form Body") from None
        if not 1 <= limit <= 100 or "around" in query or (after and before):
            raise DiscordError(400, 50035, "Invalid Form Body")  # (`around` is not modelled)
        if channel in self.no_history:  # no Read Message History: no messages, no error
            return _json([])
        kept = sorted(
            (m for m in [*self.posted.values(), *self.said.values()] if m.channel_id == channel),
            key=lambda m: m.id,
        )
        if after:
            page = [m for m in kept if m.id > after][:limit]
        else:
            page = [m for m in kept if not before or m.id < before][-limit:]
        return _json([self._message(m) for m in reversed(page)])

    async def _open_dm(self, request: web.Request) -> web.Response:
        """The bot's DM channel with a person (`create_dm`): its id is recorded in `dms`."""
        recipient = int((await request.json())["recipient_id"])
        self.users.setdefault(recipient, f"user{recipient}")
        channel = self.dms.setdefault(recipient, snowflake())
        return _json({"id": str(channel), "type": 1, "last_message_id": None,
                      "recipients": [self._user(recipient)]})  # fmt: skip

    async def _edit(self, request: web.Request) -> web.Response:
        channel, body = self._channel_id(request), await _read_body(request)
        message = self.posted.get(_id(request, "message"))
        if message is None or message.channel_id != channel:
            raise DiscordError(404, 10008, "Unknown Message")
        message.content = body.get("content", message.content)
        message.edits += 1
        return _json(self._message(message))

    def _channel_id(self, request: web.Request) -> int:
        channel = _id(request, "channel")
        if channel in self.no_access:
            raise DiscordError(403, 50001, "Missing Access")
        return channel

    def _message(self, message: Posted) -> dict[str, Any]:
        return {"id": str(message.id), "channel_id": str(message.channel_id), "type": 0,
                "content": message.content, "author": self._user(message.author or self.bot_id),
                "timestamp": snowflake_time(message.id),
                "edited_timestamp": stamp() if message.edits else None,
                "attachments": [], "embeds": [], "mentions": [], "mention_roles": [],
                "pinned": False, "mention_everyone": False, "tts": False}  # fmt: skip

    async def _cdn(self, request: web.Request) -> web.Response:
        info = request.match_info
        data = self.attachments.get(f"{info['channel']}/{info['id']}/{info['name']}")
        if data is None:  # an expired or unknown address
            return web.Response(status=404, text="This content is no longer available.")
        return web.Response(body=data, content_type="application/pdf")

    async def _thread_member(self, request: web.Request) -> web.Response:
        thread = self.threads.get(_id(request, "channel"))
        if thread is None:
            raise DiscordError(404, 10003, "Unknown Channel")
        user = _id(request, "user")
        if user not in thread.members:
            raise DiscordError(*UNKNOWN_MEMBER)
        return _json(self._member_of_thread(thread, user))


async def _read_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise DiscordError(400, 50109, "The request body contains invalid JSON.") from None
    if not isinstance(body, dict) or len(body.get("content") or "") > 2000:
        raise DiscordError(400, 50035, "Invalid Form Body")
    return body


def _json(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """Discord's Content-Type is exactly `application/json` (discord.py parses nothing else)."""
    return web.Response(body=json.dumps(body).encode(), status=status,
                        headers={**(headers or {}), "Content-Type": "application/json"})  # fmt: skip


def _id(request: web.Request, name: str) -> int:
    value = request.match_info[name]
    if not value.isdigit():
        raise DiscordError(400, 50035, "Invalid Form Body")  # not a snowflake
    return int(value)


@asynccontextmanager
async def serving_discord_api() -> AsyncIterator[MockDiscordApi]:
    """A running mock that the whole process's discord.py talks to, restored afterwards."""
    api = MockDiscordApi()
    await api.start()
    previous = discord.http.Route.BASE
    use_discord_api(api.base_url)
    try:
        yield api
    finally:
        discord.http.Route.BASE = previous
        await api.close()
