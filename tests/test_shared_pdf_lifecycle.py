"""PDFs shared in chat, after they are saved, against the real Redis: retention takes the
private ones shared in a thread it drops whole, as forgetting the thread does (the team's copies
stay); the memory page and the App Home name them as shared PDFs, not as arXiv papers; whoever
shared a PDF privately may forget it from the memory page."""

from __future__ import annotations

import json
import re
import time
from urllib.parse import quote

import pytest

from adapters.slack_home import SlackHome
from memory.governance_purge import Purge
from memory.governance_sweeps import Sweeps
from memory.governance_threads import ThreadEraser
from memory.ingest.shared_pdf import SavedPdf, SharedFile, save_shared_pdf
from memory.keys import papers_key
from memory.retention import DAY, Retention
from memory.scope import Scope, Visibility
from memory.tokens import encoding_for
from tests.support.memory_seed import PAPER
from tests.test_memory_page import get, page_client, post, seed, signed_in, slack_scope
from tests.test_shared_pdfs import PHRASE, shared_pdf


async def share(memory, scope: Scope, name: str, sharer: str = "U1") -> SavedPdf:
    shared = SharedFile(f"{name}.pdf", "", f"share-{name}", sharer=sharer)
    kb, encoding = memory.knowledge_base, encoding_for("gpt-5-mini")
    return await save_shared_pdf(shared_pdf(f"Paper of the {name}"), shared, scope, kb,
                                 memory.embedder, encoding, 10**7)  # fmt: skip


async def backdate(memory, tenant: str, arxiv_id: str, when: float) -> None:
    """Say the PDF was saved at `when` (it was shared with the thread's old message)."""
    key = papers_key(tenant)
    record = json.loads(await memory.redis.hget(key, arxiv_id))
    await memory.redis.hset(key, arxiv_id, json.dumps({**record, "ingested_at": when}))


async def say(memory, scope: Scope, when: float) -> None:
    await memory.conversation.append(scope, "user", "here is a paper", timestamp=when)


async def has_chunks(memory, tenant: str, arxiv_id: str) -> bool:
    return bool(await memory.redis.exists(memory.knowledge_base.chunk_key(tenant, arxiv_id, 0)))


async def test_retention_forgets_private_pdfs_shared_in_the_threads_it_drops(memory, tenant):
    old, new = time.time() - 3 * DAY, time.time() - 600
    dropped = Scope(tenant, "slack:T:G1:1", channel="G1", visibility=Visibility.PRIVATE)
    dm = Scope(tenant, "slack:T:D1:dm", channel="D1", visibility=Visibility.DM)
    mixed = Scope(tenant, "slack:T:G1:2", channel="G1", visibility=Visibility.PRIVATE)
    team = Scope(tenant, "slack:T:C1:1", channel="C1")
    saved = {}
    for name, scope in (("dropped", dropped), ("dm", dm), ("mixed", mixed), ("team", team)):
        saved[name] = await share(memory, scope, name)
        await backdate(memory, tenant, saved[name].arxiv_id, old)
        await say(memory, scope, old)
    # shared alone (no message) into the old thread just now: the thread goes, the PDF stays
    saved["fresh"] = await share(memory, dropped, "fresh")
    await say(memory, dm, new)  # the DM thread and the mixed one are only partly old
    await say(memory, mixed, new)
    for name in saved:
        assert await has_chunks(memory, tenant, saved[name].arxiv_id)
    retention = Retention(memory)
    await retention.set(tenant, 1)

    erasure = await retention.sweep(tenant)

    assert erasure.threads == 2 and erasure.papers == 1 and erasure.chunks >= 1
    gone = saved["dropped"].arxiv_id
    assert not await memory.knowledge_base.has_paper(dropped, gone)
    assert not await has_chunks(memory, tenant, gone)
    kept = {p["arxiv_id"] for p in await memory.knowledge_base.papers(team, everywhere=True)}
    assert kept == {saved[n].arxiv_id for n in ("dm", "mixed", "team", "fresh")}
    for name in ("dm", "mixed", "team", "fresh"):
        assert await has_chunks(memory, tenant, saved[name].arxiv_id)
    last = await retention.last_sweep(tenant)
    assert last["papers"] == 1


