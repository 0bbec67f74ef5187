"""A person erased leaves nothing of theirs on the team's copies of the PDFs they shared in a
public channel (memory/governance.py `_unname_shares`): the paper stays, the team's knowledge as
papers from arXiv are, but its record and chunks lose their user id, their link (a Slack file
link holds their id) and their share's id, and the logs that quoted the link go. Another
person's shared PDF keeps all of its share. A real Redis."""

from __future__ import annotations

import json

from memory.ingest.shared_pdf import SavedPdf, SharedFile, save_shared_pdf
from memory.keys import papers_key
from memory.scope import Scope
from memory.stores.knowledge_base import shares_of
from memory.stores.tool_log import ToolLogEntry, paper_shown
from memory.tokens import encoding_for
from tests.support.pdfs import make_pdf

ERASED, OTHER = "UERASED33", "UOTHER33"
ERASED_LINK = f"https://acme.slack.com/files/{ERASED}/F0ERASED/erased.pdf"
OTHER_LINK = f"https://acme.slack.com/files/{OTHER}/F0OTHER/other.pdf"
PHRASE = "Quokka tessellation lemmas bound the glacier entropy of sparse attention heads."


def pdf(title: str, phrase: str) -> bytes:
    return make_pdf(
        [("1 Introduction", ["Teams share papers in chat. " * 3]), ("2 Method", [phrase])],
        title=title,
    )


async def share(memory, scope: Scope, data: bytes, shared: SharedFile) -> SavedPdf:
    kb, encoding = memory.knowledge_base, encoding_for("gpt-5-mini")
    return await save_shared_pdf(data, shared, scope, kb, memory.embedder, encoding, 10**7)


async def stored(memory, tenant: str, paper_id: str) -> list[bytes]:
    """What Redis holds of a paper: its record, then each chunk's fields (raw bytes)."""
    record = await memory.redis.hget(papers_key(tenant), paper_id)
    kb, count = memory.knowledge_base, int(json.loads(record)["chunks"])
    chunks = [await memory.redis.hgetall(kb.chunk_key(tenant, paper_id, i)) for i in range(count)]
    assert all(chunks)
    return [record] + [value for chunk in chunks for value in chunk.values()]


def holds(values: list[bytes], *texts: str) -> bool:
    return any(text.encode() in value for value in values for text in texts)


async def test_erasing_a_person_unnames_the_team_copies_they_shared(memory, tenant):
    kb = memory.knowledge_base
    team = Scope(tenant, "slack:T:C1:1", channel="C1")
    data = pdf("Glacier Entropy", PHRASE)
    theirs = await share(
        memory, team, data,
        SharedFile("erased.pdf", ERASED_LINK, "F0ERASED:1", sharer=ERASED),
    )  # fmt: skip
    again = SharedFile("again.pdf", OTHER_LINK + "?again", "F0AGAIN:2", sharer=OTHER)
    assert (await share(memory, team, data, again)).already  # the team's copy lists no more
    others = await share(
        memory, team, pdf("Narwhal Review", "Narwhal reviews converge in sparse committees."),
        SharedFile("other.pdf", OTHER_LINK, "F0OTHER:1", sharer=OTHER),
    )  # fmt: skip
    reader = Scope(tenant, "slack:T:C2:9", channel="C2", user="U3")

    async def log_showing(paper_id: str, link: str) -> str:
        entry = ToolLogEntry(
            reader.thread, "search_papers", {"query": "entropy"}, f"Link: {link}",
            "success", message_ids=[paper_shown(paper_id)], author="U3",
        )  # fmt: skip
        return await memory.tool_logs.write(reader, entry)

    quoted = await log_showing(theirs.arxiv_id, ERASED_LINK)
    unrelated = await log_showing(others.arxiv_id, OTHER_LINK)
    before = await stored(memory, tenant, theirs.arxiv_id)
    assert holds(before, ERASED) and holds(before, ERASED_LINK)  # the person is there at first
    others_before = await stored(memory, tenant, others.arxiv_id)
    assert holds(others_before, OTHER_LINK)

    erasure = await memory.governance.forget_person(tenant, ERASED)  # their only trace: found

    assert erasure.shares == 1 and erasure.papers == 0 and erasure.tool_logs == 1
    after = await stored(memory, tenant, theirs.arxiv_id)
    assert not holds(after, ERASED, ERASED_LINK, "F0ERASED")
    record = await kb.paper(team, theirs.arxiv_id)
    assert record is not None and record["title"] == "Glacier Entropy"
    assert (record["sharer"], record["url"], record["origin"]) == ("", "", "")
    [left] = shares_of(record)
    assert (left["thread"], left["file_name"]) == (team.thread, "erased.pdf")
    # the team reads and finds it still, from any public place
    vector = (await memory.embedder.embed([PHRASE]))[0]
    found = await kb.search(reader, "quokka tessellation glacier entropy", vector, k=5)
    assert theirs.arxiv_id in {passage.arxiv_id for passage in found}
    assert all(not passage.url for passage in found if passage.arxiv_id == theirs.arxiv_id)
    # the log that quoted their link went; the other person's paper and log are as they were
    assert await memory.tool_logs.ids(reader) == [unrelated] != [quoted]
    assert await stored(memory, tenant, others.arxiv_id) == others_before
    assert [s["sharer"] for s in shares_of(await kb.paper(team, others.arxiv_id))] == [OTHER]
