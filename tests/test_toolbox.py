"""bot.toolbox: schemas from signatures and docstrings, injection, and the never-raising executor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, Optional

import pytest

from bot.llm import LLMClient, RetryPolicy
from bot.toolbox import (
    Injected,
    Tool,
    Toolbox,
    ToolDefinitionError,
    build_tool,
    parse_docstring,
)
from tests.support.scripted_openai import ScriptedOpenAI, call, text, tool_calls


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

    Returns:
        Nothing useful.
    """
    return "ok"


# -- schema building -------------------------------------------------------------------------
def test_schema_types_required_and_defaults() -> None:
    tool = build_tool(kitchen_sink)
    params = tool.parameters
    assert params["type"] == "object" and params["additionalProperties"] is False
    assert params["required"] == ["query", "count", "ratio", "flag"]
    p = params["properties"]
    assert p["query"] == {"type": "string", "description": "What to look for."}
    assert p["count"] == {"type": "integer", "description": "How many results to return, at most."}
    assert p["ratio"]["type"] == "number"
    assert p["flag"]["type"] == "boolean"
    assert p["maybe"] == {"type": ["integer", "null"], "default": None}
    assert p["maybe_text"] == {"type": ["string", "null"], "default": None}
    assert p["tags"] == {"type": ["array", "null"], "items": {"type": "string"}, "default": None}
    assert p["scores"] == {"type": "array", "items": {"type": "number"}, "default": []}
    assert p["order"] == {
        "type": "string",
        "enum": ["relevance", "date"],
        "description": "Sort order.",
        "default": "relevance",
    }
    assert p["level"] == {"type": "integer", "enum": [1, 2, 3], "default": 1}
    assert p["anything"] == {"default": None}
    assert p["plain"] == {"type": "string", "default": None}
    assert p["options"] == {"type": ["object", "null"], "default": None}


def test_openai_schema_description_and_record() -> None:
    tool = build_tool(kitchen_sink)
    schema = tool.schema()
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "kitchen_sink"
    assert schema["function"]["description"] == (
        "Exercise every supported parameter kind. Second paragraph of the description."
    )
    assert schema["function"]["parameters"] is tool.parameters
    record = tool.record()
    assert set(record) == {"name", "description", "signature"}
    assert record["signature"].startswith("kitchen_sink(query: str, count: int, ratio: float")
    assert "order: Literal['relevance', 'date'] = 'relevance'" in record["signature"]
    assert record["signature"].endswith(") -> str")


def test_parse_docstring_sections() -> None:
    summary, args = parse_docstring(
        "Find papers.\n\nArgs:\n    q (str): the query\n        continued here\n"
        "    n: how many\nRaises:\n    ValueError: never\n"
    )
    assert summary == "Find papers."
    assert args == {"q": "the query continued here", "n": "how many"}


def test_decorator_forms_and_registry() -> None:
    box = Toolbox()

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
    assert "renamed" in box and len(box) == 2
    assert box["renamed"].description == "Custom description."
    assert box["renamed"].timeout == 1.5 and box["renamed"].is_async
    assert box["bare"].timeout == box.default_timeout and not box["bare"].is_async
    assert [s["function"]["name"] for s in box.schemas(["renamed", "missing", "bare"])] == [
        "renamed",
        "bare",
    ]
    assert all(isinstance(t, Tool) for t in box)


def test_context_params_are_hidden_from_the_schema() -> None:
    box = Toolbox()

    @box.register_tool
    def summarize_and_store(thread_id: str, tenant: str, note: str = "") -> str:
        """Summarize the thread."""
        return ""

    @box.register_tool(inject={"store"})
    def save(arxiv_id: str, store: object, clock: Annotated[object, Injected("now")] = None) -> str:
        """Save a paper."""
        return ""

    assert box["summarize_and_store"].parameters["properties"] == {
        "note": {"type": "string", "default": ""}
    }
    assert box["summarize_and_store"].parameters["required"] == []
    assert box["summarize_and_store"].signature == "summarize_and_store(note: str = '') -> str"
    assert list(box["save"].parameters["properties"]) == ["arxiv_id"]
    assert dict(box["save"].injected) == {"store": "store", "clock": "now"}


def test_definition_errors() -> None:
    box = Toolbox()

    def star(*args: int) -> None:
        """No."""

    def weird(x: set[int]) -> None:
        """No."""

    def union(x: int | str) -> None:
        """No."""

    for fn in (star, weird, union):
        with pytest.raises(ToolDefinitionError):
            box.register_tool(fn)

    @box.register_tool
    def dup() -> None:
        """First."""

    with pytest.raises(ToolDefinitionError, match="already registered"):
        box.register_tool(name="dup")(lambda: None)
    with pytest.raises(ToolDefinitionError, match="must match"):
        box.register_tool(name="has space")(lambda: None)


