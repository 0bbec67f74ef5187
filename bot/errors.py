"""The errors a user can cause or meet, which the CLI prints as one line instead of a trace."""

from __future__ import annotations

from bot.config import ConfigError
from memory.connection import RedisCapabilityError
from memory.embeddings import EmbeddingError
from memory.keys import InvalidName
from memory.redis_server import EmbeddedRedisError
from memory.stores.base import IndexModelMismatch
from memory.stores.conversation import InvalidMessage
from memory.stores.summary import UnknownSummary
from memory.stores.tool_log import UnknownToolLog

USER_ERRORS: tuple[type[BaseException], ...] = (
    ConfigError,
    RedisCapabilityError,
    EmbeddedRedisError,
    EmbeddingError,
    IndexModelMismatch,
    InvalidName,
    InvalidMessage,
    UnknownSummary,
    UnknownToolLog,
)
