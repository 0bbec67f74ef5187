"""Topic watches and digests (bot/watches.py, memory/digest.py, memory/stores/watches.py) against
the real Redis, a replayed arXiv with new-paper feeds, the mock Slack Web API and a clock the
tests move: one digest per period however many processes check, none twice after a restart or
a crash between posting and recording, one catch-up digest after downtime, known and posted
papers dropped, the topic's papers first."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from adapters.slack_digest import SAVE_ACTION
from adapters.slack_watch import SlackWatches
from bot.watches import DigestBusy, WatchPlace, WatchService, parse_watch
from memory.governance import NotFound
from memory.ingest.arxiv_pace import SharedPace
from memory.ingest.arxiv_source import ArxivSource, submitted_query
from memory.keys import arxiv_slot_key, task_stream
from memory.scope import Scope, Visibility
from memory.stores.knowledge_base import Chunk, Paper
from memory.stores.watches import DAY, InvalidWatch, WatchStore
from memory.tasks import TaskStream
from memory.tokens import encoding_for
from tests.support.arxiv_replay import ArxivReplay, AtomEntry
from tests.support.pdfs import make_pdf
from tests.support.slack_api import MockSlackApi

T0 = 1_767_600_000.0  # 2026-01-05 08:00 UTC: the tests' clock starts here
WEEK = 7 * DAY

ON_TOPIC = [
    ("Selective state space models for long sequence modeling",
     "We propose a selective state space model that scales linearly with sequence length. "
     "Our structured state space layers match attention on language modeling."),
    ("Structured state space sequence models revisited",
     "State space models (SSMs) such as S4 and Mamba handle long-range dependencies. "
     "We analyse their recurrent and convolutional views."),
    ("Linear-time sequence modeling with state space layers",
     "This paper introduces a hardware-aware state space model for long context. "
     "The state space recurrence is computed with a parallel scan."),
    ("Hybrid attention and state space models for speech",
     "We combine attention with state space models for speech recognition. "
     "The state space blocks capture long audio sequences."),
]  # fmt: skip
OFF_TOPIC = [
    ("Protein structure prediction with equivariant diffusion",
     "We predict protein folds using an equivariant diffusion model trained on crystal "
     "structures."),
    ("Traffic forecasting with graph convolutions",
     "Road sensor networks are modeled as graphs to forecast traffic speed in cities."),
    ("A survey of reinforcement learning for robotic grasping",
     "We review reinforcement learning methods for robot grasping and manipulation."),
]  # fmt: skip


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def iso(seconds: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))


_serial = iter(range(10_000, 99_999))


def entry(title: str, abstract: str, submitted: float, cats=("cs.LG",)) -> AtomEntry:
    return AtomEntry(f"2601.{next(_serial):05d}", title, abstract, ["Ada Lovelace", "Alan Turing",
                     "Grace Hopper", "Edsger Dijkstra"], iso(submitted), list(cats))  # fmt: skip


class WatchWorld:
    """A replayed arXiv, a mock Slack, and bot processes' watch services sharing one Redis."""

    def __init__(self, memory, replay: ArxivReplay, api: MockSlackApi, clock: Clock) -> None:
        self.memory, self.replay, self.api, self.clock = memory, replay, api, clock
        self.prefix = f"digests-{uuid.uuid4().hex[:8]}"  # this test's streams
        self.services: list[WatchService] = []
        self.clients: list[AsyncWebClient] = []

    def process(self, top_n: int = 5, poster=None) -> WatchService:
        """One bot process's watches: its own consumer of the Slack digest stream."""
        service = WatchService(
            self.memory, ArxivSource(self.replay.api_url, 0.0), encoding_for("gpt-5-mini"),
            now=self.clock, top_n=top_n, stream_prefix=self.prefix, claim_idle_ms=300,
        )  # fmt: skip
        client = AsyncWebClient(token="xoxb-test", base_url=self.api.base_url)
        self.clients.append(client)
        service.attach(
            "slack", poster(service, client) if poster else SlackWatches(service, client)
        )
        self.services.append(service)
        return service

    async def drain(self) -> None:
        for _ in range(2):
            for service in self.services:
                if "slack" in service.workers:
                    await service.workers["slack"].drain()

    async def stop(self, service: WatchService) -> None:
        await service.close()
        self.services.remove(service)

    def digests(self, channel: str) -> list[list[str]]:
        """The arXiv ids each digest posted in `channel` showed, in posting order."""
        return [
            [b["accessory"]["value"] for b in _blocks(p) if b.get("accessory", {}).get("action_id") == SAVE_ACTION]
            for p in self.api.of("chat.postMessage")
            if p["channel"] == channel and "_ts" in p and p.get("blocks")  # a posted digest
        ]  # fmt: skip


