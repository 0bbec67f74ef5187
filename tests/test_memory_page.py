"""The memory page over real HTTP and a real Redis: what each person sees, paging, search, and
who may forget, edit, export and import what.

Most tests mount the pages behind a middleware of their own that names the viewer
(`X-Test-Viewer`), so each can look as several people; `test_pages_behind_the_real_middleware`
goes through the real access middleware (`adapters/memory_page/server.py`): its signed links,
sessions and CSRF check."""

from __future__ import annotations

import json
import re
from contextlib import asynccontextmanager
from dataclasses import dataclass
from urllib.parse import parse_qsl, urlencode

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from adapters.memory_page.auth import Links, LinkSigner
from adapters.memory_page.pages import counted, erased, page_routes, safe_back
from adapters.memory_page.server import IMPORT_PATH, SESSION_COOKIE, Flashed, memory_page
from adapters.memory_page.viewer import CSRF, IMPORT_FORM, VIEWER, Viewer
from memory.browse import PAGE_SIZE
from memory.governance import Erasure
from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.entity import Entity
from memory.stores.summary import Summary
from memory.stores.tool_log import ToolLogEntry
from memory.web_sessions import WebSessions
from tests.support.memory_seed import PAPER, PASSAGES, add_paper, say


@dataclass
class World:
    tenant: str
    public: str  # thread ids
    alice_dm: str
    bob_dm: str
    private: str
    summary_id: str
    log_id: str
    alice_message: str  # alice's message in the public thread
    bob_message: str  # bob's message in the public thread


def slack_scope(tenant: str, channel: str, ts: str, user: str, name: str, kind: Visibility):
    return Scope(tenant, f"slack:{tenant}:{channel}:{ts}", channel, kind, user, name)


async def seed(memory, tenant: str) -> World:
    pub = slack_scope(tenant, "C1", "100.1", "U1", "Alice", Visibility.PUBLIC)
    pub_bob = slack_scope(tenant, "C1", "100.1", "U2", "Bob", Visibility.PUBLIC)
    adm = slack_scope(tenant, "D1", "200.1", "U1", "Alice", Visibility.DM)
    bdm = slack_scope(tenant, "D2", "300.1", "U2", "Bob", Visibility.DM)
    priv = slack_scope(tenant, "G1", "400.1", "U2", "Bob", Visibility.PRIVATE)
    day = 1_700_000_000.0
    alice = await say(memory, pub, "user", "Can you find the MemGPT paper about memory tiers?", day)
    await say(memory, pub, "assistant", "Saved MemGPT <b>to</b> the knowledge base.", day + 5)
    bob = await say(memory, pub_bob, "user", "Thanks, what about virtual context?", day + 60)
    await say(memory, adm, "user", "My private note: the quokka launch is Tuesday.", day + 100)
    await say(memory, bdm, "user", "Bob's secret: the pelican budget is 42k.", day + 200)
    await say(memory, priv, "user", "Team G only: the walrus roadmap slips.", day + 300)
    summary = await memory.summaries.save(
        pub, Summary(pub.thread, "Alice asked for MemGPT", "Alice wanted MemGPT saved.", [alice.id])
    )
    first, raw = await memory.conversation.unsummarized_snapshot(pub)
    await memory.conversation.mark_summarized(pub, first, raw[:1], summary.id)
    log_id = await memory.tool_logs.write(
        pub, ToolLogEntry(pub.thread, "fetch_and_save_paper_to_kb", {"arxiv_id": "2310.08560"},
                          "saved 3 passages", "success", created_at=day + 3),
    )  # fmt: skip
    await add_paper(memory, tenant)
    await memory.entities.upsert(pub, [Entity("MemGPT", "system", "An LLM operating system.")])
    await memory.entities.upsert(adm, [Entity("Quokka", "project", "Alice's launch.")])
    await memory.entities.upsert(bdm, [Entity("Pelican", "project", "Bob's budget line.")])
    await memory.workflows.add(pub, "find MemGPT", ["arxiv_search_candidates -> success"], "ok")
    await memory.workflows.add(bdm, "plan pelican", ["search_knowledge_base -> success"], "ok")
    return World(tenant, pub.thread, adm.thread, bdm.thread, priv.thread, summary.id, log_id,
                 alice.id, bob.id)  # fmt: skip


