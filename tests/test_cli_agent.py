"""`arxivscout chat`, `ask` and `eval scenario` as a user runs them: subprocesses, offline."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from bot.consolidation import SUMMARY_INSTRUCTIONS
from bot.harness import ENTITY_INSTRUCTIONS
from tests.agent_world import memgpt_arxiv
from tests.support.arxiv_replay import MEMGPT_ID
from tests.support.scripted_openai import ScriptedOpenAI, call, text, tool_calls


def scenario_model(body: dict):
    """A stand-in model that plays the seed's session by reading the context it is sent."""
    messages = body["messages"]
    system = messages[0]["content"]
    if system == ENTITY_INSTRUCTIONS:
        return text("[]")
    if system == SUMMARY_INSTRUCTIONS:
        return text(
            json.dumps({"description": "MemGPT search, save and takeaways", "summary": "..."})
        )
    question = messages[1]["content"].split("\n")[1]
    after_tool = messages[-1]["role"] == "tool"
    if question.startswith("Can you get me"):
        return (
            text("Found MemGPT (arXiv 2310.08560).")
            if after_tool
            else tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"}))
        )
    if question.startswith("Can you save"):
        return (
            text("Saved it.")
            if after_tool
            else tool_calls(call("fetch_and_save_paper_to_kb", {"arxiv_id": MEMGPT_ID}))
        )
    if question.startswith("What are the main"):
        return text("MemGPT pages context between a main context and an archival store.")
    if question.startswith("Summarize"):
        return text("Summarized.") if after_tool else tool_calls(call("summarize_and_store", {}))
    if question.startswith("What was my first"):
        if after_tool:
            return text("Your first question was: Can you get me the paper MemGPT")
        summary_id = re.search(r"\[Summary ID: (sum_\w+)\]", messages[1]["content"])[1]
        return tool_calls(call("expand_summary", {"summary_id": summary_id}))
    return text(f"You said: {question}")


@pytest.fixture(scope="module")
def services():
    arxiv = memgpt_arxiv()
    model = ScriptedOpenAI(responder=scenario_model)
    base_url = model.start_in_thread()
    yield base_url, arxiv
    model.stop()
    arxiv.stop()


@pytest.fixture
def env(cli_env, services):
    base_url, arxiv = services
    return {**cli_env, "OPENAI_API_KEY": "test-key", "OPENAI_BASE_URL": base_url,
            "ARXIV_API_URL": arxiv.api_url, "ARXIV_DELAY_SECONDS": "0"}  # fmt: skip


def arxivscout(env: dict, *args: str, stdin: str = "") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, input=stdin,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_ask_answers_one_question(env, tenant):
    result = arxivscout(env, "ask", "--tenant", tenant, "--thread", "q", "hello there")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "You said: hello there"


def test_chat_reads_piped_lines_and_runs_commands(env, tenant):
    lines = "first message\n\nsecond message\n/summarize\n/context what now\n/expand sum_missing\n"
    result = arxivscout(env, "chat", "--tenant", tenant, "--thread", "c", stdin=lines)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "You said: first message" in out and "You said: second message" in out
    assert out.index("You said: first message") < out.index("You said: second message")
    stored = re.search(r"Stored as \[Summary ID: (sum_\w+)\]", out)
    assert stored, out
    assert f"[Summary ID: {stored[1]}] MemGPT search, save and takeaways" in out  # /context
    assert "<!-- Knowledge Base Memory:" in out
    assert "No summary with id 'sum_missing'" in out
    shown = arxivscout(env, "memory", "thread", "c", "--tenant", tenant)
    assert f"[summary {stored[1]}]: first message" in shown.stdout


def test_chat_shows_tool_steps(env, tenant):
    result = arxivscout(
        env, "chat", "--tenant", tenant, "--thread", "s", stdin="Can you get me the paper MemGPT\n"
    )
    assert result.returncode == 0, result.stderr
    assert (
        "→ arxiv_search_candidates" in result.stdout
        and "← arxiv_search_candidates: success" in result.stdout
    )


def test_missing_key_is_a_clear_error(cli_env):
    result = arxivscout(cli_env, "ask", "--thread", "x", "hi")
    assert result.returncode == 2 and "OPENAI_API_KEY is not set" in result.stderr
    assert "Traceback" not in result.stderr


def test_eval_without_key_says_so(cli_env):
    result = arxivscout(cli_env, "eval", "scenario")  # nothing ran: not a success
    assert result.returncode == 2 and "OPENAI_API_KEY is not set" in result.stderr


def test_eval_scenario_reports_each_step(env, tenant):
    result = arxivscout(env, "eval", "scenario", "--tenant", tenant)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASS ") == 5 and "all steps passed" in result.stdout
