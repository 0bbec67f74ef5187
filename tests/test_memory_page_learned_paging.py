"""The memory page's entities and workflows pages over real HTTP and a real Redis, for a busy
workspace: more of them than one FT.SEARCH used to read (500). They are listed 50 a page, as the
thread list is (`?page=`), under their real count, so an admin reaches the oldest to edit or
forget it; a member's pages still hold only what they may see."""

from __future__ import annotations

import re

import pytest

from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.entity import Entity
from tests.test_memory_page import get, page_client, slack_scope
from tests.test_memory_page import post as post_form

MANY = 530  # public ones: more than the 500 the pages used to read
SECRETS = 4  # Bob's, in his DM: the newest of all
DAY = 1_700_000_000.0
PER_PAGE = 50  # as the thread list


def public_scope(tenant: str) -> Scope:
    return slack_scope(tenant, "C1", "100.1", "U1", "Alice", Visibility.PUBLIC)


def bob_dm_scope(tenant: str) -> Scope:
    return slack_scope(tenant, "D2", "300.1", "U2", "Bob", Visibility.DM)


async def dated(memory, store, tenant: str, field: str, ids_in_age_order: list[str]) -> None:
    """Give the records distinct times, the first the oldest (stored at once, they share one)."""
    pipe = memory.redis.pipeline(transaction=False)
    for i, record_id in enumerate(ids_in_age_order):
        pipe.hset(store.key_of(tenant, record_id), field, DAY + i)
    await pipe.execute()


@pytest.fixture
async def entities(memory, tenant):
    """MANY public entities "Item 000" (the oldest) to "Item 529", then Bob's secret ones."""
    public = [Entity(f"Item {i:03d}", "system", f"Thing number {i:03d}.") for i in range(MANY)]
    secret = [Entity(f"Pelican {i}", "project", "Bob's budget line.") for i in range(SECRETS)]
    await memory.entities.upsert(public_scope(tenant), public)
    await memory.entities.upsert(bob_dm_scope(tenant), secret)
    listed = {e.name: e.id for e in await memory.browse.entities(tenant, None, limit=1000)}
    order = [listed[e.name] for e in public] + [listed[e.name] for e in secret]
    await dated(memory, memory.entities, tenant, "updated_at", order)
    yield listed
    await memory.drop_tenant(tenant)


def names_on(html: str) -> list[str]:
    return re.findall(r'<span class="speaker">([^<]+)</span>', html)


async def test_entities_are_paged_under_their_real_count(memory, tenant, entities):
    last = -(-(MANY + SECRETS) // PER_PAGE)
    async with page_client(memory, tenant) as client:
        status, html = await get(client, "/memory/entities", "admin")
        assert status == 200
        assert f'Entities <span class="muted">({MANY + SECRETS})</span>' in html
        assert names_on(html)[:SECRETS] == [f"Pelican {i}" for i in reversed(range(SECRETS))]
        assert len(names_on(html)) == PER_PAGE and f"page 1 of {last}" in html
        assert 'href="/memory/entities?page=2"' in html

        status, html = await get(client, f"/memory/entities?page={last}", "admin")
        assert status == 200 and f"page {last} of {last}" in html
        assert names_on(html)[-1] == "Item 000"  # the oldest, out of reach before
        assert f'href="/memory/entities?page={last - 1}"' in html
        assert 'action="/memory/entities/edit"' in html  # editable there
        assert (await get(client, "/memory/entities?page=999", "admin"))[1].count("Item 000") >= 1
        assert "page 1 of" in (await get(client, "/memory/entities?page=x", "admin"))[1]

        # Alice (public and her own DM) sees every public one, across the pages, none of Bob's
        seen: list[str] = []
        for number in range(1, last + 1):
            status, html = await get(client, f"/memory/entities?page={number}")
            assert status == 200 and "Pelican" not in html and "pelican" not in html
            seen += names_on(html)
        assert f'Entities <span class="muted">({MANY})</span>' in html
        assert seen == [f"Item {i:03d}" for i in reversed(range(MANY))]

        # the admin forgets the oldest from its page, and is sent back to that page
        back = f"/memory/entities?page={last}"
        oldest = entities["Item 000"]
        status, location, _, flash = await post_form(
            client, "/memory/forget",
            {"csrf": "test-csrf", "kind": "entity", "id": oldest, "back": back}, "admin",
        )  # fmt: skip
        assert status == 303 and location == back and "1 entity" in flash["done"]
        _, html = await get(client, back, "admin")
        assert "Item 000" not in html and f"({MANY + SECRETS - 1})" in html


async def test_browse_lists_a_page_of_entities_and_counts_them_all(memory, tenant, entities):
    listing = await memory.browse.entity_listing(tenant, {PUBLIC, "dm:D1"}, 10, 520)
    assert [e.name for e in listing.items] == [f"Item {i:03d}" for i in reversed(range(10))]
    assert listing.total == MANY
    counted = await memory.browse.entity_listing(tenant, None, 0)
    assert counted.items == [] and counted.total == MANY + SECRETS
    nobody = await memory.browse.entity_listing(tenant, set(), 10)
    assert nobody.items == [] and nobody.total == 0


async def test_workflows_are_paged_under_their_real_count(memory, tenant):
    store = memory.workflows
    vector = (await store.embedder.embed(["a workflow"]))[0]
    scope, dm = public_scope(tenant), bob_dm_scope(tenant)
    keys = [
        await store.add(scope, f"question {i:03d}", ["step -> success"], "ok", vector)
        for i in range(MANY)
    ]
    keys.append(await store.add(dm, "plan pelican", ["step -> success"], "ok", vector))
    *ids, secret = [key.removeprefix(store.key_prefix(tenant)) for key in keys]
    await dated(memory, memory.workflows, tenant, "created_at", [*ids, secret])
    last = -(-MANY // PER_PAGE)
    try:
        async with page_client(memory, tenant) as client:
            _, html = await get(client, "/memory/workflows", "admin")
            assert f'Workflows <span class="muted">({MANY + 1})</span>' in html
            assert "plan pelican" in html and "page 1 of" in html
            _, html = await get(client, f"/memory/workflows?page={last}")
            assert f'Workflows <span class="muted">({MANY})</span>' in html
            assert f"page {last} of {last}" in html and "plan pelican" not in html
            assert f'id="w{ids[0]}"' in html  # the oldest, out of reach before
            _, html = await get(client, f"/memory/workflows?page={last}", "admin")
            assert f'id="w{ids[0]}"' in html and f'name="id" value="{ids[0]}"' in html
    finally:
        await memory.drop_tenant(tenant)
