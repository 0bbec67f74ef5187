"""A private PDF shared again, against the real Redis: an erased first sharer's link and file name
leave the copy kept for the others (its record and every passage); a forget waits for a share
adding itself; two shares of one new file at once both hold the copy; each sharer may take back
their own shares from the memory page; the record names the first share that stays, and a
share that left, delivered again, holds the copy again."""

from __future__ import annotations

import asyncio
import json
import time

from memory.ingest.shared_pdf import (
    SharedFile,
    content_hash,
    save_shared_pdf,
    shared_pdf_id,
)
from memory.scope import Scope, Visibility
from memory.stores.base import decode
from memory.stores.knowledge_base import shares_of, with_shares
from memory.stores.tool_log import ToolLogEntry, paper_shown
from memory.tokens import encoding_for
from tests.test_memory_page import get, page_client, post, slack_scope
from tests.test_s29_B_forgetting import record_of
from tests.test_shared_pdf_lifecycle import has_chunks, world  # noqa: F401  (its fixture)
from tests.test_shared_pdfs import shared_pdf

OSPREY_PDF = shared_pdf("Paper of the osprey")  # made once: each PDF made has its own bytes
ERASED = "UERASED7"  # the first sharer, erased: their id is in their share's Slack permalink
FIRST_LINK = f"https://team.slack.com/files/{ERASED}/F111/erased-persons-draft.pdf"
SECOND_LINK = "https://team.slack.com/files/U2/F222/osprey.pdf"


def in_g1(tenant: str, thread: str, user: str) -> Scope:
    return Scope(tenant, f"slack:T:G1:{thread}", "G1", user=user, visibility=Visibility.PRIVATE)


async def share(memory, scope: Scope, shared: SharedFile, embedder=None, data=OSPREY_PDF):
    return await save_shared_pdf(
        data, shared, scope, memory.knowledge_base, embedder or memory.embedder,
        encoding_for("gpt-5-mini"), 10**7,
    )  # fmt: skip


async def chunks_of(memory, tenant: str, record: dict) -> list[dict[str, str]]:
    """Each stored passage's text fields (its vector left out)."""
    kb, rows = memory.knowledge_base, []
    for index in range(int(record["chunks"])):
        raw = await memory.redis.hgetall(kb.chunk_key(tenant, record["arxiv_id"], index))
        rows.append({decode(k): decode(v) for k, v in raw.items() if decode(k) != kb.VECTOR_FIELD})
    return rows


async def test_an_erased_first_sharers_link_and_file_name_leave_the_copy_kept(memory, tenant):
    first, second = in_g1(tenant, "1", ERASED), in_g1(tenant, "2", "U2")
    for scope in (first, second):
        await memory.conversation.append(scope, "user", "a paper for you")
    saved = await share(
        memory, first, SharedFile("erased-persons-draft.pdf", FIRST_LINK, "s-1", ERASED)
    )
    await share(memory, second, SharedFile("osprey.pdf", SECOND_LINK, "s-2", "U2"))
    record = await record_of(memory, tenant, saved.arxiv_id)
    assert all(c["url"] == FIRST_LINK for c in await chunks_of(memory, tenant, record))

    await memory.governance.forget_person(tenant, ERASED)

    record = await record_of(memory, tenant, saved.arxiv_id)
    assert record is not None and (record["url"], record["file_name"]) == (
        SECOND_LINK,
        "osprey.pdf",
    )
    assert record["origin"] == "s-2"
    chunks = await chunks_of(memory, tenant, record)
    assert chunks and all(c["url"] == SECOND_LINK for c in chunks)
    for shown in (json.dumps(record), *map(json.dumps, chunks)):
        assert ERASED not in shown and "erased-persons-draft" not in shown


def test_shares_listed_before_they_kept_links_take_only_their_own():
    record = {"url": "L1", "file_name": "a.pdf", "thread": "t1", "sharer": "U1", "origin": "o1",
              "shares": [{"thread": "t1", "sharer": "U1", "origin": "o1", "at": 1.0},
                         {"thread": "t2", "sharer": "U2", "origin": "o2", "at": 2.0}]}  # fmt: skip
    first, again = shares_of(record)
    assert (first["link"], first["file_name"]) == ("L1", "a.pdf")
    assert (again["link"], again["file_name"]) == ("", "")  # the record's are the first's


