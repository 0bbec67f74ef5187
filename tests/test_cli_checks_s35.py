"""What `eval locomo`, `memory thread` and `memory usage` refuse, and what they print, as a user
runs them (subprocesses against the test Redis)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from app.commands.eval_cmd import budget_tokens
from app.locomo import Outcome, Report
from app.settings import Settings
from bot.errors import ConfigError
from memory.context import MIN_MEMORY_TOKENS
from memory.scope import Scope


def arxivscout(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True,
        timeout=300, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture
def tiny_locomo(tmp_path):
    """One short conversation, and a question whose evidence is its first turn."""
    turns = [
        {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a dog named Rex yesterday."},
        {"speaker": "Bob", "dia_id": "D1:2", "text": "Nice! I started learning the cello."},
    ]
    sample = {
        "sample_id": "tiny",
        "conversation": {"speaker_a": "Ann", "speaker_b": "Bob",
                         "session_1_date_time": "1:56 pm on 8 May, 2023", "session_1": turns},
        "qa": [{"question": "What is Ann's dog called?", "answer": "Rex", "evidence": ["D1:1"],
                "category": 4}],
    }  # fmt: skip
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps([sample]))
    return path


def test_eval_locomo_json_prints_only_the_json(cli_env, tiny_locomo):
    """`--json | jq` works: nothing follows the report; without --json the text ends as before."""
    shown = arxivscout(cli_env, "eval", "locomo", "--data", str(tiny_locomo), "--json")
    assert shown.returncode == 0, shown.stderr
    report = json.loads(shown.stdout)  # the whole output, as jq reads it
    assert report["questions"] == 1 and report["budget"] == 2000
    text = arxivscout(cli_env, "eval", "locomo", "--data", str(tiny_locomo))
    assert text.returncode == 0, text.stderr
    assert text.stdout.strip().splitlines()[-1] == "recall 1.000 over 1 questions at 2000 tokens"


@pytest.mark.parametrize("budget", ["0", "-5", "50"])
def test_eval_locomo_refuses_a_budget_below_the_settings_minimum(cli_env, tiny_locomo, budget):
    """0 or less was a traceback, 50 a context larger than its budget: refused as
    ARXIVSCOUT_MEMORY_TOKENS would be, before anything runs."""
    shown = arxivscout(cli_env, "eval", "locomo", "--data", str(tiny_locomo), "--budget", budget)
    assert shown.returncode == 2 and shown.stdout == ""
    assert "Traceback" not in shown.stderr
    error = shown.stderr.strip().splitlines()[-1]  # after the usage, as argparse refuses
    assert shown.stderr.startswith("usage: arxivscout eval")
    assert error.startswith("arxivscout eval: error: argument --budget: ")
    assert f"{budget} is too small: at least" in error


def test_budget_and_memory_setting_share_one_minimum(monkeypatch):
    """`--budget` takes what ARXIVSCOUT_MEMORY_TOKENS takes, from one named constant (it was read
    from the setting's pydantic metadata at import, which a rewritten constraint would break)."""
    assert budget_tokens(str(MIN_MEMORY_TOKENS)) == MIN_MEMORY_TOKENS
    with pytest.raises(argparse.ArgumentTypeError, match="too small"):
        budget_tokens(str(MIN_MEMORY_TOKENS - 1))
    monkeypatch.setenv("ARXIVSCOUT_MEMORY_TOKENS", str(MIN_MEMORY_TOKENS))
    assert Settings.from_env().memory_tokens == MIN_MEMORY_TOKENS
    monkeypatch.setenv("ARXIVSCOUT_MEMORY_TOKENS", str(MIN_MEMORY_TOKENS - 1))
    with pytest.raises(ConfigError, match="ARXIVSCOUT_MEMORY_TOKENS"):
        Settings.from_env()


def test_p95_is_never_below_p50():
    """Nearest rank: of two questions the slower one, not the faster."""
    report = Report(2000)
    for ms in (1.0, 9.0):
        report.outcomes.append(Outcome("s", "q?", 4, ["D1:1"], ["D1:1"], 10, ms))
    data = report.to_json()
    assert data["assembly_ms_p50"] == 5.0 and data["assembly_ms_p95"] == 9.0


async def test_memory_thread_of_an_unknown_thread_says_so(cli_env, memory, tenant):
    """A misspelled id: said as `memory export --thread` says it, exit 2; a real one is shown."""
    await memory.conversation.append(Scope(tenant, "t1"), "user", "Tell me about quokkas.")
    shown = arxivscout(cli_env, "memory", "thread", "t2", "--tenant", tenant)
    assert shown.returncode == 2 and shown.stdout == ""
    assert shown.stderr.strip() == "arxivscout: error: No thread 't2' in this workspace's memory."
    exported = arxivscout(cli_env, "memory", "export", "--thread", "t2", "--tenant", tenant)
    assert exported.stderr == shown.stderr
    found = arxivscout(cli_env, "memory", "thread", "t1", "--tenant", tenant)
    assert found.returncode == 0 and "Tell me about quokkas." in found.stdout


async def zrevrange_calls(client) -> int:
    return int((await client.info("commandstats")).get("cmdstat_zrevrange", {}).get("calls", 0))


async def test_memory_thread_with_records_reads_no_thread_index(cli_env, memory, tenant, client):
    """A thread that shows something needs no existence check: the tenant's whole threads
    index (ZREVRANGE 0 -1) was read on every call."""
    await memory.conversation.append(Scope(tenant, "t1"), "user", "Tell me about quokkas.")
    before = await zrevrange_calls(client)
    found = arxivscout(cli_env, "memory", "thread", "t1", "--tenant", tenant)
    assert found.returncode == 0 and "Tell me about quokkas." in found.stdout
    assert await zrevrange_calls(client) == before


@pytest.mark.parametrize("top", ["0", "-1"])
def test_memory_usage_refuses_a_top_below_one(cli_env, tenant, top):
    """0 or less listed every thread (Redis reads a stop of -1 as the end): refused instead."""
    shown = arxivscout(cli_env, "memory", "usage", "--top", top, "--tenant", tenant)
    assert shown.returncode == 2 and shown.stdout == ""
    assert "argument --top" in shown.stderr and "Traceback" not in shown.stderr
