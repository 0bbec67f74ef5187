"""Knowledge base memory: passages of papers, shared by a tenant, found by hybrid search.

Hybrid search runs a vector KNN query and a BM25 full-text query side by side (both with the
tenant and metadata filters) and fuses their rankings with reciprocal rank fusion: exact terms
(model names, acronyms) and paraphrases both find their passages. The text half matches terms
verbatim (no stemming expansion, a third faster at 100k chunks) and skips stopwords, which are
not indexed at all: word forms and paraphrases are what the vector half is for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import PurePath
from typing import Any

import numpy as np
from redis.commands.search.query import Query
from redisvl.query import FilterQuery
from redisvl.query.filter import FilterExpression, Num, Tag
from redisvl.utils.token_escaper import TokenEscaper

from memory.keys import KB_INDEX, KB_PREFIX, paper_save_key, papers_key
from memory.links import web_link
from memory.scope import PUBLIC, Scope
from memory.stores.base import Segment, VectorStore, decode, delete_keys
from memory.stores.stopwords import STOPWORDS

RRF_K = 60
SAVE_LOCK_MS = 60_000  # a paper's save lock lapses after this (its process died meanwhile)
SAVE_WAIT_SECONDS = 30.0  # how long a second save of a paper waits for the first one
HOLD_WAIT_SECONDS = SAVE_LOCK_MS / 1000 + 5  # `holding`: past any lock a dead process left
SAVE_POLL_SECONDS = 0.05
# Compare-and-delete: only the save that took the lock releases it.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_WORD = re.compile(r"\w+")  # RediSearch's own tokenizer splits at hyphens and punctuation
_ESCAPER = TokenEscaper()
_ARXIV_ID = re.compile(r"^(\d{4}\.\d{4,5}|[a-z\-]+(\.[A-Z]{2})?/\d{7})(v\d+)?$")


def base_arxiv_id(arxiv_id: str) -> str:
    """`2310.08560v2` -> `2310.08560`: a paper is one paper whatever its version."""
    return re.sub(r"v\d+$", "", arxiv_id.strip())


class PaperKept(Exception):
    """The stored paper stays (`add_paper`'s `keep` said why, under the save lock)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ReplaceFailed(Exception):
    """A save that replaces a stored paper failed once that paper was removed: none is stored
    now. `removed`: its record; the error is the cause."""

    def __init__(self, removed: dict[str, Any], error: Exception) -> None:
        super().__init__(str(error))
        self.removed = removed


class PaperBusy(Exception):
    """Another save of the paper held its lock for longer than a save waits."""


def is_arxiv_id(text: str) -> bool:
    return bool(_ARXIV_ID.match(text.strip()))


# How every paper id that is not arXiv's begins: a PDF shared in chat (`pdf-`,
# memory/ingest/shared_pdf.py), a PDF the operator ingests from a local file (`local-`,
# memory/ingest/pipeline.py). A walled place reads only arXiv's papers (`may_read`), and its
# search filter can only exclude prefixes (`KnowledgeBase.audience_filter`): a new kind of id
# must be added here, or a walled place finds its passages.
NOT_ARXIV_PREFIXES = ("pdf-", "local-")


def is_from_arxiv(paper_id: str) -> bool:
    """A real arXiv paper's id (a public text), none of the kinds we make ourselves."""
    return is_arxiv_id(paper_id) and not paper_id.startswith(NOT_ARXIV_PREFIXES)


def paper_label(paper_id: str, file_name: str = "") -> str:
    """How a paper is named beside its title: `arXiv:<id>`, else what kind of PDF it is (a
    PDF shared in chat, or one ingested from a file: neither has an arXiv id, nor link)."""
    if is_from_arxiv(paper_id):
        return f"arXiv:{paper_id}"
    kind = "shared PDF" if is_shared_pdf(paper_id) else "PDF file"
    return f"{kind} · {file_name}" if file_name else kind


def shares_of(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The shares that hold a PDF shared in chat (memory/ingest/shared_pdf.py), each
    {"thread", "sharer", "origin", "at", "link", "file_name"}: the one that read it, and each
    sharing it again in its place. A record no second share changed lists none: its own
    thread, sharer, origin, link (`url`) and file name, as one. Shares listed before they kept
    their link and file name: the first has the record's (they are its), the others none (the
    record's are another's, maybe a person erased since)."""
    first = {
        "thread": record.get("thread") or "", "sharer": record.get("sharer") or "",
        "origin": record.get("origin") or "", "at": float(record.get("ingested_at") or 0),
        "link": record.get("url") or "", "file_name": record.get("file_name") or "",
    }  # fmt: skip
    listed = record.get("shares")
    if isinstance(listed, list) and listed:
        unnamed = {**dict.fromkeys(first, ""), "at": first["at"]}
        shares = [share for share in listed if isinstance(share, dict)]
        return [
            {**(first if index == 0 else unnamed), **share} for index, share in enumerate(shares)
        ]
    return [first]


def with_shares(record: dict[str, Any], shares: list[dict[str, Any]]) -> dict[str, Any]:
    """The record held by these shares (one at least). What it says of its share (`thread`,
    `sharer`, `origin`, its link `url` and `file_name`, which the memory page, citations and
    records from before read) is the first's: a share that went leaves nothing of its own (a
    Slack permalink holds its sharer's id). A title made of the file's name (the PDF had none:
    shared_pdf.py `title_of`) is the first's file name's too. The chunks hold the link and
    title as well: `KnowledgeBase.put_shares` writes them."""
    first = shares[0]
    old_name, new_name = str(record.get("file_name") or ""), str(first.get("file_name") or "")
    title = record.get("title")
    if old_name and new_name != old_name and title in (PurePath(old_name).stem, old_name):
        title = PurePath(new_name).stem or new_name or "Untitled PDF"
    return {
        **record, "shares": shares, "thread": first.get("thread") or "",
        "sharer": first.get("sharer") or "", "origin": first.get("origin") or "",
        "url": first.get("link") or "", "file_name": new_name, "title": title,
    }  # fmt: skip


def may_read(scope: Scope, paper: dict[str, Any]) -> bool:
    """Whether `scope` may read a paper: as it may see its audience, and a walled place (a
    guest, another organisation: memory/scope.py) also the papers saved from arXiv, the team's
    shared library of public texts; not a PDF shared in chat or ingested from a local file."""
    audience = paper.get("audience") or PUBLIC
    if scope.can_see(audience):
        return True
    return scope.walled and audience == PUBLIC and is_from_arxiv(paper.get("arxiv_id", ""))


def is_shared_pdf(paper_id: str) -> bool:
    """A PDF shared in chat (memory/ingest/shared_pdf.py), known as `pdf-…`: no arXiv paper,
    so no arxiv.org link or `arXiv:` label is to be made of it."""
    return paper_id.startswith("pdf-")


@dataclass
class Paper:
    """A paper's metadata as the knowledge base keeps it."""

    arxiv_id: str
    title: str
    authors: list[str] = field(default_factory=list)
    published: str = ""  # ISO date
    categories: list[str] = field(default_factory=list)
    abstract: str = ""
    url: str = ""
    source: str = ""  # "arxiv", "pdf", "unarxive"

    @property
    def year(self) -> int | None:
        return int(self.published[:4]) if self.published[:4].isdigit() else None

    @property
    def link(self) -> str:
        """Its address: the one given, else its arXiv abs page (none for a PDF of ours)."""
        if self.url or not is_from_arxiv(self.arxiv_id):
            return self.url
        return f"https://arxiv.org/abs/{self.arxiv_id}"


@dataclass
class Chunk:
    text: str
    section: str = ""
    index: int = 0
    page: int | None = None  # the PDF page where the chunk starts, where known


@dataclass
class Passage:
    """A knowledge-base hit."""

    arxiv_id: str
    title: str
    section: str
    chunk_index: int
    content: str
    url: str
    year: int | None
    score: float
    audience: str = PUBLIC  # where it may be shown (a PDF shared in a private place: there only)
    page: int | None = None  # the PDF page where the passage starts (None: not known)


# A paper's label as passages show it, and the ids a question names so (`search_naming`)
NAMED_LABEL = re.compile(r"\[(?:PDF|arXiv):([A-Za-z0-9._/\-]+)\]")
MAX_NAMED = 3  # papers a question's labels narrow a search to, at most


def _round_robin(rankings: list[list[Passage]]) -> list[Passage]:
    """The rankings' passages taken one from each in turn, each ranking's order kept."""
    merged: list[Passage] = []
    for row in range(max(map(len, rankings), default=0)):
        merged += [ranking[row] for ranking in rankings if row < len(ranking)]
    return merged


class KnowledgeBase(VectorStore):
    SCHEMA = {
        # The text fields are matched verbatim (see `text_query`), so no stems are indexed.
        "index": {
            "name": KB_INDEX,
            "prefix": KB_PREFIX,
            "stopwords": sorted(STOPWORDS),
        },
        "fields": [
            {"name": "arxiv_id", "type": "tag"},
            {"name": "title", "type": "text", "attrs": {"weight": 2.0, "no_stem": True}},
            {"name": "authors", "type": "tag", "attrs": {"separator": "|"}},
            {"name": "categories", "type": "tag", "attrs": {"separator": "|"}},
            {"name": "year", "type": "numeric"},
            {"name": "chunk_index", "type": "numeric"},
            {"name": "content", "type": "text", "attrs": {"no_stem": True}},
            {"name": "audience", "type": "tag"},
        ],
    }
    DEFAULTS = {"audience": PUBLIC}  # papers from before audiences were the whole team's
    RETURN_FIELDS = [
        "arxiv_id", "title", "section", "chunk_index", "content", "url", "year", "audience",
        "page",
    ]  # fmt: skip

    def embedding_text(self, record: dict[str, Any]) -> str:
        return record.get("content", "")

    def chunk_key(self, tenant: str, arxiv_id: str, index: int) -> str:
        return f"{self.key_prefix(tenant)}{arxiv_id}:{index}"

    # -- papers ------------------------------------------------------------------------------

    async def has_paper(self, scope: Scope, arxiv_id: str) -> bool:
        return await self.paper(scope, arxiv_id) is not None

    async def paper(self, scope: Scope, arxiv_id: str) -> dict[str, Any] | None:
        """The paper's record, if it exists and `scope` may see it."""
        raw = await self.redis.hget(papers_key(scope.tenant), base_arxiv_id(arxiv_id))
        record = json.loads(raw) if raw else None
        return record if record and may_read(scope, record) else None

    async def papers(self, scope: Scope, everywhere: bool = False) -> list[dict[str, Any]]:
        """Those `scope` may see, oldest first; `everywhere`: the whole tenant's (its operator)."""
        rows = await self.redis.hgetall(papers_key(scope.tenant))
        papers = [json.loads(v) for v in rows.values()]
        if not everywhere:
            papers = [p for p in papers if may_read(scope, p)]
        return sorted(papers, key=lambda p: p.get("ingested_at", 0))

    def audience_filter(self, scope: Scope) -> FilterExpression:
        """What `scope` may see (see `may_read`: a walled place also reads arXiv's papers, all
        public ones but those of `NOT_ARXIV_PREFIXES`)."""
        seen = super().audience_filter(scope)
        if not scope.walled:
            return seen
        ours = " ".join(f"-{Tag('arxiv_id') % (prefix + '*')}" for prefix in NOT_ARXIV_PREFIXES)
        return seen | FilterExpression(f"(@audience:{{{PUBLIC}}} {ours})")

    async def add_paper(
        self, scope: Scope, paper: Paper, chunks: list[Chunk], vectors: np.ndarray,
        audience: str = PUBLIC, keep: Callable[[dict[str, Any]], str | None] | None = None,
        **extra: Any,
    ) -> int:  # fmt: skip
        """Store a paper's chunks with their vectors; returns the number of chunks written.

        `audience`: who may find it (papers from arXiv are the whole team's; a PDF shared in a
        private channel or a DM is found only there). `extra` goes into the paper's record
        (e.g. a shared PDF's content hash). The paper record is written last, so a paper counts
        as present only once all of its chunks are searchable; a write that fails or is
        cancelled partway takes its chunks back (none is left that search finds but no record
        lists). A stored version is replaced: it goes first (chunks, then record), so a
        failure leaves no paper rather than a mix of two versions (`ReplaceFailed` says so).
        `keep`, asked about the stored record, may give a reason to keep it instead
        (`PaperKept`). All this runs under the paper's save lock, the stored record read
        under it: two saves of one paper never interleave.
        """
        if len(chunks) != len(vectors):
            raise ValueError("one vector per chunk is needed")
        arxiv_id = base_arxiv_id(paper.arxiv_id)
        async with self._saving(scope.tenant, arxiv_id):
            raw = await self.redis.hget(papers_key(scope.tenant), arxiv_id)
            stored = json.loads(raw) if raw else None
            if stored is not None and keep is not None and (reason := keep(stored)):
                raise PaperKept(reason)
            await self._remove(scope.tenant, arxiv_id)
            keys = [self.chunk_key(scope.tenant, arxiv_id, chunk.index) for chunk in chunks]
            try:
                await self._write_paper(
                    scope, paper, arxiv_id, chunks, keys, vectors, audience, extra
                )
            except BaseException as exc:
                await asyncio.shield(self._take_back(scope.tenant, arxiv_id, keys))
                if stored is not None and isinstance(exc, Exception):
                    raise ReplaceFailed(stored, exc) from exc
                raise
        return len(chunks)

    def holding(self, tenant: str, arxiv_id: str) -> contextlib.AbstractAsyncContextManager[None]:
        """The paper's save lock (`_saving`), to change its record (`put_record`) with no save or
        other change in between (a shared PDF's shares: memory/ingest/shared_pdf.py). Waited
        for until a lock left by a dead process lapses: an erasure must not stop half-way
        (PaperBusy) for a save that died a moment before."""
        return self._saving(tenant, base_arxiv_id(arxiv_id), HOLD_WAIT_SECONDS)

    async def put_record(self, tenant: str, record: dict[str, Any]) -> None:
        """Write a paper's record as changed (under `holding`, read under it)."""
        arxiv_id = base_arxiv_id(record["arxiv_id"])
        await self.redis.hset(papers_key(tenant), arxiv_id, json.dumps(record))

    async def put_shares(
        self, tenant: str, record: dict[str, Any], shares: list[dict[str, Any]]
    ) -> None:
        """A shared PDF's record held by these shares now (`with_shares`; under `holding`, read
        under it). When its first share changes, its chunks' link and title are the new first
        share's too: a passage cited, or shown, keeps nothing of a share that went. The chunks
        go first: a failure between leaves the record naming the share that went, and the
        erasure, done again, finds it and finishes."""
        changed = with_shares(record, shares)
        fields = {
            name: changed[name] for name in ("url", "title") if changed[name] != record.get(name)
        }
        if fields:
            arxiv_id = base_arxiv_id(record["arxiv_id"])
            keys = [
                self.chunk_key(tenant, arxiv_id, i) for i in range(int(record.get("chunks") or 0))
            ]
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in keys:
                    pipe.exists(key)
                present = [
                    key for key, there in zip(keys, await pipe.execute(), strict=True) if there
                ]
            async with self.redis.pipeline(transaction=False) as pipe:
                for key in present:
                    pipe.hset(key, mapping=fields)
                await pipe.execute()
        await self.put_record(tenant, changed)

    @contextlib.asynccontextmanager
    async def _saving(
        self, tenant: str, arxiv_id: str, wait_seconds: float = SAVE_WAIT_SECONDS
    ) -> AsyncIterator[None]:
        """The paper's save lock (owner token, released only by its owner); a second save
        waits for it up to `wait_seconds`. It lapses if its process dies."""
        key, token = paper_save_key(tenant, arxiv_id), uuid.uuid4().hex
        deadline = time.monotonic() + wait_seconds
        while not await self.redis.set(key, token, nx=True, px=SAVE_LOCK_MS):
            if time.monotonic() > deadline:
                raise PaperBusy(
                    f"{arxiv_id} is being saved by another request; try again in a minute."
                )
            await asyncio.sleep(SAVE_POLL_SECONDS)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):  # else it lapses
                await asyncio.shield(self.redis.eval(_RELEASE, 1, key, token))

    async def _remove(self, tenant: str, arxiv_id: str) -> None:
        """A stored paper's chunks (all that carry its id, listed in its record or not), then
        its record."""
        where = Tag("arxiv_id") == arxiv_id
        prefix = self.chunk_key(tenant, arxiv_id, 0)[:-1]  # `…<arxiv_id>:`, none other's
        while True:
            query = FilterQuery(
                filter_expression=where, return_fields=["arxiv_id"], num_results=1000
            )
            rows = [r["id"] for r in await self._run(tenant, query)]
            rows = [key for key in rows if key.startswith(prefix)]
            if not rows or not await delete_keys(self.redis, rows):
                break
        await self.redis.hdel(papers_key(tenant), arxiv_id)

    async def _take_back(self, tenant: str, arxiv_id: str, keys: list[str]) -> None:
        """Best effort, after a failed write (under the save lock): its chunks, unless the
        record made it (the write was complete)."""
        with contextlib.suppress(Exception):
            if not await self.redis.hexists(papers_key(tenant), arxiv_id):
                await delete_keys(self.redis, keys)

    async def _write_paper(
        self, scope: Scope, paper: Paper, arxiv_id: str, chunks: list[Chunk], keys: list[str],
        vectors: np.ndarray, audience: str, extra: dict[str, Any],
    ) -> None:  # fmt: skip
        common = {
            "tenant": scope.tenant,
            "arxiv_id": arxiv_id,
            "title": paper.title,
            "authors": "|".join(a.replace("|", " ") for a in paper.authors),
            "categories": "|".join(paper.categories),
            "year": paper.year,
            "url": paper.link,
            "audience": audience,
        }
        await self._write(
            scope.tenant,
            [
                (
                    key,
                    {
                        **common,
                        "section": chunk.section,
                        "chunk_index": chunk.index,
                        "content": chunk.text,
                        "page": chunk.page,  # None is not written
                    },
                    vector,
                )
                for key, chunk, vector in zip(keys, chunks, vectors, strict=True)
            ],
        )
        record = {
            **asdict(paper),
            "arxiv_id": arxiv_id,
            "chunks": len(chunks),
            "ingested_at": time.time(),
            "audience": audience,
            **extra,
        }
        await self.redis.hset(papers_key(scope.tenant), arxiv_id, json.dumps(record))

    async def chunk_count(self, scope: Scope, arxiv_id: str) -> int:
        record = await self.paper(scope, arxiv_id)
        return int(record["chunks"]) if record else 0

    # -- search ------------------------------------------------------------------------------

    @staticmethod
    def filters(
        arxiv_id: str | None = None,
        author: str | None = None,
        year: int | tuple[int, int] | None = None,
        category: str | None = None,
    ) -> FilterExpression | None:
        parts: list[FilterExpression] = []
        if arxiv_id:
            if not base_arxiv_id(arxiv_id):  # "v2": an empty tag filter would match every paper
                raise ValueError(f"{arxiv_id!r} is not a paper id")
            parts.append(Tag("arxiv_id") == base_arxiv_id(arxiv_id))
        if author:
            parts.append(Tag("authors") == author)
        if category:
            parts.append(Tag("categories") == category)
        if isinstance(year, tuple):
            parts.append((Num("year") >= year[0]) & (Num("year") <= year[1]))
        elif year:
            parts.append(Num("year") == year)
        combined = None
        for part in parts:
            combined = part if combined is None else combined & part
        return combined

    async def search(
        self,
        scope: Scope,
        query: str,
        vector: np.ndarray,
        k: int = 5,
        candidates: int = 10,
        everywhere: bool = False,
        **filters: Any,
    ) -> list[Passage]:
        """Hybrid search: vector and BM25 rankings fused by reciprocal rank, over what `scope`
        may see (`everywhere`: the whole tenant's, for an admin).

        Both rankings return ids only; the passages' text is read for the final k alone.
        `candidates` stays at 10: with a tenant filter, RediSearch answers larger KNN
        queries on a big index by scanning every vector (k=20 took 29 ms at 100k chunks).
        """
        narrowing = self.filters(**filters)
        extra = narrowing
        if not everywhere:
            seen = self.audience_filter(scope)
            extra = seen if extra is None else extra & seen
        vector_hits = self._nearest(scope.tenant, vector, candidates, [], extra)
        text_query = self.text_query(query, candidates, extra)
        if text_query is None:
            text_hits = None
        elif narrowing is None and not everywhere:  # only the audience stands in the way
            text_hits = self._text_admitted(scope, query, candidates, text_query)
        else:
            text_hits = self._run(scope.tenant, text_query)
        if text_hits is not None:
            text_rows, vector_rows = await asyncio.gather(text_hits, vector_hits)
        else:
            vector_rows, text_rows = await vector_hits, []
        scores: dict[str, float] = {}
        for ranking in (vector_rows, text_rows):
            for rank, row in enumerate(ranking):
                scores[row["id"]] = scores.get(row["id"], 0.0) + 1.0 / (RRF_K + rank + 1)
        best = sorted(scores, key=scores.__getitem__, reverse=True)[:k]
        pipe = self.redis.pipeline(transaction=False)
        for key in best:
            pipe.hmget(key, self.RETURN_FIELDS)
        rows = await pipe.execute()
        return [
            self._passage(dict(zip(self.RETURN_FIELDS, row, strict=True)), scores[key])
            for key, row in zip(best, rows, strict=True)
            if row[0] is not None  # deleted meanwhile
        ]

    async def search_naming(
        self, scope: Scope, query: str, vector: np.ndarray, k: int = 5, **filters: Any
    ) -> list[Passage]:
        """`search`, where the query names papers by the labels passages show (`[PDF:pdf-…]`,
        `[arXiv:…]`: a question sent with a PDF carries its note, adapters/shared_files.py):
        up to half of the k passages are theirs, best first, so "what are the key takeaways?"
        reads that paper and not only whichever best matches its words; the rest as `search`
        ranks them. A label of a paper the scope may not read finds nothing (same filters)."""
        named = list(dict.fromkeys(base_arxiv_id(i) for i in NAMED_LABEL.findall(query)))
        named = [paper for paper in named if paper][:MAX_NAMED]
        if not named or filters:
            return await self.search(scope, query, vector, k=k, **filters)
        found = await asyncio.gather(
            *(self.search(scope, query, vector, k=k, arxiv_id=paper) for paper in named),
            self.search(scope, query, vector, k=k),
        )
        *theirs, ranked = found
        picked: dict[tuple[str, int], Passage] = {}
        for passage in _round_robin(theirs)[: max(1, k // 2)] + ranked:
            picked.setdefault((passage.arxiv_id, passage.chunk_index), passage)
        return list(picked.values())[:k]

    async def _text_admitted(
        self, scope: Scope, query: str, candidates: int, filtered: Query
    ) -> list[dict[str, Any]]:
        """The BM25 half when only the audience filters: most passages pass it, and walking its
        long postings took 40 % of the query's time at 100k chunks. The query runs unfiltered
        for twice the candidates, with each row's audience, and `may_read` filters them here;
        when too few pass and there were more, the `filtered` query runs after all, so the ids
        are the filtered query's either way (BM25's scores do not depend on the filter)."""
        returning = ("audience", "arxiv_id")
        unfiltered = self.text_query(query, 2 * candidates, returning=returning)
        rows = await self._run(scope.tenant, unfiltered) if unfiltered is not None else []
        passed = [  # a chunk with no audience tag is not in the filtered query's either
            r for r in rows
            if r.get("audience") is not None
            and may_read(scope, {f: decode(r.get(f)) for f in returning})
        ]  # fmt: skip
        if len(passed) >= candidates or len(rows) < 2 * candidates:
            return passed[:candidates]
        return await self._run(scope.tenant, filtered)

    @staticmethod
    def text_query(
        query: str,
        candidates: int = 10,
        extra: FilterExpression | None = None,
        returning: tuple[str, ...] = (),
    ) -> Query | None:
        """The BM25 half: the question's informative terms, matched verbatim, ids only (and
        the `returning` fields).

        One union over every text field (the schema weighs title matches double), so each
        term's postings are walked once; naming the fields would walk them once per field.
        """
        terms = dict.fromkeys(
            t for t in _WORD.findall(query.lower()) if t not in STOPWORDS and len(t) > 1
        )
        if not terms:
            return None
        union = " | ".join(_ESCAPER.escape(t) for t in terms)
        text_query = (
            Query(f"({union}) {extra}" if extra is not None else f"({union})")
            .verbatim()  # exact terms: paraphrases and word forms are the vector half's job
            .scorer("BM25STD")
            .paging(0, candidates)
            .dialect(2)
        )
        return text_query.return_fields(*returning) if returning else text_query.no_content()

    @staticmethod
    def _passage(row: dict[str, Any], score: float) -> Passage:
        year, page = decode(row.get("year")), decode(row.get("page"))
        return Passage(
            arxiv_id=decode(row.get("arxiv_id", "")),
            title=decode(row.get("title", "")),
            section=decode(row.get("section", "")),
            chunk_index=int(float(decode(row.get("chunk_index", 0)) or 0)),
            content=decode(row.get("content", "")),
            url=decode(row.get("url", "")),
            year=int(float(year)) if year not in (None, "") else None,
            score=score,
            audience=decode(row.get("audience")) or PUBLIC,
            page=int(float(page)) if page not in (None, "") else None,
        )

    @staticmethod
    def segment(passages: list[Passage], numbers: Sequence[int] | None = None) -> Segment:
        """The passages as a segment, each headed by its number: `numbers` (the turn's, given by
        the caller) or 1, 2, … in order."""
        numbers = list(numbers) if numbers is not None else list(range(1, len(passages) + 1))
        if len(numbers) != len(passages):
            raise ValueError("one number per passage is needed")
        items = []
        for number, p in zip(numbers, passages, strict=True):
            where = f" — section: {p.section}" if p.section else ""
            year = f" ({p.year})" if p.year else ""
            page = f" — page {p.page}" if p.page else ""
            label = "PDF" if is_shared_pdf(p.arxiv_id) else "arXiv"
            link = web_link(p.url)  # never an old local PDF's `file:` server path
            items.append(
                f"[{number}] [{label}:{p.arxiv_id}] {p.title}{year}{where}{page} — chunk "
                f"{p.chunk_index}\nLink: {link}\n{p.content}"
            )
        return Segment(
            name="Knowledge Base",
            description="passages of papers saved to the team's knowledge base, most relevant first.",
            usage="ground factual claims in these passages; cite each passage you use by its number "
            "in brackets, as [1] or [2, 3], right after the claim, and only numbers you were shown.",
            items=items,
            empty_note="(no relevant passages in the knowledge base)",
        )
