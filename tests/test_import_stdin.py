"""`arxivscout memory import -` reads its export from stdin as a file is read: lines end at
"\\n" only, so the line and paragraph separators (U+2028, U+2029) and NEL (U+0085) an export
keeps raw inside its JSON strings do not cut a record in two."""

from __future__ import annotations

import io
import uuid

from memory.scope import Scope
from tests.test_cli_memory import arxivscout

SAID = "First line\u2028second line\u2029a new paragraph\x85and a NEL."


async def test_an_export_on_stdin_with_unicode_line_breaks_is_imported(
    memory, tenant, capsys, monkeypatch
):
    scope = Scope(tenant, "t1", channel="terminal", user="U1", user_name="alice")
    await memory.conversation.append(scope, "user", SAID)
    code, exported, _ = await arxivscout(capsys, "memory", "export", "--tenant", tenant)
    assert code == 0 and "\u2028" in exported and "\x85" in exported  # kept raw in the file

    other = f"t-{uuid.uuid4().hex[:10]}"
    monkeypatch.setattr("sys.stdin", io.StringIO(exported))
    try:
        code, out, err = await arxivscout(capsys, "memory", "import", "-", "--tenant", other)
        assert code == 0 and err == "" and f"Imported into tenant {other!r}" in out
        copied = await memory.conversation.all(Scope(other, "t1"))
        assert [m.content for m in copied] == [SAID]
    finally:
        await memory.drop_tenant(other)
