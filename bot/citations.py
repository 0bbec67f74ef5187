"""Citations: an answer that rests on knowledge-base passages cites them, and lists its sources.

Every passage the model is shown in a turn (the Knowledge Base segment, tool results) carries a
number from the turn's `SourceRegistry`; the model cites them inline, as [1], [1, 3] or [2-4].
After the loop `cite` drops the citations to numbers the model was not shown (it made them up),
counts them, and appends the Sources list of the cited passages in the order they are first
cited, each with its paper, section, page and a link (the arXiv abs page; a PDF's page).

An answer that cites no number but names a paper and rests on its passages still gets that
paper listed (`add_citations`): a paper counts as used when the answer names it (arXiv id,
title, or the short title before a colon, as whole words; the id in any version) and shares at
least `MIN_SHARED_WORDS` content words with its passages; naming a paper is not resting on it.

A bracketed paper id, "[arXiv:2310.08560]", becomes a link to the paper when delivered
(adapters/text.py `link_arxiv`); it stays bracketed only for a paper the turn showed (a passage,
a tool's search result or saved paper, `SourceRegistry.show_paper`), else it is left as plain
text, "arXiv:2401.99999": a made-up id is never a link, while streaming either.

A bracket of numbers is a citation only where a citation stands (`is_citation`): "[0, 1]",
"shape [2, 3]" and "equation [3]" are left as written, and with no passage shown nothing is.
While the answer streams, `CitationStream` holds a bracket back until it can tell, so a made-up
citation is never shown, not even for a moment.

The answer is stored as delivered, its numbers with the Sources list under them: a later turn
reads an old "[1]" beside the list that says what it was, and numbers its own passages afresh
(the prompt asks for citations of this turn's numbers only). Renumbering stored answers would
make the remembered text differ from what the user read.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

from bot.llm import DeltaCallback
from memory.links import web_link
from memory.stores.knowledge_base import Passage, base_arxiv_id, is_arxiv_id
from memory.stores.stopwords import STOPWORDS

MIN_SHARED_WORDS = 3
MAX_RANGE = 50  # a wider "[n-m]" is read as its two ends, not as every number between

HOLD_CHARS = 40  # a streamed "[" not closed as a citation within this many characters is text

# [1], [1, 3], [2-4], [1; 2–3]: positive numbers of one to three digits on one line (not "[0, 1]",
# not a bracketed year), not an index ("x[1]"), not followed by a word ("[1]st"), a Markdown
# link's text ("[1](…)") or a link reference ("[1]: https://…"). `is_citation` then looks at the
# words before it.
_NUMBER = r"[1-9]\d{0,2}"
_ITEM = rf"{_NUMBER}(?:[ \t]*[-–][ \t]*{_NUMBER})?"
_CITATION = re.compile(
    rf"(?P<space>[ \t]*)(?<![\w\[])\[(?P<items>{_ITEM}(?:[ \t]*[,;][ \t]*{_ITEM})*)\]"
    r"(?![\w(]|:\s*(?:https?://|<))"
)
_INSIDE = re.compile(r"\[[\d \t,;\-–]*(?P<close>\])?")  # a bracket as far as a citation's


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


_INTERVAL = re.compile(rf"(?P<a>{_NUMBER})[ \t]*,[ \t]*(?P<b>{_NUMBER})")
# Nouns whose bracket names a thing, not a source: "shape [2, 3]", "equation [3]", "Fig. [2]".
_NAMING = _words(
    """shape shapes size sizes dimension dimensions dim dims index indices indexes range ranges
    interval intervals equation equations eq eqs eqn formula formulas table tables tab figure
    figures fig figs step steps section sections sec chapter chapters appendix page pages pp
    line lines row rows column columns col cols item items entry entries element elements
    algorithm alg theorem thm lemma corollary definition proposition example exercise listing
    version epoch epochs iteration iterations axis axes array arrays vector vectors matrix
    matrices tensor tensors tuple tuples"""
)
_ABBREVIATIONS = _words("eq eqs eqn fig figs sec secs tab no nos p pp ch alg thm def ex")
# After these, "[a, b]" with a < b may be an interval ("lie in [2, 5]") or two sources ("as
# shown in [1, 2]"): it is read as citations only if both numbers were shown.
_PREPOSITIONS = _words("in into to within between from on onto over at across of")
_BEFORE = re.compile(r"(?:(?P<word>[A-Za-z]+)(?P<dot>\.)?|(?P<symbol>[=≈≠∈∉<>≤≥×/+^]))[ \t]*\Z")
# A passage as `KnowledgeBase.segment` shows it (numbered, or from before numbers).
_PASSAGE = re.compile(
    r"^(?:\[\d+\] )?\[(?:arXiv|PDF):(?P<id>[^\]\n]+)\] (?P<title>[^\n]+?)"
    r"(?: \((?P<year>\d{4})\))?"
    r"(?: — section: (?P<section>[^\n]*?))?(?: — page (?P<page>\d+))? — chunk (?P<chunk>\d+)\n"
    r"Link: (?P<url>[^\n]*)\n(?P<content>.*?)(?=\n\n(?:\[\d+\] )?\[(?:arXiv|PDF):|\Z)",
    re.MULTILINE | re.DOTALL,
)
# "[arXiv:2310.08560]" as adapters/text.py `link_arxiv` links it, and the start of one streaming.
_ARXIV_CITATION = re.compile(r"\[arXiv:(?P<id>\d{4}\.\d{4,5}(?:v\d+)?)\](?!\()")
_ARXIV_OPENING = "[arXiv:"
# A new-style arXiv id anywhere in a text ("arXiv:2310.08560", "arxiv.org/abs/2310.08560v2").
_SHOWN_ID = re.compile(
    r"(?<![\d.])(?P<id>\d{2}(?:0[1-9]|1[0-2])\.\d{4,5})(?:v\d+)?(?![\d.]\d)(?P<url>)"
)
# A paper an earlier answer cited or linked: "[arXiv:2310.08560]", "arxiv.org/abs/2310.08560".
_CITED_ID = re.compile(
    r"\[arXiv:(?P<id>\d{4}\.\d{4,5})(?:v\d+)?\]|arxiv\.org/(?:abs|pdf)/(?P<url>\d{4}\.\d{4,5})"
)
SOURCES_HEADING = "Sources:"  # above the list under an answer (adapters/text.py keeps it whole)
_ENDS = frozenset(" \t\n.,;:!?)")  # what may follow a removed citation without its space
_CODE = re.compile(r"```.*?(?:```|\Z)|`[^`\n]*`", re.DOTALL)


def content_words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z][a-z\-]{3,}", text.lower()) if w not in STOPWORDS}


def passage_link(passage: Passage) -> str:
    """A paper from arXiv: its abs page. A PDF with an address: that address, at the page.
    Only a web address (`web_link`): never a `file://` one (a server path, stored for local
    PDFs before they had no link)."""
    url = passage.url
    if is_arxiv_id(passage.arxiv_id) and (not url or "arxiv.org/" in url):
        return f"https://arxiv.org/abs/{base_arxiv_id(passage.arxiv_id)}"
    url = web_link(url)
    if not url:
        return ""
    url = url.split("#", 1)[0]
    return f"{url}#page={passage.page}" if passage.page else url


def _markdown_text(text: str) -> str:
    return text.replace("[", "(").replace("]", ")").replace("\n", " ").strip()


@dataclass(frozen=True)
class Source:
    """A source listed under an answer: a cited passage (`number`), or a paper the answer named
    without citing a number (`number` None, no section or page)."""

    number: int | None
    arxiv_id: str
    title: str
    link: str
    section: str = ""
    page: int | None = None
    chunk_index: int | None = None

    @classmethod
    def of(cls, number: int | None, passage: Passage) -> Source:
        return cls(
            number, passage.arxiv_id, passage.title, passage_link(passage), passage.section,
            passage.page, passage.chunk_index,
        )  # fmt: skip

    def line(self, listed: Sequence[Source] = ()) -> str:
        """`- [1] [Title](link) — §Section — p. 4` (section, page and link where known), and
        `— chunk 7` when another source of `listed` (the list it is in) reads the same without
        it: two passages of one paper, their pages unknown, would else be told by number only."""
        parts = self._parts()
        alike = any(o.number != self.number and o._parts() == parts for o in listed)
        if alike and self.number is not None and self.chunk_index is not None:
            parts.append(f"chunk {self.chunk_index}")
        number = f"[{self.number}] " if self.number is not None else ""
        return f"- {number}{' — '.join(parts)}"

    def _parts(self) -> list[str]:
        title = _markdown_text(self.title) or self.arxiv_id
        parts = [f"[{title}]({self.link})" if self.link else title]
        if self.section and self.number is not None:
            parts.append(f"§{_markdown_text(self.section)}")
        if self.page and self.number is not None:
            parts.append(f"p. {self.page}")
        return parts


class SourceRegistry:
    """The passages shown to the model in one turn, each with its number.

    The same chunk shown twice keeps its first number. The Knowledge Base segment numbers its
    passages 1, 2, … in order, so a registry started from them (`SourceRegistry(passages)`)
    agrees with what the context shows; tools number what they show through `number`.
    """

    def __init__(self, passages: Iterable[Passage] = ()) -> None:
        self._numbers: dict[tuple[str, int], int] = {}
        self._passages: dict[int, Passage] = {}
        self._papers: set[str] = set()  # base ids of papers shown without passages
        self.numbers(list(passages))

    def number(self, passage: Passage) -> int:
        key = (base_arxiv_id(passage.arxiv_id), passage.chunk_index)
        if key not in self._numbers:
            self._numbers[key] = len(self._numbers) + 1
            self._passages[self._numbers[key]] = passage
        return self._numbers[key]

    def numbers(self, passages: list[Passage]) -> list[int]:
        return [self.number(p) for p in passages]

    def renumber(self, text: str) -> str:
        """Passages shown under another turn's numbers (a tool log read again), under this
        turn's: the model cites what it reads by the numbers this turn checks."""

        def one(match: re.Match[str]) -> str:
            year, page = match["year"], match["page"]
            passage = Passage(
                match["id"], match["title"], match["section"] or "", int(match["chunk"]),
                match["content"], match["url"], int(year) if year else None, 0.0,
                page=int(page) if page else None,
            )  # fmt: skip
            header = re.sub(r"^\[\d+\] ", "", match[0])  # without its old number
            return f"[{self.number(passage)}] {header}"

        return _PASSAGE.sub(one, text)

    def get(self, number: int) -> Passage | None:
        return self._passages.get(number)

    def show_paper(self, arxiv_id: str) -> None:
        """A paper a tool showed by its id (a search result, a saved paper): it may be cited as
        "[arXiv:id]" and linked."""
        self._papers.add(base_arxiv_id(arxiv_id))

    def show_papers_in(self, text: str, bare: bool = False) -> None:
        """The papers `text` shows the model (its memory, a tool's result): those an earlier
        answer cited ("[arXiv:id]", bracketed only if shown then) or linked; with `bare` (the
        person's question) any id, "2310.08560". The answer may cite them as "[arXiv:id]"."""
        for found in (_SHOWN_ID if bare else _CITED_ID).finditer(text):
            self.show_paper(found["id"] or found["url"])

    def shows_paper(self, arxiv_id: str) -> bool:
        base = base_arxiv_id(arxiv_id)
        return base in self._papers or any(base_arxiv_id(k) == base for k, _ in self._numbers)

    @property
    def passages(self) -> list[Passage]:
        return list(self._passages.values())

    def __len__(self) -> int:
        return len(self._passages)


