"""The seed's five-call session as an evaluation against a real model: each step pass or fail."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from app.runtime import AgentRuntime
from bot.agent import TurnResult
from memory.scope import Scope

MEMGPT_ID = "2310.08560"
FIRST_QUESTION = "Can you get me the paper MemGPT"


@dataclass
class Check:
    question: str
    expectation: str
    passed: Callable[[AgentRuntime, Scope, TurnResult], Awaitable[bool]]


def _called(result: TurnResult, name: str) -> bool:
    return any(step.name == name and step.status == "success" for step in result.steps)


async def _found(runtime, scope, result) -> bool:
    return _called(result, "arxiv_search_candidates") and "memgpt" in result.answer.lower()


async def _saved(runtime, scope, result) -> bool:
    return _called(result, "fetch_and_save_paper_to_kb") and (
        await runtime.memory.knowledge_base.chunk_count(scope, MEMGPT_ID) > 0
    )


async def _from_memory(runtime, scope, result) -> bool:
    return not result.steps and result.stop_reason == "final" and len(result.answer) > 40


async def _summarized(runtime, scope, result) -> bool:
    messages = await runtime.memory.conversation.all(scope)
    return _called(result, "summarize_and_store") and all(m.summary_id for m in messages[:-1])


async def _expanded(runtime, scope, result) -> bool:
    return _called(result, "expand_summary") and "memgpt" in result.answer.lower()


SCENARIO = [
    Check(FIRST_QUESTION, "searches arXiv and names MemGPT", _found),
    Check(
        "Can you save the content of the paper", "saves 2310.08560 to the knowledge base", _saved
    ),
    Check(
        "What are the main key takeaways from the paper", "answers with no tool call", _from_memory
    ),
    Check(
        "Summarize the conversation so far using your tool", "summarizes with the tool", _summarized
    ),
    Check("What was my first question?", "expands the summary and recalls it", _expanded),
]


async def run_scenario(runtime: AgentRuntime, tenant: str, report: Callable[[str], None]) -> bool:
    scope = Scope.local(f"eval-{uuid.uuid4().hex[:8]}", tenant)
    report(
        f"Five-call session in thread {scope.thread} (tenant {tenant}), model {runtime.llm.model}"
    )
    all_passed = True
    for number, check in enumerate(SCENARIO, 1):
        result = await runtime.agent.run_turn(scope, check.question)
        await runtime.harness.drain()
        passed = await check.passed(runtime, scope, result)
        all_passed &= passed
        tools = ", ".join(s.name for s in result.steps) or "no tool"
        report(f"{'PASS' if passed else 'FAIL'} {number}. {check.question!r}: {check.expectation}")
        report(
            f"       tools: {tools}; iterations: {result.iterations}; answer: {result.answer[:160]!r}"
        )
    report("all steps passed" if all_passed else "some steps failed")
    return all_passed