def viewers(tenant: str) -> dict[str, Viewer]:
    return {
        "alice": Viewer(tenant, "U1", "slack", False, frozenset({PUBLIC, "dm:D1"}), "Alice"),
        "bob": Viewer(tenant, "U2", "slack", False, frozenset({PUBLIC, "dm:D2", "private:G1"}), "Bob"),
        "admin": Viewer(tenant, "U9", "slack", True, frozenset({PUBLIC}), "Ada"),
    }  # fmt: skip


@asynccontextmanager
async def page_client(memory, tenant: str):
    """The pages behind the test's own middleware: `X-Test-Viewer` names who is looking."""
    people = viewers(tenant)

    @web.middleware
    async def as_viewer(request: web.Request, handler):
        request[VIEWER] = people[request.headers.get("X-Test-Viewer", "alice")]
        request[CSRF] = "test-csrf"
        if request.method == "POST" and request.path == IMPORT_PATH:  # as the guard hands it on
            request[IMPORT_FORM] = await request.multipart()
        try:
            return await handler(request)
        except Flashed as redirect:  # what the real guard would keep in the session
            redirect.headers["X-Test-Flash"] = urlencode(redirect.flash)
            raise

    app = web.Application(middlewares=[as_viewer])
    app.add_routes(page_routes(memory))
    async with TestClient(TestServer(app)) as client:
        yield client


async def get(client, path: str, who: str = "alice", **kw):
    response = await client.get(path, headers={"X-Test-Viewer": who}, **kw)
    return response.status, await response.text()


async def post(client, path: str, data, who: str = "alice"):
    """(status, Location, body, the redirect's message: {"done": …} or {"error": …})."""
    response = await client.post(
        path, data=data, headers={"X-Test-Viewer": who}, allow_redirects=False
    )
    flash = dict(parse_qsl(response.headers.get("X-Test-Flash", "")))
    return response.status, response.headers.get("Location", ""), await response.text(), flash


def url(thread: str) -> str:
    from urllib.parse import quote

    return f"/memory/threads/{quote(thread, safe='')}"


@pytest.fixture
async def world(memory, tenant):
    yield await seed(memory, tenant)
    await memory.drop_tenant(tenant)


# -- browse ----------------------------------------------------------------------------------


async def test_browse_threads_carry_their_audience(memory, world):
    browse = memory.browse
    every = {t.id: t for t in await browse.threads(world.tenant, None)}
    assert every[world.public].audience == PUBLIC
    assert every[world.alice_dm].audience == "dm:D1"
    assert every[world.private].audience == "private:G1"
    assert every[world.public].messages == 3 and every[world.public].channel == "C1"
    assert every[world.public].title.startswith("Can you find the MemGPT paper")
    alice = {t.id for t in await browse.threads(world.tenant, {PUBLIC, "dm:D1"})}
    assert alice == {world.public, world.alice_dm}
    assert await browse.threads(world.tenant, set()) == []


async def test_browse_provenance_ids_and_tolerates_missing_fields(memory, world):
    entities = await memory.browse.entities(world.tenant, {PUBLIC})
    assert [e.name for e in entities] == ["MemGPT"]
    assert entities[0].id == "memgpt" and entities[0].audience == PUBLIC
    everything = {e.name: e for e in await memory.browse.entities(world.tenant, None)}
    assert everything["Pelican"].audience == "dm:D2" and everything["Pelican"].id == "dm:D2|pelican"
    flows = await memory.browse.workflows(world.tenant, {PUBLIC, "dm:D1"})
    assert len(flows) == 1 and "find MemGPT" in flows[0].text and len(flows[0].id) == 16
    # provenance as the stores write it: where each was learned, from whom
    assert entities[0].threads == [world.public] and entities[0].authors == ["U1"]
    assert flows[0].thread == world.public and flows[0].authors == ["U1"]
    # a record from before provenance has none
    await memory.redis.hdel(memory.entities.key_of(world.tenant, "memgpt"), "threads", "authors")
    await memory.redis.hdel(memory.workflows.key_of(world.tenant, flows[0].id), "thread", "authors")
    entity = (await memory.browse.entities(world.tenant, {PUBLIC}))[0]
    assert entity.threads == [] and entity.authors == []
    flow = (await memory.browse.workflows(world.tenant, {PUBLIC}))[0]
    assert flow.thread == "" and flow.authors == []


