"""`arxivscout eval scenario|locomo|feedback`: the seed's five-call session against the configured
model, LoCoMo's evidence recall of the context assembly (no model needed), and the feedback
people gave answers (app/commands/turns_cmd.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import uuid
from pathlib import Path

from app.commands.turns_cmd import add_feedback_options, run_feedback
from app.evaluation import run_scenario
from app.locomo import DEFAULT_DATA, LocomoEval, load, text_report
from app.runtime import llm_client, open_agent, open_memory
from app.settings import Settings
from bot.background import BackgroundWork
from bot.consolidation import Consolidator
from bot.errors import ConfigError
from bot.upkeep import Upkeep
from memory.context import MIN_MEMORY_TOKENS, ContextLimits
from memory.keys import task_stream
from memory.tasks import TaskStream


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "eval", help="evaluate the agent (scenario), its memory (locomo); list feedback"
    )
    parser.add_argument("name", choices=["scenario", "locomo", "feedback"], help="what to run")
    parser.add_argument("--tenant", help="scenario: tenant to run in (default eval); "
                        "feedback: whose feedback (default local)")  # fmt: skip
    parser.add_argument("--data", type=Path, default=None,
                        help=f"locomo: a file in LoCoMo's layout (default: {DEFAULT_DATA})")  # fmt: skip
    parser.add_argument("--budget", type=budget_tokens, default=2000,
                        help="locomo: tokens for the conversation-derived segments (default 2000)")  # fmt: skip
    parser.add_argument("--dump", type=Path, help="locomo: one JSON line per question to FILE")
    parser.add_argument("--json", action="store_true", help="locomo, feedback: print JSON")
    parser.add_argument("--answer", action="store_true",
                        help="locomo: the model answers each question and an LLM judge grades it")  # fmt: skip
    add_feedback_options(parser)  # `eval feedback`: app/commands/turns_cmd.py
    parser.set_defaults(handler=run)


def budget_tokens(text: str) -> int:
    """--budget's type: refused with the command's usage below the least ARXIVSCOUT_MEMORY_TOKENS
    may be (fewer leave the rolling summaries no window, and the context outgrows its budget)."""
    try:
        tokens = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    if tokens < MIN_MEMORY_TOKENS:
        raise argparse.ArgumentTypeError(
            f"{tokens} is too small: at least {MIN_MEMORY_TOKENS} tokens"
        )
    return tokens


async def run(args: argparse.Namespace) -> int:
    if args.name == "feedback":
        return await run_feedback(args)
    settings = Settings.from_env()
    if args.name == "locomo":
        return await run_locomo(args, settings)
    if not (settings.openai_api_key or settings.openai_base_url):  # a local server needs no key
        raise ConfigError(
            "OPENAI_API_KEY is not set: the scenario needs a real model (or OPENAI_BASE_URL, an "
            "OpenAI-compatible server), so nothing was run."
        )
    runtime = await open_agent(settings)
    try:
        return 0 if await run_scenario(runtime, args.tenant or "eval", print) else 1
    finally:
        await runtime.close()


async def run_locomo(args: argparse.Namespace, settings: Settings) -> int:
    data = args.data or DEFAULT_DATA
    if not data.is_file():
        raise ConfigError(f"No LoCoMo file at {data}: pass one with --data.")
    if args.answer and not (settings.openai_api_key or settings.openai_base_url):
        raise ConfigError("--answer needs a model: set OPENAI_API_KEY (or OPENAI_BASE_URL).")
    conversations = load(data)
    has_model = bool(settings.openai_api_key or settings.openai_base_url)
    llm = llm_client(settings) if has_model else None
    memory = await open_memory(settings)
    tasks = TaskStream(memory.redis, task_stream(f"eval-{uuid.uuid4().hex[:12]}"))
    background = BackgroundWork(tasks)
    upkeep = Upkeep(memory, Consolidator(memory, llm), background, ContextLimits(args.budget))
    background.handle(upkeep.handlers())
    evaluation = LocomoEval(memory, upkeep, args.budget, llm if args.answer else None)
    try:
        with open(args.dump, "w") if args.dump else contextlib.nullcontext() as dump:
            report = await evaluation.run(conversations, dump)
    finally:
        await background.close()
        await tasks.destroy()
        if llm is not None:
            await llm.aclose()
        await memory.close()
    if args.json:  # the JSON alone, for `| jq`
        json.dump(report.to_json(), sys.stdout, indent=2)
        print()
    else:
        print(text_report(report))
    return 0
