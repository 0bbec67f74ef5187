"""All configuration, read once from the environment (and a `.env` file) into one typed object.

Nothing below `app/` reads the environment: the wiring (`app/runtime.py`) hands each part the
values it needs. A wrong value is a `ConfigError` that names the variable.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from dotenv import dotenv_values
from platformdirs import user_data_dir
from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from bot.errors import ConfigError
from memory.connection import MAX_CONNECTIONS, redact_url
from memory.context import DEFAULT_MEMORY_TOKENS, MIN_MEMORY_TOKENS

DEFAULT_ARXIV_API_URL = "https://export.arxiv.org/api/query"
REDIS_SCHEMES = ("redis://", "rediss://", "unix://")  # what redis-py connects to


def env(*names: str) -> AliasChoices:
    """The documented variable(s) a field is read from, the first the one errors name. Code
    may pass the field's own name (`Settings(data_dir=...)`); the environment may not (see
    `DocumentedNamesOnly`)."""
    return AliasChoices(*names)


class DocumentedNamesOnly(PydanticBaseSettingsSource):
    """What `source` (the environment, `.env`) read under a documented name only.

    `populate_by_name`, kept so code can pass field names, makes pydantic-settings also read
    each field's bare name, case-insensitively and from `.env` too: a PUBLIC_URL, ADMINS or
    SECRET meant for another program would send sign-in links elsewhere or grant admin."""

    def __init__(self, source: PydanticBaseSettingsSource) -> None:
        super().__init__(source.settings_cls)
        self._source = source

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[object, str, bool]:
        return None, field_name, False  # unused: __call__ filters what `source` read

    def __call__(self) -> dict[str, object]:
        documented = documented_names()
        return {name: value for name, value in self._source().items() if name in documented}


def documented_names() -> set[str]:
    """Every variable name a setting is read from (README's Configuration table)."""
    return {
        str(name)
        for info in Settings.model_fields.values()
        if isinstance(info.validation_alias, AliasChoices)
        for name in info.validation_alias.choices
    }


class Settings(BaseSettings):
    """Everything ArxivScout can be configured with, and its defaults (see the README)."""

    model_config = SettingsConfigDict(
        env_file=".env", extra="ignore", env_ignore_empty=True, populate_by_name=True,
        frozen=True,
    )  # fmt: skip

    # memory
    # REDISCLOUD_URL: what Heroku's Redis Cloud add-on sets
    redis_url: str | None = Field(None, validation_alias=env("REDIS_URL", "REDISCLOUD_URL"))
    redis_max_connections: int = Field(
        MAX_CONNECTIONS, ge=1, le=100_000,
        validation_alias=env("ARXIVSCOUT_REDIS_MAX_CONNECTIONS"),
    )  # fmt: skip
    data_dir: Path = Field(
        default_factory=lambda: Path(user_data_dir("arxivscout")),
        validation_alias=env("ARXIVSCOUT_DATA_DIR"),
    )
    redis_server: str | None = Field(None, validation_alias=env("ARXIVSCOUT_REDIS_SERVER"))
    redis_modules: str | None = Field(None, validation_alias=env("ARXIVSCOUT_REDIS_MODULES"))
    embeddings: Literal["local", "openai"] = Field(
        "local", validation_alias=env("ARXIVSCOUT_EMBEDDINGS")
    )
    embedding_dims: int | None = Field(
        None, gt=0, validation_alias=env("ARXIVSCOUT_EMBEDDING_DIMS")
    )
    # the model
    openai_api_key: str | None = Field(None, validation_alias=env("OPENAI_API_KEY"))
    openai_base_url: str | None = Field(None, validation_alias=env("OPENAI_BASE_URL"))
    openai_model: str = Field("gpt-5-mini", validation_alias=env("OPENAI_MODEL"))
    openai_embedding_model: str = Field(
        "text-embedding-3-small",
        validation_alias=env("OPENAI_EMBEDDING_MODEL"),
    )
    llm_timeout_seconds: float = Field(60.0, gt=0, validation_alias=env("ARXIVSCOUT_LLM_TIMEOUT"))
    turn_timeout_seconds: float = Field(
        300.0, gt=0, validation_alias=env("ARXIVSCOUT_TURN_TIMEOUT")
    )
    memory_tokens: int = Field(
        DEFAULT_MEMORY_TOKENS, ge=MIN_MEMORY_TOKENS,
        validation_alias=env("ARXIVSCOUT_MEMORY_TOKENS"),
    )  # fmt: skip
    context_window: int | None = Field(
        None, gt=0, validation_alias=env("ARXIVSCOUT_CONTEXT_WINDOW")
    )
    # arXiv
    arxiv_api_url: str = Field(DEFAULT_ARXIV_API_URL, validation_alias=env("ARXIV_API_URL"))
    arxiv_delay_seconds: float = Field(3.0, ge=0, validation_alias=env("ARXIV_DELAY_SECONDS"))
    # platforms
    slack_bot_token: str | None = Field(None, validation_alias=env("SLACK_BOT_TOKEN"))
    slack_signing_secret: str | None = Field(None, validation_alias=env("SLACK_SIGNING_SECRET"))
    slack_app_token: str | None = Field(None, validation_alias=env("SLACK_APP_TOKEN"))
    slack_api_url: str | None = Field(None, validation_alias=env("SLACK_API_URL"))
    discord_token: str | None = Field(None, validation_alias=env("DISCORD_TOKEN"))
    discord_api_url: str | None = Field(
        None, pattern=r"^https?://[^\s/]+",
        validation_alias=env("DISCORD_API_URL"),
    )  # fmt: skip
    # PDFs shared in chat (adapters/shared_files.py): larger ones are refused, not downloaded
    max_pdf_mb: float = Field(50.0, gt=0, le=2000, validation_alias=env("ARXIVSCOUT_MAX_PDF_MB"))
    max_pdf_pages: int = Field(
        300, gt=0, le=100_000, validation_alias=env("ARXIVSCOUT_MAX_PDF_PAGES")
    )
    port: int | None = Field(None, ge=0, le=65535, validation_alias=env("PORT"))
    # the memory page
    secret: str | None = Field(None, validation_alias=env("ARXIVSCOUT_SECRET"))
    public_url: str | None = Field(
        None,
        pattern=r"^https?://[^\s/]+",
        validation_alias=env("ARXIVSCOUT_PUBLIC_URL"),
    )
    admins: str | None = Field(None, validation_alias=env("ARXIVSCOUT_ADMINS"))
    link_ttl_seconds: int = Field(
        3600, ge=60, le=7 * 86400, validation_alias=env("ARXIVSCOUT_LINK_TTL")
    )
    # retention of conversation memory (memory/retention.py)
    retention_days: float | None = Field(
        None, gt=0, le=36_500, validation_alias=env("ARXIVSCOUT_RETENTION_DAYS")
    )
    retention_sweep_seconds: float = Field(
        3600.0, gt=0,
        validation_alias=env("ARXIVSCOUT_RETENTION_SWEEP_SECONDS"),
    )  # fmt: skip
    # a workspace or server that removed the bot: its whole memory is erased this many days
    # later unless the bot comes back (0: at the next tick; memory/governance_tenants.py)
    uninstalled_keep_days: float = Field(
        30.0, ge=0, le=36_500,
        validation_alias=env("ARXIVSCOUT_UNINSTALLED_KEEP_DAYS"),
    )  # fmt: skip
    # topic watches (bot/watches.py)
    watch_check_seconds: float = Field(
        60.0, gt=0, validation_alias=env("ARXIVSCOUT_WATCH_CHECK_SECONDS")
    )
    # set by the platform: where this process runs (a dyno's disk and a Fly machine's are lost)
    dyno: str | None = Field(None, validation_alias=env("DYNO"))
    fly_app_name: str | None = Field(None, validation_alias=env("FLY_APP_NAME"))

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:  # fmt: skip
        """Code's arguments by field name; the environment and `.env` by documented name."""
        return (
            init_settings,
            DocumentedNamesOnly(env_settings),
            DocumentedNamesOnly(dotenv_settings),
        )

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, url: str | None) -> str | None:
        """Caught here, not as redis-py's ValueError trace when the first command connects: a
        scheme it does not know, or a port that is no number or out of range (`redis://h:abc`,
        `:99999`). The messages never quote the URL: `from_env` shows it with its password
        hidden."""
        if url is None:
            return url
        if not url.lower().startswith(REDIS_SCHEMES):
            raise ValueError("should start with redis://, rediss:// or unix:// (redis://host:6379)")
        if not _port_valid(url):
            raise ValueError("the port should be a number from 1 to 65535 (redis://host:6379)")
        return url

    @classmethod
    def from_env(cls) -> Settings:
        """The settings of this process; a bad value is a ConfigError naming its variable."""
        try:
            return cls()
        except ValidationError as exc:
            problems = "; ".join(
                f"{_variable(error['loc'], error.get('input'))}: {error['msg']} "
                f"(got {_shown(error)!r})"
                for error in exc.errors()
            )
            raise ConfigError(f"Invalid configuration: {problems}") from None

    def embedded_redis_allowed(self) -> None:
        """Refuse the embedded Redis where its memory would be lost or split. A dyno's disk is
        wiped at least daily, each dyno would keep a memory of its own, and Heroku has no
        volumes: never there. A Fly machine's disk is lost on restart: allowed only with
        ARXIVSCOUT_DATA_DIR set (a mounted volume, which one machine alone can use)."""
        if self.dyno:
            raise ConfigError(
                "REDIS_URL is not set: on Heroku the embedded Redis cannot keep memory (a dyno's "
                "disk is wiped daily, each dyno would have its own, and there are no volumes). "
                "Add a Redis with the Query Engine (e.g. Redis Cloud) and set REDIS_URL."
            )
        if self.fly_app_name and "data_dir" not in self.model_fields_set:
            raise ConfigError(
                "REDIS_URL is not set: on Fly the embedded Redis would keep memory on the "
                "machine's disk, lost on restart. Set REDIS_URL to a Redis with the Query Engine "
                "(e.g. Redis Cloud), or, for a single machine running every process, "
                "ARXIVSCOUT_DATA_DIR to a volume mounted on it (web and worker on separate "
                "machines must share one Redis)."
            )

    def links_url(self) -> str | None:
        """Where memory-page links point: ARXIVSCOUT_PUBLIC_URL, else the Fly app's address;
        None (the serving process's own address) elsewhere. A Heroku web dyno must be told:
        its own address is not one people can open."""
        if self.public_url:
            return self.public_url
        if self.fly_app_name:
            return f"https://{self.fly_app_name}.fly.dev"
        if (self.dyno or "").startswith("web."):
            raise ConfigError(
                "ARXIVSCOUT_PUBLIC_URL is not set: on Heroku set it to the app's Web URL (`heroku "
                "apps:info` shows it), or memory-page links would point to this dyno's localhost."
            )
        return None

    def require(self, field: str, why: str, prefix: str = "") -> str:
        """A setting that this command needs, checked before anything slow starts."""
        value = (getattr(self, field) or "").strip()
        name = _variable((field,))
        if not value:
            raise ConfigError(f"{name} is not set: {why}")
        if prefix and not value.startswith(prefix):
            raise ConfigError(f"{name} should start with '{prefix}' (got '{value[:5]}…'): {why}")
        return value


