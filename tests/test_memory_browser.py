"""The memory page in a real browser: headless Chromium (Debian's, driven by Playwright) against
`arxivscout web` running as its own process, as someone on the server starts it.

One server and one browser serve the whole module. The server asks a local stand-in for Slack's
Web API who each person is (`tests/support/slack_api.py`); links for Slack people are signed with
the server's own secret by `LinkSigner`, as `/memory` in Slack makes them. Screenshots of the
main views are saved as test artifacts (`tests/support/browser.py`, `test-artifacts/`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from playwright.async_api import Browser, BrowserContext, Page, Response, async_playwright
from playwright.async_api import TimeoutError as PlaywrightTimeout

from adapters.memory_page.auth import Links, LinkSigner
from adapters.memory_page.server import SESSION_COOKIE
from memory.browse import PAGE_SIZE
from memory.scope import Scope, Visibility
from memory.stores.entity import Entity
from memory.stores.summary import Summary
from memory.stores.tool_log import ToolLogEntry
from tests.support.browser import FLAGS, WebProcess, ensure_chromium, screenshot_path
from tests.support.memory_seed import PAPER, add_paper, say
from tests.support.slack_api import MockSlackApi

ROOT = Path(__file__).resolve().parents[1]
SECRET = "browser-test-secret-0123456789"
TEAM = "TB"  # the Slack workspace in thread ids
DAY = 1_700_000_000.0  # 2023-11-14 22:13 UTC
LONG = PAGE_SIZE + 30  # messages of the long thread: two pages
WAIT_MS = 15_000  # a browser step that does not happen in this time will not happen

FORGOTTEN_ENTITY = Entity("Quillfeather", "system", "An obscure vector cache the ops team built.")
THROWAWAY_ENTITY = Entity("Ephemeral Widget", "system", "A widget kept only to be forgotten.")


@dataclass
class World:
    tenant: str  # Slack people and the terminal's admin browse this one
    other: str  # another workspace
    empty: str  # an empty workspace an export is imported into
    public: str  # thread ids
    long: str
    ada_dm: str
    grace_dm: str
    private: str
    foreign: str  # a thread of `other`
    foreign_summary: str
    summary_id: str
    log_id: str


def place(tenant: str, channel: str, ts: str, user: str, name: str, kind: Visibility) -> Scope:
    return Scope(tenant, f"slack:{TEAM}:{channel}:{ts}", channel, kind, user, name)


async def seed(memory, tenant: str, other: str, empty: str) -> World:
    pub = place(tenant, "C1", "100.1", "U1", "Ada", Visibility.PUBLIC)
    pub_grace = place(tenant, "C1", "100.1", "U2", "Grace", Visibility.PUBLIC)
    long = place(tenant, "C2", "500.1", "U1", "Ada", Visibility.PUBLIC)
    ada = place(tenant, "DU1", "200.1", "U1", "Ada", Visibility.DM)
    grace = place(tenant, "DU2", "300.1", "U2", "Grace", Visibility.DM)
    private = place(tenant, "G1", "400.1", "U2", "Grace", Visibility.PRIVATE)
    first = await say(memory, pub, "user", "Can you find the MemGPT paper about memory tiers?", DAY)
    await say(memory, pub, "assistant", "Saved MemGPT <b>to</b> the knowledge base.", DAY + 5)
    await say(memory, pub_grace, "user", "Thanks, what about virtual context?", DAY + 60)
    await say(memory, ada, "user", "My private note: the quokka launch is Tuesday.", DAY + 100)
    await say(memory, grace, "user", "Grace's secret: the pelican budget is 42k.", DAY + 200)
    await say(memory, private, "user", "Team G only: the walrus roadmap slips.", DAY + 300)
    for i in range(LONG):
        role = "user" if i % 2 == 0 else "assistant"
        text = f"Step {i:03d} of the long plan"
        await say(memory, long, role, text, DAY + 1000 + i, searchable=False)
    summary = await memory.summaries.save(
        pub, Summary(pub.thread, "Ada asked for MemGPT", "Ada wanted MemGPT saved.", [first.id])
    )
    start, raw = await memory.conversation.unsummarized_snapshot(pub)
    await memory.conversation.mark_summarized(pub, start, raw[:1], summary.id)
    log_id = await memory.tool_logs.write(
        pub, ToolLogEntry(pub.thread, "fetch_and_save_paper_to_kb", {"arxiv_id": PAPER.arxiv_id},
                          "saved 3 passages", "success", duration_ms=812, created_at=DAY + 3),
    )  # fmt: skip
    await add_paper(memory, tenant)
    await memory.entities.upsert(
        pub, [Entity("MemGPT", "system", "An LLM operating system."), FORGOTTEN_ENTITY,
              THROWAWAY_ENTITY],
    )  # fmt: skip
    await memory.entities.upsert(ada, [Entity("Quokka", "project", "Ada's launch.")])
    await memory.entities.upsert(grace, [Entity("Pelican", "project", "Grace's budget line.")])
    await memory.workflows.add(pub, "find MemGPT", ["arxiv_search_candidates -> success",
                                                    "fetch_and_save_paper_to_kb -> success"], "ok")  # fmt: skip
    await memory.workflows.add(grace, "plan pelican", ["search_knowledge_base -> success"], "ok")
    # another workspace: an id of its own that this one's people must not reach
    theirs = place(other, "C7", "900.1", "U1", "Ada", Visibility.PUBLIC)
    await say(memory, theirs, "user", "Otter secret of the other workspace.", DAY)
    foreign_summary = await memory.summaries.save(
        theirs, Summary(theirs.thread, "otters", "Otters were discussed.", [])
    )
    return World(
        tenant, other, empty, pub.thread, long.thread, ada.thread, grace.thread, private.thread,
        theirs.thread, foreign_summary.id, summary.id, log_id,
    )  # fmt: skip


@dataclass
class Site:
    web: WebProcess
    env: dict[str, str]
    links: Links  # signed with the server's secret, pointing at it

    def url(self, path: str) -> str:
        return f"{self.web.base_url}{path}"

    def login(self, tenant: str, user: str, platform: str = "slack") -> str:
        return self.links.login(tenant, user, platform)

    def log_tail(self, chars: int = 3000) -> str:
        """What the server logged last (its tracebacks, when a page says something failed)."""
        return self.web.log.read_text(errors="replace")[-chars:]


def thread_path(thread: str, page: int | None = None) -> str:
    path = f"/memory/threads/{quote(thread, safe='')}"
    return path if page is None else f"{path}?page={page}"


# -- the module's world, server and browser -------------------------------------------------------


@pytest.fixture(scope="module")
async def world(memory) -> AsyncIterator[World]:
    tag = uuid.uuid4().hex[:8]
    tenants = (f"br-{tag}", f"other-{tag}", f"empty-{tag}")
    world = await seed(memory, *tenants)
    yield world
    for tenant in tenants:
        await memory.drop_tenant(tenant)


@pytest.fixture(scope="module")
def slack() -> AsyncIterator[MockSlackApi]:
    """Slack's Web API as the server asks it: Ada (U1) and Grace (U2) are members, Root (U9)
    an admin, Linus (U5) a member named an admin of the empty workspace by ARXIVSCOUT_ADMINS;
    the private channel G1 is Grace's."""
    api = MockSlackApi()
    api.users.update({"U5": "Linus", "U9": "Root"})
    api.admins.add("U9")
    api.members["G1"] = {"U2"}
    api.start_in_thread()
    yield api
    api.stop()