@dataclass
class CitedAnswer:
    """The answer as delivered: unshown citations removed, the Sources list appended."""

    text: str
    sources: list[Source] = field(default_factory=list)
    removed: int = 0  # citations to numbers the model was not shown, taken out


def is_citation(match: re.Match[str], registry: SourceRegistry) -> bool:
    """Whether a `_CITATION` match stands where a citation does, after a claim: not after a
    naming noun ("shape [2, 3]", "Eq. [3]") or a math sign ("x = [1, 2]"); after a preposition,
    an interval "[a, b]" (a < b) only if both numbers were shown ("in [1, 2]" cites; "lie in
    [2, 5]" with fewer passages shown is an interval)."""
    before = _BEFORE.search(match.string[max(0, match.end("space") - 40) : match.end("space")])
    if before is None:
        return True
    if before["symbol"]:
        return False
    word = before["word"].lower()
    if before["dot"]:  # "Fig. [2]"; after any other word the dot ends a sentence
        return word not in _ABBREVIATIONS
    if word in _NAMING:
        return False
    interval = _INTERVAL.fullmatch(match["items"].strip())
    if word in _PREPOSITIONS and interval and int(interval["a"]) < int(interval["b"]):
        return all(registry.get(int(n)) is not None for n in (interval["a"], interval["b"]))
    return True


