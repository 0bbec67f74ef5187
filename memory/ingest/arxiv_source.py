"""arXiv metadata (through the `arxiv` package) and PDFs, politely rate limited.

arXiv asks for at most one request every three seconds. One process-wide limiter spaces every
request (API pages, retries and PDF downloads alike) by `delay_seconds`, counted from the end
of the previous request; the `arxiv` client's own delay is set to zero so the wait is not paid
twice. An optional async `pace` hook (memory/ingest/arxiv_pace.py: a slot shared in Redis)
is awaited before each request too (inside the local slot, so a Redis slot is never taken and
left to lapse while this process's own turn is still to come) and, if it has `release`, told
when the request ended, so processes keep arXiv's pace together, counted from the end too. A
429 or 503 is retried by the `arxiv` client after the Retry-After arXiv gives, if that is short
(up to `MAX_RETRY_AFTER` seconds); a 429 that stays ends in `RATE_LIMITED`. A longer
Retry-After fails at once, and blocks arXiv for as long: in this process (`RateLimiter`) and,
through the `pace` hook's `block`, in every process; a request asked meanwhile fails fast,
without going out, saying how long arXiv asked to wait. A 200 that is no Atom feed (an HTML
page, an empty body), which the client would read as "no papers", is tried again as the
client tries a failed request (`num_retries`); one still unreadable then fails as `UNREADABLE`.

The blocking calls run on this module's own few threads (`ARXIV_THREADS`), not the default
executor: a call waiting its turn (a digest's pages, 3 s each) holds one of them, while the
default executor's threads stay free for what every turn needs (question embeddings, PDF reads).
The limiter's lock is a thread lock, so the spacing holds across event loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import email.utils
import functools
import http.client
import math
import re
import threading
import time
import unicodedata
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

import arxiv
import requests

from memory.ingest.clean import clean_extracted_text
from memory.ingest.errors import IngestError
from memory.stores.knowledge_base import Paper, base_arxiv_id, is_arxiv_id

DEFAULT_API_URL = "https://export.arxiv.org/api/query"
MAX_PDF_BYTES = 100 * 1024 * 1024
USER_AGENT = "ArxivScout/0.1 (+https://github.com/arxivscout)"
_ERROR_SUMMARY = re.compile(rb"<summary>(.*?)</summary>", re.S)
RETRIED_STATUSES = (429, 503)  # arXiv busy: the `arxiv` client tries again
MAX_RETRY_AFTER = 5.0  # seconds a request may wait for a Retry-After; longer is a failure now
RATE_LIMITED = "arXiv is rate limiting requests; try again in a minute."
UNREADABLE = "arXiv sent an unreadable answer; try again in a minute."
# in an entry's free-text comment: words of a withdrawal or retraction (of some version)
_WITHDRAWAL_WORDS = re.compile(r"\b(?:withdr[ae]w(?:n|s|al|ing)?|retract(?:s|ed|ion|ing)?)\b", re.I)


def blocked_message(status: int, seconds: float) -> str:
    """What a user is told while arXiv's pause (`seconds` left) lasts."""
    minutes = max(1, math.ceil(seconds / 60))
    wait = f"try again in about {minutes} minute{'s' if minutes > 1 else ''}."
    if status == 429:
        return f"arXiv is rate limiting requests; {wait}"
    return f"arXiv is unavailable (HTTP {status}); {wait}"


class RateLimiter:
    """Spaces requests by a delay measured from the end of the previous one (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0.0
        self._back_off = 0.0
        self._blocked_until, self._blocked_status = 0.0, 429

    @contextlib.contextmanager
    def slot(self, delay: float) -> Iterator[None]:
        """Hold the only request slot; it frees `delay` seconds after the request ends (or
        later, as `back_off` asks). IngestError at once while arXiv's long pause (`block`) lasts."""
        with self._lock:
            blocked = self._blocked_until - time.monotonic()
            if blocked > 0:
                raise IngestError(blocked_message(self._blocked_status, blocked))
            wait = self._next - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            self._back_off = 0.0
            try:
                yield
            finally:
                self._next = time.monotonic() + max(delay, self._back_off)

    def back_off(self, seconds: float) -> None:
        """Called inside `slot`: arXiv asked for a pause (Retry-After); no request of this
        process goes before it is over."""
        self._back_off = max(self._back_off, seconds)

    def block(self, seconds: float, status: int) -> None:
        """arXiv asked for a pause too long to wait in a request: until it is over, every
        request of this process fails at once (with its `status`'s message)."""
        self._blocked_until = time.monotonic() + seconds
        self._blocked_status = status


