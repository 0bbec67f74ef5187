"""Episodic memory: every message of every thread of a tenant, found again when it matters.

Each message is a hash with its text, its embeddings and where, when and by whom it was said.
For a question, Redis proposes candidates: BM25 over its words, KNN over all messages, and KNN
over the messages of the people it names in this thread, all filtered to what the asking place
may see. Their scores are z-scored and summed, so each half counts by how far a message stands
out; priors for a named author, a named date, this thread and a conversation's opening message
adjust that, and every message borrows from its neighbours' scores (an answer sits next to its
question; a story goes on in the speaker's next message), the neighbours of the best ones
joining the candidates; one filtered KNN over those neighbours and the hits only BM25 found
measures their cosine (stems of the question's words are searched as prefixes too). The
words the best candidates share, rare among the others, re-score every candidate
(pseudo-relevance feedback, `episodic_ranking`: rows carry their words, no query is added). The
best are packed into the token budget by value per token, a short hit with the message it
replies to; only the chosen messages are read whole. Rendering is compact: a header per thread,
`Name: text` lines, the date where it changes.

Privacy: the KNN queries carry the audience filter; BM25 and the tag lookups run unfiltered
when nothing but the audience restricts them (filtering there walks the long `public` postings)
and every row they return passes `Scope.can_see` here before it is used.

What a message and a question say as text (the dates a question names, a message's parts, word
stems) is read in `episodic_text`; `parts` and `mentioned_periods` are re-exported from here.
"""

from __future__ import annotations

import asyncio
import calendar
import math
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

import numpy as np
from redis.asyncio import Redis
from redisvl.utils.token_escaper import TokenEscaper

from memory.embeddings import Embedder
from memory.keys import EPISODE_INDEX, EPISODE_PREFIX, erasing_key
from memory.scope import PUBLIC, Scope
from memory.stores.base import Segment, VectorStore, decode, delete_keys, vector_bytes
from memory.stores.episodic_ranking import feedback_score, feedback_terms, row_words, z_of
from memory.stores.episodic_text import DAY, MAX_PARTS, asks, mentioned_periods, parts, stems
from memory.stores.stopwords import STOPWORDS
from memory.tokens import block_tokens, count_tokens

SEP = "\x1f"  # tag separator: validated thread ids, like channel and user ids, never hold it
OPENING_GAP = 4 * 3600.0  # a message this long after the one before opens a conversation
NAMES_TTL = 60.0  # seconds a process trusts its list of a tenant's author names
# Of a longer message (a model's answer can run to 250,000 characters), episodic memory keeps
# the first INDEXED_CHARS: what it stores, searches by its words, splits into parts and shows,
# with a note of what the thread's conversation holds beyond it. A vector embeds at most
# EMBEDDED_CHARS: under the 8,191-token input of OpenAI's embedding models in any script
# (MiniLM reads only its first 256 tokens anyway).
INDEXED_CHARS = 8_000
EMBEDDED_CHARS = 6_000
ESTIMATE_MODEL = "gpt-4o"  # whose tokens a stored line count is in (o200k)
FIELDS = ["thread", "channel", "audience", "author", "author_name", "role", "text", "ts", "seq"]
ROW = ["msg", "meta"]  # what a candidate row carries (see `EpisodicStore._common`)
WORDS_ROW = [*ROW, "text", "part"]  # and its words, for pseudo-relevance feedback
_WORD = re.compile(r"\w+")
_TAG_ESCAPER = TokenEscaper(re.compile(TokenEscaper.TAG_ESCAPED_CHARS))
_TEXT_ESCAPER = TokenEscaper()
_ASKING = """
ever recently last time times anything something someone kind type sort mention mentioned talk
talked said ask asked think thought like likely both
"""
QUESTION_WORDS = frozenset(_ASKING.split())  # they phrase a question, not name its subject


@dataclass
class Episode:
    """One message as episodic memory keeps it; `seq` is its position in its thread."""

    id: str
    thread: str
    channel: str = ""
    audience: str = PUBLIC
    author: str = ""
    author_name: str = ""
    role: str = "user"
    text: str = ""
    ts: float = 0.0
    seq: int = 0
    previous_ts: float | None = None  # when the thread's message before it was said, if known

    @property
    def speaker(self) -> str:
        name = self.author_name or self.author or self.role
        return name.lstrip("/ \t") or self.role  # a line starts where the token counter cuts

    @property
    def date(self) -> str:
        return time.strftime("%Y-%m-%d", time.gmtime(self.ts))

    @property
    def embedding_text(self) -> str:
        """What a message's vector embeds: who said it, then what, so that a question about
        someone lands nearer their own messages than the ones addressed to them."""
        return f"{self.speaker}: {self.text}"[:EMBEDDED_CHARS]

    def part_texts(self) -> list[str]:
        """What the vectors of its parts embed (see `parts`): none for a one-part message."""
        return [f"{self.speaker}: {part}"[:EMBEDDED_CHARS] for part in parts(self.text)]

    def line(self, when: str = "") -> str:
        """Its line in the rendering, after `when` it was said (given where that changes)."""
        head = f"{when} {self.speaker}" if when else self.speaker
        return f"{head}: {self.text.strip()}\n"


