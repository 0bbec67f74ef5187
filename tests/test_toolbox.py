"""bot.toolbox: pydantic schemas from signatures, the typed run context, and the executor."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Optional

import pydantic
import pytest
from pydantic import BaseModel, Field

from bot.llm import LLMClient, RetryPolicy
from bot.toolbox import (
    ArgumentError,
    Tool,
    Toolbox,
    ToolDefinitionError,
    ToolResult,
    build_tool,
    format_output,
)
from tests.support.scripted_openai import ScriptedOpenAI, call, text, tool_calls


@dataclass
class RunContext:
    tenant: str
    thread_id: str


class Paper(BaseModel):
    title: str
    year: int | None = None


class Opaque:
    """Not something pydantic can validate."""


def kitchen_sink(
    query: str,
    count: int,
    ratio: float,
    flag: bool,
    maybe: Optional[int] = None,  # noqa: UP045 - the typing.Optional spelling is under test
    maybe_text: str | None = None,
    tags: list[str] | None = None,
    scores: list[float] = [],  # noqa: B006 - a default list shows up in the schema
    order: Literal["relevance", "date"] = "relevance",
    level: Literal[1, 2, 3] = 1,
    anything: Any = None,
    plain=None,
    options: dict[str, int] | None = None,
    papers: list[Paper] | None = None,
    either: int | str = 0,
    limit: Annotated[int, Field(ge=1, le=50)] = 10,
) -> str:
    """Exercise every supported parameter kind.

    Second paragraph of the description.

    Args:
        query: What to look for.
        count (int): How many results
            to return, at most.
        ratio: A number.
        flag: A boolean.
        order: Sort order.
        papers: Papers to compare.

    Returns:
        Nothing useful.

    Raises:
        ValueError: never.
    """
    return "ok"


NULL = {"type": "null"}


# -- schema building -------------------------------------------------------------------------
def test_schema_types_required_and_defaults() -> None:
    params = build_tool(kitchen_sink).parameters
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert params["required"] == ["query", "count", "ratio", "flag"]
    p = params["properties"]
    assert p["query"] == {"type": "string", "description": "What to look for."}
    assert p["count"] == {"type": "integer", "description": "How many results to return, at most."}
    assert p["ratio"] == {"type": "number", "description": "A number."}
    assert p["flag"] == {"type": "boolean", "description": "A boolean."}
    assert p["maybe"] == {"anyOf": [{"type": "integer"}, NULL], "default": None}
    assert p["maybe_text"] == {"anyOf": [{"type": "string"}, NULL], "default": None}
    assert p["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, NULL],
        "default": None,
    }
    assert p["scores"] == {"type": "array", "items": {"type": "number"}, "default": []}
    assert p["order"] == {
        "type": "string",
        "enum": ["relevance", "date"],
        "description": "Sort order.",
        "default": "relevance",
    }
    assert p["level"] == {"type": "integer", "enum": [1, 2, 3], "default": 1}
    assert p["anything"] == {"default": None}
    assert p["plain"] == {"type": "string", "default": None}  # unannotated means text
    assert p["options"] == {
        "anyOf": [{"type": "object", "additionalProperties": {"type": "integer"}}, NULL],
        "default": None,
    }
    assert p["either"] == {"anyOf": [{"type": "integer"}, {"type": "string"}], "default": 0}
    assert p["limit"] == {"type": "integer", "minimum": 1, "maximum": 50, "default": 10}


def test_nested_models_stay_usable_and_titles_are_dropped() -> None:
    params = build_tool(kitchen_sink).parameters
    assert params["properties"]["papers"] == {
        "anyOf": [{"type": "array", "items": {"$ref": "#/$defs/Paper"}}, NULL],
        "default": None,
        "description": "Papers to compare.",
    }
    assert params["$defs"]["Paper"] == {
        "type": "object",
        "properties": {  # a property *named* title survives; title keywords do not
            "title": {"type": "string"},
            "year": {"anyOf": [{"type": "integer"}, NULL], "default": None},
        },
        "required": ["title"],
    }
    assert '"title": "' not in json.dumps(params)


def test_openai_schema_description_and_record() -> None:
    tool = build_tool(kitchen_sink)
    schema = tool.schema()
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "kitchen_sink"
    assert schema["function"]["description"] == (
        "Exercise every supported parameter kind. Second paragraph of the description."
    )
    assert schema["function"]["parameters"] is tool.parameters  # built once, not per call
    record = tool.record()
    assert set(record) == {"name", "description", "signature"}
    assert record["signature"].startswith("kitchen_sink(query: str, count: int, ratio: float")
    assert "order: Literal['relevance', 'date'] = 'relevance'" in record["signature"]
    assert "plain: str = None" in record["signature"]
    assert "papers: list[Paper] | None = None, either: int | str = 0" in record["signature"]
    assert record["signature"].endswith(") -> str")


def test_description_whitespace_cap_override_and_other_docstring_styles() -> None:
    def rest_style(q: str, n: int = 3) -> str:
        """Find papers.

        :param q: the
            query
        :param n: how many
        """
        return q

    tool = build_tool(rest_style)
    assert tool.description == "Find papers."
    assert tool.parameters["properties"]["q"]["description"] == "the query"
    assert tool.parameters["properties"]["n"]["description"] == "how many"
    assert build_tool(rest_style, description="  Custom\n  text. ").description == "Custom text."
    assert len(build_tool(rest_style, description="word " * 400).description) == 1024

    def undocumented(x: int) -> int:
        return x

    tool = build_tool(undocumented)
    assert tool.description == "" and "description" not in tool.parameters["properties"]["x"]


def test_decorator_forms_and_registry() -> None:
    box: Toolbox[RunContext] = Toolbox(RunContext)

    @box.register_tool
    def bare(x: int) -> int:
        """Bare form."""
        return x

    @box.register_tool(name="renamed", description="Custom description.", timeout=1.5)
    async def original(y: str) -> str:
        """Ignored because a description was given."""
        return y

    assert bare(3) == 3  # the function stays directly callable
    assert box.names() == ["bare", "renamed"]
    assert "renamed" in box and "original" not in box and len(box) == 2
    assert box["renamed"].description == "Custom description."
    assert box["renamed"].fn is original and box.get("missing") is None
    assert box["renamed"].timeout == 1.5 and box["bare"].timeout == box.default_timeout == 120.0

    @box.register_tool(timeout=None)
    def unlimited() -> None:
        """No time limit."""

    assert box["unlimited"].timeout is None
    box.add(box["bare"])  # the same function again is not a duplicate
    assert box.names() == ["bare", "renamed", "unlimited"]
    assert [s["function"]["name"] for s in box.schemas(["renamed", "missing", "bare"])] == [
        "renamed",
        "bare",
    ]
    assert [s["function"]["name"] for s in box.schemas()] == box.names()
    assert all(isinstance(t, Tool) for t in box)


def test_context_parameter_is_hidden_from_the_schema() -> None:
    box: Toolbox[RunContext] = Toolbox(RunContext)

    @box.register_tool
    def summarize_and_store(ctx: RunContext, note: str = "") -> str:
        """Summarize the thread."""
        return ""

    @box.register_tool
    def save(arxiv_id: str, ctx: RunContext) -> str:  # not first: still the context
        """Save a paper."""
        return ""

    tool = box["summarize_and_store"]
    assert tool.context_param == "ctx"
    assert tool.parameters["properties"] == {"note": {"type": "string", "default": ""}}
    assert tool.parameters["required"] == []
    assert tool.signature == "summarize_and_store(note: str = '') -> str"
    assert list(box["save"].parameters["properties"]) == ["arxiv_id"]
    assert box["save"].context_param == "ctx"
    assert set(tool.arguments.model_fields) == {"note"}
    # without a context type, nothing is hidden (and a dataclass is an ordinary argument)
    assert build_tool(save).context_param is None
    assert "ctx" in build_tool(save).parameters["required"]


def test_definition_errors() -> None:
    box: Toolbox[RunContext] = Toolbox(RunContext)

    def star(*args: int) -> None:
        """No."""

    def double_star(**kwargs: int) -> None:
        """No."""

    def positional(x: int, /) -> None:
        """No."""

    def opaque(x: Opaque) -> None:
        """No."""

    def unresolvable(x: Missing) -> None:  # type: ignore[name-defined]  # noqa: F821
        """No."""

    def underscore(_x: int) -> None:
        """No."""

    def two_contexts(a: RunContext, b: RunContext) -> None:
        """No."""

    for fn in (star, double_star, positional, opaque, unresolvable, underscore, two_contexts):
        with pytest.raises(ToolDefinitionError):
            box.register_tool(fn)
    assert len(box) == 0

    @box.register_tool
    def dup() -> None:
        """First."""

    with pytest.raises(ToolDefinitionError, match="already registered"):
        box.register_tool(name="dup")(lambda: None)
    for bad in ("has space", "", "x" * 65, "dötted"):
        with pytest.raises(ToolDefinitionError, match="must match"):
            box.register_tool(name=bad)(lambda: None)
    with pytest.raises(ToolDefinitionError, match="must match"):
        build_tool(lambda: None)  # "<lambda>" is not a tool name
    assert issubclass(ToolDefinitionError, TypeError) and issubclass(ArgumentError, ValueError)


# -- execute -----------------------------------------------------------------------------------
CONTEXT = RunContext(tenant="slack:T1", thread_id="cli:50000")


@pytest.fixture
def box() -> Toolbox[RunContext]:
    box: Toolbox[RunContext] = Toolbox(RunContext, default_timeout=2.0)

    @box.register_tool
    def add(a: int, b: int = 1) -> int:
        """Add two integers."""
        return a + b

    @box.register_tool
    async def greet(name: str, shout: bool = False) -> str:
        """Greet someone."""
        await asyncio.sleep(0)
        return f"HELLO {name.upper()}" if shout else f"hello {name}"

    @box.register_tool
    def whoami(ctx: RunContext, note: str = "") -> dict[str, str]:
        """Report the run context."""
        return {"thread": ctx.thread_id, "tenant": ctx.tenant, "note": note}

    @box.register_tool
    def pick(
        order: Literal["relevance", "date"], ids: list[int] | None = None, weight: float = 1.0
    ) -> str:
        """Enum, list and number parameters."""
        return f"{order} {ids} {weight!r}"

    @box.register_tool
    async def compare(ctx: RunContext, papers: list[Paper], key: int | str = "title") -> Paper:
        """Nested models arrive as model instances."""
        assert all(isinstance(p, Paper) for p in papers)
        return max(papers, key=lambda p: p.year or 0)

    @box.register_tool
    def explode() -> str:
        """Always fails."""
        raise ValueError("paper not found")

    @box.register_tool
    async def own_timeout() -> str:
        """Raises TimeoutError itself, well within its time limit."""
        raise TimeoutError("arxiv did not answer")

    @box.register_tool
    def nothing() -> None:
        """Returns None."""

    @box.register_tool(timeout=0.1)
    async def slow_async() -> str:
        """Too slow."""
        await asyncio.sleep(5)
        return "never"

    @box.register_tool(timeout=0.1)
    def slow_sync() -> str:
        """Too slow, in a thread."""
        time.sleep(0.5)
        return "never"

    return box


async def test_execute_sync_and_async_success(box: Toolbox[RunContext]) -> None:
    result = await box.execute("add", '{"a": 2, "b": 3}')
    assert (result.status, result.output, result.error) == ("success", "5", None)
    assert result.ok and result.duration_ms >= 0
    assert (await box.execute("add", '{"a": 2.0}')).output == "3"  # lax: 2.0 is an integer
    assert (await box.execute("greet", '{"name": "ada", "shout": true}')).output == "HELLO ADA"
    assert (
        await box.execute("pick", '{"order": "date", "ids": [1, 2], "weight": 2}')
    ).output == "date [1, 2] 2.0"
    for empty in ("", None, "null", "  "):
        assert (await box.execute("nothing", empty)).output == "Done"
    assert (await box.execute("add", "null")).status == "error"  # "a" is still required


async def test_sync_tool_runs_in_a_worker_thread() -> None:
    box: Toolbox[RunContext] = Toolbox()
    loop_thread = threading.get_ident()

    @box.register_tool
    def where() -> bool:
        """Which thread am I on?"""
        return threading.get_ident() != loop_thread

    assert (await box.execute("where", "{}")).output == "true"


async def test_context_is_injected_and_never_chosen_by_the_model(box: Toolbox[RunContext]) -> None:
    result = await box.execute("whoami", '{"note": "hi"}', CONTEXT)
    assert result.status == "success"
    assert result.output == '{"thread": "cli:50000", "tenant": "slack:T1", "note": "hi"}'
    spoof = await box.execute("whoami", '{"ctx": {"tenant": "x", "thread_id": "y"}}', CONTEXT)
    assert spoof.status == "error" and "ctx: unknown parameter (allowed: note)" in spoof.output
    missing = await box.execute("whoami", "{}")
    assert missing.status == "error" and "harness bug" in missing.output
    assert (await box.execute("add", '{"a": 1}', CONTEXT)).output == "2"  # ignored if unused


async def test_nested_models_and_unions(box: Toolbox[RunContext]) -> None:
    raw = json.dumps({"papers": [{"title": "A", "year": 2020}, {"title": "B", "year": 2024}]})
    result = await box.execute("compare", raw, CONTEXT)
    assert result.output == '{"title": "B", "year": 2024}'
    for key in ("1", '"year"'):
        raw = f'{{"papers": [{{"title": "A"}}], "key": {key}}}'
        assert (await box.execute("compare", raw, CONTEXT)).ok
    bad = await box.execute("compare", '{"papers": [{"year": "old"}], "key": [1]}', CONTEXT)
    assert bad.status == "error"
    assert "papers[0].title: required but missing" in bad.output
    assert "papers[0].year: Input should be a valid integer, unable to parse" in bad.output
    assert 'as an integer (got "old")' in bad.output
    assert "key.int: Input should be a valid integer (got [1])" in bad.output


async def test_unknown_tool(box: Toolbox[RunContext]) -> None:
    result = await box.execute("fly", "{}")
    assert result.status == "error"
    assert result.output.startswith("Error: unknown tool 'fly'")
    assert "add, compare, explode, greet" in result.output  # the model is told what exists


@pytest.mark.parametrize(
    ("name", "raw", "fragment"),
    [
        ("add", '{"a": 1,', "arguments are not valid JSON (EOF while parsing"),
        ("add", "[1, 2]", "arguments must be a JSON object (got [1, 2])"),
        ("add", '"a"', 'arguments must be a JSON object (got "a")'),
        ("add", "{}", "a: required but missing"),
        ("add", '{"a": "two"}', "a: Input should be a valid integer, unable to parse string"),
        ("add", '{"a": "two"}', 'parse string as an integer (got "two")'),
        ("add", '{"a": 1.5}', "a: Input should be a valid integer, got a number with a frac"),
        ("add", '{"a": 1, "c": 2}', "c: unknown parameter (allowed: a, b)"),
        ("greet", '{"name": 5}', "name: Input should be a valid string (got 5)"),
        ("greet", '{"name": "x", "shout": "maybe"}', "shout: Input should be a valid boolean"),
        ("pick", '{"order": "random"}', "order: Input should be 'relevance' or 'date' (got \"ra"),
        ("pick", '{"order": "date", "ids": [1, "x"]}', "ids[1]: Input should be a valid integer"),
        ("pick", '{"order": "date", "ids": 3}', "ids: Input should be a valid array (got 3)"),
        ("pick", '{"order": "date", "weight": "heavy"}', "weight: Input should be a valid number"),
    ],
)
async def test_invalid_arguments_are_readable_errors(
    box: Toolbox[RunContext], name: str, raw: str, fragment: str
) -> None:
    result = await box.execute(name, raw)
    assert result.status == "error"
    assert result.output.startswith(f"Error: invalid arguments for {name}: ")
    assert fragment in result.output
    assert result.error is not None and fragment in result.error


async def test_every_field_error_is_reported_at_once(box: Toolbox[RunContext]) -> None:
    result = await box.execute("pick", '{"ids": ["x"], "weight": "heavy", "zzz": 1}')
    assert result.error is not None
    parts = result.error.removeprefix("invalid arguments for pick: ").split("; ")
    assert [p.split(":")[0] for p in parts] == ["order", "ids[0]", "weight", "zzz"]


async def test_parse_arguments_directly(box: Toolbox[RunContext]) -> None:
    assert box["add"].parse_arguments('{"a": "7"}') == {"a": 7, "b": 1}  # lax mode
    with pytest.raises(ArgumentError, match="a: required but missing"):
        box["add"].parse_arguments("")


async def test_raising_tool_is_an_error(box: Toolbox[RunContext]) -> None:
    result = await box.execute("explode", "{}")
    assert result.status == "error"
    assert result.output == "Error: tool explode failed: ValueError: paper not found"
    assert result.error == "ValueError: paper not found"
    own = await box.execute("own_timeout", "{}")  # a tool's own TimeoutError is not ours
    assert own.status == "error" and own.error == "TimeoutError: arxiv did not answer"


@pytest.mark.parametrize("name", ["slow_async", "slow_sync"])
async def test_timeout(box: Toolbox[RunContext], name: str) -> None:
    started = time.monotonic()
    result = await box.execute(name, "{}")
    assert result.status == "timeout" and not result.ok
    assert result.output == f"Error: tool {name} timed out after 0.1s"
    assert result.error == f"tool {name} timed out after 0.1s"
    assert time.monotonic() - started < 0.4


async def test_cancellation_propagates(box: Toolbox[RunContext]) -> None:
    task = asyncio.create_task(box.execute("slow_async", "{}"))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_execute_does_not_rebuild_schemas(
    box: Toolbox[RunContext], monkeypatch: pytest.MonkeyPatch
) -> None:
    box.schemas()

    def forbidden(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("schema rebuilt")

    monkeypatch.setattr(pydantic, "create_model", forbidden)
    monkeypatch.setattr(box["add"].arguments, "model_json_schema", forbidden)
    assert (await box.execute("add", '{"a": 1}')).output == "2"
    assert box.schemas(["add"])[0]["function"]["parameters"]["required"] == ["a"]


def test_format_output() -> None:
    @dataclass
    class Hit:
        arxiv_id: str
        score: float

    assert format_output("plain text") == "plain text"
    assert format_output(None) == "Done"
    assert format_output(42) == "42"
    assert format_output({"title": "Müller"}) == '{"title": "Müller"}'
    assert format_output([Paper(title="A")]) == '[{"title": "A", "year": null}]'
    assert format_output(Hit("2401.1", 0.5)) == '{"arxiv_id": "2401.1", "score": 0.5}'
    assert format_output({"when": Opaque}).startswith('{"when": "<class ')  # str() fallback
    looped: list[Any] = []
    looped.append(looped)
    assert format_output(looped) == "[[...]]"


def test_tool_result_ok() -> None:
    assert ToolResult("success", "x").ok
    assert not ToolResult("error", "x", "boom").ok


# -- end to end: a model's tool call over HTTP into the toolbox -------------------------------
@pytest.fixture
async def server() -> AsyncIterator[ScriptedOpenAI]:
    async with ScriptedOpenAI() as srv:
        yield srv


async def test_model_tool_calls_run_through_the_toolbox(
    box: Toolbox[RunContext], server: ScriptedOpenAI
) -> None:
    server.script(
        tool_calls(call("add", {"a": 40, "b": 2}, id="c1"), call("add", '{"a": ', id="c2")),
        text("The answer is 42."),
    )
    client = LLMClient(
        api_key="k", base_url=server.base_url, timeout_seconds=5, retry=RetryPolicy(max_attempts=1)
    )
    messages: list[dict[str, Any]] = [{"role": "user", "content": "add 40 and 2"}]
    reply = await client.chat(messages, tools=box.schemas(["add"]))
    messages.append(reply.assistant_message())
    for tc in reply.tool_calls:
        result = await box.execute(tc.name, tc.arguments, CONTEXT)
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": result.output})
    final = await client.chat(messages, tools=box.schemas(["add"]))
    await client.aclose()
    assert final.content == "The answer is 42."
    seen = server.requests[1]["messages"]
    assert seen[2]["content"] == "42"
    assert seen[3]["content"].startswith("Error: invalid arguments for add: arguments are not")
    assert server.requests[0]["tools"][0]["function"]["parameters"]["required"] == ["a"]
