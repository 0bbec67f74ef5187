"""Slack's rendering of a watch's digest (adapters/slack_watch.py posts it).

A digest is one message (Block Kit): per paper its title linked, authors, why it matters, and a
"Save to team knowledge base" button (action `digest_save`, value the arXiv id); a plain-text
fallback names the papers for notifications. The watch's topic (head) and description (footer)
are cut to WATCH_TEXT_LIMIT, an ellipsis where cut: a watch of 150 authors (or an imported
topic of 5,000 characters) would pass Slack's 3,000 characters of a block's text, and Slack
refuses the whole digest (`invalid_blocks`) every period.
"""

from __future__ import annotations

from typing import Any

from adapters.slack_home import esc
from bot.watches import describe
from memory.digest import Digest, capped_note, short_authors, when
from memory.shorten import shortened

SAVE_ACTION = "digest_save"
SAVE_LABEL = "Save to team knowledge base"
# a watch's topic or description in the digest's head and footer (as Discord's digest cuts
# them): escaped for mrkdwn (`&` is 5 characters) still well under a block's 3,000
WATCH_TEXT_LIMIT = 200


def digest_blocks(digest: Digest) -> list[dict[str, Any]]:
    watch = digest.watch
    topic = esc(
        shortened(watch.query or ", ".join(watch.categories + watch.authors), WATCH_TEXT_LIMIT)
    )
    blocks: list[dict[str, Any]] = [{"type": "section", "text": {"type": "mrkdwn", "text": (
        f"*New on “{topic}”*: {len(digest.items)} of {digest.found} papers submitted since "
        f"{when(digest.since)}" + (f". {capped_note(digest)}" if digest.capped else "")
    )}}]  # fmt: skip
    for item in digest.items:
        paper = item.paper
        link = paper.url or f"https://arxiv.org/abs/{paper.arxiv_id}"
        text = (
            f"*<{link}|{esc(paper.title)}>*\n{esc(short_authors(paper.authors))} · "
            f"arXiv:{paper.arxiv_id}\n{esc(item.why)}"
        )[:3000]
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


def digest_fallback(digest: Digest) -> str:
    titles = "; ".join(item.paper.title for item in digest.items)
    return f"New papers on “{digest.watch.query}”: {titles}"[:3000]