def _port_valid(url: str) -> bool:
    """Whether a Redis URL's port, if it names one, is one redis-py can connect to (a unix://
    socket has none)."""
    if url.lower().startswith("unix://"):
        return True
    try:
        port = urlsplit(url).port
    except ValueError:  # not a number, or beyond 65535
        return False
    return port != 0


def _shown(error: dict) -> object:
    """The wrong value, fit to print: a Redis URL's user and password hidden."""
    value = error.get("input")
    if _field(error.get("loc", ())) == "redis_url" and isinstance(value, str):
        shown = redact_url(value) if "://" in value else re.sub(r"^.*@", "***@", value)
        return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", shown)
    return value


def _field(location: tuple) -> str:
    """The field an error's location names (by the field's name, or by one of its aliases)."""
    name = str(location[0]) if location else ""
    for field, info in Settings.model_fields.items():
        alias = info.validation_alias
        if name == field or (isinstance(alias, AliasChoices) and name in alias.choices):
            return field
    return name


def _variable(location: tuple, value: object = None) -> str:
    """The environment variable behind a field: of its aliases, the one set to `value` (e.g.
    REDISCLOUD_URL, where errors name REDIS_URL), else the first."""
    field = _field(location)
    info = Settings.model_fields.get(field)
    alias = info.validation_alias if info is not None else None
    if not isinstance(alias, AliasChoices):
        return field.upper()
    names = [str(choice) for choice in alias.choices]
    if value is not None:
        given = {k.upper(): v for k, v in dotenv_values(".env").items()}
        given |= {k.upper(): v for k, v in os.environ.items()}  # over .env, as pydantic does
        names = [name for name in names if given.get(name.upper()) == value] or names
    return names[0]
