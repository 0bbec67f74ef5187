"""What the memory page keeps in Redis: the link-signing secret when none is configured, the
sessions signed links open, the links already used (and by which browser), and who each person
is (cached for minutes).

Every process serving the page, or issuing its links, shares these, so a link made by the Slack
process opens on the `arxivscout web` process, and a session started on one web process is
known to the others. Records are JSON documents: the page's own types stay above `memory/`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
from typing import Any

from redis.asyncio import Redis

from memory.keys import web_secret_key, web_session_key, web_used_link_key, web_viewer_key
from memory.stores.base import decode

SESSION_TTL_SECONDS = 8 * 3600
VIEWER_TTL_SECONDS = 300
USED_LINK_MARGIN_SECONDS = 300  # a used link is kept this long past its expiry (clock skew)
PRESS_AGAIN_SECONDS = 120  # the same browser may press a used link again this long after


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


class LinkSecrets:
    """The secret that signs memory-page links when ARXIVSCOUT_SECRET is not set: made at
    random by the first process that needs it and kept, so all processes agree."""

    def __init__(self, redis: Redis) -> None:
        self.redis = redis

    async def shared(self) -> tuple[str, bool]:
        """(the secret, True if this call made it)."""
        made = secrets.token_hex(32)
        created = bool(await self.redis.set(web_secret_key(), made, nx=True))
        return (made, True) if created else (decode(await self.redis.get(web_secret_key())), False)


class WebSessions:
    """Sessions of the memory page: a random id in an HttpOnly cookie, its record here under
    the id's hash, gone after `ttl` seconds (or when signed out)."""

    def __init__(self, redis: Redis, ttl: int = SESSION_TTL_SECONDS) -> None:
        self.redis = redis
        self.ttl = ttl

    @staticmethod
    def key(session_id: str) -> str:
        return web_session_key(_digest(session_id))

    async def create(self, record: dict[str, Any]) -> str:
        session_id = secrets.token_urlsafe(32)
        await self.redis.set(self.key(session_id), json.dumps(record), ex=self.ttl)
        return session_id

    async def get(self, session_id: str) -> dict[str, Any] | None:
        if not session_id:
            return None
        raw = await self.redis.get(self.key(session_id))
        return json.loads(raw) if raw else None

    async def update(self, session_id: str, record: dict[str, Any]) -> bool:
        """Replace a live session's record, keeping its expiry; False if it has ended."""
        return bool(
            await self.redis.set(self.key(session_id), json.dumps(record), xx=True, keepttl=True)
        )

    async def delete(self, session_id: str) -> None:
        if session_id:
            await self.redis.delete(self.key(session_id))


