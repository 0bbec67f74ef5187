"""Signing in and out of the memory page when it matters most: a link read from the router's
logs, a platform that cannot answer, a process without the platform's token. Real HTTP, real
Redis; the directory is a stand-in whose answers the test changes (as Slack's would change)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, TypeVar
from urllib.parse import urlsplit

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from adapters.memory_page.access import (
    Directories,
    DirectoryError,
    DiscordDirectory,
    viewer_record,
)
from adapters.memory_page.auth import Links, new_csrf
from adapters.memory_page.server import (
    LOGOUT_PATH,
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    memory_page,
)
from adapters.memory_page.viewer import Viewer
from adapters.web import build_web_app
from memory.web_sessions import (
    PRESS_AGAIN_SECONDS,
    USED_LINK_MARGIN_SECONDS,
    UsedLinks,
    WebSessions,
    WebState,
)
from tests.support.memory_page_sessions import due_to_ask_again, session_of
from tests.test_memory_access import (
    Clock,
    People,
    page_client,
    press_link,
    probe_routes,
    token_of,
)

BACK = '<a href="/memory">Back to the memory page</a>'
USED = "This link was already used. Type <code>/memory</code> in Slack or Discord"
LEAKED = (
    "This link was used by another browser: the session it started has been ended. Ask for a "
    "new link with <code>/memory</code>."
)


Directory = TypeVar("Directory", bound=People)


class Unsteady(People):
    """People, or the platform's failure while `down` is set (a rate limit, an outage)."""

    def __init__(self) -> None:
        super().__init__()
        self.down: DirectoryError | None = None

    async def viewer(self, tenant: str, user: str, platform: str) -> Viewer:
        if self.down is not None:
            self.asked += 1
            raise self.down
        return await super().viewer(tenant, user, platform)


def knowing_u1(people: Directory, tenant: str, **viewer: Any) -> Directory:
    """The directory `people`, now knowing U1 as a Slack member of `tenant`."""
    people.known["U1"] = Viewer(tenant, "U1", "slack", **viewer)
    return people


@asynccontextmanager
async def page_and_browser(
    memory, people: People, clock: Clock | None = None
) -> AsyncIterator[tuple[TestClient, Links, aiohttp.ClientSession]]:
    """The page's client (its person's browser, which keeps its cookies), its links, and
    another browser, which keeps no cookie from an answer (see `press_as`)."""
    async with (
        page_client(memory, people, clock=clock) as (client, links, _),
        aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as browser,
    ):
        yield client, links, browser


async def previewed_link(client: TestClient, links: Links, tenant: str) -> tuple[str, str]:
    """U1's new link's token, and the sign-in cookie its preview gave the person's browser."""
    link = links.login(tenant, "U1", "slack")
    return token_of(link), await preview(client, link)


async def press(client: TestClient, token: str) -> aiohttp.ClientResponse:
    """The sign-in page's button: the POST that turns the link into a session."""
    return await client.post("/memory/login", data={"token": token}, allow_redirects=False)


async def preview(client: TestClient, link: str) -> str:
    """Open the link (its page with the button): the sign-in cookie it gives this browser."""
    url = urlsplit(link)
    response = await client.get(f"{url.path}?{url.query}")
    assert response.status == 200 and "Open my memory" in await response.text()
    return response.cookies[SIGNIN_COOKIE].value


async def press_as(
    browser: aiohttp.ClientSession, client: TestClient, token: str, **cookies: str
) -> aiohttp.ClientResponse:
    """The button pressed by a browser that keeps no cookie from the answer (`cookies` are
    what it sends): as when the answer never reaches it."""
    sent = "; ".join(f"{name}={value}" for name, value in cookies.items())
    return await browser.post(client.make_url("/memory/login"), data={"token": token},
                              headers={"Cookie": sent} if sent else {},
                              allow_redirects=False)  # fmt: skip


