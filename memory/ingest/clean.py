"""Clean text extracted from papers (PDF, LaTeX, unarXive): stricter than memory.text's
`clean_text`, which only makes a person's message valid UTF-8. Kept apart from chunking so the
PDF reader's child process imports no stores (it starts in a fraction of the time)."""

from __future__ import annotations

import re

_SURROGATES = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd\ufffe\uffff]")


def clean_extracted_text(text: str) -> str:
    """Drop lone surrogates, control characters and replacement marks: Redis needs valid UTF-8."""
    if not text.isascii():
        text = _SURROGATES.sub("", text)
    return _CONTROL.sub("", text)
