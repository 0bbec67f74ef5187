"""Slack's rendering of a watch's digest (adapters/slack_watch.py posts it).

A digest is one message (Block Kit): per paper its title linked, authors, why it matters, and a
"Save to team knowledge base" button (action `digest_save`, value the arXiv id); a plain-text
fallback names the papers for notifications. The watch's topic (head) and description (footer)
are cut to WATCH_TEXT_LIMIT, an ellipsis where cut: a watch of 150 authors (or an imported
topic of 5,000 characters) would pass Slack's 3,000 characters of a block's text, and Slack
refuses the whole digest (`invalid_blocks`) every period. A paper's block is cut the same way:
its title, authors and "why" cut before they are escaped, so the escaped block fits and no
escape is cut in half.
"""

from __future__ import annotations

from itertools import accumulate, takewhile
from typing import Any

from adapters.slack_home import esc
from bot.watches import describe
from memory.digest import Digest, capped_note, short_authors, when
from memory.shorten import shortened
from memory.stores.watches import Watch

SAVE_ACTION = "digest_save"
SAVE_LABEL = "Save to team knowledge base"
# a watch's topic or description in the digest's head and footer (as Discord's digest cuts
# them): escaped for mrkdwn (`&` is 5 characters) still well under a block's 3,000
WATCH_TEXT_LIMIT = 200
SECTION_LIMIT = 3000  # characters in a section block's text (escaped)
# a paper's title and its authors in its block (escaped): its "why" takes the rest
TITLE_LIMIT = 500
AUTHORS_LIMIT = 300
FALLBACK_LIMIT = 3000  # the digest's plain text


def _topic(watch: Watch) -> str:
    """The watch's topic as the digest names it (raw): its query, else its categories and
    authors, cut to WATCH_TEXT_LIMIT."""
    return shortened(watch.query or ", ".join(watch.categories + watch.authors), WATCH_TEXT_LIMIT)


def _escaped_within(text: str, most: int) -> str:
    """`text` escaped for mrkdwn in at most `most` characters: the raw text is cut (with "…"),
    never an escape in half (`&am`)."""
    if most <= 0:
        return ""
    if len(escaped := esc(text)) <= most:
        return escaped
    sizes = accumulate(len(esc(character)) for character in text)  # escaped, so far
    kept = sum(1 for _ in takewhile(lambda size: size < most, sizes))  # and room for the "…"
    return esc(text[:kept].rstrip()) + "…"  # as `shortened` cuts


def digest_blocks(digest: Digest) -> list[dict[str, Any]]:
    watch = digest.watch
    topic = esc(_topic(watch))
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": (
        f"*New on “{topic}”*: {len(digest.items)} of {digest.found} papers submitted since "
        f"{when(digest.since)}" + (f". {capped_note(digest)}" if digest.capped else "")
    )}}]  # fmt: skip
    for item in digest.items:
        paper = item.paper
        link = paper.url or f"https://arxiv.org/abs/{paper.arxiv_id}"
        head = (
            f"*<{link}|{_escaped_within(paper.title, TITLE_LIMIT)}>*\n"
            f"{_escaped_within(short_authors(paper.authors), AUTHORS_LIMIT)} · "
            f"arXiv:{paper.arxiv_id}\n"
        )
        why = _escaped_within(item.why, SECTION_LIMIT - len(head))
        text = shortened(head + why, SECTION_LIMIT)  # a last guard (an absurd link)
        blocks.append({
            "type": "section", "block_id": f"paper-{paper.arxiv_id}",
            "text": {"type": "mrkdwn", "text": text},
            "accessory": {"type": "button", "action_id": SAVE_ACTION, "value": paper.arxiv_id,
                          "text": {"type": "plain_text", "text": SAVE_LABEL}},
        })  # fmt: skip
    blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": (
        f"Watch `{watch.id}`: {esc(shortened(describe(watch), WATCH_TEXT_LIMIT))}. "
        f"`/watch remove {watch.id}` stops it."
    )}]})  # fmt: skip
    return blocks


def digest_fallback(digest: Digest, note: str = "") -> str:
    """The digest's plain text (notifications; the whole digest when Slack refused its
    blocks): its topic and papers' titles, cut to FALLBACK_LIMIT with `note` kept whole."""
    head = f"New papers on “{_topic(digest.watch)}”: "
    tail = f" {note}" if note else ""
    titles = "; ".join(item.paper.title for item in digest.items)
    return head + shortened(titles, FALLBACK_LIMIT - len(head) - len(tail)) + tail
