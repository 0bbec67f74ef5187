"""Upgrades that stop part way, and the command line's wrong inputs: a reindex cut off by a
quota is refused until it is run again, a rebuild that failed after dropping its indexes is
done (defaults filled) at the next start, a failed episodic back-fill is tried again; a bad
REDIS_URL, port, embedding size, output path or LoCoMo file is one clear line, never a trace."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import subprocess
import sys
import uuid

import numpy as np
import pytest
from redis.exceptions import ResponseError

from app import cli
from app.runtime import make_embedder
from app.settings import Settings
from bot.background import BackgroundWork
from bot.consolidation import Consolidator
from bot.upkeep import BACKFILL, EPISODES, Upkeep
from memory.connection import connect
from memory.coordination import Upgrades
from memory.embeddings import CachedEmbedder, EmbeddingError
from memory.keys import INDEX_META_KEY, messages_key, task_stream, threads_key, upgrade_key
from memory.manager import MemoryManager
from memory.redis_server import EmbeddedRedis
from memory.scope import PUBLIC, Scope
from memory.stores.base import REINDEXING, IndexModelMismatch, ReindexUnfinished, delete_matching
from memory.stores.workflow import WorkflowStore
from memory.tasks import TaskStream
from tests.agent_world import memgpt_arxiv
from tests.conftest import free_port, redis_options
from tests.support.scripted_openai import ScriptedOpenAI
from tests.test_cli_agent import scenario_model

WORKFLOWS = 5


class Quota:
    """Another embedding model (16 dims) whose quota runs out after `allowed` calls."""

    model_name, dims = "quota-16", 16

    def __init__(self, allowed: int | None = None) -> None:
        self.allowed = allowed
        self.calls = 0

    async def embed(self, texts: list[str]) -> np.ndarray:
        self.calls += 1
        if self.allowed is not None and self.calls > self.allowed:
            raise EmbeddingError("OpenAI embeddings failed: Error code: 429 (insufficient_quota)")
        rows = [np.frombuffer(hashlib.sha256(t.encode()).digest()[:16], np.uint8) for t in texts]
        matrix = np.array(rows, dtype=np.float32) + 1
        return matrix / np.linalg.norm(matrix, axis=1, keepdims=True)


@pytest.fixture
async def notes(memory):
    """A workflow store class of a family of its own (rebuilding it disturbs no other test)."""
    family = f"test_s24_{uuid.uuid4().hex[:8]}"

    class Notes(WorkflowStore):
        SCHEMA = {**WorkflowStore.SCHEMA, "index": {"name": family, "prefix": f"test:{family}"}}

    yield Notes
    store = Notes(memory.redis, memory.embedder)
    for name in await store.existing_indexes():
        await memory.redis.execute_command("FT.DROPINDEX", name)
    await delete_matching(memory.redis, f"test:{family}:*")
    await memory.redis.hdel(INDEX_META_KEY, family)


async def seeded(store: WorkflowStore, scope: Scope, count: int) -> list[str]:
    vector = await store.embedder.embed_one("find a paper")
    return [
        await store.add(scope, f"find paper {i}", ["arxiv_search_candidates"], "found", vector)
        for i in range(count)
    ]


async def found(store: WorkflowStore, scope: Scope, vector: np.ndarray, count: int) -> list[str]:
    """What `scope` finds, once Redis has indexed the records (it does so in the background)."""
    for _ in range(100):
        hits = await store.similar(scope, vector, k=count + 5)
        if len(hits) >= count:
            break
        await asyncio.sleep(0.05)
    return hits


# -- 1. a reindex that stopped part way ------------------------------------------------------


async def test_a_reindex_cut_off_by_a_quota_is_refused_until_run_again(memory, notes, tenant):
    scope = Scope(tenant, user="u")
    await notes(memory.redis, memory.embedder).open()
    await seeded(notes(memory.redis, memory.embedder), scope, WORKFLOWS)

    with pytest.raises(EmbeddingError, match="429"):  # the first batch went through, not more
        await notes(memory.redis, Quota(allowed=1)).reindex(batch_size=2)
    for embedder in (Quota(), memory.embedder):  # neither the new model nor the old one opens
        with pytest.raises(ReindexUnfinished, match="Run `arxivscout reindex` again"):
            await notes(memory.redis, embedder).open()

    again = notes(memory.redis, Quota())
    assert await again.reindex(batch_size=2) == WORKFLOWS
    await again.open()
    vector = (await Quota().embed(["find paper 0"]))[0]
    assert len(await found(again, scope, vector, WORKFLOWS)) == WORKFLOWS  # none left behind


async def test_a_bot_still_on_the_old_model_creates_no_index_during_or_after_a_reindex(
    memory, notes, tenant
):
    """Its index would have the old dimensions: every search of that tenant would then fail."""
    stale = notes(memory.redis, memory.embedder)  # started before the switch, still running
    await stale.open()
    await seeded(stale, Scope(tenant, user="u"), 2)

    with pytest.raises(EmbeddingError):  # a reindex under way (here: stopped part way)
        await notes(memory.redis, Quota(allowed=1)).reindex(batch_size=1)
    with pytest.raises(ReindexUnfinished):
        await seeded(stale, Scope(f"{tenant}-b", user="u"), 1)
    await notes(memory.redis, Quota()).reindex()  # and after it
    with pytest.raises(IndexModelMismatch, match="built with quota-16"):
        await seeded(stale, Scope(f"{tenant}-c", user="u"), 1)
    assert await stale.existing_indexes() == [stale.index_name(tenant)]  # the new model's

    fresh = notes(memory.redis, Quota())
    await fresh.open()
    scope = Scope(f"{tenant}-c", user="u")
    vector = (await Quota().embed(["find paper 0"]))[0]
    await fresh.add(scope, "find paper 0", ["arxiv_search_candidates"], "found", vector)
    assert len(await found(fresh, scope, vector, 1)) == 1  # its index has the new dimensions


async def test_a_start_rebuilding_while_a_reindex_begins_keeps_the_reindex_marked(
    memory, notes, tenant
):
    store = notes(memory.redis, memory.embedder)
    await old_records(memory, store, Scope(tenant, user="u"))

    class ReindexBegins(notes):
        async def _index(self, tenant: str | None) -> str:  # as this start rebuilds it, a
            name = await super()._index(tenant)  # reindex begins
            await self.redis.hset(INDEX_META_KEY, self.family(), REINDEXING)
            return name

    with pytest.raises(ReindexUnfinished):
        await ReindexBegins(memory.redis, memory.embedder).open()
    assert await memory.redis.hget(INDEX_META_KEY, store.family()) == REINDEXING.encode()


# -- 2. defaults of an older layout, after a failed rebuild and by `reindex` ----------------


async def old_records(memory, store: WorkflowStore, scope: Scope) -> list[str]:
    """Workflows stored before audiences, in indexes of an older layout."""
    await store.open()
    keys = await seeded(store, scope, 3)
    for key in keys:
        await memory.redis.hdel(key, "audience")
    await memory.redis.hset(INDEX_META_KEY, store.family(), f"{store.signature}#oldlayout")
    return keys


async def test_a_rebuild_that_failed_after_dropping_the_indexes_is_done_at_the_next_start(
    memory, notes, tenant
):
    scope = Scope(tenant, user="u")
    store = notes(memory.redis, memory.embedder)
    keys = await old_records(memory, store, scope)
    await store._drop(await store.existing_indexes())  # the rebuild died right after this
    with pytest.raises(IndexModelMismatch, match="built with all-MiniLM-L6-v2"):
        await notes(memory.redis, Quota()).open()  # not rebuilt over records of another model

    restarted = notes(memory.redis, memory.embedder)
    await restarted.open()
    assert [await memory.redis.hget(k, "audience") for k in keys] == [PUBLIC.encode()] * 3
    vector = await memory.embedder.embed_one("find a paper")
    assert len(await found(restarted, scope, vector, 3)) == 3
    recorded = (await memory.redis.hget(INDEX_META_KEY, store.family())).decode()
    assert recorded == f"{store.signature}#{store.layout()}"


async def test_reindex_gives_old_records_the_fields_the_layout_added(memory, notes, tenant):
    scope = Scope(tenant, user="u")
    store = notes(memory.redis, memory.embedder)
    keys = await old_records(memory, store, scope)
    assert await notes(memory.redis, memory.embedder).reindex() == 3  # `arxivscout reindex`
    assert [await memory.redis.hget(k, "audience") for k in keys] == [PUBLIC.encode()] * 3
    vector = await memory.embedder.embed_one("find a paper")
    assert len(await found(store, scope, vector, 3)) == 3


# -- 3-6. the command line's wrong inputs -----------------------------------------------------


async def arxivscout(capsys, *args: str) -> tuple[int, str, str]:
    """`app.cli.main` in a thread of its own (it starts its own event loop)."""
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


@pytest.mark.parametrize(
    ("variable", "value", "says"),
    [
        ("REDIS_URL", "localhost:6379", "REDIS_URL: Value error, should start with redis://"),
        ("REDIS_URL", "me:s3cret@db:6379", "REDIS_URL: Value error, should start with redis://"),
        ("REDIS_URL", "me:s3cret@db:6379", "(got '***@db:6379')"),  # no password shown
        ("REDISCLOUD_URL", "me:s3cret@db:6379", "REDISCLOUD_URL: Value error, should start"),
        ("REDIS_URL", "db:6379/?password=s3cret", "(got 'db:6379/?password=***')"),
        ("ARXIVSCOUT_EMBEDDING_DIMS", "0", "ARXIVSCOUT_EMBEDDING_DIMS: Input should be greater"),
        ("ARXIVSCOUT_EMBEDDING_DIMS", "-5", "ARXIVSCOUT_EMBEDDING_DIMS: Input should be greater"),
        ("PORT", "99999", "PORT: Input should be less than or equal to 65535"),
    ],
)
async def test_a_wrong_setting_is_one_line_naming_it(
    capsys, monkeypatch, data_dir, variable, value, says
):
    monkeypatch.delenv("REDIS_URL", raising=False)
    monkeypatch.setenv(variable, value)
    code, _, err = await arxivscout(capsys, "memory", "threads")
    assert code == 2 and says in err and "s3cret" not in err


async def test_a_port_out_of_range_is_refused_before_anything_starts(capsys):
    with pytest.raises(SystemExit) as stop:
        await asyncio.to_thread(cli.main, ["web", "--port", "99999"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "arxivscout web: error: argument --port: 99999 is not a port (0-65535)" in err


def test_a_port_in_use_is_one_line(cli_env):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", "web", "--host", "127.0.0.1", "--port", str(port)],
            env=cli_env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"arxivscout: error: cannot listen on 127.0.0.1:{port}: " in result.stderr
    assert "address already in use" in result.stderr


def test_a_host_that_does_not_resolve_is_one_line_naming_it(cli_env):
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "web", "--host", "no-such-host.invalid", "--port", "0"],
        env=cli_env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "arxivscout: error: cannot listen on no-such-host.invalid:0: " in result.stderr


async def test_an_output_file_in_a_missing_folder_is_one_line(capsys, memory, tenant, tmp_path):
    await memory.conversation.append(Scope(tenant, "t1"), "user", "keep me")
    target = tmp_path / "missing" / "x.jsonl"
    for args in (
        ("memory", "export", "--tenant", tenant, "-o", str(target)),
        ("eval", "feedback", "--tenant", tenant, "-o", str(target)),
    ):
        code, _, err = await arxivscout(capsys, *args)
        assert code == 2 and f"arxivscout: error: {target}.part: No such file" in err, args
    assert await memory.conversation.all(Scope(tenant, "t1"))  # nothing lost


LOCOMO = [
    {
        "sample_id": "s1",
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [{"speaker": "Ann", "dia_id": "D1:1", "text": "I run marathons."}],
        },
        "qa": [{"question": "What does Ann run?", "answer": "marathons", "evidence": ["D1:1"],
                "category": 4}],
    }
]  # fmt: skip


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('[{"conversation": ', "is not in LoCoMo's layout: Expecting value"),
        ('{"a": 1}', "is not in LoCoMo's layout: a list of conversations expected, not a dict"),
        ('[{"qa": []}]', "is not in LoCoMo's layout: no 'conversation' field"),
        (json.dumps([{**LOCOMO[0], "conversation": {**LOCOMO[0]["conversation"],
                      "session_1_date_time": "yesterday"}}]),
         "is not in LoCoMo's layout: time data 'yesterday' does not match"),
    ],
)  # fmt: skip
async def test_a_file_not_in_locomo_layout_is_one_line(capsys, tmp_path, content, says):
    data = tmp_path / "locomo.json"
    data.write_text(content)
    code, _, err = await arxivscout(capsys, "eval", "locomo", "--data", str(data))
    assert code == 2 and f"arxivscout: error: {data} {says}" in err


async def test_a_locomo_dump_in_a_missing_folder_is_one_line(capsys, tmp_path, redis_server):
    data = tmp_path / "locomo.json"
    data.write_text(json.dumps(LOCOMO))
    dump = tmp_path / "missing" / "dump.jsonl"
    code, _, err = await arxivscout(
        capsys, "eval", "locomo", "--data", str(data), "--dump", str(dump)
    )
    assert code == 2 and f"arxivscout: error: {dump}: No such file or directory" in err


# -- 5. embedding dimensions ---------------------------------------------------------------


async def test_fewer_dimensions_are_asked_of_the_models_that_give_them():
    async with ScriptedOpenAI(embedding_dims=1536) as server:
        settings = Settings(
            embeddings="openai", openai_api_key="k", openai_base_url=server.base_url,
            embedding_dims=512,
        )  # fmt: skip
        embedder = make_embedder(settings)
        try:
            assert (await embedder.embed(["a", "b"])).shape == (2, 512)
            assert server.embedding_requests[-1]["dimensions"] == 512
        finally:
            await embedder.aclose()


async def test_vectors_of_another_size_than_configured_name_the_setting():
    async with ScriptedOpenAI(embedding_dims=768) as server:
        settings = Settings(
            embeddings="openai", openai_api_key="k", openai_base_url=server.base_url,
            openai_embedding_model="nomic-embed-text", embedding_dims=512,
        )  # fmt: skip
        embedder = make_embedder(settings)
        try:
            with pytest.raises(EmbeddingError, match="ARXIVSCOUT_EMBEDDING_DIMS=768"):
                await embedder.embed(["a"])
            assert "dimensions" not in server.embedding_requests[-1]  # a model that has none
        finally:
            await embedder.aclose()


# -- 7. the episodic back-fill, tried again ---------------------------------------------------


async def test_a_failed_backfill_is_released_and_tried_again(tmp_path, local_embedder, tenant):
    """Its own Redis: the back-fill is once per Redis, and the suite's is long done."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port(), **redis_options())
    url = server.ensure_running()
    client = await connect(url, warm=0)
    try:
        thread = "slack:T:C1:1.0"
        old = {"role": "user", "content": "the cryostat arrives Tuesday", "id": "msg_1",
               "thread_id": thread, "timestamp": 1.7e9, "metadata": {}, "summary_id": ""}  # fmt: skip
        await client.rpush(messages_key(tenant, thread), json.dumps(old))
        await client.zadd(threads_key(tenant), {thread: 1.7e9})
        memory = MemoryManager(client, CachedEmbedder(local_embedder, client))
        stream = task_stream(f"s24-{uuid.uuid4().hex[:8]}")
        await client.set(stream, "not a stream")  # Redis refuses the first tasks (WRONGTYPE)
        background = BackgroundWork(TaskStream(client, stream))
        queued: list[dict] = []

        async def index(tasks: list[dict]) -> None:
            queued.extend(tasks)

        background.handle({EPISODES: index})
        upkeep = Upkeep(memory, Consolidator(memory, None), background)
        upkeep.backfill_retry_seconds = 0.05
        try:
            with pytest.raises(ResponseError):
                await client.xadd(stream, {"probe": "1"})
            assert await upkeep.backfill() == 0  # the start goes on
            assert await client.get(upgrade_key(BACKFILL)) != b"running"  # claim given up
            await client.delete(stream)  # Redis takes tasks again
            for _ in range(200):
                if await memory.upgrades.done(BACKFILL) and queued:
                    break
                await asyncio.sleep(0.05)
            assert await memory.upgrades.done(BACKFILL)  # the background loop did it
            assert [m["id"] for t in queued for m in t["messages"]] == ["msg_1"]
        finally:
            await background.close()
    finally:
        await client.aclose()
        server.stop()