# -- pages -----------------------------------------------------------------------------------


async def test_overview_shows_what_the_viewer_may_see(memory, world):
    async with page_client(memory, world.tenant) as client:
        status, html = await get(client, "/memory")
        assert status == 200
        assert "Can you find the MemGPT paper" in html and "quokka launch" in html
        assert "pelican" not in html and "walrus" not in html
        assert 'name="csrf" value="test-csrf"' in html
        assert "Workspace administration" not in html
        status, html = await get(client, "/memory", "admin")
        assert status == 200 and "pelican" in html and "walrus" in html
        assert "Workspace administration" in html and 'action="/memory/import"' in html


async def test_thread_page_shows_speakers_summaries_and_tool_logs(memory, world):
    async with page_client(memory, world.tenant) as client:
        status, html = await get(client, url(world.public))
    assert status == 200
    for expected in ("Alice", "Bob", "assistant", world.summary_id, "Alice asked for MemGPT",
                     "fetch_and_save_paper_to_kb", world.log_id, "2023-11-14", "channel C1"):  # fmt: skip
        assert expected in html, expected
    assert "Saved MemGPT &lt;b&gt;to&lt;/b&gt; the knowledge base." in html  # escaped
    assert "<b>to</b>" not in html
    assert f"in {world.summary_id}" in html  # the summarized message names its summary
    # alice may forget her own message, not bob's, nor the public thread
    assert f'name="id" value="{world.alice_message}"' in html
    assert f'name="id" value="{world.bob_message}"' not in html
    assert "Forget thread" not in html


@pytest.mark.parametrize("thread", ["bob_dm", "private"])
async def test_a_thread_the_viewer_is_not_in_is_a_404(memory, world, thread):
    async with page_client(memory, world.tenant) as client:
        status, html = await get(client, url(getattr(world, thread)))
        assert status == 404 and "pelican" not in html and "walrus" not in html
        assert (await get(client, url(world.private), "bob"))[0] == 200
        assert (await get(client, url(world.bob_dm), "admin"))[0] == 200
        assert (await get(client, url("no-such-thread")))[0] == 404


async def test_another_tenants_ids_are_404(memory, world):
    other = f"{world.tenant}-b"
    theirs = await seed(memory, other)
    try:
        async with page_client(memory, world.tenant) as client:
            for who in ("alice", "admin"):
                assert (await get(client, url(theirs.public), who))[0] == 404
            status, *_ = await post(
                client, "/memory/forget",
                {"csrf": "test-csrf", "kind": "summary", "id": theirs.summary_id}, "alice",
            )  # fmt: skip
            assert status == 404
            status, _ = await get(client, f"/memory/export?thread={theirs.public}", "admin")
            assert status == 404
    finally:
        await memory.drop_tenant(other)


async def test_a_long_thread_is_paged_newest_last(memory, tenant):
    scope = Scope(tenant, "long-thread", "terminal", user="local", user_name="local")
    for i in range(2 * PAGE_SIZE + 50):
        await memory.conversation.append(
            scope, "user", f"message number {i:04d}", timestamp=1e9 + i
        )
    try:
        async with page_client(memory, tenant) as client:
            status, html = await get(client, url("long-thread"))
            assert status == 200
            shown = re.findall(r"<div class=\"text\">message number (\d{4})", html)
            assert shown[0] == "0200" and shown[-1] == "0249" and len(shown) == 50
            assert "page 3 of 3" in html and "?page=2" in html
            _, html = await get(client, url("long-thread") + "?page=1")
            shown = re.findall(r"<div class=\"text\">message number (\d{4})", html)
            assert shown == [f"{i:04d}" for i in range(PAGE_SIZE)]
            _, html = await get(client, url("long-thread") + "?page=99")
            assert "page 3 of 3" in html
    finally:
        await memory.drop_tenant(tenant)


