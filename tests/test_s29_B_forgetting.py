"""What forgetting leaves behind, against the real Redis: a forgotten paper's passages leave the
tool logs that showed them (and their copies read back); a PDF shared again in its place stays
for the second share when the first one's thread or sharer goes, and goes with the last; an
entity deleted on the memory page is not learned again when its question is edited; retention
keeps a PDF shared again in a thread it keeps, and a share taken back leaves it to the other;
a shared PDF's id, written as the tools show it, finds its passages."""

from __future__ import annotations

import json
import time

from bot.llm import ToolCall
from memory.ingest.shared_pdf import SavedPdf, SharedFile, save_shared_pdf
from memory.keys import papers_key
from memory.retention import DAY, Retention
from memory.scope import Scope, Visibility
from memory.stores.knowledge_base import shares_of
from memory.tokens import encoding_for
from tests import test_governance_learned_retries
from tests.support.memory_seed import PAPER, add_paper
from tests.test_governance_learned import KESTREL, ask
from tests.test_learning_after_edits import OKAPI, OKAPI_PIECE, SOURCE, ZEBRA, ZEBRA_PIECE, edit_to
from tests.test_shared_pdf_lifecycle import backdate
from tests.test_shared_pdfs import shared_pdf

world = test_governance_learned_retries.world  # its fixture: an agent world on the test Redis


def search(query: str, **filters: str) -> ToolCall:
    return ToolCall("c1", "search_knowledge_base", json.dumps({"query": query, **filters}))


async def logs_of(memory, scope: Scope) -> list[str]:
    return [entry.id for entry in await memory.tool_logs.recent(scope)]


