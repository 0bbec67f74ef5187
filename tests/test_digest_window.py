"""A digest's window on arXiv (memory/digest.py) against the real Redis and a replayed arXiv: a
paper arXiv announces days after its submission (a Friday afternoon's is listed on Monday
evening; holidays and moderation hold papers longer) is shown once, in the first digest after it
is listed, and a paper an earlier digest was given is never shown again, posted or not; a window
with more papers than a query reads is asked again day by day, and the digest says it was cut.
The digests run as `arxivscout watch run` runs them (bot/watch_digest.py `run_by_hand`: a
terminal watch records each)."""

from __future__ import annotations

import re
import time

import pytest

from bot.watch_digest import DigestTasks
from memory.digest import DigestBuilder
from memory.ingest.arxiv_source import ArxivSource
from memory.keys import watch_seen_key
from memory.scope import Scope
from memory.stores.watches import DAY, WatchStore
from tests.support.arxiv_replay import ArxivReplay, AtomEntry

T0 = 1_767_600_000.0  # 2026-01-05 08:00 UTC, a Monday
TOPIC = "state space models"
ABSTRACT = "We study state space models for long sequences. Our layers scale linearly."


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def paper(number: int, submitted: float) -> AtomEntry:
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(submitted))
    return AtomEntry(f"2601.{number:05d}", f"State space models, part {number}", ABSTRACT,
                     ["Ada Lovelace"], stamp, ["cs.LG"])  # fmt: skip


def shown(text: str) -> list[str]:
    return re.findall(r"arXiv:(\d{4}\.\d{5})", text)


@pytest.fixture
async def world(memory, tenant):
    replay = ArxivReplay().start()
    store = WatchStore(memory.redis)
    clock = Clock(T0)

    def tasks(top_n: int, max_candidates: int = 500, day_share: int = 100) -> DigestTasks:
        builder = DigestBuilder(
            memory.knowledge_base, store, memory.embedder, ArxivSource(replay.api_url, 0.0),
            top_n=top_n, max_candidates=max_candidates, day_share=day_share,
        )  # fmt: skip
        return DigestTasks(store, builder, {}, clock)

    yield replay, store, clock, tasks
    for watch in await store.all(tenant):
        await store.remove(tenant, watch.id)
    replay.stop()


async def run(store: WatchStore, tasks: DigestTasks, tenant: str, watch_id: str) -> str:
    return await tasks.run_by_hand(await store.get(tenant, watch_id))


async def test_a_paper_listed_days_after_its_submission_is_shown_once(world, tenant):
    replay, store, clock, tasks = world
    digests = tasks(top_n=1)
    watch = await store.create(Scope(tenant), TOPIC, DAY, platform="terminal",
                               channel="terminal", now=T0 - 2 * DAY)  # fmt: skip
    clock.now = T0 - 2 * DAY  # a Saturday: Friday's listed papers, one shown and one not
    replay.add_feed([paper(1, clock.now - 2 * 3600), paper(2, clock.now - 3 * 3600)])
    first = shown(await run(store, digests, tenant, watch.id))
    assert len(first) == 1

    # Submitted Friday afternoon before the Saturday digest, listed only on Monday evening:
    # more than three days before the Monday digest's `since`.
    late = paper(3, T0 - 2 * DAY - 3.5 * DAY)
    replay.add_feed([late])
    clock.now = T0 + DAY
    second = await run(store, digests, tenant, watch.id)
    assert shown(second) == [late.arxiv_id], second
    assert "1 of 1 papers" in second  # the late one: not the two an earlier digest was given

    clock.now = T0 + 2 * DAY
    third = await run(store, digests, tenant, watch.id)
    assert shown(third) == [] and third.startswith("Nothing new"), third
    # all given before: said, so the numbers add up
    assert "(3 found: 0 already saved, 0 already shown, 3 in an earlier digest)" in third, third

    assert await store.redis.exists(watch_seen_key(tenant, watch.id))
    await store.remove(tenant, watch.id)  # its record of what it was given goes with it
    assert not await store.redis.exists(watch_seen_key(tenant, watch.id))


