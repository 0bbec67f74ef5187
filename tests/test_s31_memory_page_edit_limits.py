"""The memory page's edit forms and their limits, over real HTTP through the real access
middleware (signed link, session, CSRF) and the real Redis:

- an entity's description field carries `maxlength` equal to the store's own limit
  (`MAX_DESCRIPTION`), so a browser stops a longer text before sending it; a workflow's text, the
  limit that keeps its form under 1 MB (`WORKFLOW_TEXT_LIMIT`);
- a description the server still refuses (a client that ignores `maxlength`) answers with the
  refusal and the text as typed in the field, to shorten (it used to redirect to the list, which
  showed the old text: what was typed was lost); the stored entity is unchanged;
- a line break is one character, as `maxlength` counts it (a form sends CRLF); otherwise the
  page counts characters as the store does (a browser's `maxlength` counts UTF-16 units, never
  fewer, so it stops no less than the store refuses), and a text the store takes is not refused;
- a refused page's form is submitted as a browser would (its `action`, its hidden fields): it
  posts to the kind's list path (`/memory/entities/edit`, never "entitys"), and what was typed
  comes back escaped in the field, markup and all; an edit an entity's merges kept crossing
  (`EntityChanging`) is refused the same way, not a 500.
"""

from __future__ import annotations

import html
import itertools
import json
import re
from html.parser import HTMLParser

from adapters.memory_page.pages import WORKFLOW_TEXT_LIMIT
from memory.embeddings import CachedEmbedder
from memory.manager import MemoryManager
from memory.scope import Scope
from memory.stores.entity import MAX_DESCRIPTION, Entity
from tests.test_memory_page import signed_in, world  # noqa: F401 (a fixture)

ADMIN = "U9"  # the seeded workspace's admin (tests.test_memory_page.viewers)
ENTITY = "memgpt"  # the seeded public entity
OLD = "An LLM operating system."
DESCRIPTION_FIELD = re.compile(r"<textarea ([^>]*)>(.*?)</textarea>", re.S)
ASTRAL = "\N{MATHEMATICAL SCRIPT CAPITAL O}"  # outside the BMP: two UTF-16 code units


def fields(page: str) -> list[tuple[str, str]]:
    """Each textarea's attributes and its text, unescaped."""
    return [(attrs, html.unescape(text)) for attrs, text in DESCRIPTION_FIELD.findall(page)]


class Forms(HTMLParser):
    """A page's forms as a browser reads them: each one's action and its named inputs' and
    textareas' values (a textarea ends at the first `</textarea>`, escaped or not)."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.forms: list[tuple[str, dict[str, str]]] = []
        self._textarea: str | None = None
        self.feed(page)
        self.close()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        named = dict(attrs)
        if tag == "form":
            self.forms.append((named.get("action") or "", {}))
        elif tag in ("input", "textarea") and self.forms and named.get("name"):
            self.forms[-1][1][named["name"]] = named.get("value") or ""
            self._textarea = named["name"] if tag == "textarea" else None

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.forms[-1][1][self._textarea] += data


def form_of(page: str, field: str, item: str) -> tuple[str, dict[str, str]]:
    """The form on `page` that edits `field` of `item`: its action and its values."""
    found = [(a, f) for a, f in Forms(page).forms if field in f and f.get("id") == item]
    assert len(found) == 1, f"no single form edits the {field} of {item}"
    return found[0]


async def submit(client, page: str, description: str, item: str = ENTITY):
    """Type `description` into the page's edit form of `item` and save, as a browser would
    (redirects followed)."""
    action, values = form_of(page, "description", item)
    response = await client.post(action, data={**values, "description": description})
    return response.status, await response.text()


async def described(memory, tenant: str) -> str:
    return (await memory.browse.entity(tenant, ENTITY, None)).description


async def edit(client, description: str):
    """Save the entity's edit form of the entities page with `description` typed in."""
    return await submit(client, await (await client.get("/memory/entities")).text(), description)


async def test_the_edit_fields_carry_the_servers_limit(memory, world):  # noqa: F811
    async with signed_in(memory, world.tenant, ADMIN) as client:
        entities = await (await client.get("/memory/entities")).text()
        workflows = await (await client.get("/memory/workflows")).text()
    descriptions = [attrs for attrs, text in fields(entities) if 'name="description"' in attrs]
    assert descriptions and all(f'maxlength="{MAX_DESCRIPTION}"' in a for a in descriptions)
    texts = [attrs for attrs, _ in fields(workflows) if 'name="text"' in attrs]
    # within the form's 1 MB whatever the characters (adapters/memory_page/pages.py)
    assert texts and all(f'maxlength="{WORKFLOW_TEXT_LIMIT}"' in a for a in texts)


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
        # shortened on that page, its form saves and returns to the list
        status, page = await submit(client, page, typed[:MAX_DESCRIPTION])
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


