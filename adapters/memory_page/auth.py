"""Signed links to the memory page, and the CSRF tokens of its sessions.

A link names one person on one platform in one tenant, until it expires:
`{public_url}/memory/login?token=v1.<payload>.<signature>`, the payload being base64url JSON
(tenant, user, platform, expiry, nonce) and the signature HMAC-SHA256 over it with the secret
(ARXIVSCOUT_SECRET, or one made once and kept in Redis so every process agrees).

A link signs in one browser: its address, query and all, is written in the router's logs
(Heroku's, a log drain), where someone else could read it within its hour, so the POST that
turns it into a session uses up its nonce for the browser that pressed it, known by the cookie
its preview set (`memory.web_sessions.UsedLinks`, server.py); a second browser pressing it ends
the session it started. Opening it (the GET that shows who
it signs in as) signs nobody in and may be repeated: link scanners and previews fetch a URL
before the person does. A second browser or the phone asks for a new link with /memory (the
terminal's person runs `arxivscout web --link`).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from memory.web_sessions import LinkSecrets

log = logging.getLogger(__name__)

VERSION = "v1"
DEFAULT_LINK_TTL = 3600
LOGIN_PATH = "/memory/login"
NOT_SERVED = "The memory page is not served by this ArxivScout (ask whoever runs it)."
ASK_AGAIN = (  # plain words: the page shows its own markup (server.ASK_AGAIN)
    "Ask for a new link: type /memory in Slack or Discord (or, on the server, run arxivscout web --link)."
)


class InvalidLink(Exception):
    """A link that opens nothing: `reason` is "missing", "expired" or "invalid" (forged, cut
    short or altered); `problem` says what is wrong with it, `advice` that and what to do."""

    def __init__(self, reason: str, problem: str) -> None:
        self.reason = reason
        self.problem = problem
        self.advice = f"{problem} {ASK_AGAIN}"
        super().__init__(f"{reason}: {self.advice}")


@dataclass(frozen=True, slots=True)
class LinkClaims:
    """What a valid link says: who, where, until when."""

    tenant: str
    user: str
    platform: str  # "slack", "discord" or "local"
    expires: float
    nonce: str


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class LinkSigner:
    """Signs and checks link tokens with one secret; `ttl` is how long a link lasts."""

    def __init__(
        self, secret: str | bytes, ttl: int = DEFAULT_LINK_TTL,
        clock: Callable[[], float] = time.time,
    ) -> None:  # fmt: skip
        if not secret:
            raise ValueError("a link secret is needed")
        self._key = secret.encode() if isinstance(secret, str) else secret
        self.ttl = ttl
        self.clock = clock

    def _signature(self, signed: str) -> str:
        return _b64(hmac.new(self._key, signed.encode(), hashlib.sha256).digest())

    def sign(self, tenant: str, user: str, platform: str) -> str:
        claims = {"t": tenant, "u": user, "p": platform, "e": int(self.clock() + self.ttl),
                  "n": secrets.token_urlsafe(9)}  # fmt: skip
        signed = f"{VERSION}.{_b64(json.dumps(claims, separators=(',', ':')).encode())}"
        return f"{signed}.{self._signature(signed)}"

    def verify(self, token: str) -> LinkClaims:
        """The link's claims; InvalidLink when it is missing, altered, forged or expired."""
        if not token:
            raise InvalidLink("missing", "This address has no sign-in token.")
        version, _, rest = token.partition(".")
        payload, _, signature = rest.partition(".")
        invalid = InvalidLink(
            "invalid",
            "This link is not valid: it was changed, cut short when copied, or not made by "
            "this ArxivScout.",
        )
        # a link is ASCII (base64url and dots): anything else was altered, and is refused here
        # (compare_digest takes no non-ASCII text: a TypeError, a bare 500)
        if not token.isascii() or version != VERSION or not payload or not signature:
            raise invalid
        if not hmac.compare_digest(self._signature(f"{version}.{payload}"), signature):
            raise invalid
        try:
            data = json.loads(_unb64(payload))
            claims = LinkClaims(str(data["t"]), str(data["u"]), str(data["p"]),
                                float(data["e"]), str(data["n"]))  # fmt: skip
        except (ValueError, KeyError, TypeError, binascii.Error):
            raise invalid from None
        if claims.expires <= self.clock():
            minutes = max(1, self.ttl // 60)
            raise InvalidLink("expired", f"This link has expired (links last {minutes} minutes).")
        return claims


class Links:
    """Addresses on the memory page: a person's sign-in link, and pages under the public URL."""

    def __init__(self, signer: LinkSigner, public_url: str) -> None:
        self.signer = signer
        self.public_url = public_url.rstrip("/")

    @property
    def ttl(self) -> int:
        return self.signer.ttl

    @property
    def secure(self) -> bool:
        """Cookies are Secure when the page is served over https."""
        return self.public_url.startswith("https://")

    def login(self, tenant: str, user: str, platform: str) -> str:
        token = self.signer.sign(tenant, user, platform)
        return f"{self.public_url}{LOGIN_PATH}?token={quote(token, safe='')}"

    def page(self, path: str) -> str:
        """`path` ("/memory/...") on the public URL."""
        return f"{self.public_url}{path}"


def new_csrf() -> str:
    return secrets.token_urlsafe(32)


def same_csrf(expected: str, given: str | None) -> bool:
    return bool(expected) and hmac.compare_digest(expected.encode(), (given or "").encode())


async def link_secret(configured: str | None, shared: LinkSecrets) -> str:
    """ARXIVSCOUT_SECRET, or the secret kept in Redis (made now if no process made it yet)."""
    if configured:
        return configured
    secret, created = await shared.shared()
    log.warning(
        "ARXIVSCOUT_SECRET is not set: memory-page links are signed with a random secret %s "
        "Redis (every process sharing it agrees; set ARXIVSCOUT_SECRET to choose your own).",
        "just made and kept in" if created else "kept in",
    )
    return secret
