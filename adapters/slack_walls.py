"""Who is asking the Slack adapter, and where: whether the team's public memory may be shown.

The memory page keeps the workspace's public memory from guests and people of another
organisation (adapters/memory_page/access.py); the bot keeps it from them too. A scope is
walled (`memory.scope.Scope.walled`) when the person is of another organisation (the event's
`user_team` is not the workspace, or users.info says `is_stranger`, and Slack does not say they
are of the workspace's own Enterprise Grid organisation: slack_org.py `same_organisation`), a
guest (`is_restricted`, `is_ultra_restricted`), or when the channel is shared with another
organisation (Slack Connect: conversations.info `is_ext_shared`, or about to be, or `is_shared`
beyond the organisation), where every answer is read by the other organisation too.

An organisation is an Enterprise Grid org (its rules: adapters/slack_org.py). When Slack cannot
say the workspace's org (auth.test failing), nothing is cached of it: the person is walled
without Slack's word (`Person.said` False), and asked again.

Slack's answers (a channel's privacy and sharing, a person's name and guest status, the
channels a person is in) are cached for `CACHE_SECONDS`, per process: a member made a guest is
followed within minutes, not at the next restart. Slack's `channel_shared` and its notice of a
channel made private or public (each sent to one process) empty every process's cache of that
channel at once: the receiving process leaves a new token for it in Redis
(`sharing_changed_key`), and each process compares it with the one it last saw before it trusts
its cache (a digest also asks afresh: `fresh_place`). One question per channel or person is asked at a time; whoever
needs the answer meanwhile waits for that one. When Slack cannot say (unreachable, slow, rate
limited), the last answer stands for up to `STALE_SECONDS`; with none, it fails closed: a
channel is private and shared, a person walled, a membership refused. Slack is then not asked
again before its Retry-After (a 429: for no key of that method, as Slack's limit is the
method's), or for `FAILED_SECONDS` (any other failure, that key), so a busy Slack is not asked
once per event.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack_delivery import retry_after
from adapters.slack_org import (
    OrganisationUnknown,
    enterprise_of,
    names_another_team,
    outsider,
    same_organisation,
    shared_outside,
    workspace_organisation,
)
from bot.watch_places import Undeliverable
from memory.scope import Visibility
from memory.sharing import SharingChanges

log = logging.getLogger(__name__)

CACHE_SECONDS = 300.0
ASK_SECONDS = 2.0  # Slack wants its events and commands answered within 3 s
FRESH_SECONDS = 10.0  # a digest's channel, asked afresh: no event waits for it
MEMBERSHIP_SECONDS = 10.0  # users.conversations' pages, asked after the command's answer
FAILED_SECONDS = 10.0  # a failure (not a 429: that says how long) is remembered this long
# while Slack cannot say, its last answer stands in this long, then the scope fails closed: a
# channel shared or made private meanwhile, a person who left a channel, are not trusted for
# longer on an old word
STALE_SECONDS = 900.0
UNKNOWN_PERSON = ("user_not_found", "users_not_found")  # a definite answer: not of the team
CHANNEL_TYPES = "public_channel,private_channel,mpim"
PAGE_SIZE = 200  # users.conversations (Slack suggests at most 200)

K = TypeVar("K")
V = TypeVar("V")


class Expiring(Generic[K, V]):
    """A process's cache whose answers are fresh for `seconds` (by `clock`, monotonic); the
    last answer stays readable after that, for when Slack cannot be asked."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self.clock = clock
        self._items: dict[K, tuple[float, V]] = {}

    def fresh(self, key: K) -> V | None:
        found = self._items.get(key)
        if found is None or self.clock() - found[0] >= self.seconds:
            return None
        return found[1]

    def last(self, key: K) -> V | None:
        """The last answer, if it is under `STALE_SECONDS` old."""
        found = self._items.get(key)
        if found is None or self.clock() - found[0] >= STALE_SECONDS:
            return None
        return found[1]

    def put(self, key: K, value: V) -> V:
        self._items[key] = (self.clock(), value)
        return value

    def drop(self, key: K) -> None:
        self._items.pop(key, None)

    def keys(self) -> list[K]:
        return list(self._items)


