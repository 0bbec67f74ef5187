"""A workflow's edit form has a limit, as an entity's has, over real HTTP through the real
access middleware (signed link, session, CSRF) and the real Redis:

- its text field carries `maxlength` (`WORKFLOW_TEXT_LIMIT`), so a browser never sends a form
  over the 1 MB the server reads (a 413, and what was typed lost);
- a longer text (a client that ignores `maxlength`) comes back on the 422 page with why and the
  text as typed, the stored workflow unchanged; one character over the limit, in the characters
  that take the most bytes, is still a form the server reads whole;
- a workflow another path wrote longer (the bot, an import) opens whole, its field's
  `maxlength` its own length; saved unchanged, nothing stored changes (not its text, with its
  line breaks and trailing ones, nor its step count or vector); it may be shortened, never grown.
"""

from __future__ import annotations

import re
from urllib.parse import urlencode

from adapters.memory_page.pages import WORKFLOW_TEXT_LIMIT
from adapters.memory_page.server import FORM_BYTES
from memory.scope import Scope
from tests.test_memory_page import signed_in, world  # noqa: F401 (a fixture)
from tests.test_s31_memory_page_edit_limits import ADMIN, ASTRAL, form_of

SAVED = "The workflow was saved."


def field_attrs(page: str, item: str) -> str:
    """The attributes of the textarea that edits workflow `item`'s text."""
    found = re.findall(rf'name="id" value="{item}">\s*<textarea ([^>]*)>', page)
    assert len(found) == 1, f"no single field edits workflow {item}"
    return found[0]


def as_a_browser_sends(text: str) -> str:
    """A textarea's value as a form sends it: each line break CRLF."""
    return text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\r\n")


async def submit(client, page: str, item: str, text: str) -> tuple[int, str, int]:
    """Type `text` into the page's edit form of workflow `item` and save, as a browser would
    (redirects followed): the status, the page and the bytes the form took."""
    action, values = form_of(page, "text", item)
    body = urlencode({**values, "text": text})
    response = await client.post(
        action, data=body, headers={"Content-Type": "application/x-www-form-urlencoded"}
    )
    return response.status, await response.text(), len(body)


async def stored(memory, tenant: str, item: str) -> dict:
    """Everything the workflow's hash holds, its vector too."""
    return await memory.redis.hgetall(memory.workflows.key_of(tenant, item))


async def seeded_workflow(memory, tenant: str) -> str:
    flows = await memory.browse.workflows(tenant, None)
    return next(f.id for f in flows if "find MemGPT" in f.text)


async def long_workflow(memory, tenant: str) -> tuple[str, str]:
    """A workflow the bot wrote longer than the limit (a long question): its id and text. Its
    question has CRLF line breaks, its outcome a numbered line (not a step: its step count is 1)
    and a trailing line break, all of which a form would send otherwise."""
    scope = Scope(tenant, "t-long", channel="C1", user="U1")
    question = "\r\n".join(["q" * 1000] * (WORKFLOW_TEXT_LIMIT // 1000 + 5))
    key = await memory.workflows.add(
        scope, question, ["arxiv_search -> success"], "found it\n2. then saved it\n"
    )
    item = key.removeprefix(memory.workflows.key_prefix(tenant))
    text = (await memory.browse.workflow(tenant, item, None)).text
    assert len(text) > WORKFLOW_TEXT_LIMIT
    return item, text


async def test_the_workflow_field_carries_the_limit(memory, world):  # noqa: F811
    item = await seeded_workflow(memory, world.tenant)
    async with signed_in(memory, world.tenant, ADMIN) as client:
        page = await (await client.get("/memory/workflows")).text()
    assert f'maxlength="{WORKFLOW_TEXT_LIMIT}"' in field_attrs(page, item)


async def test_a_workflow_over_the_limit_keeps_what_was_typed(memory, world):  # noqa: F811
    item = await seeded_workflow(memory, world.tenant)
    before = await stored(memory, world.tenant, item)
    typed = ASTRAL * (WORKFLOW_TEXT_LIMIT + 1)  # 4 bytes in UTF-8, 12 percent-encoded
    async with signed_in(memory, world.tenant, ADMIN) as client:
        page = await (await client.get("/memory/workflows")).text()
        status, page, size = await submit(client, page, item, typed)
        assert size < FORM_BYTES  # the worst characters, one over the limit: read whole
        assert status == 422
        limit, length = f"{WORKFLOW_TEXT_LIMIT:,}", f"{len(typed):,}"
        assert f"at most {limit} characters; this one has {length}" in page
        assert form_of(page, "text", item)[1]["text"] == typed
        assert f'maxlength="{WORKFLOW_TEXT_LIMIT}"' in field_attrs(page, item)
        assert await stored(memory, world.tenant, item) == before
        # shortened on that page, its form saves
        shortened = typed[:WORKFLOW_TEXT_LIMIT]
        status, page, _ = await submit(client, page, item, shortened)
    assert status == 200 and SAVED in page
    assert (await memory.browse.workflow(world.tenant, item, None)).text == shortened


async def test_a_longer_stored_workflow_opens_whole_and_saves_unchanged(memory, world):  # noqa: F811
    item, text = await long_workflow(memory, world.tenant)
    before = await stored(memory, world.tenant, item)
    async with signed_in(memory, world.tenant, ADMIN) as client:
        page = await (await client.get("/memory/workflows")).text()
        as_held = text.replace("\r\n", "\n")  # a line break is one character in the field
        assert f'maxlength="{len(as_held)}"' in field_attrs(page, item)
        shown = form_of(page, "text", item)[1]["text"]
        assert shown == text  # not cut
        status, page, _ = await submit(client, page, item, as_a_browser_sends(shown))
    assert status == 200 and "The workflow is unchanged." in page
    assert await stored(memory, world.tenant, item) == before


async def test_a_longer_stored_workflow_may_shrink_not_grow(memory, world):  # noqa: F811
    item, text = await long_workflow(memory, world.tenant)
    before = await stored(memory, world.tenant, item)
    as_held = text.replace("\r\n", "\n")
    grown = as_held.strip() + " and more"
    async with signed_in(memory, world.tenant, ADMIN) as client:
        page = await (await client.get("/memory/workflows")).text()
        status, page, _ = await submit(client, page, item, grown)
        assert status == 422 and f"at most {len(as_held):,} characters" in page
        assert form_of(page, "text", item)[1]["text"] == grown
        assert await stored(memory, world.tenant, item) == before
        shortened = as_held[:-100].strip()  # still over the limit
        status, page, _ = await submit(client, page, item, as_a_browser_sends(shortened))
    assert status == 200 and SAVED in page
    assert (await memory.browse.workflow(world.tenant, item, None)).text == shortened
