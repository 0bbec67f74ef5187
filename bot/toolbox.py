"""The Toolbox pattern: a registry of tools, their function-calling schemas, and a safe executor.

`@toolbox.register_tool` turns a plain (sync or async) function into a `Tool` whose OpenAI
schema is built from its signature and Google-style docstring. `Toolbox.execute` runs a tool
call exactly as the model sent it (raw JSON arguments) and always returns a `ToolResult`: a
bad call becomes an error message the model can read and correct, never an exception.

Injection rule: a parameter named in the toolbox's `context_params` (default `tenant`,
`thread_id`), in the tool's own `inject=` set, or annotated `Annotated[X, Injected()]` is
hidden from the model's schema and supplied by the executor from the run context. If the
model passes such a parameter anyway (the seed's prompt tells it to call
`summarize_and_store` with `thread_id`), its value is ignored and the context's value wins,
so the model can never reach another thread or tenant.

The toolbox knows nothing of Redis: the toolbox memory store indexes `Tool.record()`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import time
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

DEFAULT_CONTEXT_PARAMS = frozenset({"tenant", "thread_id"})
DEFAULT_TIMEOUT_SECONDS = 120.0
MAX_DESCRIPTION_CHARS = 1024

ToolStatus = Literal["success", "error", "timeout"]


class ToolDefinitionError(TypeError):
    """A function cannot be a tool (unsupported parameter type, *args, duplicate name...)."""


@dataclass(frozen=True)
class Injected:
    """Marks a parameter as supplied from the run context: `Annotated[Store, Injected()]`.

    `key` names the context entry when it differs from the parameter name."""

    key: str | None = None


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
    parameters: dict[str, Any]
    """JSON schema of the model-visible parameters."""
    injected: Mapping[str, str] = field(default_factory=dict)
    """Hidden parameter name -> the run-context key it is filled from."""
    injected_defaults: Mapping[str, Any] = field(default_factory=dict)
    signature: str = ""
    timeout: float | None = DEFAULT_TIMEOUT_SECONDS

    @property
    def is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.fn)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function-calling schema (`tools=[...]` entry)."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def record(self) -> dict[str, str]:
        """What the toolbox memory store indexes for top-k retrieval."""
        return {"name": self.name, "description": self.description, "signature": self.signature}


class Toolbox:
    """A name -> Tool registry with a decorator to fill it and an executor to run calls."""

    def __init__(
        self,
        *,
        context_params: Iterable[str] = DEFAULT_CONTEXT_PARAMS,
        default_timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.context_params = frozenset(context_params)
        self.default_timeout = default_timeout
        self._tools: dict[str, Tool] = {}

    # -- registry ----------------------------------------------------------------------------
    def register_tool(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        description: str | None = None,
        timeout: float | types.EllipsisType | None = ...,
        inject: Iterable[str] = (),
    ) -> Any:
        """Register `fn` as a tool. Usable bare (`@toolbox.register_tool`) or with options
        (`@toolbox.register_tool(name=..., description=..., timeout=..., inject=...)`).
        Returns the function unchanged, so it stays directly callable."""

        def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
            tool = build_tool(
                func,
                name=name,
                description=description,
                context_params=self.context_params | frozenset(inject),
                timeout=self.default_timeout if timeout is ... else timeout,
            )
            self.add(tool)
            return func

        return decorate(fn) if fn is not None else decorate

    def add(self, tool: Tool) -> None:
        """Add a built tool; a second tool with the same name is a definition error."""
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

    # -- execution ---------------------------------------------------------------------------
    async def execute(
        self, name: str, raw_arguments: str | None, context: Mapping[str, Any] | None = None
    ) -> ToolResult:
        """Run one tool call. Every failure is a ToolResult for the model to read; only a
        cancellation of the caller propagates. A sync tool runs in a worker thread; on
        timeout that thread cannot be stopped and finishes in the background."""
        started = time.perf_counter()

        def done(status: ToolStatus, output: str, error: str | None = None) -> ToolResult:
            return ToolResult(
                status=status,
                output=output,
                error=error,
                duration_ms=(time.perf_counter() - started) * 1000,
            )

        def failed(message: str) -> ToolResult:
            return done("error", f"Error: {message}", message)

        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(sorted(self._tools)) or "none"
            return failed(f"unknown tool {name!r}. Available tools: {available}.")
        try:
            kwargs = parse_arguments(tool, raw_arguments, context or {})
        except ArgumentError as exc:
            return failed(f"invalid arguments for {tool.name}: {exc}")
        try:
            call = tool.fn(**kwargs) if tool.is_async else asyncio.to_thread(tool.fn, **kwargs)
            result = await asyncio.wait_for(call, tool.timeout)
            if inspect.isawaitable(result):  # a sync function that returned a coroutine
                result = await asyncio.wait_for(result, tool.timeout)
        except TimeoutError:
            message = f"tool {tool.name} timed out after {tool.timeout:g}s"
            return done("timeout", f"Error: {message}", message)
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"
            return done("error", f"Error: tool {tool.name} failed: {detail}", detail)
        return done("success", format_output(result))


def format_output(result: Any) -> str:
    """Tool return value -> text for the model: str as is, None as "Done", else JSON."""
    if result is None:
        return "Done"
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(result)


# -- schema building -------------------------------------------------------------------------
_PRIMITIVES: dict[Any, str] = {int: "integer", float: "number", bool: "boolean", str: "string"}
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns|Return|Yields|Raises|"
    r"Examples?|Notes?|Attributes)\s*:\s*$"
)
_ARG_SECTIONS = ("args", "arguments", "parameters", "params")
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def build_tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    context_params: Iterable[str] = DEFAULT_CONTEXT_PARAMS,
    timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
) -> Tool:
    """Build a Tool from a function's signature and docstring (see the module docstring)."""
    tool_name = name or fn.__name__
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", tool_name):
        raise ToolDefinitionError(f"tool name {tool_name!r} must match [A-Za-z0-9_-]{{1,64}}")
    doc = inspect.getdoc(fn) or ""
    summary, arg_docs = parse_docstring(doc)
    text = " ".join((description or summary).split())[:MAX_DESCRIPTION_CHARS]
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise ToolDefinitionError(f"{tool_name}: cannot resolve type hints: {exc}") from exc
    hidden_names = frozenset(context_params)
    properties: dict[str, Any] = {}
    required: list[str] = []
    injected: dict[str, str] = {}
    injected_defaults: dict[str, Any] = {}
    shown: list[str] = []
    for pname, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolDefinitionError(
                f"{tool_name}: parameter {pname!r} must be an ordinary named parameter"
            )
        annotation = hints.get(pname, inspect.Parameter.empty)
        marker = _injected_marker(annotation)
        if marker is not None or pname in hidden_names:
            injected[pname] = marker.key if marker and marker.key else pname
            if param.default is not param.empty:
                injected_defaults[pname] = param.default
            continue
        try:
            prop = json_schema_for(annotation)
        except ToolDefinitionError as exc:
            raise ToolDefinitionError(f"{tool_name}: parameter {pname!r}: {exc}") from None
        if pname in arg_docs:
            prop["description"] = arg_docs[pname]
        if param.default is param.empty:
            required.append(pname)
        elif _json_safe(param.default):
            prop["default"] = param.default
        properties[pname] = prop
        shown.append(_param_text(pname, annotation, param.default))
    parameters = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    returns = hints.get("return", inspect.Parameter.empty)
    ret = "" if returns is inspect.Parameter.empty else f" -> {_type_text(returns)}"
    return Tool(
        name=tool_name,
        description=text,
        fn=fn,
        parameters=parameters,
        injected=injected,
        injected_defaults=injected_defaults,
        signature=f"{tool_name}({', '.join(shown)}){ret}",
        timeout=timeout,
    )