def test_a_title_made_of_the_first_sharers_file_name_is_the_next_ones():
    """A PDF with no title of its own is named after its file (shared_pdf.py `title_of`)."""
    record = {"title": "alices-draft", "file_name": "alices-draft.pdf", "url": "L1"}
    kept = {"thread": "t2", "sharer": "U2", "origin": "o2", "link": "L2", "file_name": "b.pdf"}
    assert with_shares(record, [kept])["title"] == "b"
    assert with_shares({**record, "title": "Its Own Title"}, [kept])["title"] == "Its Own Title"


async def test_a_forget_waits_for_a_share_adding_itself(memory, tenant):
    """A share adding itself (shared_pdf.py `_held_by`: read the record, write it back, under
    the save lock) while the paper is forgotten: the forget goes after it, so no record of a
    paper without passages is left."""
    kb, first = memory.knowledge_base, in_g1(tenant, "1", "U1")
    saved = await share(memory, first, SharedFile("osprey.pdf", "", "s-1", "U1"))
    async with kb.holding(tenant, saved.arxiv_id):
        record = await kb.paper(first, saved.arxiv_id)
        forgetting = asyncio.create_task(memory.governance.forget_paper(tenant, saved.arxiv_id))
        for _ in range(100):  # the forget runs, or waits (the lock), meanwhile
            if forgetting.done():
                break
            await asyncio.sleep(0.01)
        added = {"thread": "slack:T:G1:2", "sharer": "U2", "origin": "s-2", "at": time.time()}
        await kb.put_shares(tenant, record, [*shares_of(record), added])
    await forgetting

    assert await record_of(memory, tenant, saved.arxiv_id) is None
    assert not await has_chunks(memory, tenant, saved.arxiv_id)


class Embedded:
    """The test's embedder, counting the shares that got as far as embedding their passages."""

    def __init__(self, inner, shares: int) -> None:
        self.inner, self.left, self.all_there = inner, shares, asyncio.Event()

    async def embed(self, texts):
        vectors = await self.inner.embed(texts)
        self.left -= 1
        if self.left == 0:
            self.all_there.set()
        return vectors


async def test_two_shares_of_one_new_file_at_once_both_hold_the_copy(memory, tenant):
    kb, data = memory.knowledge_base, shared_pdf("Paper of the heron")
    paper_id = shared_pdf_id(content_hash(data), "private:G1")
    first, second = in_g1(tenant, "1", "U1"), in_g1(tenant, "2", "U2")
    for scope in (first, second):
        await memory.conversation.append(scope, "user", "a paper for you")
    embedder = Embedded(memory.embedder, 2)
    async with kb.holding(tenant, paper_id):  # both found no copy and read it: then they save
        saving = [
            asyncio.create_task(
                share(memory, scope, SharedFile("heron.pdf", "", origin, user), embedder, data)
            )
            for scope, origin, user in ((first, "s-1", "U1"), (second, "s-2", "U2"))
        ]
        await asyncio.wait_for(embedder.all_there.wait(), 60)
    saved = await asyncio.gather(*saving)

    assert {s.arxiv_id for s in saved} == {paper_id} and sorted(s.already for s in saved) == [
        False,
        True,
    ]
    record = await record_of(memory, tenant, paper_id)
    assert sorted(s["origin"] for s in shares_of(record)) == ["s-1", "s-2"]
    await memory.governance.forget_thread(tenant, first.thread)
    assert await kb.has_paper(second, paper_id)


