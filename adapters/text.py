"""Splitting a long reply into platform-sized messages without breaking its markdown.

Chat platforms cap a message (Discord at 2,000 characters, Slack's text at a few thousand).
A cut in the middle of a fenced code block leaves one message with an unclosed fence and the
next with code rendered as prose, so cuts go, in order of preference, at a paragraph or
code-block boundary, at a line break, at a space, and only then anywhere. A code block longer
than the limit is cut between its lines, closed, and reopened (same language) in the next part.
What is delivered goes through `split_for_delivery`, which also caps how many messages one
answer becomes (and keeps its Sources list whole when it cuts). Also here, the other way: a
person's Slack message as the bot takes it (`slack_question`).
"""

from __future__ import annotations

import re

from bot.citations import SOURCES_HEADING
from memory.text import clean_text

FENCE = "```"
_CLOSE = "\n" + FENCE
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n")
_LEADING_BLANK_LINES = re.compile(r"^(?:[ \t]*\n)+")
MIN_LIMIT = 16
MAX_PARTS = 8  # messages one answer may become (`split_for_delivery`)
# A code block or span (kept as written), or "[arXiv:2310.08560]" as the model cites a paper.
_CODE_OR_ARXIV_REF = re.compile(
    r"```.*?(?:```|\Z)|`[^`\n]*`|\[arXiv:(?P<id>\d{4}\.\d{4,5}(?:v\d+)?)\](?!\()", re.DOTALL
)


def link_arxiv(markdown: str) -> str:
    """`[arXiv:2310.08560]`, as the model cites, as a Markdown link to the paper's page (not in
    code, which shows what was written). Only a paper the turn showed is still bracketed
    (bot/citations.py `cite`)."""

    def link(match: re.Match[str]) -> str:
        paper = match["id"]
        return match[0] if paper is None else f"[arXiv:{paper}](https://arxiv.org/abs/{paper})"

    return _CODE_OR_ARXIV_REF.sub(link, markdown)


def split_message(text: str, limit: int = 2000) -> list[str]:
    """Parts of `text`, each at most `limit` characters; blank text gives no parts.

    Nothing is lost but the whitespace at a cut (and a fence is added around each part of a
    code block that had to be cut).
    """
    if limit < MIN_LIMIT:
        raise ValueError(f"limit must be at least {MIN_LIMIT}, got {limit}")
    parts: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        head, rest = _cut(rest, limit)
        if head.strip():
            parts.append(head)
        rest = _LEADING_BLANK_LINES.sub("", rest).rstrip()
    if rest.strip():
        parts.append(rest)
    return parts


def split_for_delivery(text: str, limit: int, max_parts: int = MAX_PARTS) -> list[str]:
    """`split_message`, but at most `max_parts` parts: a very long answer (the model can write
    250,000 characters) would otherwise flood the thread with dozens of messages. The last
    part kept is shortened to end with a note of how much is not shown; the answer itself is
    stored whole in the thread's conversation. What is cut is the answer's body, not its
    Sources list: the numbers it cites would otherwise lose their key."""
    if max_parts < 1:
        raise ValueError(f"max_parts must be at least 1, got {max_parts}")
    parts = split_message(text, limit)
    if len(parts) <= max_parts:
        return parts
    body, sources = _sources_apart(text)
    source_parts = split_message(sources, limit)
    if not source_parts or len(source_parts) >= max_parts:
        return _truncated(parts, limit, max_parts)
    kept = _truncated(split_message(body, limit), limit, max_parts - len(source_parts))
    joined = f"{kept[-1]}\n\n{source_parts[0]}" if kept else source_parts[0]
    if len(joined) <= limit:
        return [*kept[:-1], joined, *source_parts[1:]]
    return [*kept, *source_parts]


def _sources_apart(text: str) -> tuple[str, str]:
    """The answer's body and the Sources list `cite` appended to it ("" if it has none)."""
    heading = f"\n\n{SOURCES_HEADING}\n"
    at = text.rfind(heading)
    lines = text[at + len(heading) :].strip().splitlines() if at >= 0 else []
    if not lines or not all(line.startswith("- ") for line in lines):
        return text, ""
    return text[:at], text[at:].strip()


