"""Which stored addresses may be shown as links: one rule for citations, the model's
knowledge segment and the memory page."""

from __future__ import annotations

from urllib.parse import urlsplit


def web_link(url: str, fallback: str = "") -> str:
    """`url` when it is a web address (http or https), else `fallback`. A stored URL may be
    anything: an old local PDF's `file:` server path, an import's `javascript:`."""
    url = url.strip()
    parts = urlsplit(url)
    return url if parts.scheme.lower() in ("http", "https") and parts.netloc else fallback