async def test_a_link_starts_one_session_and_its_preview_stays_repeatable(memory, tenant):
    """A link copied from `heroku logs` after its person used it opens nothing, and ends the
    session it started: a copy pressed before the person would have had it."""
    people = knowing_u1(Unsteady(), tenant, name="Ada")
    clock = Clock()
    async with page_client(memory, people, clock=clock) as (client, links, _):
        link = urlsplit(links.login(tenant, "U1", "slack"))
        token = token_of(link.geturl())
        for _ in range(2):  # a link preview, then the person: nothing is used up
            response = await client.get(f"{link.path}?{link.query}")
            assert response.status == 200 and "Open my memory" in await response.text()

        # the platform cannot answer: the link is not used up, the person tries again
        people.down = DirectoryError("Slack asks ArxivScout to slow down.", retry_after=7)
        response = await press(client, token)
        assert response.status == 503 and "Set-Cookie" not in response.headers
        people.down = None
        clock.now += 1800  # half the link's hour has gone
        response = await press(client, token)
        assert response.status == 303 and response.headers["Location"] == "/memory"
        session = session_of(client)
        nonce = links.signer.verify(token).nonce
        # the link's rest, and a margin for another process's clock running behind
        assert (
            1800 < await memory.redis.ttl(UsedLinks.key(nonce)) <= 1800 + USED_LINK_MARGIN_SECONDS
        )

        # whoever read the link elsewhere: refused before Slack is asked anything, no session
        # starts, and the link's session ends; from then on every browser is refused
        asked = people.asked
        async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as stranger:
            response = await press_as(stranger, client, token)
            page = await response.text()
            assert response.status == 403 and LEAKED in page, page
            assert "Set-Cookie" not in response.headers and "--link" not in page
            assert not await memory.redis.exists(WebSessions.key(session))
            for cookies in ({}, {SIGNIN_COOKIE: "another-browser"}):
                response = await press_as(stranger, client, token, **cookies)
                assert response.status == 403 and USED in await response.text()
        assert people.asked == asked
        response = await press(client, token)  # the person's own browser, within the minutes
        assert response.status == 403 and USED in await response.text()
        response = await client.get(f"{link.path}?{link.query}")  # the preview still shows
        assert response.status == 200 and "Open my memory" in await response.text()
        assert (await client.get("/memory")).status == 401


async def test_a_link_pressed_first_by_someone_reading_the_logs_is_ended_by_its_person(
    memory, tenant, caplog
):
    """Whoever reads the router's log live may press the link before its person: the person's
    own press then ends that session, says so, and a warning (without the token) is logged."""
    people = knowing_u1(People(), tenant)
    async with page_and_browser(memory, people) as (client, links, attacker):
        link = links.login(tenant, "U1", "slack")
        token = token_of(link)
        taken = await press_as(attacker, client, token, **{SIGNIN_COOKIE: "attackers"})
        assert taken.status == 303
        stolen = taken.cookies[SESSION_COOKIE].value
        await preview(client, link)
        response = await press(client, token)
        page = await response.text()
        assert response.status == 403 and LEAKED in page and SESSION_COOKIE not in response.cookies
        assert not await memory.redis.exists(WebSessions.key(stolen))
        answer = await attacker.get(client.make_url("/memory"),
                                    headers={"Cookie": f"{SESSION_COOKIE}={stolen}"})  # fmt: skip
        assert answer.status == 401
        warned = [r for r in caplog.records if r.levelname == "WARNING" and "second" in r.message]
        assert len(warned) == 1 and token not in warned[0].message
        assert "U1" in warned[0].message
        response = await press_as(attacker, client, token)  # and again: refused, nothing starts
        assert response.status == 403 and USED in await response.text()


async def test_the_preview_gives_its_browser_one_sign_in_cookie(memory, tenant):
    """Opened again (a second tab, the link tapped again after a lost press), the preview keeps
    the browser's value: its press is still known as this browser's."""
    people = knowing_u1(People(), tenant)
    for public_url in ("http://127.0.0.1", "https://scout.example.com"):
        async with page_client(memory, people, public_url=public_url) as (client, links, _):
            link = urlsplit(links.login(tenant, "U1", "slack"))
            first = await client.get(f"{link.path}?{link.query}")
            again = await client.get(f"{link.path}?{link.query}")
            cookie = again.headers["Set-Cookie"]
            assert "HttpOnly" in cookie and "Path=/memory/login" in cookie
            assert "SameSite=Lax" in cookie and SESSION_COOKIE not in cookie
            assert ("Secure" in cookie) == public_url.startswith("https")
            if not public_url.startswith("https"):  # the test's http server: sent back
                assert again.cookies[SIGNIN_COOKIE].value == first.cookies[SIGNIN_COOKIE].value


