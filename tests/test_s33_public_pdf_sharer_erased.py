"""A person erased leaves nothing of theirs on the team's copies of the PDFs they shared in a
public channel (memory/governance.py `_unname_shares`): the paper stays, the team's knowledge as
papers from arXiv are, but its record and chunks lose their user id and their link (a Slack file
link holds their id), and the logs that quoted the link go; the share keeps its origin (its
message's), by which a share read across the erasure takes back the copy it saved
(adapters/shared_files.py `_forget_saved`). Another person's shared PDF keeps all of its share.
A real Redis."""

from __future__ import annotations

import json
import time

from memory.ingest.shared_pdf import SavedPdf, SharedFile, save_shared_pdf
from memory.keys import papers_key, turn_queue_key
from memory.scope import Scope, Visibility
from memory.stores.knowledge_base import shares_of
from memory.stores.tool_log import ToolLogEntry, paper_shown
from memory.tokens import encoding_for
from tests.support.pdfs import make_pdf
from tests.test_shared_files_erased_meanwhile import channel_of
from tests.test_shared_pdfs import StubEnd, share_payload, stub_files

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
    assert not holds(after, ERASED, ERASED_LINK)
    record = await kb.paper(team, theirs.arxiv_id)
    assert record is not None and record["title"] == "Glacier Entropy"
    assert (record["sharer"], record["url"], record["origin"]) == ("", "", "F0ERASED:1")
    [left] = shares_of(record)
    # the origin names their message, not them: it stays, as the thread does
    assert (left["thread"], left["origin"]) == (team.thread, "F0ERASED:1")
    assert left["file_name"] == "erased.pdf"
    # the team reads and finds it still, from any public place
    vector = (await memory.embedder.embed([PHRASE]))[0]
    found = await kb.search(reader, "quokka tessellation glacier entropy", vector, k=5)
    assert theirs.arxiv_id in {passage.arxiv_id for passage in found}
    assert all(not passage.url for passage in found if passage.arxiv_id == theirs.arxiv_id)
    # the log that quoted their link went; the other person's paper and log are as they were
    logs = await memory.tool_logs.ids(reader)
    assert quoted not in logs and logs == [unrelated]
    assert await stored(memory, tenant, others.arxiv_id) == others_before
    assert [s["sharer"] for s in shares_of(await kb.paper(team, others.arxiv_id))] == [OTHER]


class ErasingOnSecondRead(StubEnd):
    """A platform whose second download returns once `erase` ran: the share's first file is
    saved, the team's copy, before its sharer's erasure, the second after it."""

    def __init__(self, papers: dict[str, bytes], erase) -> None:
        super().__init__()
        self.papers, self.erase, self.reads = papers, erase, 0

    async def fetch(self, file, max_bytes):
        self.reads += 1
        if self.reads == 2:
            await self.erase()
        return self.papers[file["id"]]


async def test_a_public_share_read_across_its_sharers_erasure_keeps_neither_copy(memory, tenant):
    """The erasure's pass over the papers unnames the copy the share's first file saved; the
    share, seeing the erasure, takes back both copies it saved, found by their origin: none is
    left, unnamed or not, while its message says "Not kept."."""
    scope = channel_of(tenant, Visibility.PUBLIC)
    await memory.conversation.append(scope, "user", "earlier words")  # theirs, to erase
    papers = {
        "F1": pdf("Walrus Sorting", "Walrus sorting networks merge icebergs in logarithmic depth."),
        "F2": pdf("Puffin Caches", "Puffin caches evict herring by their least recent dive."),
    }
    erasures = []

    async def erase() -> None:
        erasures.append(await memory.governance.forget_person(tenant, "U1"))

    end = ErasingOnSecondRead(papers, erase)
    payload = share_payload(scope, f"slack:{scope.channel}:{time.time_ns()}", turn="read these")
    payload["files"].append({**payload["files"][0], "id": "F2", "name": "y.pdf"})
    payload.update(queued_at=time.time(), sharer="U1")
    await stub_files(memory, end).one(payload)
    [erasure] = erasures
    assert erasure.shares == 1 and erasure.papers == 0  # the first file's copy, unnamed
    assert await memory.redis.hlen(papers_key(tenant)) == 0  # then taken back, as the second
    assert await memory.redis.llen(turn_queue_key(tenant, scope.thread)) == 0
    said = dict(end.edits)  # each file's message, its last word
    assert len(said) == 2 and set(said.values()) == {"Not kept."}