def _truncated(parts: list[str], limit: int, max_parts: int) -> list[str]:
    """The first `max_parts` of `parts`, the last ending with a note of how much is left out."""
    if len(parts) <= max_parts:
        return parts
    kept, last = parts[: max_parts - 1], parts[max_parts - 1]
    rest = sum(len(p) for p in parts[max_parts:])
    for make_note in (_truncation_note, _short_truncation_note):
        note = make_note(rest + len(last))  # the longest it can be: all of `last` left out
        room = limit - len(note)
        if room >= MIN_LIMIT:
            shown = split_message(last, room)[0]
            return [*kept, shown + make_note(rest + len(last) - len(shown))]
    return [*kept, "…"[:limit]]


def _truncation_note(hidden: int) -> str:
    return (
        f"\n\n… (answer truncated here: {hidden:,} more characters are saved in this "
        "thread's memory; ask me to continue)"
    )


def _short_truncation_note(hidden: int) -> str:
    return f"\n… ({hidden:,} more characters)"


def _code_blocks(text: str) -> list[tuple[int, int, str]]:
    """(start, end, opening fence line) of each fenced block; an unclosed one runs to the end."""
    blocks: list[tuple[int, int, str]] = []
    opened: tuple[int, str] | None = None
    pos = 0
    for line in text.splitlines(keepends=True):
        bare = line.strip()
        if bare.startswith(FENCE) and not (opened is None and FENCE in bare[3:]):
            if opened is None:
                opened = (pos, bare)
            else:
                blocks.append((opened[0], pos + len(line.rstrip("\r\n")), opened[1]))
                opened = None
        pos += len(line)
    if opened is not None:
        blocks.append((opened[0], len(text), opened[1]))
    return blocks


def _cut(text: str, limit: int) -> tuple[str, str]:
    """One part of at most `limit` characters from the front of `text`, and what is left."""
    blocks = _code_blocks(text)
    block = next(((s, e, f) for s, e, f in blocks if s < limit < e), None)

    # 1. A code block that fits no part is cut anyway: fill this part with its first lines.
    if block is not None and block[1] - block[0] > limit:
        start, _, opening = block
        if start == 0 or limit - start >= limit // 4:
            cut = _cut_code(text, limit, start, opening)
            if cut is not None:
                return cut

    # 2. The last paragraph or code-block boundary that fits.
    def in_code(pos: int) -> bool:
        return any(start < pos < end for start, end, _ in blocks)

    boundaries = [m.start() for m in _PARAGRAPH_BREAK.finditer(text) if not in_code(m.start())]
    boundaries += [edge for start, end, _ in blocks for edge in (start, end)]
    fitting = [p for p in boundaries if 0 < p <= limit and text[:p].strip()]
    if fitting:
        p = max(fitting)
        return text[:p].rstrip(), text[p:]

    # 3. Prose: the last line break, else the last space, else anywhere; never into a block.
    end = min(limit, block[0]) if block is not None and block[0] > 0 else limit
    window = text[:end]
    for sep in ("\n", " "):
        p = window.rfind(sep)
        if p > 0 and window[:p].strip():
            return window[:p].rstrip(), text[p + 1 :]
    return window, text[end:]


def _cut_code(text: str, limit: int, start: int, opening: str) -> tuple[str, str] | None:
    """Cut inside the code block at `start` between two lines, closing the fence in this part
    and reopening it (same language) in the rest; None if no line of it fits after `start`."""
    reopen = opening if len(opening) <= limit // 4 else FENCE
    budget = limit - len(_CLOSE)
    fence_end = text.find("\n", start)
    p = text.rfind("\n", start, budget + 1)
    if fence_end < 0 or p <= fence_end:  # not one code line fits
        if start > 0:
            return None
        return text[:budget] + _CLOSE, f"{reopen}\n{text[budget:]}"
    return text[:p] + _CLOSE, f"{reopen}\n{text[p + 1 :]}"


def slack_question(text: str, bot_user_id: str) -> str:
    """A person's Slack message as the bot takes it (a new one, an edit, one with files):
    without its mention of the bot; a lone surrogate (bad input, which would fail the job's
    JSON in Redis) replaced."""
    return clean_text(re.sub(rf"<@{bot_user_id}>\s*", "", text).strip())