def retry_after(headers: Any) -> float:
    """Seconds a 429/503 asks to wait: Retry-After in seconds or as an HTTP date (none said:
    0, the usual spacing only)."""
    value = (headers.get("Retry-After") or "").strip()
    if not value:
        return 0.0
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return 0.0
    return max(0.0, when.timestamp() - time.time())


ARXIV_LIMITER = RateLimiter()
# Where arXiv calls wait their turn. More calls than threads queue here, holding no thread.
ARXIV_THREADS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="arxiv")


class _ThrottledSession(requests.Session):
    """The `arxiv` client's HTTP session: rate limited, with a timeout, 4xx turned into errors
    but for 429 (left, as a 503, to the client's retries after the Retry-After pause)."""

    def __init__(
        self, limiter: RateLimiter, delay: float, timeout: float,
        paced: Callable[[], contextlib.AbstractContextManager[None]] | None = None,
        on_busy: Callable[[int, float], None] | None = None,
    ) -> None:  # fmt: skip
        super().__init__()
        self.limiter, self.delay, self.timeout = limiter, delay, timeout
        self.paced = paced or contextlib.nullcontext  # the shared slot, held while a request runs
        self.on_busy = on_busy  # (status, Retry-After seconds): raises when too long to wait

    def request(self, method, url, *args, **kwargs):  # type: ignore[override]
        kwargs.setdefault("timeout", self.timeout)
        # the shared slot held until the answer is read, and a pause arXiv asks recorded
        with self.limiter.slot(self.delay), self.paced():
            response = super().request(method, url, *args, **kwargs)
            if response.status_code in RETRIED_STATUSES:
                if self.on_busy is not None:
                    self.on_busy(response.status_code, retry_after(response.headers))
                return response  # the client raises arxiv.HTTPError and tries again
        # arXiv reports a malformed id as an entry titled "Error" (with HTTP 400 or 200).
        if 400 <= response.status_code < 500 or b"arxiv.org/api/errors" in response.content:
            found = _ERROR_SUMMARY.search(response.content)
            detail = found.group(1).decode("utf-8", "replace").strip() if found else ""
            raise IngestError(
                f"arXiv rejected the request (HTTP {response.status_code})"
                + (f": {detail}" if detail else "")
            )
        if response.status_code == 200 and not _is_feed(response.content):
            # the `arxiv` client would only log "Malformed feed" and find no paper at all
            raise _Unreadable(url)
        return response


class _Unreadable(requests.ConnectionError):
    """A 200 that is no Atom feed (a passing arXiv glitch, as a blank page): a ConnectionError
    so that the `arxiv` client tries the page again, as it does a failed connection (of
    request errors, the only one it retries); `ArxivSource._results` says it as `UNREADABLE`
    once the retries are spent."""


def _is_feed(body: bytes) -> bool:
    """Whether an API answer is an Atom feed with its result count (not an HTML page, an
    empty body or a feed cut off before it)."""
    return b"<feed" in body and b"<opensearch:totalResults" in body


def _cut_off(url: str) -> str:
    return f"The download of {url} was cut off; try again in a minute."


def _busy_message(status: int) -> str:
    if status == 429:
        return RATE_LIMITED
    return "arXiv is unavailable (HTTP 503); try again in a few minutes."


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
    version: str = ""  # the version arXiv answered with, e.g. "v2"
    comment: str = ""  # the entry's comment, e.g. "This paper has been withdrawn by the author"

    @property
    def comment_speaks_of_withdrawal(self) -> bool:
        """Whether the entry's comment has a word of withdrawal or retraction. A hint only: the
        comment is the author's free text, may speak of another version, and is often silent."""
        return bool(_WITHDRAWAL_WORDS.search(self.comment))

    def no_pdf_reason(self) -> str:
        """What to say when arXiv has no PDF of this version (HTTP 404): past v1, the version
        before it to ask for (arXiv keeps none of a withdrawn version, which the comment may
        not say); a v1 is said withdrawn only if its comment speaks of it. "" otherwise: the
        download's own message stands."""
        base = self.paper.arxiv_id
        said = "its arXiv entry says it was withdrawn"
        number = int(self.version[1:]) if self.version[1:].isdigit() else 0
        if number > 1:
            why = said if self.comment_speaks_of_withdrawal else "a withdrawn version has none"
            return (
                f"arXiv has no PDF of {base}{self.version} ({why}); "
                f"ask me to save {base}v{number - 1}."
            )
        if self.comment_speaks_of_withdrawal:
            return f"arXiv has no PDF of {base}{self.version}; {said}."
        return ""


