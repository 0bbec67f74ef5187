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


def utf16_length(text: str) -> int:
    """A text's length as a browser's `maxlength` counts it: UTF-16 code units, so a character
    outside the BMP (an emoji, 𝒪) is two. The stores count their limits this way too, so what
    they keep always fits the field that edits it."""
    if text.isascii():
        return len(text)
    return len(text) + sum(1 for char in text if ord(char) > 0xFFFF)


def utf16_cut(text: str, limit: int) -> str:
    """The text's start of at most `limit` UTF-16 code units, never half a character."""
    if utf16_length(text) <= limit:
        return text
    units = 0
    for end, char in enumerate(text):
        units += 2 if ord(char) > 0xFFFF else 1
        if units > limit:
            return text[:end]
    return text