class UsedLinks:
    """Sign-in links already turned into a session. A link's address can be read where requests
    are logged (a router logs every path with its query), so a link signs in one browser: its
    nonce, hashed, is kept here (`link_id`) with the hash of that browser's sign-in cookie (set
    by the link's preview page; a press without one is not recorded at all), the hashes of the
    sessions its presses started and when it was first pressed, until the link expires, when
    the signature refuses it anyway.

    A press's verdict: OPEN (unused, or the same browser again within `again_seconds` of the
    first press and fewer than `MAX_PRESSES` times: a double click, a reply lost to a dropped
    connection or a router timeout), USED (that window or count has passed, or the link was
    ended), LEAKED (another browser, or a request without the cookie, while the link's sessions
    live: whoever read the link in a log pressed it before or after its person, so they are
    all ended and both are refused from then on). A press again adds its session and ends none:
    of a double click's two sessions, either may be the one the browser keeps."""

    OPEN, USED, LEAKED = "open", "used", "leaked"
    MAX_PRESSES = 5  # a link's sessions, at most: its record stays short

    def __init__(
        self, redis: Redis, margin: int = USED_LINK_MARGIN_SECONDS,
        again_seconds: int = PRESS_AGAIN_SECONDS,
    ) -> None:  # fmt: skip
        self.redis = redis
        self.margin = margin
        self.again_seconds = again_seconds

    @staticmethod
    def link_id(nonce: str) -> str:
        """What names the link here (and in its session's record, for signing out)."""
        return _digest(nonce)

    @classmethod
    def key(cls, nonce: str) -> str:
        return web_used_link_key(cls.link_id(nonce))

    def _verdict(self, record: dict[str, Any] | None, browser: str, now: float) -> str:
        if record is None:
            return self.OPEN
        if not record["sessions"]:  # ended: signed out, or leaked
            return self.USED
        if not (browser and hmac.compare_digest(record["browser"], _digest(browser))):
            return self.LEAKED
        again = now - record["at"] < self.again_seconds
        return self.OPEN if again and len(record["sessions"]) < self.MAX_PRESSES else self.USED

    async def check(self, nonce: str, browser: str, now: float) -> str:
        """The verdict on a press by the browser of sign-in cookie `browser`: one read, to
        refuse a used link before anyone is asked who its person is."""
        return self._verdict(self._load(await self.redis.get(self.key(nonce))), browser, now)

    async def use(
        self, nonce: str, browser: str, session_id: str, now: float, remaining: float
    ) -> bool:
        """Use up the link of `nonce`, valid for `remaining` more seconds, for the browser of
        sign-in cookie `browser` (never empty: such a press is not a sign-in) and the session
        `session_id` its press started: True when the verdict is OPEN and the press recorded.
        One transaction, so of two browsers at once only one wins. Kept `margin` seconds past
        the link's expiry: another process's clock may run a little behind."""
        if not browser:
            return False
        key = self.key(nonce)

        async def press(pipe: Any) -> bool:
            record = self._load(await pipe.get(key))
            if self._verdict(record, browser, now) != self.OPEN:
                return False
            started = record["sessions"] if record else []
            pressed = {"browser": _digest(browser), "at": record["at"] if record else now,
                       "sessions": [*started, _digest(session_id)]}  # fmt: skip
            pipe.multi()
            if record is None:
                pipe.set(key, json.dumps(pressed), ex=max(1, math.ceil(remaining)) + self.margin)
            else:
                pipe.set(key, json.dumps(pressed), keepttl=True)
            return True

        return bool(await self.redis.transaction(press, key, value_from_callable=True))

    async def refused(
        self, nonce: str, browser: str, session_id: str, now: float
    ) -> tuple[str, bool]:
        """A press not let in: its verdict (USED or LEAKED; a LEAKED link is then `end`ed by
        the caller, after it logged why) and whether `session_id`, the browser's session, is one
        the link started (a second tab, Back)."""
        record = self._load(await self.redis.get(self.key(nonce)))
        verdict = self._verdict(record, browser, now)
        own = record is not None and _digest(session_id) in record["sessions"]
        return (self.LEAKED if verdict == self.LEAKED else self.USED), own

    async def end(self, link_id: str) -> None:
        """A leak, or signing out: every session the link started ends and it lets no browser in
        again (its record kept until it expires). One transaction watching the link, so a press
        recorded meanwhile is read again and its session ended too. The sessions are deleted
        first, each alone (their keys hash to other slots than the link's, and a sharded Redis
        takes no MULTI across slots), then the link is marked ended: a failure between leaves
        the link as it was (LEAKED to the next press, which ends it again), never marked ended
        with a session alive. Deleting an ended session again is harmless."""
        key = web_used_link_key(link_id)

        async def finish(pipe: Any) -> None:
            record = self._load(await pipe.get(key))
            if record is None:
                return
            for digest in record["sessions"]:
                await self.redis.delete(web_session_key(digest))
            pipe.multi()
            pipe.set(key, json.dumps(self._ended(record)), xx=True, keepttl=True)

        await self.redis.transaction(finish, key)

    @staticmethod
    def _load(raw: bytes | str | None) -> dict[str, Any] | None:
        """A used link's record: the first browser's hash, when it pressed, its sessions."""
        return None if raw is None else json.loads(raw)

    @staticmethod
    def _ended(record: dict[str, Any]) -> dict[str, Any]:
        """Signed out or leaked: no sessions left (what `_verdict` reads as used)."""
        return {"at": record["at"], "browser": "", "sessions": []}


class ViewerCache:
    """Who a person is, as their platform last said (a JSON record), for `ttl` seconds: a
    page's every request need not ask Slack or Discord again."""

    def __init__(self, redis: Redis, ttl: int = VIEWER_TTL_SECONDS) -> None:
        self.redis = redis
        self.ttl = ttl

    @staticmethod
    def key(platform: str, tenant: str, user: str) -> str:
        return web_viewer_key(_digest(platform, tenant, user))

    async def get(self, platform: str, tenant: str, user: str) -> dict[str, Any] | None:
        raw = await self.redis.get(self.key(platform, tenant, user))
        return json.loads(raw) if raw else None

    async def put(self, platform: str, tenant: str, user: str, record: dict[str, Any]) -> None:
        await self.redis.set(self.key(platform, tenant, user), json.dumps(record), ex=self.ttl)

    async def forget(self, platform: str, tenant: str, user: str) -> None:
        await self.redis.delete(self.key(platform, tenant, user))


class WebState:
    """The memory page's state in one Redis: secret, sessions, used links, viewer cache."""

    def __init__(
        self, redis: Redis, session_ttl: int = SESSION_TTL_SECONDS,
        viewer_ttl: int = VIEWER_TTL_SECONDS,
    ) -> None:  # fmt: skip
        self.secrets = LinkSecrets(redis)
        self.sessions = WebSessions(redis, session_ttl)
        self.used_links = UsedLinks(redis)
        self.viewers = ViewerCache(redis, viewer_ttl)
