"""Shared fixtures: one real embedded Redis (with the search module) for the whole session."""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

import pytest

from app.settings import Settings
from memory.connection import connect
from memory.embeddings import CachedEmbedder, LocalEmbedder
from memory.manager import MemoryManager
from memory.redis_server import EmbeddedRedis

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_options() -> dict[str, str | None]:
    """The redis-server and modules the app would start (ARXIVSCOUT_REDIS_SERVER and
    ARXIVSCOUT_REDIS_MODULES): EmbeddedRedis no longer reads the environment itself."""
    settings = Settings.from_env()
    return {"server_binary": settings.redis_server, "modules": settings.redis_modules}


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("arxivscout-data")
    os.environ["ARXIVSCOUT_DATA_DIR"] = str(path)
    os.environ.pop("REDIS_URL", None)
    os.environ["TIKTOKEN_CACHE_DIR"] = str(tmp_path_factory.mktemp("tiktoken"))
    return path


@pytest.fixture(scope="session")
def redis_server(data_dir: Path):
    server = EmbeddedRedis(data_dir, preferred_port=free_port(), **redis_options())
    server.ensure_running()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: EmbeddedRedis) -> str:
    url = redis_server.running_url()
    assert url
    return url


@pytest.fixture(scope="session")
def local_embedder() -> LocalEmbedder:
    return LocalEmbedder()


@pytest.fixture(scope="session")
async def memory(redis_url: str, local_embedder: LocalEmbedder):
    client = await connect(redis_url)
    manager = await MemoryManager(client, CachedEmbedder(local_embedder, client)).open()
    yield manager
    await manager.close()


@pytest.fixture
def tenant() -> str:
    """A fresh tenant per test, so tests never see each other's memory."""
    return f"t-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def cli_env(data_dir: Path, redis_server: EmbeddedRedis) -> dict[str, str]:
    """Environment for running `arxivscout` as a subprocess against the test Redis."""
    env = dict(os.environ)
    env["ARXIVSCOUT_DATA_DIR"] = str(data_dir)
    env.pop("REDIS_URL", None)
    env.pop("OPENAI_API_KEY", None)
    return env
