"""How a turn ends when something around the model fails: a re-run of a turn whose answer was
stored gives that answer again (the model is not asked twice); an empty final answer is a
failure, not an answer to learn from; a status update the platform fails to show is skipped;
an embedding service that refuses, throttles or errs is said as such (never as Redis down,
never "your message is saved" when it was not). Over the scripted OpenAI-compatible server
and a real Redis."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import openai
import pytest
from aiohttp import web

from adapters.discord_platform import StepStatus
from adapters.spine import MEMORY_DOWN, Job, Pipeline, error_kind
from app.runtime import open_agent
from app.settings import Settings
from bot.agent import EMPTY, AgentEvent
from bot.llm import openai_client
from memory.embeddings import EmbeddingError, OpenAIEmbedder
from memory.errors import memory_unavailable
from memory.redis_server import EmbeddedRedis
from memory.scope import Scope
from tests.agent_world import close_world, open_world
from tests.conftest import free_port
from tests.support.scripted_openai import ScriptedOpenAI, _error_response, call, text, tool_calls
from tests.test_turn_recovery import Board, fast, until


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def test_a_turn_run_again_after_its_answer_was_stored_gives_that_answer(world, tenant):
    """The first run stored its answer, then died (before its job recorded it): the run that
    takes the job over delivers the stored answer, and asks the model nothing."""
    scope = Scope(tenant, "answered-before")
    world.model.script(text("Answer A."), text("Answer B."))
    first = await world.agent.run_turn(scope, "What is MemGPT?", turn_id="job-1")
    again = await world.agent.run_turn(scope, "What is MemGPT?", turn_id="job-1")
    assert (first.answer, again.answer) == ("Answer A.", "Answer A.")
    assert again.stop_reason == "final" and again.turn_id == first.turn_id
    assert len(world.model_requests()) == 1
    stored = [m.content for m in await world.runtime.memory.conversation.all(scope)]
    assert stored == ["What is MemGPT?", "Answer A."]


async def test_an_empty_final_answer_is_a_failure_that_says_what_was_done(world, tenant):
    scope = Scope(tenant, "empty")
    world.model.script(tool_calls(call("search_knowledge_base", {"query": "MemGPT"})), text(""))
    result = await world.agent.run_turn(scope, "What is MemGPT?", turn_id="job-empty")
    assert result.stop_reason == "empty" and result.answer.startswith(EMPTY)
    assert "What I did so far:\n- search_knowledge_base: success" in result.answer
    record = await world.runtime.memory.turn_records.get(tenant, "job-empty")
    assert record.stop_reason == "empty"


async def test_a_status_update_that_fails_does_not_fail_the_turn(world, tenant):
    """A platform's status callback failing in passing (its network, a timeout) is skipped:
    the turn goes on to its answer."""
    world.model.script(tool_calls(call("search_knowledge_base", {"query": "MemGPT"})),
                       text("MemGPT pages memory."))  # fmt: skip
    failures = iter([aiohttp.ServerDisconnectedError(), TimeoutError(), OSError("reset")])

    async def on_event(event: AgentEvent) -> None:
        raise next(failures)

    result = await world.agent.run_turn(Scope(tenant, "status"), "What is MemGPT?", on_event)
    assert (result.answer, result.stop_reason) == ("MemGPT pages memory.", "final")


async def test_a_status_update_failing_otherwise_is_logged_as_a_warning(world, tenant, caplog):
    """A callback failing for another reason (its bug) does not fail the turn either, but is
    logged with its traceback, not noted quietly as a network failure is."""

    async def on_event(event: AgentEvent) -> None:
        raise KeyError("no such status message")

    world.model.script(tool_calls(call("search_knowledge_base", {"query": "MemGPT"})),
                       text("MemGPT pages memory."))  # fmt: skip
    with caplog.at_level(logging.INFO, logger="bot.agent"):
        result = await world.agent.run_turn(Scope(tenant, "buggy"), "What is MemGPT?", on_event)
    assert (result.answer, result.stop_reason) == ("MemGPT pages memory.", "final")
    failed = [r for r in caplog.records if "status update" in r.getMessage()]
    assert failed and all(r.levelno == logging.WARNING and r.exc_info for r in failed)


class FailingChannel:
    """A Discord channel whose every post fails as the network or its API can."""

    def __init__(self, failure: BaseException) -> None:
        self.failure = failure
        self.sent = 0

    async def send(self, *args, **kwargs):
        self.sent += 1
        raise self.failure


@pytest.mark.parametrize(
    "failure",
    [aiohttp.ServerDisconnectedError(), aiohttp.ClientConnectionError("reset"), TimeoutError()],
)
async def test_a_discord_tool_status_that_cannot_be_posted_is_skipped(failure):
    channel = FailingChannel(failure)
    status = StepStatus(channel)  # type: ignore[arg-type]
    await status.event(AgentEvent("tool_start", "search_knowledge_base"))
    await status.event(AgentEvent("tool_end", "search_knowledge_base", "success"))
    assert channel.sent == 2 and status.message is None


class Embeddings(ScriptedOpenAI):
    """The scripted server, whose embeddings endpoint can be made to fail with `status`."""

    status: int | None = None

    async def _embeddings(self, request: web.Request) -> web.Response:
        if self.status is not None:
            return _error_response(self.status, f"the service refused key sk-...{SECRET}")
        return await super()._embeddings(request)


SECRET = "Zq9x"  # a masked key's suffix, as a provider's 401 text holds one


@pytest.mark.parametrize("failure", ["refused", 429, 500, 401, 404])
async def test_an_embedding_service_failing_is_said_and_the_message_not_claimed_saved(
    tmp_path, tenant, failure
):
    """The question is embedded before it is stored: an embedding service that refuses the
    connection, throttles or errs ends the turn with a reply naming it (not Redis, whose
    outage would keep the job waiting for ever) and asking to send the message again; one
    that refuses the key or knows no such model (not passing) says what to check. The reply
    names the kind of failure, not the provider's text (a key's suffix, an internal URL)."""
    server = EmbeddedRedis(tmp_path / "redis", preferred_port=free_port())
    model = Embeddings()
    await model.start()
    settings = Settings(
        redis_url=server.ensure_running(), data_dir=tmp_path, openai_api_key="test-key",
        openai_base_url=model.base_url, embeddings="openai", embedding_dims=8,
        llm_timeout_seconds=5.0,
    )  # fmt: skip
    runtime = await open_agent(settings)
    board = Board()
    pipeline = fast(Pipeline(board, runtime.turns()))
    scope = Scope(tenant, f"embeddings-{failure}")
    job = Job("turn", scope, "What is MemGPT?", event_id=f"EvEmbed{failure}")
    try:
        if failure == "refused":
            await model.close()  # its port closed: the connection is refused
        else:
            model.status = int(failure)
        assert await pipeline.submit(job)
        turns = runtime.memory.turns
        for _ in range(400):
            if await turns.delivered(scope, job.id):
                break
            await asyncio.sleep(0.05)
        await pipeline.wait_idle()
        await until(lambda: board.placeholders.get("p0", "Thinking…") != "Thinking…")
        reply = board.placeholders["p0"]
        assert reply != MEMORY_DOWN and "embedding model" in reply and "was not saved" in reply
        assert SECRET not in reply and model.base_url not in reply
        kind = "connection refused" if failure == "refused" else f"(HTTP {failure})"
        assert kind in reply
        if failure in (401, 404):  # its setup's: waiting does not help
            assert reply.startswith("Sorry, the embedding model failed") and "check" in reply
            assert "could not reach" not in reply and "in a moment" not in reply
        else:
            assert "could not reach" in reply and "please send it again" in reply
        assert await turns.delivered(scope, job.id)
        assert await runtime.memory.conversation.all(scope) == []
        assert model.requests == []  # the model was never asked
    finally:
        await pipeline.close()
        await runtime.close()
        await model.close()
        server.stop()


async def test_an_embedding_error_from_a_refused_connection_is_not_memory_down():
    client = openai_client("k", f"http://127.0.0.1:{free_port()}/v1", 5.0, max_retries=0)
    embedder = OpenAIEmbedder(client)
    try:
        with pytest.raises(Exception) as caught:
            await embedder.embed(["a question"])
    finally:
        await embedder.aclose()
    chain, exc = [], caught.value
    while exc is not None:
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    assert any(isinstance(e, ConnectionRefusedError) for e in chain)  # what misled it before
    assert not memory_unavailable(caught.value)


def test_our_own_error_raised_from_another_is_said_whole():
    """Our own instruction, raised from what caused it (as `_load_torch` raises it from an
    ImportError), reaches the reply whole; a provider's error text is still shortened."""
    not_installed = (
        "The local embedding model is not installed: pip install 'arxivscout[local]' "
        "(or set ARXIVSCOUT_EMBEDDINGS=openai)."
    )
    try:
        try:
            import arxivscout_no_such_module  # noqa: F401
        except ImportError as exc:
            raise EmbeddingError(not_installed) from exc
    except EmbeddingError as caught:
        assert isinstance(caught.__cause__, ModuleNotFoundError)
        assert error_kind(caught) == not_installed
    try:
        try:
            raise openai.OpenAIError(f"bad request for key sk-...{SECRET}")
        except openai.OpenAIError as exc:
            raise EmbeddingError(f"OpenAI embeddings failed: {exc}") from exc
    except EmbeddingError as caught:
        assert error_kind(caught) == "OpenAIError" and SECRET not in error_kind(caught)