async def test_a_thread_that_grew_during_the_sweep_is_not_dropped(memory, tenant):
    """A reply comes after the sweep read the old thread: it is kept, so it is not among the
    dropped threads whose private PDFs retention takes."""
    purge = Purge(memory)
    sweeps = Sweeps(memory, ThreadEraser(memory, purge), purge)
    scope = Scope(tenant, "slack:T:G1:1", channel="G1", visibility=Visibility.PRIVATE)
    await say(memory, scope, time.time() - 3 * DAY)
    expiry = await sweeps.expiry(tenant, time.time() - DAY)
    assert expiry.whole == [scope.thread]
    await say(memory, scope, time.time())
    await sweeps.expire(tenant, expiry)
    assert expiry.dropped == []  # what `Governance.sweep_retention` takes the PDFs of


# -- how they are named ------------------------------------------------------------------------


@pytest.fixture
async def world(memory, tenant):
    """The memory page's seeded tenant (tests/test_memory_page.py): Alice (U1), Bob (U2, in the
    private channel G1) and an admin (U9), with the arXiv paper PAPER."""
    yield await seed(memory, tenant)
    await memory.drop_tenant(tenant)


def papers_url(arxiv_id: str) -> str:
    return f"/memory/papers/{quote(arxiv_id, safe='')}"


async def test_the_memory_page_names_shared_pdfs_by_title_not_as_arxiv_papers(memory, world):
    team = slack_scope(world.tenant, "C1", "100.1", "U1", "Alice", Visibility.PUBLIC)
    pdf = await share(memory, team, "team")
    async with page_client(memory, world.tenant) as client:
        status, html = await get(client, "/memory/papers")
        assert status == 200 and "Paper of the team" in html and "shared PDF · team.pdf" in html
        assert f"arXiv:{PAPER.arxiv_id}" in html  # papers from arXiv unchanged
        status, html = await get(client, papers_url(pdf.arxiv_id))
        assert status == 200 and "<h1>Paper of the team</h1>" in html
        assert "shared PDF · team.pdf" in html and PHRASE in html
        _, html = await get(client, f"/memory/search?q={quote(PHRASE)}")
        assert "Paper of the team" in html and "shared PDF · passage #" in html
        confirm = f"/memory/forget/confirm?kind=paper&id={pdf.arxiv_id}"
        status, html = await get(client, confirm, "admin")
        assert status == 200 and "shared PDF · team.pdf" in html
        shown = [html]
        for path in ("/memory/papers", papers_url(pdf.arxiv_id), f"/memory/search?q={PHRASE}"):
            shown.append((await get(client, path))[1])
        _, html = await get(client, papers_url(PAPER.arxiv_id))
        assert f"https://arxiv.org/abs/{PAPER.arxiv_id}" in html  # arXiv papers still link
    for html in shown:
        assert "arXiv:pdf-" not in html and "arxiv.org/abs/pdf-" not in html


async def test_the_app_home_names_shared_pdfs_by_title_not_as_arxiv_papers(memory, world):
    team = slack_scope(world.tenant, "C1", "100.1", "U1", "Alice", Visibility.PUBLIC)
    pdf = await share(memory, team, "team")
    home = SlackHome(memory, client=None, links=None, directory=None)
    view = json.dumps(await home.view(world.tenant, "U1"), ensure_ascii=False)
    assert "Paper of the team · shared PDF" in view
    assert f"arXiv:{PAPER.arxiv_id}" in view and f"arxiv.org/abs/{PAPER.arxiv_id}" in view
    assert pdf.arxiv_id not in view  # no `arXiv:pdf-…`, no arxiv.org link made of its id


# -- who may forget them -----------------------------------------------------------------------