@dataclass
class Ranking:
    """The knobs of recall, tuned on LoCoMo's development split (bench/locomo_recall.py)."""

    text_candidates: int = 100  # BM25
    vector_candidates: int = 50  # KNN over every message
    named_candidates: int = 150  # KNN over this thread's messages by the people named
    text_weight: float = 1.0
    vector_weight: float = 1.0
    author_bonus: float = 1.0  # the question names the message's author
    thread_bonus: float = 0.6  # the message is from the thread the question is asked in
    date_bonus: float = 2.0  # the message is from around a date the question names
    date_days: float = 3.0  # how far around a named day
    opener_bonus: float = 0.5  # the message opens a conversation
    question_penalty: float = 0.3  # the message asks: its answer says more
    smoothing: float = 0.7  # share of the better adjacent message's score borrowed
    smoothing_far: float = 0.5  # the same, from two messages away
    context_neighbours: int = 20  # best candidates whose neighbours join the candidates
    short_tokens: int = 10  # a hit this short is shown with the message it replies to
    answer_tokens: int = 16  # a hit this short is shown with its question, or its answer
    cost_exponent: float = 0.3  # priority = exp(score) / tokens**exponent
    stem_weight: float = 0.5  # BM25 weight of the question's stems as prefixes (0: none)
    feedback_weight: float = 0.15  # weight of the best candidates' vocabulary (0: none)
    feedback_docs: int = 5  # how many best candidates lend it
    feedback_terms: int = 20  # how many of their words, at most


@dataclass
class _Question:
    """What recall reads from a question: words for BM25, named authors, named periods."""

    terms: list[str]
    named: list[str]
    periods: list[tuple[float, float]]
    plain: frozenset[str] = frozenset()  # words that say nothing of a subject here
    feedback: dict[str, float] = field(default_factory=dict)  # see `episodic_ranking`


@dataclass
class Found:
    """What recall's candidate searches found for a question (`EpisodicStore.find`)."""

    scope: Scope
    vector: np.ndarray
    read: _Question
    where: _Filter
    candidates: dict[str, _Candidate]


@dataclass
class _Filter:
    """What a read may return. `clause` filters the KNN queries; when `broad` (only the
    audience and the recent window stand in the way: most messages pass) the BM25 and tag
    lookups go unfiltered and `admits` filters their rows here, which spares Redis walking
    the long `public` postings (half of a BM25 query's time at 100k messages)."""

    scope: Scope
    clause: str
    broad: bool
    skip: tuple[str, int] | None = None  # (thread, seq): that thread from seq on is hidden

    @property
    def lookup(self) -> str:
        return "" if self.broad else self.clause

    def admits(self, c: _Candidate) -> bool:
        hidden = self.skip is not None and c.thread == self.skip[0] and c.seq >= self.skip[1]
        return self.scope.can_see(c.audience) and not hidden


