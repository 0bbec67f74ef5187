"""Shared fixtures: one real embedded Redis (with the search module) for the whole session."""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import uuid
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio.connection as async_connection
import redis.connection as sync_connection
from redis.crc import key_slot

from app.settings import Settings
from memory.connection import connect
from memory.embeddings import CachedEmbedder, LocalEmbedder
from memory.manager import MemoryManager
from memory.redis_server import EmbeddedRedis
from tests.support.gated_memory import gated  # noqa: F401  (a fixture, for every test)
from tests.support.pipelines import no_pipeline_outlives_its_test  # noqa: F401  (autouse)

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
async def client(redis_url: str):
    """A Redis connection of the test's own (no pool warmed), closed afterwards."""
    client = await connect(redis_url, warm=0)
    yield client
    await client.aclose()


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


# -- hash slots: every multi-key call the suite makes stays in one slot (a sharded Redis) ------

SCRIPTS = {"EVAL", "EVALSHA", "EVAL_RO", "EVALSHA_RO", "FCALL", "FCALL_RO"}
ALL_KEYS = {
    "MGET", "DEL", "UNLINK", "EXISTS", "TOUCH", "WATCH", "SDIFF", "SINTER", "SUNION",
    "SDIFFSTORE", "SINTERSTORE", "SUNIONSTORE", "PFCOUNT", "PFMERGE",
}  # fmt: skip
TWO_KEYS = {
    "RENAME", "RENAMENX", "RPOPLPUSH", "BRPOPLPUSH", "LMOVE", "BLMOVE", "SMOVE", "COPY",
    "ZRANGESTORE", "GEOSEARCHSTORE", "GEORADIUSSTORE",
}  # fmt: skip
BLOCKING = {"BLPOP", "BRPOP", "BZPOPMIN", "BZPOPMAX"}  # keys, then a timeout
NUMKEYS_FIRST = {"ZUNION", "ZINTER", "ZDIFF", "ZINTERCARD", "SINTERCARD", "LMPOP", "ZMPOP"}
NUMKEYS_SECOND = {"ZUNIONSTORE", "ZINTERSTORE", "ZDIFFSTORE", "BLMPOP", "BZMPOP"}
KEYLESS = {
    "MULTI", "EXEC", "DISCARD", "UNWATCH", "PING", "ECHO", "INFO", "TIME", "SCRIPT", "FUNCTION",
    "CLIENT", "CONFIG", "SELECT", "HELLO", "AUTH", "COMMAND", "MODULE", "DBSIZE", "SCAN",
    "KEYS", "RANDOMKEY", "FLUSHDB", "FLUSHALL", "PUBLISH", "SUBSCRIBE", "READONLY", "WAIT",
}  # fmt: skip
KEY_SECOND = {"XGROUP", "XINFO", "OBJECT", "MEMORY"}  # a subcommand, then the key


def _text(arg: object) -> str:
    return arg.decode() if isinstance(arg, bytes) else str(arg)


