"""Text of a PDF as (section, paragraph) pairs, each with its page, with pypdfium2.

PDF text comes as positioned lines with no paragraph structure, so paragraphs are rebuilt with
cheap heuristics: blank lines, a short line that ends a sentence, and numbered headings such as
"2 Related Work" (which also name the section of the paragraphs that follow).

A PDF is not trusted: its page count is checked before any page is read, and extraction stops
once the text passes a budget, since pages may share one compressed content stream (a 49 KB
file can hold 150 MB of text). Read untrusted PDFs in a child process (memory/ingest/
pdf_child.py), which also bounds memory and time.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pypdfium2 as pdfium

from memory.ingest.clean import clean_extracted_text
from memory.ingest.errors import IngestError

# Text budget per page a PDF may have (max_pages): a dense two-column page of a paper holds
# 5,000-7,000 characters (7,300 at most in the 49 papers of the unarXive sample); the longest
# of them, 306,000 characters, is a tenth of the budget at 300 pages (3,000,000).
MAX_CHARS_PER_PAGE = 10_000
# Passages per page a PDF may have: the sample's papers make one per 560 characters (383 at
# the densest), 556 at most; 6,000 at 300 pages, for the embedding API and the store.
MAX_CHUNKS_PER_PAGE = 20

_HEADING = re.compile(r"^(\d{1,2}(?:\.\d{1,2}){0,2})\.?\s+([A-Z][A-Za-z][^\n]{0,70})$")
_NAMED_HEADINGS = frozenset(
    {"abstract", "introduction", "background", "related work", "conclusion", "conclusions",
     "discussion", "references", "acknowledgments", "acknowledgements", "appendix"}
)  # fmt: skip
_SENTENCE_END = (".", "?", "!", ":")
_SOFT_HYPHENS = re.compile("[\u00ad\x02\ufffe]\n")


@dataclass
class PdfText:
    title: str = ""
    pages: int = 0
    paragraphs: list[tuple[str, str]] = field(default_factory=list)
    paragraph_pages: list[int] = field(default_factory=list)  # 1-based, one per paragraph

    def located(self) -> list[tuple[str, str, int]]:
        """(section, paragraph, page) triples, as `chunk_paragraphs` takes them."""
        return [(s, t, p) for (s, t), p in zip(self.paragraphs, self.paragraph_pages, strict=True)]


def text_budget(max_pages: int | None) -> int | None:
    """The characters read from a PDF of up to `max_pages` pages (None: no limit)."""
    return None if max_pages is None else MAX_CHARS_PER_PAGE * max_pages


def chunk_budget(max_pages: int | None) -> int | None:
    """The passages stored from a PDF of up to `max_pages` pages (None: no limit)."""
    return None if max_pages is None else MAX_CHUNKS_PER_PAGE * max_pages


def check_passages(name: str, passages: int, max_pages: int | None) -> None:
    """Refuse a PDF whose text makes more passages than its pages allow (`chunk_budget`): the
    one check of every way a PDF is stored (a paper's, a shared file's)."""
    most = chunk_budget(max_pages)
    if most is not None and passages > most:
        raise IngestError(
            f"{name}: its text makes {passages:,} passages, and I store up to {most:,} from "
            "one PDF."
        )


def read_pdf(
    source: str | Path | bytes, name: str | None = None, max_pages: int | None = None,
    max_chars: int | None = None, on_page: Callable[[int], None] | None = None,
) -> PdfText:  # fmt: skip
    """Open a PDF (path or bytes) and extract its title and (section, paragraph) pairs.

    `name` labels the PDF in error messages (default: the path, or "PDF data"). A PDF of more
    than `max_pages` pages is refused before any page is read, and one whose text passes
    `max_chars` (default: `text_budget(max_pages)`) as soon as it does (IngestError).
    `on_page(index)` is told of each page about to be read.
    """
    if name is None:
        name = "PDF data" if isinstance(source, bytes | bytearray) else str(source)
    if isinstance(source, bytes | bytearray):
        data = bytes(source)
    else:
        try:
            data = Path(source).read_bytes()
        except OSError as exc:
            raise IngestError(f"{name}: cannot read the file ({exc.strerror or exc}).") from exc
    if not data.lstrip()[:5].startswith(b"%PDF"):
        raise IngestError(f"{name}: not a PDF file (it does not start with %PDF).")
    try:
        doc = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        reason = "it is encrypted" if "password" in str(exc).lower() else str(exc).rstrip(".")
        raise IngestError(f"{name}: cannot open the PDF ({reason}).") from exc
    if max_chars is None:
        max_chars = text_budget(max_pages)
    try:
        count = len(doc)
        if max_pages is not None and count > max_pages:
            raise IngestError(f"{name}: it has {count} pages, and I read up to {max_pages}.")
        title = clean_extracted_text(doc.get_metadata_value("Title") or "").strip()
        pages: list[str] = []
        read = 0
        for index in range(count):
            if on_page is not None:
                on_page(index)
            pages.append(_page_text(doc, index))
            read += len(pages[-1])
            if max_chars is not None and read > max_chars:
                raise IngestError(
                    f"{name}: it holds more text than I read from one PDF (over {max_chars:,} "
                    f"characters by page {index + 1} of {count})."
                )
    except pdfium.PdfiumError as exc:
        raise IngestError(f"{name}: cannot extract the text ({exc}).") from exc
    finally:
        doc.close()
    located = _paragraphs(pages)
    if not located:
        raise IngestError(
            f"{name}: no extractable text in {len(pages)} pages (a scanned PDF needs OCR first)."
        )
    return PdfText(
        title=title, pages=len(pages), paragraphs=[(s, t) for s, t, _ in located],
        paragraph_pages=[p for _, _, p in located],
    )  # fmt: skip


def pdf_paragraphs(source: str | Path | bytes, name: str | None = None) -> list[tuple[str, str]]:
    """The (section, paragraph) pairs of a PDF; section is "" until a heading is seen."""
    return read_pdf(source, name).paragraphs


def _page_text(doc: pdfium.PdfDocument, index: int) -> str:
    page = doc[index]
    try:
        textpage = page.get_textpage()
        try:
            return textpage.get_text_range()
        finally:
            textpage.close()
    finally:
        page.close()


def _heading(line: str) -> str | None:
    """The section name if `line` looks like a section heading."""
    if len(line) > 80 or line.endswith((".", ",", ";")):
        return None
    if line.lower().rstrip(":") in _NAMED_HEADINGS:
        return line.rstrip(":")
    match = _HEADING.match(line)
    if not match or len(match.group(2).split()) > 10:
        return None
    words = match.group(2)
    letters = sum(c.isalpha() for c in words)
    return line if letters >= 0.7 * len(words.replace(" ", "")) else None


def _paragraphs(pages: list[str]) -> list[tuple[str, str, int]]:
    """(section, paragraph, page) triples; a paragraph never spans a page break."""
    section = ""
    out: list[tuple[str, str, int]] = []
    current: list[str] = []

    def flush(page: int) -> None:
        if current:
            text = " ".join(current).strip()
            if text:
                out.append((section, text, page))
            current.clear()

    for number, raw in enumerate(pages, start=1):
        text = clean_extracted_text(raw.replace("\r\n", "\n").replace("\r", "\n"))
        text = _SOFT_HYPHENS.sub("", text)
        lines = [line.strip() for line in text.split("\n")]
        lengths = sorted(len(line) for line in lines if line)
        typical = lengths[int(len(lengths) * 0.8)] if lengths else 0
        for line in lines:
            if not line:
                flush(number)
                continue
            heading = _heading(line)
            if heading is not None:
                flush(number)
                section = heading
                continue
            if current and current[-1].endswith("-") and line[:1].islower():
                current[-1] = current[-1][:-1] + line  # dehyphenate a word broken at line end
            else:
                current.append(line)
            if line.endswith(_SENTENCE_END) and len(line) < 0.8 * typical:
                flush(number)
        flush(number)  # a page break ends a paragraph; chunking packs them together again
    return out
