"""Markdown from the model -> Slack mrkdwn, with arXiv references as links."""

from __future__ import annotations

import re

_CODE = re.compile(r"(```.*?```|`[^`\n]+`)", re.DOTALL)
_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^)\s]+)\)")
_BOLD = re.compile(r"\*\*(.+?)\*\*|__(.+?)__")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*$", re.MULTILINE)
_ARXIV_REF = re.compile(r"\[arXiv:(\d{4}\.\d{4,5})(v\d+)?\]")
_ARXIV_BARE = re.compile(r"(?<![\w/|.])arXiv:(\d{4}\.\d{4,5})(v\d+)?(?![\w>|])")
_BULLET = re.compile(r"^(\s*)[-*]\s+", re.MULTILINE)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _prose(text: str) -> str:
    links: list[str] = []

    def keep(link: str) -> str:
        links.append(link)
        return f"\x00{len(links) - 1}\x00"

    text = _LINK.sub(lambda m: keep(f"<{m[2]}|{_escape(m[1])}>"), text)
    text = _ARXIV_REF.sub(
        lambda m: keep(f"<https://arxiv.org/abs/{m[1]}|arXiv:{m[1]}{m[2] or ''}>"), text
    )
    text = _ARXIV_BARE.sub(
        lambda m: keep(f"<https://arxiv.org/abs/{m[1]}|arXiv:{m[1]}{m[2] or ''}>"), text
    )
    text = re.sub(r"(?<![<|])\bhttps?://[^\s<>]+", lambda m: keep(f"<{m[0]}>"), text)
    text = _escape(text)
    text = _HEADING.sub(lambda m: f"*{m[1]}*", text)
    text = _BOLD.sub(lambda m: f"*{m[1] or m[2]}*", text)
    text = _BULLET.sub(lambda m: f"{m[1]}• ", text)
    return re.sub(r"\x00(\d+)\x00", lambda m: links[int(m[1])], text)


def to_mrkdwn(markdown: str) -> str:
    """Convert the prose parts; code spans and blocks pass through untouched."""
    parts = _CODE.split(markdown)
    return "".join(part if i % 2 else _prose(part) for i, part in enumerate(parts))
