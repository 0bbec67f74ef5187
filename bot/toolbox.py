"""The Toolbox pattern: a registry of tools, their function-calling schemas, and a safe executor.

pydantic builds each tool's arguments model from its signature, once, at registration: that
model gives the JSON schema the LLM sees and validates the LLM's raw JSON, so nested types work
without a hand-written schema. Parameter descriptions come from the docstring. A parameter
typed as the toolbox's `context_type` is hidden from the schema and filled from `execute`'s
context, so the LLM can never choose its thread, tenant or store. `execute` never raises: a bad
call becomes an error message the LLM can read and correct.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
import typing
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from types import EllipsisType
from typing import Any, Generic, Literal, TypeVar

import docstring_parser
import pydantic
from pydantic_core import to_jsonable_python

from memory.shorten import shortened

DEFAULT_TIMEOUT_SECONDS = 120.0
MAX_DESCRIPTION_CHARS = 1024
ToolStatus = Literal["success", "error", "timeout"]
C = TypeVar("C")


class ToolDefinitionError(TypeError):
    """A function cannot be a tool (bad name, *args, a type pydantic cannot model, duplicate)."""


class ArgumentError(ValueError):
    """The model's arguments do not fit the tool; the message says how, per field."""


@dataclass(frozen=True)
class ToolResult:
    """What a tool call produced; `output` is the text that goes back to the model."""

    status: ToolStatus
    output: str
    error: str | None = None
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.status == "success"


@dataclass(frozen=True)
class Tool:
    """A registered tool: the callable plus what the model and the toolbox memory see of it."""

    name: str
    description: str
    fn: Callable[..., Any]
    arguments: type[pydantic.BaseModel]
    context_param: str | None
    signature: str
    timeout: float | None

    @cached_property
    def parameters(self) -> dict[str, Any]:
        """The arguments' JSON schema, cleaned for function calling; computed once per tool."""
        schema = _strip_titles(self.arguments.model_json_schema())
        return {**schema, "required": schema.get("required", []), "additionalProperties": False}

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema (`tools=[...]` entry)."""
        function = {"name": self.name, "description": self.description}
        return {"type": "function", "function": {**function, "parameters": self.parameters}}

    def record(self) -> dict[str, str]:
        """What the toolbox memory store indexes for top-k retrieval."""
        return {"name": self.name, "description": self.description, "signature": self.signature}

    def parse_arguments(self, raw_arguments: str | None) -> dict[str, Any]:
        """Model's raw JSON -> validated keyword arguments (nested models stay instances)."""
        raw = (raw_arguments or "").strip()
        try:
            model = self.arguments.model_validate_json("{}" if raw in ("", "null") else raw)
        except pydantic.ValidationError as exc:
            allowed = ", ".join(self.arguments.model_fields) or "none"
            raise ArgumentError("; ".join(_explain(e, allowed) for e in exc.errors())) from None
        return {field: getattr(model, field) for field in self.arguments.model_fields}


class Toolbox(Generic[C]):
    """A name -> Tool registry with a decorator to fill it and an executor to run calls."""

    def __init__(
        self,
        context_type: type[C] | None = None,
        *,
        default_timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.context_type = context_type
        self.default_timeout = default_timeout
        self._tools: dict[str, Tool] = {}

    def register_tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | EllipsisType | None = ...,
    ) -> Any:
        """Register `fn`, bare or with options; `fn` is returned unchanged, still callable."""

        def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
            limit = self.default_timeout if timeout is ... else timeout
            self.add(build_tool(func, name=name, description=description,
                                context_type=self.context_type, timeout=limit))  # fmt: skip
            return func

        return decorate(fn) if fn is not None else decorate

    def add(self, tool: Tool) -> None:
        """Add a built tool; another function under the same name is a definition error."""
        existing = self._tools.get(tool.name)
        if existing is not None and existing.fn is not tool.fn:
            raise ToolDefinitionError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def names(self) -> list[str]:
        return list(self._tools)

    def schemas(self, names: Iterable[str] | None = None) -> list[dict[str, Any]]:
        """Schemas for `names` (in that order, unknown names skipped), or for every tool."""
        chosen = self._tools if names is None else [n for n in names if n in self._tools]
        return [self._tools[n].schema() for n in chosen]

    async def execute(
        self, name: str, raw_arguments: str | None, context: C | None = None
    ) -> ToolResult:
        """Run one call; every failure is a ToolResult the model can read (only cancellation
        propagates). A timed-out sync tool's thread cannot be stopped and runs on unseen."""
        started = time.perf_counter()

        def done(status: ToolStatus, output: str, error: str | None = None) -> ToolResult:
            elapsed = (time.perf_counter() - started) * 1000
            return ToolResult(status, output, error, elapsed)

        def failed(message: str, status: ToolStatus = "error") -> ToolResult:
            return done(status, f"Error: {message}", message)

        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(sorted(self._tools)) or "none"
            return failed(f"unknown tool {name!r}. Available tools: {available}.")
        if tool.context_param is not None and context is None:
            return failed(f"tool {name} needs a run context but got none (a harness bug)")
        try:
            kwargs = tool.parse_arguments(raw_arguments)
        except Exception as exc:  # ArgumentError, or a custom validator raising something odd
            detail = str(exc) if isinstance(exc, ArgumentError) else f"{type(exc).__name__}: {exc}"
            return failed(f"invalid arguments for {name}: {detail}")
        if tool.context_param is not None:
            kwargs[tool.context_param] = context
        try:
            async with asyncio.timeout(tool.timeout) as deadline:
                is_async = inspect.iscoroutinefunction(tool.fn)
                result = await (
                    tool.fn(**kwargs) if is_async else asyncio.to_thread(tool.fn, **kwargs)
                )
                if inspect.isawaitable(result):  # a sync function that returned a coroutine
                    result = await result
        except Exception as exc:
            if isinstance(exc, TimeoutError) and deadline.expired():
                return failed(f"tool {name} timed out after {tool.timeout:g}s", "timeout")
            detail = f"{type(exc).__name__}: {exc}"
            return done("error", f"Error: tool {name} failed: {detail}", detail)
        return done("success", format_output(result))


