"""The memory page says an import's refusals in its own words: an admin there imports into their
own workspace only, so the command line's advice (another tenant, `arxivscout memory forget
tenant`) is not what it shows; the command line keeps its own text."""

from __future__ import annotations

import time
import uuid

from adapters.memory_page.transfer import said_here
from memory.keys import import_partial_key
from memory.portability import ImportInterrupted, Left, TenantNotEmpty, dumps
from memory.scope import Scope
from tests.test_memory_page import aiohttp_file_form, page_client, post, world  # noqa: F401

CLI_ONLY = ("--tenant", "another tenant", "arxivscout memory forget")


def page_only(text: str) -> bool:
    return not any(advice in text for advice in CLI_ONLY)


async def test_an_import_into_a_workspace_with_memory_says_to_forget_it_on_the_page(
    memory,
    world,  # noqa: F811
):
    async with page_client(memory, world.tenant) as client:
        response = await client.get("/memory/export", headers={"X-Test-Viewer": "admin"})
        exported = await response.read()
        status, location, _, flash = await post(
            client, "/memory/import", aiohttp_file_form(exported), "admin"
        )
    error = flash["error"]
    assert status == 303 and location == "/memory"
    assert "This workspace's memory is not empty" in error and "on these pages" in error
    assert "Nothing was imported" in error and page_only(error)


async def test_a_crashed_import_used_since_is_said_in_the_pages_words(memory, tenant):
    await memory.conversation.append(Scope(tenant, "t1"), "user", "An exported question.")
    exported = "".join([dumps(r) + "\n" async for r in memory.portability.export_tenant(tenant)])
    into = f"t-{uuid.uuid4().hex[:10]}"
    try:
        await memory.conversation.append(Scope(into, "t1"), "user", "Said after the crash.")
        await memory.redis.set(import_partial_key(into), repr(time.time() - 3600))
        async with page_client(memory, into) as client:
            status, _, _, flash = await post(
                client, "/memory/import", aiohttp_file_form(exported.encode()), "admin"
            )
        error = flash["error"]
        assert status == 303 and "part of an import that stopped on " in error
        assert "forget what it holds first" in error and page_only(error)
    finally:
        await memory.drop_tenant(into)
        await memory.drop_tenant(tenant)


def test_a_failed_import_kept_because_used_says_to_forget_on_the_page():
    failed = ImportInterrupted("T1", Left.USED, OSError("I/O error"))
    said = said_here(failed)
    assert "OSError: I/O error" in said and "was used while it ran" in said
    assert "forget what it holds first" in said and page_only(said)
    assert not page_only(str(failed))  # the command line keeps its own advice
    assert not page_only(str(TenantNotEmpty("T1")))
    for left in (Left.CLEARED, Left.PARTIAL, Left.UNKNOWN):  # nothing CLI-only: said as it is
        other = ImportInterrupted("T1", left, OSError("I/O error"))
        assert said_here(other) == str(other)
