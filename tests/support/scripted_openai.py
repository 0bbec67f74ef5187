"""A local OpenAI-compatible HTTP server whose answers a test scripts in advance.

Tests talk to it with the real `openai` client (or run `arxivscout` pointed at it via
OPENAI_BASE_URL), so retries, timeouts and the wire format are exercised for real, with no
monkeypatching. Script it with a queue of replies:

    async with ScriptedOpenAI() as server:
        server.script(text("hello"), tool_calls(call("search", {"q": "MemGPT"})), error(429))
        client = AsyncOpenAI(base_url=server.base_url, api_key="test")

or start it in a background thread for synchronous tests and subprocesses:

    server = ScriptedOpenAI()
    base_url = server.start_in_thread()
    ...
    server.stop()

Every chat-completions body is recorded in `server.requests` (embeddings bodies in
`server.embedding_requests`), so a test can assert on the context the model saw. When the
script is exhausted and no `responder` is set, the server answers 500 with a body saying so.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import inspect
import json
import math
import struct
import threading
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.support.threaded import ThreadedServer

EXHAUSTED_MESSAGE = "ScriptedOpenAI: the script is exhausted (no reply left for this request)"


@dataclass(frozen=True)
class Call:
    """One tool call; `arguments` as a str is sent verbatim (to simulate malformed JSON)."""

    name: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def raw_arguments(self) -> str:
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments)


@dataclass(frozen=True)
class TextReply:
    """A final text answer; `finish_reason` None: a stream that ends cleanly but unfinished
    (no finish_reason, no [DONE])."""

    content: str
    delay: float = 0.0
    finish_reason: str | None = "stop"


@dataclass(frozen=True)
class ToolCallsReply:
    """An assistant turn asking for one or more tool calls (optionally with some text)."""

    calls: tuple[Call, ...]
    content: str | None = None
    delay: float = 0.0


@dataclass(frozen=True)
class ErrorReply:
    """An HTTP error in OpenAI's error format (e.g. 429, 500, 401)."""

    status: int
    message: str | None = None
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    code: str | None = None


Reply = TextReply | ToolCallsReply | ErrorReply
Responder = Callable[[dict[str, Any]], "Reply | str | Awaitable[Reply | str]"]


def text(content: str, *, delay: float = 0.0, finish_reason: str | None = "stop") -> TextReply:
    """A final answer with `content`, sent after `delay` seconds (`finish_reason` e.g. "length",
    "content_filter")."""
    return TextReply(content=content, delay=delay, finish_reason=finish_reason)


def call(
    name: str, arguments: dict[str, Any] | str | None = None, *, id: str | None = None
) -> Call:
    """A tool call; pass a str as `arguments` to send it unparsed (e.g. broken JSON)."""
    return Call(name=name, arguments={} if arguments is None else arguments, id=id)


def tool_calls(
    *calls: Call | tuple[str, Any], content: str | None = None, delay: float = 0.0
) -> ToolCallsReply:
    """An assistant turn with tool calls; each call is a `Call` or a (name, arguments) pair."""
    normalized = tuple(c if isinstance(c, Call) else Call(c[0], c[1]) for c in calls)
    return ToolCallsReply(calls=normalized, content=content, delay=delay)


def error(
    status: int,
    message: str | None = None,
    *,
    delay: float = 0.0,
    headers: dict[str, str] | None = None,
    code: str | None = None,
) -> ErrorReply:
    """An HTTP error reply with OpenAI's `{"error": {...}}` body (`code` e.g. insufficient_quota)."""
    return ErrorReply(
        status=status, message=message, delay=delay, headers=dict(headers or {}), code=code
    )


_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_exceeded",
}


def fake_embedding(text_: str, dims: int) -> list[float]:
    """A deterministic unit vector for `text_`: equal texts give equal vectors."""
    values: list[float] = []
    counter = 0
    while len(values) < dims:
        digest = hashlib.sha256(f"{counter}:{text_}".encode()).digest()
        values.extend((b - 127.5) / 127.5 for b in digest)
        counter += 1
    values = values[:dims]
    norm = math.sqrt(sum(v * v for v in values)) or 1.0
    return [v / norm for v in values]


