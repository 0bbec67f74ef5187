"""A wrong model address is said as one: an unresolvable host, a TLS failure or a closed port
is "Cannot reach the model server at <url>: <why>", never "did not answer within 60s" (the
aiohttp transport reports all three as connect timeouts); and a 404 from a base URL missing
its /v1 points at OPENAI_BASE_URL, not only at OPENAI_MODEL."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest

from bot.llm import LLMBadRequest, LLMClient, LLMUnavailable, RetryPolicy
from tests.support.scripted_openai import ScriptedOpenAI, error

ONCE = RetryPolicy(max_attempts=1, base_delay=0.01, max_delay=0.01)
QUESTION = [{"role": "user", "content": "What is MemGPT?"}]


@pytest.fixture
async def server() -> AsyncIterator[ScriptedOpenAI]:
    async with ScriptedOpenAI() as srv:
        yield srv


async def ask(base_url: str, stream: bool = False) -> BaseException:
    client = LLMClient(api_key="sk-test", base_url=base_url, timeout_seconds=10.0, retry=ONCE)
    try:
        await client.chat(QUESTION, on_delta=(lambda piece: None) if stream else None)
    except Exception as exc:
        return exc
    finally:
        await client.aclose()
    raise AssertionError("the call succeeded")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_unresolvable_host_is_unreachable_not_slow(stream: bool) -> None:
    url = "http://nonexistent.invalid:1/v1"  # .invalid never resolves: no internet needed
    failure = await ask(url, stream)
    assert isinstance(failure, LLMUnavailable), failure
    assert str(failure).startswith(f"Cannot reach the model server at {url}: "), failure
    assert "resolve the host name" in str(failure)
    assert "did not answer" not in str(failure)


async def test_tls_to_a_plain_http_server_is_unreachable_not_slow(server: ScriptedOpenAI) -> None:
    url = server.base_url.replace("http://", "https://")
    failure = await ask(url)
    assert isinstance(failure, LLMUnavailable), failure
    assert str(failure).startswith(f"Cannot reach the model server at {url}: TLS failed"), failure


async def test_a_closed_port_is_unreachable() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    failure = await ask(url)
    assert isinstance(failure, LLMUnavailable), failure
    assert str(failure) == f"Cannot reach the model server at {url}: connection refused"


async def test_a_404_from_a_base_url_without_v1_names_the_base_url(
    server: ScriptedOpenAI,
) -> None:
    url = server.base_url.removesuffix("/v1")  # the server answers 404 off its /v1 routes
    failure = await ask(url)
    assert isinstance(failure, LLMBadRequest), failure
    assert "HTTP 404" in str(failure)
    assert "Check OPENAI_BASE_URL (usually ends in /v1) or OPENAI_MODEL." in str(failure)


async def test_a_404_for_an_unknown_model_names_only_the_model(server: ScriptedOpenAI) -> None:
    server.script(error(404, "The model `nope` does not exist", code="model_not_found"))
    failure = await ask(server.base_url)
    assert isinstance(failure, LLMBadRequest), failure
    assert str(failure).endswith("Check OPENAI_MODEL."), failure
    assert "OPENAI_BASE_URL" not in str(failure)