def _blocks(params: dict) -> list[dict]:
    blocks = params.get("blocks") or []
    return json.loads(blocks) if isinstance(blocks, str) else blocks


@pytest.fixture
async def watch_world(memory, tenant):
    replay = ArxivReplay().start()
    api = MockSlackApi(team_id=tenant)  # the tenant's workspace: its people are told
    await api.start()
    world = WatchWorld(memory, replay, api, Clock(T0))
    yield world
    for service in list(world.services):
        await service.close()
    store = WatchStore(memory.redis)  # the global due index keeps no test's watches
    for watch in await store.all(tenant):
        await store.remove(tenant, watch.id)
    await TaskStream(memory.redis, task_stream(f"{world.prefix}-slack")).destroy()
    await api.close()
    replay.stop()


def place(tenant: str, channel: str = "C1", user: str = "U1") -> Scope:
    return Scope(tenant, channel=channel, user=user, visibility=Visibility.PUBLIC)


async def test_parse_watch_reads_topic_period_categories_and_authors():
    request = parse_watch('state-space models weekly cat:cs.LG author:"Albert Gu" author:Dao')
    assert request.query == "state-space models" and request.period == WEEK
    assert request.categories == ["cs.LG"] and request.authors == ["Albert Gu", "Dao"]
    assert parse_watch("diffusion every 3 days").period == 3 * DAY
    assert parse_watch("diffusion").period == DAY
    with pytest.raises(InvalidWatch):
        parse_watch("weekly")
    query = submitted_query("state-space models", T0 - DAY, T0, ["cs.LG"], ["Albert Gu"])
    assert query == (
        '(all:state AND all:space AND all:models) AND (cat:cs.LG) AND (au:"Albert Gu") AND '
        "(submittedDate:[202601040800 TO 202601050800])"
    )


async def test_two_processes_post_one_digest_per_period_and_a_restart_posts_none_again(
    watch_world, tenant
):
    world = watch_world
    first = [entry(t, a, T0 - (i + 1) * DAY) for i, (t, a) in enumerate(ON_TOPIC[:2])]
    first.append(entry(*OFF_TOPIC[0], T0 - 2 * DAY))
    second = [entry(*ON_TOPIC[2], T0 + 2 * DAY), entry(*OFF_TOPIC[1], T0 + 3 * DAY)]
    world.replay.add_feed(first + second)
    a, b = world.process(), world.process()
    watch = await a.create(place(tenant), "state space models weekly", WatchPlace("slack", "C1"))
    assert (watch.period, watch.next_due, watch.since) == (WEEK, int(T0), T0 - WEEK)

    world.clock.now = T0 + 10
    queued = await asyncio.gather(a.check(), b.check())
    assert sorted(len(q) for q in queued) == [0, 1]  # one process claimed the period
    await world.drain()
    posted = world.digests("C1")
    assert len(posted) == 1
    assert set(posted[0][:2]) == {e.arxiv_id for e in first[:2]}
    assert posted[0][-1] == first[2].arxiv_id  # off the topic: last

    world.clock.now = T0 + DAY  # the week is not over: nothing is due
    assert await a.check() == [] and await b.check() == []

    # both processes restart: new services on the same Redis find nothing to post again
    await world.stop(a)
    await world.stop(b)
    c, d = world.process(), world.process()
    assert await asyncio.gather(c.check(), d.check()) == [[], []]
    await world.drain()
    assert len(world.digests("C1")) == 1

    world.clock.now = T0 + WEEK + 10
    queued = await asyncio.gather(c.check(), d.check(), c.check())
    assert sum(len(q) for q in queued) == 1
    await world.drain()
    posted = world.digests("C1")
    assert len(posted) == 2
    assert posted[1] == [second[0].arxiv_id, second[1].arxiv_id]  # none of the first again
    stored = await c.store.get(tenant, watch.id)
    assert stored.since == T0 + WEEK + 10 and stored.next_due == int(T0) + 2 * WEEK


