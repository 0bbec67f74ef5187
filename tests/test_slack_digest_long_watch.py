"""A Slack digest of a watch with a long topic or many authors is posted: its head (the topic)
and its footer (the watch's description) are cut to fit Slack's 3,000 characters of a block's
text, which the local Slack refuses past (`invalid_blocks`), as Slack does."""

from __future__ import annotations

import json
from dataclasses import replace

from adapters.slack_watch import BUTTONS_UNSHOWN, METADATA_EVENT
from bot.watches import WatchPlace
from memory.stores.watches import WatchStore
from tests.support.slack_api import SECTION_TEXT_LIMIT
from tests.test_watches import ON_TOPIC, T0, entry, place, watch_world  # noqa: F401

AUTHORS = ["Ada Lovelace", *(f"Firstname{i} Lastname{i}" for i in range(149))]


async def _digest_of(world, watch) -> str:
    """The watch's due digest, as the scheduler's task runs it: what happened."""
    due = await world.process().store.claim(watch, T0 + 1, "tok")
    payload = {"tenant": watch.tenant, "watch": watch.id, "due": str(due), "until": T0 + 1,
               "next": watch.next_due, "token": "tok"}  # fmt: skip
    return await world.services[-1].digest(payload)


def _posted_blocks(world, channel: str) -> list[dict]:
    [posted] = [p for p in world.api.of("chat.postMessage") if p["channel"] == channel]
    blocks = posted["blocks"]
    return json.loads(blocks) if isinstance(blocks, str) else blocks


def _texts(blocks: list[dict]) -> list[str]:
    return [
        b["text"]["text"] if b["type"] == "section" else b["elements"][0]["text"] for b in blocks
    ]


async def test_a_digest_of_a_watch_of_150_authors_is_posted_its_head_and_footer_cut(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])  # by Ada Lovelace
    service = world.process()
    authors = " ".join(f'author:"{name}"' for name in AUTHORS)
    watch = await service.create(
        place(tenant, "C5"), f"{authors} weekly", WatchPlace("slack", "C5")
    )
    assert len(watch.authors) == 150

    assert await _digest_of(world, watch) == "posted"
    blocks = _posted_blocks(world, "C5")
    head, *papers, foot = _texts(blocks)
    assert all(len(text) <= SECTION_TEXT_LIMIT for text in _texts(blocks))
    assert (
        head.startswith("*New on “Ada Lovelace, Firstname0 Lastname0, ") and "…”*: 1 of 1" in head
    )
    assert len(papers) == 1 and ON_TOPIC[0][0] in papers[0]
    assert foot.startswith(f"Watch `{watch.id}`: new papers author:Ada Lovelace ")
    assert foot.endswith(f"…. `/watch remove {watch.id}` stops it.")


async def test_a_digest_of_an_imported_watch_of_a_5000_character_topic_is_posted(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[1], T0 - 3600)])
    service = world.process()
    made = await service.create(
        place(tenant, "C6"), "state space models", WatchPlace("slack", "C6")
    )
    topic = " ".join(["selective structured state space sequence models"] * 110)[:5000]
    assert len(topic) == 5000  # an import keeps a topic `/watch add` would cut to 300
    watch = await WatchStore(world.memory.redis).restore(replace(made, query=topic), {}, T0 - 1)

    assert await _digest_of(world, watch) == "posted"
    blocks = _posted_blocks(world, "C6")
    head, *papers, foot = _texts(blocks)
    assert all(len(text) <= SECTION_TEXT_LIMIT for text in _texts(blocks))
    assert head.startswith("*New on “selective structured state space") and "…”*: 1 of 1" in head
    assert len(papers) == 1 and ON_TOPIC[1][0] in papers[0]
    assert foot.startswith(f"Watch `{watch.id}`: “selective structured state space")
    assert foot.endswith(f"…. `/watch remove {watch.id}` stops it.")


def _posted_text(world, channel: str) -> str:
    [posted] = [p for p in world.api.of("chat.postMessage") if p["channel"] == channel]
    return posted["text"]


async def test_a_paper_of_a_topic_of_hundreds_of_shared_words_keeps_its_key_sentence(
    watch_world,  # noqa: F811
    tenant,
):
    """`why` names the first WHY_WORDS shared words and how many more (an imported topic of
    550 distinct words the paper shares listed them all: 5,000 characters, its block cut mid-
    word with its key sentence lost); a title of many `&` is cut before it is escaped."""
    world = watch_world
    title = "R&D " * 400 + "selective state space"
    abstract = "We propose a selective state space model that scales linearly with length."
    world.replay.add_feed([entry(title, abstract, T0 - 3600)])
    service = world.process()
    made = await service.create(
        place(tenant, "C7"), "state space models", WatchPlace("slack", "C7")
    )
    topic = " ".join(f"state{i:04d}" for i in range(550))  # each shares "state" with the paper
    watch = await WatchStore(world.memory.redis).restore(replace(made, query=topic), {}, T0 - 1)

    assert await _digest_of(world, watch) == "posted"
    _, paper, _ = _texts(_posted_blocks(world, "C7"))
    assert len(paper) <= SECTION_TEXT_LIMIT
    assert "; on state0000, state0001, " in paper and ", state0007 and 542 more: " in paper
    assert paper.endswith(abstract), paper[-200:]
    assert "|R&amp;D R&amp;D " in paper and "…>*" in paper  # the title cut, escaped whole
    assert all(piece.startswith(("amp;", "lt;", "gt;")) for piece in paper.split("&")[1:])
    text = _posted_text(world, "C7")  # the notification names the topic as the head does
    assert text.startswith("New papers on “state0000 state0001 ") and "…”: R&D R&D" in text


async def test_the_notification_of_a_categories_only_watch_names_its_categories(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[2], T0 - 3600)])
    service = world.process()
    watch = await service.create(place(tenant, "C8"), "cat:cs.LG", WatchPlace("slack", "C8"))

    assert await _digest_of(world, watch) == "posted"
    assert _posted_text(world, "C8") == f"New papers on “cs.LG”: {ON_TOPIC[2][0]}"


async def test_a_digest_whose_blocks_slack_refuses_is_posted_once_more_as_plain_text(
    watch_world,  # noqa: F811
    tenant,
    caplog,
):
    """A refused shape (our bug) would be refused every period: its titles are posted
    instead, with the digest's metadata (a re-run finds it), saying the buttons are missing."""
    world = watch_world
    world.replay.add_feed([entry(*ON_TOPIC[0], T0 - 3600)])
    service = world.process()
    watch = await service.create(
        place(tenant, "C9"), "state space models", WatchPlace("slack", "C9")
    )
    world.api.fail("chat.postMessage", "invalid_blocks")

    assert await _digest_of(world, watch) == "posted"
    refused, plain = [p for p in world.api.of("chat.postMessage") if p["channel"] == "C9"]
    assert refused.get("blocks") and not plain.get("blocks")
    assert plain["text"] == (
        f"New papers on “state space models”: {ON_TOPIC[0][0]} {BUTTONS_UNSHOWN}"
    )
    metadata = plain["metadata"]
    metadata = json.loads(metadata) if isinstance(metadata, str) else metadata
    assert metadata["event_type"] == METADATA_EVENT
    assert any(
        r.levelname == "ERROR" and "invalid_blocks" in r.getMessage() for r in caplog.records
    )