async def test_a_forgotten_message_shows_as_forgotten(memory, tenant):
    """A tombstone (what forgetting leaves in a thread's list) keeps its place, emptied."""
    thread = "notes/2024 #1?x"  # a terminal's thread id may hold any printable character
    scope = Scope(tenant, thread, "terminal", user="local", user_name="local")
    await memory.conversation.append(scope, "user", "kept message", timestamp=1e9)
    gone = await memory.conversation.append(scope, "user", "a regretted message", timestamp=1e9 + 1)
    await memory.governance.forget_message(tenant, thread, gone.id)
    try:
        async with page_client(memory, tenant) as client:
            status, html = await get(client, url(thread))
        assert status == 200 and "kept message" in html and "(forgotten)" in html
        assert "regretted" not in html
    finally:
        await memory.drop_tenant(tenant)


async def test_papers_and_passages_in_order(memory, world):
    async with page_client(memory, world.tenant) as client:
        status, html = await get(client, "/memory/papers")
        assert status == 200 and PAPER.title in html and "Charles Packer" in html
        status, html = await get(client, "/memory/papers/2310.08560")
        assert status == 200 and "An operating system for language model memory." in html
        positions = [html.index(text[:40]) for text in PASSAGES]
        assert positions == sorted(positions)
        assert (await get(client, "/memory/papers/2401.00001"))[0] == 404


async def test_entities_and_workflows_pages(memory, world):
    async with page_client(memory, world.tenant) as client:
        _, html = await get(client, "/memory/entities")
        assert "MemGPT" in html and "Quokka" in html and "Pelican" not in html
        assert 'action="/memory/entities/edit"' not in html  # editing is an admin's
        _, html = await get(client, "/memory/entities", "admin")
        assert "Pelican" in html and 'action="/memory/entities/edit"' in html
        _, html = await get(client, "/memory/workflows")
        assert "find MemGPT" in html and "plan pelican" not in html


async def test_search_finds_messages_and_passages_it_may_show(memory, world):
    async with page_client(memory, world.tenant) as client:
        status, html = await get(client, "/memory/search?q=quokka launch")
        assert status == 200 and "quokka launch is Tuesday" in html and world.alice_dm in html
        _, html = await get(client, "/memory/search?q=zanzibarite benchmark")
        assert "zanzibarite" in html and "/memory/papers/2310.08560#c2" in html
        _, html = await get(client, "/memory/search?q=pelican budget")
        assert "42k" not in html  # bob's DM
        _, html = await get(client, "/memory/search?q=pelican budget", "bob")
        assert "42k" in html
        _, html = await get(client, "/memory/search?q=walrus roadmap", "admin")
        assert "walrus roadmap slips" in html


async def test_search_lists_only_what_bears_on_the_query(memory, world):
    """Nearest-neighbour search always returns k results: the page keeps those holding the
    query's words, or close in meaning to it."""
    found = await memory.browse.search(world.tenant, "zanzibarite benchmark", None)
    assert found.messages == []  # no message holds either word or says anything like it
    assert [p.chunk_index for p in found.passages] == [2]  # the one passage that does
    found = await memory.browse.search(world.tenant, "memory tiers", None)
    assert [m.id for m in found.messages] == [world.alice_message]
    assert 0 in [p.chunk_index for p in found.passages]
    # no word in common, the same meaning: kept by its similarity
    scope = slack_scope(world.tenant, "C1", "100.1", "U2", "Bob", Visibility.PUBLIC)
    await say(memory, scope, "user", "We should deploy the new retrieval service on Friday.", 1e9)
    found = await memory.browse.search(world.tenant, "when do we ship the search backend", None)
    assert [m.text for m in found.messages] == [
        "We should deploy the new retrieval service on Friday."
    ]
    async with page_client(memory, world.tenant) as client:
        _, html = await get(client, "/memory/search?q=zanzibarite benchmark")
    assert 'Messages <span class="muted">(0)</span>' in html and "memory tiers?" not in html
    assert html.count('type="search"') == 1  # the header's box, not a second one