@pytest.fixture(scope="module")
async def site(world, slack, redis_url, data_dir, tmp_path_factory) -> AsyncIterator[Site]:
    drop = ("SLACK_", "DISCORD_", "OPENAI_", "ARXIVSCOUT_ADMINS", "ARXIVSCOUT_PUBLIC_URL", "PORT")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(
        REDIS_URL=redis_url, ARXIVSCOUT_DATA_DIR=str(data_dir), ARXIVSCOUT_EMBEDDINGS="local",
        ARXIVSCOUT_SECRET=SECRET, ARXIVSCOUT_ADMINS=f"{world.empty}:U5",
        SLACK_BOT_TOKEN="xoxb-test", SLACK_API_URL=slack.base_url, PYTHONUNBUFFERED="1",
    )  # fmt: skip
    log = tmp_path_factory.mktemp("web") / "web.log"
    web = await WebProcess(env, world.tenant, log).start()
    try:
        yield Site(web, env, Links(LinkSigner(SECRET), web.base_url))
    finally:
        web.stop()


@pytest.fixture(scope="module")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=ensure_chromium(), args=FLAGS)
        yield chromium
        await chromium.close()


@asynccontextmanager
async def fresh(browser: Browser) -> AsyncIterator[tuple[BrowserContext, Page]]:
    """A browser profile of its own (no cookies), with one tab."""
    context = await browser.new_context(accept_downloads=True)
    context.set_default_timeout(WAIT_MS)
    try:
        yield context, await context.new_page()
    finally:
        await context.close()


