"""The memory page's search, over past messages (episodic memory) and the knowledge base, and
the display names of the people its provenance names.

A result must bear on the query: it holds one of the query's words (`Relevance`) or is at least
SIMILARITY_FLOOR similar to it (nearest-neighbour search returns k results however unrelated).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from redis.exceptions import ResponseError
from redisvl.utils.token_escaper import TokenEscaper

from memory.browse_knowledge import PassageView
from memory.browse_reader import Audiences, Reader, Reads, sees
from memory.keys import erasing_key
from memory.scope import PUBLIC
from memory.stores.base import decode
from memory.stores.episodic import Episode
from memory.stores.episodic_text import MAX_PARTS, stems
from memory.stores.stopwords import STOPWORDS

# A search result without the query's words is listed only this similar to the query (cosine):
# nearest-neighbour search returns k results however unrelated. With MiniLM, unrelated messages
# stay under 0.35 and paraphrases ("when do we ship the search backend" of "deploy the new
# retrieval service on Friday") reach 0.45 to 0.55.
SIMILARITY_FLOOR = 0.4
NAMES_LOOKED_UP = 200  # distinct user ids whose display names one page looks up, at most
NAME_ROWS = 10  # messages read per person: a name is shown from one not being forgotten
_WORD = re.compile(r"\w+")
_TAG = TokenEscaper(re.compile(TokenEscaper.TAG_ESCAPED_CHARS))


@dataclass(frozen=True)
class Relevance:
    """Whether a text holds the query's words: a word of the text begins with one of them (or
    with a stem of one, `benchmark` for `benchmarking`); a two-letter word must match whole.
    Stopwords do not count: "the paper" is not a match for every message with "the"."""

    words: frozenset[str]
    prefixes: tuple[str, ...]

    @classmethod
    def of(cls, query: str) -> Relevance:
        words = sorted({w for w in _WORD.findall(query.lower()) if w not in STOPWORDS})
        prefixes = [w for w in words if len(w) > 2] + stems(words)
        return cls(frozenset(words), tuple(dict.fromkeys(prefixes)))

    def mentioned_in(self, text: str) -> bool:
        found = set(_WORD.findall(text.lower()))
        return bool(found & self.words) or any(w.startswith(self.prefixes) for w in found)


@dataclass
class SearchResults:
    messages: list[Episode]  # each with its thread, channel, author, date and audience
    passages: list[PassageView]


class SearchReads(Reads):
    async def search(
        self, tenant: str, query: str, audiences: Audiences, k: int = 10
    ) -> SearchResults:
        """Messages (episodic memory, as `search_conversations` finds them, over everything
        `audiences` may see) and passages of the knowledge base that bear on `query`: each
        holds one of its words (`Relevance`) or is at least SIMILARITY_FLOOR similar to it."""
        query = query.strip()
        if not query:
            return SearchResults([], [])
        if audiences is None:
            scope = Reader(tenant, seen=await self._episode_audiences(tenant), everything=True)
        elif not audiences:
            scope = None
        else:
            scope = self.reader(tenant, audiences)
        vector = (await self.memory.embedder.embed([query]))[0]
        episodes = self.memory.episodes.search(scope, query, vector, k=k) if scope else _none()
        kb_reader = self.reader(tenant, audiences)  # an admin's (None) sees every passage
        passages_found = (
            self.memory.knowledge_base.search(
                kb_reader, query, vector, k=k, everywhere=audiences is None
            )
            if audiences is None or audiences
            else _none()
        )
        found, passages = await asyncio.gather(episodes, passages_found)
        relevance, store, kb = Relevance.of(query), self.memory.episodes, self.memory.knowledge_base
        messages = [e for e in found if sees(audiences, e.audience)]
        unmatched = [e for e in messages if not relevance.mentioned_in(f"{e.author_name} {e.text}")]
        views = [
            PassageView(p.arxiv_id, p.title, p.section, p.chunk_index, p.content, p.url, p.audience)
            for p in passages
        ]
        unmatched_passages = [
            p for p in views if not relevance.mentioned_in(f"{p.title} {p.section} {p.content}")
        ]
        similar, similar_passages = await asyncio.gather(
            self._similarities(
                store.VECTOR_FIELD, vector,
                [[store.key(tenant, e.id),
                  *(store.part_key(tenant, e.id, n) for n in range(MAX_PARTS))]
                 for e in unmatched],
            ),
            self._similarities(
                kb.VECTOR_FIELD, vector,
                [[kb.chunk_key(tenant, p.arxiv_id, p.chunk_index)] for p in unmatched_passages],
            ),
        )  # fmt: skip
        far = {e.id for e, s in zip(unmatched, similar, strict=True) if s < SIMILARITY_FLOOR}
        far |= {
            f"{p.arxiv_id}#{p.chunk_index}"
            for p, s in zip(unmatched_passages, similar_passages, strict=True)
            if s < SIMILARITY_FLOOR
        }
        return SearchResults(
            [e for e in messages if e.id not in far],
            [p for p in views if f"{p.arxiv_id}#{p.chunk_index}" not in far],
        )

    async def _similarities(
        self, field_name: str, vector: np.ndarray, groups: list[list[str]]
    ) -> list[float]:
        """For each group of keys (a message and its parts), the best cosine of their stored
        vectors to `vector` (-1 when none is stored, or of another model's size)."""
        if not groups:
            return []
        pipe = self.redis.pipeline(transaction=False)
        for keys in groups:
            for key in keys:
                pipe.hget(key, field_name)
        replies = iter(await pipe.execute())
        out = []
        for keys in groups:
            best = -1.0
            for raw in (next(replies) for _ in keys):
                if raw is None or len(raw) != vector.size * 4:  # float32
                    continue
                best = max(best, float(np.frombuffer(raw, dtype=np.float32) @ vector))
            out.append(best)
        return out

    async def _episode_audiences(self, tenant: str) -> tuple[str, ...]:
        """Every audience episodic memory holds messages of (what an admin's search covers)."""
        index = self.memory.episodes.index_name(tenant)
        try:
            reply = await self.redis.execute_command("FT.TAGVALS", index, "audience")
        except ResponseError:  # no message indexed yet: the index does not exist
            return (PUBLIC,)
        return tuple(sorted({PUBLIC, *(decode(v) for v in reply)}))

    # -- people --------------------------------------------------------------------------------

    async def names(self, tenant: str, users: Iterable[str]) -> dict[str, str]:
        """The display names of these user ids, as their messages in episodic memory carry
        them (one tag lookup each, at once); an id without a message there is left out. A
        forgotten message's document is read as gone while its purge runs (the erasing hash,
        as `EpisodicStore._fetch` reads it): an erased person's name is not shown."""
        wanted = sorted({u for u in users if u})[:NAMES_LOOKED_UP]
        if not wanted:
            return {}
        index = self.memory.episodes.index_name(tenant)
        try:
            replies = await asyncio.gather(*(
                self.redis.execute_command(
                    "FT.SEARCH", index, f"@author:{{{_TAG.escape(user)}}}",
                    "RETURN", 2, "msg", "author_name", "LIMIT", 0, NAME_ROWS, "DIALECT", 2,
                ) for user in wanted
            ))  # fmt: skip
        except ResponseError:  # no message indexed yet: the index does not exist
            return {}
        rows = [_fields(reply) for reply in replies]
        ids = [row.get("msg", "") for found in rows for row in found]
        erasing = await self.redis.hmget(erasing_key(tenant), ids) if ids else []
        gone = {i for i, parts in zip(ids, erasing, strict=True) if parts is not None}
        out = {}
        for user, found in zip(wanted, rows, strict=True):
            names = (r.get("author_name", "").strip() for r in found if r.get("msg") not in gone)
            if name := next((n for n in names if n), ""):
                out[user] = name
        return out


async def _none() -> list[Episode]:
    return []


def _fields(reply: Any) -> list[dict[str, str]]:
    """FT.SEARCH's rows (RESP2 or RESP3), each as its returned fields, decoded."""
    if isinstance(reply, dict):
        rows = reply.get(b"results") or reply.get("results") or []
        found = [r.get(b"extra_attributes") or r.get("extra_attributes") or {} for r in rows]
        return [{decode(k): decode(v) or "" for k, v in f.items()} for f in found]
    return [
        {decode(k): decode(v) or "" for k, v in zip(row[::2], row[1::2], strict=True)}
        for row in (reply or [])[2::2]
        if isinstance(row, list)
    ]