def format_output(result: Any) -> str:
    """Tool return value -> text for the model: str as is, None as "Done", else JSON."""
    if result is None:
        return "Done"
    if isinstance(result, str):
        return result
    try:
        return json.dumps(to_jsonable_python(result, fallback=str), ensure_ascii=False)
    except (TypeError, ValueError):
        return str(result)


def build_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    context_type: type[Any] | None = None,
    timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
) -> Tool:
    """Build a Tool from a function's signature and docstring (see the module docstring)."""
    tool_name = name or getattr(fn, "__name__", "")
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_name):
        raise ToolDefinitionError(f"tool name {tool_name!r} must match [A-Za-z0-9_-]{{1,64}}")
    try:
        doc = docstring_parser.parse(inspect.getdoc(fn) or "")
        summary = f"{doc.short_description or ''} {doc.long_description or ''}"
        arg_docs = {p.arg_name: " ".join((p.description or "").split()) for p in doc.params}
    except Exception:  # docstring_parser can fail on odd layouts; the text still describes
        summary, arg_docs = inspect.getdoc(fn) or "", {}
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"{tool_name}: cannot resolve type hints: {exc}") from exc
    signature = inspect.signature(fn)
    fields: dict[str, Any] = {}
    shown: list[str] = []
    context_param: str | None = None
    for pname, param in signature.parameters.items():
        if param.kind not in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
            raise ToolDefinitionError(f"{tool_name}: {pname!r} must be an ordinary parameter")
        hint = hints.get(pname, str)  # an unannotated parameter is text
        if context_type is not None and hint == context_type:
            if context_param is not None:
                raise ToolDefinitionError(f"{tool_name}: more than one context parameter")
            context_param = pname
            continue
        default = ... if param.default is param.empty else param.default
        fields[pname] = (hint, pydantic.Field(default, description=arg_docs.get(pname)))
        text = f"{pname}: {_type_text(param.annotation)}"
        shown.append(text if default is ... else f"{text} = {default!r}")
    returns = signature.return_annotation
    arrow = "" if returns is signature.empty else f" -> {_type_text(returns)}"
    config = pydantic.ConfigDict(extra="forbid", protected_namespaces=())
    try:
        tool = Tool(
            name=tool_name,
            description=" ".join((description or summary).split())[:MAX_DESCRIPTION_CHARS],
            fn=fn,
            arguments=pydantic.create_model(f"{tool_name}_args", __config__=config, **fields),
            context_param=context_param,
            signature=f"{tool_name}({', '.join(shown)}){arrow}",
            timeout=timeout,
        )
        tool.parameters  # noqa: B018 - build (and so check) the JSON schema once, now
    except Exception as exc:  # a type pydantic cannot validate or describe
        raise ToolDefinitionError(f"{tool_name}: {exc}") from exc
    return tool


def _type_text(annotation: Any) -> str:
    """An annotation as written (a string under PEP 563), else a readable repr."""
    if annotation is inspect.Parameter.empty:
        return "str"
    if isinstance(annotation, str):
        return annotation
    plain = isinstance(annotation, type) and not typing.get_args(annotation)
    return annotation.__name__ if plain else repr(annotation).replace("typing.", "")


def _strip_titles(node: Any) -> Any:
    """Drop pydantic's `title` keywords (noise to the model), but not properties named title."""
    if isinstance(node, list):
        return [_strip_titles(item) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in ("default", "enum", "const", "examples"):
            out[key] = value
        elif key in ("properties", "$defs"):
            out[key] = {name: _strip_titles(sub) for name, sub in value.items()}
        elif key != "title":
            out[key] = _strip_titles(value)
    return out


def _explain(error: Any, allowed: str) -> str:
    """One pydantic error -> a sentence the model can act on."""
    where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"])[1:]
    kind, value = error["type"], error["input"]
    got = json.dumps(value, ensure_ascii=False, default=str)
    got = shortened(got, 101)
    if kind == "json_invalid":
        reason = error["msg"].removeprefix("Invalid JSON: ")
        return f"arguments are not valid JSON ({reason}): {str(value)[:200]}"
    if kind == "model_type" and not where:
        return f"arguments must be a JSON object (got {got})"
    if kind == "missing":
        return f"{where}: required but missing"
    if kind == "extra_forbidden":
        top_level = len(error["loc"]) == 1
        return f"{where}: unknown parameter" + (f" (allowed: {allowed})" if top_level else "")
    return f"{where}: {error['msg']} (got {got})"