async def open_link(page: Page, link: str, site: Site) -> Response:
    """Open a sign-in link and press its page's button (the POST that starts the session)."""
    response = await page.goto(link)
    assert response is not None and response.status == 200, (
        f"{await main_text(page)}\nthe server logged: {site.log_tail()}"
    )
    async with page.expect_navigation() as navigation:
        await page.get_by_role("button", name="Open my memory").click()
    response = await navigation.value
    assert response is not None
    return response


@asynccontextmanager
async def signed_in(
    browser: Browser, site: Site, tenant: str, user: str, platform: str = "slack"
) -> AsyncIterator[Page]:
    """A tab that opened `user`'s signed link and landed on the overview."""
    async with fresh(browser) as (_, page):
        response = await open_link(page, site.login(tenant, user, platform), site)
        assert response.status == 200, (
            f"{await main_text(page)}\nthe server logged: {site.log_tail()}"
        )
        assert urlsplit(page.url).path == "/memory"
        yield page


async def shot(page: Page, name: str) -> None:
    await page.screenshot(path=str(screenshot_path(name)), full_page=True)


async def main_text(page: Page) -> str:
    return await page.locator("main").inner_text()


SUBMIT = """([action, fields]) => {
  const form = document.createElement('form');
  form.method = 'post';
  form.action = action;
  for (const [name, value] of Object.entries(fields)) {
    const input = document.createElement('input');
    input.type = 'hidden';
    input.name = name;
    input.value = value;
    form.appendChild(input);
  }
  document.body.appendChild(form);
  form.submit();
}"""


async def submit(page: Page, action: str, fields: dict[str, str]) -> Response:
    """Post a form the page did not offer, from the page (as someone could with devtools)."""
    async with page.expect_navigation() as navigation:
        await page.evaluate(SUBMIT, [action, fields])
    response = await navigation.value
    assert response is not None
    return response


async def csrf_of(page: Page) -> str:
    token = await page.locator('input[name="csrf"]').first.get_attribute("value")
    assert token, "the page carries no CSRF token"
    return token


async def arxivscout(env: dict[str, str], *args: str) -> str:
    """Run a command as the operator would; its output (it must succeed)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app.cli", *args, cwd=ROOT, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode == 0, f"arxivscout {args[0]} failed: {err.decode()[-3000:]}"
    return out.decode()


async def download(site: Site, page: Page, link_name: str, path: Path) -> Path:
    """Click a link that downloads a file; where it was saved."""
    try:
        async with page.expect_download(timeout=WAIT_MS) as started:
            await page.get_by_role("link", name=link_name).click()
        await (await started.value).save_as(path)
    except PlaywrightTimeout:
        pytest.fail(
            f"{link_name!r} downloaded nothing; the page shows: {await main_text(page)}\n"
            f"the server logged: {site.log_tail()}"
        )
    return path


def canonical(path: Path, tenant: str) -> list[str]:
    """An export's records, comparable with another tenant's: the tenant's name and the time
    of the export left out, records in a fixed order."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if k != "exported_at"}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return "<tenant>" if value == tenant else value

    lines = [line for line in path.read_text().splitlines() if line.strip()]
    return sorted(json.dumps(clean(json.loads(line)), sort_keys=True) for line in lines)


# -- signing in ----------------------------------------------------------------------------------


