"""A watch's digest: the new arXiv papers on its topic, minus what the team has, best first.

arXiv is asked for the papers submitted since the last digest, from LOOKBACK before it: arXiv
lists a paper a day to a week or more after it was submitted (weekends, holidays, moderation), so
a window that ended at the last digest may still gain papers. What an earlier finished digest of
this watch was given is dropped (its `seen` set), so a late paper is shown once. Until that set
exists (a watch's first digest, or its first since the set came), the lookback is OVERLAP's, or
none for a new watch: else papers listed but not shown before would be offered again. When a window
has more papers than a query reads (MAX_CANDIDATES), the new period's days that query did not
reach are asked again one by one, each day's newest DAY_SHARE (the lookback is not), and the
digest says it was cut only when such a day was full. Papers already in the team's knowledge
base, or shown by this watch before, are dropped. The rest are ranked by how close they are, in the
embedder's space, to the topic and to what the team saved (its nearest saved paper and the
centroid of its saved papers), with every text embedded in one call. Why a paper matters to this
team is said from that ranking, deterministically and honestly: the team's closest saved paper
with a plain word for how close it is, the topic's words the paper shares, and its abstract's
sentence that shares most with the topic. No model is needed.
"""

from __future__ import annotations

import calendar
import contextlib
import math
import re
import time
from dataclasses import dataclass, field

import numpy as np

from memory.ingest.arxiv_source import ArxivSource, Candidate
from memory.keys import watch_seen_key
from memory.scope import PUBLIC, Scope, Visibility
from memory.shorten import shortened
from memory.stores.knowledge_base import KnowledgeBase
from memory.stores.watches import DAY, Watch, WatchStore

LOOKBACK = 14 * DAY  # asked again before `since` (by the first query); what was given is dropped
OVERLAP = 3 * DAY  # the lookback while the watch has no `seen` set (what was posted is dropped)
SEEN_KEPT = LOOKBACK + DAY  # a paper given this long before `since` is out of every window
MAX_CANDIDATES = 500  # per query: five pages of arXiv's 100
DAY_SHARE = 100  # a new period's day a full first query did not reach: its newest page
MAX_SLICES = 15  # at most this many such queries a digest (a longer period gets longer slices)
TOP_N = 5
SAVED_COMPARED = 300  # the team's most recently saved papers that ranking compares against
TEXT_CHARS = 200  # of title and abstract embedded per paper: its gist (~40 tokens); the cost
# of an embedding grows with its length, and 500 candidates must rank within 2 s
CLOSENESS = ((0.75, "very close to"), (0.55, "close to"), (0.35, "loosely related to"))
# cosine -> how a saved paper's closeness is said; below the last, "nothing you saved is close"
TOPIC_WEIGHT = 0.65  # the rest goes to closeness to the team's saved papers
WHY_WORDS = 8  # the topic's shared words a paper's "why" names (an imported topic has hundreds)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9])")
_WORD = re.compile(r"[a-z0-9]+")


@dataclass
class DigestItem:
    paper: Candidate
    score: float
    why: str
    near: str = ""  # the title of the team's closest saved paper (any closeness)
    closeness: float = 0.0


@dataclass
class Digest:
    watch: Watch
    since: float
    until: float
    items: list[DigestItem] = field(default_factory=list)
    found: int = 0  # what arXiv gave that no earlier finished digest of the watch was given
    known: int = 0  # of those, dropped: in the knowledge base
    repeated: int = 0  # of those, dropped: shown by an earlier digest (posted before `seen`)
    earlier: int = 0  # what arXiv gave that an earlier finished digest was given (not in `found`)
    capped: bool = False  # a day of the new period had more papers than were read

    @property
    def arxiv_ids(self) -> list[str]:
        return [item.paper.arxiv_id for item in self.items]


def short_authors(authors: list[str], shown: int = 3) -> str:
    if not authors:
        return "unknown authors"
    names = ", ".join(authors[:shown])
    return names + (" et al." if len(authors) > shown else "")


def when(seconds: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(seconds))


def best_sentence(abstract: str, query: str, limit: int = 240) -> str:
    """The abstract's sentence sharing most words (or word starts) with the topic; the first
    sentence when none does."""
    sentences = [s.strip() for s in _SENTENCE.split(abstract or "") if s.strip()]
    if not sentences:
        return ""
    wanted = {w[:5] for w in _WORD.findall(query.lower()) if len(w) > 2}
    scores = [len(wanted & {w[:5] for w in _WORD.findall(s.lower())}) for s in sentences]
    best = sentences[int(np.argmax(scores))] if max(scores) else sentences[0]
    return shortened(best, limit)


def matched_words(paper: Candidate, query: str) -> list[str]:
    """The topic's words (or word starts) the paper's title or abstract has, in topic order."""
    have = {w[:5] for w in _WORD.findall(f"{paper.title} {paper.summary}".lower())}
    words = [w for w in _WORD.findall(query.lower()) if len(w) > 2 and w[:5] in have]
    return list(dict.fromkeys(words))