async def test_counts_are_worded_as_english():
    assert counted(1, "entities") == "1 entity" and counted(2, "summaries") == "2 summaries"
    assert counted(1, "tool_logs") == "1 tool log" and counted(3, "tool_logs") == "3 tool logs"
    assert counted(1, "cached_embeddings") == "1 cached embedding"
    assert counted(1, "messages") == "1 message" and counted(1, "message") == "1 message"
    assert counted(1, "chunks") == "1 passage" and counted(1_200, "passages") == "1,200 passages"
    assert counted(1, "gadgets") == "1 gadget" and counted(2, "category") == "2 categories"
    assert erased(Erasure(entities=1, cached_embeddings=1)) == (
        "Forgotten: 1 entity, 1 cached embedding."
    )
    assert erased(Erasure()) == "Nothing was left to forget."


async def test_provenance_names_people_with_their_id_on_hover(memory, world):
    async with page_client(memory, world.tenant) as client:
        _, html = await get(client, "/memory/entities", "admin")
        assert 'from <span class="person" title="U1">Alice</span>' in html
        _, html = await get(client, "/memory/workflows", "admin")
        assert 'asked by <span class="person" title="U1">Alice</span>' in html
        _, html = await get(client, url(world.public))
        assert "3 messages" in html and "1 messages" not in html  # the summary covers 1 message
    assert await memory.browse.names(world.tenant, ["U1", "U2", "U404"]) == {
        "U1": "Alice", "U2": "Bob"
    }  # fmt: skip


async def test_forget_buttons_lead_to_a_confirmation_page(memory, world):
    async with page_client(memory, world.tenant) as client:
        _, html = await get(client, "/memory/entities", "admin")
        assert 'action="/memory/forget/confirm"' in html
        assert 'action="/memory/forget"' not in html  # no one-click erasure
        confirm = "/memory/forget/confirm?kind=entity&id=memgpt&back=/memory/entities%3Fx%3D1"
        status, html = await get(client, confirm, "admin")
        assert status == 200 and "Forget this entity?" in html
        assert "An LLM operating system." in html and "cannot be undone" in html
        form = re.search(r'<form method="post" action="/memory/forget">.*?</form>', html, re.S)
        assert form is not None
        fields = dict(re.findall(r'name="(\w+)" value="([^"]*)"', form.group(0)))
        assert fields == {"csrf": "test-csrf", "kind": "entity", "id": "memgpt", "thread": "",
                          "back": "/memory/entities?x=1"}  # fmt: skip
        assert 'href="/memory/entities?x=1">Cancel' in html
        assert await memory.browse.entity(world.tenant, "memgpt", None) is not None  # not yet
        status, location, _, flash = await post(client, "/memory/forget", fields, "admin")
        assert status == 303 and location == "/memory/entities?x=1"
        assert flash["done"].startswith("Forgotten")
        assert await memory.browse.entity(world.tenant, "memgpt", None) is None
        # the page checks like the erasure: unseen is 404, an admin's kind is 403
        message = f"kind=message&id={world.alice_message}&thread={world.public}"
        status, html = await get(client, f"/memory/forget/confirm?{message}")
        assert status == 200 and "Can you find the MemGPT paper" in html
        bob = f"kind=message&id={world.bob_message}&thread={world.public}"
        assert (await get(client, f"/memory/forget/confirm?{bob}"))[0] == 403
        hidden = f"kind=thread&id={world.bob_dm}&thread={world.bob_dm}"
        status, html = await get(client, f"/memory/forget/confirm?{hidden}")
        assert status == 404 and "pelican" not in html
        assert (await get(client, "/memory/forget/confirm?kind=paper&id=2310.08560"))[0] == 403
        status, html = await get(client, f"/memory/forget/confirm?kind=thread&id={world.alice_dm}")
        assert status == 200 and "quokka launch" in html and "1 message" in html
        status, html = await get(client, "/memory/forget/confirm?kind=paper&id=2310.08560", "admin")
        assert status == 200 and PAPER.title in html and "3 passages" in html
        back = "/memory/forget/confirm?kind=entity&id=x&back=https://evil.example/"
        assert (await get(client, back, "admin"))[0] == 404


