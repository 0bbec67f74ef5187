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
    are logged (a router logs every path with its query), so a link starts sessions in one
    browser only: its nonce, hashed, is kept here with the hash of that browser's sign-in cookie
    (set by the link's preview page), until the link expires, when the signature refuses it
    anyway. The same browser pressing again (a double click, a reply lost to a dropped
    connection or a router timeout, a retried SET whose answer was lost) is let in again; anyone
    else, or a request without the cookie (someone who read the link in a log), is not."""

    def __init__(self, redis: Redis, margin: int = USED_LINK_MARGIN_SECONDS) -> None:
        self.redis = redis
        self.margin = margin

    @staticmethod
    def key(nonce: str) -> str:
        return web_used_link_key(_digest(nonce))

    @staticmethod
    def _browser(browser: str) -> str:
        """What is kept for the browser of sign-in cookie `browser`; without one, a value no
        browser's hash equals, so nobody's retry matches it."""
        return _digest(browser) if browser else NO_BROWSER

    async def usable(self, nonce: str, browser: str) -> bool:
        """Whether the link of `nonce` is still unused or was used by this same browser: one
        read, to refuse a replayed link before anyone is asked who its person is."""
        used_by = await self.redis.get(self.key(nonce))
        return used_by is None or self._same(decode(used_by), browser)

    async def use(self, nonce: str, browser: str, remaining: float) -> bool:
        """Use up the link of `nonce`, valid for `remaining` more seconds, for the browser of
        sign-in cookie `browser`: True the first time (one atomic SET NX, so of two browsers at
        once only one wins) and for the same browser again, False for any other. Kept `margin`
        seconds past the link's expiry: another process's clock may run a little behind."""
        lifetime = max(1, math.ceil(remaining)) + self.margin
        key = self.key(nonce)
        if await self.redis.set(key, self._browser(browser), nx=True, ex=lifetime):
            return True
        used_by = await self.redis.get(key)
        return used_by is not None and self._same(decode(used_by), browser)

    def _same(self, used_by: str, browser: str) -> bool:
        return bool(browser) and hmac.compare_digest(used_by, self._browser(browser))


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
