"""`arxivscout memory import -` reads its export from stdin as a file is read: UTF-8 whatever
the locale's encoding (a byte that is not UTF-8 refused as a file's is), and lines end at "\\n"
only, so the line and paragraph separators (U+2028, U+2029) and NEL (U+0085) an export keeps
raw inside its JSON strings do not cut a record in two."""

from __future__ import annotations

import io
import uuid

import pytest

from memory.scope import Scope
from tests.test_cli_memory import arxivscout

SAID = "First line\u2028second line\u2029a new paragraph\x85and a NEL."


def stdin_of(text: bytes, locale_encoding: str = "utf-8") -> io.TextIOWrapper:
    """Standard input carrying `text`, as a process whose locale says `locale_encoding` has it."""
    return io.TextIOWrapper(io.BytesIO(text), encoding=locale_encoding)


@pytest.mark.parametrize("locale_encoding", ["utf-8", "latin-1"])
async def test_an_export_on_stdin_with_unicode_line_breaks_is_imported(
    memory, tenant, capsys, monkeypatch, locale_encoding
):
    scope = Scope(tenant, "t1", channel="terminal", user="U1", user_name="alice")
    await memory.conversation.append(scope, "user", SAID)
    code, exported, _ = await arxivscout(capsys, "memory", "export", "--tenant", tenant)
    assert code == 0 and "\u2028" in exported and "\x85" in exported  # kept raw in the file

    other = f"t-{uuid.uuid4().hex[:10]}"
    monkeypatch.setattr("sys.stdin", stdin_of(exported.encode("utf-8"), locale_encoding))
    try:
        code, out, err = await arxivscout(capsys, "memory", "import", "-", "--tenant", other)
        assert code == 0 and err == "" and f"Imported into tenant {other!r}" in out
        copied = await memory.conversation.all(Scope(other, "t1"))
        assert [m.content for m in copied] == [SAID]
    finally:
        await memory.drop_tenant(other)


async def test_stdin_that_is_not_utf8_is_refused_as_a_file_is(memory, capsys, monkeypatch):
    other = f"t-{uuid.uuid4().hex[:10]}"
    monkeypatch.setattr("sys.stdin", stdin_of(b'{"kind": "arxivscout-export\xff"}\n', "latin-1"))
    code, out, err = await arxivscout(capsys, "memory", "import", "-", "--tenant", other)
    assert code == 2 and out == ""
    assert err == "arxivscout: error: the file is not UTF-8 text; nothing was imported.\n"
    assert await memory.portability.is_empty(other)