async def test_flash_messages_come_from_the_session_only_once_and_escaped(memory, world):
    async with signed_in(memory, world.tenant, "U1") as client:  # alice, the real guard
        response = await client.get("/memory?done=Your+account+is+locked&error=Call+us")
        html = await response.text()
        assert response.status == 200 and 'class="flash' not in html  # the address is not read
        csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
        form = {"csrf": csrf, "kind": "message", "id": world.alice_message,
                "thread": world.public, "back": url(world.public)}  # fmt: skip
        response = await client.post("/memory/forget", data=form, allow_redirects=False)
        location = response.headers["Location"]
        assert response.status == 303 and location == str(URL(url(world.public)))
        html = await (await client.get(location)).text()
        shown = re.search(r'<p class="flash done" role="status">([^<]*)</p>', html)
        assert shown is not None and shown.group(1).startswith("Forgotten: 1 message")
        assert "Forgotten:" not in await (await client.get(location)).text()  # shown once

        sessions = WebSessions(memory.redis)
        session = client.session.cookie_jar.filter_cookies(client.make_url("/memory"))
        session_id = session[SESSION_COOKIE].value
        record = await sessions.get(session_id)
        await sessions.update(session_id, {**record, "flash": {"error": "<script>x</script>"}})
        html = await (await client.get("/memory")).text()
    assert "&lt;script&gt;x&lt;/script&gt;" in html and "<script>" not in html


async def test_admin_actions_by_a_non_admin_are_403(memory, world):
    form = {"csrf": "test-csrf"}
    async with page_client(memory, world.tenant) as client:
        attempts = [
            ("/memory/forget", {"kind": "entity", "id": "memgpt"}),
            ("/memory/forget", {"kind": "paper", "id": "2310.08560"}),
            ("/memory/forget", {"kind": "workflow", "id": "0" * 16}),
            (
                "/memory/forget",
                {"kind": "message", "id": world.bob_message, "thread": world.public},
            ),
            ("/memory/forget", {"kind": "thread", "id": world.public, "thread": world.public}),
            ("/memory/forget", {"kind": "summary", "id": world.summary_id}),
            ("/memory/forget", {"kind": "tool_log", "id": world.log_id}),
            ("/memory/entities/edit", {"id": "memgpt", "description": "vandalised"}),
            ("/memory/workflows/edit", {"id": "0" * 16, "text": "vandalised"}),
            ("/memory/retention", {"days": "1"}),
            ("/memory/people/forget", {"user": "U2", "confirm": "yes"}),
        ]
        for path, data in attempts:
            status, _, html, _ = await post(client, path, {**form, **data})
            assert status == 403, (path, data)
            assert "Only an admin" in html
        data = aiohttp_file_form(b'{"kind": "message"}\n')
        status, *_ = await post(client, "/memory/import", data)
        assert status == 403
        assert (await get(client, "/memory/export"))[0] == 403
        # what the viewer cannot see at all stays a 404, admin action or not
        hidden = {"kind": "message", "id": "x", "thread": world.bob_dm}
        assert (await post(client, "/memory/forget", {**form, **hidden}))[0] == 404
    entities = await memory.browse.entities(world.tenant, None)
    assert "vandalised" not in {e.description for e in entities}


def aiohttp_file_form(content: bytes):
    from aiohttp import FormData

    data = FormData()
    data.add_field("csrf", "test-csrf")
    data.add_field("file", content, filename="export.jsonl", content_type="application/x-ndjson")
    return data


def test_back_never_leaves_the_memory_page():
    assert safe_back("/memory/threads/x?page=2", "/memory") == "/memory/threads/x?page=2"
    for bad in ("https://evil.example/", "//evil.example/memory", "/memoryx", "/\\evil", ""):
        assert safe_back(bad, "/memory") == "/memory"


async def test_a_bad_retention_value_redirects_back_with_an_error(memory, world):
    async with page_client(memory, world.tenant) as client:
        status, location, _, flash = await post(
            client, "/memory/retention",
            {"csrf": "test-csrf", "days": "forever", "back": "//evil.example/"}, "admin",
        )  # fmt: skip
    assert status == 303 and location == "/memory" and "whole number" in flash["error"]


# -- forms that change memory (helper A's governance, helper P's portability) ------------------