async def test_the_printed_link_opens_the_overview_with_an_httponly_session(site, browser, world):
    async with fresh(browser) as (context, page):
        response = await page.goto(site.web.link)  # what `arxivscout web` printed
        assert response is not None and response.status == 200
        assert "local user local" in await main_text(page)  # asks first, signs in nobody
        assert not [c for c in await context.cookies() if c["name"] == SESSION_COOKIE]
        await shot(page, "login-confirm")
        response = await open_link(page, site.web.link, site)
        assert response.status == 200
        assert urlsplit(page.url).path == "/memory" and "token" not in page.url
        cookies = [c for c in await context.cookies() if c["name"] == SESSION_COOKIE]
        assert len(cookies) == 1, await context.cookies()
        cookie = cookies[0]
        assert cookie["httpOnly"] is True and cookie["path"] == "/memory"
        assert cookie["sameSite"] == "Lax"
        assert SESSION_COOKIE not in await page.evaluate("document.cookie")  # not for scripts
        assert await page.locator("h1").inner_text() == "What ArxivScout remembers"
        assert f"local · {world.tenant} · admin" in await page.locator(".who").inner_text()
        text = await main_text(page)
        assert "Team G only: the walrus roadmap slips." in text  # the admin sees every thread
        for thread in (world.public, world.ada_dm, world.grace_dm, world.private, world.long):
            assert thread in text, thread
        assert await page.get_by_role("heading", name="Workspace administration").is_visible()


async def test_a_slack_link_shows_that_person_what_they_may_see(site, browser, world):
    async with signed_in(browser, site, world.tenant, "U1") as page:  # Ada
        assert "Ada · " in await page.locator(".who").inner_text()
        text = await main_text(page)
        assert world.public in text and world.ada_dm in text and world.long in text
        assert world.grace_dm not in text and world.private not in text
        assert "Workspace administration" not in text
        await shot(page, "overview-member")


# -- browsing ------------------------------------------------------------------------------------


async def test_browse_a_thread_with_speakers_dates_and_summary(site, browser, world):
    async with signed_in(browser, site, world.tenant, "U1") as page:
        await page.get_by_role(
            "link", name="Can you find the MemGPT paper about memory tiers?"
        ).click()
        await page.wait_for_url(f"**{thread_path(world.public)}")
        speakers = await page.locator("#m0, #m1, #m2").locator(".speaker").all_inner_texts()
        assert speakers == ["Ada", "assistant", "Grace"]
        text = await main_text(page)
        assert "2023-11-14 22:13 UTC" in text and "channel C1" in text
        assert "Saved MemGPT <b>to</b> the knowledge base." in text  # shown as text, not markup
        assert await page.locator("main b").count() == 0
        assert f"in {world.summary_id}" in text  # the summarized message names its summary
        summary = page.locator(f"[id='{world.summary_id}']")
        assert "Ada asked for MemGPT" in await summary.inner_text()
        assert not await summary.get_by_text("Ada wanted MemGPT saved.").is_visible()
        await summary.get_by_text("Show the summary").click()
        assert await summary.get_by_text("Ada wanted MemGPT saved.").is_visible()
        tool = page.locator(".item", has_text="fetch_and_save_paper_to_kb")
        assert "success" in await tool.inner_text()
        # Ada may forget her own message, not Grace's nor the public thread
        assert await page.locator("#m0").get_by_role("button", name="Forget").count() == 1
        assert await page.locator("#m2").get_by_role("button", name="Forget").count() == 0
        assert await page.get_by_role("button", name="Forget thread").count() == 0
        await shot(page, "thread")


async def test_a_long_thread_pages_back_to_its_start(site, browser, world):
    async with signed_in(browser, site, world.tenant, "U1") as page:
        await page.get_by_role("link", name="Step 000 of the long plan").click()
        await page.wait_for_url(f"**{thread_path(world.long)}")
        texts = await page.locator(".item .text").all_inner_texts()
        assert texts[0] == f"Step {PAGE_SIZE:03d} of the long plan"  # the newest page first
        assert (
            texts[-1] == f"Step {LONG - 1:03d} of the long plan" and len(texts) == LONG - PAGE_SIZE
        )
        assert "page 2 of 2" in await page.locator(".pager").first.inner_text()
        await page.get_by_role("link", name="‹ Older").first.click()
        await page.wait_for_url("**?page=1")
        texts = await page.locator(".item .text").all_inner_texts()
        assert texts == [f"Step {i:03d} of the long plan" for i in range(PAGE_SIZE)]
        assert "page 1 of 2" in await page.locator(".pager").first.inner_text()
        await shot(page, "thread-page-1")


