"""Text hygiene that every layer can use before it stores, embeds or counts a text.

Kept apart from the stores so the embedder, the token counter and the adapters can clean
text without importing the conversation store.
"""

from __future__ import annotations


def clean_text(text: str) -> str:
    """Replace what cannot be encoded as UTF-8 (lone surrogates from bad input) with '?':
    Redis, the tokenizers and the embedding APIs all need valid UTF-8, and one bad character
    must not fail the whole text."""
    if text.isascii():  # the common case: nothing to replace, no copy
        return text
    return text.encode("utf-8", "replace").decode("utf-8")
