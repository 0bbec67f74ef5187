"""Topic watches' words and races: a period is read only as the topic's last phrase (Slack,
chat, before a closing full stop; a chat command's period only there) and never from Discord's
topic field; a topic arXiv cannot search is refused, one with accents is folded to ASCII; a watch removed or paused while its digest is built posts nothing;
a watch gone when its place refuses the digest is not made again as a paused husk, nor is its
seen set, and nobody is told; a Slack channel deleted is refused before arXiv is asked; the
Save button's answer that Slack's response_url refuses for good (4xx) is logged, not retried
(5xx and 429 raise: tests/test_watch_unsearchable_and_answers.py); the scheduler pages past
another platform's due watches.

Against the real Redis, the mock Slack Web API, the local Discord API and the replayed arXiv,
with the fixtures of the watch tests these extend."""

from __future__ import annotations

from dataclasses import replace

import pytest

from adapters.slack_watch import SlackWatches
from bot.watch_scheduler import WatchScheduler
from bot.watches import WatchPlace, chat_command, parse_watch
from memory.ingest.arxiv_source import submitted_query
from memory.keys import watch_key, watch_seen_key
from memory.stores.watches import DAY, InvalidWatch
from tests.test_discord_feedback import answered
from tests.test_watches import ON_TOPIC, T0, WEEK, entry, place, watch_world  # noqa: F401
from tests.test_watches_discord import api, env, watch_command  # noqa: F401 (fixtures)

# -- the words of a request ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "query", "period"),
    [
        ("3D reconstruction", "3D reconstruction", DAY),
        ("3D gaussian splatting weekly", "3D gaussian splatting", WEEK),
        ("weekly seasonality forecasting", "weekly seasonality forecasting", DAY),
        ("day trading week", "day trading week", DAY),
        ("state-space models weekly cat:cs.LG", "state-space models", WEEK),
        ("diffusion every 3 days", "diffusion", 3 * DAY),
        ("diffusion every 3d author:Gu", "diffusion", 3 * DAY),
        ("rainfall nowcasting every week", "rainfall nowcasting", WEEK),
        ("diffusion models weekly.", "diffusion models", WEEK),  # a sentence's full stop
        ("graph networks every 3 days!", "graph networks", 3 * DAY),
    ],
)
async def test_a_period_is_only_the_topics_last_phrase(text, query, period):
    request = parse_watch(text)
    assert (request.query, request.period) == (query, period)


def test_a_chat_watch_command_names_its_period_as_the_topics_last_phrase():
    # "weekly" leading the topic is part of it (a daily watch on "weekly diffusion models"):
    # such a message is no command, it goes to the agent
    assert chat_command("watch weekly diffusion models") is None
    assert chat_command("watch daily life of LLM agents") is None
    # the documented forms still are commands
    for text in ("watch state-space models weekly", "watch diffusion models weekly.",
                 "watch state-space models weekly cat:cs.LG", "watch diffusion author:Gu",
                 "watch for retrieval models every 3 days", "watch: weekly seasonality"):  # fmt: skip
        assert chat_command(text) is not None, text
    request = parse_watch(chat_command("watch: diffusion models weekly."))
    assert (request.query, request.period) == ("diffusion models", WEEK)


async def test_discord_watch_add_never_reads_a_period_in_its_topic(env):  # noqa: F811
    world, fake, adapter, api_ = env
    guild = fake.guild()
    channel, user = fake.text_channel(guild), fake.snowflake()
    adapter.client._connection.parse_interaction_create(watch_command(
        guild.id, channel.id, user, "add", topic="weekly seasonality forecasting",
        period="daily", author="Rob Hyndman",
    ))  # fmt: skip
    [made] = await answered(api_, 1)
    assert made["data"]["content"].startswith("Watching “weekly seasonality forecasting”"), made
    store = world.runtime.watches.store
    [watch] = await store.all(str(guild.id))
    try:
        assert (watch.query, watch.period) == ("weekly seasonality forecasting", DAY)
        assert watch.authors == ["Rob Hyndman"]
    finally:
        await store.remove(str(guild.id), watch.id)


async def test_a_topic_arxiv_cannot_search_is_refused_and_accents_are_folded(
    watch_world,  # noqa: F811
    tenant,
):
    assert submitted_query("Schrödinger bridges", T0 - DAY, T0).startswith(
        "(all:Schrodinger AND all:bridges) AND (submittedDate:"
    )
    service = watch_world.process()
    here = WatchPlace("slack", "C3")
    answer = await service.command(place(tenant, "C3"), "量子计算 weekly", here)
    assert answer.startswith("I cannot search arXiv for “量子计算”"), answer
    assert await service.store.all(tenant) == []
    with pytest.raises(InvalidWatch):
        await service.store.create(place(tenant), "—", DAY, platform="terminal", channel="t")
    made = await service.command(place(tenant, "C3"), "量子计算 cat:quant-ph", here)
    assert made.startswith("Watching “量子计算” cat:quant-ph, daily here"), made


# -- a watch removed or paused while its digest is built ----------------------------------------


class ChangedWhileBuilding(SlackWatches):
    """Asked for the place's walls just before arXiv is: the watch is removed or paused then,
    as a `/watch remove` or `/watch pause` while the digest's arXiv requests run would."""

    change = "remove"

    async def walled(self, watch):
        if ChangedWhileBuilding.change == "remove":
            await self.watches.store.remove(watch.tenant, watch.id)
        else:
            await self.watches.store.pause(replace(watch), "paused by U2")
        return await super().walled(watch)