@dataclass
class _Candidate:
    """A message as ranking sees it: where and when, from its row's `meta`; of its text only
    the words, for feedback."""

    id: str
    thread: str
    seq: int
    ts: float
    names: tuple[str, ...]
    audience: str
    opens: bool  # it opens a conversation (see `_openers`)
    asks: bool  # it ends with a question mark
    tokens: int  # its line's tokens, in ESTIMATE_MODEL's encoding
    text_score: float = 0.0
    cosine: float | None = None
    measured: bool = False  # its cosine comes from the second pass, not a KNN list
    neighbour: bool = False  # found as the neighbour of a candidate, not by a search
    words: frozenset[str] | None = None  # its row's words, when read (see `episodic_ranking`)
    own: float = 0.0  # its own score: fused, plus the priors
    score: float = 0.0  # after smoothing

    @classmethod
    def from_row(cls, row: dict[bytes, Any]) -> _Candidate:
        seq, ts, flags, tokens, names, thread, audience = decode(row[b"meta"]).split(SEP, 6)
        return cls(decode(row[b"msg"]), thread, int(seq), float(ts), tuple(names.split()),
                   audience, "o" in flags, "q" in flags, int(tokens))  # fmt: skip

    @property
    def day(self) -> int:
        return int(self.ts // DAY)


class EpisodicStore(VectorStore):
    SCHEMA = {
        # Matched verbatim (see `_candidates`), so no stems are indexed.
        "index": {"name": EPISODE_INDEX, "prefix": EPISODE_PREFIX, "stopwords": sorted(STOPWORDS)},
        "fields": [
            {"name": "text", "type": "text", "attrs": {"no_stem": True}},
            *(
                {"name": name, "type": "tag", "attrs": {"separator": SEP, "case_sensitive": True}}
                for name in ("thread", "channel", "audience", "author", "names", "role", "pos")
            ),
            {"name": "ts", "type": "numeric", "attrs": {"sortable": True}},
            {"name": "seq", "type": "numeric"},
        ],
    }

    def __init__(self, redis: Redis, embedder: Embedder, ranking: Ranking | None = None) -> None:
        super().__init__(redis, embedder)
        self.ranking = ranking or Ranking()
        self._names: dict[str, tuple[float, frozenset[str]]] = {}

    def embedding_text(self, record: dict[str, Any]) -> str:
        if record.get("part"):  # a part's embedding text, as embedded
            return record["part"]
        return Episode("", "", author=record.get("author", ""), role=record.get("role", "user"),
                       author_name=record.get("author_name", ""),
                       text=record.get("text", "")).embedding_text  # fmt: skip

    def key(self, tenant: str, episode_id: str) -> str:
        return f"{self.key_prefix(tenant)}{episode_id}"

    def part_key(self, tenant: str, episode_id: str, n: int) -> str:
        return f"{self.key(tenant, episode_id)}{SEP}{n}"

    # -- writes --------------------------------------------------------------------------------

    async def add(
        self, scope: Scope, episodes: list[Episode], vectors: np.ndarray | None = None
    ) -> None:
        """Store messages with the vectors of their `embedding_text` (embedded here when not
        given); a message stored again (same id) is overwritten. A message without an audience
        gets the scope's.

        A message of several sentences also gets a vector per part (`parts`), stored beside it
        under `<key><SEP><n>`: a long message about many things is found by the one it shares
        with the question, which its whole vector blurs. Parts carry the message's tags, so
        every filter applies to them, but no indexed text: BM25 sees the message once.
        A message longer than INDEXED_CHARS is kept as its beginning (`indexed`).
        """
        episodes = [indexed(e) for e in episodes]
        pieces = [(e, n, part) for e in episodes for n, part in enumerate(e.part_texts())]
        parts = [part for _, _, part in pieces]
        if vectors is None:  # messages and parts in one embedding pass
            both = await self.embedder.embed([e.embedding_text for e in episodes] + parts)
            vectors, part_vectors = both[: len(episodes)], both[len(episodes) :]
        else:
            part_vectors = await self.embedder.embed(parts)
        if len(episodes) != len(vectors):
            raise ValueError("one vector per episode is needed")
        opens = await self._openers(scope, episodes)
        common = {e.id: self._common(scope, e, e.id in opens) for e in episodes}
        rows = [
            (self.key(scope.tenant, e.id), {**common[e.id], "text": e.text, "channel": e.channel,
             "author": e.author, "author_name": e.author_name, "role": e.role,
             "pos": _pos(e.thread, e.seq)}, vector)
            for e, vector in zip(episodes, vectors, strict=True)
        ]  # fmt: skip
        rows += [
            (self.part_key(scope.tenant, e.id, n), {**common[e.id], "part": part}, vector)
            for (e, n, part), vector in zip(pieces, part_vectors, strict=True)
        ]
        stored = await self._stored(scope.tenant, [e.id for e in episodes])
        await delete_keys(self.redis, self._part_keys(scope.tenant, stored))  # re-indexed ones
        await self._write(scope.tenant, rows)
        if scope.tenant in self._names:
            when, known = self._names[scope.tenant]
            self._names[scope.tenant] = (when, known.union(*(_names(e) for e in episodes)))

    @staticmethod
    def _common(scope: Scope, e: Episode, opens: bool) -> dict[str, Any]:
        """The fields a message and its parts share: the filters' tags, and `meta`."""
        audience = e.audience or scope.audience
        flags = ("o" if opens else "") + ("q" if asks(e.text) else "")
        tokens = count_tokens(e.line(), ESTIMATE_MODEL)
        names = " ".join(_names(e))
        meta = SEP.join(
            [str(e.seq), repr(float(e.ts)), flags, str(tokens), names, e.thread, audience]
        )
        return {"thread": e.thread, "audience": audience, "names": SEP.join(_names(e)),
                "ts": e.ts, "seq": e.seq, "msg": e.id, "meta": meta}  # fmt: skip

    async def _openers(self, scope: Scope, episodes: list[Episode]) -> set[str]:
        """The ids of the messages that open a conversation: first in their thread, or said
        OPENING_GAP after the message before. An opener is where a topic is brought up (the
        news, the question, the decision), so recall favours it. The message before is dated by
        `previous_ts` when the caller knows it: looked up here, it may not be indexed yet."""
        before = {(e.thread, e.seq): e.ts for e in episodes}
        before.update(
            {(e.thread, e.seq - 1): e.previous_ts for e in episodes if e.previous_ts is not None}
        )
        missing = {(e.thread, e.seq - 1) for e in episodes if e.seq > 0} - before.keys()
        if missing:
            for c in await self._at(scope.tenant, missing, ""):
                before[(c.thread, c.seq)] = c.ts
        return {
            e.id
            for e in episodes
            if e.ts - before.get((e.thread, e.seq - 1), float("-inf")) >= OPENING_GAP
        }

    async def _stored(self, tenant: str, ids: list[str]) -> list[str]:
        """Those of `ids` already in episodic memory: one EXISTS each (their keys are spread
        over hash slots), so a new message does not cost a DEL of each possible part."""
        found = await asyncio.gather(*(self.redis.exists(self.key(tenant, i)) for i in ids))
        return [i for i, n in zip(ids, found, strict=True) if n]

    def _part_keys(self, tenant: str, ids: list[str]) -> list[str]:
        return [self.part_key(tenant, i, n) for i in ids for n in range(MAX_PARTS)]

    async def delete(self, scope: Scope, ids: Iterable[str]) -> int:
        """Forget messages (and their parts); returns how many messages were stored."""
        ids = list(ids)
        if not ids:
            return 0
        found = await delete_keys(self.redis, (self.key(scope.tenant, i) for i in ids))
        await delete_keys(self.redis, self._part_keys(scope.tenant, ids))
        return int(found)

    # -- reads ---------------------------------------------------------------------------------

    async def search(
        self,
        scope: Scope,
        query: str,
        vector: np.ndarray,
        k: int = 10,
        thread: str | None = None,
        author: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Episode]:
        """Plain top-k hybrid search (the `search_conversations` tool), best first."""
        clause = _filter(scope, thread=thread, author=author, since=since, until=until)
        broad = not (thread or author or since is not None or until is not None)
        question = await self._read(scope, query)
        where = _Filter(scope, clause, broad)
        candidates = await self._candidates(scope, question, vector, where, max(k, 20))
        self._score(scope, question, candidates)
        question.feedback = self._feedback(candidates)
        if question.feedback:
            self._score(scope, question, candidates)
        self._smooth(candidates)
        best = sorted(candidates.values(), key=lambda c: -c.score)[:k]
        found = await self._fetch(scope, {c.id: (c.thread, c.seq) for c in best})
        return [found[c.id] for c in best if c.id in found]

    async def recall(
        self,
        scope: Scope,
        question: str,
        vector: np.ndarray,
        budget_tokens: int,
        model: str,
        exclude_ids: frozenset[str] = frozenset(),
        exclude_thread_seq_from: int | None = None,
        thread_only: bool = False,
        author: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Episode]:
        """The messages most worth showing for `question`, whose rendering (`render`) fits
        `budget_tokens` in `model`'s encoding, in rendering order.

        `exclude_ids` (or every message of this thread from `exclude_thread_seq_from` on) are
        the ones the recent window already shows.
        """
        found = await self.find(
            scope, question, vector, exclude_thread_seq_from, thread_only, author, since, until
        )
        return await self.pick(found, budget_tokens, model, exclude_ids)

    async def find(
        self,
        scope: Scope,
        question: str,
        vector: np.ndarray,
        exclude_thread_seq_from: int | None = None,
        thread_only: bool = False,
        author: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> Found:
        """Recall's first half, its candidate searches: it needs no budget, so context
        assembly runs it beside its other reads (see `recall` for the arguments)."""
        skip = None
        if exclude_thread_seq_from is not None and scope.thread:
            skip = (scope.thread, exclude_thread_seq_from)
        clause = _filter(
            scope, thread=scope.thread if thread_only else None, author=author,
            since=since, until=until, skip_from=skip,
        )  # fmt: skip
        broad = not (thread_only or author or since is not None or until is not None)
        where = _Filter(scope, clause, broad, skip)
        read = await self._read(scope, question)
        candidates = await self._candidates(scope, read, vector, where)
        return Found(scope, vector, read, where, candidates)

    async def pick(
        self, found: Found, budget_tokens: int, model: str, exclude_ids: frozenset[str]
    ) -> list[Episode]:
        """Recall's second half: score what `find` found, read around the best, pack the
        budget, and read the chosen messages' texts."""
        scope, read, where, candidates = found.scope, found.read, found.where, found.candidates
        if count_tokens(self.render([]), model) > budget_tokens:
            return []
        for episode_id in exclude_ids & candidates.keys():
            del candidates[episode_id]
        if not candidates:
            return []
        self._score(scope, read, candidates)  # to know the best, whose neighbours to read
        read.feedback = self._feedback(candidates)
        await self._expand(scope, candidates, where, exclude_ids, found.vector, read.plain)
        self._score(scope, read, candidates)
        self._smooth(candidates)
        units = self._pack(candidates, budget_tokens, model)
        places = {i: (candidates[i].thread, candidates[i].seq) for unit in units for i in unit}
        fetched = await self._fetch(scope, places)
        chosen = [[fetched[i] for i in unit if i in fetched] for unit in units]
        while chosen and count_tokens(self.render(_ordered(chosen)), model) > budget_tokens:
            chosen.pop()  # the estimate fell short: drop the least valuable
        return _ordered(chosen)

    # -- candidates ----------------------------------------------------------------------------

    async def _read(self, scope: Scope, question: str) -> _Question:
        words = dict.fromkeys(_WORD.findall(question.lower()))
        authors = await self._author_names(scope.tenant)
        named = [w for w in words if w in authors and w not in STOPWORDS]  # not "will", "may"
        # A name in a message mostly addresses someone: the named authors' own messages are
        # found by the named KNN and the author prior instead.
        skip = STOPWORDS | QUESTION_WORDS | authors
        terms = [w for w in words if len(w) > 1 and w not in skip]
        plain = frozenset(skip | set(terms))
        return _Question(terms, named, mentioned_periods(question, self.ranking.date_days), plain)

    async def _author_names(self, tenant: str) -> frozenset[str]:
        """The words of the tenant's author names, read from the index once a minute."""
        cached = self._names.get(tenant)
        if cached and time.monotonic() - cached[0] < NAMES_TTL:
            return cached[1]
        reply = await self.redis.execute_command("FT.TAGVALS", await self._index(tenant), "names")
        names = frozenset(decode(v) for v in reply)
        self._names[tenant] = (time.monotonic(), names)
        return names

    async def _candidates(
        self,
        scope: Scope,
        question: _Question,
        vector: np.ndarray,
        where: _Filter,
        least: int = 0,
    ) -> dict[str, _Candidate]:
        """Candidates from up to three queries at once, ids and `meta` only: BM25 over the
        question's words, KNN over all messages, and KNN over this thread's messages by the
        people the question names (a question about the past is mostly about someone, and
        their own messages are where the answer is; the thread keeps that set small)."""
        r = self.ranking
        index = await self._index(scope.tenant)
        knn = [self._knn(index, where.clause, vector, max(r.vector_candidates, least), where.broad)]
        if question.named and scope.thread and r.named_candidates:
            here = f"{_tags('names', question.named)} {_tags('thread', [scope.thread])}"
            knn.append(
                self._knn(index, f"{here} {where.clause}", vector, r.named_candidates, False)
            )
        bm25 = []
        if question.terms:
            words = [_TEXT_ESCAPER.escape(t) for t in question.terms]
            if r.stem_weight:
                weight = f"=>{{$weight: {r.stem_weight}}}"
                words += [f"({_TEXT_ESCAPER.escape(s)}*){weight}" for s in stems(question.terms)]
            union = " | ".join(words)
            query = f"({union}) {where.lookup}".strip()
            bm25.append(self._bm25(index, query, max(r.text_candidates, least)))
        replies = await asyncio.gather(*knn, *bm25)
        out: dict[str, _Candidate] = {}
        for reply in replies[: len(knn)]:
            for _, row in _rows(reply):
                cosine = 1.0 - float(row[b"dist"])
                c = out.get(decode(row[b"msg"]))
                if c is None:
                    c = _Candidate.from_row(row)
                    out[c.id] = c
                c.cosine = max(c.cosine if c.cosine is not None else -1.0, cosine)
                _add_words(c, row, question.plain)
        for reply in replies[len(knn) :]:
            for score, row in _rows(reply):
                c = out.get(decode(row[b"msg"])) or _Candidate.from_row(row)
                out[c.id] = c
                c.text_score = float(score)
                _add_words(c, row, question.plain)
        return {i: c for i, c in out.items() if where.admits(c)}

    def _bm25(self, index: str, query: str, k: int) -> Any:
        return self.redis.execute_command(
            "FT.SEARCH", index, query, "VERBATIM", "WITHSCORES", "SCORER", "BM25STD",
            "RETURN", len(self._row), *self._row, "LIMIT", 0, k, "DIALECT", 2,
        )  # fmt: skip

    @property
    def _row(self) -> list[str]:
        """What a candidate row returns: its words too when feedback reads them."""
        return WORDS_ROW if self.ranking.feedback_weight else ROW

    def _knn(self, index: str, where: str, vector: np.ndarray, k: int, batches: bool) -> Any:
        """A KNN query. With a filter most messages pass, HNSW batches: RediSearch would
        otherwise pick a brute-force scan of every vector (23 ms at 100k messages)."""
        policy = " HYBRID_POLICY BATCHES" if batches else ""
        return self.redis.execute_command(
            "FT.SEARCH", index, f"({where})=>[KNN {k} @{self.VECTOR_FIELD} $vec{policy} AS dist]",
            "PARAMS", 2, "vec", vector_bytes(vector), "SORTBY", "dist",
            "RETURN", len(self._row) + 1, *self._row, "dist", "LIMIT", 0, k, "DIALECT", 2,
        )  # fmt: skip

    async def _at(self, tenant: str, places: set[tuple[str, int]], where: str) -> list[_Candidate]:
        """The messages at these (thread, seq) places: one tag lookup."""
        tags = "|".join(_TAG_ESCAPER.escape(_pos(t, s)) for t, s in sorted(places))
        reply = await self.redis.execute_command(
            "FT.SEARCH", await self._index(tenant), f"@pos:{{{tags}}} {where}".strip(),
            "RETURN", len(ROW), *ROW, "LIMIT", 0, len(places), "DIALECT", 2,
        )  # fmt: skip
        return [_Candidate.from_row(row) for _, row in _rows(reply)]

    async def _measure(
        self,
        tenant: str,
        places: set[tuple[str, int]],
        where: _Filter,
        vector: np.ndarray,
        plain: frozenset[str] = frozenset(),
    ) -> list[_Candidate]:
        """The messages at these (thread, seq) places with their cosine to the question: one
        KNN restricted to them (exact: RediSearch scans so few), filtered like every KNN."""
        tags = "|".join(_TAG_ESCAPER.escape(_pos(t, s)) for t, s in sorted(places))
        index = await self._index(tenant)
        where_here = f"@pos:{{{tags}}} {where.clause}"
        reply = await self._knn(index, where_here, vector, len(places), False)
        out = []
        for _, row in _rows(reply):
            c = _Candidate.from_row(row)
            c.cosine = 1.0 - float(row[b"dist"])
            _add_words(c, row, plain)
            out.append(c)
        return out

    # -- scoring -------------------------------------------------------------------------------

    def _score(self, scope: Scope, question: _Question, candidates: dict[str, _Candidate]) -> None:
        """Each candidate's own score: z-scored BM25 plus z-scored cosine, plus the priors.
        Neighbours (`_expand`) start from the lowest fused score."""
        r = self.ranking
        found = [c for c in candidates.values() if not c.neighbour]
        text = np.array([c.text_score for c in found])
        known = [c.cosine for c in found if c.cosine is not None and not c.measured]
        floor = min(known, default=0.0)  # beyond the KNN lists: at most their last cosine
        cosine = np.array([floor if c.cosine is None else c.cosine for c in found])
        text_z, cosine_z = z_of(text), z_of(cosine)
        fused = r.text_weight * text_z(text) + r.vector_weight * cosine_z(cosine)
        feedback = np.array([feedback_score(c.words, question.feedback) for c in found])
        feedback_z = z_of(feedback)
        fused += r.feedback_weight * feedback_z(feedback)
        low = float(fused.min()) if len(fused) else 0.0
        for c, f in zip(found, fused, strict=True):
            c.own = float(f)
        for c in candidates.values():
            if c.neighbour:  # by its own cosine when measured, never below the floor
                c.own = low
                if c.cosine is not None:
                    own = r.text_weight * text_z(0.0) + r.vector_weight * cosine_z(c.cosine)
                    own += r.feedback_weight * feedback_z(
                        feedback_score(c.words, question.feedback)
                    )
                    c.own = max(low, float(own))
        named = set(question.named)
        for c in candidates.values():
            own = c.own
            own += r.author_bonus * bool(named.intersection(c.names))
            own += r.thread_bonus * (c.thread == scope.thread)
            own += r.opener_bonus * c.opens - r.question_penalty * c.asks
            own += r.date_bonus * any(start <= c.ts < end for start, end in question.periods)
            c.own = c.score = own

    def _feedback(self, candidates: dict[str, _Candidate]) -> dict[str, float]:
        """The vocabulary of the best candidates by their own score (see `episodic_ranking`)."""
        r = self.ranking
        if not r.feedback_weight:
            return {}
        read = [c for c in candidates.values() if c.words is not None]
        best = sorted(read, key=lambda c: -c.own)[: r.feedback_docs]
        return feedback_terms([c.words or frozenset() for c in best],
                              (c.words or frozenset() for c in read), r.feedback_terms)  # fmt: skip

    def _smooth(self, candidates: dict[str, _Candidate]) -> None:
        """A message borrows from its best neighbour within two messages: the answer sits
        next to the question, the story goes on in the speaker's next message."""
        r = self.ranking
        at = {(c.thread, c.seq): c.own for c in candidates.values()}
        low = min(at.values(), default=0.0)
        weights = ((-2, r.smoothing_far), (-1, r.smoothing), (1, r.smoothing), (2, r.smoothing_far))
        for c in candidates.values():
            near = [w * (at[(c.thread, c.seq + d)] - low) for d, w in weights
                    if (c.thread, c.seq + d) in at]  # fmt: skip
            c.score = c.own + max(near, default=0.0)

    async def _expand(
        self,
        scope: Scope,
        candidates: dict[str, _Candidate],
        where: _Filter,
        exclude_ids: frozenset[str],
        vector: np.ndarray,
        plain: frozenset[str] = frozenset(),
    ) -> None:
        """Add the messages around the best candidates: as candidates of their own (scored by
        their neighbours) and as context for short hits."""
        r = self.ranking
        have = {(c.thread, c.seq) for c in candidates.values()}
        best = sorted(candidates.values(), key=lambda c: -c.own)[: r.context_neighbours]
        reach = (-2, -1, 1, 2) if r.smoothing_far else (-1, 1)
        wanted = {(c.thread, c.seq + d) for c in best for d in reach} - have
        unmeasured = {(c.thread, c.seq) for c in candidates.values() if c.cosine is None}
        if not wanted | unmeasured:
            return
        for c in await self._measure(scope.tenant, wanted | unmeasured, where, vector, plain):
            known = candidates.get(c.id)
            if known is not None:
                if known.cosine is None:
                    known.cosine, known.measured = c.cosine, True
                if c.words is not None:
                    known.words = c.words | (known.words or frozenset())
            elif c.id not in exclude_ids and where.admits(c):
                c.neighbour = True
                candidates[c.id] = c

    # -- packing -------------------------------------------------------------------------------

    def _pack(self, candidates: dict[str, _Candidate], budget: int, model: str) -> list[list[str]]:
        """Greedy by value per token: each hit with the context it needs, until the budget.
        Returns the units (lists of ids) in the order they were taken.

        Costs are the lines' stored token counts plus the headers a new thread or date adds:
        an estimate, which `recall` checks on the rendering.
        """
        r = self.ranking
        at = {(c.thread, c.seq): c for c in candidates.values()}
        units = []
        for c in _leading(candidates.values(), 2 * budget):
            members = [c]
            before, after = at.get((c.thread, c.seq - 1)), at.get((c.thread, c.seq + 1))
            if before is not None and (
                c.tokens < r.short_tokens or (c.tokens < r.answer_tokens and before.asks)
            ):
                members.insert(0, before)  # what a short reply, or an answer, responds to
            if after is not None and c.tokens < r.answer_tokens and c.asks:
                members.append(after)  # the answer to a short question
            cost = sum(m.tokens for m in members)
            units.append((c.score - r.cost_exponent * math.log(cost), members))
        used = _heading_tokens(model)
        date_cost = _date_tokens(model)
        taken: set[str] = set()
        threads: set[str] = set()
        days: set[tuple[str, int]] = set()
        out: list[list[str]] = []
        for _, members in sorted(units, key=lambda u: -u[0]):
            if budget - used < 8:  # full: no line is that short
                break
            fresh = [m for m in members if m.id not in taken]
            cost = 0
            for m in fresh:
                cost += m.tokens
                if m.thread not in threads:
                    cost += len(m.thread) // 3 + 8  # its header, about
                if (m.thread, m.day) not in days:
                    cost += date_cost
            if not fresh or used + cost > budget:
                continue
            used += cost
            for m in fresh:
                taken.add(m.id)
                threads.add(m.thread)
                days.add((m.thread, m.day))
            out.append([m.id for m in fresh])
        return out

    async def _fetch(self, scope: Scope, places: dict[str, tuple[str, int]]) -> dict[str, Episode]:
        """The chosen messages (id -> (thread, seq)), whole: one tag lookup, unfiltered (every
        id was admitted already; the audience is checked again all the same). Forgotten
        messages whose documents are still being deleted (memory/governance_purge.py) are left out:
        asked in the same round trip."""
        if not places:
            return {}
        tags = "|".join(_TAG_ESCAPER.escape(_pos(t, s)) for t, s in places.values())
        ids = list(places)
        reply, erasing = await asyncio.gather(
            self.redis.execute_command(
                "FT.SEARCH", await self._index(scope.tenant), f"@pos:{{{tags}}}",
                "RETURN", len(FIELDS) + 1, "msg", *FIELDS, "LIMIT", 0, 2 * len(places),
                "DIALECT", 2,
            ),
            self.redis.hmget(erasing_key(scope.tenant), ids),
        )  # fmt: skip
        gone = {i for i, parts in zip(ids, erasing, strict=True) if parts is not None}
        found = (_episode(row) for _, row in _rows(reply))
        return {
            e.id: e
            for e in found
            if e.id in places and e.id not in gone and scope.can_see(e.audience)
        }

    # -- rendering -----------------------------------------------------------------------------

    @classmethod
    def render(cls, episodes: list[Episode]) -> str:
        """The segment as the context shows it (what `recall`'s budget covers)."""
        return cls.segment(episodes).render()

    @staticmethod
    def segment(episodes: list[Episode]) -> Segment:
        """Threads in the order given, each oldest first, one `Name: text` line a message; the
        day starts the line where it changes (`8 May 2023`, the year only when it changes), and
        a blank line marks skipped messages."""
        threads: dict[str, list[Episode]] = {}
        for e in episodes:
            threads.setdefault(e.thread, []).append(e)
        items = []
        for members in threads.values():
            members.sort(key=lambda e: e.seq)
            lines = [_thread_line(members[0])]
            last: Episode | None = None
            year = 0
            for e in members:
                if last is not None and e.seq != last.seq + 1:
                    lines.append("\n")
                when = ""
                if last is None or e.date != last.date:
                    day = time.gmtime(e.ts)
                    when = f"{day.tm_mday} {calendar.month_abbr[day.tm_mon]}"
                    when += f" {day.tm_year}" if day.tm_year != year else ""
                    year = day.tm_year
                lines.append(e.line(when))
                last = e
            items.append("".join(lines).rstrip("\n"))
        return Segment(
            name="Episodic",
            description="earlier messages of this team's threads that bear on the question.",
            usage="recall who said what and when: a date holds until the next one, a year "
            "too; a blank line marks skipped messages.",
            items=items,
            empty_note="(no related earlier messages)",
        )


# -- helpers --------------------------------------------------------------------------------


def indexed(e: Episode) -> Episode:
    """`e` as episodic memory keeps it: its first INDEXED_CHARS characters, and a note of how
    many more the thread's conversation holds (a note counted with the line's tokens)."""
    if len(e.text) <= INDEXED_CHARS:
        return e
    more = len(e.text) - INDEXED_CHARS
    note = f" [... {more:,} more characters in the thread's conversation]"
    return replace(e, text=e.text[:INDEXED_CHARS] + note)


def _add_words(c: _Candidate, row: dict[bytes, Any], plain: frozenset[str]) -> None:
    """Join a row's words (a message's text, or a part's) to its candidate's, when returned."""
    text = row.get(b"text") or row.get(b"part")
    if text is not None:
        c.words = row_words(decode(text), plain) | (c.words or frozenset())


def _names(e: Episode) -> list[str]:
    """The words of the author's name, as the `names` tag holds them."""
    return list(dict.fromkeys(_WORD.findall(e.author_name.lower())))


def _pos(thread: str, seq: int) -> str:
    return f"{seq}@{thread}"


def _tags(field_name: str, values: Iterable[str]) -> str:
    return f"@{field_name}:{{{'|'.join(_TAG_ESCAPER.escape(v) for v in values)}}}"


def _filter(
    scope: Scope,
    thread: str | None = None,
    author: str | None = None,
    since: float | None = None,
    until: float | None = None,
    skip_from: tuple[str, int] | None = None,
) -> str:
    """The query clause every read carries: what this place may see, and the caller's filters."""
    parts = [_tags("audience", scope.audiences)]
    if thread:
        parts.append(_tags("thread", [thread]))
    if author:
        parts.append(_tags("author", [author]))
    if since is not None or until is not None:
        low = "-inf" if since is None else repr(float(since))
        high = "+inf" if until is None else repr(float(until))
        parts.append(f"@ts:[{low} {high}]")
    if skip_from is not None:
        parts.append(f"-({_tags('thread', [skip_from[0]])} @seq:[{skip_from[1]} +inf])")
    return " ".join(parts)


def _rows(reply: Any) -> list[tuple[float, dict[bytes, Any]]]:
    """FT.SEARCH's reply, RESP2 or RESP3, as (score, fields by their names as bytes); the
    score when WITHSCORES. Nothing is decoded here: this runs for every candidate."""
    if isinstance(reply, dict):
        rows = [(r.get(b"score") or 0.0, r[b"extra_attributes"]) for r in reply[b"results"]]
    else:
        step = 3 if len(reply) > 2 and not isinstance(reply[2], list) else 2
        rows = [
            (float(reply[i + 1]) if step == 3 else 0.0,
             dict(zip(reply[i + step - 1][::2], reply[i + step - 1][1::2], strict=True)))
            for i in range(1, len(reply), step)
        ]  # fmt: skip
    if rows and isinstance(next(iter(rows[0][1]), b""), str):  # a client decoding replies
        rows = [(score, {k.encode(): v for k, v in row.items()}) for score, row in rows]
    return rows


def _episode(row: dict[bytes, Any]) -> Episode:
    def text(name: str) -> str:
        return decode(row.get(name.encode())) or ""

    return Episode(
        id=text("msg"), thread=text("thread"), channel=text("channel"),
        audience=text("audience") or PUBLIC, author=text("author"),
        author_name=text("author_name"), role=text("role") or "user", text=text("text"),
        ts=float(text("ts") or 0), seq=int(float(text("seq") or 0)),
    )  # fmt: skip


@lru_cache(maxsize=16)
def _heading_tokens(model: str) -> int:
    """What the segment costs before its first thread."""
    return count_tokens(EpisodicStore.segment([]).render().rsplit("\n", 1)[0], model)


@lru_cache(maxsize=16)
def _date_tokens(model: str) -> int:
    """What a date costs at the start of a line."""
    return block_tokens(model, "28 Sep Name: x\n") - block_tokens(model, "Name: x\n")


def _leading(candidates: Iterable[_Candidate], tokens: int) -> list[_Candidate]:
    """The best candidates, as many as take `tokens`: the rest could not make it in."""
    out = []
    for c in sorted(candidates, key=lambda c: -c.score):
        out.append(c)
        tokens -= c.tokens
        if tokens < 0:
            break
    return out


def _thread_line(e: Episode) -> str:
    where = f"#{e.channel} " if e.channel else ""
    return f"{where}thread {e.thread}\n"


def _ordered(units: list[list[Episode]]) -> list[Episode]:
    """Rendering order: threads by their best unit, messages by position."""
    rank: dict[str, int] = {}
    for unit in units:
        for e in unit:
            rank.setdefault(e.thread, len(rank))
    return sorted((e for unit in units for e in unit), key=lambda e: (rank[e.thread], e.seq))