async def test_a_press_that_did_not_finish_can_be_pressed_again_in_the_same_browser(memory, tenant):
    """A double click, a dropped connection, a router timeout: the first press used the link
    up but its answer (the session's cookie) never arrived. The same browser, known by the
    cookie its preview set, presses again and is signed in; another browser is not."""
    people = knowing_u1(People(), tenant)
    async with page_and_browser(memory, people) as (client, links, browser):
        token, signin = await previewed_link(client, links, tenant)
        lost = await press_as(browser, client, token, **{SIGNIN_COOKIE: signin})
        assert lost.status == 303  # used up: its answer is thrown away, as if never received
        again = await press_as(browser, client, token, **{SIGNIN_COOKIE: signin})
        assert again.status == 303 and again.headers["Location"] == "/memory"
        session = again.cookies[SESSION_COOKIE].value
        assert session != lost.cookies[SESSION_COOKIE].value
        # the press that was lost started a session nobody holds: it ends with the link
        assert await memory.redis.exists(WebSessions.key(lost.cookies[SESSION_COOKIE].value))
        assert (await browser.get(client.make_url("/memory"),
                                  headers={"Cookie": f"{SESSION_COOKIE}={session}"})).status == 200  # fmt: skip

        # a double click: two presses at once from that browser both sign in
        answers = await asyncio.gather(
            *(press_as(browser, client, token, **{SIGNIN_COOKIE: signin}) for _ in range(2))
        )
        assert [a.status for a in answers] == [303, 303]
        other = await press_as(browser, client, token, **{SIGNIN_COOKIE: "x" + signin})
        assert other.status == 403 and LEAKED in await other.text()
        started = [lost, again, *answers]
        for answer in started:
            assert not await memory.redis.exists(
                WebSessions.key(answer.cookies[SESSION_COOKIE].value)
            )


async def test_the_same_browser_may_press_a_used_link_again_only_for_two_minutes(memory, tenant):
    """After the double-click and lost-answer window, a sign-in cookie planted in someone's
    browser no longer replays the link; a browser signed in as its person still goes on."""
    people = knowing_u1(People(), tenant)
    clock = Clock()
    async with page_and_browser(memory, people, clock=clock) as (client, links, browser):
        token, signin = await previewed_link(client, links, tenant)
        first = await press_as(browser, client, token, **{SIGNIN_COOKIE: signin})
        assert first.status == 303
        clock.now += PRESS_AGAIN_SECONDS - 1
        again = await press_as(browser, client, token, **{SIGNIN_COOKIE: signin})
        assert again.status == 303
        clock.now += 2  # past the window since the first press
        late = await press_as(browser, client, token, **{SIGNIN_COOKIE: signin})
        assert late.status == 403 and USED in await late.text()
        session = again.cookies[SESSION_COOKIE].value
        signed_in = {SIGNIN_COOKIE: signin, SESSION_COOKIE: session}
        response = await press_as(browser, client, token, **signed_in)
        assert response.status == 303 and response.headers["Location"] == "/memory"
        assert await memory.redis.exists(WebSessions.key(session))  # not taken for a leak


async def test_a_planted_sign_in_cookie_opens_only_a_few_sessions_within_the_window(memory, tenant):
    """Within the two minutes, the link's browser may press again, but only up to
    MAX_PRESSES sessions: a cookie planted in someone's browser cannot open sessions without
    end, and the link's record stays short."""
    people = knowing_u1(People(), tenant)
    async with page_and_browser(memory, people) as (client, links, browser):
        token, signin = await previewed_link(client, links, tenant)
        for _ in range(UsedLinks.MAX_PRESSES):
            pressed = await press_as(browser, client, token, **{SIGNIN_COOKIE: signin})
            assert pressed.status == 303
        refused = await press_as(browser, client, token, **{SIGNIN_COOKIE: signin})
        assert refused.status == 403 and USED in await refused.text()
        nonce = links.signer.verify(token).nonce
        record = json.loads(await memory.redis.get(UsedLinks.key(nonce)))
        assert len(record["sessions"]) == UsedLinks.MAX_PRESSES