def json_schema_for(annotation: Any) -> dict[str, Any]:
    """JSON schema for one parameter annotation (the subset tools may use)."""
    if annotation is inspect.Parameter.empty:
        return {"type": "string"}  # as the seed: an unannotated parameter is text
    if annotation is Any:
        return {}
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return json_schema_for(args[0])
    if annotation in _PRIMITIVES:
        return {"type": _PRIMITIVES[annotation]}
    if origin in (typing.Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        if len(members) != 1:
            raise ToolDefinitionError(
                f"unions other than Optional[X] are not supported: {annotation!r}"
            )
        inner = json_schema_for(members[0])
        if len(members) == len(args):
            return inner
        return _nullable(inner)
    if origin is Literal:
        schema: dict[str, Any] = {"enum": list(args)}
        kinds = {type(a) for a in args}
        if len(kinds) == 1 and next(iter(kinds)) in _PRIMITIVES:
            schema = {"type": _PRIMITIVES[next(iter(kinds))], **schema}
        return schema
    if annotation is list or origin is list:
        return {"type": "array", **({"items": json_schema_for(args[0])} if args else {})}
    if annotation is dict or origin is dict:
        return {"type": "object"}
    raise ToolDefinitionError(
        f"unsupported type {annotation!r} (use int, float, bool, str, "
        "Optional, list, dict or Literal)"
    )


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if not schema:
        return schema
    out = dict(schema)
    if isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if "enum" in out and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]
    return out


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description before the first section, {param: description from `Args:`})."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    section_indent = arg_indent = 0
    current: str | None = None
    for line in doc.splitlines():
        header = _SECTION.match(line)
        if header:
            section = header.group(1).lower()
            section_indent = len(line) - len(line.lstrip())
            current = None
            continue
        if section is None:
            summary.append(line)
            continue
        if section not in _ARG_SECTIONS or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent <= section_indent:  # dedented text ends the section
            section, current = "other", None
            continue
        match = _ARG_LINE.match(line)
        if match and (current is None or indent <= arg_indent):
            current, arg_indent = match.group(1), indent
            args[current] = match.group(2).strip()
        elif current is not None:  # a continuation line of the current parameter
            args[current] = f"{args[current]} {line.strip()}".strip()
    return "\n".join(summary).strip(), args