class Answers(Generic[K, V]):
    """Slack's answers by key: cached (`Expiring`), one question per key at a time (shared by
    everyone who asks meanwhile), and not asked again while Slack said to wait."""

    def __init__(
        self, seconds: float, timeout: float = ASK_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.timeout = timeout
        self.failed_seconds = min(FAILED_SECONDS, seconds)
        self.clock = clock
        self._cache: Expiring[K, V] = Expiring(seconds, clock)
        self._pending: dict[K, asyncio.Task[V | None]] = {}
        self._quiet_until: dict[K, float] = {}  # `clock` time before which Slack is not asked
        self._limited_until = 0.0  # a 429 is the method's, for the whole workspace: every key
        self._forgotten: dict[K, int] = {}  # `forget`s per key: an answer asked before one is
        # not kept

    async def get(self, key: K, ask: Callable[[], Awaitable[V]]) -> V | None:
        """The fresh answer, else Slack's (`ask`); when Slack cannot say, the last answer, or
        None if it never said."""
        found = self._cache.fresh(key)
        if found is not None:
            return found
        if self.clock() < max(self._limited_until, self._quiet_until.get(key, 0.0)):
            return self._cache.last(key)
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.create_task(self._ask(key, ask))
            self._pending[key] = pending
            pending.add_done_callback(lambda done: self._unpend(key, done))
        return await asyncio.shield(pending)  # one asker's cancellation leaves it to the others

    def _unpend(self, key: K, done: asyncio.Task[V | None]) -> None:
        if self._pending.get(key) is done:
            del self._pending[key]

    async def _ask(self, key: K, ask: Callable[[], Awaitable[V]]) -> V | None:
        asked = self._forgotten.get(key, 0)
        try:
            async with asyncio.timeout(self.timeout):
                found = await ask()
            if self._forgotten.get(key, 0) != asked:
                return found  # asked before Slack said it changed: answers its askers only
            self._quiet_until.pop(key, None)
            return self._cache.put(key, found)
        except SlackApiError as exc:
            wait = retry_after(exc)
            self._quiet(key, self.failed_seconds if wait is None else wait, exc)
            if wait is not None:  # rate limited: no key asks before Retry-After
                self._limited_until = self._quiet_until[key]
        except (aiohttp.ClientError, TimeoutError, OSError, OrganisationUnknown) as exc:
            self._quiet(key, self.failed_seconds, exc)
        return self._cache.last(key)

    def _quiet(self, key: K, seconds: float, why: Exception) -> None:
        log.info("Slack could not say %s (%r): not asked again for %.0f s", key, why, seconds)
        self._quiet_until[key] = self.clock() + seconds

    def forget(self, wanted: Callable[[K], bool]) -> None:
        """Drop every answer of the keys `wanted` picks, the last one too (Slack said they
        changed): the next `get` asks Slack, and fails closed if it cannot say."""
        for key in {*self._cache.keys(), *self._pending, *self._quiet_until}:
            if wanted(key):
                self._cache.drop(key)
                self._pending.pop(key, None)
                self._quiet_until.pop(key, None)
                self._forgotten[key] = self._forgotten.get(key, 0) + 1


@dataclass(frozen=True, slots=True)
class Place:
    visibility: Visibility
    shared: bool = False  # with another organisation (or not known): walled for everyone


@dataclass(frozen=True, slots=True)
class Person:
    name: str
    outsider: bool = False  # a guest, or of another organisation (or not known)
    enterprise: str = ""  # their Enterprise Grid org (users.info enterprise_user), "" if none
    said: bool = True  # False: Slack could not say who they are (no answer, not even a recent
    # one): `outsider` is the fail-closed default, not Slack's word, and may be asked again


DM_PLACE = Place(Visibility.DM)
UNKNOWN_PLACE = Place(Visibility.PRIVATE, shared=True)


async def _nothing() -> None:
    return None


class SlackWalls:
    """Asks Slack about channels and people, once per `cache_seconds` each (by `clock`,
    monotonic: a test's own moves the cache's time on)."""

    def __init__(
        self, client: AsyncWebClient, cache_seconds: float = CACHE_SECONDS,
        clock: Callable[[], float] = time.monotonic, sharing: SharingChanges | None = None,
    ) -> None:  # fmt: skip
        """`sharing`: where sharing changes are told to the other processes (none: this
        process's own events only)."""
        self.client = client
        self.sharing = sharing
        self._places: Answers[tuple[str, str], Place] = Answers(cache_seconds, clock=clock)
        self._people: Answers[tuple[str, str], Person] = Answers(cache_seconds, clock=clock)
        self._channels: Answers[tuple[str, str], frozenset[str]] = Answers(
            cache_seconds, MEMBERSHIP_SECONDS, clock
        )
        self._organisations: Answers[str, str] = Answers(cache_seconds, clock=clock)

    async def place(self, team: str, channel: str, kind: str | None) -> Place:
        """A channel's visibility (the event's channel_type, made stricter by Slack's answer)
        and whether it is shared with another organisation. A DM is neither."""
        if kind == "im" or channel.startswith("D"):
            return DM_PLACE
        await self._follow_sharing(channel)
        found = await self._places.get((team, channel), lambda: self._describe(channel))
        found = found or UNKNOWN_PLACE
        if kind in ("group", "mpim") and found.visibility is Visibility.PUBLIC:
            return Place(Visibility.PRIVATE, found.shared)
        return found

    async def on_sharing_changed(self, event: dict) -> None:
        """Slack's `channel_shared` or `channel_unshared` (another organisation joined or
        left the channel), or its `channel_convert_to_private` or `channel_convert_to_public`
        notice: what this process cached of the channel goes at once, whichever workspace asked, and a new sharing token tells
        the other processes to do the same."""
        channel = event.get("channel")
        if not channel or not isinstance(channel, str):
            return
        self._places.forget(lambda key: key[1] == channel)
        if self.sharing is not None:
            await self.sharing.changed(channel)

    async def _follow_sharing(self, channel: str) -> None:
        """Forget this process's walls of a channel whose sharing changed since it last looked
        (another process received Slack's event)."""
        if self.sharing is not None and await self.sharing.changed_since_seen(channel):
            self._places.forget(lambda key: key[1] == channel)

    async def person(self, team: str, user: str) -> Person:
        """A person's display name and whether they are a guest or of another organisation;
        Slack unable to say: an outsider, not `said`."""
        if not user:
            return Person("")
        found = await self._people.get((team, user), lambda: self._introduce(team, user))
        return found or Person(user, outsider=True, said=False)

    async def foreign(self, team: str, user: str, event: dict[str, Any]) -> bool:
        """The event's person is of another organisation than the workspace (Slack Connect):
        the event names another workspace as theirs, and Slack does not say they are of the
        workspace's own Enterprise Grid org (a sister workspace's member, in an org-shared
        channel, is). Slack unable to say (the person, or the workspace's org): foreign. The
        person and the organisation are asked at once (Slack's 3 s)."""
        if not names_another_team(team, event):
            return False
        person, organisation = await asyncio.gather(
            self.person(team, user), self.organisation(team)
        )
        return not same_organisation(person.enterprise, organisation)

    async def asked(
        self, team: str, channel: str, kind: str | None, user: str, event: dict[str, Any]
    ) -> tuple[Place, Person, bool]:
        """An event's (or command's) place, person, and whether that person is `foreign`:
        every question Slack is asked of it at once, in one wait, not one after another (an
        event is answered after them, and Slack waits 3 s for it); the workspace's organisation
        only when the payload names another workspace as the person's."""
        another = names_another_team(team, event)
        place, person, organisation = await asyncio.gather(
            self.place(team, channel, kind),
            self.person(team, user),
            self.organisation(team) if another else _nothing(),
        )
        return place, person, another and not same_organisation(person.enterprise, organisation)

    async def organisation(self, team: str) -> str | None:
        """The workspace's Enterprise Grid org (`workspace_organisation`; "" when it is in
        none); None when Slack cannot say (not cached: asked again)."""
        return await self._organisations.get(
            team, lambda: workspace_organisation(self.client, team)
        )

    async def fresh_place(self, team: str, channel: str, gone: Collection[str] = ()) -> Place:
        """A channel's walls as Slack says them now (conversations.info, not the cache, which
        another process's `channel_shared` did not empty): for what is rare and posted for all
        of the channel to read (a digest). Slack unable to say: private and shared. An error
        of `gone` (the channel deleted: a digest's place refused before arXiv is asked) raises
        Undeliverable."""
        try:
            async with asyncio.timeout(FRESH_SECONDS):
                return await self._describe(channel)
        except SlackApiError as exc:
            error = exc.response.get("error", "")
            if error in gone:
                raise Undeliverable(f"Slack refused the digest in {channel}: {error}") from exc
            log.info("Slack could not describe %s of %s (%r): walled", channel, team, exc)
            return UNKNOWN_PLACE
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.info("Slack could not describe %s of %s (%r): walled", channel, team, exc)
            return UNKNOWN_PLACE

    async def member_of(self, team: str, user: str, channel: str) -> bool | None:
        """Whether a person is in a channel (one the bot is in too); None: Slack cannot say."""
        found = await self._channels.get((team, user), lambda: self._channels_of(user))
        return None if found is None else channel in found

    async def _describe(self, channel: str) -> Place:
        response = await self.client.conversations_info(channel=channel)
        info = response.get("channel") or {}
        private = info.get("is_private") or info.get("is_group") or info.get("is_mpim")
        visibility = Visibility.PRIVATE if private else Visibility.PUBLIC
        return Place(visibility, shared_outside(info))

    async def _introduce(self, team: str, user: str) -> Person:
        try:
            response = await self.client.users_info(user=user)
        except SlackApiError as exc:
            if exc.response.get("error") in UNKNOWN_PERSON:
                return Person(user, outsider=True)
            raise
        found = response.get("user") or {}
        profile = {**found, **(found.get("profile") or {})}
        name = profile.get("display_name") or profile.get("real_name") or user
        walled = await outsider(found, lambda: self.organisation(team))
        return Person(name, walled, enterprise_of(found))

    async def _channels_of(self, user: str) -> frozenset[str]:
        """users.conversations with the bot's token: the person's channels the bot is in."""
        channels: set[str] = set()
        cursor = None
        while True:
            try:
                page = await self.client.users_conversations(
                    user=user, types=CHANNEL_TYPES, limit=PAGE_SIZE, cursor=cursor
                )
            except SlackApiError as exc:
                if exc.response.get("error") in UNKNOWN_PERSON:
                    return frozenset()  # not of the workspace: in none of its channels
                raise
            channels.update(c["id"] for c in page.get("channels") or [])
            cursor = (page.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                return frozenset(channels)