async def test_a_used_link_leads_to_the_page_only_a_browser_holding_a_session_it_started(
    memory, tenant, caplog
):
    """A second tab, or Back: a session the link itself started goes on to /memory. Being
    signed in as its person by an earlier link proves nothing: a new link someone read in a log
    and pressed first is still ended by its person's press, with a warning."""
    people = knowing_u1(People(), tenant)
    clock = Clock()
    async with page_and_browser(memory, people, clock=clock) as (client, links, browser):
        link = links.login(tenant, "U1", "slack")
        assert (await press_link(client, link, allow_redirects=False)).status == 303
        own = session_of(client)
        clock.now += PRESS_AGAIN_SECONDS + 1  # no longer a press again: the link is used
        response = await press(client, token_of(link))
        assert response.status == 303 and response.headers["Location"] == "/memory"
        assert "Set-Cookie" not in response.headers  # the session it has goes on

        newer = token_of(links.login(tenant, "U1", "slack"))
        taken = await press_as(browser, client, newer, **{SIGNIN_COOKIE: "attackers"})
        stolen = taken.cookies[SESSION_COOKIE].value
        response = await press(client, newer)  # signed in as U1, by the earlier link
        assert response.status == 403 and LEAKED in await response.text()
        assert not await memory.redis.exists(WebSessions.key(stolen))
        assert await memory.redis.exists(WebSessions.key(own))  # not a session of that link
        warned = [r for r in caplog.records if r.levelname == "WARNING" and "second" in r.message]
        assert len(warned) == 1

        # the link's own session, pressed without its sign-in cookie (as a copy would be): it
        # leaked, so that session ends too, and its browser is led to the page (to sign in)
        response = await press_as(browser, client, token_of(link), **{SESSION_COOKIE: own})
        assert response.status == 303 and response.headers["Location"] == "/memory"
        assert not await memory.redis.exists(WebSessions.key(own))
        assert (await client.get("/memory")).status == 401


async def test_a_double_click_keeps_both_sessions_until_the_link_ends(memory, tenant):
    """Both presses of a double click pass the check before either is recorded; whichever is
    recorded last must not end the other's session, which may be the one the browser keeps.
    Signing out of either ends both."""
    people = knowing_u1(People(), tenant)
    async with page_client(memory, people) as (client, links, _):
        link = links.login(tenant, "U1", "slack")
        signin = await preview(client, link)
        nonce = links.signer.verify(token_of(link)).nonce
        state = WebState(memory.redis)
        now = links.signer.clock()
        assert await state.used_links.check(nonce, signin, now) == UsedLinks.OPEN  # the first
        assert await state.used_links.check(nonce, signin, now) == UsedLinks.OPEN  # the second
        record = {
            "viewer": viewer_record(people.known["U1"]),
            "csrf": new_csrf(),
            "resolved_at": time.time(),
            "link": UsedLinks.link_id(nonce),
        }  # as a press's
        first, second = [await state.sessions.create(record) for _ in range(2)]
        assert await state.used_links.use(nonce, signin, second, now, 3600)  # recorded first
        assert await state.used_links.use(nonce, signin, first, now, 3600)
        assert await state.sessions.get(first) and await state.sessions.get(second)

        client.session.cookie_jar.update_cookies(
            {SESSION_COOKIE: second}, client.make_url("/memory")
        )
        csrf = (await (await client.get("/memory")).json())["csrf"]
        assert (await client.post(LOGOUT_PATH, data={"csrf": csrf})).status == 200
        assert not await state.sessions.get(first) and not await state.sessions.get(second)


async def test_a_first_press_without_the_sign_in_cookie_shows_the_link_again(memory, tenant):
    """A browser the preview never marked (its cookie refused, or the POST sent by hand): its
    press is not recorded as nobody's, which would make its own double click a leak; it is
    shown the link's page again, which marks it, and then signs in."""
    people = knowing_u1(People(), tenant)
    async with page_client(memory, people) as (client, links, _):
        token = token_of(links.login(tenant, "U1", "slack"))
        response = await press(client, token)
        page = await response.text()
        assert response.status == 200 and "press the button again" in page
        assert SIGNIN_COOKIE in response.cookies and SESSION_COOKIE not in response.cookies
        assert not await memory.redis.exists(UsedLinks.key(links.signer.verify(token).nonce))
        assert people.asked == 0
        first = await press(client, token)
        assert first.status == 303
        again = await press(client, token)  # Back, or a double click: still this browser's
        assert again.status == 303 and "Set-Cookie" in again.headers
        assert (await client.get("/memory")).status == 200