def closeness_phrase(similarity: float) -> str:
    return next((said for floor, said in CLOSENESS if similarity >= floor), "")


def _text(title: str, abstract: str) -> str:
    return f"{title}. {abstract}"[:TEXT_CHARS]


class DigestBuilder:
    def __init__(
        self, knowledge_base: KnowledgeBase, watches: WatchStore, embedder, arxiv: ArxivSource,
        top_n: int = TOP_N, max_candidates: int = MAX_CANDIDATES, day_share: int = DAY_SHARE,
    ) -> None:  # fmt: skip
        self.kb = knowledge_base
        self.watches = watches
        self.embedder = embedder
        self.arxiv = arxiv
        self.top_n = top_n
        self.max_candidates = max_candidates
        self.day_share = day_share

    async def build(
        self, watch: Watch, until: float, since: float | None = None, walled: bool = False,
        record: bool = True,
    ) -> Digest:  # fmt: skip
        """Ask arXiv, then rank (`since`: from then instead of the watch's own, with no
        lookback and what earlier digests were given not dropped, so an older window can be
        shown again; `walled`: its place is walled now, see `reader`). With `record` (a digest
        task, a terminal watch's run; never a preview), what arXiv gave is kept in the watch's
        `seen` set: once the digest is finished (`since` reaches `until`), a later one drops
        it."""
        again = since is not None
        if again:
            lookback = 0.0
        elif await self.watches.redis.exists(watch_seen_key(watch.tenant, watch.id)):
            lookback = LOOKBACK
        else:  # a new watch's first digest covers its period; an older watch's overlaps
            lookback = 0.0 if watch.since < watch.created_at else OVERLAP
        since = watch.since if since is None else since
        found, capped = await self.submitted(watch, since, until, lookback)
        digest = await self.rank(watch, found, since, until, walled, drop_seen=not again)
        digest.capped = capped
        if record:
            ids = list(dict.fromkeys(c.arxiv_id for c in found))
            await self.watches.given(watch, ids, until, min(since, watch.since) - SEEN_KEPT)
        return digest

    async def submitted(
        self, watch: Watch, since: float, until: float, lookback: float = LOOKBACK
    ) -> tuple[list[Candidate], bool]:
        """The watch's papers submitted in [since - lookback, until], and whether some of the
        new period [since, until] were not read. One query of MAX_CANDIDATES, newest first: if
        full, it read every paper submitted after its oldest paper's day, and only the new
        period's days up to that one are asked again, each its newest `day_share` (the lookback
        is the first query's alone: a broad watch costs a few queries, not one per day)."""
        ask = self.arxiv.submitted
        found = await ask(watch.query, since - lookback, until, watch.categories, watch.authors,
                          self.max_candidates)  # fmt: skip
        if len(found) < self.max_candidates:
            return found, False
        end = min(until, _day_after_oldest(found))
        width = max(DAY, (end - since) / MAX_SLICES)
        slices = min(MAX_SLICES, max(0, math.ceil((end - since) / width)))  # never an empty one
        capped = False
        for i in range(slices):
            part = await ask(watch.query, max(since, end - (i + 1) * width), end - i * width,
                             watch.categories, watch.authors, self.day_share)  # fmt: skip
            found += part
            capped = capped or len(part) >= self.day_share
        return found, capped

    async def rank(
        self, watch: Watch, candidates: list[Candidate], since: float, until: float,
        walled: bool = False, drop_seen: bool = True,
    ) -> Digest:  # fmt: skip
        """Drop what an earlier digest was given (unless not `drop_seen`), the known and the
        already posted, rank the rest, keep the best `top_n`."""
        unique = list({c.arxiv_id: c for c in candidates}.values())
        seen = await self.watches.seen(watch, [c.arxiv_id for c in unique]) if drop_seen else set()
        unique = [c for c in unique if c.arxiv_id not in seen]  # shown or not: not new
        posted = await self.watches.posted(watch, [c.arxiv_id for c in unique])
        digest = Digest(watch, since, until, found=len(unique), earlier=len(seen))
        saved = await self.kb.papers(reader(watch, walled))
        in_kb = {p["arxiv_id"] for p in saved}
        fresh = [c for c in unique if c.arxiv_id not in in_kb and c.arxiv_id not in posted]
        digest.known = sum(c.arxiv_id in in_kb for c in unique)
        digest.repeated = sum(c.arxiv_id in posted and c.arxiv_id not in in_kb for c in unique)
        if not fresh:
            return digest
        saved = saved[-SAVED_COMPARED:]
        topic = " ".join([watch.query, *watch.categories]).strip() or "new research papers"
        texts = [topic, *(_text(c.title, c.summary) for c in fresh)]
        texts += [_text(p.get("title", ""), p.get("abstract", "")) for p in saved]
        vectors = np.asarray(await self.embedder.embed(texts), dtype=np.float32)
        query, papers, team = vectors[0], vectors[1 : 1 + len(fresh)], vectors[1 + len(fresh) :]
        scores = papers @ query if watch.query else np.zeros(len(fresh), dtype=np.float32)
        nearest = np.full(len(fresh), -1, dtype=np.int64)
        closeness = np.zeros(len(fresh), dtype=np.float32)
        if len(team):
            similarity = papers @ team.T
            nearest = similarity.argmax(axis=1)
            centroid = team.mean(axis=0)
            centroid /= np.linalg.norm(centroid) or 1.0
            closeness = 0.5 * similarity.max(axis=1) + 0.5 * (papers @ centroid)
            weight = TOPIC_WEIGHT if watch.query else 0.0
            scores = weight * scores + (1 - weight) * closeness
        order = np.argsort(-scores, kind="stable")[: self.top_n]
        for i in order:
            paper, near, similarity = fresh[i], "", 0.0
            if nearest[i] >= 0:
                near = saved[nearest[i]].get("title") or saved[nearest[i]]["arxiv_id"]
                similarity = float(papers[i] @ team[nearest[i]])
            why = self.why(paper, watch, near, similarity)
            digest.items.append(DigestItem(paper, float(scores[i]), why, near, similarity))
        return digest

    @staticmethod
    def why(paper: Candidate, watch: Watch, near: str, similarity: float) -> str:
        """Why it matters to this team: its closest saved paper (said as close as it is), the
        topic's words it shares (the first WHY_WORDS, and how many more), and its key sentence."""
        phrase = closeness_phrase(similarity) if near else ""
        if phrase:
            team = f"{phrase[0].upper()}{phrase[1:]} your saved “{near}”"
        elif near:
            team = f"Nothing you saved is close (nearest: “{near}”)"
        else:
            team = "Nothing saved yet to compare it with"
        words = matched_words(paper, watch.query)
        more = len(words) - WHY_WORDS
        shown = ", ".join(words[:WHY_WORDS]) + (f" and {more} more" if more > 0 else "")
        on = f"; on {shown}" if words else ""
        sentence = best_sentence(paper.summary, watch.query)
        return f"{team}{on}: {sentence}" if sentence else f"{team}{on}."


