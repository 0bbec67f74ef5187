"""The memory page's powers and limits, over real HTTP and a real Redis: a Discord DM's owner
manages their memory but is no admin (no import); only an admin's import is read, and only
after its CSRF token, its first field; a thread's export tells a member the rating and their
own vote only; a remembered URL is a link only when it is a web address; a walled Slack person
is never an admin; an import's count of watches reads as English."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestClient, TestServer
from slack_sdk.web.async_client import AsyncWebClient
from yarl import URL

from adapters.memory_page.access import Admins, Directories, DiscordDirectory, SlackDirectory
from adapters.memory_page.auth import Links, LinkSigner
from adapters.memory_page.pages import counted, listed
from adapters.memory_page.server import MAX_IMPORT_BYTES, memory_page
from adapters.memory_page.viewer import Viewer
from adapters.web import build_web_app
from memory.links import web_link
from memory.portability import dumps
from memory.scope import PUBLIC, Scope
from memory.stores.knowledge_base import Chunk, Paper
from memory.stores.turn_records import TurnRecord, Vote
from tests.support.slack_api import MockSlackApi
from tests.test_memory_page import get, page_client, seed, viewers

BOUNDARY = "powers-test-boundary"


class Known:
    """A directory (`access.Directory`) of fixed people, without asking a platform."""

    def __init__(self, *people: Viewer) -> None:
        self.people = {v.user: v for v in people}

    async def viewer(self, tenant: str, user: str, platform: str) -> Viewer:
        return self.people[user]


@asynccontextmanager
async def site(memory, directory) -> AsyncIterator[tuple[TestClient, Links]]:
    """The web app as `arxivscout web` builds it, with the real memory page and its guard."""
    links = Links(LinkSigner("powers-test-secret"), "http://127.0.0.1")
    app = build_web_app(memory, page=memory_page(memory, links, directory))
    async with TestClient(TestServer(app)) as client:
        yield client, links


async def sign_in(client: TestClient, links: Links, tenant: str, user: str, platform: str) -> str:
    """Open `user`'s link (its page's button); the session's CSRF token, from the overview."""
    login = URL(links.login(tenant, user, platform))
    await client.get(login.path_qs, allow_redirects=False)  # its page gives the sign-in cookie
    response = await client.post(login.path, data={"token": login.query["token"]},
                                 allow_redirects=False)  # fmt: skip
    assert response.status == 303, await response.text()
    html = await (await client.get("/memory")).text()
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def import_form(csrf: str | None, content: bytes, token_first: bool = True) -> aiohttp.FormData:
    """The overview's import form as a browser sends it: the token first (or, to test, last)."""
    form = aiohttp.FormData()
    if csrf is not None and token_first:
        form.add_field("csrf", csrf)
    form.add_field("back", "/memory")
    form.add_field("file", content, filename="export.jsonl", content_type="application/x-ndjson")
    if csrf is not None and not token_first:
        form.add_field("csrf", csrf)
    return form


async def flash_after(client: TestClient, response: aiohttp.ClientResponse) -> str:
    """The message the page shows after a form's redirect."""
    assert response.status == 303, (response.status, await response.text())
    html = await (await client.get(response.headers["Location"])).text()
    found = re.search(r'<p class="flash \w+" role="\w+">([^<]*)</p>', html)
    return found.group(1) if found else ""


@pytest.fixture
async def exported(memory) -> AsyncIterator[bytes]:
    """A whole tenant's export (tests/test_memory_page.py's world) as its file's bytes."""
    source = f"t-{uuid.uuid4().hex[:10]}"
    await seed(memory, source)
    lines = [dumps(r) + "\n" async for r in memory.portability.export_tenant(source)]
    yield "".join(lines).encode()
    await memory.drop_tenant(source)


# -- 1. a Discord DM's owner is no admin ---------------------------------------------------------


