"""The model client: chat completions with tools over `openai.AsyncOpenAI`.

Any OpenAI-compatible server works (OpenAI, Ollama, vLLM, the tests' scripted server). The
client does its own retries (the SDK's are switched off) so that attempts are bounded, the
delays are configurable (small in tests) and every failure ends as one `LLMError` subclass:
its message is for the operator (it may quote the provider), `failure_kind` for a channel.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import random
import re
import socket
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import openai
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from bot.errors import ConfigError
from bot.metering import count_call
from memory.errors import ServiceError, error_chain

log = logging.getLogger(__name__)

PLACEHOLDER_API_KEY = "not-needed"
"""Sent when OPENAI_BASE_URL points at a local server that needs no key (Ollama, vLLM)."""

Message = dict[str, Any]
DeltaCallback = Callable[[str], Awaitable[None] | None]


# -- errors --------------------------------------------------------------------------------
class LLMError(ServiceError):
    """Any failure to get an answer from the model; `str(err)` is for the operator (the log,
    the terminal): it may quote the provider's text. A channel is told `failure_kind`. A
    ServiceError: a refused connection under it is the model server's, never Redis's."""

    transient = True  # asking again in a moment may work (not so for a refused request)

    def __init__(
        self, message: str, *, status: int | None = None, code: str | None = None, attempts: int = 1
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.attempts = attempts


class LLMConfigError(LLMError, ConfigError):
    """The client cannot be built from the settings (e.g. no OPENAI_API_KEY)."""

    transient = False


class LLMTimeout(LLMError):
    """The model did not answer within the per-request timeout, on every attempt."""


class LLMUnavailable(LLMError):
    """The server is unreachable, overloaded (429/5xx) or out of quota, after the retries; or
    its answer was cut off (the stream ended before the model said it was done)."""

    @property
    def transient(self) -> bool:
        return self.code != "insufficient_quota"  # a quota is not back in a moment


class LLMStreamCut(LLMUnavailable):
    """The stream ended before the model said it was done (the server is up: retried)."""


class LLMAuthError(LLMError):
    """The server rejected the credentials (401/403): OPENAI_API_KEY is wrong or lacks access."""

    transient = False


class LLMBadRequest(LLMError):
    """The server refused the request itself (400/404/422): unknown model, context too long..."""

    transient = False


class LLMContextTooLong(LLMBadRequest):
    """The request is longer than the model's context window: the same request fails again,
    a shorter one may not (the agent loop shrinks the context and asks once more)."""


class LLMResponseError(LLMError):
    """The model answered, but not in the shape asked for (empty text, no JSON)."""


class LLMNotOpenAIFormat(LLMError):
    """The server at OPENAI_BASE_URL answered, but not in the OpenAI format (a web page, a
    proxy's login page): it is not a model server, and asking it again gives the same."""

    transient = False


def failure_kind(error: LLMError) -> str:
    """What kind of failure `error` is, in words fit for a channel: its class, HTTP status
    and code, with what fixes it. Never the provider's text or our address of it: either may
    hold a masked API key or an internal base URL (they go to the log)."""
    status = f" (HTTP {error.status})" if error.status else ""
    if isinstance(error, LLMConfigError):
        return "the model service is not set up (OPENAI_API_KEY or OPENAI_BASE_URL)"
    if isinstance(error, LLMAuthError):
        return f"the model service refused the API key{status}; check OPENAI_API_KEY"
    if isinstance(error, LLMContextTooLong):
        return f"the request is longer than the model's context window{status}"
    if isinstance(error, LLMBadRequest):
        hint = "; check OPENAI_MODEL and OPENAI_BASE_URL" if error.status == 404 else ""
        return f"the model service refused the request{status}{hint}"
    if isinstance(error, LLMTimeout):
        return "the model timed out (ARXIVSCOUT_LLM_TIMEOUT)"
    if isinstance(error, LLMStreamCut):
        return "the model's answer was cut off before it finished"
    if isinstance(error, LLMUnavailable):
        if error.code == "insufficient_quota":
            return f"the model account is out of quota{status}"
        if error.status == 429:
            return f"the model service is rate limited{status}"
        if status:
            return f"the model service is unavailable{status}"
        return "the model service is unreachable"
    if isinstance(error, LLMResponseError):
        return "the model's answer was not in the shape asked for"
    if isinstance(error, LLMNotOpenAIFormat):
        return "the model server did not answer in the OpenAI format; check OPENAI_BASE_URL"
    cause = error.__cause__
    return f"the model call failed ({type(cause or error).__name__})"


# -- results -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolCall:
    """A tool call as the model sent it; `arguments` is the raw JSON string, unparsed."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


@dataclass(frozen=True)
class ChatReply:
    """One assistant turn: text, tool calls, or both."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    finish_reason: str | None = None
    model: str | None = None

    @property
    def is_final(self) -> bool:
        """True when the model answered without asking for a tool (the loop's stop condition)."""
        return not self.tool_calls

    def assistant_message(self) -> Message:
        """The turn as a chat message, to append before the tool results."""
        message: Message = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": tc.id,
                    "type": "function",
                    "function": {"name": tc.name, "arguments": tc.arguments},
                }
                for tc in self.tool_calls
            ]
        return message


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries: `max_attempts` in all, exponential backoff with jitter between them."""

    max_attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        ceiling = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        wait = ceiling / 2 + random.uniform(0, ceiling / 2)  # "equal jitter"
        if retry_after is not None:
            wait = max(wait, min(retry_after, self.max_delay))
        return wait


class _Retryable(Exception):
    """Internal: an attempt failed in a way another attempt may fix."""

    def __init__(self, error: LLMError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after
        self.streamed = False  # text already reached the user: retrying would repeat it


# -- client --------------------------------------------------------------------------------
def openai_client(
    api_key: str | None, base_url: str | None, timeout_seconds: float, max_retries: int = 2
) -> openai.AsyncOpenAI:
    """The SDK client, on aiohttp: its connection pool stays fast with hundreds of requests
    in flight, where the default transport's pool bookkeeping grows with every connection."""
    if not api_key and not base_url:
        raise LLMConfigError(
            "OPENAI_API_KEY is not set. Set OPENAI_API_KEY to your OpenAI key, or set "
            "OPENAI_BASE_URL to an OpenAI-compatible server (e.g. Ollama, vLLM)."
        )
    return openai.AsyncOpenAI(
        api_key=api_key or PLACEHOLDER_API_KEY,
        base_url=base_url,
        timeout=timeout_seconds,
        max_retries=max_retries,
        http_client=openai.DefaultAioHttpClient(timeout=timeout_seconds),
    )