@dataclass
class _Rewrite:
    """One citation as delivered: kept, narrowed to its shown numbers, or removed."""

    registry: SourceRegistry
    cited: list[int] = field(default_factory=list)
    removed: int = 0

    def __call__(self, match: re.Match[str]) -> str:
        if not len(self.registry) or not is_citation(match, self.registry):
            return match[0]
        numbers = _numbers(match["items"])
        kept = [n for n in dict.fromkeys(numbers) if self.registry.get(n) is not None]
        self.removed += sum(1 for n in numbers if self.registry.get(n) is None)
        self.cited.extend(n for n in kept if n not in self.cited)
        if len(kept) == len(numbers):
            return match[0]
        if kept:
            return f"{match['space']}[{_compact(kept)}]"
        following = match.string[match.end() : match.end() + 1]
        return "" if not following or following in _ENDS else match["space"]


def unlinked_paper(match: re.Match[str], registry: SourceRegistry) -> str:
    """A `_ARXIV_CITATION` as delivered: bracketed (to be linked) only if the turn showed it."""
    return match[0] if registry.shows_paper(match["id"]) else f"arXiv:{match['id']}"


def cite(answer: str, registry: SourceRegistry) -> CitedAnswer:
    """Keep the answer's citations to shown passages, remove the others (counted), list the
    cited passages; an answer that cites none gets the papers it rests on (`add_citations`).
    A bracketed id of a paper not shown is unbracketed (`unlinked_paper`). With no passage
    shown the numbers are left as written: its brackets cannot be citations."""
    answer = _outside_code(
        answer, lambda part: _ARXIV_CITATION.sub(lambda m: unlinked_paper(m, registry), part)
    )
    if not len(registry):
        return CitedAnswer(answer)
    rewrite = _Rewrite(registry)
    text = _outside_code(answer, lambda part: _CITATION.sub(rewrite, part))
    text = re.sub(r"[ \t]+\n", "\n", text).strip() if rewrite.removed else text
    if not rewrite.cited:
        sources = named_sources(text, registry.passages)
        return CitedAnswer(_with_sources(text, sources), sources, rewrite.removed)
    sources = [Source.of(n, p) for n in rewrite.cited if (p := registry.get(n)) is not None]
    return CitedAnswer(_with_sources(text, sources), sources, rewrite.removed)