async def test_downtime_of_three_periods_is_caught_up_by_one_digest(watch_world, tenant):
    world = watch_world
    service = world.process(top_n=20)
    watch = await service.create(place(tenant), "state space models daily",
                                 WatchPlace("slack", "C2"))  # fmt: skip
    world.clock.now = T0 + 5
    await service.check()
    await world.drain()
    assert world.digests("C2") == []  # nothing was submitted before: no message at all
    assert (await service.store.get(tenant, watch.id)).since == T0 + 5

    missed = [entry(t, a, T0 + (i + 0.5) * DAY * 0.7) for i, (t, a) in enumerate(ON_TOPIC)]
    world.replay.add_feed(missed)
    world.clock.now = T0 + 3 * DAY + 600  # no process ran for three periods
    assert len(await service.check()) == 1
    assert await service.check() == []  # the missed periods are not posted one by one
    await world.drain()
    assert [sorted(ids) for ids in world.digests("C2")] == [sorted(e.arxiv_id for e in missed)]
    stored = await service.store.get(tenant, watch.id)
    assert stored.next_due == int(T0) + 4 * DAY  # the next period after now


async def test_papers_in_the_knowledge_base_or_already_posted_are_dropped(
    watch_world, tenant, memory
):
    world = watch_world
    papers = [entry(t, a, T0 - (i + 1) * 3600) for i, (t, a) in enumerate(ON_TOPIC)]
    world.replay.add_feed(papers)
    saved = papers[0]
    kb_paper = Paper(saved.arxiv_id, saved.title, saved.authors, "2026-01-05", ["cs.LG"],
                     saved.summary, source="arxiv")  # fmt: skip
    vector = await memory.embedder.embed([saved.summary])
    await memory.knowledge_base.add_paper(
        Scope(tenant), kb_paper, [Chunk(saved.summary, "Abstract", 0)], vector
    )
    service = world.process()
    watch = await service.create(place(tenant), "state space models", WatchPlace("slack", "C3"))
    await service.store.finish(watch, "earlier", T0 - WEEK, T0 - WEEK, "ts", [papers[1].arxiv_id])
    digest = await service.preview(await service.store.get(tenant, watch.id))
    shown = [item.paper.arxiv_id for item in digest.items]
    assert saved.arxiv_id not in shown and papers[1].arxiv_id not in shown
    assert sorted(shown) == sorted(p.arxiv_id for p in papers[2:])
    assert (digest.found, digest.known, digest.repeated) == (4, 1, 1)
    # why it matters to this team: always its closest saved paper, said as close as it is, the
    # topic's words it shares, and its key sentence
    for item in digest.items:
        assert item.near == saved.title
        assert f"your saved “{saved.title}”; on state, space, models: " in item.why, item.why
        assert "state space" in item.why.split(": ", 1)[1].lower()
    assert {item.why.split(" your saved")[0] for item in digest.items} <= {
        "Very close to",
        "Close to",
        "Loosely related to",
    }