async def test_a_window_with_more_papers_than_a_query_reads_is_asked_day_by_day(world, tenant):
    replay, store, clock, tasks = world
    digests = tasks(top_n=10, max_candidates=3, day_share=2)
    watch = await store.create(Scope(tenant), TOPIC, DAY, platform="terminal",
                               channel="terminal", now=T0 - 2 * DAY)  # fmt: skip
    busy_day = [paper(20 + i, T0 - (2 + i) * 3600) for i in range(4)]
    day_before = paper(30, T0 - 30 * 3600)
    replay.add_feed([*busy_day, day_before])
    text = await run(store, digests, tenant, watch.id)
    ids = shown(text)
    assert day_before.arxiv_id in ids  # an older day is read, not only the newest papers
    assert busy_day[0].arxiv_id in ids and busy_day[3].arxiv_id not in ids
    assert "busy days were cut to their newest papers" in text, text

    quiet = await store.create(Scope(tenant), TOPIC, DAY, platform="terminal",
                               channel="terminal", now=T0 + 20 * DAY)  # fmt: skip
    clock.now = T0 + 20 * DAY
    replay.add_feed([paper(40, clock.now - 3600)])
    text = await run(store, tasks(top_n=10, max_candidates=3, day_share=2), tenant, quiet.id)
    assert shown(text) == ["2601.00040"] and "cut" not in text, text


@pytest.mark.parametrize("capped", [True, False])
def test_slack_and_discord_digests_say_when_the_window_was_cut(capped) -> None:
    """The cut is said where the team reads the digest, not only in the terminal's text."""
    from adapters.discord_watch import digest_message
    from adapters.slack_digest import digest_blocks
    from memory.digest import Digest, DigestItem
    from memory.ingest.arxiv_source import Candidate
    from memory.stores.watches import Watch

    watch = Watch("w1", "t1", TOPIC, DAY, "slack", "C1", since=T0 - DAY, next_due=int(T0))
    item = DigestItem(Candidate("2601.00001", "State space models, part 1"), 0.9, "Close.")
    digest = Digest(watch, T0 - DAY, T0, items=[item], found=600, capped=capped)
    slack = digest_blocks(digest)[0]["text"]["text"]
    discord = digest_message(digest)
    for text in (slack, discord):
        assert ("busy days were cut" in text) is capped


def searches(replay: ArxivReplay) -> int:
    return sum("search_query" in path for path in replay.api_paths())