class CitationStream:
    """`on_delta` as the model streams its reply, with the citations `cite` would remove left
    out: a made-up "[7]" must not be seen while the answer grows, not only in the final text.

    Text from a "[" (and the spaces before it) is held until the bracket closes and the next
    character is known, then goes through `cite`'s rule with the registry as it is then (the
    final answer streams after every tool call, so its registry is complete). A bracket that
    cannot be a citation (a letter or a line end inside, longer than `HOLD_CHARS`) is released
    as text as soon as that shows. `flush` ends one model reply: what is held goes out, and the
    next reply starts afresh, as `cite` reads the final reply alone.
    """

    def __init__(self, registry: SourceRegistry, on_delta: DeltaCallback) -> None:
        self.registry, self.on_delta = registry, on_delta
        self._text = ""  # the reply so far
        self._done = 0  # characters of `_text` released (or dropped)

    async def __call__(self, piece: str) -> None:
        self._text += piece
        await self._send(self._release(final=False))

    async def flush(self) -> None:
        await self._send(self._release(final=True))
        self._text, self._done = "", 0

    async def _send(self, text: str) -> None:
        if text:
            result = self.on_delta(text)
            if inspect.isawaitable(result):
                await result

    def _release(self, final: bool) -> str:
        text, out = self._text, []
        while self._done < len(text):
            bracket = text.find("[", self._done)
            if bracket < 0:  # trailing spaces wait: a citation may follow them
                end = len(text) if final else max(self._done, len(text.rstrip(" \t")))
                out.append(text[self._done : end])
                self._done = end
                break
            start = max(self._done, len(text[:bracket].rstrip(" \t")))
            out.append(text[self._done : start])
            self._done = start
            decided = self._bracket(start, bracket, final)
            if decided is None:
                break
            shown, self._done = decided
            out.append(shown)
        return "".join(out)

    def _bracket(self, start: int, bracket: int, final: bool) -> tuple[str, int] | None:
        """What the text from `start` (spaces, then "[" at `bracket`) becomes, up to where;
        None while that cannot be told yet."""
        text = self._text
        as_text = (text[start : bracket + 1], bracket + 1)
        if any(block.start() <= bracket < block.end() for block in _CODE.finditer(text)):
            return as_text
        if text.startswith(_ARXIV_OPENING[:2], bracket):
            return self._paper_bracket(start, bracket, final)
        shape = _INSIDE.match(text, bracket)
        if shape["close"] is None:  # still open, or a character no citation has
            open_ = shape.end() == len(text) and shape.end() - bracket < HOLD_CHARS
            return None if open_ and not final else as_text
        if not final and not _settled(text[shape.end() :]):
            return None
        match = _CITATION.match(text, start)
        if match is None or match.end() != shape.end():
            return as_text
        return _Rewrite(self.registry)(match), match.end()

    def _paper_bracket(self, start: int, bracket: int, final: bool) -> tuple[str, int] | None:
        """`_bracket` for a "[a…" that may be a paper's id: as `cite` delivers it, once known."""
        text = self._text
        match = _ARXIV_CITATION.match(text, bracket)
        if match is not None and (final or match.end() < len(text)):
            return text[start:bracket] + unlinked_paper(match, self.registry), match.end()
        tail = text[bracket:]
        growing = _ARXIV_OPENING.startswith(tail) or (
            tail.startswith(_ARXIV_OPENING) and re.fullmatch(r"[\d.v\]]*", tail[7:]) is not None
        )
        if growing and len(tail) < HOLD_CHARS and not final:
            return None
        return text[start : bracket + 1], bracket + 1


