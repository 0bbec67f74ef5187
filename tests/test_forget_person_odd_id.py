"""A person id no platform gives (a control character, or thousands of characters) is a person
nothing is remembered about: `NotFound` before any store is queried (a tag query cannot quote
a control character), one line at the terminal, the same answer on the memory page; a real
person's memory is untouched."""

from __future__ import annotations

import pytest

from memory.governance import NotFound
from memory.scope import Scope
from tests import test_memory_page
from tests.test_cli_memory import arxivscout
from tests.test_memory_page import page_client, post

CONTROL = ["\x01", "U1\x00"]  # redisvl's tag escaper leaves them: a query syntax error
ODD = [*CONTROL, "U1\n", "U" * 257]

world = test_memory_page.world  # its fixture: the memory page's people and threads


async def said(memory, tenant: str) -> Scope:
    scope = Scope(tenant, "t1", channel="C1", user="U1", user_name="alice")
    await memory.conversation.append(scope, "user", "Tell me about the quokka paper.")
    return scope


@pytest.mark.parametrize("user", CONTROL)
async def test_an_odd_person_id_is_nobody(memory, tenant, user):
    scope = await said(memory, tenant)
    with pytest.raises(NotFound):
        await memory.governance.forget_person(tenant, user)
    assert [m.content for m in await memory.conversation.all(scope)] == [
        "Tell me about the quokka paper."
    ]


async def test_the_cli_says_nothing_is_remembered_about_them(memory, tenant, capsys):
    await said(memory, tenant)
    for user in ODD:
        code, out, err = await arxivscout(
            capsys, "memory", "forget", "person", user, "--tenant", tenant, "--yes"
        )
        assert code == 2 and "No person" in err and err.count("\n") == 1 and "Forgot" not in out
    code, out, _ = await arxivscout(
        capsys, "memory", "forget", "person", "U1", "--tenant", tenant, "--yes"
    )
    assert code == 0 and "1 messages" in out  # a real id is still erased


async def test_the_memory_page_says_nothing_is_remembered_about_them(memory, world):
    async with page_client(memory, world.tenant) as client:
        form = {"csrf": "test-csrf", "user": "\x00", "confirm": "yes"}
        status, location, _, flash = await post(client, "/memory/people/forget", form, "admin")
    assert status == 303 and location == "/memory"
    assert flash.get("done", "").startswith("Nothing about")
