"""The way into the memory page: signed links, sessions, CSRF, who the viewer is (Slack, Discord,
the terminal), and Slack's `/memory` and App Home, over real HTTP, real Redis and the mock Slack
Web API."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import shlex
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import discord
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from slack_sdk.web.async_client import AsyncWebClient

from adapters.discord import DiscordAdapter
from adapters.memory_page.access import (
    Admins,
    Directories,
    DirectoryError,
    DiscordDirectory,
    SlackDirectory,
    discord_viewer,
    viewer_of,
    viewer_record,
)
from adapters.memory_page.auth import InvalidLink, Links, LinkSigner, link_secret
from adapters.memory_page.server import (
    LOGOUT_PATH,
    SESSION_COOKIE,
    SIGNIN_COOKIE,
    memory_page,
)
from adapters.memory_page.viewer import CSRF, VIEWER, Viewer
from adapters.slack import SlackAdapter, thread_id
from adapters.slack_home import BUTTON_ACTION
from adapters.web import build_web_app
from app.commands.web_cmd import again_command
from memory.keys import web_session_key
from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.knowledge_base import Chunk, Paper
from memory.stores.summary import Summary
from memory.web_sessions import ViewerCache, WebSessions, WebState
from tests.agent_world import close_world, open_world
from tests.support.discord_fakes import FakeDiscord, spec
from tests.support.memory_page_sessions import due_to_ask_again, session_of
from tests.support.scripted_openai import text
from tests.support.slack_api import MockSlackApi, SlackSender, mention, message

SECRET = "test-signing-secret"
LINK_SECRET = "link-secret"


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


def token_of(url: str) -> str:
    return parse_qs(urlsplit(url).query)["token"][0]


def claims_of(token: str) -> dict:
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def reencoded(token: str, **changes: str) -> str:
    """The token with its payload changed and its old signature kept (a tampered link)."""
    version, _, signature = token.split(".")
    data = {**claims_of(token), **changes}
    payload = base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()
    return f"{version}.{payload}.{signature}"


# -- signed links ---------------------------------------------------------------------------------


def test_a_link_names_its_person_and_expires():
    clock = Clock()
    signer = LinkSigner(LINK_SECRET, ttl=3600, clock=clock)
    token = signer.sign("T1", "U1", "slack")
    claims = signer.verify(token)
    assert (claims.tenant, claims.user, claims.platform) == ("T1", "U1", "slack")
    assert claims.expires == pytest.approx(clock.now + 3600, abs=1)
    assert signer.verify(token) == claims  # verified again (the sign-in POST uses it up)
    assert claims_of(signer.sign("T1", "U1", "slack"))["n"] != claims.nonce  # a nonce each

    clock.now += 3601
    with pytest.raises(InvalidLink) as expired:
        signer.verify(token)
    assert expired.value.reason == "expired" and "/memory" in expired.value.advice


def test_forged_tampered_and_malformed_links_are_refused():
    signer = LinkSigner(LINK_SECRET)
    token = signer.sign("T1", "U1", "slack")
    forged = LinkSigner("another-secret").sign("T1", "U1", "slack")
    other_tenant = reencoded(token, t="T2")
    other_user = reencoded(token, u="U9")
    longer = reencoded(token, e=int(time.time()) + 10**6)
    bad_signature = token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    for bad in (forged, other_tenant, other_user, longer, bad_signature, token[:-10],
                "v1.x.y", "v2." + token[3:], "garbage", token.replace(".", "", 1)):  # fmt: skip
        with pytest.raises(InvalidLink) as refused:
            signer.verify(bad)
        assert refused.value.reason == "invalid", bad
    with pytest.raises(InvalidLink) as missing:
        signer.verify("")
    assert missing.value.reason == "missing"


def test_links_are_built_from_the_public_url():
    links = Links(LinkSigner(LINK_SECRET), "https://scout.example.com/")
    url = links.login("T1", "U1", "slack")
    assert url.startswith("https://scout.example.com/memory/login?token=v1.")
    assert links.signer.verify(token_of(url)).user == "U1"
    assert links.secure and not Links(LinkSigner(LINK_SECRET), "http://127.0.0.1:8080").secure
    assert links.page("/memory/papers") == "https://scout.example.com/memory/papers"


async def test_without_a_configured_secret_every_process_shares_one_from_redis(memory):
    await memory.redis.delete("arxivscout:web:secret")
    first = await link_secret(None, WebState(memory.redis).secrets)
    second = await link_secret(None, WebState(memory.redis).secrets)  # another process
    assert first == second and len(first) == 64
    assert await link_secret("configured", WebState(memory.redis).secrets) == "configured"


def test_admins_setting():
    admins = Admins(" U1 , T2:U2,,")
    assert admins.named("T1", "U1") and admins.named("T9", "U1")
    assert admins.named("T2", "U2") and not admins.named("T1", "U2")
    assert not Admins(None).named("T1", "U1")


# -- sessions and the guard, through a real server ------------------------------------------------


class People:
    """A directory whose answers a test changes (as Slack's would change)."""

    def __init__(self) -> None:
        self.known: dict[str, Viewer] = {}
        self.asked = 0

    async def viewer(self, tenant: str, user: str, platform: str) -> Viewer:
        self.asked += 1
        if user not in self.known or self.known[user].tenant != tenant:
            raise DirectoryError("Slack does not know you in this workspace.", status=403)
        return self.known[user]


def probe_routes(seen: list[str]) -> list[web.RouteDef]:
    """Stand-ins for the pages: what the guard handed the handler."""

    async def overview(request: web.Request) -> web.Response:
        viewer = request[VIEWER]
        return web.json_response({"tenant": viewer.tenant, "user": viewer.user,
                                  "admin": viewer.admin, "audiences": sorted(viewer.audiences),
                                  "csrf": request[CSRF]})  # fmt: skip

    async def change(request: web.Request) -> web.Response:
        form = await request.post()  # read by the guard already: the same form
        seen.append(str(form.get("what")))
        upload = form.get("file")
        size = len(upload.file.read()) if upload is not None and hasattr(upload, "file") else 0
        return web.json_response({"done": form.get("what"), "size": size})

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("a bug in a page")

    return [web.get("/memory", overview), web.post("/memory/change", change),
            web.get("/memory/broken", broken)]  # fmt: skip


@asynccontextmanager
async def page_client(
    memory, people: People, public_url: str = "http://127.0.0.1", clock: Clock | None = None
) -> AsyncIterator[tuple[TestClient, Links, list[str]]]:
    links = Links(LinkSigner(LINK_SECRET, clock=clock or time.time), public_url)
    seen: list[str] = []
    app = build_web_app(memory, page=memory_page(memory, links, people, pages=probe_routes(seen)))
    async with TestClient(TestServer(app)) as client:
        yield client, links, seen


async def press_link(client: TestClient, url: str, **kwargs: Any) -> aiohttp.ClientResponse:
    """Open the link (its page gives the browser its sign-in cookie), then press its button."""
    parts = urlsplit(url)
    page = await client.get(f"{parts.path}?{parts.query}", allow_redirects=False)
    assert page.status == 200 and SESSION_COOKIE not in page.cookies, await page.text()
    signin = {SIGNIN_COOKIE: page.cookies[SIGNIN_COOKIE].value}  # sent back under https too
    return await client.post(parts.path, data={"token": token_of(url)}, cookies=signin, **kwargs)


async def sign_in(
    client: TestClient, links: Links, tenant: str, user: str
) -> aiohttp.ClientResponse:
    """Open the link, then press its page's button (the POST that starts the session)."""
    return await press_link(client, links.login(tenant, user, "slack"), allow_redirects=False)


async def test_login_starts_a_session_and_the_guard_checks_every_request(memory, tenant):
    people = People()
    people.known["U1"] = Viewer(tenant, "U1", "slack", False, frozenset({PUBLIC, "dm:D1"}), "Ada")
    async with page_client(memory, people) as (client, links, seen):
        response = await client.get("/memory")
        page = await response.text()
        assert response.status == 401 and "<code>/memory</code> in Slack or Discord" in page
        assert 'href="/memory"' not in page  # it would only answer 401 again: how to get a link
        response = await client.post("/memory/change", data={"what": "x"})
        assert response.status == 401 and seen == []

        response = await sign_in(client, links, tenant, "U1")
        assert response.status == 303 and response.headers["Location"] == "/memory"
        cookie = response.headers["Set-Cookie"]
        assert f"{SESSION_COOKIE}=" in cookie and "HttpOnly" in cookie and "Path=/memory" in cookie
        assert "SameSite=Lax" in cookie and "Secure" not in cookie  # http: not Secure
        assert response.headers["Referrer-Policy"] == "no-referrer"

        response = await client.get("/memory")
        page = await response.json()
        assert response.status == 200
        assert (page["tenant"], page["user"], page["audiences"]) == (
            tenant,
            "U1",
            ["dm:D1", PUBLIC],
        )
        assert response.headers["Cache-Control"] == "no-store"
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
        csrf = page["csrf"]

        # a POST without the session's CSRF token never reaches its handler
        for form in ({"what": "no token"}, {"what": "wrong", "csrf": "x" * len(csrf)}):
            response = await client.post("/memory/change", data=form)
            page = await response.text()
            assert response.status == 403 and "security token" in page
            assert '<a href="/memory">Back to the memory page</a>' in page
        assert seen == []
        response = await client.get("/memory/broken")  # a bug: a page of its own, a way back
        page = await response.text()
        assert response.status == 500 and "Something went wrong" in page
        assert "a bug in a page" not in page and 'href="/memory"' in page
        response = await client.post("/memory/change", data={"what": "ok", "csrf": csrf})
        assert response.status == 200 and seen == ["ok"]
        upload = aiohttp.FormData()
        upload.add_field("csrf", csrf)
        upload.add_field("what", "file")
        upload.add_field("file", b"x" * 2_000_000, filename="export.jsonl")  # past aiohttp's 1 MB
        response = await client.post("/memory/change", data=upload)  # only an import takes more
        assert response.status == 413 and "at most 1 MB" in await response.text()
        assert seen == ["ok"]
        no_token = aiohttp.FormData()
        no_token.add_field("file", b"{}", filename="export.jsonl")
        assert (await client.post("/memory/change", data=no_token)).status == 403

        # the session is kept under the cookie's hash, not the cookie itself
        value = session_of(client)
        assert not await memory.redis.exists(web_session_key(value))
        assert await memory.redis.exists(WebSessions.key(value))

        response = await client.post(LOGOUT_PATH, data={"csrf": csrf})
        assert response.status == 200 and "Signed out" in await response.text()
        assert not await memory.redis.exists(WebSessions.key(value))
        assert (await client.get("/memory")).status == 401
        assert (await client.get("/healthz")).status == 200  # outside /memory: no guard


async def test_a_link_signs_one_browser_in_and_only_for_its_own_tenant(memory, tenant):
    people = People()
    people.known["U1"] = Viewer(tenant, "U1", "slack")
    async with (
        page_client(memory, people) as (first, links, _),
        aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as second,
    ):
        link = links.login(tenant, "U1", "slack")
        login = first.make_url(f"{urlsplit(link).path}?{urlsplit(link).query}")
        response = await press_link(first, link)
        assert response.status == 200 and (await response.json())["tenant"] == tenant
        # a second browser (each has a cookie jar of its own) asks for a link of its own; its
        # press ends the session the link started (the link may have been read from a log)
        response = await second.post(login.with_query(None), data={"token": token_of(link)})
        assert response.status == 403 and "used by another browser" in await response.text()
        assert not second.cookie_jar.filter_cookies(login)
        assert (await first.get("/memory")).status == 401
        assert (await sign_in(first, links, tenant, "U1")).status == 303  # a new link
        # the same person's id in another workspace: that workspace's directory decides
        response = await sign_in(first, links, "T-elsewhere", "U1")
        assert response.status == 403 and "does not know you" in await response.text()
        assert (await first.get("/memory")).status == 200  # their own session is untouched


async def test_expired_forged_and_tampered_links_get_a_page_that_says_what_to_do(memory, tenant):
    people = People()
    people.known["U1"] = Viewer(tenant, "U1", "slack")
    clock = Clock()
    async with page_client(memory, people, clock=clock) as (client, links, _):
        token = links.signer.sign(tenant, "U1", "slack")
        forged = LinkSigner("not-our-secret").sign(tenant, "U1", "slack")
        tampered = reencoded(token, u="U2")
        for bad, title in ((forged, "not valid"), (tampered, "not valid"), ("", "not valid")):
            response = await client.get("/memory/login", params={"token": bad})
            page = await response.text()
            assert response.status == 403 and title in page and "/memory" in page
            assert "`" not in page and "<code>arxivscout web --link</code>" in page  # markup
        clock.now += links.ttl + 1
        response = await client.get("/memory/login", params={"token": token})
        page = await response.text()
        assert response.status == 403 and "expired" in page and "/memory" in page
        assert "`" not in page and "<code>/memory</code>" in page
        assert "Set-Cookie" not in response.headers and people.asked == 0
        for bad in (token, forged, tampered, ""):  # and again on the button's POST
            response = await client.post("/memory/login", data={"token": bad})
            assert response.status == 403 and "link" in await response.text()
            assert "Set-Cookie" not in response.headers and people.asked == 0


async def test_opening_a_link_asks_before_it_replaces_the_session(memory, tenant):
    """Login CSRF: someone's own link sent to you, or posted to the page from another site,
    must not sign your browser in as them."""
    people = People()
    people.known["U1"] = Viewer(tenant, "U1", "slack", name="Ada")
    people.known["EVE"] = Viewer(tenant, "EVE", "slack", name="Eve")
    async with page_client(memory, people) as (client, links, _):
        assert (await sign_in(client, links, tenant, "U1")).status == 303
        evil = links.login(tenant, "EVE", "slack")
        response = await client.get(f"{urlsplit(evil).path}?{urlsplit(evil).query}")
        page = await response.text()
        assert response.status == 200 and SESSION_COOKIE not in response.cookies
        assert "<code>EVE</code>" in page and f"<code>{tenant}</code>" in page
        assert "Eve" not in page and people.asked == 1  # the link's claims only, asked nobody
        assert 'method="post" action="/memory/login"' in page and token_of(evil) in page
        assert response.headers["Referrer-Policy"] == "same-origin"  # so the POST has an Origin
        assert (await (await client.get("/memory")).json())["user"] == "U1"  # still Ada

        own = str(client.make_url("/"))
        for origin in ("https://evil.example", "null", "http://127.0.0.1.evil.example"):
            response = await client.post("/memory/login", data={"token": token_of(evil)},
                                         headers={"Origin": origin}, allow_redirects=False)  # fmt: skip
            assert response.status == 403 and "own sign-in page" in await response.text()
        response = await client.post("/memory/login", data={"token": token_of(evil)},
                                     headers={"Referer": "https://evil.example/x"})  # fmt: skip
        assert response.status == 403 and people.asked == 1
        assert (await (await client.get("/memory")).json())["user"] == "U1"

        response = await client.post("/memory/login", data={"token": token_of(evil)},
                                     headers={"Origin": own.rstrip("/")}, allow_redirects=False)  # fmt: skip
        assert response.status == 303 and response.headers["Location"] == "/memory"
        assert (await (await client.get("/memory")).json())["user"] == "EVE"  # asked, then so


async def test_the_viewer_is_asked_again_after_a_few_minutes(memory, tenant):
    people = People()
    people.known["U1"] = Viewer(tenant, "U1", "slack", False, frozenset({PUBLIC, "private:C9"}))
    async with page_client(memory, people) as (client, links, _):
        await sign_in(client, links, tenant, "U1")
        assert "private:C9" in (await (await client.get("/memory")).json())["audiences"]
        people.known["U1"] = Viewer(tenant, "U1", "slack")  # they left the private channel
        assert "private:C9" in (await (await client.get("/memory")).json())["audiences"]
        # a few minutes later (the session's record says when it was last asked)
        session = session_of(client)
        await due_to_ask_again(memory, session)
        assert (await (await client.get("/memory")).json())["audiences"] == [PUBLIC]
        # and when the directory cannot answer, a page says so (no trace, no stale access)
        await due_to_ask_again(memory, session)
        del people.known["U1"]
        response = await client.get("/memory")
        assert response.status == 403 and "does not know you" in await response.text()


async def test_secure_cookie_under_an_https_public_url(memory, tenant):
    people = People()
    people.known["U1"] = Viewer(tenant, "U1", "slack")
    async with page_client(memory, people, public_url="https://scout.example.com") as (
        client, links, _,
    ):  # fmt: skip
        response = await sign_in(client, links, tenant, "U1")
        assert response.status == 303 and "Secure" in response.headers["Set-Cookie"]


# -- who the viewer is: Slack ---------------------------------------------------------------------


@pytest.fixture
async def slack_api() -> AsyncIterator[MockSlackApi]:
    api = MockSlackApi()
    await api.start()
    yield api
    await api.close()


def slack_directory(api: MockSlackApi, token: str = "xoxb-test") -> SlackDirectory:
    return SlackDirectory(AsyncWebClient(token=token, base_url=api.base_url))


async def test_slack_viewer_private_channels_group_dms_and_their_own_dm(slack_api):
    api = slack_api
    api.private_channels.update({"C9", "C8", "C7"})
    api.mpims.add("G5")
    api.members.update({"C9": {"U1", "U2"}, "C8": {"U2"}, "C7": {"U1"}, "G5": {"U1", "U2"},
                        "C1": {"U1"}})  # fmt: skip
    api.not_joined.add("C7")  # private, but the bot is not there: no memory of it either
    api.page_size = 1  # every channel on a page of its own
    viewer = await slack_directory(api).viewer("T1", "U1", "slack")
    # the audiences the Slack adapter stores (Scope.audience) for those places; public C1's
    # private memory is what walled people said there (memory/scope.py: Scope.audiences)
    expected = {PUBLIC, "private:C9", "private:G5", "dm:DU1", "private:C1"}
    assert viewer.audiences == expected and not viewer.admin and viewer.name == "Ada"
    assert expected == {PUBLIC} | {
        Scope("T1", channel=c, visibility=v).audience
        for c, v in (("C9", Visibility.PRIVATE), ("G5", Visibility.PRIVATE), ("DU1", Visibility.DM))
    } | set(Scope("T1", channel="C1").audiences)  # public C1: and what walled people said there
    assert viewer.can_see("private:C9") and not viewer.can_see("private:C8")
    assert not viewer.can_see("dm:DU2")
    pages = api.of("users.conversations")
    assert len(pages) >= 3 and pages[0]["types"] == "public_channel,private_channel,mpim,im"
    assert api.of("conversations.open")[-1]["users"] == "U1"


async def test_slack_admins_and_owners_manage_the_tenant(slack_api):
    slack_api.admins.add("U1")
    slack_api.owners.add("U2")
    directory = slack_directory(slack_api)
    assert (await directory.viewer("T1", "U1")).admin
    assert (await directory.viewer("T1", "U2")).admin
    slack_api.users["U3"] = "Linus"
    assert not (await directory.viewer("T1", "U3")).admin


async def test_slack_guests_see_only_their_own_places(memory, slack_api, tenant):
    """A guest was let into some channels only: the workspace's public memory is not theirs,
    and the viewer cached for their session keeps it that way."""
    slack_api.guests.add("U1")
    slack_api.private_channels.add("C9")
    slack_api.members.update({"C9": {"U1"}})
    guest = await slack_directory(slack_api).viewer(tenant, "U1")
    assert guest.audiences == {"private:C9", "dm:DU1"} and not guest.can_see(PUBLIC)
    assert viewer_of(viewer_record(guest)).audiences == guest.audiences
    assert (await slack_directory(slack_api).viewer(tenant, "U2")).can_see(PUBLIC)


async def test_slack_failures_become_messages(slack_api):
    directory = slack_directory(slack_api)
    slack_api.rate_limit("users.conversations", retry_after=7)
    with pytest.raises(DirectoryError) as limited:
        await directory.viewer("T1", "U1")
    assert limited.value.retry_after == 7 and limited.value.status == 503
    assert "7 seconds" in limited.value.message
    slack_api.fail("users.info", "invalid_auth")
    with pytest.raises(DirectoryError) as token:
        await directory.viewer("T1", "U1")
    assert "SLACK_BOT_TOKEN" in token.value.message
    slack_api.fail("users.conversations", "missing_scope")
    with pytest.raises(DirectoryError) as scope:
        await directory.viewer("T1", "U1")
    assert "manifest.yml" in scope.value.message
    with pytest.raises(DirectoryError) as unknown:
        await directory.viewer("T1", "U404")
    assert unknown.value.status == 403
    slack_api.deactivated.add("U2")
    with pytest.raises(DirectoryError) as gone:
        await directory.viewer("T1", "U2")
    assert "deactivated" in gone.value.message
    unreachable = SlackDirectory(AsyncWebClient(token="xoxb-t", base_url="http://127.0.0.1:9/api/"))
    with pytest.raises(DirectoryError) as down:
        await unreachable.viewer("T1", "U1")
    assert "could not be reached" in down.value.message


async def test_a_rate_limited_login_says_when_to_try_again(memory, slack_api, tenant):
    directories = Directories(slack=slack_directory(slack_api))
    links = Links(LinkSigner(LINK_SECRET), "http://127.0.0.1")
    app = build_web_app(memory, page=memory_page(memory, links, directories, pages=[]))
    slack_api.rate_limit("users.info", retry_after=12)
    async with TestClient(TestServer(app)) as client:
        url = urlsplit(links.login(tenant, "U1", "slack"))
        response = await press_link(client, url.geturl(), allow_redirects=False)
        page = await response.text()
        assert response.status == 503 and response.headers["Retry-After"] == "12"
        assert "12 seconds" in page and "Traceback" not in page
        missing = Directories()  # a server without Slack's token
        app = build_web_app(memory, page=memory_page(memory, links, missing, pages=[]))
    async with TestClient(TestServer(app)) as client:
        response = await press_link(client, url.geturl(), allow_redirects=False)
        assert response.status == 502 and "SLACK_BOT_TOKEN" in await response.text()


async def test_viewers_are_cached_and_the_admins_setting_applies(memory, slack_api, tenant):
    cache = ViewerCache(memory.redis)
    await cache.forget("slack", tenant, "U1")
    directories = Directories(cache, Admins(f"{tenant}:U1"), slack=slack_directory(slack_api))
    first = await directories.viewer(tenant, "U1", "slack")
    asked = len(slack_api.of("users.info"))
    again = await Directories(cache, slack=slack_directory(slack_api)).viewer(tenant, "U1", "slack")
    assert len(slack_api.of("users.info")) == asked  # another process: from Redis
    assert first.admin and not again.admin  # the setting, not the cache, makes U1 an admin
    assert again.audiences == first.audiences
    local = await directories.viewer("local", "local", "local")
    assert local.admin and local.platform == "local"


# -- who the viewer is: Discord -------------------------------------------------------------------


def discord_member(fake: FakeDiscord, **permissions: bool):
    return spec(discord.Member, id=fake.snowflake(), display_name="Ada",
                guild_permissions=discord.Permissions(**permissions))  # fmt: skip


def test_discord_viewer_sees_hidden_channels_they_can_view_and_their_threads():
    fake = FakeDiscord()
    guild = fake.guild()
    public = fake.text_channel(guild)
    theirs = fake.text_channel(guild, private=True)
    closed = fake.text_channel(guild, private=True)
    member = discord_member(fake)
    closed.permissions_for.side_effect = lambda target: discord.Permissions(view_channel=False)
    in_theirs = fake.thread(guild, owner_id=fake.bot.id, parent_id=theirs.id)
    in_closed = fake.thread(guild, owner_id=fake.bot.id, parent_id=closed.id)
    in_public = fake.thread(guild, owner_id=fake.bot.id, parent_id=public.id)
    tenant = str(guild.id)
    viewer = discord_viewer(tenant, member, [public, theirs, closed],
                            [in_theirs, in_closed, in_public])  # fmt: skip
    assert viewer.audiences == {PUBLIC, f"private:{theirs.id}", f"private:{in_theirs.id}"}
    assert not viewer.admin and viewer.user == str(member.id) and viewer.platform == "discord"
    # the audience the adapter stores for a turn in that thread (its Scope) is one of them
    stored = Scope(tenant, channel=str(in_theirs.id), visibility=Visibility.PRIVATE).audience
    assert viewer.can_see(stored)
    for power in ("manage_guild", "administrator"):
        assert discord_viewer(tenant, discord_member(fake, **{power: True}), []).admin


async def test_discord_dm_memory_is_its_persons_and_a_missing_token_is_named():
    directory = DiscordDirectory(token=None)
    own = await directory.viewer("dm-42", "42")
    assert own.owner and own.manages and not own.admin and own.tenant == "dm-42"
    with pytest.raises(DirectoryError) as other:
        await directory.viewer("dm-42", "43")
    assert other.value.status == 403
    with pytest.raises(DirectoryError) as missing:
        await directory.viewer("123456", "42")
    assert "DISCORD_TOKEN" in missing.value.message and missing.value.status == 502


# -- Slack and Discord hand out links ------------------------------------------------------------


@pytest.fixture(scope="module")
async def world(redis_url, tmp_path_factory):
    world = await open_world(redis_url, tmp_path_factory.mktemp("access"))
    yield world
    await close_world(world)


async def test_discord_memory_command_answers_with_a_link_only_its_caller_sees(world):
    links = Links(LinkSigner(LINK_SECRET), "https://scout.example.com")
    fake = FakeDiscord()
    adapter = DiscordAdapter(world.runtime.turns(), sync=False, links=links)
    fake.attach(adapter.client)
    assert "memory" in [c.name for c in adapter.tree.get_commands()]
    guild = fake.guild()
    user = fake.user(name="Ada")
    for channel, tenant in ((fake.text_channel(guild), str(guild.id)),
                            (fake.dm_channel(user), f"dm-{user.id}")):  # fmt: skip
        interaction = fake.interaction(channel, user)
        await adapter.commands.memory(interaction)
        args, kwargs = interaction.response.send_message.call_args
        assert kwargs == {"ephemeral": True}
        url = re.search(r"\(<(https://[^>]+)>\)", args[0]).group(1)
        claims = links.signer.verify(token_of(url))
        assert (claims.tenant, claims.user, claims.platform) == (tenant, str(user.id), "discord")
    unserved = DiscordAdapter(world.runtime.turns(), sync=False)
    interaction = fake.interaction(fake.text_channel(guild), user)
    await unserved.commands.memory(interaction)
    assert "not served" in interaction.response.send_message.call_args.args[0]


@asynccontextmanager
async def slack_with_page(world, api: MockSlackApi, links: Links, directories: Directories):
    """The Slack app and the memory page in one web process, as `arxivscout slack` serves them."""
    memory = world.runtime.memory
    adapter = SlackAdapter(world.runtime.turns(), "xoxb-test", SECRET, api_url=api.base_url,
                           links=links, directory=directories)  # fmt: skip
    await adapter.check_token()
    page = memory_page(memory, links, directories, pages=probe_routes([]))
    app = build_web_app(memory, adapter.app, signing_secret=SECRET, page=page)
    async with TestClient(TestServer(app)) as client:
        sender = SlackSender(str(client.make_url("/slack/events")), SECRET, client.session, api)

        async def settle() -> None:
            for _ in range(3):
                await adapter.wait_idle()
                await world.runtime.harness.drain()

        yield client, sender, settle
        await settle()
    await adapter.close()


async def test_slack_memory_command_links_to_the_callers_page(world, slack_api):
    team = f"T{time.time_ns()}"
    slack_api.private_channels.add("C9")
    slack_api.members["C9"] = {"U1"}
    links = Links(LinkSigner(LINK_SECRET), "http://127.0.0.1")
    directories = Directories(ViewerCache(world.runtime.memory.redis),
                              slack=slack_directory(slack_api))  # fmt: skip
    async with slack_with_page(world, slack_api, links, directories) as (client, sender, _):
        for channel in ("C1", "DU1"):  # in a channel and in a DM
            response = await sender.command("/memory", "", slack_api.response_url + "m",
                                            team=team, channel=channel)  # fmt: skip
            answer = json.loads(await response.text())
            assert response.status == 200 and answer["response_type"] == "ephemeral"
            url = re.search(r"<(http[^|>]+)\|", answer["text"]).group(1)
            claims = links.signer.verify(token_of(url))
            assert (claims.tenant, claims.user, claims.platform) == (team, "U1", "slack")
        response = await press_link(client, url)
        page = await response.json()
        assert response.status == 200 and page["tenant"] == team and page["user"] == "U1"
        assert set(page["audiences"]) == {PUBLIC, "private:C9", "dm:DU1"}
    assert slack_api.of("views.publish") == []


async def test_slack_app_home_shows_papers_threads_summaries_and_a_fresh_link(world, slack_api):
    team = f"T{time.time_ns()}"
    memory = world.runtime.memory
    api = slack_api
    api.private_channels.update({"C9", "C8"})
    api.members.update({"C9": {"U1"}, "C8": {"U1", "U2"}})
    vectors = await memory.embedder.embed(["Paging between a main context and an archive."])
    paper = Paper("2310.08560", "MemGPT: Towards LLMs as <Operating Systems>")
    await memory.knowledge_base.add_paper(Scope(team), paper, [Chunk("Paging.")], vectors)
    links = Links(LinkSigner(LINK_SECRET), "http://127.0.0.1")
    directories = Directories(ViewerCache(memory.redis), slack=slack_directory(api))
    async with slack_with_page(world, api, links, directories) as (client, sender, settle):
        world.model.script(*(text(f"answer {i}") for i in range(4)))
        for n, channel in enumerate(("C1", "C9", "C8")):  # one turn at a time
            await sender.event(mention(f"hello {channel}", f"1700000000.00000{n}", channel=channel),
                               team=team)  # fmt: skip
            await settle()
        await sender.event(message("hi in a DM", "1700000001.000000", channel="DU1",
                                   channel_type="im"), team=team)  # fmt: skip
        await settle()
        c1 = thread_id(team, "C1", "1700000000.000000")
        await memory.summaries.save(Scope(team, c1, "C1"), Summary(
            c1, "Ada said hello & asked <things>", "A greeting.", message_ids=[]))  # fmt: skip
        api.members["C8"].discard("U1")  # Ada has left C8 since
        await directories.cache.forget("slack", team, "U1")

        await sender.home_opened("U1", team=team, tab="messages")
        await settle()
        assert "U1" not in api.home_views  # only the Home tab is built

        await sender.home_opened("U1", team=team)
        await settle()
        home = api.home_views["U1"]
        texts = "\n".join(json.dumps(b) for b in home["blocks"])
        assert "MemGPT: Towards LLMs as &lt;Operating Systems&gt;" in texts  # escaped mrkdwn
        assert "arXiv:2310.08560" in texts
        assert "<#C1>" in texts and "<#C9>" in texts and "<#C8>" not in texts
        assert "Our direct messages" in texts
        assert "Ada said hello &amp; asked &lt;things&gt;" in texts
        button = next(b["accessory"] for b in home["blocks"] if "accessory" in b)
        assert button["action_id"] == BUTTON_ACTION
        claims = links.signer.verify(token_of(button["url"]))
        assert (claims.tenant, claims.user) == (team, "U1")

        # pressing the button rebuilds the Home with a new link for the next press
        assert (await sender.block_action(BUTTON_ACTION, "U1", team, button["url"])).status == 200
        await settle()
        pressed = api.home_views["U1"]
        again = next(b["accessory"] for b in pressed["blocks"] if "accessory" in b)["url"]
        assert again != button["url"] and links.signer.verify(token_of(again)).user == "U1"
        response = await press_link(client, again)
        assert response.status == 200 and (await response.json())["user"] == "U1"

        # a Home that Slack refuses is logged, not raised; the next opening publishes again
        api.fail("views.publish", "invalid_auth")
        await sender.home_opened("U1", team=team)
        await settle()
        assert len(api.of("views.publish")) == 3 and api.home_views["U1"] is pressed
        await sender.home_opened("U1", team=team)
        await settle()
        assert len(api.of("views.publish")) == 4 and api.home_views["U1"] is not pressed


async def test_app_home_without_any_memory_yet(world, slack_api):
    team = f"T{time.time_ns()}"
    links = Links(LinkSigner(LINK_SECRET), "http://127.0.0.1")
    async with slack_with_page(world, slack_api, links, Directories(
        slack=slack_directory(slack_api))) as (_, sender, settle):  # fmt: skip
        await sender.home_opened("U2", team=team)
        await settle()
    texts = json.dumps(slack_api.home_views["U2"])
    assert "No papers saved yet" in texts and "No threads with me yet" in texts


def test_the_printed_link_command_is_quoted_for_a_shell():
    """A tenant with a space or a quote still gets a command that runs as printed."""
    assert shlex.split(again_command("127.0.0.1", 8080, "it's ours")) == [
        "arxivscout", "web", "--link", "--host", "127.0.0.1", "--port", "8080",
        "--tenant", "it's ours",
    ]  # fmt: skip


async def test_arxivscout_web_serves_the_page_and_prints_a_local_link(cli_env):
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", "web", "--port", "0",
        env={**cli_env, "ARXIVSCOUT_SECRET": "cli-secret"},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        printed = ""
        while "--link" not in printed:  # the address, the link, how to get another
            line = await asyncio.wait_for(process.stdout.readline(), 120)
            assert line, (await process.stderr.read()).decode()
            printed += line.decode()
        link = re.search(r"http://\S+token=\S+", printed).group(0)
        claims = LinkSigner("cli-secret").verify(token_of(link))
        assert (claims.tenant, claims.user, claims.platform) == ("local", "local", "local")
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as browser:
            base = link.split("/memory/login")[0]
            async with browser.get(f"{base}/memory") as response:
                assert response.status == 401
            async with browser.get(link) as response:  # asks first
                assert response.status == 200 and "Open my memory" in await response.text()
            login = link.split("?")[0]
            async with browser.post(login, data={"token": token_of(link)}) as response:
                assert response.status == 200 and response.url.path == "/memory"  # signed in
            async with browser.get(f"{base}/healthz") as response:
                assert (await response.json())["redis"] == "up"
        port = urlsplit(base).port
        again = re.search(r"run: (arxivscout web --link .*)$", printed, re.M).group(1)
        assert again == f"arxivscout web --link --host 127.0.0.1 --port {port} --tenant local"

        # the link is used: another browser is told how to get a new one without a restart
        async with (
            aiohttp.ClientSession() as phone,
            phone.post(login, data={"token": token_of(link)}) as response,
        ):
            page = await response.text()
            assert response.status == 403 and "<code>arxivscout web --link</code>" in page
        fresh = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "app.cli", *again.split()[1:],
            env={**cli_env, "ARXIVSCOUT_SECRET": "cli-secret"},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(fresh.communicate(), 120)
        assert fresh.returncode == 0, err.decode()
        new_link = re.search(r"http://\S+token=\S+", out.decode()).group(0)
        assert new_link != link and new_link.startswith(f"{base}/memory/login?token=")
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as phone:
            async with phone.get(new_link) as response:
                assert response.status == 200 and "Open my memory" in await response.text()
            async with phone.post(login, data={"token": token_of(new_link)}) as response:
                assert response.status == 200 and response.url.path == "/memory"  # signed in
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)
    assert process.returncode == 0