@pytest.mark.parametrize("change", ["remove", "pause"])
async def test_a_watch_removed_or_paused_during_its_build_posts_nothing(
    watch_world,  # noqa: F811
    tenant,
    change,
):
    world = watch_world
    ChangedWhileBuilding.change = change
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    service = world.process(poster=ChangedWhileBuilding)
    watch = await service.create(
        place(tenant, "C4"), "state space models", WatchPlace("slack", "C4")
    )
    world.clock.now = T0 + 1
    due = await service.store.claim(watch, T0 + 1, "tok")
    payload = {"tenant": tenant, "watch": watch.id, "due": str(due), "until": T0 + 1,
               "next": watch.next_due, "token": "tok"}  # fmt: skip
    said = "gone" if change == "remove" else "paused"
    assert await service.digest(payload) == said
    assert world.digests("C4") == []
    record = await service.store.digest(tenant, watch.id, str(due))
    assert record.state == said and record.finished
    if change == "pause":
        stored = await service.store.get(tenant, watch.id)
        assert stored.paused == "paused by U2" and stored.since == watch.since  # not moved on
        assert await service.digest(payload) == "done"  # the task run again: nothing more


# -- a watch gone when its place refuses the digest ---------------------------------------------


class DeletedWhileAsked(SlackWatches):
    """The channel is deleted as the digest asks for its walls: its deletion removes the watch
    (bot/upkeep.py), and Slack then answers channel_not_found."""

    async def walled(self, watch):
        await self.watches.store.remove(watch.tenant, watch.id)
        return await super().walled(watch)


async def test_a_watch_removed_with_its_channel_is_not_paused_back_nor_its_creator_told(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    service = world.process(poster=DeletedWhileAsked)
    watch = await service.create(
        place(tenant, "C5"), "state space models", WatchPlace("slack", "C5")
    )
    due = await service.store.claim(watch, T0 + 1, "tok")
    payload = {"tenant": tenant, "watch": watch.id, "due": str(due), "until": T0 + 1,
               "next": watch.next_due, "token": "tok"}  # fmt: skip
    world.api.fail("conversations.info", "channel_not_found", times=3)
    assert await service.digest(payload) == "failed"
    assert not await world.memory.redis.exists(watch_key(tenant, watch.id))  # no paused husk
    assert [p for p in world.api.of("chat.postMessage") if p["channel"] == "DU1"] == []
    assert world.replay.api_paths() == []  # refused before arXiv was asked
    answer = await service.command(
        place(tenant, "C5"), f"resume {watch.id}", WatchPlace("slack", "C5")
    )
    assert answer.startswith(f"No watch `{watch.id}` posts here"), answer


async def test_a_husk_of_a_watch_is_no_watch_and_a_removed_watch_keeps_no_seen_set(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    service = world.process()
    here = WatchPlace("slack", "C6")
    watch = await service.create(place(tenant, "C6"), "state space models", here)
    await service.store.remove(tenant, watch.id)
    assert not await service.store.pause(watch, "refused")  # nothing written for it
    assert not await world.memory.redis.exists(watch_key(tenant, watch.id))
    await world.memory.redis.hset(watch_key(tenant, watch.id), "paused", "an older bot's husk")
    try:
        assert await service.store.get(tenant, watch.id) is None
        answer = await service.command(place(tenant, "C6"), f"resume {watch.id}", here)
        assert answer.startswith(f"No watch `{watch.id}` posts here"), answer
    finally:
        await world.memory.redis.delete(watch_key(tenant, watch.id))
    digest = await service.builder.build(watch, T0 + 1)  # a build that outlived its watch
    assert digest.found == 1
    assert not await world.memory.redis.exists(watch_seen_key(tenant, watch.id))


# -- Slack: a deleted channel, a refused answer -------------------------------------------------


async def test_a_deleted_slack_channel_is_refused_before_arxiv_is_asked(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    service = world.process()
    watch = await service.create(
        place(tenant, "C7"), "state space models", WatchPlace("slack", "C7")
    )
    due = await service.store.claim(watch, T0 + 1, "tok")
    payload = {"tenant": tenant, "watch": watch.id, "due": str(due), "until": T0 + 1,
               "next": watch.next_due, "token": "tok"}  # fmt: skip
    world.api.fail("conversations.info", "channel_not_found", times=3)
    assert await service.digest(payload) == "failed"
    assert world.replay.api_paths() == []  # no arXiv request for a place that is gone
    stored = await service.store.get(tenant, watch.id)
    assert stored.paused.endswith("channel_not_found")


async def test_a_save_answer_the_response_url_refuses_for_good_is_not_retried(
    watch_world,  # noqa: F811
):
    world = watch_world
    service = world.process()
    poster = service.posters["slack"]
    gone = world.api.response_url.replace("/respond/", "/no-such-hook/")  # answers 404
    await poster.answer({"response_url": gone}, "Saved “a paper”.")  # logged: a retry fails too
    await poster.answer({"response_url": world.api.response_url + "ok"}, "Saved “a paper”.")
    assert world.api.responses[-1]["text"] == "Saved “a paper”."


# -- the scheduler ------------------------------------------------------------------------------


async def test_the_scheduler_pages_past_another_platforms_due_watches(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    service = world.process()
    store = service.store
    discord = [
        await store.create(
            place(tenant, f"D{i}"),
            f"topic {i}",
            DAY,
            platform="discord",
            channel=f"D{i}",
            now=T0 - 10 * DAY - i,
        )
        for i in range(5)
    ]  # overdue longest: first in the due index
    slack = await store.create(place(tenant, "C9"), "state space models", DAY, platform="slack",
                               channel="C9", now=T0)  # fmt: skip
    scheduler = WatchScheduler(store, service.posters, service.stream, world.clock, page=2)
    world.clock.now = T0 + 1
    assert await scheduler.queue_due() == [(tenant, slack.id)]
    assert {w for _, w in await store.due(T0 + 1, limit=100)} >= {w.id for w in discord}
    await world.drain()