def command_keys(args: tuple) -> list[bytes]:
    """The keys a command names, as Redis hashes them (patterns of SORT's BY and GET too)."""
    name = _text(args[0]).upper()
    rest = list(args[1:])
    if name in SCRIPTS:
        keys = rest[2 : 2 + int(rest[1])]
    elif name in ALL_KEYS:
        keys = rest
    elif name in ("MSET", "MSETNX"):
        keys = rest[::2]
    elif name in TWO_KEYS:
        keys = rest[:2]
    elif name in BLOCKING:
        keys = rest[:-1]
    elif name in NUMKEYS_FIRST:
        keys = rest[1 : 1 + int(rest[0])]
    elif name in NUMKEYS_SECOND:
        keys = ([] if name.startswith("B") else rest[:1]) + rest[2 : 2 + int(rest[1])]
    elif name == "BITOP":
        keys = rest[1:]
    elif name in ("XREAD", "XREADGROUP"):
        streams = [_text(a).upper() for a in rest].index("STREAMS") + 1
        keys = rest[streams : streams + (len(rest) - streams) // 2]
    elif name in ("SORT", "SORT_RO"):
        named = {"BY", "GET", "STORE"}
        pairs = itertools.pairwise(rest[1:])
        keys = rest[:1] + [
            v for o, v in pairs if _text(o).upper() in named and _text(v) not in ("#", "nosort")
        ]
    elif name in KEYLESS or name.startswith("FT.") or not rest:
        keys = []
    elif name in KEY_SECOND:
        keys = rest[1:2]
    else:
        keys = rest[:1]
    return [k if isinstance(k, bytes) else str(k).encode() for k in keys]


class SlotRecorder:
    """Sees every command the suite's Redis connections pack (redis-py's own packing, wrapped
    for the session: the project's code runs unchanged) and checks the calls that name several
    keys: scripts, built-in multi-key commands, and MULTI..EXEC blocks with the keys WATCHed
    before them. A call whose keys lie in several hash slots is an offender: a sharded Redis
    would refuse it. Only calls on the project's keys (`arxivscout...`) count: the tests' own
    scaffolding (a throwaway stream, a probe) is not what runs in production."""

    NAMESPACE = b"arxivscout"

    def __init__(self) -> None:
        self.checked = 0  # multi-key calls seen
        self.offenders: list[str] = []
        self._blocks: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # in MULTI
        self._watched: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def see(self, connection: object, args: tuple) -> None:
        if " " in _text(args[0]):  # e.g. "CLIENT SETNAME": redis-py splits it the same way
            args = tuple(_text(args[0]).split()) + tuple(args[1:])
        name = _text(args[0]).upper()
        if name == "MULTI":
            self._blocks[connection] = ["MULTI"], list(self._watched.pop(connection, []))
        elif name in ("EXEC", "DISCARD") and connection in self._blocks:
            names, keys = self._blocks.pop(connection)
            self._check(f"{' '.join(names)} EXEC", keys)
        elif name == "UNWATCH":
            self._watched.pop(connection, None)
        elif connection in self._blocks:
            names, keys = self._blocks[connection]
            names.append(name)
            keys += command_keys(args)
        elif name == "WATCH":
            self._watched.setdefault(connection, []).extend(command_keys(args))
        else:
            keys = command_keys(args)
            if len(keys) > 1:
                self._check(name, keys)

    def _check(self, what: str, keys: list[bytes]) -> None:
        if len(keys) < 2 or not any(k.startswith(self.NAMESPACE) for k in keys):
            return
        self.checked += 1
        if len({key_slot(k) for k in keys}) > 1:
            self.offenders.append(f"{what}: {', '.join(k.decode(errors='replace') for k in keys)}")

    @contextlib.contextmanager
    def apart(self) -> Iterator[list[str]]:
        """Record the offenders of the block in a list of their own (a test's deliberate ones)."""
        kept, self.offenders = self.offenders, []
        try:
            yield self.offenders
        finally:
            self.offenders = kept


SLOTS = SlotRecorder()


@pytest.fixture(scope="session", autouse=True)
def slot_recorder() -> Iterator[SlotRecorder]:
    """Every Redis connection of the session reports what it sends to `SLOTS`."""
    originals = {}
    for module in (async_connection, sync_connection):
        cls = module.AbstractConnection
        originals[cls] = pack = cls.pack_command

        def recording(self, *args, _pack=pack):
            SLOTS.see(self, args)
            return _pack(self, *args)

        cls.pack_command = recording
    yield SLOTS
    for cls, pack in originals.items():
        cls.pack_command = pack


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run on any cross-slot call (also those after tests/test_zz_cluster_slots.py)."""
    if SLOTS.offenders and exitstatus == pytest.ExitCode.OK:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line("Multi-key calls across hash slots:", red=True)
            for offender in dict.fromkeys(SLOTS.offenders):
                reporter.write_line(f"  {offender[:300]}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
