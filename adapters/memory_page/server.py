"""The memory page's way in: `/memory/login`, sessions, and the guard in front of every page.

- `GET /memory/login?token=…` checks the signed link (`auth.py`) and only shows who it would sign
  in as (the link's own claims: platform, user id, tenant) with a button; it changes nothing.
  The button POSTs the token to `/memory/login`, which checks it again, asks the person's
  platform who they are (`access.py`), uses the link up (`UsedLinks`: a link's address sits in
  the router's logs, so it signs in one browser only), starts a session in Redis and sets its
  cookie (HttpOnly, SameSite=Lax, Path=/memory, Secure under an https public URL), then
  redirects 303 to `/memory`. Which browser: the preview gives it a random sign-in cookie
  (`SIGNIN_COOKIE`, on `/memory/login` only) and the link is used up for that cookie's hash, so
  a press that did not finish (a double click, a dropped connection, a router timeout) can be
  pressed again in the same browser within two minutes (each press's session lives on). A first
  press without that cookie is shown the preview again, which sets it. A used link is refused
  before the platform is asked; pressed again by a browser holding a session the link started (a
  second tab, Back), it leads to `/memory`; pressed by another browser (or one without the
  cookie, as from a log) while its sessions live, a warning is logged, they all end and both
  browsers are refused from then on: whoever read the link in a log and pressed first is signed
  out by the person's own press. Signing out ends the link and its sessions too. Two steps so
  that a link someone else sends you cannot sign your browser in as them (login CSRF): opening
  it asks first, and the preview can be opened again (link scanners fetch it). A missing,
  altered, forged or expired link is a 403 page that says how to get a new one, on either step;
  so is a used one, on the POST.
- Every other `/memory…` request passes the middleware: without a live session, a 401 page;
  with one, `request[VIEWER]` (a `Viewer`) and `request[CSRF]` (`viewer.py`). A request that changes
  anything (any method but GET and HEAD) has its form read here, before the handler, at most
  1 MB (aiohttp's default), and is refused 403 unless its `csrf` field is the session's token.
  An import's form (`POST /memory/import`, a file of up to 64 MB) is read only for an admin, and
  here only as far as its first field, the token: its handler streams the file to disk. Who the
  viewer is is asked again every few minutes (the platform's answer is cached), so someone who
  left a private channel stops seeing it within minutes, not at the session's end. Signing out
  is not asked about (only its CSRF token is checked): it must work while the platform is down.
- A form's message ("Forgotten: 3 messages.") is kept in the session's record by the POST that
  redirects (`Flashed`) and shown, then cleared, by the next page: never read from the address,
  where anyone could write text onto the real page.
- Failures end in a short page, never a trace: the platform rate limiting or refusing our token,
  Redis unreachable (503), an unexpected error (500, logged).
"""

from __future__ import annotations

import html
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web
from yarl import URL

from adapters.memory_page.access import Directory, DirectoryError, viewer_of, viewer_record
from adapters.memory_page.auth import (
    LOGIN_PATH,
    InvalidLink,
    LinkClaims,
    Links,
    new_csrf,
    same_csrf,
)
from adapters.memory_page.viewer import CSRF, IMPORT_FORM, SESSION, VIEWER
from memory.errors import memory_unavailable
from memory.manager import MemoryManager
from memory.web_sessions import UsedLinks, WebState

log = logging.getLogger(__name__)