async def search(page: Page, query: str) -> str:
    box = page.locator("header").get_by_role("searchbox", name="Search")
    await box.fill(query)
    await box.press("Enter")
    await page.wait_for_url(re.compile(r"/memory/search\?q="))
    return await main_text(page)


async def test_search_finds_a_message_and_a_passage_but_not_another_persons_dm(
    site, browser, world
):
    async with signed_in(browser, site, world.tenant, "U1") as page:
        text = await search(page, "quokka launch")
        assert "My private note: the quokka launch is Tuesday." in text and world.ada_dm in text
        hit = page.locator(".item", has_text="quokka launch").get_by_role("link", name=world.ada_dm)
        assert await hit.get_attribute("href") == thread_path(world.ada_dm, 1) + "#m0"
        text = await search(page, "zanzibarite benchmark")
        assert "zanzibarite benchmark" in text and PAPER.title in text
        passage = page.get_by_role("link", name=PAPER.title)
        assert await passage.first.get_attribute("href") == f"/memory/papers/{PAPER.arxiv_id}#c2"
        await shot(page, "search")
        text = await search(page, "pelican budget")
        assert "42k" not in text and world.grace_dm not in text
        text = await search(page, "walrus roadmap")
        assert "the walrus roadmap slips" not in text and world.private not in text
    async with signed_in(browser, site, world.tenant, "U2") as page:  # Grace finds her own
        assert "the pelican budget is 42k" in await search(page, "pelican budget")


# -- forget, export, import ----------------------------------------------------------------------


async def test_a_forgotten_entity_leaves_the_next_turns_context(site, browser, world):
    question = "What is Quillfeather used for?"
    args = ("context", "--tenant", world.tenant, "--thread", world.public, question)
    before = await arxivscout(site.env, *args)
    assert FORGOTTEN_ENTITY.line() in before, before
    async with signed_in(browser, site, world.tenant, "U9") as page:  # a workspace admin
        await page.get_by_role("link", name="Entities").click()
        await page.wait_for_url("**/memory/entities")
        item = page.locator(".item", has_text=FORGOTTEN_ENTITY.name)
        assert await item.count() == 1
        await item.get_by_role("button", name="Forget").click()
        await page.wait_for_url(re.compile(r"/memory/forget/confirm\?"))  # what would go
        assert FORGOTTEN_ENTITY.description in await main_text(page)
        await shot(page, "forget-confirm")
        await page.get_by_role("button", name="Forget for good").click()
        await page.wait_for_url("**/memory/entities")
        assert "Forgotten" in await page.locator(".flash.done").inner_text()
        await shot(page, "entities-forgotten")
        assert FORGOTTEN_ENTITY.name not in await main_text(page)
        assert "MemGPT" in await main_text(page)  # only that one
    after = await arxivscout(site.env, *args)
    assert "Entity Memory" in after and "Quillfeather (system)" not in after, after
    assert FORGOTTEN_ENTITY.description not in after


async def test_export_then_import_into_an_empty_workspace_round_trips(
    site, browser, world, tmp_path
):
    async with signed_in(browser, site, world.tenant, "U9") as page:
        first = await download(
            site, page, "Export the whole workspace (JSON Lines)", tmp_path / "a.jsonl"
        )
    exported = first.read_text()
    for said in ("walrus roadmap slips", "pelican budget is 42k", "zanzibarite", "Step 000"):
        assert said in exported, said
    async with signed_in(browser, site, world.empty, "U5") as page:  # named an admin there
        assert "admin" in await page.locator(".who").inner_text()
        await page.locator('input[name="file"]').set_input_files(first)
        await page.get_by_role("button", name="Import", exact=True).click()
        await page.wait_for_url("**/memory")
        flash = await page.locator(".flash").inner_text()
        assert "Imported" in flash, flash
        await shot(page, "overview-imported")
        assert world.private in await main_text(page)  # the imported threads are listed
        second = await download(
            site, page, "Export the whole workspace (JSON Lines)", tmp_path / "b.jsonl"
        )
    assert canonical(second, world.empty) == canonical(first, world.tenant)