async def test_forgetting_a_paper_takes_the_tool_logs_that_showed_its_passages(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    await add_paper(memory, tenant)
    asked, other = Scope(tenant, "t-1", "C1", user="U1"), Scope(tenant, "t-2", "C1", user="U2")
    shown, _ = await harness.run_tool(asked, search("memory tiers paging"), 1)
    assert "MemGPT" in shown
    (log_id,) = await logs_of(memory, asked)
    read = ToolCall("c2", "read_tool_log", json.dumps({"log_id": log_id}))
    await harness.run_tool(other, read, 1)  # read back in another thread: a copy
    assert len(await logs_of(memory, other)) == 1

    erasure = await memory.governance.forget_paper(tenant, PAPER.arxiv_id)

    assert erasure.papers == 1 and erasure.chunks == 3 and erasure.tool_logs == 2
    assert await logs_of(memory, asked) == [] and await logs_of(memory, other) == []


KESTREL_PDF = shared_pdf("Paper of the kestrel")  # made once: each PDF made has its own bytes


async def share(memory, scope: Scope, origin: str, sharer: str) -> SavedPdf:
    """The same file (same bytes) shared by `sharer` in `scope`'s thread."""
    shared = SharedFile("kestrel.pdf", "", origin, sharer=sharer)
    return await save_shared_pdf(
        KESTREL_PDF, shared, scope, memory.knowledge_base,
        memory.embedder, encoding_for("gpt-5-mini"), 10**7,
    )  # fmt: skip


async def record_of(memory, tenant: str, paper_id: str) -> dict | None:
    raw = await memory.redis.hget(papers_key(tenant), paper_id)
    return json.loads(raw) if raw else None


async def shared_twice(memory, tenant: str) -> tuple[Scope, Scope, str]:
    """The file shared by U1 in one thread of private channel G1, then by U2 in another (twice:
    a redelivery): one copy."""
    first = Scope(tenant, "slack:T:G1:1", "G1", user="U1", visibility=Visibility.PRIVATE)
    second = Scope(tenant, "slack:T:G1:2", "G1", user="U2", visibility=Visibility.PRIVATE)
    for scope in (first, second):
        await memory.conversation.append(scope, "user", "a paper for you")
    saved = await share(memory, first, "share-1", "U1")
    assert not saved.already
    for _ in range(2):
        again = await share(memory, second, "share-2", "U2")
        assert again.already and again.arxiv_id == saved.arxiv_id
    return first, second, saved.arxiv_id


async def test_a_pdf_shared_again_stays_when_the_first_thread_goes(world, tenant):
    memory = world.runtime.memory
    first, second, paper_id = await shared_twice(memory, tenant)

    await memory.governance.forget_thread(tenant, first.thread)

    assert await memory.knowledge_base.has_paper(second, paper_id)
    record = await record_of(memory, tenant, paper_id)
    assert (record["thread"], record["sharer"]) == (second.thread, "U2")
    await memory.governance.forget_thread(tenant, second.thread)  # the last share: it goes
    assert await record_of(memory, tenant, paper_id) is None


async def test_a_pdf_shared_again_stays_when_its_first_sharer_is_erased(world, tenant):
    memory = world.runtime.memory
    first, second, paper_id = await shared_twice(memory, tenant)
    listed = shares_of(await record_of(memory, tenant, paper_id))
    assert [(s["thread"], s["sharer"]) for s in listed] == [
        (first.thread, "U1"),
        (second.thread, "U2"),
    ]  # fmt: skip  (each share once, whatever its redeliveries)

    await memory.governance.forget_person(tenant, "U1")

    assert await memory.knowledge_base.has_paper(second, paper_id)
    record = await record_of(memory, tenant, paper_id)
    assert "U1" not in json.dumps(record)  # the erased person's id left the record
    assert [s["sharer"] for s in shares_of(record)] == ["U2"]
    await memory.governance.forget_person(tenant, "U2")
    assert await record_of(memory, tenant, paper_id) is None


async def test_an_entity_deleted_on_the_memory_page_stays_deleted_after_an_edit(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1")
    await ask(world, scope, ZEBRA, ZEBRA_PIECE, source=SOURCE)
    key = memory.entities.key(scope, KESTREL)
    entity_id = key.removeprefix(memory.entities.key_prefix(tenant))
    assert await memory.entities.by_id(tenant, entity_id) is not None

    await memory.governance.forget_entity(tenant, entity_id)
    world.entities = [{"name": KESTREL, "type": "system", "description": OKAPI_PIECE}]
    await edit_to(world, tenant, OKAPI)  # the question's turn is learned again
    await harness.drain()

    assert await memory.entities.by_id(tenant, entity_id) is None


async def test_a_shared_pdf_written_as_the_tools_show_it_is_searched(world, tenant):
    memory = world.runtime.memory
    scope = Scope(tenant, "slack:T:C1:1", "C1", user="U1")
    saved = await share(memory, scope, "share-1", "U1")
    for written in (f"[PDF:{saved.arxiv_id}]", f"pdf:{saved.arxiv_id}"):
        call = search("quokka tessellation", arxiv_id=written)
        found, _ = await world.runtime.harness.run_tool(scope, call, 1)
        assert f"[PDF:{saved.arxiv_id}]" in found, (written, found)


async def test_retention_keeps_a_pdf_shared_again_in_a_thread_it_keeps(world, tenant):
    memory, old = world.runtime.memory, time.time() - 3 * DAY
    quiet = Scope(tenant, "slack:T:G1:1", "G1", user="U1", visibility=Visibility.PRIVATE)
    active = Scope(tenant, "slack:T:G1:2", "G1", user="U2", visibility=Visibility.PRIVATE)
    await memory.conversation.append(quiet, "user", "a paper for you", timestamp=old)
    saved = await share(memory, quiet, "share-1", "U1")
    await backdate(memory, tenant, saved.arxiv_id, old)  # shared with the old message
    await memory.conversation.append(active, "user", "this one again")
    assert (await share(memory, active, "share-2", "U2")).already
    retention = Retention(memory)
    await retention.set(tenant, 1)

    erasure = await retention.sweep(tenant)

    assert erasure.threads == 1 and erasure.papers == 0
    assert await memory.knowledge_base.has_paper(active, saved.arxiv_id)
    assert [s["thread"] for s in shares_of(await record_of(memory, tenant, saved.arxiv_id))] == [
        active.thread
    ]


async def test_a_share_taken_back_leaves_the_copy_another_share_holds(world, tenant):
    memory = world.runtime.memory
    *_, paper_id = await shared_twice(memory, tenant)

    await memory.governance.forget_shares(tenant, ["share-2"])  # read across U2's erasure

    record = await record_of(memory, tenant, paper_id)
    assert [s["sharer"] for s in shares_of(record)] == ["U1"]
    await memory.governance.forget_shares(tenant, ["share-1"])
    assert await record_of(memory, tenant, paper_id) is None