async def test_the_topic_ranks_first_and_the_team_saved_papers_pull_theirs_up(
    watch_world, tenant, memory
):
    world = watch_world
    entries = [entry(t, a, T0 - (i + 1) * 600) for i, (t, a) in enumerate(OFF_TOPIC + ON_TOPIC)]
    world.replay.add_feed(entries)
    service = world.process(top_n=10)
    watch = await service.create(place(tenant), "state space models", WatchPlace("slack", "C4"))
    digest = await service.preview(watch)
    ranked = [item.paper.title for item in digest.items]
    assert set(ranked[: len(ON_TOPIC)]) == {t for t, _ in ON_TOPIC}
    scores = [item.score for item in digest.items]
    assert scores == sorted(scores, reverse=True)

    # a category-only watch ranks by the team's saved papers: a saved protein paper pulls the
    # protein paper up
    protein = Paper("2501.00001", "Equivariant diffusion for protein design", [], "2025-01-01",
                    ["q-bio"], "Protein structures generated by equivariant diffusion.")  # fmt: skip
    vector = await memory.embedder.embed([protein.abstract])
    await memory.knowledge_base.add_paper(
        Scope(tenant), protein, [Chunk(protein.abstract, "Abstract", 0)], vector
    )
    broad = await service.create(place(tenant), "cat:cs.LG", WatchPlace("slack", "C4"))
    digest = await service.preview(broad)
    assert digest.items[0].paper.title == OFF_TOPIC[0][0]


class CrashAfterPosting(SlackWatches):
    """Posts, then dies before the period is recorded (once)."""

    crashed = 0

    async def post(self, watch, digest, marker):
        ref = await super().post(watch, digest, marker)
        if not CrashAfterPosting.crashed:
            CrashAfterPosting.crashed += 1
            raise ConnectionError("killed between posting and recording")
        return ref


async def test_a_crash_between_posting_and_recording_does_not_post_twice(watch_world, tenant):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    service = world.process(poster=CrashAfterPosting)
    watch = await service.create(place(tenant), "state space models", WatchPlace("slack", "C5"))
    world.clock.now = T0 + 1
    assert len(await service.check()) == 1
    await world.drain()  # the task failed once, was claimed again and found its message
    assert CrashAfterPosting.crashed == 1
    assert len(world.digests("C5")) == 1
    assert len(world.api.of("conversations.history")) >= 1
    record = await service.store.digest(tenant, watch.id, str(int(T0)))
    assert record.state == "posted" and record.ref == world.api.of("chat.postMessage")[-1]["_ts"]
    posted = world.replay.feed[0].arxiv_id
    assert await service.store.posted(watch, [posted]) == {posted}


async def test_watch_list_and_remove_answer_only_for_the_place_a_watch_posts_to(
    watch_world, tenant
):
    service = watch_world.process()
    here, there = WatchPlace("slack", "C6"), WatchPlace("slack", "C9")
    made = await service.command(place(tenant, "C6"), "state space models weekly cat:cs.LG", here)
    watch_id = made.split("(id `")[1].split("`")[0]
    assert made.startswith("Watching “state space models” cat:cs.LG, weekly here")
    private = Scope(tenant, channel="G9", user="U2", visibility=Visibility.PRIVATE)
    secret = await service.command(private, "protein folding", WatchPlace("slack", "G9"))
    secret_id = secret.split("(id `")[1].split("`")[0]
    listed = await service.command(place(tenant, "C6"), "list", here)
    assert watch_id in listed and secret_id not in listed
    # the id is in every digest's footer: another channel (public too) cannot remove, pause
    # or resume it, nor can the terminal's chat
    elsewhere = place(tenant, "C9", user="U3")
    for verb in ("remove", "pause", "resume"):
        answer = await service.command(elsewhere, f"{verb} {watch_id}", there)
        assert answer == f"No watch `{watch_id}` posts here (`/watch list` shows their ids)."
    assert "No watch" in await service.command(elsewhere, f"remove {watch_id}", None)
    assert "No watch" in await service.command(place(tenant, "C6"), f"remove {secret_id}", here)
    assert len(await service.store.all(tenant)) == 2
    assert not (await service.store.get(tenant, watch_id)).paused
    # its own channel can
    paused = await service.command(place(tenant, "C6", "U2"), f"pause {watch_id}", here)
    assert paused.startswith("Paused “state space models”")
    assert "*paused* (paused by U2)" in await service.command(place(tenant, "C6"), "list", here)
    assert await service.store.due(T0 + WEEK * 10) == [(tenant, secret_id)]
    resumed = await service.command(place(tenant, "C6"), f"resume {watch_id}", here)
    assert resumed.startswith("Resumed") and (tenant, watch_id) in await service.store.due(T0)
    stopped = await service.command(place(tenant, "C6"), f"remove {watch_id}", here)
    assert stopped.startswith("Stopped watching")
    assert "No watches here" in await service.command(place(tenant, "C6"), "list", here)
    assert "What should I watch" in await service.command(place(tenant, "C6"), "daily", here)


