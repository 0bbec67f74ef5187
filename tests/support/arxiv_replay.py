"""A local stand-in for arXiv: replays the recorded Atom fixtures and serves test PDFs.

The recorded responses live in `../shared/fixtures/arxiv-api/` (read in place, never copied).
Tests add their own responses (e.g. MemGPT, built by `atom_feed`) and PDFs. Every request is
logged with its arrival time, so tests can check rate limiting and that nothing was fetched.
"""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit
from xml.sax.saxutils import escape

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared"
FIXTURES = SHARED / "fixtures" / "arxiv-api"
_ENTRY = re.compile(r"  <entry>.*?</entry>\n", re.S)

MEMGPT_ID = "2310.08560"
MEMGPT_TITLE = "MemGPT: Towards LLMs as Operating Systems"
MEMGPT_AUTHORS = [
    "Charles Packer", "Sarah Wooders", "Kevin Lin", "Vivian Fang",
    "Shishir G. Patil", "Ion Stoica", "Joseph E. Gonzalez",
]  # fmt: skip
MEMGPT_ABSTRACT = (
    "Large language models (LLMs) have revolutionized AI, but are constrained by limited "
    "context windows, hindering their utility in tasks like extended conversations and "
    "document analysis. To enable using context beyond limited context windows, we propose "
    "virtual context management, a technique drawing inspiration from hierarchical memory "
    "systems in traditional operating systems. We introduce MemGPT (Memory-GPT), a system "
    "that intelligently manages different memory tiers in order to effectively provide "
    "extended context within the LLM's limited context window."
)


_RANGE = re.compile(r"submittedDate:\[(\d{12}) TO (\d{12})\]")
_CATS = re.compile(r"cat:([\w.\-]+)")
_AUTHORS = re.compile(r'au:("[^"]+"|[\w.\-]+)')


def _minute(iso: str) -> str:
    """2026-01-05T10:30:00Z -> 202601051030, as submittedDate ranges are written."""
    return re.sub(r"\D", "", iso)[:12]


@dataclass
class AtomEntry:
    arxiv_id: str  # without version
    title: str
    summary: str
    authors: list[str]
    published: str  # ISO timestamp, e.g. 2023-10-12T17:51:32Z
    categories: list[str] = field(default_factory=lambda: ["cs.AI"])
    version: int = 1
    comment: str = ""

    def xml(self) -> str:
        vid = f"{self.arxiv_id}v{self.version}"
        cats = "".join(
            f'    <category term="{c}" scheme="http://arxiv.org/schemas/atom"/>\n'
            for c in self.categories
        )
        authors = "".join(
            f"    <author>\n      <name>{escape(a)}</name>\n    </author>\n" for a in self.authors
        )
        comment = (
            f"    <arxiv:comment>{escape(self.comment)}</arxiv:comment>\n" if self.comment else ""
        )
        return (
            "  <entry>\n"
            f"    <id>http://arxiv.org/abs/{vid}</id>\n"
            f"    <title>{escape(self.title)}</title>\n"
            f"    <updated>{self.published}</updated>\n"
            f'    <link href="https://arxiv.org/abs/{vid}" rel="alternate" type="text/html"/>\n'
            f'    <link href="https://arxiv.org/pdf/{vid}" rel="related" type="application/pdf"'
            ' title="pdf"/>\n'
            f"    <summary>{escape(self.summary)}</summary>\n"
            f"{cats}"
            f"    <published>{self.published}</published>\n"
            f"{comment}"
            f'    <arxiv:primary_category term="{self.categories[0]}"/>\n'
            f"{authors}"
            "  </entry>\n"
        )


def atom_feed(entries: list[AtomEntry], search_query: str = "", id_list: str = "") -> str:
    """A feed in the exact layout of the recorded arXiv responses."""
    args = f"search_query={search_query}&amp;id_list={id_list}&amp;start=0&amp;max_results=100"
    return (
        "<?xml version='1.0' encoding='UTF-8'?>\n"
        '<feed xmlns:opensearch="http://a9.com/-/spec/opensearch/1.1/" '
        'xmlns:arxiv="http://arxiv.org/schemas/atom" xmlns="http://www.w3.org/2005/Atom">\n'
        "  <id>https://arxiv.org/api/replay</id>\n"
        f"  <title>arXiv Query: {escape(args, {'&amp;': '&amp;'})}</title>\n"
        "  <updated>2026-04-12T22:10:19Z</updated>\n"
        f'  <link href="https://arxiv.org/api/query?{args}" type="application/atom+xml"/>\n'
        "  <opensearch:itemsPerPage>100</opensearch:itemsPerPage>\n"
        f"  <opensearch:totalResults>{len(entries)}</opensearch:totalResults>\n"
        "  <opensearch:startIndex>0</opensearch:startIndex>\n"
        + "".join(e.xml() for e in entries)
        + "</feed>\n"
    )