# -- execute -----------------------------------------------------------------------------------
@pytest.fixture
def box() -> Toolbox:
    box = Toolbox(default_timeout=2.0)

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
    def whoami(thread_id: str, tenant: str) -> dict[str, str]:
        """Report the injected context."""
        return {"thread": thread_id, "tenant": tenant}

    @box.register_tool
    def pick(
        order: Literal["relevance", "date"], ids: list[int] | None = None, weight: float = 1.0
    ) -> str:
        """Enum, list and number parameters."""
        return f"{order} {ids} {weight!r}"

    @box.register_tool
    def explode() -> str:
        """Always fails."""
        raise ValueError("paper not found")

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


async def test_execute_sync_and_async_success(box: Toolbox) -> None:
    result = await box.execute("add", '{"a": 2, "b": 3}', {})
    assert (result.status, result.output, result.error) == ("success", "5", None)
    assert result.ok and result.duration_ms >= 0
    assert (await box.execute("add", '{"a": 2.0}', {})).output == "3"  # 2.0 is an integer
    assert (await box.execute("greet", '{"name": "ada", "shout": true}', {})).output == "HELLO ADA"
    assert (await box.execute("nothing", "", {})).output == "Done"
    assert (
        await box.execute("pick", '{"order": "date", "ids": [1, 2], "weight": 2}', {})
    ).output == "date [1, 2] 2.0"


async def test_execute_injects_context_over_the_model(box: Toolbox) -> None:
    context = {"tenant": "slack:T1", "thread_id": "cli:50000"}
    result = await box.execute("whoami", '{"thread_id": "someone-else"}', context)
    assert result.status == "success"
    assert result.output == '{"thread": "cli:50000", "tenant": "slack:T1"}'
    missing = await box.execute("whoami", "{}", {"tenant": "t"})
    assert missing.status == "error" and "does not supply 'thread_id'" in missing.output


async def test_unknown_tool(box: Toolbox) -> None:
    result = await box.execute("fly", "{}", {})
    assert result.status == "error"
    assert result.output.startswith("Error: unknown tool 'fly'")
    assert "add" in result.output  # the model is told what exists


@pytest.mark.parametrize(
    ("name", "raw", "fragment"),
    [
        ("add", '{"a": 1,', "not valid JSON"),
        ("add", "[1, 2]", "must be a JSON object"),
        ("add", "{}", "missing required parameter(s): a"),
        ("add", '{"a": "two"}', 'a must be an integer, got "two"'),
        ("add", '{"a": true}', "a must be an integer"),
        ("add", '{"a": 1.5}', "a must be an integer"),
        ("add", '{"a": 1, "c": 2}', "unknown parameter(s) c; allowed parameters: a, b"),
        ("greet", '{"name": 5}', "name must be a string"),
        ("greet", '{"name": "x", "shout": "yes"}', "shout must be true or false"),
        ("pick", '{"order": "random"}', 'order must be one of "relevance", "date"'),
        ("pick", '{"order": "date", "ids": [1, "x"]}', "ids[1] must be an integer"),
        ("pick", '{"order": "date", "ids": 3}', "ids must be an array or null"),
        ("pick", '{"order": "date", "weight": "heavy"}', "weight must be a number"),
    ],
)
async def test_schema_violations_are_errors(
    box: Toolbox, name: str, raw: str, fragment: str
) -> None:
    result = await box.execute(name, raw, {})
    assert result.status == "error"
    assert result.output.startswith(f"Error: invalid arguments for {name}: ")
    assert fragment in result.output
    assert result.error is not None and fragment in result.error


async def test_raising_tool_is_an_error(box: Toolbox) -> None:
    result = await box.execute("explode", "{}", {})
    assert result.status == "error"
    assert result.output == "Error: tool explode failed: ValueError: paper not found"
    assert result.error == "ValueError: paper not found"


@pytest.mark.parametrize("name", ["slow_async", "slow_sync"])
async def test_timeout(box: Toolbox, name: str) -> None:
    started = time.monotonic()
    result = await box.execute(name, "{}", {})
    assert result.status == "timeout"
    assert result.output == f"Error: tool {name} timed out after 0.1s"
    assert time.monotonic() - started < 0.4


# -- end to end: a model's tool call over HTTP into the toolbox -------------------------------
@pytest.fixture
async def server() -> AsyncIterator[ScriptedOpenAI]:
    async with ScriptedOpenAI() as srv:
        yield srv


async def test_model_tool_calls_run_through_the_toolbox(
    box: Toolbox, server: ScriptedOpenAI
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
        result = await box.execute(tc.name, tc.arguments, {"thread_id": "t"})
        messages.append({"role": "tool", "tool_call_id": tc.id, "content": result.output})
    final = await client.chat(messages, tools=box.schemas(["add"]))
    await client.aclose()
    assert final.content == "The answer is 42."
    seen = server.requests[1]["messages"]
    assert seen[2]["content"] == "42"
    assert seen[3]["content"].startswith("Error: invalid arguments for add: arguments are not")
    assert server.requests[0]["tools"][0]["function"]["parameters"]["required"] == ["a"]
