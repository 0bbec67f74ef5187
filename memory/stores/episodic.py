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
and every row they return passes `Scope.can_see` here before it is used. A walled scope's are
always filtered: it sees only its own place, whose few messages an unfiltered top-k over the
whole tenant would crowd out.

This module is the store: its index, its writes, and recall's two halves (`find`, `pick`).
The rest lives beside it, one job a module:
- `episodic_episode`: a message as kept (`Episode`, `indexed`) and the segment it renders to;
- `episodic_query`: RediSearch syntax: tag values, the clause every read carries, reply rows;
- `episodic_candidates`: the knobs (`Ranking`), a question as read, the filter, a candidate;
- `episodic_search`: the Redis reads of recall (candidates, neighbours, the chosen messages);
- `episodic_scoring`: scoring, smoothing and packing, no Redis;
- `episodic_ranking`: the pure helpers of scoring (z-scores, pseudo-relevance feedback);
- `episodic_text`: what a message and a question say as text (dates, parts, stems).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import numpy as np
from redis.asyncio import Redis

from memory.embeddings import Embedder
from memory.keys import EPISODE_INDEX, EPISODE_PREFIX
from memory.scope import Scope
from memory.stores.base import delete_keys
from memory.stores.episodic_candidates import Found, Ranking, _Candidate, _Filter
from memory.stores.episodic_episode import (
    EMBEDDED_CHARS,
    INDEXED_CHARS,
    Episode,
    _ordered,
    indexed,
    segment,
)
from memory.stores.episodic_query import ROW, SEP, _filter, _names, _pos, _rows
from memory.stores.episodic_scoring import EpisodicScoring
from memory.stores.episodic_search import EpisodicSearch
from memory.stores.episodic_text import MAX_PARTS, asks
from memory.stores.stopwords import STOPWORDS
from memory.tokens import count_tokens

__all__ = [
    "EMBEDDED_CHARS",
    "INDEXED_CHARS",
    "SEP",
    "Episode",
    "EpisodicStore",
    "Found",
    "Ranking",
    "indexed",
]

OPENING_GAP = 4 * 3600.0  # a message this long after the one before opens a conversation
ESTIMATE_MODEL = "gpt-4o"  # whose tokens a stored line count is in (o200k)


class EpisodicStore(EpisodicScoring, EpisodicSearch):
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
        broad = not (scope.walled or thread or author or since is not None or until is not None)
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

    async def latest(
        self,
        scope: Scope,
        k: int = 10,
        thread: str | None = None,
        author: str | None = None,
        since: float | None = None,
        until: float | None = None,
    ) -> list[Episode]:
        """The newest k messages that pass the filters, newest first (`search_conversations`
        with no query: nothing to rank by but time). A message's parts share its `ts`: enough
        rows are read for k messages."""
        clause = _filter(scope, thread=thread, author=author, since=since, until=until)
        reply = await self._search(
            scope.tenant, "FT.SEARCH", clause, "SORTBY", "ts", "DESC",
            "RETURN", len(ROW), *ROW, "LIMIT", 0, k * (1 + MAX_PARTS), "DIALECT", 2,
        )  # fmt: skip
        rows = [_Candidate.from_row(row) for _, row in _rows(reply)]
        newest = list({c.id: (c.thread, c.seq) for c in rows}.items())[:k]
        found = await self._fetch(scope, dict(newest))
        return [found[i] for i, _ in newest if i in found]

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
        broad = not (
            scope.walled or thread_only or author or since is not None or until is not None
        )
        where = _Filter(scope, clause, broad, skip)
        read = await self._read(scope, question)
        candidates = await self._candidates(scope, read, vector, where)
        return Found(scope, vector, read, where, candidates)

    async def pick(
        self, found: Found, budget_tokens: int, model: str, exclude_ids: frozenset[str]
    ) -> list[Episode]:
        """Recall's second half: score what `find` found, read around the best, pack the
        budget, and read the chosen messages' texts."""
        return (await self.pick_rendered(found, budget_tokens, model, exclude_ids))[0]

    async def pick_rendered(
        self,
        found: Found,
        budget_tokens: int,
        model: str,
        exclude_ids: frozenset[str],
        empty_tokens: int | None = None,
    ) -> tuple[list[Episode], str, int]:
        """`pick`, with the chosen messages' rendering (`render`) and its tokens in `model`:
        the budget check has both at hand, and context assembly shows them. `empty_tokens`:
        the empty segment's tokens in `model`, when the caller counted them already."""
        empty = self.render([])
        if empty_tokens is None:
            empty_tokens = count_tokens(empty, model)
        picked = await self._pick(found, budget_tokens, model, exclude_ids, empty_tokens)
        if picked is None or not picked[0]:
            return [], empty, empty_tokens
        return picked

    async def _pick(
        self,
        found: Found,
        budget_tokens: int,
        model: str,
        exclude_ids: frozenset[str],
        empty_tokens: int,
    ) -> tuple[list[Episode], str, int] | None:
        """The chosen messages, rendered and counted; None when none fit."""
        scope, read, where, candidates = found.scope, found.read, found.where, found.candidates
        if empty_tokens > budget_tokens:
            return None
        for episode_id in exclude_ids & candidates.keys():
            del candidates[episode_id]
        if not candidates:
            return None
        self._score(scope, read, candidates)  # to know the best, whose neighbours to read
        read.feedback = self._feedback(candidates)
        await self._expand(
            scope, candidates, where, exclude_ids, found.vector, read.plain, read.seen_words
        )
        self._score(scope, read, candidates)
        self._smooth(candidates)
        units = self._pack(candidates, budget_tokens, model)
        places = {i: (candidates[i].thread, candidates[i].seq) for unit in units for i in unit}
        fetched = await self._fetch(scope, places)
        chosen = [[fetched[i] for i in unit if i in fetched] for unit in units]
        rendered: dict[tuple[str, ...], str] = {}  # threads' items: a pop changes one or two
        while chosen:
            episodes = _ordered(chosen)
            text = self.segment(episodes, rendered).render()
            if (tokens := count_tokens(text, model)) <= budget_tokens:
                return episodes, text, tokens
            chosen.pop()  # the estimate fell short: drop the least valuable
        return None

    # -- rendering -----------------------------------------------------------------------------

    @classmethod
    def render(cls, episodes: list[Episode]) -> str:
        """The segment as the context shows it (what `recall`'s budget covers)."""
        return cls.segment(episodes).render()

    segment = staticmethod(segment)  # see `episodic_episode.segment`