async def test_each_sharer_takes_back_their_own_shares_from_the_memory_page(memory, world):  # noqa: F811
    """Bob (U2, no admin) shared one PDF first and another second; Carol (U3) the other
    shares. Bob's forget takes back his shares only: both PDFs stay for Carol."""
    tenant, kb = world.tenant, memory.knowledge_base
    bob, carol = (slack_scope(tenant, "G1", ts, user, name, Visibility.PRIVATE)
                  for ts, user, name in (("400.1", "U2", "Bob"), ("400.2", "U3", "Carol")))  # fmt: skip
    bobs_first = await share(memory, bob, SharedFile("osprey.pdf", "", "b-1", "U2"))
    await share(memory, carol, SharedFile("osprey.pdf", "", "c-1", "U3"))
    heron = shared_pdf("Paper of the heron")
    carols_first = await share(memory, carol, SharedFile("heron.pdf", "", "c-2", "U3"), data=heron)
    await share(memory, bob, SharedFile("heron.pdf", "", "b-2", "U2"), data=heron)
    form = {"csrf": "test-csrf", "kind": "paper", "thread": "", "back": "/memory/papers"}
    async with page_client(memory, tenant) as client:
        for paper in (bobs_first, carols_first):
            query = f"kind=paper&id={paper.arxiv_id}&back=/memory/papers"
            status, html = await get(client, f"/memory/forget/confirm?{query}", "bob")
            assert status == 200 and "Your shares of this PDF are taken back" in html
            status, _, _, flash = await post(
                client, "/memory/forget", {**form, "id": paper.arxiv_id}, "bob"
            )
            assert status == 303 and "taken back" in flash["done"] and "stays" in flash["done"]
            record = await record_of(memory, tenant, paper.arxiv_id)
            assert [s["sharer"] for s in shares_of(record)] == ["U3"], paper.arxiv_id
            assert await kb.has_paper(carol, paper.arxiv_id)
            assert await has_chunks(memory, tenant, paper.arxiv_id)


async def test_a_share_that_left_delivered_again_holds_the_copy_again(memory, tenant):
    """The record names the first share that stays (its `origin` too): a redelivery of the share
    that left is no longer taken for the one that saved it, and holds the copy again."""
    first, second = in_g1(tenant, "1", "U1"), in_g1(tenant, "2", "U2")
    saved = await share(memory, first, SharedFile("osprey.pdf", "", "s-1", "U1"))
    await share(memory, second, SharedFile("osprey.pdf", "", "s-2", "U2"))
    await memory.governance.forget_shares(tenant, ["s-1"])
    assert (await record_of(memory, tenant, saved.arxiv_id))["origin"] == "s-2"

    again = await share(memory, first, SharedFile("osprey.pdf", "", "s-1", "U1"))

    assert again.already and again.arxiv_id == saved.arxiv_id
    record = await record_of(memory, tenant, saved.arxiv_id)
    assert [s["origin"] for s in shares_of(record)] == ["s-2", "s-1"]


async def test_a_person_whose_only_trace_is_a_share_others_keep_is_erased_not_unknown(
    memory, tenant
):
    """Their share leaves the copy (counted): the erasure is not answered "nothing found"."""
    first, second = in_g1(tenant, "1", "U1"), in_g1(tenant, "2", "U2")
    await memory.conversation.append(second, "user", "a paper for you")  # U2's words only
    await share(memory, first, SharedFile("osprey.pdf", SECOND_LINK, "s-1", "U1"))
    saved = await share(memory, second, SharedFile("osprey.pdf", SECOND_LINK, "s-2", "U2"))

    erasure = await memory.governance.forget_person(tenant, "U1")

    assert erasure.shares == 1
    record = await record_of(memory, tenant, saved.arxiv_id)
    assert [s["sharer"] for s in shares_of(record)] == ["U2"]


async def test_a_log_that_quoted_an_erased_first_sharers_link_goes_with_it(memory, tenant):
    """U2's search showed the passages headed with the first sharer's link: erasing that
    sharer rewrites the passages, and takes the log that quoted them (held in G1)."""
    first, second = in_g1(tenant, "1", ERASED), in_g1(tenant, "2", "U2")
    for scope in (first, second):
        await memory.conversation.append(scope, "user", "a paper for you")
    saved = await share(
        memory, first, SharedFile("erased-persons-draft.pdf", FIRST_LINK, "s-1", ERASED)
    )
    await share(memory, second, SharedFile("osprey.pdf", SECOND_LINK, "s-2", "U2"))
    quoted = ToolLogEntry(
        second.thread, "search_knowledge_base", {"query": "osprey"}, f"Link: {FIRST_LINK}",
        "success", audience=second.audience, author="U2",
        message_ids=[paper_shown(saved.arxiv_id)],
    )  # fmt: skip
    await memory.tool_logs.write(second, quoted)

    erasure = await memory.governance.forget_person(tenant, ERASED)

    assert erasure.tool_logs >= 1
    assert [e.id for e in await memory.tool_logs.recent(second)] == []