async def test_a_dm_owner_keeps_their_powers_but_only_an_admin_imports(memory, exported):
    user = str(uuid.uuid4().int % 10**18)
    dm = f"dm-{user}"
    owner_directory = Directories(discord=DiscordDirectory(token=None))
    try:
        async with site(memory, owner_directory) as (client, links):
            csrf = await sign_in(client, links, dm, user, "discord")
            html = await (await client.get("/memory")).text()
            assert "· owner" in html and "· admin" not in html
            assert 'action="/memory/import"' not in html and "ARXIVSCOUT_ADMINS" in html
            response = await client.post("/memory/import", data=import_form(csrf, exported),
                                         allow_redirects=False)  # fmt: skip
            assert response.status == 403 and "Only an admin" in await response.text()
            assert await memory.conversation.threads(dm) == []  # nothing was imported
        # ARXIVSCOUT_ADMINS names them: now an admin, they may import
        admin_directory = Directories(admins=Admins(f"{dm}:{user}"),
                                      discord=DiscordDirectory(token=None))  # fmt: skip
        async with site(memory, admin_directory) as (client, links):
            csrf = await sign_in(client, links, dm, user, "discord")
            assert 'action="/memory/import"' in await (await client.get("/memory")).text()
            response = await client.post("/memory/import", data=import_form(csrf, exported),
                                         allow_redirects=False)  # fmt: skip
            assert (await flash_after(client, response)).startswith("Imported")
        # the owner keeps every other power over their memory: see, fix, erase, export it all
        async with site(memory, owner_directory) as (client, links):
            csrf = await sign_in(client, links, dm, user, "discord")
            entities = {e.name: e.id for e in await memory.browse.entities(dm, None)}
            html = await (await client.get("/memory")).text()
            assert "walrus roadmap" in html and "quokka launch" in html and "Managing" in html
            response = await client.get("/memory/export")
            assert response.status == 200 and "pelican budget" in await response.text()
            forms = [
                ("/memory/forget", {"kind": "entity", "id": entities["MemGPT"]}),
                (
                    "/memory/entities/edit",
                    {"id": entities["Quokka"], "description": "Renamed launch."},
                ),
                ("/memory/retention", {"days": "30"}),
                ("/memory/people/forget", {"user": "U2", "confirm": "yes"}),
            ]
            for path, form in forms:
                response = await client.post(path, data={"csrf": csrf, **form},
                                             allow_redirects=False)  # fmt: skip
                assert response.status == 303, (path, await response.text())
        assert await memory.retention.get(dm) == 30
        left = {e.name: e.description for e in await memory.browse.entities(dm, None)}
        assert "MemGPT" not in left and left["Quokka"] == "Renamed launch."
    finally:
        await memory.drop_tenant(dm)


# -- 2. an import's body: only an admin's, read after its token ------------------------------------


def multipart(*parts: tuple[str, bytes, str | None]) -> bytes:
    """Parts (name, content, file name) of a multipart/form-data body, without its end."""
    body = b""
    for name, content, file_name in parts:
        named = f'name="{name}"' + (f'; filename="{file_name}"' if file_name else "")
        body += f"--{BOUNDARY}\r\nContent-Disposition: form-data; {named}\r\n\r\n".encode()
        body += content + b"\r\n"
    return body


async def test_an_import_by_someone_no_admin_is_refused_before_its_body_is_read(memory, tenant):
    """The upload never ends: the refusal must come without reading it."""
    member = viewers(tenant)["alice"]
    async with site(memory, Known(member)) as (client, links):
        csrf = await sign_in(client, links, tenant, member.user, "slack")
        rest_may_come = asyncio.Event()

        async def upload() -> AsyncIterator[bytes]:
            start = multipart(("csrf", csrf.encode(), None))
            yield start[: -len(b"\r\n")]  # not even the token's field ends
            await rest_may_come.wait()  # the rest, a large file: never sent
            yield b"\r\n" + multipart(("file", b"x" * 65_536, "big.jsonl"))
            yield f"--{BOUNDARY}--\r\n".encode()

        headers = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}
        try:
            async with asyncio.timeout(60):  # without the guard's early refusal, a hang
                response = await client.post("/memory/import", data=upload(), headers=headers,
                                             allow_redirects=False)  # fmt: skip
                status, text = response.status, await response.text()
        finally:
            rest_may_come.set()
        assert status == 403 and "Only an admin" in text
    assert await memory.conversation.threads(tenant) == []


async def test_an_admins_import_reads_its_token_first_and_takes_more_than_a_form(
    memory, tenant, exported
):
    admin = viewers(tenant)["admin"]
    async with site(memory, Known(admin)) as (client, links):
        csrf = await sign_in(client, links, tenant, admin.user, "slack")
        for form in (import_form(csrf, exported, token_first=False),  # the file before it
                     import_form("x" * len(csrf), exported), import_form(None, exported)):  # fmt: skip
            response = await client.post("/memory/import", data=form, allow_redirects=False)
            assert response.status == 403 and "security token" in await response.text()
        assert await memory.conversation.threads(tenant) == []
        too_large = import_form(csrf, b" " * (MAX_IMPORT_BYTES + 1))
        response = await client.post("/memory/import", data=too_large, allow_redirects=False)
        assert "too large" in await flash_after(client, response)
        assert await memory.conversation.threads(tenant) == []
        # more than the 1 MB any other form may be: blank lines, which an import skips
        padded = exported + (b" " * 1023 + b"\n") * 1500
        assert len(padded) > 1.4 * 1024 * 1024
        response = await client.post("/memory/import", data=import_form(csrf, padded),
                                     allow_redirects=False)  # fmt: skip
        assert (await flash_after(client, response)).startswith("Imported")
    assert await memory.conversation.threads(tenant)


# -- 4. a thread's export: the rating and one's own vote --------------------------------------------


