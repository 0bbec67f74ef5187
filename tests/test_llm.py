"""bot.llm against the scripted OpenAI-compatible server, over real HTTP with the real SDK."""

from __future__ import annotations

import socket
import time
from collections.abc import AsyncIterator

import openai
import pytest

from app.runtime import llm_client
from app.settings import Settings
from bot.errors import ConfigError
from bot.llm import (
    PLACEHOLDER_API_KEY,
    ChatReply,
    LLMAuthError,
    LLMBadRequest,
    LLMClient,
    LLMConfigError,
    LLMResponseError,
    LLMTimeout,
    LLMUnavailable,
    RetryPolicy,
    extract_json,
)
from tests.support.scripted_openai import (
    EXHAUSTED_MESSAGE,
    ScriptedOpenAI,
    call,
    error,
    fake_embedding,
    text,
    tool_calls,
)

FAST = RetryPolicy(max_attempts=3, base_delay=0.01, max_delay=0.05)
QUESTION = [{"role": "user", "content": "Can you get me the paper MemGPT"}]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedOpenAI]:
    async with ScriptedOpenAI() as srv:
        yield srv


_open_clients: list[LLMClient] = []


@pytest.fixture(autouse=True)
async def _close_clients() -> AsyncIterator[None]:
    """Close every client a test made, so no socket outlives its test."""
    yield
    while _open_clients:
        await _open_clients.pop().aclose()


def make_client(server: ScriptedOpenAI, **kw: object) -> LLMClient:
    options: dict[str, object] = {
        "api_key": "sk-test",
        "base_url": server.base_url,
        "model": "test-model",
        "timeout_seconds": 5.0,
        "retry": FAST,
    }
    options.update(kw)
    client = LLMClient(**options)  # type: ignore[arg-type]
    _open_clients.append(client)
    return client


# -- construction ----------------------------------------------------------------------------
def test_missing_key_without_base_url_names_the_variable() -> None:
    with pytest.raises(LLMConfigError, match="OPENAI_API_KEY") as info:
        llm_client(Settings(openai_api_key=None, openai_base_url=None))
    assert isinstance(info.value, ConfigError)  # the CLI's config handler catches it too


async def test_base_url_without_key_sends_placeholder(server: ScriptedOpenAI) -> None:
    server.script(text("hi"))
    settings = Settings(
        openai_base_url=server.base_url, openai_model="llama3", llm_timeout_seconds=5
    )
    async with llm_client(settings, retry=FAST) as client:
        reply = await client.chat(QUESTION)
    assert reply.content == "hi"
    assert server.request_headers[0]["Authorization"] == f"Bearer {PLACEHOLDER_API_KEY}"
    assert server.requests[0]["model"] == "llama3"


# -- answers -----------------------------------------------------------------------------------
async def test_plain_answer(server: ScriptedOpenAI) -> None:
    server.script(text("MemGPT is arXiv:2310.08560."))
    reply = await make_client(server).chat(QUESTION)
    assert reply.content == "MemGPT is arXiv:2310.08560."
    assert reply.is_final and reply.tool_calls == ()
    assert reply.finish_reason == "stop"
    assert reply.usage is not None and reply.usage.total_tokens > 0
    body = server.requests[0]
    assert body["messages"] == QUESTION
    assert body["model"] == "test-model"
    assert "tools" not in body


async def test_tool_calls_are_parsed_with_raw_arguments(server: ScriptedOpenAI) -> None:
    server.script(
        tool_calls(
            call("arxiv_search_candidates", {"query": "MemGPT"}, id="c1"),
            call("expand_summary", '{"summary_id": ', id="c2"),
        )
    )
    tools = [
        {
            "type": "function",
            "function": {"name": "arxiv_search_candidates", "parameters": {"type": "object"}},
        }
    ]
    reply = await make_client(server).chat(QUESTION, tools=tools)
    assert not reply.is_final
    assert [(tc.id, tc.name, tc.arguments) for tc in reply.tool_calls] == [
        ("c1", "arxiv_search_candidates", '{"query": "MemGPT"}'),
        ("c2", "expand_summary", '{"summary_id": '),  # malformed JSON passes through untouched
    ]
    assert reply.finish_reason == "tool_calls"
    assert server.requests[0]["tools"] == tools
    assert server.requests[0]["tool_choice"] == "auto"
    message = reply.assistant_message()
    assert message["tool_calls"][0]["function"] == {
        "name": "arxiv_search_candidates",
        "arguments": '{"query": "MemGPT"}',
    }


