"""`arxivscout eval scenario`: the seed's five-call session against the configured model."""

from __future__ import annotations

import argparse

from app.evaluation import run_scenario
from app.runtime import open_agent
from app.settings import Settings


def add_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("eval", help="evaluate the agent against the real model")
    parser.add_argument("name", choices=["scenario"], help="the evaluation to run")
    parser.add_argument("--tenant", default="eval", help="tenant to run in (default: eval)")
    parser.set_defaults(handler=run)


async def run(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if not settings.openai_api_key:
        print("OPENAI_API_KEY is not set: the scenario needs a real model, so nothing was run.")
        return 0
    runtime = await open_agent(settings)
    try:
        return 0 if await run_scenario(runtime, args.tenant, print) else 1
    finally:
        await runtime.close()