def _day_after_oldest(papers: list[Candidate]) -> float:
    """The end of the UTC day the oldest of these papers was submitted on (arXiv gives a
    paper's day, not its time); infinity when no day is known."""
    days = []
    for paper in papers:
        with contextlib.suppress(ValueError):
            days.append(calendar.timegm(time.strptime(paper.published[:10], "%Y-%m-%d")))
    return min(days) + DAY if days else float("inf")


def capped_note(digest: Digest) -> str:
    """Said when arXiv had more papers than the digest read: not all of them were ranked."""
    if not digest.capped:
        return ""
    return (
        "arXiv had more papers than a digest reads: busy days were cut to their newest "
        "papers, so some were not looked at (a narrower topic gets them all)."
    )


def digest_text(digest: Digest) -> str:
    """The digest as plain text (the terminal's)."""
    watch = digest.watch
    note = capped_note(digest)
    if not digest.items:
        return (
            f"Nothing new on “{watch.query or ', '.join(watch.categories)}” since "
            f"{when(digest.since)} ({digest.found + digest.earlier} found: {digest.known} "
            f"already saved, {digest.repeated} already shown, {digest.earlier} in an earlier "
            "digest)." + (f" {note}" if note else "")
        )
    lines = [
        f"New on “{watch.query or ', '.join(watch.categories)}” since {when(digest.since)}: "
        f"{len(digest.items)} of {digest.found} papers" + (f". {note}" if note else "")
    ]
    for n, item in enumerate(digest.items, 1):
        paper = item.paper
        lines += [
            "",
            f"{n}. {paper.title}",
            f"   {short_authors(paper.authors)} · arXiv:{paper.arxiv_id} · {paper.published}",
            f"   {item.why}",
            f"   {paper.url or 'https://arxiv.org/abs/' + paper.arxiv_id}",
        ]
    return "\n".join(lines)


def reader(watch: Watch, walled: bool = False) -> Scope:
    """The watch's place as a reader of the saved papers its digest names. A public channel's
    is the team's, unless it is `walled` now (the platform's poster says so: shared with
    another organisation since the watch was made, or not known); any other place (a private
    channel, a DM, a shared channel: a watch does not tell them apart) reads the team's arXiv
    papers and its own shared PDFs, never a PDF shared in a public channel
    (memory/stores/knowledge_base.py)."""
    kind, _, place = watch.audience.partition(":")
    if kind != PUBLIC and place:
        return Scope(watch.tenant, channel=place, visibility=Visibility(kind), walled=True)
    if walled:  # a walled scope is its channel's private memory (memory/scope.py)
        return Scope(watch.tenant, channel=watch.channel, walled=True)
    return Scope(watch.tenant)