async def test_forget_own_message_through_the_form(memory, world):
    async with page_client(memory, world.tenant) as client:
        data = {"csrf": "test-csrf", "kind": "message", "id": world.alice_message,
                "thread": world.public, "back": url(world.public)}  # fmt: skip
        status, location, _, flash = await post(client, "/memory/forget", data)
        assert status == 303 and location == str(URL(url(world.public)))
        assert flash["done"].startswith("Forgotten")
        status, html = await get(client, location)
        assert status == 200
        assert "Can you find the MemGPT paper about memory tiers?" not in html
        assert "(forgotten)" in html
        _, html = await get(client, "/memory/search?q=memory tiers MemGPT paper")
        assert "Can you find the MemGPT paper about memory tiers?" not in html


async def test_admin_forgets_an_entity_and_edits_a_workflow(memory, world):
    async with page_client(memory, world.tenant) as client:
        form = {"csrf": "test-csrf", "kind": "entity", "id": "memgpt", "back": "/memory/entities"}
        status, location, _, flash = await post(client, "/memory/forget", form, "admin")
        assert status == 303 and location == "/memory/entities" and "done" in flash
        _, html = await get(client, "/memory/entities", "admin")
        assert "An LLM operating system." not in html
        flow = (await memory.browse.workflows(world.tenant, {PUBLIC}))[0]
        form = {"csrf": "test-csrf", "id": flow.id, "text": "QUERY: better\nSTEPS:\n1. think"}
        status, *_ = await post(client, "/memory/workflows/edit", form, "admin")
        assert status == 303
        _, html = await get(client, "/memory/workflows")
        assert "QUERY: better" in html
        missing = {"csrf": "test-csrf", "kind": "entity", "id": "no-such-entity"}
        assert (await post(client, "/memory/forget", missing, "admin"))[0] == 404


async def test_alice_forgets_her_own_dm_and_herself(memory, world):
    async with page_client(memory, world.tenant) as client:
        form = {"csrf": "test-csrf", "kind": "thread", "id": world.alice_dm,
                "thread": world.alice_dm}  # fmt: skip
        status, location, _, flash = await post(client, "/memory/forget", form)
        assert status == 303 and location == "/memory" and "done" in flash
        assert (await get(client, url(world.alice_dm)))[0] == 404
        form = {"csrf": "test-csrf", "user": "U1", "confirm": "yes"}
        status, location, _, flash = await post(client, "/memory/people/forget", form)
        assert status == 303
        _, html = await get(client, url(world.public), "admin")
        assert "memory tiers" not in html and "virtual context" in html


async def test_export_a_thread_as_json_lines(memory, world):
    async with page_client(memory, world.tenant) as client:
        response = await client.get(
            f"/memory/export?thread={world.alice_dm}", headers={"X-Test-Viewer": "alice"}
        )
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("application/x-ndjson")
        assert "attachment" in response.headers["Content-Disposition"]
        lines = [json.loads(line) for line in (await response.text()).splitlines()]
        assert lines and "quokka launch" in json.dumps(lines)
        assert (await get(client, f"/memory/export?thread={world.bob_dm}"))[0] == 404
        response = await client.get("/memory/export", headers={"X-Test-Viewer": "admin"})
        assert response.status == 200 and "walrus" in await response.text()


async def test_a_place_turned_private_shows_its_later_messages_only_to_its_members(memory, world):
    """A Discord thread made private after its first message: the thread is listed by its first
    message's audience, but each later message keeps its own, on the page and in the export."""
    thread = world.public
    later = Scope(world.tenant, thread, "G1", Visibility.PRIVATE, "U2", "Bob")
    await say(memory, later, "user", "Now private: the narwhal budget doubles.", 1_700_000_500.0)
    async with page_client(memory, world.tenant) as client:
        status, alice_page = await get(client, url(thread), "alice")
        assert status == 200 and "virtual context" in alice_page
        assert "narwhal" not in alice_page
        status, bob_page = await get(client, url(thread), "bob")
        assert status == 200 and "narwhal" in bob_page
        status, alice_export = await get(client, f"/memory/export?thread={thread}", "alice")
        assert status == 200 and "virtual context" in alice_export
        assert "narwhal" not in alice_export
        status, bob_export = await get(client, f"/memory/export?thread={thread}", "bob")
        assert status == 200 and "narwhal" in bob_export


