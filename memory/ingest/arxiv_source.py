"""arXiv metadata (through the `arxiv` package) and PDFs, politely rate limited.

arXiv asks for at most one request every three seconds. One process-wide limiter spaces every
request (API pages, retries and PDF downloads alike) by `delay_seconds`, counted from the end
of the previous request; the `arxiv` client's own delay is set to zero so the wait is not paid
twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import arxiv
import requests

from memory.ingest.chunking import clean_text
from memory.ingest.errors import IngestError
from memory.stores.knowledge_base import Paper, base_arxiv_id, is_arxiv_id

DEFAULT_API_URL = "https://export.arxiv.org/api/query"
MAX_PDF_BYTES = 100 * 1024 * 1024
USER_AGENT = "ArxivScout/0.1 (+https://github.com/arxivscout)"
_ERROR_SUMMARY = re.compile(rb"<summary>(.*?)</summary>", re.S)


class RateLimiter:
    """Spaces requests by a delay measured from the end of the previous one (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0.0

    @contextlib.contextmanager
    def slot(self, delay: float) -> Iterator[None]:
        """Hold the only request slot; it frees `delay` seconds after the request ends."""
        with self._lock:
            wait = self._next - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            try:
                yield
            finally:
                self._next = time.monotonic() + delay


ARXIV_LIMITER = RateLimiter()


class _ThrottledSession(requests.Session):
    """The `arxiv` client's HTTP session: rate limited, with a timeout, 4xx turned into errors."""

    def __init__(self, limiter: RateLimiter, delay: float, timeout: float) -> None:
        super().__init__()
        self.limiter, self.delay, self.timeout = limiter, delay, timeout

    def request(self, method, url, *args, **kwargs):  # type: ignore[override]
        kwargs.setdefault("timeout", self.timeout)
        with self.limiter.slot(self.delay):
            response = super().request(method, url, *args, **kwargs)
        # arXiv reports a malformed id as an entry titled "Error" (with HTTP 400 or 200).
        if 400 <= response.status_code < 500 or b"arxiv.org/api/errors" in response.content:
            found = _ERROR_SUMMARY.search(response.content)
            detail = found.group(1).decode("utf-8", "replace").strip() if found else ""
            raise IngestError(
                f"arXiv rejected the request (HTTP {response.status_code})"
                + (f": {detail}" if detail else "")
            )
        return response


@dataclass
class Candidate:
    """A search hit, as the agent's candidate list shows it."""

    arxiv_id: str
    title: str
    authors: list[str] = field(default_factory=list)
    published: str = ""
    summary: str = ""
    pdf_url: str = ""
    url: str = ""
    categories: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ArxivHit:
    """A looked-up paper and the PDF link arXiv gave for it."""

    paper: Paper
    pdf_url: str


def _one_line(text: str) -> str:
    return " ".join(clean_text(text or "").split())


def result_to_paper(result: arxiv.Result) -> Paper:
    """An `arxiv.Result` as a knowledge-base Paper (base id, ISO date, abs link as given)."""
    alternate = next((link.href for link in result.links if link.rel == "alternate"), "")
    return Paper(
        arxiv_id=base_arxiv_id(result.get_short_id()),
        title=_one_line(result.title),
        authors=[_one_line(a.name) for a in result.authors],
        published=result.published.date().isoformat() if result.published else "",
        categories=list(result.categories),
        abstract=_one_line(result.summary),
        url=alternate or result.entry_id,
        source="arxiv",
    )


def check_arxiv_id(arxiv_id: str) -> str:
    """The id stripped, or IngestError before any request if it is not an arXiv id."""
    cleaned = (arxiv_id or "").strip()
    if not is_arxiv_id(cleaned):
        raise IngestError(
            f"{cleaned[:60]!r} is not a valid arXiv id "
            "(expected e.g. 2310.08560, 2310.08560v2 or hep-th/9901001)."
        )
    return cleaned


class ArxivSource:
    """Metadata lookups, searches and PDF downloads against one arXiv API endpoint."""

    def __init__(
        self,
        api_url: str = DEFAULT_API_URL,
        delay_seconds: float = 3.0,
        limiter: RateLimiter | None = None,
        timeout: float = 60.0,
        num_retries: int = 2,
    ) -> None:
        self.api_url = api_url.rstrip("?")
        self.delay_seconds = delay_seconds
        self.limiter = limiter or ARXIV_LIMITER
        self.timeout = timeout
        self.client = arxiv.Client(page_size=100, delay_seconds=0.0, num_retries=num_retries)
        self.client.query_url_format = self.api_url + "?{}"  # instance attribute: no global change
        self.client._session = _ThrottledSession(self.limiter, delay_seconds, timeout)

    # -- blocking calls (run in a worker thread by the async wrappers) -------------------------

    def _results(self, search: arxiv.Search) -> list[arxiv.Result]:
        try:
            return list(self.client.results(search))
        except arxiv.HTTPError as exc:
            raise IngestError(f"arXiv answered HTTP {exc.status} for {exc.url}") from exc
        except (arxiv.ArxivError, requests.RequestException) as exc:
            raise IngestError(f"Could not query arXiv at {self.api_url}: {exc}") from exc

    def lookup_sync(self, arxiv_ids: list[str]) -> dict[str, ArxivHit | IngestError]:
        """Metadata of many ids in one id_list request; each id maps to a hit or its error."""
        out: dict[str, ArxivHit | IngestError] = {}
        wanted: list[str] = []
        for raw in arxiv_ids:
            try:
                wanted.append(check_arxiv_id(raw))
            except IngestError as exc:
                out[raw] = exc
        if not wanted:
            return out
        found: dict[str, arxiv.Result] = {}
        for start in range(0, len(wanted), 100):
            batch = wanted[start : start + 100]
            search = arxiv.Search(id_list=batch, max_results=len(batch))
            try:
                results = self._results(search)
            except IngestError as exc:  # the whole request failed: so did each of its ids
                out.update(dict.fromkeys(batch, exc))
                continue
            for result in results:
                found.setdefault(base_arxiv_id(result.get_short_id()), result)
        for arxiv_id in wanted:
            if arxiv_id in out:
                continue
            result = found.get(base_arxiv_id(arxiv_id))
            if result is None:
                out[arxiv_id] = IngestError(f"arXiv has no paper with id {arxiv_id}.")
            else:
                pdf_url = result.pdf_url or f"https://arxiv.org/pdf/{result.get_short_id()}"
                out[arxiv_id] = ArxivHit(result_to_paper(result), pdf_url)
        return out

    def search_sync(self, query: str, max_results: int = 10) -> list[Candidate]:
        if not query or not query.strip():
            raise IngestError("The arXiv search query is empty.")
        search = arxiv.Search(query=query.strip(), max_results=max_results)
        candidates = []
        for result in self._results(search):
            paper = result_to_paper(result)
            candidates.append(
                Candidate(
                    arxiv_id=paper.arxiv_id,
                    title=paper.title,
                    authors=paper.authors,
                    published=paper.published,
                    summary=paper.abstract,
                    pdf_url=result.pdf_url or "",
                    url=paper.url,
                    categories=paper.categories,
                )
            )
        return candidates

    def download_sync(self, url: str) -> bytes:
        """A PDF's bytes; IngestError for HTTP errors, oversize or non-PDF answers."""
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        try:
            with (
                self.limiter.slot(self.delay_seconds),
                urllib.request.urlopen(request, timeout=self.timeout) as response,
            ):
                data = response.read(MAX_PDF_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise IngestError(f"Downloading {url} failed: HTTP {exc.code}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise IngestError(f"Downloading {url} failed: {exc}") from exc
        if len(data) > MAX_PDF_BYTES:
            raise IngestError(f"{url}: the PDF is larger than {MAX_PDF_BYTES // 2**20} MB")
        if not data.lstrip()[:5].startswith(b"%PDF"):
            raise IngestError(f"{url}: arXiv did not return a PDF")
        return data

    # -- async API --------------------------------------------------------------------------

    async def lookup(self, arxiv_ids: list[str]) -> dict[str, ArxivHit | IngestError]:
        return await asyncio.to_thread(self.lookup_sync, arxiv_ids)

    async def paper(self, arxiv_id: str) -> ArxivHit:
        """One paper's metadata, or IngestError (invalid id checked before any request)."""
        check_arxiv_id(arxiv_id)
        found = (await self.lookup([arxiv_id]))[arxiv_id.strip()]
        if isinstance(found, IngestError):
            raise found
        return found

    async def search_candidates(self, query: str, max_results: int = 10) -> list[Candidate]:
        return await asyncio.to_thread(self.search_sync, query, max_results)

    async def download_pdf(self, url: str) -> bytes:
        return await asyncio.to_thread(self.download_sync, url)