def _one_line(text: str) -> str:
    return " ".join(clean_extracted_text(text or "").split())


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


_QUERY_WORD = re.compile(r"[A-Za-z0-9]+")
_FIELD_VALUE = re.compile(r"[^\w.\- ]")


def _stamp(seconds: float) -> str:
    return time.strftime("%Y%m%d%H%M", time.gmtime(seconds))


# letters NFKD does not take apart into an ASCII letter and accents
_UNDECOMPOSED = str.maketrans({
    "ø": "o", "Ø": "O", "ł": "l", "Ł": "L", "ß": "ss", "æ": "ae", "Æ": "AE", "œ": "oe",
    "Œ": "OE", "đ": "d", "Đ": "D", "þ": "th", "Þ": "TH", "ı": "i", "ð": "d", "Ð": "D",
    "ħ": "h", "Ħ": "H", "ŋ": "ng", "Ŋ": "NG",
})  # fmt: skip
_NON_ASCII = re.compile(r"[^\x00-\x7f]")
_POSSESSIVE = re.compile(r"(?<=\w)['’]s\b")  # "Schrödinger’s": no stray word "s"


def query_words(query: str | None) -> list[str]:
    """The words arXiv is asked for (`all:`), folded to ASCII first (a few letters by a table,
    then NFKD with its accents dropped): "Schrödinger bridges" asks for Schrodinger and
    bridges, not "Schr" and "dinger", and "Bjørn" for Bjorn. Anything else not ASCII (a
    Chinese word) ends a word rather than joining its neighbours into one that is none. A
    possessive's "'s" is dropped first: "Schrödinger’s equation" asks for no word "s"."""
    bare = _POSSESSIVE.sub("", query or "")
    folded = unicodedata.normalize("NFKD", bare.translate(_UNDECOMPOSED))
    folded = _NON_ASCII.sub(" ", "".join(c for c in folded if not unicodedata.combining(c)))
    return _QUERY_WORD.findall(folded)


def _field_values(values: list[str] | None) -> list[str]:
    return [v for v in (_FIELD_VALUE.sub("", v).strip() for v in values or []) if v]


def searchable(query: str, categories: list[str] | None, authors: list[str] | None) -> bool:
    """Whether `submitted_query` asks arXiv for more than a date range: a topic with no word
    it can search (all Chinese, all punctuation) and no category nor author would ask for
    every paper submitted in the period."""
    return bool(query_words(query) or _field_values(categories) or _field_values(authors))


def submitted_query(
    query: str, since: float, until: float, categories: list[str] | None = None,
    authors: list[str] | None = None,
) -> str:  # fmt: skip
    """arXiv's search_query for a topic's papers submitted in [since, until]: every word of the
    topic (`all:`), any of the categories (`cat:`), any of the authors (`au:`), and the
    `submittedDate` range (GMT, to the minute)."""
    parts = [" AND ".join(f"all:{w}" for w in query_words(query))]
    cats, names = _field_values(categories), _field_values(authors)
    parts.append(" OR ".join(f"cat:{c}" for c in cats))
    parts.append(" OR ".join(f'au:"{a}"' if " " in a else f"au:{a}" for a in names))
    parts.append(f"submittedDate:[{_stamp(since)} TO {_stamp(until)}]")
    return " AND ".join(f"({p})" for p in parts if p)


def _candidate(result: arxiv.Result) -> Candidate:
    paper = result_to_paper(result)
    return Candidate(
        arxiv_id=paper.arxiv_id, title=paper.title, authors=paper.authors,
        published=paper.published, summary=paper.abstract, pdf_url=result.pdf_url or "",
        url=paper.url, categories=paper.categories,
    )  # fmt: skip


