"""Who is asking the Slack adapter, and where: whether the team's public memory may be shown.

The memory page keeps the workspace's public memory from guests and people of another
organisation (adapters/memory_page/access.py); the bot keeps it from them too. A scope is
walled (`memory.scope.Scope.walled`) when the person is of another organisation (the event's
`user_team` is not the workspace, or users.info says `is_stranger`), a guest (`is_restricted`,
`is_ultra_restricted`), or when the channel is shared with another organisation (Slack Connect:
conversations.info `is_ext_shared`, or about to be, or `is_shared` beyond the organisation),
where every answer is read by the other organisation too.

Slack's answers (a channel's privacy and sharing, a person's name and guest status) are cached
for `CACHE_SECONDS`: a channel converted to private, or a member made a guest, is followed
within minutes, not at the next restart. Unknown (Slack unreachable) fails closed: a channel is
private and shared; a person is as last known, else walled; neither is cached.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from memory.scope import Visibility

CACHE_SECONDS = 300.0
ASK_SECONDS = 2.0  # Slack wants its events and commands answered within 3 s
OUTSIDER_FLAGS = ("is_restricted", "is_ultra_restricted", "is_stranger")
UNKNOWN_PERSON = ("user_not_found", "users_not_found")  # a definite answer: not of the team

K = TypeVar("K")
V = TypeVar("V")


class Expiring(Generic[K, V]):
    """A process's cache whose answers are fresh for `seconds` (monotonic clock); the last
    answer stays readable after that, for when Slack cannot be asked."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._items: dict[K, tuple[float, V]] = {}

    def fresh(self, key: K) -> V | None:
        found = self._items.get(key)
        if found is None or time.monotonic() - found[0] >= self.seconds:
            return None
        return found[1]

    def last(self, key: K) -> V | None:
        found = self._items.get(key)
        return None if found is None else found[1]

    def put(self, key: K, value: V) -> V:
        self._items[key] = (time.monotonic(), value)
        return value


@dataclass(frozen=True, slots=True)
class Place:
    visibility: Visibility
    shared: bool = False  # with another organisation (or not known): walled for everyone


@dataclass(frozen=True, slots=True)
class Person:
    name: str
    outsider: bool = False  # a guest, or of another organisation (or not known)


DM_PLACE = Place(Visibility.DM)
UNKNOWN_PLACE = Place(Visibility.PRIVATE, shared=True)


def shared_outside(info: dict[str, Any]) -> bool:
    """conversations.info says the channel is (or is being) shared with another organisation.
    `is_org_shared` alone is a channel of several workspaces of one Enterprise Grid org."""
    if info.get("is_ext_shared") or info.get("is_pending_ext_shared"):
        return True
    return bool(info.get("is_shared")) and not info.get("is_org_shared")


def foreign(team: str, event: dict[str, Any]) -> bool:
    """The event's person is of another organisation than the workspace (Slack Connect)."""
    teams = {event.get("user_team"), event.get("source_team")} - {None, ""}
    return any(t != team for t in teams)


class SlackWalls:
    """Asks Slack about channels and people, once per `cache_seconds` each."""

    def __init__(self, client: AsyncWebClient, cache_seconds: float = CACHE_SECONDS) -> None:
        self.client = client
        self._places: Expiring[tuple[str, str], Place] = Expiring(cache_seconds)
        self._people: Expiring[tuple[str, str], Person] = Expiring(cache_seconds)

    async def place(self, team: str, channel: str, kind: str | None) -> Place:
        """A channel's visibility (the event's channel_type, made stricter by Slack's answer)
        and whether it is shared with another organisation. A DM is neither."""
        if kind == "im" or channel.startswith("D"):
            return DM_PLACE
        found = self._places.fresh((team, channel))
        if found is None:
            try:
                async with asyncio.timeout(ASK_SECONDS):
                    response = await self.client.conversations_info(channel=channel)
            except (SlackApiError, aiohttp.ClientError, TimeoutError, OSError):
                return UNKNOWN_PLACE  # not cached: asked again
            info = response.get("channel") or {}
            private = info.get("is_private") or info.get("is_group") or info.get("is_mpim")
            visibility = Visibility.PRIVATE if private else Visibility.PUBLIC
            found = self._places.put((team, channel), Place(visibility, shared_outside(info)))
        if kind in ("group", "mpim") and found.visibility is Visibility.PUBLIC:
            return Place(Visibility.PRIVATE, found.shared)
        return found

    async def person(self, team: str, user: str) -> Person:
        """A person's display name and whether they are a guest or of another organisation."""
        if not user:
            return Person("")
        found = self._people.fresh((team, user))
        if found is not None:
            return found
        try:
            async with asyncio.timeout(ASK_SECONDS):
                response = await self.client.users_info(user=user)
        except SlackApiError as exc:
            if exc.response.get("error") in UNKNOWN_PERSON:
                return self._people.put((team, user), Person(user, outsider=True))
            return self._people.last((team, user)) or Person(user, outsider=True)
        except (aiohttp.ClientError, TimeoutError, OSError):
            return self._people.last((team, user)) or Person(user, outsider=True)
        found_user = response.get("user") or {}
        profile = {**found_user, **(found_user.get("profile") or {})}
        name = profile.get("display_name") or profile.get("real_name") or user
        outsider = any(found_user.get(k) for k in OUTSIDER_FLAGS)
        return self._people.put((team, user), Person(name, outsider))
