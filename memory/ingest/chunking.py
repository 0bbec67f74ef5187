"""Token-based chunking that keeps sections apart and packs whole paragraphs.

Chunks are built on token ids (each paragraph is encoded once, in a multithreaded batch) and
decoded back at the end, so the hot path is list slicing rather than repeated re-tokenising.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import groupby

from memory.ingest.clean import clean_extracted_text
from memory.stores.knowledge_base import Chunk

__all__ = ["Paragraph", "chunk_paragraphs"]


def _encode_all(encoding, texts: list[str]) -> list[list[int]]:
    batch = getattr(encoding, "encode_ordinary_batch", None)
    if batch is not None:
        return batch(texts)
    return [encoding.encode_ordinary(t) for t in texts]


Paragraph = tuple[str, str] | tuple[str, str, int | None]  # (section, text[, page])


def chunk_paragraphs(
    paragraphs: Iterable[Paragraph],
    encoding,
    max_tokens: int = 256,
    overlap: int = 32,
) -> list[Chunk]:
    """Split (section, text) or (section, text, page) paragraphs into chunks of at most
    `max_tokens` tokens; each chunk keeps the page where it starts (None where not given).

    Whole paragraphs of one section are packed together; a chunk never spans two sections.
    Consecutive chunks of a section share up to `overlap` tokens (the tail of the previous
    chunk is carried over), and a paragraph longer than a chunk is cut into overlapping windows.
    """
    if max_tokens <= 0 or not 0 <= overlap < max_tokens:
        raise ValueError("need max_tokens > 0 and 0 <= overlap < max_tokens")
    kept = [
        (
            clean_extracted_text(p[0] or "").strip(),
            clean_extracted_text(p[1] or "").strip(),
            p[2] if len(p) > 2 else None,
        )
        for p in paragraphs
    ]
    kept = [p for p in kept if p[1]]
    tokens = _encode_all(encoding, [t for _, t, _ in kept])
    sep = encoding.encode_ordinary("\n\n")
    raw: list[tuple[str, int | None, list[int]]] = []
    position = 0
    for section, group in groupby(kept, key=lambda p: p[0]):
        pages = [page for _, _, page in group]
        encoded = list(zip(tokens[position : position + len(pages)], pages, strict=True))
        _pack(section, encoded, sep, max_tokens, overlap, raw, encoding)
        position += len(pages)
    chunks: list[Chunk] = []
    for section, page, ids in raw:
        text = encoding.decode_bytes(ids).decode("utf-8", "ignore").strip()
        if text:
            chunks.append(Chunk(text=text, section=section, index=len(chunks), page=page))
    return chunks


class _Pages:
    """Where each paragraph of a token stream starts, to tell the page at any offset."""

    def __init__(self, marks: list[tuple[int, int | None]] | None = None) -> None:
        self.marks = marks or []  # (offset, page), offsets increasing

    def at(self, offset: int) -> int | None:
        page = None
        for start, mark in self.marks:
            if start > offset:
                break
            page = mark
        return page

    def from_(self, offset: int) -> _Pages:
        """The marks of the stream cut at `offset`."""
        later = [(s - offset, p) for s, p in self.marks if s > offset]
        return _Pages([(0, self.at(offset)), *later])


def _pack(
    section: str,
    paragraphs: list[tuple[list[int], int | None]],
    sep: list[int],
    max_tokens: int,
    overlap: int,
    out: list[tuple[str, int | None, list[int]]],
    encoding,
) -> None:
    """Pack one section's encoded paragraphs (with their pages) into `out`."""
    current: list[int] = []  # the open chunk: it always holds tokens not yet emitted
    pages = _Pages()  # where `current`'s paragraphs start
    step = max_tokens - overlap
    for para, page in paragraphs:
        joiner = sep if current else []
        if len(current) + len(joiner) + len(para) <= max_tokens:
            pages.marks.append((len(current) + len(joiner), page))
            current = current + joiner + para
            continue
        if len(joiner) + len(para) > max_tokens:
            # Too long for any chunk: it continues the current one and is cut into windows.
            pages.marks.append((len(current) + len(joiner), page))
            stream = current + joiner + para
        else:
            out.append((section, pages.at(0), current))
            # Carry the previous chunk's tail, shortened if that lets the paragraph fit whole.
            keep = min(overlap, len(current), max_tokens - len(sep) - len(para))
            tail = _word_aligned(current[len(current) - keep :], encoding) if keep > 0 else []
            stream = [*tail, *sep, *para] if tail else para
            marks = [(0, pages.at(len(current) - len(tail)))] if tail else []
            pages = _Pages([*marks, (len(tail) + len(sep) if tail else 0, page)])
        start = 0
        while start + max_tokens < len(stream):
            out.append((section, pages.at(start), stream[start : start + max_tokens]))
            start += step
        current = stream[start:]
        pages = pages.from_(start)
    if current:
        out.append((section, pages.at(0), current))


def _word_aligned(tail: list[int], encoding) -> list[int]:
    """Drop leading tokens up to a word start, so a carried-over tail begins with a whole word."""
    for i, token in enumerate(tail):
        if encoding.decode_single_token_bytes(token)[:1] in (b" ", b"\n", b"\t"):
            return tail[i:]
    return tail
