"""A Save button's answer that the platform did not take is posted when the task runs again,
once, and says what happened the first time (bot/watch_saves.py)."""

from __future__ import annotations

from bot.watch_saves import answer_marker
from memory.keys import watch_answer_pending_key
from tests.support.pdfs import make_pdf
from tests.test_watches import ON_TOPIC, T0, entry, watch_world  # noqa: F401 (a fixture)


async def test_a_save_answer_slack_refused_is_posted_on_the_next_run(watch_world, tenant):  # noqa: F811
    world = watch_world
    paper = entry(*ON_TOPIC[0], T0 - 3600)
    world.replay.add_feed([paper])
    world.replay.pdfs[paper.arxiv_id] = make_pdf(title=paper.title)
    service = world.process()  # the real Slack poster, over the mock Slack
    world.api.fail("chat.postEphemeral", "fatal_error")  # Slack fails the first answer
    reply = {"channel": "C1", "user": "U1"}
    await service.queue_save("slack", tenant, paper.arxiv_id, "U1", reply)
    await world.drain()  # the task failed, and ran again
    tried = [p["text"] for p in world.api.of("chat.postEphemeral")]
    assert len(tried) == 2, tried  # refused, then taken
    assert all(text.startswith(f"Saved “{paper.title}”") for text in tried), tried
    payload = {"tenant": tenant, "arxiv_id": paper.arxiv_id, "user": "U1", "reply": reply,
               "platform": "slack"}  # fmt: skip
    await service.run_saves([payload])  # delivered once more: said once only
    assert len(world.api.of("chat.postEphemeral")) == 2
    kept = watch_answer_pending_key(answer_marker(payload))
    assert not await service.memory.redis.exists(kept)  # said: its kept text goes


async def test_an_answer_refused_on_every_delivery_is_given_up_not_dead_lettered(
    watch_world,  # noqa: F811
    tenant,
):
    world = watch_world
    paper = entry(*ON_TOPIC[0], T0 - 3600)
    world.replay.add_feed([paper])
    world.replay.pdfs[paper.arxiv_id] = make_pdf(title=paper.title)
    service = world.process()
    world.api.fail("chat.postEphemeral", "channel_not_found", times=100)  # refused for good
    await service.queue_save("slack", tenant, paper.arxiv_id, "U1", {"channel": "C9", "user": "U1"})
    for _ in range(10):  # each delivery waits for the claim time to pass
        await world.drain()
        if len(world.api.of("chat.postEphemeral")) >= 5:
            break
    tried = [p["text"] for p in world.api.of("chat.postEphemeral")]
    assert len(tried) == 5, tried  # one post per delivery: saved once, said as it was
    assert all(text.startswith(f"Saved “{paper.title}”") for text in tried), tried
    stream = service.stream("slack")
    assert await stream.pending_count() == 0  # the last delivery gave it up, acknowledged
    assert await service.memory.redis.xlen(stream.dead_stream) == 0
    payload = {"tenant": tenant, "arxiv_id": paper.arxiv_id, "user": "U1",
               "reply": {"channel": "C9", "user": "U1"}, "platform": "slack"}  # fmt: skip
    assert not await service.memory.redis.exists(watch_answer_pending_key(answer_marker(payload)))