def _injected_marker(annotation: Any) -> Injected | None:
    if typing.get_origin(annotation) is typing.Annotated:
        for extra in typing.get_args(annotation)[1:]:
            if isinstance(extra, Injected):
                return extra
            if extra is Injected:
                return Injected()
    return None


def _json_safe(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _type_text(annotation: Any) -> str:
    if annotation is inspect.Parameter.empty:
        return "str"
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return repr(annotation).replace("typing.", "")


def _param_text(name: str, annotation: Any, default: Any) -> str:
    text = f"{name}: {_type_text(annotation)}"
    return text if default is inspect.Parameter.empty else f"{text} = {default!r}"


# -- argument parsing and validation --------------------------------------------------------
class ArgumentError(ValueError):
    """The model's arguments do not fit the tool's schema; the message says how."""


def parse_arguments(
    tool: Tool, raw_arguments: str | None, context: Mapping[str, Any]
) -> dict[str, Any]:
    """Raw JSON from the model + run context -> keyword arguments for the tool."""
    raw = (raw_arguments or "").strip()
    if not raw:
        data: Any = {}
    else:
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ArgumentError(
                f"arguments are not valid JSON ({exc.msg} at position {exc.pos}): {raw[:200]!r}"
            ) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ArgumentError(f"arguments must be a JSON object, got {type(data).__name__}")
    properties = tool.parameters["properties"]
    unknown = sorted(k for k in data if k not in properties and k not in tool.injected)
    if unknown:
        allowed = ", ".join(properties) or "none"
        raise ArgumentError(
            f"unknown parameter(s) {', '.join(unknown)}; allowed parameters: {allowed}"
        )
    missing = [p for p in tool.parameters["required"] if p not in data]
    if missing:
        raise ArgumentError(f"missing required parameter(s): {', '.join(missing)}")
    kwargs = {k: _check(v, properties[k], k) for k, v in data.items() if k in properties}
    for pname, key in tool.injected.items():  # the context wins over the model
        if key in context:
            kwargs[pname] = context[key]
        elif pname not in tool.injected_defaults:
            raise ArgumentError(
                f"the run context does not supply {key!r}, which this tool "
                "needs (a harness bug, not the model's)"
            )
    return kwargs


_JSON_NAMES = {
    "integer": "an integer",
    "number": "a number",
    "boolean": "true or false",
    "string": "a string",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def _check(value: Any, schema: Mapping[str, Any], where: str) -> Any:
    """Validate (and lightly coerce: 3.0 -> 3, 3 -> 3.0) one value against our schema subset."""
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(json.dumps(c) for c in schema["enum"])
        raise ArgumentError(f"{where} must be one of {choices}, got {json.dumps(value)}")
    kinds = schema.get("type")
    if kinds is None:
        return value
    for kind in [kinds] if isinstance(kinds, str) else kinds:
        ok, coerced = _fits(value, kind)
        if ok:
            if kind == "array" and "items" in schema:
                return [_check(v, schema["items"], f"{where}[{i}]") for i, v in enumerate(coerced)]
            return coerced
    expected = " or ".join(_JSON_NAMES[k] for k in ([kinds] if isinstance(kinds, str) else kinds))
    raise ArgumentError(f"{where} must be {expected}, got {json.dumps(value)}")


def _fits(value: Any, kind: str) -> tuple[bool, Any]:
    if kind == "null":
        return value is None, value
    if kind == "boolean":
        return isinstance(value, bool), value
    if isinstance(value, bool):
        return False, value
    if kind == "integer":
        if isinstance(value, int):
            return True, value
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return False, value
    if kind == "number":
        return isinstance(value, int | float), float(value) if isinstance(value, int) else value
    if kind == "string":
        return isinstance(value, str), value
    if kind == "array":
        return isinstance(value, list), value
    if kind == "object":
        return isinstance(value, dict), value
    return True, value


__all__ = [
    "ArgumentError",
    "Injected",
    "Tool",
    "ToolDefinitionError",
    "ToolResult",
    "Toolbox",
    "build_tool",
    "format_output",
    "json_schema_for",
    "parse_arguments",
    "parse_docstring",
]
