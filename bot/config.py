"""Settings from the environment (and a `.env` file): the only place that reads configuration."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from dotenv import load_dotenv
from platformdirs import user_data_dir

DEFAULT_ARXIV_API_URL = "https://export.arxiv.org/api/query"


class ConfigError(ValueError):
    """A setting is missing or wrong; the message names it and says how to fix it."""


def _float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw in (None, ""):
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {raw!r}") from None


@dataclass(frozen=True)
class Settings:
    """Everything ArxivScout can be configured with, with its defaults."""

    redis_url: str | None = None
    data_dir: Path = field(default_factory=lambda: Path(user_data_dir("arxivscout")))
    embeddings: str = "local"
    openai_api_key: str | None = None
    openai_base_url: str | None = None
    openai_model: str = "gpt-5-mini"
    openai_embedding_model: str = "text-embedding-3-small"
    llm_timeout_seconds: float = 60.0
    turn_timeout_seconds: float = 300.0
    arxiv_api_url: str = DEFAULT_ARXIV_API_URL
    arxiv_delay_seconds: float = 3.0

    @classmethod
    def from_env(cls, dotenv: bool = True) -> Settings:
        if dotenv:
            load_dotenv(override=False)
        env = os.environ
        embeddings = env.get("ARXIVSCOUT_EMBEDDINGS", "local").strip().lower() or "local"
        if embeddings not in ("local", "openai"):
            raise ConfigError(
                f"ARXIVSCOUT_EMBEDDINGS must be 'local' or 'openai', got {embeddings!r}"
            )
        data_dir = env.get("ARXIVSCOUT_DATA_DIR")
        return cls(
            redis_url=env.get("REDIS_URL") or None,
            data_dir=Path(data_dir).expanduser() if data_dir else Path(user_data_dir("arxivscout")),
            embeddings=embeddings,
            openai_api_key=env.get("OPENAI_API_KEY") or None,
            openai_base_url=env.get("OPENAI_BASE_URL") or None,
            openai_model=env.get("OPENAI_MODEL") or "gpt-5-mini",
            openai_embedding_model=env.get("OPENAI_EMBEDDING_MODEL") or "text-embedding-3-small",
            llm_timeout_seconds=_float("ARXIVSCOUT_LLM_TIMEOUT", 60.0),
            turn_timeout_seconds=_float("ARXIVSCOUT_TURN_TIMEOUT", 300.0),
            arxiv_api_url=env.get("ARXIV_API_URL") or DEFAULT_ARXIV_API_URL,
            arxiv_delay_seconds=_float("ARXIV_DELAY_SECONDS", 3.0),
        )