class LLMClient:
    """Async chat client with per-request timeout, bounded retries and typed errors."""

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None = None,
        model: str = "gpt-5-mini",
        timeout_seconds: float = 60.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.timeout_seconds = timeout_seconds
        self.retry = retry or RetryPolicy()
        self._client = openai_client(api_key, base_url, timeout_seconds, max_retries=0)

    async def aclose(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> LLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def chat(
        self,
        messages: Sequence[Message],
        tools: Sequence[dict[str, Any]] | None = None,
        *,
        on_delta: DeltaCallback | None = None,
        model: str | None = None,
        **options: Any,
    ) -> ChatReply:
        """One assistant turn. With `on_delta`, the answer is streamed and each text piece is
        passed to it as it arrives; the returned reply is the same either way. Extra keyword
        `options` go to the API as is (e.g. max_completion_tokens, response_format)."""
        kwargs: dict[str, Any] = {
            "model": model or self.model,
            "messages": list(messages),
            **options,
        }
        if tools:
            kwargs["tools"] = list(tools)
            kwargs.setdefault("tool_choice", "auto")
        for attempt in range(1, self.retry.max_attempts + 1):
            try:
                if on_delta is None:
                    reply = await self._once(kwargs)
                else:
                    reply = await self._once_streaming(kwargs, on_delta)
                count_call(reply.usage)
                return reply
            except _Retryable as failure:
                failure.error.attempts = attempt
                # Text already shown to the user cannot be taken back: no retry mid-stream.
                if attempt >= self.retry.max_attempts or failure.streamed:
                    raise failure.error from failure.__cause__
                wait = self.retry.delay(attempt, failure.retry_after)
                log.warning(
                    "model call failed (%s), attempt %d/%d, retrying in %.2fs",
                    failure.error,
                    attempt,
                    self.retry.max_attempts,
                    wait,
                )
                await asyncio.sleep(wait)
            except LLMError as error:
                error.attempts = attempt
                raise
        raise AssertionError("unreachable")  # pragma: no cover

    async def complete_text(self, messages: Sequence[Message], **options: Any) -> str:
        """The model's text answer, stripped (for summaries and descriptions)."""
        reply = await self.chat(messages, **options)
        text = reply.content.strip()
        if not text:
            raise LLMResponseError(
                f"The model returned an empty answer (finish_reason={reply.finish_reason})."
            )
        return text

    async def complete_json(self, messages: Sequence[Message], **options: Any) -> Any:
        """The JSON value in the model's answer (for entity extraction). Code fences and prose
        around the JSON are tolerated, since not every compatible server has a JSON mode."""
        reply = await self.chat(messages, **options)
        return extract_json(reply.content)

    # -- one attempt -----------------------------------------------------------------------
    async def _create(self, body: dict[str, Any]) -> Any:
        """POST /chat/completions through the SDK's public `post` (its way to send a body as
        is): the typed `create` first walks every message through its parameter transformer,
        about 2 ms per call with a full context, which hundreds of concurrent turns feel."""
        streaming = bool(body.get("stream"))
        return await self._client.post(
            "/chat/completions",
            body=body,
            cast_to=ChatCompletion,
            stream=streaming,
            stream_cls=openai.AsyncStream[ChatCompletionChunk] if streaming else None,
        )

    async def _once(self, kwargs: dict[str, Any]) -> ChatReply:
        try:
            # The SDK's timeout bounds each read; this bounds the whole request.
            async with asyncio.timeout(self.timeout_seconds):
                completion = await self._create(kwargs)
        except (TimeoutError, openai.APIError) as exc:
            raise self._translate(exc) from exc
        except _UNREADABLE_BODY as exc:  # the SDK could not read the body (not JSON, not UTF-8)
            raise self._not_openai_format(f"{type(exc).__name__}: {exc}") from exc
        return self._reply(completion)

    def _reply(self, completion: Any) -> ChatReply:
        """The reply in a completion body. The SDK hands back a body that is not JSON as text,
        and any JSON object as a completion: one with an `error` is the model's error (sent
        with 200, as OpenRouter does once the model started), one without `choices` is no
        OpenAI format."""
        if not isinstance(completion, ChatCompletion):
            raise self._not_openai_format(f"it sent {str(completion)[:100]!r}")
        error = getattr(completion, "error", None)
        if isinstance(error, Mapping):
            raise self._error_in_body(error)
        if not isinstance(getattr(completion, "choices", None), list):
            raise self._not_openai_format("it sent JSON without 'choices'")
        if not completion.choices:
            raise LLMResponseError("The model server returned no choices.")
        choice = completion.choices[0]
        message = choice.message
        calls = tuple(
            ToolCall(
                id=tc.id or f"call_{i}",
                name=tc.function.name,
                arguments=_raw_arguments(tc.function.arguments),
            )
            for i, tc in enumerate(message.tool_calls or ())
            if getattr(tc, "function", None) is not None
        )
        return ChatReply(
            content=message.content or "",
            tool_calls=calls,
            usage=_usage(completion.usage),
            finish_reason=choice.finish_reason,
            model=completion.model,
        )

    async def _once_streaming(self, kwargs: dict[str, Any], on_delta: DeltaCallback) -> ChatReply:
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        usage: Usage | None = None
        finish: str | None = None
        model: str | None = None
        try:
            stream = await self._create(
                {**kwargs, "stream": True, "stream_options": {"include_usage": True}}
            )
            if _media_type(stream.response) == "application/json":
                return await self._unstreamed(stream, on_delta)
            async for chunk in self._chunks(stream):
                model = chunk.model or model
                if chunk.usage is not None:
                    usage = _usage(chunk.usage)
                for choice in chunk.choices or ():  # a closing usage chunk may have None
                    finish = choice.finish_reason or finish
                    delta = choice.delta
                    if delta.content:
                        parts.append(delta.content)
                        result = on_delta(delta.content)
                        if inspect.isawaitable(result):
                            await result
                    for tc in delta.tool_calls or ():
                        slot = calls.setdefault(tc.index, {"id": "", "name": "", "args": []})
                        if tc.id:
                            slot["id"] = tc.id
                        if tc.function is not None:
                            slot["name"] += tc.function.name or ""
                            slot["args"].append(tc.function.arguments or "")
        except (TimeoutError, openai.APIError) as exc:
            error = self._translate(exc)
            if isinstance(error, _Retryable):
                error.streamed = bool(parts)
            raise error from exc
        if finish is None:  # the stream ended cleanly, but before the model said it was done
            cut = _Retryable(
                LLMStreamCut("The model's answer was cut off: its stream ended unfinished.")
            )
            cut.streamed = bool(parts)
            raise cut
        tool_calls = tuple(
            ToolCall(
                id=slot["id"] or f"call_{index}", name=slot["name"], arguments="".join(slot["args"])
            )
            for index, slot in sorted(calls.items())
        )
        return ChatReply(
            content="".join(parts),
            tool_calls=tool_calls,
            usage=usage,
            finish_reason=finish,
            model=model,
        )

    async def _unstreamed(self, stream: Any, on_delta: DeltaCallback) -> ChatReply:
        """The reply of a server that ignored `stream` and sent one JSON completion: read as
        `_once` reads it, its text handed to `on_delta` at once."""
        response = stream.response
        try:
            async with asyncio.timeout(self.timeout_seconds):
                body = await response.aread()
        except TimeoutError:
            raise
        except Exception as exc:  # the transport's own error: the body was cut off
            raise openai.APIConnectionError(request=response.request) from exc
        try:
            data = json.loads(body)
        except _UNREADABLE_BODY as exc:
            raise self._not_openai_format(f"{type(exc).__name__}: {exc}") from exc
        reply = self._reply(ChatCompletion.construct(**data) if isinstance(data, dict) else data)
        if reply.content:
            result = on_delta(reply.content)
            if inspect.isawaitable(result):
                await result
        return reply

    async def _chunks(self, stream: Any) -> AsyncIterator[ChatCompletionChunk]:
        """The stream's chunks, or LLMNotOpenAIFormat when the body is no OpenAI stream: an
        event that is not a chunk before any chunk came, or nothing at all from a web page.
        Any other body that ends without a chunk is taken for a cut (retried)."""
        received = False
        try:
            async for chunk in stream:
                if isinstance(chunk, ChatCompletionChunk) and (
                    isinstance(getattr(chunk, "choices", None), list)
                    or getattr(chunk, "usage", None) is not None  # a closing usage chunk
                ):
                    received = True
                    yield chunk
                elif not received:
                    raise self._not_openai_format(f"its stream sent {str(chunk)[:100]!r}")
        except _UNREADABLE_BODY as exc:  # an event's data that is not JSON
            raise self._not_openai_format(f"{type(exc).__name__}: {exc}") from exc
        content_type = _media_type(stream.response)
        if not received and content_type in ("text/html", "text/plain"):
            raise self._not_openai_format(f"it sent {content_type}, not an event stream")

    def _error_in_body(self, error: Mapping[str, Any]) -> LLMError | _Retryable:
        """An error the server sent in a 200 body, as the error of its `code`'s HTTP status."""
        code, message = error.get("code"), str(error.get("message") or "no message")
        status = _http_status(code)
        if status is None:
            code = str(code) if code is not None else None
            return LLMError(f"The model server answered with an error: {message}", code=code)
        return self._status_error(status, str(code), message, retry_after=None)

    def _not_openai_format(self, detail: str) -> LLMNotOpenAIFormat:
        where = self.base_url or "the OpenAI API"
        return LLMNotOpenAIFormat(
            f"The model server at {where} did not answer in the OpenAI format ({detail}); "
            "check OPENAI_BASE_URL (usually ends in /v1)."
        )

    def _translate(self, exc: BaseException) -> LLMError | _Retryable:
        """Map an SDK error to an LLMError, wrapped in _Retryable when retrying may help."""
        where = self.base_url or "the OpenAI API"
        if isinstance(exc, openai.APIConnectionError) and (cause := _unreachable(exc)):
            # the aiohttp transport reports DNS, TLS and refused connections as connect timeouts
            return _Retryable(LLMUnavailable(f"Cannot reach the model server at {where}: {cause}"))
        if isinstance(exc, TimeoutError | openai.APITimeoutError):
            return _Retryable(
                LLMTimeout(
                    f"The model ({self.model}) did not answer within {self.timeout_seconds:g}s "
                    f"(ARXIVSCOUT_LLM_TIMEOUT)."
                )
            )
        if isinstance(exc, openai.APIConnectionError):
            return _Retryable(LLMUnavailable(f"Cannot reach the model server at {where}: {exc}"))
        if not isinstance(exc, openai.APIStatusError):
            return LLMError(f"The model call failed: {exc}")
        return self._status_error(
            exc.status_code, _error_code(exc), _error_message(exc), _retry_after(exc)
        )

    def _status_error(
        self, status: int, code: str | None, detail: str, retry_after: float | None
    ) -> LLMError | _Retryable:
        """The LLMError for an HTTP error status, wrapped in _Retryable when retrying may help."""
        where = self.base_url or "the OpenAI API"
        if status in (401, 403):
            return LLMAuthError(
                f"The model server at {where} rejected the API key (HTTP {status}: {detail}). "
                "Check OPENAI_API_KEY (or OPENAI_BASE_URL for a local server).",
                status=status,
                code=code,
            )
        if status == 429 and code == "insufficient_quota":
            return LLMUnavailable(
                f"The OpenAI account is out of quota: {detail}", status=status, code=code
            )
        if status in (408, 409, 429) or status >= 500:
            kind = "rate-limited" if status == 429 else "unavailable"
            return _Retryable(
                LLMUnavailable(
                    f"The model server is {kind} (HTTP {status}: {detail}).",
                    status=status,
                    code=code,
                ),
                retry_after=retry_after,
            )
        if status in (400, 413, 422) and (
            code == "context_length_exceeded" or _TOO_LONG.search(detail)
        ):
            return LLMContextTooLong(
                f"The request is longer than the model's context window (HTTP {status}: {detail}).",
                status=status,
                code=code,
            )
        hint = ""
        if status == 404:  # an unknown model, or a base URL without its /v1: both answer 404
            hint = (
                " Check OPENAI_MODEL."
                if code == "model_not_found"
                else " Check OPENAI_BASE_URL (usually ends in /v1) or OPENAI_MODEL."
            )
        return LLMBadRequest(
            f"The model server refused the request (HTTP {status}: {detail}).{hint}",
            status=status,
            code=code,
        )


# -- helpers -------------------------------------------------------------------------------
_UNREADABLE_BODY = (json.JSONDecodeError, UnicodeDecodeError)
"""What reading a reply body that is not JSON raises (not an error building our request)."""
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
# How OpenAI-compatible servers word a too-long request: OpenAI and vLLM ("maximum context
# length"), llama.cpp ("exceeds the available context size"), others ("prompt is too long").
_TOO_LONG = re.compile(
    r"context[ _](length|size|window)|maximum context|prompt is too long|too many (input )?tokens",
    re.IGNORECASE,
)


def _unreachable(exc: BaseException) -> str | None:
    """Why the server could not be reached, when the exception chain holds a socket error (the
    host name did not resolve, TLS failed, the connection was refused): None when it holds
    none, as for a server that was reached but was too slow (a TimeoutError is an OSError)."""
    sockets = [e for e in error_chain(exc) if isinstance(e, OSError)]
    found = next((e for e in reversed(sockets) if not isinstance(e, TimeoutError)), None)
    if found is None:  # the deepest one is the root cause
        return None
    if isinstance(found, ConnectionRefusedError):
        return "connection refused"
    reason = found.strerror or str(found)
    if isinstance(found, socket.gaierror):
        return f"cannot resolve the host name ({reason})"
    if isinstance(found, ssl.SSLError):
        return f"TLS failed ({reason})"
    return str(reason)


def extract_json(text: str) -> Any:
    """The first JSON value in `text`: whole text, a fenced block, or the first [ or {."""
    candidates = [text.strip()]
    candidates += [m.group(1).strip() for m in _FENCE.finditer(text)]
    for candidate in candidates:
        try:
            return json.loads(candidate)
        except (json.JSONDecodeError, ValueError):
            pass
    decoder = json.JSONDecoder()
    for index, char in enumerate(text):
        if char in "[{":
            try:
                return decoder.raw_decode(text, index)[0]
            except json.JSONDecodeError:
                continue
    raise LLMResponseError(f"The model's answer contains no JSON: {text[:200]!r}")


def _media_type(response: Any) -> str:
    """The response's content type without its parameters (`; charset=utf-8`), lower case."""
    return str(response.headers.get("content-type", "")).split(";")[0].strip().lower()


def _http_status(code: Any) -> int | None:
    """`code` as an HTTP error status (400-599), when it is one."""
    try:
        status = int(code)
    except (TypeError, ValueError):
        return None
    return status if 400 <= status <= 599 else None


def _raw_arguments(arguments: Any) -> str:
    # Some compatible servers send the arguments as an object instead of a JSON string.
    if arguments is None:
        return ""
    return arguments if isinstance(arguments, str) else json.dumps(arguments)


def _usage(usage: Any) -> Usage | None:
    if usage is None:
        return None
    return Usage(
        prompt_tokens=usage.prompt_tokens or 0,
        completion_tokens=usage.completion_tokens or 0,
        total_tokens=usage.total_tokens or 0,
    )


def _error_body(exc: openai.APIStatusError) -> dict[str, Any]:
    body = exc.body
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return body["error"]
    return body if isinstance(body, dict) else {}


def _error_code(exc: openai.APIStatusError) -> str | None:
    code = getattr(exc, "code", None) or _error_body(exc).get("code")
    return str(code) if code is not None else None


def _error_message(exc: openai.APIStatusError) -> str:
    message = _error_body(exc).get("message")
    return str(message) if message else exc.message


def _retry_after(exc: openai.APIStatusError) -> float | None:
    value = exc.response.headers.get("retry-after") if exc.response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


__all__ = [
    "ChatReply",
    "LLMAuthError",
    "LLMBadRequest",
    "LLMClient",
    "LLMConfigError",
    "LLMContextTooLong",
    "LLMError",
    "LLMNotOpenAIFormat",
    "LLMResponseError",
    "LLMStreamCut",
    "LLMTimeout",
    "LLMUnavailable",
    "RetryPolicy",
    "ToolCall",
    "Usage",
    "extract_json",
    "failure_kind",
]