# -- refused ---------------------------------------------------------------------------------------


async def test_an_expired_link_is_refused(site, browser, world):
    past = LinkSigner(SECRET, clock=lambda: time.time() - 2 * 3600)  # made two hours ago
    expired = Links(past, site.web.base_url).login(world.tenant, "U1", "slack")
    async with fresh(browser) as (context, page):
        response = await page.goto(expired)
        assert response is not None and response.status == 403
        assert "This link has expired" in await page.locator("h1").inner_text()
        assert "/memory" in await main_text(page)  # says how to get a new one
        assert not [c for c in await context.cookies() if c["name"] == SESSION_COOKIE]
        await shot(page, "error-expired-link")
        response = await page.goto(site.url("/memory"))
        assert response is not None and response.status == 401
        assert "Please sign in again" in await page.locator("h1").inner_text()


def _forgeries(good: str) -> dict[str, str]:
    version, payload, signature = good.split(".")
    claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    claims["u"] = "U9"  # claims to be the admin, under Ada's signature
    raised = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    return {
        "signature changed": f"{version}.{payload}.{flipped}",
        "payload changed": f"{version}.{raised}.{signature}",
        "another secret": LinkSigner("not-the-server-secret").sign(claims["t"], "U1", "slack"),
        "cut short": good[: len(good) // 2],
    }


async def test_a_forged_link_is_refused(site, browser, world):
    good = site.links.signer.sign(world.tenant, "U1", "slack")
    for what, token in _forgeries(good).items():
        async with fresh(browser) as (context, page):
            response = await page.goto(site.url(f"/memory/login?token={quote(token, safe='')}"))
            assert response is not None and response.status == 403, what
            assert "This link is not valid" in await page.locator("h1").inner_text(), what
            assert not [c for c in await context.cookies() if c["name"] == SESSION_COOKIE], what
            if what == "signature changed":
                await shot(page, "error-forged-link")
    async with fresh(browser) as (_, page):  # the same link unaltered opens
        response = await open_link(page, site.url(f"/memory/login?token={quote(good, safe='')}"),
                                   site)  # fmt: skip
        assert response.status == 200 and urlsplit(page.url).path == "/memory"


async def test_another_site_cannot_sign_a_browser_in_with_its_own_link(site, browser, world):
    """Login CSRF: a page elsewhere that posts someone's valid token is refused."""
    token = site.links.signer.sign(world.tenant, "U9", "slack")  # the attacker's own link
    attack = (
        f'<form method="post" action="{site.url("/memory/login")}"><input type="hidden" '
        f'name="token" value="{token}"><button>Win a prize</button></form>'
    )
    async with fresh(browser) as (context, page):
        await page.goto(f"data:text/html,{quote(attack)}")  # an origin that is not the page's
        async with page.expect_navigation() as navigation:
            await page.get_by_role("button", name="Win a prize").click()
        response = await navigation.value
        assert response is not None and response.status == 403
        assert "own sign-in page" in await main_text(page)
        assert not [c for c in await context.cookies() if c["name"] == SESSION_COOKIE]


async def test_another_workspaces_thread_is_not_found(site, browser, world, memory):
    assert await memory.browse.thread_audience(world.other, world.foreign) is not None  # it exists
    async with signed_in(browser, site, world.tenant, "U9") as page:  # an admin, of this one
        response = await page.goto(site.url(thread_path(world.foreign)))
        assert response is not None and response.status == 404
        assert "Otter" not in await main_text(page)
        exported = await page.context.request.get(
            site.url(f"/memory/export?thread={quote(world.foreign)}")
        )
        assert exported.status == 404
        await page.goto(site.url("/memory"))
        response = await submit(page, "/memory/forget", {
            "csrf": await csrf_of(page), "kind": "summary", "id": world.foreign_summary,
        })  # fmt: skip
        assert response.status == 404
    assert await memory.browse.summary(world.other, world.foreign_summary, None) is not None


async def test_another_persons_dm_is_not_found(site, browser, world):
    async with signed_in(browser, site, world.tenant, "U1") as page:  # Ada
        response = await page.goto(site.url(thread_path(world.grace_dm)))
        assert response is not None and response.status == 404
        text = await main_text(page)
        assert "Not found" in text and "pelican" not in text and "42k" not in text
        await shot(page, "error-not-found")
        response = await page.goto(site.url(f"/memory/export?thread={quote(world.grace_dm)}"))
        assert response is not None and response.status == 404
        response = await page.goto(site.url(thread_path(world.ada_dm)))  # her own opens
        assert response is not None and response.status == 200
    async with signed_in(browser, site, world.tenant, "U2") as page:  # and Grace's opens for her
        response = await page.goto(site.url(thread_path(world.grace_dm)))
        assert response is not None and response.status == 200
        assert "the pelican budget is 42k" in await main_text(page)


async def test_a_member_posting_an_admin_action_is_refused(site, browser, world, memory):
    async with signed_in(browser, site, world.tenant, "U1") as page:  # Ada, not an admin
        token = await csrf_of(page)  # her session's real token, from the page
        attempts = {
            "forget a paper": ("/memory/forget", {"kind": "paper", "id": PAPER.arxiv_id}),
            "forget an entity": ("/memory/forget", {"kind": "entity", "id": "memgpt"}),
            "set retention": ("/memory/retention", {"days": "1"}),
            "forget another person": ("/memory/people/forget", {"user": "U2", "confirm": "yes"}),
        }
        for what, (action, fields) in attempts.items():
            await page.goto(site.url("/memory"))
            response = await submit(page, action, {"csrf": token, **fields})
            assert response.status == 403, what
            assert "Only an admin" in await main_text(page), what  # the page refused, not CSRF
        await shot(page, "error-not-allowed")
        response = await page.context.request.get(site.url("/memory/export"))
        assert response.status == 403  # the whole workspace's export is an admin's
        await page.goto(site.url("/memory/papers"))
        assert PAPER.title in await main_text(page)
        await page.goto(site.url("/memory/entities"))
        assert "MemGPT" in await main_text(page)
    assert await memory.retention.own(world.tenant) == (False, None)  # still the default


async def test_a_form_without_its_csrf_token_is_refused(site, browser, world):
    forget = {"kind": "entity", "id": "ephemeral widget", "back": "/memory/entities"}
    async with signed_in(browser, site, world.tenant, "U9") as page:  # an admin: only CSRF stops it
        await page.goto(site.url("/memory/entities"))
        response = await submit(page, "/memory/forget", forget)  # no csrf field
        assert response.status == 403
        assert "security token" in await main_text(page)
        await shot(page, "error-csrf")
        await page.goto(site.url("/memory/entities"))
        response = await submit(page, "/memory/forget", {**forget, "csrf": "not-the-token"})
        assert response.status == 403
        sent = await page.context.request.post(site.url("/memory/forget"), form=forget,
                                               max_redirects=0)  # fmt: skip
        assert sent.status == 403 and "security token" in await sent.text()
        await page.goto(site.url("/memory/entities"))
        assert THROWAWAY_ENTITY.name in await main_text(page)  # nothing was forgotten
        # the same form with the page's token goes through
        response = await submit(page, "/memory/forget", {**forget, "csrf": await csrf_of(page)})
        assert response.status == 200 and urlsplit(page.url).path == "/memory/entities"
        assert "Forgotten" in await page.locator(".flash.done").inner_text()
        assert THROWAWAY_ENTITY.name not in await main_text(page)


# -- screenshots of the main views (looked at by a person) ---------------------------------------


async def test_screenshots_of_the_main_views(site, browser, world):
    async with signed_in(browser, site, world.tenant, "U9") as page:
        views = {
            "overview": "/memory",
            "thread-admin": thread_path(world.public),
            "papers": "/memory/papers",
            "paper": f"/memory/papers/{PAPER.arxiv_id}",
            "entities": "/memory/entities",
            "workflows": "/memory/workflows",
            "search-admin": "/memory/search?q=memgpt+memory",
        }
        for name, path in views.items():
            response = await page.goto(site.url(path))
            assert response is not None and response.status == 200, (name, await main_text(page))
            await shot(page, name)
            assert screenshot_path(name).stat().st_size > 10_000, name