async def test_a_thread_export_gives_a_member_the_rating_and_their_own_vote_only(memory, tenant):
    world = await seed(memory, tenant)
    turn = TurnRecord(id=f"turn-{uuid.uuid4().hex[:8]}", tenant=tenant, thread=world.public,
                      question="Can you find MemGPT?", answer="Saved it.", audience=PUBLIC,
                      channel="C1", asker="U1", asker_name="Alice")  # fmt: skip
    records = memory.turn_records
    assert await records.save(turn)
    await records.vote(tenant, turn.id, Vote("U1", 1, "Alice"))
    await records.vote(tenant, turn.id, Vote("U3", 1, "Carol"))
    await records.comment(tenant, turn.id, "U2", "It cited the wrong pelican paper.", name="Bob")

    async def exported_turn(client: TestClient, who: str) -> dict:
        status, text = await get(client, f"/memory/export?thread={world.public}", who)
        assert status == 200
        lines = [json.loads(line) for line in text.splitlines()]
        return next(r["turn"] for r in lines if r["kind"] == "turn")

    try:
        async with page_client(memory, tenant) as client:
            alice = await exported_turn(client, "alice")
            assert alice["rating"] == 1  # as the thread's page shows it
            assert [(v["user"], v["rating"]) for v in alice["feedback"]] == [("U1", 1)]
            assert "pelican paper" not in json.dumps(alice) and "Carol" not in json.dumps(alice)
            bob = await exported_turn(client, "bob")
            assert [(v["user"], v["comment"]) for v in bob["feedback"]] == [
                ("U2", "It cited the wrong pelican paper.")
            ]
            admin = await exported_turn(client, "admin")  # an admin's export keeps every vote
            assert {v["user"] for v in admin["feedback"]} == {"U1", "U2", "U3"}
    finally:
        await memory.drop_tenant(tenant)


# -- 3. a remembered URL is a link only when it is the web's --------------------------------------


def test_only_web_addresses_are_kept_as_links():
    arxiv = "https://arxiv.org/abs/2401.00001"
    assert web_link("https://example.org/p.pdf", arxiv) == "https://example.org/p.pdf"
    assert web_link(" HTTP://example.org/a ", arxiv) == "HTTP://example.org/a"
    for bad in ("javascript:alert(1)", " JavaScript:alert(1)", "java\tscript:alert(1)",
                "data:text/html,<script>x</script>", "vbscript:x", "http:alert(1)", "//evil",
                "/memory", ""):  # fmt: skip
        assert web_link(bad, arxiv) == arxiv, bad
        assert web_link(bad) == "", bad


async def test_a_paper_page_links_only_to_web_addresses(memory, tenant):
    papers = [
        Paper("2401.00001", "Scripted arXiv paper", url="javascript:alert(document.cookie)"),
        Paper("pdf-0a1b2c3d4e5f", "Scripted shared PDF", url="javascript:alert(1)"),
        Paper("2401.00002", "A paper with its own page", url="https://example.org/paper"),
    ]
    vector = np.asarray(await memory.embedder.embed(["a passage"]))
    for paper in papers:
        chunk = Chunk("a passage", "Introduction", 0)
        await memory.knowledge_base.add_paper(Scope(tenant), paper, [chunk], vector)
    try:
        async with page_client(memory, tenant) as client:
            pages = {}
            for paper in papers:
                status, pages[paper.arxiv_id] = await get(
                    client, f"/memory/papers/{paper.arxiv_id}"
                )
                assert status == 200 and paper.title in pages[paper.arxiv_id]
        assert all("javascript:" not in html for html in pages.values())
        assert 'href="https://arxiv.org/abs/2401.00001"' in pages["2401.00001"]  # its arXiv link
        assert '<a class="meta"' not in pages["pdf-0a1b2c3d4e5f"]  # no arXiv paper: no link
        assert 'href="https://example.org/paper"' in pages["2401.00002"]
    finally:
        await memory.drop_tenant(tenant)


# -- 5. a walled Slack person is never an admin ----------------------------------------------------


@pytest.fixture
async def slack_api() -> AsyncIterator[MockSlackApi]:
    api = MockSlackApi()
    await api.start()
    yield api
    await api.close()


async def test_a_walled_slack_person_is_never_an_admin(slack_api):
    """Slack may report a Slack Connect person's admin status in their own organisation."""
    slack_api.users.update({"U7": "Xavier", "U8": "Gina"})
    slack_api.admins.update({"U1", "U7", "U8"})
    slack_api.strangers.add("U7")  # of another organisation, an admin there
    slack_api.enterprises["U7"] = "E-OTHER"
    slack_api.guests.add("U8")  # a guest flagged an admin
    directory = SlackDirectory(AsyncWebClient(token="xoxb-test", base_url=slack_api.base_url))
    assert (await directory.viewer("T1", "U1")).admin  # the workspace's own admin
    for walled in ("U7", "U8"):
        viewer = await directory.viewer("T1", walled)
        assert not viewer.admin and not viewer.manages, walled
        assert not viewer.can_see(PUBLIC) and not viewer.can_see("dm:DU1"), walled


# -- 6. counts in words --------------------------------------------------------------------------


def test_an_imports_watches_are_counted_in_english():
    assert counted(1, "watches") == "1 watch" and counted(3, "watches") == "3 watches"
    assert listed([("messages", 2), ("watches", 1)]) == "2 messages, 1 watch"