class ScriptedOpenAI(ThreadedServer):
    """An aiohttp app on 127.0.0.1 (random port) speaking enough of the OpenAI API for tests."""

    def __init__(
        self,
        replies: Iterable[Reply | str] = (),
        *,
        embedding_dims: int = 8,
        responder: Responder | None = None,
        router: Responder | None = None,
        model: str = "scripted-model",
        stream_chunk_chars: int = 8,
    ) -> None:
        self._queue: deque[Reply | str] = deque(replies)
        self._lock = threading.Lock()
        self.responder = responder
        self.router = router  # consulted first; None means "take the next scripted reply"
        self.embedding_dims = embedding_dims
        self.model = model
        self.stream_chunk_chars = stream_chunk_chars
        self.requests: list[dict[str, Any]] = []
        self.embedding_requests: list[dict[str, Any]] = []
        self.request_headers: list[dict[str, str]] = []
        self.base_url: str = ""
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- scripting --------------------------------------------------------------------------
    def script(self, *replies: Reply | str) -> None:
        """Append replies to the queue (a plain str is a text answer)."""
        with self._lock:
            self._queue.extend(replies)

    @property
    def remaining(self) -> int:
        """How many scripted replies have not been used yet."""
        with self._lock:
            return len(self._queue)

    def reset(self) -> None:
        """Forget the script and the recorded requests."""
        with self._lock:
            self._queue.clear()
            self.requests.clear()
            self.embedding_requests.clear()
            self.request_headers.clear()

    async def _next_reply(self, body: dict[str, Any]) -> Reply | None:
        reply = None
        if self.router is not None:
            reply = self.router(body)
            if inspect.isawaitable(reply):
                reply = await reply
        if reply is None:
            with self._lock:
                reply = self._queue.popleft() if self._queue else None
        if reply is None and self.responder is not None:
            reply = self.responder(body)
            if inspect.isawaitable(reply):
                reply = await reply
        if isinstance(reply, str):
            reply = TextReply(reply)
        return reply

    # -- lifecycle ---------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/embeddings", self._embeddings)
        app.router.add_get("/v1/models", self._models)
        return app

    async def start(self) -> str:
        """Start serving on the current loop; returns the base URL (ending in /v1)."""
        self._runner = web.AppRunner(
            self._app(), handler_cancellation=True, shutdown_timeout=0.5, access_log=None
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> ScriptedOpenAI:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- handlers ----------------------------------------------------------------------------
    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "object": "list",
                "data": [
                    {"id": self.model, "object": "model", "created": 0, "owned_by": "scripted"}
                ],
            }
        )

    async def _read_json(self, request: web.Request) -> dict[str, Any] | web.Response:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error_response(400, "request body is not valid JSON")
        if not isinstance(body, dict):
            return _error_response(400, "request body must be a JSON object")
        return body

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await self._read_json(request)
        if isinstance(body, web.Response):
            return body
        # Recorded on arrival, so a request the client gave up on (timeout) still counts.
        self.requests.append(body)
        self.request_headers.append(dict(request.headers))
        reply = await self._next_reply(body)
        if reply is None:
            return _error_response(500, EXHAUSTED_MESSAGE, type_="server_error")
        if reply.delay:
            await asyncio.sleep(reply.delay)
        if isinstance(reply, ErrorReply):
            message = reply.message or f"scripted HTTP {reply.status}"
            return _error_response(reply.status, message, headers=reply.headers, code=reply.code)
        model = body.get("model") or self.model
        if body.get("stream"):
            return await self._stream(request, body, reply, model)
        return web.json_response(_completion(reply, model, body))

    async def _stream(
        self,
        request: web.Request,
        body: dict[str, Any],
        reply: TextReply | ToolCallsReply,
        model: str,
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        cid, created = f"chatcmpl-{uuid.uuid4().hex[:12]}", int(time.time())

        async def send(
            delta: dict[str, Any],
            finish: str | None = None,
            usage: dict[str, int] | None = None,
            choices: bool = True,
        ) -> None:
            chunk: dict[str, Any] = {
                "id": cid,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
            }
            if choices:
                chunk["choices"] = [{"index": 0, "delta": delta, "finish_reason": finish}]
            if usage is not None:
                chunk["usage"] = usage
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())

        await send({"role": "assistant", "content": ""})
        content = reply.content or ""
        step = max(1, self.stream_chunk_chars)
        for i in range(0, len(content), step):
            await send({"content": content[i : i + step]})
        finish = "stop" if isinstance(reply, ToolCallsReply) else reply.finish_reason
        if isinstance(reply, ToolCallsReply):
            finish = "tool_calls"
            for index, tc in enumerate(reply.calls):
                await send(
                    {
                        "tool_calls": [
                            {
                                "index": index,
                                "id": tc.id or f"call_{uuid.uuid4().hex[:12]}",
                                "type": "function",
                                "function": {"name": tc.name, "arguments": ""},
                            }
                        ]
                    }
                )
                raw = tc.raw_arguments()
                for i in range(0, len(raw), step):
                    await send(
                        {
                            "tool_calls": [
                                {"index": index, "function": {"arguments": raw[i : i + step]}}
                            ]
                        }
                    )
        if finish is None:  # cut: the stream just ends
            await response.write_eof()
            return response
        await send({}, finish=finish)
        if (body.get("stream_options") or {}).get("include_usage"):
            await send({}, usage=_usage(body, reply), choices=False)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = await self._read_json(request)
        if isinstance(body, web.Response):
            return body
        self.embedding_requests.append(body)
        inputs = body.get("input")
        if isinstance(inputs, str):
            inputs = [inputs]
        if not isinstance(inputs, list) or not inputs:
            return _error_response(400, "'input' must be a string or a non-empty list")
        dims = int(body.get("dimensions") or self.embedding_dims)
        data = []
        for index, item in enumerate(inputs):
            vector = fake_embedding(item if isinstance(item, str) else json.dumps(item), dims)
            if body.get("encoding_format") == "base64":
                vector = base64.b64encode(struct.pack(f"<{dims}f", *vector)).decode()
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(len(str(i).split()) for i in inputs)
        return web.json_response(
            {
                "object": "list",
                "data": data,
                "model": body.get("model") or "scripted-embedding",
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )


def _error_response(
    status: int,
    message: str,
    *,
    type_: str | None = None,
    headers: dict[str, str] | None = None,
    code: str | None = None,
) -> web.Response:
    kind = type_ or _ERROR_TYPES.get(status, "server_error" if status >= 500 else "error")
    return web.json_response(
        {"error": {"message": message, "type": kind, "param": None, "code": code}},
        status=status,
        headers=headers,
    )


def _usage(body: dict[str, Any], reply: TextReply | ToolCallsReply) -> dict[str, int]:
    prompt = sum(
        len(str(m.get("content") or "").split())
        for m in body.get("messages", [])
        if isinstance(m, dict)
    )
    completion = len((reply.content or "").split())
    if isinstance(reply, ToolCallsReply):
        completion += sum(len(c.raw_arguments().split()) + 1 for c in reply.calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _completion(
    reply: TextReply | ToolCallsReply, model: str, body: dict[str, Any]
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    finish = "stop"
    if isinstance(reply, ToolCallsReply):
        finish = "tool_calls"
        message["tool_calls"] = [
            {
                "id": c.id or f"call_{uuid.uuid4().hex[:12]}",
                "type": "function",
                "function": {"name": c.name, "arguments": c.raw_arguments()},
            }
            for c in reply.calls
        ]
    else:
        finish = reply.finish_reason
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": _usage(body, reply),
    }