async def test_a_broad_watch_asks_only_the_new_days_its_first_query_did_not_reach(world, tenant):
    """A full first query read every paper after its oldest one's day: only the new period's
    older days are asked again (never the lookback's), and the digest is said to be cut only
    when such a day was full."""
    replay, store, clock, tasks = world
    digests = tasks(top_n=10, max_candidates=6, day_share=2)
    weekly = await store.create(Scope(tenant), TOPIC, 7 * DAY, platform="terminal",
                                channel="terminal", now=T0)  # fmt: skip
    # its first digest covers the week before T0, from `since` = T0 - 7 days
    # three papers a day (at 03:00, 05:00, 07:00) over the week and the lookback's 14 days
    replay.add_feed([paper(100 + 3 * day + n, T0 - (day * DAY + (1 + 2 * n) * 3600))
                     for day in range(21) for n in range(3)])  # fmt: skip
    before = searches(replay)
    text = await run(store, digests, tenant, weekly.id)
    # the first query reached two days back: the week's other days alone are asked again
    assert searches(replay) - before == 1 + 7, searches(replay) - before
    assert "busy days were cut" in text, text  # each such day had more than its share

    clock.now = T0 + 29 * DAY
    quiet = await store.create(Scope(tenant), TOPIC, DAY, platform="terminal",
                               channel="terminal", now=clock.now)  # fmt: skip
    replay.add_feed([paper(199, clock.now - 3600)])
    await run(store, digests, tenant, quiet.id)  # its first digest: it has a `seen` set now
    clock.now = T0 + 30 * DAY
    # the day is read in full (two papers); the first query is full of the lookback's
    replay.add_feed([paper(200 + n, clock.now - (1 + n) * 3600) for n in range(2)])
    replay.add_feed([paper(210 + n, clock.now - (2 + n // 3) * DAY - n * 3600)
                     for n in range(12)])  # fmt: skip
    before = searches(replay)
    text = await run(store, digests, tenant, quiet.id)
    assert searches(replay) - before == 1
    assert "cut" not in text and "2601.00200" in shown(text), text


async def test_a_preview_of_a_chat_watch_records_nothing(world, tenant):
    """`watch run` of a Slack watch shows the digest but does not record what arXiv gave:
    its digest task still posts those papers."""
    replay, store, _, tasks = world
    digests = tasks(top_n=5)
    watch = await store.create(Scope(tenant), TOPIC, DAY, platform="slack", channel="C1",
                               now=T0 - DAY)  # fmt: skip
    replay.add_feed([paper(300, T0 - 3600)])
    text = await run(store, digests, tenant, watch.id)
    assert shown(text) == ["2601.00300"]
    assert not await store.redis.exists(watch_seen_key(tenant, watch.id))
    stored = await store.get(tenant, watch.id)
    assert stored.since == watch.since  # nor moved `since`
    digest = await digests.builder.build(stored, T0 + DAY)  # its digest task, a day later
    assert digest.arxiv_ids == ["2601.00300"]


async def test_a_first_digest_covers_its_period_and_an_older_watch_overlaps_three_days(
    world, tenant
):
    """The 14-day lookback drops what an earlier digest was given: until a watch has that
    record, its first digest covers the period alone, and an older watch's (made before the
    record came) reaches back three days, as it did then, not 14 (it would offer again papers
    listed before and not shown)."""
    replay, store, _, tasks = world
    digests = tasks(top_n=10)
    in_period, days_before, weeks_before = (
        paper(400, T0 - 3600), paper(401, T0 - 2.5 * DAY), paper(402, T0 - 10 * DAY),
    )  # fmt: skip
    replay.add_feed([in_period, days_before, weeks_before])
    new = await store.create(Scope(tenant), TOPIC, DAY, platform="terminal",
                             channel="terminal", now=T0)  # fmt: skip
    assert shown(await run(store, digests, tenant, new.id)) == [in_period.arxiv_id]

    older = await store.create(Scope(tenant), TOPIC, DAY, platform="terminal",
                               channel="terminal", now=T0 - 30 * DAY)  # fmt: skip
    await store.finish(older, "earlier", T0 - DAY, T0 - DAY)  # a digest before the upgrade
    text = await run(store, digests, tenant, older.id)
    assert sorted(shown(text)) == [in_period.arxiv_id, days_before.arxiv_id], text


async def test_since_shows_an_older_window_again_without_what_was_shown(world, tenant):
    """`watch run --since`: what an earlier digest was given but did not show is shown again;
    what it showed is not."""
    replay, store, clock, tasks = world
    digests = tasks(top_n=1)
    watch = await store.create(Scope(tenant), TOPIC, DAY, platform="terminal",
                               channel="terminal", now=T0)  # fmt: skip
    replay.add_feed([paper(500, T0 - 3600), paper(501, T0 - 2 * 3600)])
    [first] = shown(await run(store, digests, tenant, watch.id))
    clock.now = T0 + 600
    assert shown(await run(store, digests, tenant, watch.id)) == []  # given before: not new
    again = await digests.run_by_hand(await store.get(tenant, watch.id), T0 - DAY)
    assert shown(again) == sorted({"2601.00500", "2601.00501"} - {first}), again


async def test_a_long_window_is_asked_in_at_most_fifteen_slices(world, tenant):
    """A window longer than 15 days is cut into 15 slices: never a 16th, empty one (float
    subtraction used to leave a sliver of the window before `since`)."""
    replay, store, clock, tasks = world
    digests = tasks(top_n=10, max_candidates=3, day_share=2)
    clock.now = T0 + 3.4  # the watch's `since` 3.4 s after a whole second: a sliver was left
    watch = await store.create(Scope(tenant), TOPIC, 16 * DAY, platform="terminal",
                               channel="terminal", now=clock.now)  # fmt: skip
    # the first query's three papers reach back to Sunday: slices end at Monday 00:00
    replay.add_feed([paper(600 + n, T0 - hours * 3600) for n, hours in enumerate((1, 2, 21, 45))])
    before = searches(replay)
    await run(store, digests, tenant, watch.id)
    assert searches(replay) - before == 1 + 15, searches(replay) - before