async def test_only_an_explicit_watch_command_in_chat_makes_a_watch_once(watch_world, tenant):
    service = watch_world.process()
    thread = Scope(tenant, f"slack:{tenant}:C6:1700000000.000100", channel="C6", user="U1")
    for question in (
        "Watch out — is MemGPT better than RAG here?",
        "watch for new retrieval papers?",
        "watch out for data leakage weekly",
        "watch it weekly",
        "watch diffusion models",  # no period, no option, no colon: a sentence, not a command
        "what do you watch?",
        "watchful eyes on diffusion weekly",
    ):
        assert await service.message(thread, question, "job-0") is None, question
    assert await service.store.all(tenant) == []

    made = await service.message(thread, "watch state-space models weekly", "job-1")
    assert made.startswith("Watching “state-space models”, weekly here")
    again = await service.message(thread, "watch state-space models weekly", "job-1")
    assert again == made  # the job run again (a crash before delivery): the same watch
    colon = await service.message(thread, "Watch: diffusion for protein design", "job-2")
    assert colon.startswith("Watching “diffusion for protein design”, daily here")
    leading = await service.message(thread, "watch for retrieval models every 3 days", "job-3")
    assert leading.startswith("Watching “retrieval models”, every 3 days here")
    assert len(await service.store.all(tenant)) == 3

    # reserved words never make a watch; misused, they answer the usage
    for command in ("watch list all", "watch remove abc please", "watch delete",
                    "watch pause", "watch resume a b", "watch help"):  # fmt: skip
        answer = await service.message(thread, command, "job-4")
        assert answer is not None and "Usage: `/watch <topic>" in answer, command
    for command in ("list all", "remove abc please", "delete", "stop"):
        assert "Usage:" in await service.command(thread, command, WatchPlace("slack", "C6"))
    assert len(await service.store.all(tenant)) == 3
    listed = await service.message(thread, "watch list", "job-5")
    assert listed.count("• `") == 3


async def test_a_channel_the_bot_is_not_in_is_refused_and_a_refused_digest_pauses(
    watch_world, tenant
):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    world.api.not_joined.add("C8")
    service = world.process()
    refused = await service.command(
        place(tenant, "C8"), "state space models", WatchPlace("slack", "C8")
    )
    assert refused.startswith("I am not in <#C8>, so Slack") and "invite me first" in refused
    assert await service.store.all(tenant) == []

    world.api.not_joined.discard("C8")
    watch = await service.create(
        place(tenant, "C8"), "state space models", WatchPlace("slack", "C8")
    )
    due = await service.store.claim(watch, T0 + 1, "tok")
    payload = {"tenant": tenant, "watch": watch.id, "due": str(due), "until": T0 + 1,
               "next": watch.next_due, "token": "tok"}  # fmt: skip
    assert await service.store.lock(tenant, watch.id, str(due), "another-process")
    with pytest.raises(DigestBusy):
        await service.digest(payload)  # another process runs it: this task waits its turn
    assert not await service.store.renew(tenant, watch.id, str(due), "not-the-holder")
    await service.store.unlock(tenant, watch.id, str(due), "another-process")

    world.api.not_joined.add("C8")  # the bot was removed from the channel since
    assert await service.digest(payload) == "failed"  # Slack: not_in_channel
    assert await service.digest(payload) == "done"  # given up once, not tried every time
    stored = await service.store.get(tenant, watch.id)
    assert stored.since == watch.since  # its papers stay new for the next digest
    assert stored.paused.endswith("not_in_channel")
    [told] = [p for p in world.api.of("chat.postMessage") if p["channel"] == "DU1"]
    assert "I paused it" in told["text"] and f"/watch resume {watch.id}" in told["text"]
    listed = await service.command(place(tenant, "C8"), "list", WatchPlace("slack", "C8"))
    assert "*paused*" in listed and "not_in_channel" in listed
    world.clock.now = T0 + 3 * DAY  # paused: no period is claimed, nothing queued
    assert await service.check() == [] and await service.store.due(T0 + 9 * DAY) == []

    still = await service.command(
        place(tenant, "C8"), f"resume {watch.id}", WatchPlace("slack", "C8")
    )
    assert "invite me first" in still  # still not in the channel: stays paused
    world.api.not_joined.discard("C8")
    resumed = await service.command(
        place(tenant, "C8"), f"resume {watch.id}", WatchPlace("slack", "C8")
    )
    assert resumed.startswith("Resumed")
    assert await service.check() == [(tenant, watch.id)]
    await world.drain()
    assert world.digests("C8") == [[world.replay.feed[0].arxiv_id]]