PREFIX = "/memory"
LOGOUT_PATH = "/memory/logout"
SESSION_COOKIE = "arxivscout_memory"
SIGNIN_COOKIE = "arxivscout_signin"  # which browser pressed a link's button (UsedLinks)
VIEWER_REFRESH_SECONDS = 300
IMPORT_PATH = "/memory/import"
MB = 1024 * 1024
FORM_BYTES = MB  # a form's most (aiohttp's default): each of an import's small fields too
MAX_IMPORT_BYTES = 64 * MB  # an import's file, streamed to disk by its handler (an admin's)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
ASK_AGAIN = (
    "Type <code>/memory</code> in Slack or Discord for a new link (on the server, "
    "<code>arxivscout web --link</code> prints one)."
)
HEADERS = {  # every /memory answer: private, not framed, no referrer, no script
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' "
    "data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PLATFORMS = {"slack": "Slack", "discord": "Discord", "local": "local"}
FLASH = web.RequestKey("flash", dict)  # {"done": …} or {"error": …}: the page shows it once


class Flashed(web.HTTPSeeOther):
    """A form's redirect with a message for the next page: the guard keeps `flash` in the
    session, the next page view shows it and clears it."""

    def __init__(self, location: str, **flash: str) -> None:
        super().__init__(location)
        self.flash = {k: v for k, v in flash.items() if v}


def under_page(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


BACK = f'<p><a href="{PREFIX}">Back to the memory page</a></p>'


def notice(
    status: int, title: str, message_html: str, back: bool = False, extra_html: str = "",
    **headers: str,
) -> web.Response:  # fmt: skip
    """A short page of its own (no template: it must show when everything else fails);
    `message_html` and `extra_html` (after the message: a form) are trusted markup, `title` is
    escaped; `back` adds a link to `/memory` (for a signed-in person: without a session it
    would only answer 401 again)."""
    body = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{html.escape(title)} · ArxivScout memory</title><style>body{{font:16px/1.5 "
        "system-ui,sans-serif;color:#1f2328;max-width:40rem;margin:3rem auto;padding:0 1rem}"
        "h1{font-size:1.4rem}code{background:#f6f8fa;padding:0 .25em;border-radius:4px}"
        "button{font:inherit;padding:.4rem 1rem}"
        f"</style></head><body><main><h1>{html.escape(title)}</h1><p>{message_html}</p>"
        f"{extra_html}{BACK if back else ''}</main></body></html>"
    )
    return web.Response(status=status, text=body, content_type="text/html", headers=headers)


def refused(exc: DirectoryError, signed_in: bool) -> web.Response:
    """The platform's failure as a page: a way back to `/memory` only for a signed-in person
    and a failure that may pass or be mended (5xx); a signed-out one's would answer 401."""
    headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after else {}
    title = "Try again shortly" if exc.status == 503 else "Cannot open the memory page"
    back = signed_in and exc.status >= 500
    return notice(exc.status, title, html.escape(exc.message), back=back, **headers)


def unavailable() -> web.Response:
    return notice(503, "Memory is unavailable", "ArxivScout cannot reach its memory (Redis) "
                  "right now. Try again in a minute.", back=True,
                  **{"Retry-After": "30"})  # fmt: skip


def too_large() -> web.Response:
    return notice(413, "Too large", f"A form may be at most {FORM_BYTES // MB} MB.", back=True)


def unreadable() -> web.Response:
    return notice(400, "Unreadable form", "The form could not be read. Try again.", back=True)


def bad_link(exc: InvalidLink) -> web.Response:
    title = "This link has expired" if exc.reason == "expired" else "This link is not valid"
    return notice(403, title, f"{html.escape(exc.problem)} {ASK_AGAIN}")


FRESH_LOCAL_LINK = (
    "While the page runs, <code>arxivscout web --link</code> (with its <code>--tenant</code> "
    "and <code>--port</code>) prints a new one without restarting it."
)


def used_link(platform: str) -> web.Response:
    """A link already used (by another browser, or by this one more than a couple of minutes
    ago, or signed out of); the terminal's person is told how to get a new one without
    restarting the page."""
    more = f" {FRESH_LOCAL_LINK}" if platform == "local" else ""
    return notice(403, "This link was already used",
                  f"This link was already used. {ASK_AGAIN}{more}")  # fmt: skip


def leaked_link(platform: str) -> web.Response:
    """A link pressed by a second browser while the session the first started lived: that
    session has just been ended, whoever held it."""
    more = f" {FRESH_LOCAL_LINK}" if platform == "local" else ""
    return notice(403, "This link was used by another browser", "This link was used by another "
                  "browser: the session it started has been ended. Ask for a new link with "
                  f"<code>/memory</code>.{more}")  # fmt: skip


def _origin(url: str) -> str | None:
    """scheme://host[:port] of an absolute URL; None for anything else ("null" included)."""
    try:
        parsed = URL(url)
        return str(parsed.origin()) if parsed.absolute else None
    except ValueError:
        return None


def signed_out(status: int = 401) -> web.Response:
    return notice(status, "Please sign in again", "You are not signed in, or your session "
                  f"has ended. {ASK_AGAIN}")  # fmt: skip


class Access:
    """Sign-in, sign-out and the guard of every page, over the sessions kept in Redis."""

    def __init__(self, state: WebState, links: Links, directory: Directory) -> None:
        self.state = state
        self.links = links
        self.directory = directory

    async def login_page(self, request: web.Request) -> web.StreamResponse:
        """GET: who the link would sign in as (its claims only: nobody's name is looked up),
        and a button that POSTs the token. Nothing changes here, so a link sent by someone
        else, or fetched by a link preview, signs nobody in."""
        token = request.query.get("token", "")
        try:
            claims = self.links.signer.verify(token)
        except InvalidLink as exc:
            return bad_link(exc)
        return self._preview(request, token, claims)

    def _preview(
        self, request: web.Request, token: str, claims: LinkClaims, again: bool = False
    ) -> web.Response:
        """The link's page with its button, giving this browser its sign-in cookie; `again`
        when a press came without that cookie and is to be made once more."""
        platform = PLATFORMS.get(claims.platform, claims.platform)
        message = (
            f"This link opens the memory page as {html.escape(platform)} user "
            f"<code>{html.escape(claims.user)}</code> in <code>{html.escape(claims.tenant)}</code>."
            " Continue only if it is your own link: it signs in one browser, and this browser's "
            "current memory-page session, if any, ends."
        )
        if again:
            message += " This browser had not opened this page before: press the button again."
        form = (
            f'<form method="post" action="{LOGIN_PATH}"><input type="hidden" name="token" '
            f'value="{html.escape(token)}"><button type="submit">Open my memory</button></form>'
        )
        # same-origin, not no-referrer: under no-referrer the button's POST says `Origin: null`
        response = notice(200, "Open your ArxivScout memory", message, extra_html=form,
                          **{"Referrer-Policy": "same-origin"})  # fmt: skip
        self._mark_browser(request, response)
        return response

    def _mark_browser(self, request: web.Request, response: web.StreamResponse) -> None:
        """Give this browser its sign-in cookie, keeping the value it has (set again only to
        last the link's lifetime from now). SameSite=Lax, not Strict: opening the link from
        Slack or Discord is a cross-site navigation, which would not send a Strict cookie, so a
        person whose first press was lost and who opens the link again would get a new value
        and be refused; Lax still keeps it off other sites' POSTs."""
        browser = request.cookies.get(SIGNIN_COOKIE) or secrets.token_urlsafe(32)
        response.set_cookie(
            SIGNIN_COOKIE, browser, max_age=self.links.ttl, path=LOGIN_PATH, httponly=True,
            samesite="Lax", secure=self.links.secure,
        )  # fmt: skip

    def same_site(self, request: web.Request) -> bool:
        """Whether the sign-in POST came from a page of this site (the login page's button).

        The token proves who; this proves that the person's own browser chose to send it, so an
        attacker's page cannot auto-submit the attacker's token and sign a visitor in as the
        attacker (no session exists yet, so there is no CSRF token to check). Browsers send
        `Origin` on every form POST (`Referer` is the fallback): it must be this site, as the
        public URL names it or as the browser addressed it (`Host`); "null" and other sites are
        refused. A request with neither header is not a browser's form, so cannot be forged
        this way, and is let through (scripts and tests)."""
        sent = request.headers.get("Origin") or request.headers.get("Referer")
        if sent is None:
            return True
        ours = {_origin(self.links.public_url), _origin(f"{request.scheme}://{request.host}")}
        return _origin(sent) in ours - {None}

    async def login(self, request: web.Request) -> web.StreamResponse:
        """POST: the token again, then a session of its own, replacing this browser's. A used
        link is refused before the platform is asked (one Redis read); it is used up
        (atomically) only once its person is known, so a rate limit or an outage leaves it
        usable, and the same browser pressing again within minutes signs in again."""
        if not self.same_site(request):
            return notice(403, "This sign-in cannot be sent", "It did not come from this "
                          f"site's own sign-in page. Open your link again. {ASK_AGAIN}")  # fmt: skip
        try:
            form = await request.post()
        except ValueError:
            return notice(400, "Unreadable form", f"The form could not be read. {ASK_AGAIN}")
        token = form.get("token")
        try:
            claims = self.links.signer.verify(token if isinstance(token, str) else "")
        except InvalidLink as exc:
            return bad_link(exc)
        browser = request.cookies.get(SIGNIN_COOKIE, "")
        used_links, sessions = self.state.used_links, self.state.sessions
        try:
            verdict = await used_links.check(claims.nonce, browser, self.links.signer.clock())
            if verdict != UsedLinks.OPEN:
                return await self._used(request, claims, browser)
            if not browser:  # not known as a browser yet: a press would make no retry its own
                return self._preview(request, str(token), claims, again=True)
            viewer = await self.directory.viewer(claims.tenant, claims.user, claims.platform)
            session = await sessions.create(
                {"viewer": viewer_record(viewer), "csrf": new_csrf(), "resolved_at": time.time(),
                 "created_at": time.time(), "link": used_links.link_id(claims.nonce)}
            )  # fmt: skip
            now = self.links.signer.clock()
            if not await used_links.use(claims.nonce, browser, session, now, claims.expires - now):
                await sessions.delete(session)  # another press won meanwhile
                return await self._used(request, claims, browser)
            await sessions.delete(request.cookies.get(SESSION_COOKIE, ""))
        except DirectoryError as exc:
            return refused(exc, signed_in=False)  # not as the link's person, at least
        except Exception as exc:
            if memory_unavailable(exc):
                return unavailable()
            raise
        log.info("memory page: %s %s of %s signed in", claims.platform, claims.user, claims.tenant)
        response = web.Response(status=303, headers={"Location": PREFIX})
        response.set_cookie(
            SESSION_COOKIE, session, max_age=self.state.sessions.ttl, path=PREFIX,
            httponly=True, samesite="Lax", secure=self.links.secure,
        )  # fmt: skip
        return response

    async def _used(self, request: web.Request, claims: LinkClaims, browser: str) -> web.Response:
        """A link this press may not use. Pressed by a second browser while the sessions the
        link started live: a warning is logged, then they all end (`UsedLinks.end`). A browser
        holding one of those sessions (a second tab, Back) goes on to `/memory` (signed out if
        the link leaked); any other gets a page saying the link was used."""
        used_links = self.state.used_links
        verdict, own = await used_links.refused(
            claims.nonce, browser, request.cookies.get(SESSION_COOKIE, ""),
            self.links.signer.clock(),
        )  # fmt: skip
        if verdict == UsedLinks.LEAKED:
            log.warning("memory page: a sign-in link of %s %s of %s was pressed by a second "
                        "browser (it may have been read from a log): the sessions it started "
                        "are ended", claims.platform, claims.user, claims.tenant)  # fmt: skip
            await used_links.end(used_links.link_id(claims.nonce))
        if own:
            return web.Response(status=303, headers={"Location": PREFIX})
        if verdict == UsedLinks.LEAKED:
            return leaked_link(claims.platform)
        log.info("memory page: a used link of %s %s of %s was sent again",
                 claims.platform, claims.user, claims.tenant)  # fmt: skip
        return used_link(claims.platform)

    async def logout(self, request: web.Request) -> web.StreamResponse:
        """End the session, and the link that started it for this browser too: its sign-in
        cookie goes and the link lets no browser in again."""
        record = await self.state.sessions.get(request[SESSION])
        await self.state.sessions.delete(request[SESSION])
        if record is not None and record.get("link"):
            await self.state.used_links.end(record["link"])
        response = notice(200, "Signed out", f"This browser's session has ended. {ASK_AGAIN}")
        response.del_cookie(SESSION_COOKIE, path=PREFIX)
        response.del_cookie(SIGNIN_COOKIE, path=LOGIN_PATH)
        return response

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not under_page(request.path) or request.path == LOGIN_PATH:
            return await handler(request)
        try:
            return await self._guarded(request, handler)
        except web.HTTPException:
            raise  # the handler's own redirects and errors
        except DirectoryError as exc:
            return refused(exc, signed_in=True)  # raised only past the session's check
        except Exception as exc:
            if memory_unavailable(exc):
                return unavailable()
            log.exception("memory page: %s %s failed", request.method, request.path)
            return notice(500, "Something went wrong", "The error was logged for whoever runs "
                          "ArxivScout. Go back and try again.", back=True)  # fmt: skip

    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        session = request.cookies.get(SESSION_COOKIE, "")
        record = await self.state.sessions.get(session)
        if record is None:
            return signed_out()
        if request.path != LOGOUT_PATH:  # signing out asks nobody: it works while they are down
            record = await self._fresh(session, record)
        viewer = viewer_of(record["viewer"])
        if request.method not in SAFE_METHODS:  # the token is checked before the handler runs
            request = request.clone(client_max_size=FORM_BYTES)
            if request.path == IMPORT_PATH:
                given = await self._import_token(request, viewer.admin)
            else:
                given = await self._form_token(request)
            if isinstance(given, web.Response):
                return given
            if not same_csrf(record["csrf"], given):
                return notice(403, "This form cannot be sent", "Its security token is missing "
                              "or out of date. Reload the page and try again.",
                              back=True)  # fmt: skip
        if request.method == "GET" and "flash" in record:  # shown once, by this page
            request[FLASH] = record["flash"] or {}
            record = {k: v for k, v in record.items() if k != "flash"}
            await self.state.sessions.update(session, record)
        request[VIEWER] = viewer
        request[CSRF] = record["csrf"]
        request[SESSION] = session
        try:
            return await handler(request)
        except Flashed as redirect:
            await self._keep_flash(session, redirect.flash)
            raise

    @staticmethod
    async def _form_token(request: web.Request) -> str | web.Response | None:
        """A form's CSRF token (the form read whole, at most FORM_BYTES), or a page refusing
        the form."""
        try:
            form = await request.post()
        except web.HTTPRequestEntityTooLarge:
            return too_large()
        except ValueError:
            return unreadable()
        given = form.get("csrf")
        return given if isinstance(given, str) else None

    @staticmethod
    async def _import_token(request: web.Request, admin: bool) -> str | web.Response | None:
        """An import's CSRF token, the first field of its multipart form (the page's form sends
        it first), or a page refusing the import. Only an admin's upload is read at all: anyone
        else's is refused unread. The handler streams the rest of the form (`IMPORT_FORM`)."""
        if not admin:
            return notice(403, "Not allowed", "Only an admin of this workspace may import an "
                          "export into it.", back=True)  # fmt: skip
        if request.content_type != "multipart/form-data":
            return None
        try:
            reader = await request.multipart()
            first = await reader.next()
            if not isinstance(first, BodyPartReader) or first.name != "csrf":
                return None
            given = await first.text()  # at most FORM_BYTES
        except web.HTTPRequestEntityTooLarge:
            return too_large()
        except ValueError:
            return unreadable()
        request[IMPORT_FORM] = reader
        return given

    async def _keep_flash(self, session: str, flash: dict[str, str]) -> None:
        """Put a form's message in the session (read afresh: the handler may have run long)."""
        record = await self.state.sessions.get(session)
        if record is not None and flash:
            await self.state.sessions.update(session, {**record, "flash": flash})

    async def _fresh(self, session: str, record: dict[str, Any]) -> dict[str, Any]:
        """The session's record, with who its person is asked again when that is older than
        a few minutes."""
        if time.time() - float(record.get("resolved_at") or 0) < VIEWER_REFRESH_SECONDS:
            return record
        was = viewer_of(record["viewer"])
        viewer = await self.directory.viewer(was.tenant, was.user, was.platform)
        record = {**record, "viewer": viewer_record(viewer), "resolved_at": time.time()}
        await self.state.sessions.update(session, record)
        return record

    @staticmethod
    async def headers(request: web.Request, response: web.StreamResponse) -> None:
        """on_response_prepare: the page's headers, on streamed answers (exports) too."""
        if under_page(request.path):
            for name, value in HEADERS.items():
                response.headers.setdefault(name, value)


@dataclass
class MemoryPage:
    """What `build_web_app` mounts: routes, the guard, a response hook and what to close."""

    routes: list[web.RouteDef]
    middlewares: list[Any]
    on_prepare: Callable[[web.Request, web.StreamResponse], Awaitable[None]]
    cleanup: list[Callable[[], Awaitable[Any]]] = field(default_factory=list)


def memory_page(
    memory: MemoryManager, links: Links, directory: Directory, *,
    pages: list[web.RouteDef] | None = None, state: WebState | None = None,
    cleanup: list[Callable[[], Awaitable[Any]]] | None = None,
) -> MemoryPage:  # fmt: skip
    """The memory page over `memory`: `pages` are its pages (default: `pages.page_routes`),
    behind sign-in by `links` and the viewers `directory` resolves."""
    if pages is None:
        from adapters.memory_page.pages import page_routes

        pages = page_routes(memory)
    access = Access(state or WebState(memory.redis), links, directory)
    routes = [
        web.get(LOGIN_PATH, access.login_page), web.post(LOGIN_PATH, access.login),
        web.post(LOGOUT_PATH, access.logout), *pages,
    ]  # fmt: skip
    return MemoryPage(routes, [access.middleware], access.headers, list(cleanup or []))