def _settled(tail: str) -> bool:
    """Whether `tail`, after a closed bracket, tells a citation from a link reference."""
    if len(tail) > HOLD_CHARS or tail[:1] not in (":", ""):
        return True
    rest = tail[1:].lstrip()
    return bool(tail) and not any(u.startswith(rest) and u != rest for u in ("http://", "https://"))


def _numbers(items: str) -> list[int]:
    numbers: list[int] = []
    for item in re.split(r"\s*[,;]\s*", items.strip()):
        ends = [int(x) for x in re.split(r"\s*[-–]\s*", item)]
        if len(ends) == 2 and 0 <= ends[1] - ends[0] <= MAX_RANGE:
            numbers += range(ends[0], ends[1] + 1)
        else:
            numbers += ends
    return numbers


def _compact(numbers: list[int]) -> str:
    """[1, 2, 3, 5] -> "1-3, 5": runs of three or more as ranges."""
    parts: list[str] = []
    run: list[int] = []
    for n in [*numbers, None]:
        if run and n is not None and n == run[-1] + 1:
            run.append(n)
            continue
        if run:
            parts += [f"{run[0]}-{run[-1]}"] if len(run) >= 3 else [str(r) for r in run]
        run = [n] if n is not None else []
    return ", ".join(parts)


def _outside_code(text: str, change) -> str:
    """`change` applied to the text outside code blocks and code spans."""
    out, position = [], 0
    for block in _CODE.finditer(text):
        out += [change(text[position : block.start()]), block[0]]
        position = block.end()
    out.append(change(text[position:]))
    return "".join(out)