def memgpt_entry() -> AtomEntry:
    return AtomEntry(
        arxiv_id=MEMGPT_ID,
        title=MEMGPT_TITLE,
        summary=MEMGPT_ABSTRACT,
        authors=MEMGPT_AUTHORS,
        published="2023-10-12T17:51:32Z",
        categories=["cs.AI"],
        version=2,
    )


def load_fixtures() -> dict[tuple[str, str], tuple[int, str]]:
    """(kind, key) -> (status, body), kind "id" (an id_list) or "q" (a search_query)."""
    table: dict[tuple[str, str], tuple[int, str]] = {}
    for path in sorted(FIXTURES.glob("*.json")):
        data = json.loads(path.read_text())
        query = parse_qs(urlsplit(data["url"]).query, keep_blank_values=True)
        ids, search = query.get("id_list", [""])[0], query.get("search_query", [""])[0]
        key = ("id", ids) if ids else ("q", search)
        table[key] = (int(data["status_code"]), data["body"])
    return table


class ArxivReplay:
    """A threaded HTTP server on 127.0.0.1: /api/query replays feeds, /pdf/<id> serves PDFs."""

    def __init__(self) -> None:
        self.responses = load_fixtures()
        self.pdfs: dict[str, bytes] = {}
        self.feed: list[AtomEntry] = []  # new papers, for submittedDate range searches
        self.requests: list[tuple[float, str]] = []  # (time.monotonic() on arrival, path)
        self.down = False  # while set, API queries are answered 503 (arXiv unavailable)
        # the next requests' answers, one each, with no body: (status, Retry-After or ""),
        # e.g. (429, "1"); (200, "") is a blank page
        self.busy: list[tuple[int, str]] = []
        self.garbled = False  # while set, API queries are answered 200 with an HTML page
        # answers that take this long (seconds), by path prefix, e.g. {"/pdf/": 1.0}; `busy`
        # ones too
        self.slow: dict[str, float] = {}
        # PDFs whose download breaks off halfway, by key: "length" (fewer bytes than the
        # Content-Length said) or "chunked" (a chunked body that stops inside a chunk)
        self.cut_off: dict[str, str] = {}
        # (arrival, answered, path) of each request: `answered` taken before the body is
        # written, so a request sent once another's answer was read arrives after it
        self.spans: list[tuple[float, float, str]] = []
        self._lock = threading.Lock()
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with replay._lock:
                    replay.requests.append((time.monotonic(), self.path))
                    busy = replay.busy.pop(0) if replay.busy else None
                if busy is not None:
                    time.sleep(replay.slowness(self.path))
                    self.send_response(busy[0])
                    if busy[1]:
                        self.send_header("Retry-After", busy[1])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                arrived = time.monotonic()
                status, body, ctype = replay.answer(self.path)
                time.sleep(replay.slowness(self.path))
                with replay._lock:
                    replay.spans.append((arrived, time.monotonic(), self.path))
                cut = replay.cut_off.get(self.path.rsplit("/", 1)[-1])
                if cut is not None and status == 200:
                    replay.send_cut_off(self, body, cut)
                    return
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.api_url = f"{self.base}/api/query"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # -- setup ------------------------------------------------------------------------------

    def start(self) -> ArxivReplay:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def add_entry(self, entry: AtomEntry, search_query: str | None = None) -> None:
        """Answer id lookups of the entry (with and without version), and a search if given."""
        feed = atom_feed([entry], id_list=entry.arxiv_id)
        self.responses["id", entry.arxiv_id] = (200, feed)
        self.responses["id", f"{entry.arxiv_id}v{entry.version}"] = (200, feed)
        if search_query is not None:
            self.responses["q", search_query] = (200, atom_feed([entry], search_query))

    @staticmethod
    def send_cut_off(handler: BaseHTTPRequestHandler, body: bytes, how: str) -> None:
        """Half of `body`, then the connection closed (`cut_off`)."""
        handler.send_response(200)
        handler.send_header("Content-Type", "application/pdf")
        half = body[: len(body) // 2]
        if how == "chunked":
            handler.send_header("Transfer-Encoding", "chunked")
            handler.end_headers()
            handler.wfile.write(b"%x\r\n" % len(body) + half)  # a chunk said whole, sent half
        else:
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(half)
        handler.wfile.flush()
        handler.close_connection = True

    def add_response(self, kind: str, key: str, body: str, status: int = 200) -> None:
        self.responses[kind, key] = (status, body)

    def slowness(self, path: str) -> float:
        return next((t for prefix, t in self.slow.items() if path.startswith(prefix)), 0.0)

    def api_paths(self) -> list[str]:
        return [p for _, p in self.requests if p.startswith("/api/")]

    # -- answers ----------------------------------------------------------------------------

    def answer(self, path: str) -> tuple[int, bytes, str]:
        parts = urlsplit(path)
        if parts.path.startswith("/pdf/"):
            key = parts.path[len("/pdf/") :]
            pdf = self.pdfs.get(key) or self.pdfs.get(re.sub(r"v\d+$", "", key))
            if pdf is None:
                return 404, b"not found", "text/plain"
            return 200, pdf, "application/pdf"
        if self.down:
            return 503, b"Service Unavailable", "text/plain"
        if self.garbled:
            return 200, b"<html><body>Temporarily busy</body></html>", "text/html"
        query = parse_qs(parts.query, keep_blank_values=True)
        ids, search = query.get("id_list", [""])[0], query.get("search_query", [""])[0]
        if ids:
            status, body = self._ids(ids.split(","))
        elif self.feed and "submittedDate:[" in search:
            status, body = 200, self._new_papers(search, query)
        else:
            status, body = self.responses.get(("q", search), (200, atom_feed([], search)))
        body = body.replace("https://arxiv.org/pdf/", f"{self.base}/pdf/")
        return status, body.encode("utf-8"), "application/atom+xml; charset=utf-8"

    def add_feed(self, entries: list[AtomEntry]) -> None:
        """New papers: answer submittedDate range searches (and id lookups) from them."""
        self.feed += entries
        for entry in entries:
            self.add_entry(entry)

    def _new_papers(self, search: str, query: dict[str, list[str]]) -> str:
        """The feed's entries in the search's submittedDate range, of any of its `cat:` and
        `au:` values, newest first, one page (`start`, `max_results`) with the total, as arXiv
        pages. Topic words (`all:`) are not matched: every paper of the range comes back, so
        the digest's ranking is what puts the topic first."""
        low, high = _RANGE.search(search).groups()
        cats = _CATS.findall(search)
        names = [a.strip('"') for a in _AUTHORS.findall(search)]
        found = [
            e for e in self.feed
            if low <= _minute(e.published) <= high
            and (not cats or set(cats) & set(e.categories))
            and (not names or any(n in a for n in names for a in e.authors))
        ]  # fmt: skip
        found.sort(key=lambda e: e.published, reverse=True)
        start = int(query.get("start", ["0"])[0])
        size = int(query.get("max_results", ["100"])[0])
        body = atom_feed(found[start : start + size], search)
        total = f"<opensearch:totalResults>{len(found)}</opensearch:totalResults>"
        return re.sub(r"<opensearch:totalResults>\d+</opensearch:totalResults>", total, body)

    def _lookup(self, arxiv_id: str) -> tuple[int, str] | None:
        """The recorded answer for an id, else the one for its unversioned form."""
        found = self.responses.get(("id", arxiv_id))
        return found or self.responses.get(("id", re.sub(r"v\d+$", "", arxiv_id)))

    def _ids(self, ids: list[str]) -> tuple[int, str]:
        if len(ids) == 1:
            return self._lookup(ids[0]) or (200, atom_feed([], id_list=ids[0]))
        entries = []
        for arxiv_id in ids:  # a batch: the entries of each single-id answer, in one feed
            status, body = self._lookup(arxiv_id) or (200, "")
            if status != 200:
                return status, body
            entries += _ENTRY.findall(body)
        empty = atom_feed([], id_list=",".join(ids))
        total = f"<opensearch:totalResults>{len(entries)}</opensearch:totalResults>"
        body = re.sub(r"<opensearch:totalResults>0</opensearch:totalResults>", total, empty)
        return 200, body.replace("</feed>\n", "".join(entries) + "</feed>\n")
