"""`arxivscout memory forget|export|import|retention` in-process (`app.cli.main`, run in a thread
of its own: it starts its own event loop) against the test Redis; every refusal is one line."""

from __future__ import annotations

import asyncio
import io
import json
import uuid

import pytest

from app import cli
from memory.scope import Scope
from memory.stores.entity import Entity
from tests.test_memory_stores import add_memgpt


async def arxivscout(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = await asyncio.to_thread(cli.main, list(args))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


async def seeded(memory, tenant: str) -> Scope:
    scope = Scope(tenant, "t1", channel="terminal", user="U1", user_name="alice")
    await memory.conversation.append(scope, "user", "Tell me about the quokka paper.")
    await memory.conversation.append(scope, "assistant", "It studies marsupial memory.")
    await memory.entities.upsert(scope, [Entity("Quokka", "animal", "A small marsupial.")])
    await add_memgpt(memory, tenant)
    return scope


async def test_export_then_import_into_an_empty_tenant(memory, tenant, capsys, tmp_path):
    await seeded(memory, tenant)
    code, out, _ = await arxivscout(capsys, "memory", "export", "--tenant", tenant)
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and lines[0]["kind"] == "arxivscout-export" and lines[0]["tenant"] == tenant
    assert {"thread", "message", "paper", "chunk", "entity"} <= {r["kind"] for r in lines}

    path = tmp_path / "tenant.jsonl"
    code, _, err = await arxivscout(capsys, "memory", "export", "--tenant", tenant, "-o", str(path))
    assert lines[-1]["kind"] == "end"  # the closing line, not counted as a record
    assert code == 0 and f"Exported {len(lines) - 1} records" in err
    assert not (tmp_path / "tenant.jsonl.part").exists()
    other = f"t-{uuid.uuid4().hex[:10]}"
    code, out, _ = await arxivscout(capsys, "memory", "import", str(path), "--tenant", other)
    assert code == 0 and f"Imported into tenant {other!r}" in out and "2 messages" in out
    copied = await memory.conversation.all(Scope(other, "t1"))
    assert copied[0].content == "Tell me about the quokka paper."

    code, _, err = await arxivscout(capsys, "memory", "import", str(path), "--tenant", other)
    assert code == 2 and err.count("\n") == 1 and "already holds memory" in err

    code, out, _ = await arxivscout(
        capsys, "memory", "export", "--tenant", tenant, "--thread", "t1"
    )
    assert code == 0 and {json.loads(x)["kind"] for x in out.splitlines()} == {
        "arxivscout-export", "thread", "message", "end"
    }  # fmt: skip
    code, _, err = await arxivscout(
        capsys, "memory", "export", "--tenant", tenant, "--thread", "nope"
    )
    assert code == 2 and "No thread 'nope'" in err


async def test_a_malformed_file_is_one_line_and_imports_nothing(memory, tenant, capsys, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"kind": "arxivscout-export", "version": 1}\n{"kind": "message"\n')
    code, _, err = await arxivscout(capsys, "memory", "import", str(path), "--tenant", tenant)
    assert code == 2 and "Line 2 of the export: it is not JSON" in err
    assert await memory.portability.is_empty(tenant)
    code, _, err = await arxivscout(capsys, "memory", "import", str(tmp_path / "missing.jsonl"))
    assert code == 2 and "no such file" in err


async def test_forget_prints_what_went(memory, tenant, capsys):
    scope = await seeded(memory, tenant)
    _, out, _ = await arxivscout(capsys, "memory", "entities", "--tenant", tenant)
    assert "Quokka (animal): A small marsupial.  [id: quokka]" in out  # what to forget by
    code, out, _ = await arxivscout(
        capsys, "memory", "forget", "entity", "quokka", "--tenant", tenant, "--yes"
    )
    assert code == 0 and "Forgot the entity 'quokka'" in out and "1 entities" in out
    assert await memory.entities.all(scope) == []
    code, out, _ = await arxivscout(
        capsys, "memory", "forget", "paper", "2310.08560", "--tenant", tenant, "--json"
    )
    assert code == 0 and json.loads(out)["papers"] == 1 and json.loads(out)["chunks"] == 3
    message = (await memory.conversation.all(scope))[0]
    code, _, err = await arxivscout(capsys, "memory", "forget", "message", message.id,
                                    "--tenant", tenant)  # fmt: skip
    assert code == 2 and "needs its --thread" in err
    code, out, _ = await arxivscout(capsys, "memory", "forget", "message", message.id,
                                    "--thread", "t1", "--tenant", tenant)  # fmt: skip
    assert code == 0 and "1 messages" in out
    assert [m.content for m in await memory.conversation.all(scope)] == [
        "It studies marsupial memory."
    ]
    code, _, err = await arxivscout(
        capsys, "memory", "forget", "workflow", "nope", "--tenant", tenant, "--yes"
    )
    assert code == 2 and "No workflow 'nope'" in err
    code, out, _ = await arxivscout(capsys, "memory", "forget", "thread", "t1", "--tenant", tenant)
    assert code == 0 and "1 threads" in out
    assert await memory.conversation.threads(tenant) == []


class Terminal(io.StringIO):
    """Standard input that is a terminal, with the person's answers."""

    def isatty(self) -> bool:
        return True


async def test_forget_asks_at_a_terminal(memory, tenant, capsys, monkeypatch):
    scope = await seeded(memory, tenant)
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    code, out, _ = await arxivscout(
        capsys, "memory", "forget", "entity", "quokka", "--tenant", tenant
    )
    assert code == 1 and "Forget the entity 'quokka'" in out and "Nothing was forgotten" in out
    assert [e.name for e in await memory.entities.all(scope)] == ["Quokka"]
    monkeypatch.setattr("sys.stdin", Terminal("yes\n"))
    code, out, _ = await arxivscout(
        capsys, "memory", "forget", "entity", "quokka", "--tenant", tenant
    )
    assert code == 0 and await memory.entities.all(scope) == []


async def test_retention_shows_and_sets_the_period(memory, tenant, capsys):
    code, out, _ = await arxivscout(capsys, "memory", "retention", "--tenant", tenant)
    assert code == 0 and "kept for ever" in out and "the default" in out
    code, out, _ = await arxivscout(capsys, "memory", "retention", "--days", "30",
                                    "--tenant", tenant)  # fmt: skip
    assert code == 0 and "kept 30 days (its own setting)" in out
    assert await memory.retention.get(tenant) == 30
    await memory.retention.sweep(tenant)
    code, out, _ = await arxivscout(capsys, "memory", "retention", "--tenant", tenant)
    assert "kept 30 days" in out and "Last sweep:" in out and "removed nothing" in out
    code, out, _ = await arxivscout(capsys, "memory", "retention", "--off", "--tenant", tenant,
                                    "--json")  # fmt: skip
    assert json.loads(out)["days"] is None and json.loads(out)["own"] is True
    code, out, _ = await arxivscout(capsys, "memory", "retention", "--default", "--tenant", tenant)
    assert "kept for ever (the default" in out
    code, _, err = await arxivscout(capsys, "memory", "retention", "--days", "0",
                                    "--tenant", tenant)  # fmt: skip
    assert code == 2 and err.startswith("arxivscout: error: A retention period")


@pytest.mark.parametrize("flags", [["--days", "3", "--off"], ["--off", "--default"]])
def test_retention_flags_exclude_each_other(flags, capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["memory", "retention", *flags])
    assert stopped.value.code == 2 and "not allowed with" in capsys.readouterr().err
