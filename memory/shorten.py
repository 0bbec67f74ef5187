"""Cutting a text to a length, for every layer: what is echoed or shown (a typed id, a title,
a watch's description) must fit a platform's or a page's limit.

Kept apart from the stores (no Redis) so the adapters, the bot and the app can cut text without
importing them.
"""

from __future__ import annotations


def shortened(text: str, most: int) -> str:
    """`text` whole if it fits in `most` characters, else cut to fit: the ellipsis at the end
    says it was cut, and the whitespace before it is dropped (no "word …"); nothing fits in
    `most` <= 0 (not even the ellipsis)."""
    if most <= 0:
        return ""
    if len(text) <= most:
        return text
    return text[: most - 1].rstrip() + "…"