async def test_signing_out_ends_the_link_for_its_browser_too(memory, tenant):
    """Within the minutes a press may be repeated, the sign-in cookie (or a copy of it) no
    longer opens the link once its person signed out: the cookie is deleted, the link ended."""
    people = knowing_u1(People(), tenant)
    async with page_and_browser(memory, people) as (client, links, copy):
        token, signin = await previewed_link(client, links, tenant)
        assert (await press(client, token)).status == 303
        csrf = (await (await client.get("/memory")).json())["csrf"]
        response = await client.post(LOGOUT_PATH, data={"csrf": csrf})
        assert response.status == 200
        cleared = response.headers.getall("Set-Cookie")
        assert any(f"{SIGNIN_COOKIE}=" in c and "Path=/memory/login" in c for c in cleared)
        assert not client.session.cookie_jar.filter_cookies(client.make_url("/memory/login"))
        nonce = links.signer.verify(token).nonce
        assert await memory.redis.ttl(UsedLinks.key(nonce)) > 0  # kept until the link expires
        for answer in (
            await press(client, token),
            await press_as(copy, client, token, **{SIGNIN_COOKIE: signin}),
        ):
            assert answer.status == 403 and USED in await answer.text()
            assert SESSION_COOKIE not in answer.cookies


async def test_two_presses_at_once_start_one_session(memory, tenant):
    people = knowing_u1(People(), tenant)
    async with (
        page_client(memory, people) as (client, links, _),
        aiohttp.ClientSession() as first,
        aiohttp.ClientSession() as second,
    ):
        token = token_of(links.login(tenant, "U1", "slack"))
        login = client.make_url("/memory/login")
        answers = await asyncio.gather(
            *(browser.post(login, data={"token": token}, allow_redirects=False,
                           headers={"Cookie": f"{SIGNIN_COOKIE}={name}"})
              for name, browser in (("first", first), ("second", second)))
        )  # fmt: skip
        assert sorted(a.status for a in answers) == [303, 403]


async def test_signing_out_works_while_the_platform_cannot_answer(memory, tenant):
    people = knowing_u1(Unsteady(), tenant)
    async with page_client(memory, people) as (client, links, _):
        link = links.login(tenant, "U1", "slack")
        assert (await press_link(client, link, allow_redirects=False)).status == 303
        csrf = (await (await client.get("/memory")).json())["csrf"]
        session = session_of(client)
        await due_to_ask_again(memory, session)  # who they are is due to be asked
        people.down = DirectoryError("Slack asks ArxivScout to slow down.", retry_after=30)
        response = await client.get("/memory")
        assert response.status == 503 and "slow down" in await response.text()

        asked = people.asked
        response = await client.post(LOGOUT_PATH, data={"csrf": "not-the-token"})
        assert response.status == 403 and "security token" in await response.text()
        assert await memory.redis.exists(WebSessions.key(session))  # a forged sign-out: refused

        response = await client.post(LOGOUT_PATH, data={"csrf": csrf})
        assert response.status == 200 and "Signed out" in await response.text()
        assert people.asked == asked  # nobody was asked
        cleared = response.headers["Set-Cookie"]
        assert f"{SESSION_COOKIE}=" in cleared and "Max-Age=0" in cleared
        assert not await memory.redis.exists(WebSessions.key(session))
        people.down = None
        assert (await client.get("/memory")).status == 401


async def test_a_missing_platform_token_is_named_and_leads_back_only_when_signed_in(memory, tenant):
    """The process serving the page lacks SLACK_BOT_TOKEN or DISCORD_TOKEN: trying again will
    not help, and a way back to /memory helps only someone with a session."""
    people = knowing_u1(People(), tenant)
    # Slack's token not set; Discord's empty (the directory asks for it only when it is needed)
    untokened = Directories(discord=DiscordDirectory(token=None))
    async with page_client(memory, people) as (signed, links, _):
        app = build_web_app(memory, page=memory_page(memory, links, untokened,
                                                     pages=probe_routes([])))  # fmt: skip
        async with TestClient(TestServer(app)) as client:
            for platform, tenant_id, setting in (("slack", tenant, "SLACK_BOT_TOKEN"),
                                                 ("discord", "123456", "DISCORD_TOKEN")):  # fmt: skip
                link = links.login(tenant_id, "U1", platform)
                response = await press_link(client, link, allow_redirects=False)
                text = await response.text()
                assert response.status == 502 and "Cannot open the memory page" in text
                assert f"{setting} is not set where the memory page runs" in text
                assert BACK not in text and "Set-Cookie" not in response.headers

            # signed in on a process that has the token, then served by one that has not
            link = links.login(tenant, "U1", "slack")
            assert (await press_link(signed, link, allow_redirects=False)).status == 303
            session = session_of(signed)
            await due_to_ask_again(memory, session)
            response = await client.get(
                "/memory", headers={"Cookie": f"{SESSION_COOKIE}={session}"}
            )
            text = await response.text()
            assert response.status == 502 and "SLACK_BOT_TOKEN" in text and BACK in text