async def test_characters_outside_the_bmp_count_once_as_the_store_counts_them(
    memory,
    world,  # noqa: F811
):
    typed = ASTRAL * (MAX_DESCRIPTION // 2 + 1)  # within the store's limit, over maxlength's
    async with signed_in(memory, world.tenant, ADMIN) as client:
        status, page = await edit(client, typed)
    assert status == 200 and "The entity was saved." in page
    assert await described(memory, world.tenant) == typed


async def test_typed_markup_comes_back_escaped_in_the_field(memory, world):  # noqa: F811
    markup = "</textarea><b>x</b>"
    typed = "x" * MAX_DESCRIPTION + markup
    async with signed_in(memory, world.tenant, ADMIN) as client:
        status, page = await edit(client, typed)
    assert status == 422
    assert markup not in page and html.escape(markup, quote=False) in page
    assert form_of(page, "description", ENTITY)[1]["description"] == typed  # as a browser reads it
    assert await described(memory, world.tenant) == OLD


async def test_a_forgotten_entity_returns_to_the_entities_list(memory, world):  # noqa: F811
    async with signed_in(memory, world.tenant, ADMIN) as client:
        page = await (await client.get(f"/memory/forget/confirm?kind=entity&id={ENTITY}")).text()
        action, values = next((a, f) for a, f in Forms(page).forms if a == "/memory/forget")
        response = await client.post(action, data=values, allow_redirects=False)
    assert response.status == 303 and response.headers["Location"] == "/memory/entities"


async def test_a_description_is_merged_by_its_characters(memory, world):  # noqa: F811
    """The store counts characters, as it always did: a description of 600 characters outside
    the BMP (1,200 UTF-16 units) keeps them whole when a short fact joins it, nor is it cut."""
    scope = Scope(world.tenant, "t1", channel="C1", user="U2")
    await memory.entities.upsert(scope, [Entity("Sigma", "system", ASTRAL * 600)])
    await memory.entities.upsert(scope, [Entity("Sigma", "system", "A search service.")])
    description = (await memory.entities.get(scope, "Sigma")).description
    assert description.startswith(ASTRAL * 600) and "A search service." in description


class Crossing:
    """The test's embedder, but each line it embeds comes with a change to the entity's pieces,
    as a background merge landing between the edit's read and its write: every round of its
    compare-and-set finds the entity changed."""

    def __init__(self, inner, redis, key: str) -> None:
        self.inner, self.redis, self.key = inner, redis, key
        self.model_name, self.dims = inner.model_name, inner.dims
        self.rounds = itertools.count()

    async def embed(self, texts: list[str]):
        piece = ["", f"{OLD} Merged meanwhile ({next(self.rounds)})."]
        await self.redis.hset(self.key, "pieces", json.dumps([piece]))
        return await self.inner.embed(texts)


async def test_an_edit_crossed_by_merges_keeps_what_was_typed(memory, world, local_embedder):  # noqa: F811
    key = memory.entities.key_of(world.tenant, ENTITY)
    crossing = Crossing(local_embedder, memory.redis, key)
    crossed = MemoryManager(memory.redis, CachedEmbedder(crossing, memory.redis))
    typed = "A memory-tiered LLM system."
    async with signed_in(crossed, world.tenant, ADMIN) as client:
        status, page = await edit(client, typed)
    assert status == 422 and "The entity kept changing while it was edited; try again." in page
    assert form_of(page, "description", ENTITY)[1]["description"] == typed
    assert await described(memory, world.tenant) == OLD


async def test_a_description_outside_the_bmp_can_be_sent_whole(memory, world):  # noqa: F811
    """A description the store holds within its limit in characters, but over it in UTF-16
    units (as a browser's `maxlength` counts), gets a field as long as it is, so an edit that
    keeps it can be sent (the server still counts characters: a longer text gets the 422 page
    with the text kept, tested above)."""
    scope = Scope(world.tenant, "t1", channel="C1", user="U2")
    await memory.entities.upsert(scope, [Entity("Sigma", "system", ASTRAL * 600)])
    async with signed_in(memory, world.tenant, ADMIN) as client:
        entities = await (await client.get("/memory/entities")).text()
    fields_of = [attrs for attrs, text in fields(entities) if 'name="description"' in attrs]
    assert any('maxlength="1200"' in a for a in fields_of)  # Sigma's: 600 characters, 1,200 units
    assert all('maxlength="1200"' in a or f'maxlength="{MAX_DESCRIPTION}"' in a for a in fields_of)