async def test_only_a_process_posting_there_claims_and_an_overtaken_period_folds(
    watch_world, tenant
):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    discord_only = WatchService(  # a process with no Slack poster (a Discord bot, `ask`, …)
        world.memory, ArxivSource(world.replay.api_url, 0.0), encoding_for("gpt-5-mini"),
        now=world.clock, stream_prefix=world.prefix,
    )  # fmt: skip
    service = world.process()
    watch = await service.create(place(tenant), "state space models", WatchPlace("slack", "C10"))
    world.clock.now = T0 + 1
    assert await discord_only.check() == []
    assert (await service.store.get(tenant, watch.id)).next_due == int(T0)  # not claimed

    # a crash after queueing a digest, before claiming its period: the task claims it itself
    task = {"tenant": tenant, "watch": watch.id, "due": str(int(T0)), "next": int(T0) + DAY,
            "until": T0 + 1, "token": "queued-then-crashed"}  # fmt: skip
    assert await service.digest(task) == "posted"
    assert (await service.store.get(tenant, watch.id)).next_due == int(T0) + DAY
    assert await service.digest({**task, "token": "a-second-check"}) == "done"

    # Slack bots down for days: tasks of two periods queued; the older folds into the newer
    world.replay.add_feed([entry(*ON_TOPIC[1], T0 + 1.5 * DAY)])
    stored = await service.store.get(tenant, watch.id)
    older = await service.store.claim(stored, T0 + DAY + 5, "older")
    newer = await service.store.claim(stored, T0 + 3 * DAY + 5, "newer")
    assert (older, newer) == (int(T0) + DAY, int(T0) + 2 * DAY)
    late = {"tenant": tenant, "watch": watch.id, "until": T0 + 3 * DAY + 5}
    duplicate = {**late, "due": str(newer), "next": int(T0) + 4 * DAY, "token": "a-duplicate"}
    assert await service.digest(duplicate) == "other"  # its period is another task's
    assert await service.digest(
        {**late, "due": str(older), "next": int(T0) + 2 * DAY, "token": "older"}
    ) == "folded"  # fmt: skip
    assert await service.digest({**duplicate, "token": "newer"}) == "posted"
    assert world.digests("C10")[1] == [world.replay.feed[1].arxiv_id]  # one catch-up digest
    assert len(world.digests("C10")) == 2
    await discord_only.close()


class Noticed(SlackWatches):
    """Records what the place and the creator were told, and Save answers."""

    told: list[str] = []

    async def notice(self, watch, text):
        Noticed.told.append(text)
        await super().notice(watch, text)

    async def answer(self, reply, text):
        Noticed.told.append(text)