# -- through the real access middleware (adapters/memory_page/server.py) ------------------------


class Team:
    """A directory (`access.Directory`) that knows the seeded people without asking Slack."""

    def __init__(self, tenant: str) -> None:
        self.people = {v.user: v for v in viewers(tenant).values()}

    async def viewer(self, tenant: str, user: str, platform: str) -> Viewer:
        return self.people[user]


@asynccontextmanager
async def signed_in(memory, tenant: str, user: str):
    """A client that opened `user`'s signed link: its session cookie is set."""
    links = Links(LinkSigner("test-secret"), "http://127.0.0.1")
    mounted = memory_page(memory, links, Team(tenant))
    app = web.Application(middlewares=mounted.middlewares)
    app.add_routes(mounted.routes)
    app.on_response_prepare.append(mounted.on_prepare)
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/memory", allow_redirects=False)).status == 401
        login = URL(links.login(tenant, user, "slack"))
        response = await client.get(login.path_qs, allow_redirects=False)
        assert response.status == 200 and "Open my memory" in await response.text()
        response = await client.post(login.path, data={"token": login.query["token"]},
                                     allow_redirects=False)  # fmt: skip
        assert response.status == 303 and response.headers["Location"] == "/memory"
        yield client


async def test_pages_behind_the_real_middleware(memory, world):
    async with signed_in(memory, world.tenant, "U1") as client:  # alice
        response = await client.get("/memory")
        html = await response.text()
        assert response.status == 200 and "quokka launch" in html and "pelican" not in html
        csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
        assert (await client.get(url(world.bob_dm))).status == 404
        assert (await client.get(url(world.public))).status == 200
        no_token = {"kind": "entity", "id": "memgpt"}
        response = await client.post("/memory/forget", data=no_token, allow_redirects=False)
        assert response.status == 403 and "security token" in await response.text()
        response = await client.post(
            "/memory/forget", data={**no_token, "csrf": csrf}, allow_redirects=False
        )
        assert response.status == 403 and "Only an admin" in await response.text()
        response = await client.post(
            "/memory/retention", data={"csrf": csrf, "days": "x"}, allow_redirects=False
        )
        assert response.status == 403


async def test_admin_imports_an_export_into_an_empty_tenant(memory, world):
    target = f"{world.tenant}-copy"
    try:
        async with page_client(memory, world.tenant) as client:
            response = await client.get("/memory/export", headers={"X-Test-Viewer": "admin"})
            exported = await response.read()
        async with page_client(memory, target) as client:
            status, location, _, flash = await post(client, "/memory/import",
                                             aiohttp_file_form(exported), "admin")  # fmt: skip
            assert status == 303 and flash["done"].startswith("Imported")
            _, html = await get(client, "/memory", "admin")
            assert "walrus roadmap" in html and "quokka launch" in html
            # a second import into what is no longer empty is refused, with a reason
            status, location, _, flash = await post(client, "/memory/import",
                                             aiohttp_file_form(exported), "admin")  # fmt: skip
            assert status == 303 and location == "/memory" and flash["error"]
            status, location, _, flash = await post(client, "/memory/import",
                                             aiohttp_file_form(b"\xff\xfe not text"), "admin")  # fmt: skip
            assert status == 303 and location == "/memory" and flash["error"]
    finally:
        await memory.drop_tenant(target)


async def test_admin_sets_the_retention_period(memory, world):
    async with page_client(memory, world.tenant) as client:
        form = {"csrf": "test-csrf", "days": "30"}
        status, location, _, flash = await post(client, "/memory/retention", form, "admin")
        assert status == 303 and location == "/memory" and "30 days" in flash["done"]
        assert await memory.retention.get(world.tenant) == 30
        _, html = await get(client, "/memory", "admin")
        assert "<strong>30 days</strong>" in html
        status, *_ = await post(
            client, "/memory/retention", {"csrf": "test-csrf", "days": ""}, "admin"
        )
        assert status == 303 and await memory.retention.get(world.tenant) is None
