"""A PDF shared in chat is not trusted: its pages are counted before any is read, its text and
passages have a budget, it is read in a child process with a memory limit and a timeout, and a
share whose task keeps taking its process down is given up unrun, said, and its question asked
(memory/ingest/pdf.py, pdf_child.py, shared_pdf.py; bot/background.py; shared_files.py)."""

from __future__ import annotations

import asyncio
import time
import zlib

import pytest

from adapters.shared_files import MAX_DELIVERIES, SHARED_FILES
from bot.background import BackgroundWork
from memory.ingest.errors import IngestError
from memory.ingest.pdf import read_pdf
from memory.ingest.pdf_child import read_pdf_in_child
from memory.ingest.shared_pdf import SharedFile, save_shared_pdf
from memory.keys import task_stream
from memory.scope import Scope, Visibility
from memory.tasks import Task, TaskStream
from memory.tokens import encoding_for
from tests.support.pdf_children import STAND_IN
from tests.test_shared_files_last_delivery import WENT_WRONG, queued_turns
from tests.test_shared_pdfs import StubEnd, share_payload, shared_pdf, stub_files

LINE = "Lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor."


def one_stream_pdf(pages: int, lines: list[str]) -> bytes:
    """A PDF whose `pages` all show one compressed content stream of `lines`: a small file
    whatever its text."""
    shown = "".join(f"({line}) '\n" for line in lines)
    stream = zlib.compress(f"BT /F1 10 Tf 20 800 Td 12 TL\n{shown}ET\n".encode(), 9)
    objects = {
        1: b"<< /Type /Catalog /Pages 2 0 R >>",
        3: b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        4: b"<< /Length %d /Filter /FlateDecode >>\nstream\n%b\nendstream" % (len(stream), stream),
    }
    page = (
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792]"
        b" /Resources << /Font << /F1 3 0 R >> >> /Contents 4 0 R >>"
    )
    kids = []
    for number in range(5, 5 + pages):
        objects[number] = page
        kids.append(b"%d 0 R" % number)
    objects[2] = b"<< /Type /Pages /Count %d /Kids [%b] >>" % (pages, b" ".join(kids))
    out = bytearray(b"%PDF-1.4\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += b"%d 0 obj\n%b\nendobj\n" % (number, objects[number])
    xref, size = len(out), max(objects) + 1
    out += b"xref\n0 %d\n0000000000 65535 f \n" % size
    out += b"".join(b"%010d 00000 n \n" % offsets[n] for n in range(1, size))
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (size, xref)
    return bytes(out)


async def save(memory, tenant: str, data: bytes, name: str, max_pages: int):
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    shared = SharedFile(name, "", f"share-{time.time_ns()}")
    return await save_shared_pdf(
        data, shared, scope, memory.knowledge_base, memory.embedder,
        encoding_for("gpt-5-mini"), 10**8, max_pages,
    )  # fmt: skip


async def test_a_pdf_of_too_many_pages_is_refused_before_any_page_is_read(memory, tenant):
    data = one_stream_pdf(1000, [LINE])
    visited: list[int] = []
    refusal = r"many\.pdf: it has 1000 pages, and I read up to 300\."
    with pytest.raises(IngestError, match=refusal):
        read_pdf(data, "many.pdf", max_pages=300, on_page=visited.append)
    assert visited == []  # no page's text was extracted
    with pytest.raises(IngestError, match=refusal):  # the same from a share, read in a child
        await save(memory, tenant, data, "many.pdf", max_pages=300)
    assert await memory.knowledge_base.papers(Scope(tenant)) == []


async def test_a_small_pdf_whose_text_explodes_is_refused_by_the_text_budget(memory, tenant):
    data = one_stream_pdf(5, [LINE] * 2000)  # 3 KB, 790,000 characters
    assert len(data) < 5_000
    visited: list[int] = []
    refusal = (
        r"fat\.pdf: it holds more text than I read from one PDF \(over 50,000 characters by "
        r"page 1 of 5\)\."
    )
    with pytest.raises(IngestError, match=refusal):
        read_pdf(data, "fat.pdf", max_pages=5, on_page=visited.append)
    assert visited == [0]  # stopped at the first page over the budget
    with pytest.raises(IngestError, match=refusal):
        await save(memory, tenant, data, "fat.pdf", max_pages=5)


async def test_a_pdf_of_too_many_passages_for_its_pages_is_refused(memory, tenant):
    """Under the text budget, but every line a section of its own: too many passages."""
    lines = [f"{n // 9 + 1}.{n % 9 + 1} Heading of part {n}" for n in range(50)]
    lines = [line for heading in lines for line in (heading, "A short line of text.")]
    data = one_stream_pdf(1, lines)
    with pytest.raises(IngestError, match=r"x\.pdf: its text makes 50 passages, and I store up "
                       r"to 20 from one PDF\."):  # fmt: skip
        await save(memory, tenant, data, "x.pdf", max_pages=1)
    assert await memory.knowledge_base.papers(Scope(tenant)) == []


async def test_a_parse_over_the_memory_limit_or_the_time_limit_is_refused():
    """One page of 1.6 million characters, in a 6 KB file: pdfium needs about 230 MB for it."""
    data = one_stream_pdf(1, [LINE] * 20_000)
    with pytest.raises(IngestError, match=r"bomb\.pdf: the PDF reader failed on it \(it may be "
                       r"damaged, or need more memory than the 100 MB I allow") as refused:  # fmt: skip
        await read_pdf_in_child(data, "bomb.pdf", memory_mb=100)
    # pdfium aborted (SIGABRT) when an allocation failed: the limit, not a child that broke
    assert "pdf reader child exited with -6" in str(refused.value.__cause__)
    given_room = await read_pdf_in_child(data, "bomb.pdf", memory_mb=1024)
    assert given_room.pages == 1  # the same file reads with the memory it needs
    # a child that never finishes (its stand-in, through the module seam): killed, and said
    with pytest.raises(IngestError, match=r"^hang\.pdf: reading it took longer than I allow "
                       r"for one PDF \(2 s\)\.$"):  # fmt: skip
        await read_pdf_in_child(data, "hang.pdf", timeout=2, module=STAND_IN)
    text = await read_pdf_in_child(shared_pdf("Fine"), "fine.pdf", max_pages=300)
    assert text.title == "Fine" and text.pages == 2  # a paper reads, in the child as in-process
    assert text.paragraphs == read_pdf(shared_pdf("Fine")).paragraphs


async def test_a_task_claimed_past_its_last_delivery_is_dead_lettered_unrun_and_told(client_name):
    """The batch around it runs; a kind without a hook is dead-lettered all the same."""
    client, name = client_name
    runs: list[dict] = []
    told: list[dict] = []

    async def run(payloads: list[dict]) -> None:
        runs.extend(payloads)

    async def hook(payload: dict) -> None:
        told.append(payload)

    stream = TaskStream(client, name)
    await stream.ensure_group()
    spent = await stream.add("a", {"n": 1})
    await stream.add("b", {"n": 2})
    await redeliver(client, name, [spent], times=3)
    await stream.add("a", {"n": 3})
    work = BackgroundWork(TaskStream(client, name), {"a": run, "b": run}, claim_idle_ms=100,
                          block_ms=50, max_deliveries=3, on_dead_letter={"a": hook})  # fmt: skip
    work.start()
    try:
        async with asyncio.timeout(20):
            await work.drain()
    finally:
        await work.close()
    assert sorted(p["n"] for p in runs) == [2, 3] and told == [{"n": 1}]
    dead = await client.xrange(f"{name}:dead")
    assert [(f[b"id"].decode(), f[b"deliveries"]) for _, f in dead] == [(spent, b"4")]
    assert dead[0][1][b"error"].startswith(b"not run: delivered 4 times")


async def test_a_share_whose_task_keeps_killing_its_process_is_said_and_its_question_asked(
    memory, tenant
):
    """Its run posted "Reading x.pdf…" and died (the last of its deliveries): claimed again,
    it is not run, the message says it went wrong, and the question is queued as a turn."""
    end = HangingEnd(shared_pdf("Deadly"))
    files = stub_files(memory, end, stream_prefix=f"crash-{time.time_ns()}")
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}", turn="what does it say?")
    stream = files.stream("slack")
    await stream.ensure_group()
    task_id = await stream.add(SHARED_FILES, payload)
    await redeliver(memory.redis, stream.stream, [task_id], times=MAX_DELIVERIES)
    dying = asyncio.create_task(files.one(payload))  # the last run: stuck reading, then gone
    async with asyncio.timeout(10):
        await end.reading.wait()
    dying.cancel()
    await asyncio.gather(dying, return_exceptions=True)
    assert end.posts == ["_Reading x.pdf…_"] and end.edits == []
    runs: list[dict] = []

    async def run(payloads: list[dict]) -> None:
        runs.extend(payloads)
        await files.run(payloads)

    work = BackgroundWork(stream, {SHARED_FILES: run}, batch=1, claim_idle_ms=100, block_ms=50,
                          max_deliveries=MAX_DELIVERIES,
                          on_dead_letter={SHARED_FILES: files.given_up})  # fmt: skip
    work.start()
    try:
        async with asyncio.timeout(20):
            await work.drain()
    finally:
        await work.close()
        await stream.destroy()
    assert runs == []
    assert end.edits == [("1", WENT_WRONG)]  # its "Reading…" message, updated
    assert [payload["turn"]] == await queued_turns(memory, scope)
    files.attach("slack")  # the process's own worker is told the same way
    try:
        assert files.workers["slack"].on_dead_letter == {SHARED_FILES: files.given_up}
    finally:
        await files.close()


class HangingEnd(StubEnd):
    """A first download that never ends: that run is stuck until its process goes (a run
    after it would read the file)."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.reading = asyncio.Event()

    async def fetch(self, file, max_bytes):
        if not self.reading.is_set():
            self.reading.set()
            await asyncio.Event().wait()
        return await super().fetch(file, max_bytes)


async def redeliver(client, name: str, ids: list[str], times: int, began: bool = True) -> None:
    """Deliver the entries `times` times in all, to consumers that then die (XREADGROUP, then
    XCLAIM: each counts a delivery); `began`: the last one's run had started (it never ended)."""
    await client.xreadgroup("workers", "dead-0", {name: ">"})
    for n in range(1, times):
        await client.xclaim(name, "workers", f"dead-{n}", 0, ids)
    if began:
        await TaskStream(client, name).mark_started(Task(i, "", {}, times) for i in ids)


@pytest.fixture
async def client_name(memory):
    name = task_stream(f"test-{time.time_ns()}")  # with its dead letters in one slot
    yield memory.redis, name
    await memory.redis.delete(name, f"{name}:dead")
