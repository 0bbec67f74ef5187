"""A complete offline world for agent tests: scripted model, replayed arXiv, real Redis."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from app.runtime import AgentRuntime, open_agent
from app.settings import Settings
from bot.consolidation import SUMMARY_INSTRUCTIONS
from bot.harness import ENTITY_INSTRUCTIONS
from tests.support.arxiv_replay import MEMGPT_ID, MEMGPT_TITLE, ArxivReplay, memgpt_entry
from tests.support.pdfs import make_pdf
from tests.support.scripted_openai import ScriptedOpenAI, text

MEMGPT_SENTENCE = (
    "MemGPT pages information between a main context and an archival store, "
    "as an operating system pages memory between RAM and disk."
)
MEMGPT_SECTIONS = [
    (
        "1 Introduction",
        [
            "Large language models are limited by their fixed context windows. " + MEMGPT_SENTENCE,
            "Interrupts let the agent yield control while it waits for a tool to return.",
        ],
    ),
    (
        "2 Key takeaways",
        [
            "Virtual context management gives a fixed-window model the illusion of unbounded "
            "memory. Self-directed function calls let the model edit and search its own memory.",
        ],
    ),
]


@dataclass
class World:
    runtime: AgentRuntime
    model: ScriptedOpenAI
    arxiv: ArxivReplay
    entities: list[dict[str, str]] = field(default_factory=list)
    hold_entities: asyncio.Event | None = None
    summary_requests: list[dict[str, Any]] = field(default_factory=list)

    def route(self, body: dict[str, Any]):
        """Answer the harness's own model calls (entities, summaries) out of the script."""
        system = body["messages"][0]["content"] if body.get("messages") else ""
        if system == ENTITY_INSTRUCTIONS:
            return self._entities()
        if system == SUMMARY_INSTRUCTIONS:
            self.summary_requests.append(body)
            return text(json.dumps({
                "description": "User asked for MemGPT, saved it, and got takeaways",
                "summary": "The user asked for the MemGPT paper (arXiv 2310.08560), had it saved "
                           "to the knowledge base and asked for its key takeaways.",
            }))  # fmt: skip
        return None

    async def _entities(self):
        if self.hold_entities is not None:
            await self.hold_entities.wait()
        return text(json.dumps(self.entities))

    @property
    def agent(self):
        return self.runtime.agent

    def model_requests(self) -> list[dict[str, Any]]:
        """The agent loop's requests (not the harness's entity and summary calls)."""
        return [r for r in self.model.requests if r["messages"][0]["content"] not in
                (ENTITY_INSTRUCTIONS, SUMMARY_INSTRUCTIONS)]  # fmt: skip


def memgpt_arxiv() -> ArxivReplay:
    """A started arXiv replay that finds MemGPT by search and by id, and serves its PDF."""
    arxiv = ArxivReplay()
    arxiv.add_entry(memgpt_entry(), search_query="MemGPT")
    arxiv.pdfs[MEMGPT_ID] = make_pdf(MEMGPT_SECTIONS, title=MEMGPT_TITLE)
    return arxiv.start()


async def open_world(
    redis_url: str, data_dir: Path, window: int | None = None, **settings: Any
) -> World:
    arxiv = memgpt_arxiv()
    model = ScriptedOpenAI()
    await model.start()
    config = Settings(
        redis_url=redis_url, data_dir=data_dir, openai_api_key="test-key",
        openai_base_url=model.base_url, arxiv_api_url=arxiv.api_url, arxiv_delay_seconds=0.0,
        llm_timeout_seconds=10.0, **settings,
    )  # fmt: skip
    runtime = await open_agent(config, window=window)
    runtime.llm.retry = type(runtime.llm.retry)(max_attempts=2, base_delay=0.01, max_delay=0.02)
    world = World(runtime, model, arxiv)
    model.router = world.route
    return world


async def close_world(world: World) -> None:
    await world.runtime.close()
    await world.model.close()
    world.arxiv.stop()