def _with_sources(text: str, sources: list[Source]) -> str:
    if not sources:
        return text
    return f"{text.rstrip()}\n\n{SOURCES_HEADING}\n" + "\n".join(s.line(sources) for s in sources)


@dataclass(frozen=True)
class _Paper:
    """One paper and the text of its shown passages, for the named-and-supported check."""

    passage: Passage
    content: str

    def named_in(self, text: str) -> bool:
        pattern = _names_pattern(self.passage.arxiv_id, self.passage.title)
        return pattern is not None and pattern.search(text) is not None

    def supports(self, answer: str) -> bool:
        title = content_words(self.passage.title)
        shared = (content_words(answer) & content_words(self.content)) - title
        return len(shared) >= MIN_SHARED_WORDS

    def linked_in(self, text: str) -> bool:
        arxiv_id = self.passage.arxiv_id
        return bool(self.passage.url and self.passage.url in text) or (
            f"arxiv.org/abs/{arxiv_id}" in text
        )


@lru_cache(maxsize=1024)  # per paper (id, title): the same papers come back turn to turn
def _names_pattern(arxiv_id: str, title: str) -> re.Pattern[str] | None:
    """The ways an answer names a paper: its id (any version), its title, the short title before
    a colon; each as whole words in any case, so "RAG" is not named by "storage", nor "LoRA" by
    "exploration", nor "GPT-4" by "GPT-4o" or "GPT-4.5"."""
    short = title.split(":")[0].strip()
    names = [title] + ([short] if len(short) >= 3 else [])
    parts = [_whole_words(name) for name in names if name.strip()]
    paper_id = base_arxiv_id(arxiv_id) if is_arxiv_id(arxiv_id) else arxiv_id.strip()
    if paper_id:
        parts.append(_whole_words(paper_id, version=True))
    return re.compile("|".join(parts), re.IGNORECASE) if parts else None


def _whole_words(name: str, version: bool = False) -> str:
    """A pattern for `name` not inside a longer word: a letter or digit on its edge may not be
    continued by another (nor a number by ".5"); "(RAG)", "RAG's", "RAG-based" and "_RAG_"
    (Markdown italics) name it. Its words may be spaced as the answer spaces them (a title
    across a line break)."""
    name = name.strip()
    body = r"\s+".join(re.escape(word) for word in name.split())
    if version:  # "2005.11401v2" names 2005.11401
        body += r"(?:v\d+)?"
    first, last = _continuing(name[0]), _continuing(name[-1])
    before = f"(?<!{first})" if first else ""
    after = rf"(?!{last}|\.\d)" if last else ""
    return f"{before}(?:{body}){after}"


def _continuing(edge: str) -> str:
    """The characters that would continue a name past its `edge` character into a longer word
    ("" for an edge that is no letter or digit). A Latin name stands against CJK or Korean
    letters unspaced ("使用RAG的", "BERT는"): only an ASCII letter or digit continues it."""
    if edge.isascii() and edge.isalnum():
        return "[A-Za-z0-9]"
    return r"[^\W_]" if re.match(r"[^\W_]", edge) else ""


def named_sources(answer: str, passages: list[Passage]) -> list[Source]:
    """The papers the answer names and rests on but does not link, one source each."""
    papers: dict[str, _Paper] = {}
    for p in passages:  # one per paper, with all its passages' text
        known = papers.get(p.arxiv_id)
        papers[p.arxiv_id] = _Paper(known.passage, f"{known.content} {p.content}") if known else (
            _Paper(p, p.content)
        )  # fmt: skip
    return [
        Source(None, p.passage.arxiv_id, p.passage.title, passage_link(p.passage))
        for p in papers.values()
        if p.named_in(answer) and p.supports(answer) and not p.linked_in(answer)
    ]


def add_citations(answer: str, passages: list[Passage]) -> str:
    """The answer with a Sources list of the papers it names and rests on, if any."""
    return _with_sources(answer, named_sources(answer, passages))
