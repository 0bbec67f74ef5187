"""Watch topics arXiv cannot search, restored or saved before they were refused; the Save
answer's response_url refusals; Discord's category field naming several categories; letters
NFKD does not fold and possessives; the scheduler's pages per tick.

- A watch whose topic has no word arXiv can search and no category nor author asks arXiv for
  every paper of a period: `create` refuses it, and one restored from an export, or saved
  before that, is paused with the reason (its digest never asks arXiv, its creator is told);
  `/watch resume` refuses it and `/watch list` says to make it again.
- A response_url that refuses the answer for good (4xx: expired, used up) is not retried: the
  Save task would post nothing through every delivery; 5xx and 429 are retried.

Against the real Redis, the mock Slack Web API, the local Discord API and the replayed arXiv,
with the fixtures of the watch tests these extend."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from bot.watch_scheduler import WatchScheduler
from bot.watches import WatchPlace
from memory.ingest.arxiv_source import query_words, submitted_query
from memory.ingest.errors import IngestError
from memory.keys import watch_key
from memory.stores.watches import DAY, Watch
from tests.test_discord_feedback import answered
from tests.test_watches import ON_TOPIC, T0, entry, place, watch_world  # noqa: F401
from tests.test_watches_discord import api, env, watch_command  # noqa: F401 (fixtures)

# -- a topic arXiv cannot search ---------------------------------------------------------------


async def test_a_restored_watch_arxiv_cannot_search_is_kept_paused_with_the_reason(
    watch_world,  # noqa: F811
    tenant,
):
    store = watch_world.process().store
    made = dict(tenant=tenant, period=DAY, platform="slack", channel="C1",
                created_at=T0 - 3 * DAY, since=T0 - DAY, next_due=int(T0 + DAY))  # fmt: skip
    await store.restore(Watch(id="unsearch", query="量子计算", **made), {}, T0)
    await store.restore(
        Watch(id="bycat", query="量子计算", categories=["quant-ph"], **made), {}, T0
    )
    stored = await store.get(tenant, "unsearch")
    assert stored.paused.startswith("I cannot search arXiv for “量子计算”"), stored.paused
    assert (await store.get(tenant, "bycat")).paused == ""  # a category: searchable
    due = {w for _, w in await store.due(T0 + 10 * DAY, limit=1000)}
    assert "unsearch" not in due and "bycat" in due


async def test_a_saved_watch_arxiv_cannot_search_is_paused_before_arxiv_is_asked(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    service = world.process()
    watch = await service.create(
        place(tenant, "C2"), "量子计算 cat:quant-ph", WatchPlace("slack", "C2")
    )
    # saved before such topics were refused: its topic alone
    await world.memory.redis.hset(watch_key(tenant, watch.id), "categories", "[]")
    saved = await service.store.get(tenant, watch.id)
    with pytest.raises(IngestError, match="I cannot search arXiv"):  # `watch run` by hand
        await service.run_by_hand(saved)
    due = await service.store.claim(saved, T0 + 1, "tok")
    payload = {"tenant": tenant, "watch": watch.id, "due": str(due), "until": T0 + 1,
               "next": saved.next_due, "token": "tok"}  # fmt: skip
    assert await service.digest(payload) == "failed"
    assert world.replay.api_paths() == []  # arXiv never asked for every paper of the period
    assert world.digests("C2") == []
    stored = await service.store.get(tenant, watch.id)
    assert stored.paused.startswith("I cannot search arXiv for “量子计算”"), stored.paused
    [told] = [p for p in world.api.of("chat.postMessage") if p["channel"] == "DU1"]
    assert "I cannot search arXiv" in told["text"], told["text"]
    assert f"/watch remove {watch.id}" in told["text"]


async def test_a_watch_paused_for_a_topic_arxiv_cannot_search_is_not_resumed(
    watch_world,  # noqa: F811
    tenant,
):
    service = watch_world.process()
    made = dict(tenant=tenant, period=DAY, platform="slack", channel="C1",
                created_at=T0 - 3 * DAY, since=T0 - DAY, next_due=int(T0 + DAY))  # fmt: skip
    await service.store.restore(Watch(id="unsearch", query="量子计算", **made), {}, T0)
    here = WatchPlace("slack", "C1")
    listed = await service.command(place(tenant, "C1"), "list", here)
    assert "`/watch remove unsearch`" in listed and "/watch resume" not in listed, listed
    answer = await service.command(place(tenant, "C1"), "resume unsearch", here)
    assert answer.startswith("I cannot search arXiv for “量子计算”"), answer
    assert "make it again in English words" in answer and "Resumed" not in answer
    assert (await service.store.get(tenant, "unsearch")).paused  # still paused, never due
    assert await service.store.due(T0 + 10 * DAY, limit=1000) == []


# -- the Save answer's response_url ------------------------------------------------------------


@pytest.fixture
async def hooks() -> AsyncIterator[str]:
    """A response_url host answering /<status> with that status (Slack's hooks behind a proxy
    that fails, or rate limits)."""

    async def answer(request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["status"]), text="no")

    app = web.Application()
    app.router.add_post("/{status}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/"
    await runner.cleanup()


async def test_a_save_answer_is_retried_only_when_the_response_url_may_take_it_later(
    watch_world,  # noqa: F811
    hooks,
):
    poster = watch_world.process().posters["slack"]
    for status in (500, 503, 429):
        with pytest.raises(RuntimeError, match=str(status)):
            await poster.answer({"response_url": hooks + str(status)}, "Saved “a paper”.")
    for status in (404, 410, 400):  # expired or used up: every retry would be refused too
        await poster.answer({"response_url": hooks + str(status)}, "Saved “a paper”.")


# -- Discord's category field ------------------------------------------------------------------


@pytest.mark.parametrize("category", ["cs.LG cs.AI", "cs.LG, cs.AI", " cs.LG,cs.AI "])
async def test_discord_watch_add_reads_each_category_of_its_field(env, category):  # noqa: F811
    world, fake, adapter, api_ = env
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.snowflake()
    adapter.client._connection.parse_interaction_create(watch_command(
        guild.id, channel.id, user, "add", topic="mixture of experts", category=category,
        author="Noam Shazeer",
    ))  # fmt: skip
    [made] = await answered(api_, 1)
    assert made["data"]["content"].startswith("Watching “mixture of experts”"), made
    store = world.runtime.watches.store
    [watch] = await store.all(str(guild.id))
    try:
        assert watch.categories == ["cs.LG", "cs.AI"] and watch.authors == ["Noam Shazeer"]
        query = submitted_query(watch.query, T0 - DAY, T0, watch.categories, watch.authors)
        assert '(cat:cs.LG OR cat:cs.AI) AND (au:"Noam Shazeer")' in query, query
    finally:
        await store.remove(str(guild.id), watch.id)


# -- letters NFKD does not fold ----------------------------------------------------------------


def test_letters_nfkd_cannot_decompose_are_folded_and_others_end_a_word():
    assert query_words("Bjørn Łojasiewicz Straße") == ["Bjorn", "Lojasiewicz", "Strasse"]
    assert query_words("Ærø œuvre þorn đuro ıdeal") == ["AEro", "oeuvre", "thorn", "duro", "ideal"]
    assert query_words("量子computing理论") == ["computing"]
    assert query_words("graph量子networks") == ["graph", "networks"]  # not "graphnetworks"
    assert query_words("Guðmundsson ÐOR ħbar Ħ Heŋ ŊA") == [
        "Gudmundsson", "DOR", "hbar", "H", "Heng", "NGA"
    ]  # fmt: skip
    # a possessive's "'s" is no word of its own: no stray `all:s`
    assert query_words("Schrödinger’s bridges") == ["Schrodinger", "bridges"]
    assert query_words("Kolmogorov's law") == ["Kolmogorov", "law"]
    assert submitted_query("Schrödinger Łojasiewicz", T0 - DAY, T0).startswith(
        "(all:Schrodinger AND all:Lojasiewicz) AND (submittedDate:"
    )


# -- the scheduler's pages per tick ------------------------------------------------------------


async def test_the_scheduler_reads_at_most_its_pages_per_tick(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    service = world.process()
    store = service.store
    for i in range(4):  # overdue longest: first in the due index, left for Discord's processes
        await store.create(place(tenant, f"D{i}"), f"topic {i}", DAY, platform="discord",
                           channel=f"D{i}", now=T0 - 10 * DAY - i)  # fmt: skip
    slack = await store.create(place(tenant, "C9"), "state space models", DAY, platform="slack",
                               channel="C9", now=T0)  # fmt: skip
    world.clock.now = T0 + 1

    def scheduler(max_pages: int) -> WatchScheduler:
        return WatchScheduler(store, service.posters, service.stream, world.clock, page=2,
                              max_pages=max_pages)  # fmt: skip

    assert await scheduler(2).queue_due() == []  # four Discord watches fill its two pages
    assert await scheduler(3).queue_due() == [(tenant, slack.id)]
    await world.drain()
