"""A scripted OpenAI-compatible model in its own process, for benchmarks: the bot under test
then has its machine's CPU to itself, as with a remote model.

Answers every agent-loop request after `--delay` seconds; when the question starts with
TOOL_MARKER it first asks for `search_knowledge_base`. Entity extraction is answered at once
with []. Prints its base URL, then serves until its standard input closes.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bot.harness import ENTITY_INSTRUCTIONS
from tests.support.scripted_openai import ScriptedOpenAI, call, text, tool_calls

TOOL_MARKER = "Using the knowledge base: "
ANSWER = "Here is what the saved papers say, with the passages cited."


def responder(delay: float):
    async def respond(body: dict):
        messages = body.get("messages") or []
        if messages and messages[0].get("content") == ENTITY_INSTRUCTIONS:
            return text("[]")
        await asyncio.sleep(delay)
        question = messages[1]["content"].split("\n")[1] if len(messages) > 1 else ""
        first = not any(m.get("role") == "tool" for m in messages)
        if first and question.startswith(TOOL_MARKER):
            return tool_calls(
                call("search_knowledge_base", {"query": question[len(TOOL_MARKER) :]})
            )
        return text(ANSWER)

    return respond


async def serve(delay: float) -> None:
    server = ScriptedOpenAI(responder=responder(delay))
    print(await server.start(), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await server.close()


async def start_model_process(delay: float) -> tuple[asyncio.subprocess.Process, str]:
    """Start this server as a child process; returns it and its base URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--delay", str(delay),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    url = (await process.stdout.readline()).decode().strip()
    return process, url


async def stop_model_process(process: asyncio.subprocess.Process) -> None:
    process.stdin.close()
    await process.wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--delay", type=float, default=1.0)
    asyncio.run(serve(parser.parse_args().delay))