async def test_the_sharer_of_a_private_pdf_may_forget_it_from_the_memory_page(memory, world):
    tenant = world.tenant
    g1_bob = slack_scope(tenant, "G1", "400.1", "U2", "Bob", Visibility.PRIVATE)
    c1_bob = slack_scope(tenant, "C1", "100.1", "U2", "Bob", Visibility.PUBLIC)
    bobs = await share(memory, g1_bob, "bobs", sharer="U2")
    carols = await share(memory, g1_bob, "carols", sharer="U3")  # in G1 too, by someone else
    teams = await share(memory, c1_bob, "teams", sharer="U2")  # the team's copy
    form = {"csrf": "test-csrf", "kind": "paper", "thread": "", "back": "/memory/papers"}
    async with page_client(memory, tenant) as client:
        _, html = await get(client, "/memory/papers", "bob")
        buttons = set(re.findall(r'name="kind" value="paper"><input type="hidden" '
                                 r'name="id" value="([^"]+)"', html))  # fmt: skip
        assert buttons == {bobs.arxiv_id}
        status, html = await get(client, f"/memory/forget/confirm?kind=paper&id={bobs.arxiv_id}",
                                 "bob")  # fmt: skip
        assert status == 200 and "Paper of the bobs" in html and "private channel G1" in html
        # others are refused: someone else's private PDF, the team's copy, an arXiv paper
        for refused in (carols.arxiv_id, teams.arxiv_id, PAPER.arxiv_id):
            status, _, html, _ = await post(client, "/memory/forget", {**form, "id": refused},
                                            "bob")  # fmt: skip
            assert status == 403 and "Only an admin" in html, refused
        # Alice did not share it and cannot see G1: nothing there for her
        status, *_ = await post(client, "/memory/forget", {**form, "id": bobs.arxiv_id})
        assert status == 404
        assert await memory.knowledge_base.has_paper(g1_bob, bobs.arxiv_id)

        status, location, _, flash = await post(client, "/memory/forget",
                                                {**form, "id": bobs.arxiv_id}, "bob")  # fmt: skip
        assert status == 303 and location == "/memory/papers"
        assert flash["done"].startswith("Forgotten: 1 paper")
        assert not await memory.knowledge_base.has_paper(g1_bob, bobs.arxiv_id)
        assert not await has_chunks(memory, tenant, bobs.arxiv_id)
        # an admin keeps the right to forget anyone's
        status, *_ = await post(client, "/memory/forget", {**form, "id": carols.arxiv_id}, "admin")
        assert status == 303 and not await memory.knowledge_base.has_paper(g1_bob, carols.arxiv_id)
    assert await memory.knowledge_base.has_paper(c1_bob, teams.arxiv_id)


async def test_the_sharer_forgets_through_the_real_sessions_and_csrf_check(memory, world):
    g1_bob = slack_scope(world.tenant, "G1", "400.1", "U2", "Bob", Visibility.PRIVATE)
    bobs = await share(memory, g1_bob, "bobs", sharer="U2")
    async with signed_in(memory, world.tenant, "U2") as client:
        confirm = f"/memory/forget/confirm?kind=paper&id={bobs.arxiv_id}"
        html = await (await client.get(confirm)).text()
        csrf = re.search(r'name="csrf" value="([^"]+)"', html).group(1)
        form = {"kind": "paper", "id": bobs.arxiv_id, "back": "/memory/papers"}
        response = await client.post("/memory/forget", data=form, allow_redirects=False)
        assert response.status == 403 and "security token" in await response.text()
        bad = {**form, "csrf": "not-the-token"}
        response = await client.post("/memory/forget", data=bad, allow_redirects=False)
        assert response.status == 403
        assert await memory.knowledge_base.has_paper(g1_bob, bobs.arxiv_id)
        response = await client.post(
            "/memory/forget", data={**form, "csrf": csrf}, allow_redirects=False
        )
        assert response.status == 303
    assert not await memory.knowledge_base.has_paper(g1_bob, bobs.arxiv_id)