async def test_a_backfill_failing_again_is_tried_less_and_less_often(
    tmp_path, local_embedder, tenant, caplog
):
    """Each try queues again what the failed one had queued: not every minute forever."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port(), **redis_options())
    client = await connect(server.ensure_running(), warm=0)
    try:
        thread = "slack:T:C1:1.0"
        old = {"role": "user", "content": "the cryostat arrives Tuesday", "id": "msg_1",
               "thread_id": thread, "timestamp": 1.7e9, "metadata": {}, "summary_id": ""}  # fmt: skip
        await client.rpush(messages_key(tenant, thread), json.dumps(old))
        await client.zadd(threads_key(tenant), {thread: 1.7e9})
        memory = MemoryManager(client, CachedEmbedder(local_embedder, client))
        stream = task_stream(f"s24-{uuid.uuid4().hex[:8]}")
        await client.set(stream, "not a stream")  # every try fails (WRONGTYPE)
        background = BackgroundWork(TaskStream(client, stream))
        upkeep = Upkeep(memory, Consolidator(memory, None), background)
        upkeep.backfill_retry_seconds, upkeep.backfill_retry_max_seconds = 0.01, 0.04
        caplog.set_level(logging.ERROR, logger="bot.upkeep")
        try:
            assert await upkeep.backfill() == 0
            for _ in range(400):
                delays = [r.args[0] for r in caplog.records if "back-fill" in r.getMessage()]
                if len(delays) >= 4:
                    break
                await asyncio.sleep(0.01)
            assert delays[:4] == [0.01, 0.02, 0.04, 0.04]  # doubled, up to the cap
        finally:
            await background.close()
    finally:
        await client.aclose()
        server.stop()


async def test_releasing_a_step_whose_finish_went_through_keeps_it_done(memory):
    """`finish` applied but its reply lost: the failure path releases, and must not undo it."""
    upgrades, step = Upgrades(memory.redis), f"s24-step-{uuid.uuid4().hex[:8]}"
    try:
        assert await upgrades.claim(step)
        await upgrades.finish(step)
        await upgrades.release(step)
        assert await upgrades.done(step)
        assert not await upgrades.claim(step)  # not run again
    finally:
        await memory.redis.delete(upgrade_key(step))


# -- 8. `eval scenario` on a keyless local model ---------------------------------------------


def test_eval_scenario_runs_on_a_local_model_without_a_key(cli_env, tenant):
    arxiv = memgpt_arxiv()
    model = ScriptedOpenAI(responder=scenario_model)
    env = {**cli_env, "OPENAI_BASE_URL": model.start_in_thread(),
           "ARXIV_API_URL": arxiv.api_url, "ARXIV_DELAY_SECONDS": "0"}  # fmt: skip
    try:
        result = subprocess.run(
            [sys.executable, "-m", "app.cli", "eval", "scenario", "--tenant", tenant],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        model.stop()
        arxiv.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all steps passed" in result.stdout
