"""A model server that answers 200 with a body that is not the OpenAI format (OPENAI_BASE_URL at a
web UI, a proxy's login page): a turn, streamed or not, `/summarize` and `arxivscout ask` say to
check OPENAI_BASE_URL, once (no retry: the same page comes back), and the question stays stored.
It was a traceback, "something went wrong", "the answer was cut off" or a raw JSON error.
Over a local HTTP server and a real Redis."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from aiohttp import web

from app.runtime import open_agent
from app.settings import Settings
from bot.consolidation import SUMMARY_INSTRUCTIONS
from bot.harness import ENTITY_INSTRUCTIONS
from bot.llm import (
    LLMClient,
    LLMNotOpenAIFormat,
    LLMStreamCut,
    LLMUnavailable,
    RetryPolicy,
    failure_kind,
)
from memory.scope import Scope
from tests.support.threaded import ThreadedServer

SAID = "the model server did not answer in the OpenAI format; check OPENAI_BASE_URL"
BODIES = {
    "html": ("<html><body>Welcome to the web UI</body></html>", "text/html"),
    "bad-json": ("not json at all", "application/json"),
}


class NotOpenAI(ThreadedServer):
    """Answers every request 200 with one body that is not the OpenAI format."""

    def __init__(self, body: str, content_type: str) -> None:
        self.body, self.content_type = body, content_type
        self.requests: list[dict[str, Any]] = []
        self._runner: web.AppRunner | None = None

    async def _answer(self, request: web.Request) -> web.Response:
        if request.can_read_body:
            self.requests.append(await request.json())
        return web.Response(text=self.body, content_type=self.content_type)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return f"http://127.0.0.1:{port}/v1"

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def turn_requests(self) -> list[dict[str, Any]]:
        """The agent loop's requests (not the harness's entity and summary calls)."""
        return [r for r in self.requests if r["messages"][0]["content"] not in
                (ENTITY_INSTRUCTIONS, SUMMARY_INSTRUCTIONS)]  # fmt: skip


@pytest.fixture(params=list(BODIES))
def server(request):
    server = NotOpenAI(*BODIES[request.param])
    server.url = server.start_in_thread()
    yield server
    server.stop()


@pytest.fixture
async def runtime(server, redis_url, tmp_path):
    config = Settings(
        redis_url=redis_url, data_dir=tmp_path, openai_api_key="test-key",
        openai_base_url=server.url, arxiv_delay_seconds=0.0, llm_timeout_seconds=10.0,
    )  # fmt: skip
    runtime = await open_agent(config)
    runtime.llm.retry = type(runtime.llm.retry)(max_attempts=3, base_delay=0.01, max_delay=0.02)
    yield runtime
    await runtime.close()


@pytest.mark.parametrize("streamed", [False, True])
async def test_a_turn_says_to_check_the_base_url(server, runtime, tenant, streamed):
    scope = Scope(tenant, f"not-openai-{streamed}")
    shown: list[str] = []
    reply = await runtime.turns().handle(
        scope, "What is MemGPT?", on_delta=shown.append if streamed else None
    )
    assert reply.result is not None and reply.result.stop_reason == "error", reply.text
    assert SAID in reply.text and "Your message is saved" in reply.text, reply.text
    assert "try again" not in reply.text and "cut off" not in reply.text
    assert "Welcome" not in reply.text and "Expecting value" not in reply.text
    assert not "".join(shown)
    assert len(server.turn_requests()) == 1  # not asked again: the same page would come back
    stored = await runtime.memory.conversation.all(scope)
    assert [(m.role, m.content) for m in stored] == [
        ("user", "What is MemGPT?"),
        ("assistant", reply.text),
    ]


async def test_summarize_says_to_check_the_base_url(runtime, tenant):
    scope = Scope(tenant, "not-openai-summary")
    for i in range(3):
        await runtime.memory.conversation.append(scope, "user", f"Point {i} about MemGPT.")
    said = await runtime.turns().summarize(scope)
    assert said == f"Could not summarize this thread: {SAID}.", said


def test_ask_says_to_check_the_base_url_and_exits_1(server, cli_env, tenant):
    env = {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": server.url}
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "ask", "--tenant", tenant, "--thread", "q",
         "What is MemGPT?"], env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    assert SAID in done.stdout, (done.stdout, done.stderr)
    assert done.returncode == 1


# -- what is not a format error ---------------------------------------------------------------
CHAT = {"id": "c", "object": "chat.completion", "created": 1, "model": "m", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}  # fmt: skip
CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [
    {"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}  # fmt: skip
USAGE = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}


def events(*chunks: dict[str, Any]) -> str:
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"


@pytest.fixture
def scripted():
    server = NotOpenAI("", "text/plain")  # each test sets the body and content type it sends
    server.url = server.start_in_thread()
    yield server
    server.stop()


def client_of(server: NotOpenAI, api_key: str = "test-key") -> LLMClient:
    retry = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.02)
    return LLMClient(api_key=api_key, base_url=server.url, retry=retry, timeout_seconds=10.0)


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_error_sent_with_200_is_the_model_s_and_retried(scripted, streamed):
    """OpenRouter sends an error that comes after the model started with status 200."""
    scripted.body = json.dumps({"error": {"code": 502, "message": "upstream overloaded"}})
    scripted.content_type = "application/json"
    async with client_of(scripted) as llm:
        with pytest.raises(LLMUnavailable) as caught:
            await llm.chat(
                [{"role": "user", "content": "q"}], on_delta=[].append if streamed else None
            )
    assert caught.value.status == 502 and caught.value.attempts == 3
    assert failure_kind(caught.value) == "the model service is unavailable (HTTP 502)"
    assert len(scripted.requests) == 3


@pytest.mark.parametrize(
    "api_key, content",
    [("sk-ke\u201cy", "q"), ("test-key", "a lone \ud83d surrogate")],
    ids=["non-ascii-key", "lone-surrogate"],
)
async def test_a_request_that_cannot_be_sent_is_no_format_error(scripted, api_key, content):
    scripted.body, scripted.content_type = json.dumps(CHAT), "application/json"
    async with client_of(scripted, api_key) as llm:
        with pytest.raises(Exception) as caught:
            await llm.chat([{"role": "user", "content": content}])
    assert not isinstance(caught.value, LLMNotOpenAIFormat), caught.value
    assert not scripted.requests


@pytest.mark.parametrize("usage_chunk", [
    {**CHUNK, "choices": None, "usage": USAGE},
    {key: value for key, value in {**CHUNK, "usage": USAGE}.items() if key != "choices"},
], ids=["choices-null", "no-choices"])  # fmt: skip
async def test_a_closing_usage_chunk_without_choices_keeps_the_answer(scripted, usage_chunk):
    scripted.body, scripted.content_type = events(CHUNK, usage_chunk), "text/event-stream"
    shown: list[str] = []
    async with client_of(scripted) as llm:
        reply = await llm.chat([{"role": "user", "content": "q"}], on_delta=shown.append)
    assert (reply.content, shown, reply.finish_reason) == ("hi", ["hi"], "stop")
    assert reply.usage is not None and reply.usage.total_tokens == 4


async def test_a_server_that_does_not_stream_gives_its_answer_at_once(scripted):
    scripted.body, scripted.content_type = json.dumps(CHAT), "application/json"
    shown: list[str] = []
    async with client_of(scripted) as llm:
        reply = await llm.chat([{"role": "user", "content": "q"}], on_delta=shown.append)
    assert (reply.content, shown, reply.finish_reason) == ("hi", ["hi"], "stop")
    assert len(scripted.requests) == 1


async def test_an_empty_stream_of_no_known_type_is_a_cut(scripted):
    scripted.body, scripted.content_type = "", "application/octet-stream"
    async with client_of(scripted) as llm:
        with pytest.raises(LLMStreamCut) as caught:
            await llm.chat([{"role": "user", "content": "q"}], on_delta=[].append)
    assert caught.value.attempts == 3 and len(scripted.requests) == 3
