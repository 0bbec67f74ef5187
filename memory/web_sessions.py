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
NO_BROWSER = "-"  # a used link's browser when its POST had no sign-in cookie: matches none
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
    by the link's preview page), the hash of the session its press started and when, until the
    link expires, when the signature refuses it anyway.

    A press's verdict: OPEN (unused, or the same browser again within `again_seconds` of the
    first press: a double click, a reply lost to a dropped connection or a router timeout),
    USED (that window has passed, or the link's session was ended), LEAKED (another browser, or
    a request without the cookie, while the first press's session lives: whoever read the link
    in a log pressed it before or after its person, so that session is ended and both are
    refused from then on)."""

    OPEN, USED, LEAKED = "open", "used", "leaked"

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

    @staticmethod
    def _browser(browser: str) -> str:
        """What is kept for the browser of sign-in cookie `browser`; without one, a value no
        browser's hash equals, so nobody's retry matches it."""
        return _digest(browser) if browser else NO_BROWSER

    def _verdict(self, record: dict[str, Any] | None, browser: str, now: float) -> str:
        if record is None:
            return self.OPEN
        if not record["session"]:  # ended: signed out, or leaked
            return self.USED
        if not (browser and hmac.compare_digest(record["browser"], self._browser(browser))):
            return self.LEAKED
        return self.OPEN if now - record["at"] < self.again_seconds else self.USED

    async def check(self, nonce: str, browser: str, now: float) -> str:
        """The verdict on a press by the browser of sign-in cookie `browser`: one read, to
        refuse a used link before anyone is asked who its person is."""
        raw = await self.redis.get(self.key(nonce))
        return self._verdict(self._load(raw), browser, now)

    async def use(
        self, nonce: str, browser: str, session_id: str, now: float, remaining: float
    ) -> bool:
        """Use up the link of `nonce`, valid for `remaining` more seconds, for the browser of
        sign-in cookie `browser` and the session `session_id` its press started: True when the
        verdict is OPEN, the first press recorded, or a press again replacing the session the
        previous one started (which ends). One transaction, so of two browsers at once only one
        wins. Kept `margin` seconds past the link's expiry: another process's clock may run a
        little behind."""
        key = self.key(nonce)

        async def press(pipe: Any) -> tuple[bool, str]:
            raw = await pipe.get(key)
            record = self._load(raw)
            if self._verdict(record, browser, now) != self.OPEN:
                return False, ""
            pressed = {"browser": self._browser(browser), "session": _digest(session_id),
                       "at": record["at"] if record else now}  # fmt: skip
            pipe.multi()
            if record is None:
                pipe.set(key, json.dumps(pressed), ex=max(1, math.ceil(remaining)) + self.margin)
                return True, ""
            pipe.set(key, json.dumps(pressed), keepttl=True)
            return True, record["session"]

        used, replaced = await self.redis.transaction(press, key, value_from_callable=True)
        await self._end_session(replaced)
        return bool(used)

    async def refuse(self, nonce: str, browser: str, now: float) -> str:
        """The verdict on a press that is not let in (USED or LEAKED); when LEAKED, the link is
        kept as ended (one transaction: of two such presses at once, one ends it) and the
        session the first press started ends."""
        key = self.key(nonce)

        async def press(pipe: Any) -> tuple[str, str]:
            raw = await pipe.get(key)
            record = self._load(raw)
            verdict = self._verdict(record, browser, now)
            if verdict != self.LEAKED or record is None:
                return self.USED, ""
            pipe.multi()
            pipe.set(key, json.dumps(self._ended(record)), keepttl=True)
            return self.LEAKED, record["session"]

        verdict, leaked = await self.redis.transaction(press, key, value_from_callable=True)
        await self._end_session(leaked)
        return str(verdict)

    async def _end_session(self, digest: str) -> None:
        """End the session of hash `digest` (one this key's transaction gave up: only its
        caller ends it; a key of its own, so not in that transaction)."""
        if digest:
            await self.redis.delete(web_session_key(digest))

    async def end(self, link_id: str) -> None:
        """Signing out: the link lets no browser in again (its record kept until it expires)."""
        key = web_used_link_key(link_id)
        raw = await self.redis.get(key)
        if raw:
            ended = self._ended(self._load(raw) or {})
            await self.redis.set(key, json.dumps(ended), xx=True, keepttl=True)

    @classmethod
    def _load(cls, raw: bytes | str | None) -> dict[str, Any] | None:
        """A used link's record; one kept before records were JSON (a browser's hash alone,
        for at most the link's hour) reads as ended."""
        if raw is None:
            return None
        try:
            record = json.loads(raw)
        except ValueError:
            record = None
        return record if isinstance(record, dict) else cls._ended({"at": 0.0})

    @staticmethod
    def _ended(record: dict[str, Any]) -> dict[str, Any]:
        return {**record, "browser": NO_BROWSER, "session": ""}


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
