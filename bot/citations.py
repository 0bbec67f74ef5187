"""Citations: an answer that rests on knowledge-base passages names them (id, title, link).

The model is asked to cite; this makes sure of it. A paper counts as used when the answer
names it (arXiv id, title, or the short title before a colon) and shares at least
`MIN_SHARED_WORDS` content words with its passages: naming a paper is not resting on it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from memory.stores.knowledge_base import Passage
from memory.stores.stopwords import STOPWORDS

MIN_SHARED_WORDS = 3

# The passage header that KnowledgeBase.segment writes, as it reaches the model in tool results.
_PASSAGE_HEADER = re.compile(
    r"^\[arXiv:(?P<id>[^\]]+)\] (?P<title>.+?)(?: \(\d{4}\))?(?: — section: .*?)? — chunk \d+\n"
    r"Link: (?P<url>\S+)\n(?P<content>.*?)(?=\n\n\[arXiv:|\Z)",
    re.MULTILINE | re.DOTALL,
)


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z][a-z\-]{3,}", text.lower()) if w not in STOPWORDS}


@dataclass(frozen=True)
class Source:
    arxiv_id: str
    title: str
    url: str
    content: str = ""

    def line(self) -> str:
        return f"- [arXiv:{self.arxiv_id}] {self.title} — {self.url}"

    def named_in(self, text: str) -> bool:
        lowered = text.lower()
        short = self.title.split(":")[0].strip()
        names = [self.arxiv_id, self.title] + ([short] if len(short) >= 3 else [])
        return any(name.lower() in lowered for name in names if name)

    def supports(self, answer: str) -> bool:
        shared = (content_words(answer) & content_words(self.content)) - content_words(self.title)
        return len(shared) >= MIN_SHARED_WORDS

    def linked_in(self, text: str) -> bool:
        return self.url in text or f"arxiv.org/abs/{self.arxiv_id}" in text


def sources_from_passages(passages: list[Passage]) -> list[Source]:
    return [Source(p.arxiv_id, p.title, p.url, p.content) for p in passages]


def sources_from_text(text: str) -> list[Source]:
    return [
        Source(m["id"], m["title"], m["url"], m["content"]) for m in _PASSAGE_HEADER.finditer(text)
    ]


def add_citations(answer: str, sources: list[Source]) -> str:
    by_paper: dict[str, Source] = {}
    for s in sources:  # one source per paper, with all its passages' text
        known = by_paper.get(s.arxiv_id)
        by_paper[s.arxiv_id] = (
            Source(s.arxiv_id, s.title, s.url, f"{known.content} {s.content}") if known else s
        )
    missing = [
        s for s in by_paper.values()
        if s.named_in(answer) and s.supports(answer) and not s.linked_in(answer)
    ]  # fmt: skip
    if not missing:
        return answer
    return answer.rstrip() + "\n\nSources:\n" + "\n".join(s.line() for s in missing)