async def test_arxiv_failures_retry_later_with_backoff_and_the_place_is_told_once(
    watch_world, tenant
):
    world = watch_world
    Noticed.told = []
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    world.replay.down = True  # arXiv answers 503
    service = world.process(poster=Noticed)
    watch = await service.create(place(tenant), "state space models", WatchPlace("slack", "C11"))
    other = await service.create(place(tenant), "cat:cs.LG", WatchPlace("slack", "C12"))
    now = T0 + 1
    for failures, delay in ((1, 60), (2, 120), (3, 240), (4, 480)):
        world.clock.now = now
        assert sorted(await service.check()) == sorted([(tenant, watch.id), (tenant, other.id)])
        await world.drain()  # both digests of the batch ran (neither failed the other)
        stored = await service.store.get(tenant, watch.id)
        assert (stored.failures, stored.next_due) == (failures, int(now + delay))
        assert (await service.store.get(tenant, other.id)).failures == failures
        assert await service.check() == []  # not due before its retry
        now += delay
    notices = [p for p in world.api.of("chat.postMessage") if p["channel"] == "C11"]
    assert len(notices) == 1 and "arXiv has not answered" in notices[0]["text"]
    assert "I'll keep trying" in notices[0]["text"]
    world.replay.down = False
    world.clock.now = now
    assert len(await service.check()) == 2
    await world.drain()
    assert world.digests("C11") == [[world.replay.feed[0].arxiv_id]]
    stored = await service.store.get(tenant, watch.id)
    assert stored.failures == 0 and stored.next_due == watch.next_after(now)


async def test_each_save_is_answered_once_whatever_happens_to_it(watch_world, tenant):
    world = watch_world
    Noticed.told = []
    paper = entry(*ON_TOPIC[0], T0 - 3600)
    world.replay.add_feed([paper])
    world.replay.pdfs[paper.arxiv_id] = make_pdf(title=paper.title)
    service = world.process(poster=Noticed)
    broken = {"tenant": "not a tenant!", "arxiv_id": paper.arxiv_id, "platform": "slack",
              "reply": {"response_url": "https://example.invalid/1"}}  # fmt: skip
    good = {"tenant": tenant, "arxiv_id": paper.arxiv_id, "platform": "slack",
            "reply": {"response_url": "https://example.invalid/2"}}  # fmt: skip
    await service.run_saves([broken, good])  # the first fails; the batch does not
    assert (
        Noticed.told[0]
        == f"Could not save arXiv:{paper.arxiv_id} right now; press Save again in a minute."
    )
    assert Noticed.told[1].startswith(f"Saved “{paper.title}”")
    await service.run_saves([broken, good])  # the task run again: nobody is told twice
    assert len(Noticed.told) == 2


async def test_arxiv_pace_is_shared_by_processes(memory):
    first, second = SharedPace(memory.redis, 0.2), SharedPace(memory.redis, 0.2)
    await first()
    held = await memory.redis.get(arxiv_slot_key())
    assert held and await memory.redis.pttl(arxiv_slot_key()) > 0
    await second()  # waits for the first's slot to lapse, then holds its own
    assert await memory.redis.get(arxiv_slot_key()) not in (None, held)
    await memory.redis.delete(arxiv_slot_key())


async def test_a_digest_asks_arxiv_in_the_shared_slot(watch_world, tenant, memory):
    world = watch_world
    service = world.process()
    assert isinstance(service.arxiv.pace, SharedPace)  # every watch service's arXiv has one
    service.arxiv.pace = SharedPace(memory.redis, 30.0)  # with a long slot, to see it taken
    watch = await service.create(place(tenant), "state space models", WatchPlace("slack", "C14"))
    try:
        await service.preview(watch)
        assert await memory.redis.pttl(arxiv_slot_key()) > 0  # taken for this request
    finally:
        await memory.redis.delete(arxiv_slot_key())


async def test_forgetting_a_person_clears_the_watches_they_made(watch_world, tenant, memory):
    service = watch_world.process()
    watch = await service.create(place(tenant, user="U7"), "state space models",
                                 WatchPlace("slack", "C13"))  # fmt: skip
    assert watch.created_by == "U7"
    with contextlib.suppress(NotFound):
        await memory.governance.forget_person(tenant, "U7")
    stored = await service.store.get(tenant, watch.id)
    assert stored is not None and stored.created_by == ""
