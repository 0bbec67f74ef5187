"""Ingestion: arXiv ids, PDF files and unarXive files into a tenant's knowledge base.

Each paper is parsed, chunked, embedded in batches and written with its vectors. A paper that
is already stored (or listed twice) is skipped; one that fails is reported and the rest go on.
The knowledge base keeps one version of a paper: asking for a newer version (`2401.00001v2`
while v1 is stored) replaces it, once the new text is ready; an older one is refused, saying so.
The report separates embedding time from the rest, which is what ingestion speed depends on.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import re
import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np
from tqdm import tqdm

from memory.errors import in_passing, memory_full, memory_unavailable
from memory.ingest.arxiv_source import ArxivSource, check_arxiv_id
from memory.ingest.chunking import Paragraph, chunk_paragraphs
from memory.ingest.errors import IngestError
from memory.ingest.pdf import check_passages
from memory.ingest.pdf_child import read_pdf_in_child
from memory.ingest.unarxive import is_unarxive_path, read_unarxive
from memory.scope import Scope
from memory.stores.knowledge_base import (
    KnowledgeBase,
    Paper,
    PaperBusy,
    PaperKept,
    ReplaceFailed,
    base_arxiv_id,
    is_arxiv_id,
    is_from_arxiv,
)

log = logging.getLogger(__name__)

EMBED_BATCH = 128
# PDFs from arXiv (anyone may post one there and ask for it in chat) and local files: read in
# a child process, up to this many pages (and the text and passages for them: pdf.py). Longer
# than any paper; chat shares have their own limit (settings.max_pdf_pages).
MAX_PDF_PAGES = 1000
_ARXIV_URL = re.compile(r"arxiv\.org/(?:abs|pdf)/([^\s?#]+?)(?:\.pdf)?/?$")
_VERSION = re.compile(r"v(\d+)$")
ALREADY_STORED = "already in the knowledge base"


def _version(text: str) -> int | None:
    found = _VERSION.search(text or "")
    return int(found.group(1)) if found else None


def stored_version(record: dict) -> int | None:
    """The arXiv version a paper was saved at: recorded, else read from its abs link."""
    return _version(str(record.get("version") or "")) or _version(record.get("url") or "")


def why_kept(arxiv_id: str, record: dict) -> str | None:
    """Why the stored paper `record` stands for `arxiv_id` (None: fetch it and replace the
    stored version, the one asked for being newer or the stored one unknown)."""
    asked, saved = _version(arxiv_id), stored_version(record)
    if asked is None or asked == saved or not is_from_arxiv(base_arxiv_id(arxiv_id)):
        return ALREADY_STORED
    if saved is not None and asked < saved:
        return (
            f"v{saved} is saved; this asks for v{asked}. The knowledge base keeps one version of "
            f"a paper: forget the saved one first to save v{asked} instead."
        )
    return None


@dataclass
class IngestReport:
    ingested: list[tuple[str, str, int]] = field(default_factory=list)  # (arxiv_id, title, chunks)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (arxiv_id, why)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (source, message)
    chunks: int = 0
    seconds: float = 0.0
    seconds_embedding: float = 0.0

    @property
    def chunks_per_second(self) -> float:
        return self.chunks / self.seconds if self.seconds else 0.0

    @property
    def embedding_share(self) -> float:
        return self.seconds_embedding / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        lines = [
            f"Ingested {len(self.ingested)} papers ({self.chunks} chunks) in {self.seconds:.1f} s; "
            f"skipped {len(self.skipped)}, failed {len(self.failed)}."
        ]
        lines += [f"  skipped {arxiv_id}: {why}" for arxiv_id, why in self.skipped]
        lines += [f"  failed {source}: {message}" for source, message in self.failed]
        return "\n".join(lines)


class _Ingestor:
    """The state of one run: what was seen, the report, the progress bar. `reraise`: one
    paper for a caller that handles a service's failure itself (`fetch_and_save`): only an
    IngestError (said to the person as is) is reported; any other failure (Redis, the
    embedding API, the PDF reader's start) propagates as raised, its provider's text (a masked
    key, a server path) never becoming a message for the channel."""

    def __init__(self, scope, kb, embedder, encoding, report, bar=None, reraise=False) -> None:
        self.scope, self.kb, self.embedder, self.encoding = scope, kb, embedder, encoding
        self.report, self.bar, self.reraise = report, bar, reraise
        self.seen: set[str] = set()

    def tick(self) -> None:
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix(chunks=self.report.chunks, refresh=False)

    async def is_new(self, arxiv_id: str) -> bool:
        """False (and reported as skipped) if the paper is stored (at the version asked for, or
        a newer one) or was met in this run."""
        key = base_arxiv_id(arxiv_id)
        record = None if key in self.seen else await self.kb.paper(self.scope, key)
        if key in self.seen:
            self.report.skipped.append((key, "listed more than once"))
        elif record is not None and (why := why_kept(arxiv_id, record)):
            self.report.skipped.append((key, why))
        else:
            self.seen.add(key)
            return True
        self.tick()
        return False

    async def store(
        self, paper: Paper, paragraphs: list[Paragraph], max_pages: int | None = None,
        version: str = "", asked: str = "",
    ) -> int:  # fmt: skip
        """Chunk, embed and store a paper's text; a PDF's (`max_pages`) within its passages.

        Whether a stored copy stays (`why_kept` for the id `asked`) is decided again under the
        paper's save lock: another save may have landed since `is_new`."""
        chunks = await asyncio.to_thread(chunk_paragraphs, paragraphs, self.encoding)
        if not chunks:
            raise IngestError(f"{paper.arxiv_id}: no text to store")
        check_passages(paper.arxiv_id, len(chunks), max_pages)
        texts = [c.text for c in chunks]
        started = time.perf_counter()
        parts = [
            await self.embedder.embed(texts[i : i + EMBED_BATCH])
            for i in range(0, len(texts), EMBED_BATCH)
        ]
        self.report.seconds_embedding += time.perf_counter() - started
        key, asked = base_arxiv_id(paper.arxiv_id), asked or paper.arxiv_id
        extra = {"version": version} if version else {}
        try:
            written = await self.kb.add_paper(
                self.scope, paper, chunks, np.concatenate(parts),
                keep=lambda record: why_kept(asked, record), **extra,
            )  # fmt: skip
        except PaperKept as kept:
            if kept.reason != ALREADY_STORED:
                raise IngestError(f"arXiv {key}: {kept.reason}") from kept
            self.report.skipped.append((key, kept.reason))
            self.tick()
            return 0
        except ReplaceFailed as exc:
            # a service's failure: its text is enough; anything else: its traceback too
            bug = None if _may_pass(exc) else exc
            log.warning("replacing the saved %s failed: %r", key, exc.__cause__, exc_info=bug)
            raise IngestError(_replace_failed(exc)) from exc
        except PaperBusy as exc:
            raise IngestError(str(exc)) from exc
        self.report.ingested.append((base_arxiv_id(paper.arxiv_id), paper.title, written))
        self.report.chunks += written
        self.tick()
        return written

    def fail(self, source: str, exc: Exception) -> None:
        """Report `source` failed; when called in an except clause with `reraise`, a failure
        other than an IngestError is raised again instead (the caller's to handle)."""
        if self.reraise and not isinstance(exc, IngestError):
            raise exc
        self.report.failed.append((source, _described(exc)))
        self.tick()

    # -- sources ----------------------------------------------------------------------------

    async def arxiv_papers(self, ids: list[str], arxiv: ArxivSource | None) -> None:
        wanted = []
        for arxiv_id in ids:
            try:
                check_arxiv_id(arxiv_id)
            except IngestError as exc:
                self.fail(arxiv_id, exc)
                continue
            if await self.is_new(arxiv_id):
                wanted.append(arxiv_id)
        if wanted and arxiv is None:
            for arxiv_id in wanted:
                self.fail(arxiv_id, IngestError("arXiv access is not configured"))
            return
        try:
            hits = await arxiv.lookup(wanted) if wanted else {}
        except Exception as exc:  # e.g. arXiv unreachable: every id fails with the same reason
            for arxiv_id in wanted:
                self.fail(arxiv_id, exc)
            return
        for arxiv_id in wanted:
            hit = hits[arxiv_id]
            try:
                if isinstance(hit, IngestError):
                    raise hit
                data = await arxiv.download_pdf(hit.pdf_url, hit.no_pdf_reason())
                text = await read_pdf_in_child(data, f"arXiv {arxiv_id} PDF", MAX_PDF_PAGES)
                abstract = [("Abstract", hit.paper.abstract)] if hit.paper.abstract else []
                await self.store(
                    hit.paper, abstract + text.located(), MAX_PDF_PAGES, hit.version, arxiv_id
                )
            except Exception as exc:
                self.fail(arxiv_id, exc)

    async def pdf_file(self, path: Path) -> None:
        try:
            data = await asyncio.to_thread(path.read_bytes)
            stem = path.stem
            # Always `local-…`: a name like `2401.00001.pdf` says nothing of the content, and an
            # arXiv id would open the file to guests (`is_from_arxiv`) and link it to arxiv.org.
            arxiv_id = f"local-{hashlib.sha1(data).hexdigest()[:12]}"
            if not await self.is_new(arxiv_id):
                return
            text = await read_pdf_in_child(data, str(path), MAX_PDF_PAGES)
            # No link: a `file://` one would show every user the server's paths.
            paper = Paper(arxiv_id=arxiv_id, title=text.title or stem, source="pdf")
            await self.store(paper, text.located(), MAX_PDF_PAGES)
        except Exception as exc:
            self.fail(str(path), exc)

    async def unarxive_file(self, path: Path) -> None:
        items = read_unarxive(path, on_error=lambda exc: self.fail(str(path), exc))
        while True:
            try:
                item = await asyncio.to_thread(next, items, None)
            except IngestError as exc:  # the file itself is unreadable
                self.fail(str(path), exc)
                return
            if item is None:
                return
            paper, paragraphs = item
            try:
                if await self.is_new(paper.arxiv_id):
                    await self.store(paper, paragraphs)
            except Exception as exc:
                self.fail(f"{path} ({paper.arxiv_id})", exc)


def _replace_failed(exc: ReplaceFailed) -> str:
    """A replacement that failed once the saved version was removed, for a channel: what
    failed in save_failed's words (bot/tools.py), never the store's own text (an address, a
    provider's message: in the operator's log), and what to do now. Without the paper's id:
    every caller names it (the Save answer, the tool's call, the ingest report's line)."""
    saved = stored_version(exc.removed)
    removed = f"the saved version{f' (v{saved})' if saved else ''} was removed"
    if memory_full(exc):
        return f"the memory store is full and {removed}; save it again once the memory has room"
    if _may_pass(exc):
        return f"the memory store is unreachable right now and {removed}; try again in a minute"
    # the paper is gone now: a new save is a plain add, not this replacement
    return f"something went wrong on my side while saving it, and {removed}; save it again"


def _may_pass(exc: BaseException) -> bool:
    return memory_unavailable(exc) or in_passing(exc)


def _described(exc: BaseException | None) -> str:
    """An error as the report says it: an IngestError's message as is, else its type too."""
    return str(exc) if isinstance(exc, IngestError) else f"{type(exc).__name__}: {exc}"


def arxiv_id_of(source: str) -> str | None:
    found = _ARXIV_URL.search(source)
    candidate = found.group(1) if found else source
    return candidate if is_arxiv_id(candidate) else None


async def ingest(
    sources: list[str],
    scope: Scope,
    kb: KnowledgeBase,
    embedder,
    encoding,
    arxiv: ArxivSource | None,
    progress: bool = True,
) -> IngestReport:
    """Ingest arXiv ids (or abs/pdf links), PDF files and unarXive files; never raises per paper."""
    report = IngestReport()
    started = time.perf_counter()
    ids: list[str] = []
    files: list[Path] = []
    bad: list[str] = []
    for source in sources:
        source = source.strip()
        path = Path(source).expanduser()
        if path.is_file() and (path.suffix.lower() == ".pdf" or is_unarxive_path(path)):
            files.append(path)
        elif (arxiv_id := arxiv_id_of(source)) is not None:
            ids.append(arxiv_id)
        else:
            bad.append(source)
    known = len(ids) + len(bad) + sum(p.suffix.lower() == ".pdf" for p in files)
    total = None if any(is_unarxive_path(p) for p in files) else known
    with tqdm(total=total, unit="paper", desc="Ingesting", file=sys.stderr,
              disable=not progress) as bar:  # fmt: skip
        run = _Ingestor(scope, kb, embedder, encoding, report, bar)
        for source in bad:
            run.fail(source, IngestError(_why_unusable(source)))
        await run.arxiv_papers(ids, arxiv)
        for path in files:
            if path.suffix.lower() == ".pdf":
                await run.pdf_file(path)
            else:
                await run.unarxive_file(path)
    report.seconds = time.perf_counter() - started
    return report


def _why_unusable(source: str) -> str:
    path = Path(source).expanduser()
    if path.is_file():
        return f"{source}: unsupported file type (use .pdf, .jsonl, .jsonl.gz or .tar.gz)"
    if path.suffix.lower() in (".pdf", ".jsonl", ".gz", ".tgz"):
        return f"{source}: no such file"
    try:
        check_arxiv_id(source)
    except IngestError as exc:
        return str(exc)
    return f"{source!r} is neither an arXiv id nor an existing file"


def _paper_of(record: dict) -> Paper:
    names = {f.name for f in fields(Paper)}
    return Paper(**{k: v for k, v in record.items() if k in names})


async def fetch_and_save(
    arxiv_id: str,
    scope: Scope,
    kb: KnowledgeBase,
    embedder,
    encoding,
    arxiv: ArxivSource,
) -> tuple[Paper, int, bool]:
    """Fetch one arXiv paper into the knowledge base: (paper, chunks, already_present).

    For the agent's tool and the Save button: the text goes straight to the store, never
    into the conversation. A newer version than the stored one replaces it. Raises
    IngestError with a message fit for the user; any other failure (Redis, the embedding API)
    as it was raised, for the caller to say in its own words (its provider's text is not for
    the channel): the agent's tool raises `SaveFailed` naming the service (bot/tools.py), the
    Save task says to press Save again (bot/watch_saves.py).
    """
    arxiv_id = check_arxiv_id(arxiv_id)
    record = await kb.paper(scope, arxiv_id)
    why = why_kept(arxiv_id, record) if record else None
    if record and why == ALREADY_STORED:
        return _paper_of(record), int(record["chunks"]), True
    if why:
        raise IngestError(f"arXiv {base_arxiv_id(arxiv_id)}: {why}")
    report = IngestReport()
    ingestor = _Ingestor(scope, kb, embedder, encoding, report, reraise=True)
    await ingestor.arxiv_papers([arxiv_id], arxiv)
    if report.failed:
        raise IngestError(report.failed[0][1])
    record = await kb.paper(scope, arxiv_id)
    if record is None:
        raise IngestError(f"arXiv {arxiv_id} was not stored")
    return _paper_of(record), int(record["chunks"]), not report.ingested
