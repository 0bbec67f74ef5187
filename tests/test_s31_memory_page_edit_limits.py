"""The memory page's edit forms and their limits, over real HTTP through the real access
middleware (signed link, session, CSRF) and the real Redis:

- an entity's description field carries `maxlength` equal to the store's own limit
  (`MAX_DESCRIPTION`), so a browser stops a longer text before sending it; a workflow's text has
  no limit but the form's 1 MB, so its field has none;
- a description the server still refuses (a client that ignores `maxlength`) answers with the
  refusal and the text as typed in the field, to shorten (it used to redirect to the list, which
  showed the old text: what was typed was lost); the stored entity is unchanged;
- the server counts as `maxlength` does: a line break is one character (a form sends CRLF), and
  a character outside the BMP (an emoji) two, as UTF-16 code units.
"""

from __future__ import annotations

import html
import re

from memory.stores.entity import MAX_DESCRIPTION
from tests.test_memory_page import signed_in, world  # noqa: F401 (a fixture)

ADMIN = "U9"  # the seeded workspace's admin (tests.test_memory_page.viewers)
ENTITY = "memgpt"  # the seeded public entity
OLD = "An LLM operating system."
DESCRIPTION_FIELD = re.compile(r"<textarea ([^>]*)>(.*?)</textarea>", re.S)


def fields(page: str) -> list[tuple[str, str]]:
    """Each textarea's attributes and its text, unescaped."""
    return [(attrs, html.unescape(text)) for attrs, text in DESCRIPTION_FIELD.findall(page)]


def csrf_of(page: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', page).group(1)


async def described(memory, tenant: str) -> str:
    return (await memory.browse.entity(tenant, ENTITY, None)).description


async def edit(client, description: str):
    """POST the entity's edit form as the entities page would (redirects followed)."""
    page = await (await client.get("/memory/entities")).text()
    form = {"csrf": csrf_of(page), "back": "/memory/entities", "id": ENTITY,
            "description": description}  # fmt: skip
    response = await client.post("/memory/entities/edit", data=form)
    return response.status, await response.text()


async def test_the_edit_fields_carry_the_servers_limit(memory, world):  # noqa: F811
    async with signed_in(memory, world.tenant, ADMIN) as client:
        entities = await (await client.get("/memory/entities")).text()
        workflows = await (await client.get("/memory/workflows")).text()
    descriptions = [attrs for attrs, text in fields(entities) if 'name="description"' in attrs]
    assert descriptions and all(f'maxlength="{MAX_DESCRIPTION}"' in a for a in descriptions)
    texts = [attrs for attrs, _ in fields(workflows) if 'name="text"' in attrs]
    assert texts and not any("maxlength" in a for a in texts)  # no limit but the form's 1 MB


async def test_a_refused_description_keeps_what_was_typed(memory, world):  # noqa: F811
    typed = "x" * MAX_DESCRIPTION + " and a tail the person typed"
    async with signed_in(memory, world.tenant, ADMIN) as client:
        status, page = await edit(client, typed)
        assert status == 422
        assert f"at most {MAX_DESCRIPTION:,} characters; this one has {len(typed):,}" in page
        kept = [(a, t) for a, t in fields(page) if 'name="description"' in a]
        assert kept == [(kept[0][0], typed)], "the typed text is not in the field"
        assert f'maxlength="{MAX_DESCRIPTION}"' in kept[0][0]
        assert await described(memory, world.tenant) == OLD
        # shortened on that page, it saves and returns to the list
        status, page = await edit(client, typed[:MAX_DESCRIPTION])
        assert status == 200 and "The entity was saved." in page
        assert await described(memory, world.tenant) == "x" * MAX_DESCRIPTION


async def test_a_line_break_counts_once_as_maxlength_counts_it(memory, world):  # noqa: F811
    line = "y" * 99 + "\n"  # 100 characters in the browser, 101 as the form sends it (CRLF)
    text = (line * (MAX_DESCRIPTION // len(line)))[:-1] + "z"
    assert len(text) == MAX_DESCRIPTION
    async with signed_in(memory, world.tenant, ADMIN) as client:
        status, page = await edit(client, text.replace("\n", "\r\n"))
    assert status == 200 and "The entity was saved." in page
    assert await described(memory, world.tenant) == text


async def test_an_emoji_counts_twice_as_maxlength_counts_it(memory, world):  # noqa: F811
    typed = "\N{GRINNING FACE}" * (MAX_DESCRIPTION // 2 + 1)  # UTF-16: two code units each
    async with signed_in(memory, world.tenant, ADMIN) as client:
        status, page = await edit(client, typed)
    assert status == 422
    assert f"this one has {2 * len(typed):,}" in page
    assert [t for a, t in fields(page) if 'name="description"' in a] == [typed]
    assert await described(memory, world.tenant) == OLD