async def test_follow_up_request_carries_tool_results(server: ScriptedOpenAI) -> None:
    server.script(tool_calls(call("search", {"q": "x"}, id="c1")), text("done"))
    client = make_client(server)
    messages = list(QUESTION)
    first = await client.chat(messages)
    messages += [
        first.assistant_message(),
        {"role": "tool", "tool_call_id": "c1", "content": "result text"},
    ]
    assert (await client.chat(messages)).content == "done"
    seen = server.requests[1]["messages"]
    assert seen[1]["tool_calls"][0]["id"] == "c1"
    assert seen[2] == {"role": "tool", "tool_call_id": "c1", "content": "result text"}


# -- retries and errors ------------------------------------------------------------------------
async def test_retries_429_then_succeeds(server: ScriptedOpenAI) -> None:
    server.script(error(429, "slow down"), text("ok"))
    reply = await make_client(server).chat(QUESTION)
    assert reply.content == "ok"
    assert len(server.requests) == 2


async def test_500s_exhaust_retries(server: ScriptedOpenAI) -> None:
    server.script(error(500), error(502), error(503), text("never reached"))
    with pytest.raises(LLMUnavailable, match="HTTP 503") as info:
        await make_client(server).chat(QUESTION)
    assert info.value.attempts == 3 and info.value.status == 503
    assert len(server.requests) == 3
    assert server.remaining == 1


async def test_timeout_is_retried_then_raised(server: ScriptedOpenAI) -> None:
    server.script(text("late", delay=2.0), text("late", delay=2.0))
    client = make_client(
        server,
        timeout_seconds=0.2,
        retry=RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.02),
    )
    started = time.monotonic()
    with pytest.raises(LLMTimeout, match=r"did not answer within 0\.2s"):
        await client.chat(QUESTION)
    assert time.monotonic() - started < 1.5
    assert len(server.requests) == 2


async def test_401_is_auth_error_without_retry(server: ScriptedOpenAI) -> None:
    server.script(error(401, "Incorrect API key provided"), text("unused"))
    with pytest.raises(LLMAuthError, match="OPENAI_API_KEY") as info:
        await make_client(server).chat(QUESTION)
    assert "Incorrect API key provided" in str(info.value)
    assert len(server.requests) == 1


async def test_404_is_bad_request_naming_the_model_setting(server: ScriptedOpenAI) -> None:
    server.script(error(404, "model 'nope' not found"))
    with pytest.raises(LLMBadRequest, match="OPENAI_MODEL"):
        await make_client(server).chat(QUESTION)
    assert len(server.requests) == 1


async def test_quota_429_is_not_retried(server: ScriptedOpenAI) -> None:
    server.script(error(429, "You exceeded your current quota", code="insufficient_quota"))
    with pytest.raises(LLMUnavailable, match="out of quota"):
        await make_client(server).chat(QUESTION)
    assert len(server.requests) == 1


async def test_retry_after_header_is_honoured_up_to_max_delay(server: ScriptedOpenAI) -> None:
    server.script(error(429, headers={"Retry-After": "30"}), text("ok"))
    client = make_client(server, retry=RetryPolicy(max_attempts=2, base_delay=0.01, max_delay=0.3))
    started = time.monotonic()
    assert (await client.chat(QUESTION)).content == "ok"
    assert 0.3 <= time.monotonic() - started < 2.0


async def test_connection_refused_is_unavailable() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = LLMClient(api_key=None, base_url=f"http://127.0.0.1:{port}/v1", retry=FAST)
    _open_clients.append(client)
    with pytest.raises(LLMUnavailable, match="Cannot reach") as info:
        await client.chat(QUESTION)
    assert info.value.attempts == 3


async def test_exhausted_script_says_so(server: ScriptedOpenAI) -> None:
    client = make_client(server, retry=RetryPolicy(max_attempts=1))
    with pytest.raises(LLMUnavailable, match="script is exhausted"):
        await client.chat(QUESTION)


# -- streaming -----------------------------------------------------------------------------------
async def test_streaming_text_reaches_callback(server: ScriptedOpenAI) -> None:
    server.stream_chunk_chars = 4
    server.script(text("Streaming answers arrive piece by piece."))
    pieces: list[str] = []

    async def on_delta(piece: str) -> None:
        pieces.append(piece)

    reply = await make_client(server).chat(QUESTION, on_delta=on_delta)
    assert len(pieces) > 3
    assert "".join(pieces) == reply.content == "Streaming answers arrive piece by piece."
    assert reply.finish_reason == "stop"
    assert reply.usage is not None and reply.usage.total_tokens > 0
    assert server.requests[0]["stream"] is True