class ArxivSource:
    """Metadata lookups, searches and PDF downloads against one arXiv API endpoint."""

    def __init__(
        self,
        api_url: str = DEFAULT_API_URL,
        delay_seconds: float = 3.0,
        limiter: RateLimiter | None = None,
        timeout: float = 60.0,
        num_retries: int = 2,
        pace: Callable[[], Awaitable[None]] | None = None,
        executor: ThreadPoolExecutor | None = None,
    ) -> None:
        self.api_url = api_url.rstrip("?")
        self.pace = pace  # awaited (on the caller's loop) before each request, if given
        self.executor = executor or ARXIV_THREADS
        self._caller = threading.local()  # in a worker thread: the loop of the call it runs
        self.delay_seconds = delay_seconds
        self.limiter = limiter or ARXIV_LIMITER
        self.timeout = timeout
        self.client = arxiv.Client(page_size=100, delay_seconds=0.0, num_retries=num_retries)
        self.client.query_url_format = self.api_url + "?{}"  # instance attribute: no global change
        self.client._session = _ThrottledSession(
            self.limiter, delay_seconds, timeout, self._paced, self._busy
        )

    @contextlib.contextmanager
    def _paced(self) -> Iterator[None]:
        """In a worker thread, around one request: the `pace` hook's slot, waited for on the
        loop that asked and held until the request ended (a hook with `take` and `release`,
        as SharedPace; a bare one is only awaited before). If it fails, Redis away, this
        process's own spacing still holds; but for its IngestError: arXiv blocked, said by
        another process."""
        loop = getattr(self._caller, "loop", None)
        if self.pace is None or loop is None:
            yield
            return
        take, release = getattr(self.pace, "take", None), getattr(self.pace, "release", None)
        token = uuid.uuid4().hex  # made here: a take given up on is released all the same
        taking = take(token) if take else self.pace()
        waiting = None
        try:
            waiting = asyncio.run_coroutine_threadsafe(taking, loop)
            held = waiting.result(self.timeout + getattr(self.pace, "hold_seconds", 0.0))
        except IngestError:
            raise
        except Exception:  # timed out, Redis away, the loop closed: this process's spacing only
            if waiting is None:
                taking.close()  # never scheduled (the loop closed): nothing was taken
            else:
                waiting.cancel()
                if release is not None:  # the cancel may come after the SET: let the slot go
                    with contextlib.suppress(Exception):
                        asyncio.run_coroutine_threadsafe(release(token), loop)
            held, release = None, None
        try:
            yield
        finally:
            if release is not None:
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(release(held), loop).result(self.timeout)

    def _busy(self, status: int, pause: float) -> None:
        """Inside the local slot: arXiv answered `status` asking a `pause` (Retry-After). Every
        process is told through the `pace` hook's `block`, if it has one; a pause too long to
        wait blocks this process too and fails now."""
        block = getattr(self.pace, "block", None)
        loop = getattr(self._caller, "loop", None)
        if block is not None and loop is not None and pause > 0:
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(block(status, pause), loop).result(self.timeout)
        if pause > MAX_RETRY_AFTER:
            self.limiter.block(pause, status)
            raise IngestError(blocked_message(status, pause))
        self.limiter.back_off(pause)

    async def _in_thread(self, fn, *args):
        """`fn(*args)` on `executor` (as `asyncio.to_thread` would, context variables too)."""
        loop = asyncio.get_running_loop()
        call = functools.partial(contextvars.copy_context().run, self._for, loop, fn, *args)
        return await loop.run_in_executor(self.executor, call)

    def _for(self, loop: asyncio.AbstractEventLoop, fn, *args):
        """Run `fn` in this worker thread on behalf of `loop` (whose `pace` it awaits)."""
        self._caller.loop = loop
        try:
            return fn(*args)
        finally:
            self._caller.loop = None

    # -- blocking calls (run in a worker thread by the async wrappers) -------------------------

    def _results(self, search: arxiv.Search) -> list[arxiv.Result]:
        try:
            return list(self.client.results(search))
        except arxiv.HTTPError as exc:
            if exc.status in RETRIED_STATUSES:
                raise IngestError(_busy_message(exc.status)) from exc
            raise IngestError(f"arXiv answered HTTP {exc.status} for {exc.url}") from exc
        except _Unreadable as exc:  # still, after the client's retries
            raise IngestError(UNREADABLE) from exc
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
                short_id = result.get_short_id()
                pdf_url = result.pdf_url or f"https://arxiv.org/pdf/{short_id}"
                version = short_id[len(base_arxiv_id(short_id)) :]
                paper = result_to_paper(result)
                out[arxiv_id] = ArxivHit(paper, pdf_url, version, result.comment or "")
        return out

    def search_sync(self, query: str, max_results: int = 10) -> list[Candidate]:
        if not query or not query.strip():
            raise IngestError("The arXiv search query is empty.")
        search = arxiv.Search(query=query.strip(), max_results=max_results)
        return [_candidate(result) for result in self._results(search)]

    def submitted_sync(
        self, query: str, since: float, until: float, categories: list[str] | None = None,
        authors: list[str] | None = None, max_results: int = 500,
    ) -> list[Candidate]:  # fmt: skip
        """Papers submitted between `since` and `until` (Unix seconds) matching the topic, the
        categories and the authors, newest first, paged 100 at a time up to `max_results`
        (each page waits its turn under the rate limit)."""
        search = arxiv.Search(
            query=submitted_query(query, since, until, categories, authors),
            max_results=max_results,
            sort_by=arxiv.SortCriterion.SubmittedDate,
            sort_order=arxiv.SortOrder.Descending,
        )
        return [_candidate(result) for result in self._results(search)]

    def download_sync(self, url: str, not_found: str = "") -> bytes:
        """A PDF's bytes; IngestError for HTTP errors, oversize, cut off or non-PDF answers.
        `not_found`: what to say for a 404 instead of the bare status, when the caller knows
        why there is no PDF (`ArxivHit.no_pdf_reason`)."""
        request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
        try:
            # the shared slot, taken once this process's turn has come, and released once a
            # pause arXiv asks is recorded
            with self.limiter.slot(self.delay_seconds), self._paced():
                try:
                    with urllib.request.urlopen(request, timeout=self.timeout) as response:
                        data = response.read(MAX_PDF_BYTES + 1)
                        cut_off = len(data) <= MAX_PDF_BYTES and bool(response.length)
                except urllib.error.HTTPError as exc:
                    if exc.code in RETRIED_STATUSES:
                        self._busy(exc.code, retry_after(exc.headers))  # raises when long
                    raise
        except urllib.error.HTTPError as exc:
            if exc.code in RETRIED_STATUSES:
                raise IngestError(_busy_message(exc.code)) from exc
            if exc.code == 404 and not_found:
                raise IngestError(not_found) from exc
            raise IngestError(f"Downloading {url} failed: HTTP {exc.code}") from exc
        except http.client.IncompleteRead as exc:  # a chunked body that stopped early
            raise IngestError(_cut_off(url)) from exc
        except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            raise IngestError(f"Downloading {url} failed: {exc}") from exc
        if cut_off:  # fewer bytes than Content-Length said: the connection ended early
            raise IngestError(_cut_off(url))
        if len(data) > MAX_PDF_BYTES:
            raise IngestError(f"{url}: the PDF is larger than {MAX_PDF_BYTES // 2**20} MB")
        if not data.lstrip()[:5].startswith(b"%PDF"):
            raise IngestError(f"{url}: arXiv did not return a PDF")
        return data

    # -- async API --------------------------------------------------------------------------

    async def lookup(self, arxiv_ids: list[str]) -> dict[str, ArxivHit | IngestError]:
        return await self._in_thread(self.lookup_sync, arxiv_ids)

    async def paper(self, arxiv_id: str) -> ArxivHit:
        """One paper's metadata, or IngestError (invalid id checked before any request)."""
        check_arxiv_id(arxiv_id)
        found = (await self.lookup([arxiv_id]))[arxiv_id.strip()]
        if isinstance(found, IngestError):
            raise found
        return found

    async def search_candidates(self, query: str, max_results: int = 10) -> list[Candidate]:
        return await self._in_thread(self.search_sync, query, max_results)

    async def submitted(
        self, query: str, since: float, until: float, categories: list[str] | None = None,
        authors: list[str] | None = None, max_results: int = 500,
    ) -> list[Candidate]:  # fmt: skip
        return await self._in_thread(
            self.submitted_sync, query, since, until, categories, authors, max_results
        )

    async def download_pdf(self, url: str, not_found: str = "") -> bytes:
        return await self._in_thread(self.download_sync, url, not_found)