async def test_streaming_tool_calls_are_assembled(server: ScriptedOpenAI) -> None:
    server.script(
        tool_calls(
            call("fetch_and_save_paper_to_kb_db", {"arxiv_id": "2310.08560"}, id="c9"),
            call("noop", id="c10"),
        )
    )
    reply = await make_client(server).chat(QUESTION, on_delta=lambda _: None)
    assert [(tc.id, tc.name, tc.arguments) for tc in reply.tool_calls] == [
        ("c9", "fetch_and_save_paper_to_kb_db", '{"arxiv_id": "2310.08560"}'),
        ("c10", "noop", "{}"),
    ]


async def test_streaming_retries_before_any_text(server: ScriptedOpenAI) -> None:
    server.script(error(503), text("second try"))
    reply = await make_client(server).chat(QUESTION, on_delta=lambda _: None)
    assert reply.content == "second try"
    assert len(server.requests) == 2


# -- helpers for the harness -------------------------------------------------------------------
async def test_complete_text_and_json(server: ScriptedOpenAI) -> None:
    entities = '[{"name": "MemGPT", "type": "system", "description": "OS-style memory"}]'
    server.script(text("  A short summary.\n"), text(f"Here you go:\n```json\n{entities}\n```"))
    client = make_client(server)
    assert await client.complete_text(QUESTION) == "A short summary."
    assert await client.complete_json(QUESTION) == [
        {"name": "MemGPT", "type": "system", "description": "OS-style memory"}
    ]


async def test_complete_json_without_json_and_empty_text(server: ScriptedOpenAI) -> None:
    server.script(text("no json here"), text("   "))
    client = make_client(server)
    with pytest.raises(LLMResponseError, match="no JSON"):
        await client.complete_json(QUESTION)
    with pytest.raises(LLMResponseError, match="empty answer"):
        await client.complete_text(QUESTION)


def test_extract_json_variants() -> None:
    assert extract_json('{"a": 1}') == {"a": 1}
    assert extract_json("prefix [1, 2] suffix") == [1, 2]
    assert extract_json('```\n{"b": [true]}\n```') == {"b": [True]}
    assert extract_json('junk { not json } then {"c": null}') == {"c": None}


# -- the scripted server itself ----------------------------------------------------------------
async def test_responder_scripts_dynamically(server: ScriptedOpenAI) -> None:
    server.responder = lambda body: text(f"you said {body['messages'][-1]['content']}")
    client = make_client(server)
    assert (await client.chat([{"role": "user", "content": "a"}])).content == "you said a"
    assert (await client.chat([{"role": "user", "content": "b"}])).content == "you said b"


async def test_embeddings_are_deterministic(server: ScriptedOpenAI) -> None:
    sdk = openai.AsyncOpenAI(api_key="x", base_url=server.base_url, max_retries=0)
    first = await sdk.embeddings.create(model="m", input=["alpha", "beta"])
    again = await sdk.embeddings.create(model="m", input="alpha", dimensions=16)
    assert len(first.data) == 2 and len(first.data[0].embedding) == server.embedding_dims
    assert first.data[0].embedding == pytest.approx(fake_embedding("alpha", 8))
    assert first.data[0].embedding != first.data[1].embedding
    assert len(again.data[0].embedding) == 16
    assert server.embedding_requests[0]["input"] == ["alpha", "beta"]
    assert server.requests == []
    await sdk.close()


def test_server_in_thread_with_sync_client() -> None:
    with ScriptedOpenAI([text("from a thread")]) as server:
        sdk = openai.OpenAI(api_key="x", base_url=server.base_url, max_retries=0)
        completion = sdk.chat.completions.create(model="m", messages=QUESTION)
        assert completion.choices[0].message.content == "from a thread"
        with pytest.raises(openai.InternalServerError, match="exhausted"):
            sdk.chat.completions.create(model="m", messages=QUESTION)
        sdk.close()
    assert EXHAUSTED_MESSAGE.startswith("ScriptedOpenAI")


def test_chat_reply_assistant_message_without_tools() -> None:
    assert ChatReply(content="hi").assistant_message() == {"role": "assistant", "content": "hi"}
