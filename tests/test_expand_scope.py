"""Expanding a summary (the `expand_summary` tool, and `/expand` on every platform, which
share `Consolidator.expand_summary`), asked from another thread, shows only the covered
messages the asking place may see: a public summary may cover messages of a place since turned
private. In the summary's own thread, whoever asks can read every message already."""

from __future__ import annotations

from bot.consolidation import Consolidator
from memory.scope import Scope, Visibility
from memory.stores.summary import Summary
from tests.support.memory_seed import say

DAY = 1_700_000_000.0


async def test_expanding_a_summary_withholds_the_messages_the_place_may_not_see(memory, tenant):
    thread = f"slack:{tenant}:C8:100.1"
    public = Scope(tenant, thread, "C8", Visibility.PUBLIC, "U1", "Ada")
    private = Scope(tenant, thread, "C8", Visibility.PRIVATE, "U2", "Grace")  # turned private
    opener = await say(memory, public, "user", "What is new on sparse attention?", DAY)
    secret = await say(memory, private, "user", "Private plan: the SECRET-42 merger.", DAY + 1)
    summary = await memory.summaries.save(
        public, Summary(thread, "sparse attention", "Ada asked about sparse attention.",
                        [opener.id, secret.id]),
    )  # fmt: skip
    consolidator = Consolidator(memory, None)

    elsewhere = Scope(tenant, f"slack:{tenant}:C7:1.1", "C7", Visibility.PUBLIC, "U3", "Eve")
    seen_elsewhere = await consolidator.expand_summary(elsewhere, summary.id)
    assert "What is new on sparse attention?" in seen_elsewhere
    assert "SECRET-42" not in seen_elsewhere
    assert "Original messages (1) (1 more not shown here" in seen_elsewhere

    member_elsewhere = Scope(tenant, f"slack:{tenant}:C8:2.1", "C8", Visibility.PRIVATE, "U2")
    assert "SECRET-42" in await consolidator.expand_summary(member_elsewhere, summary.id)

    in_its_thread = await consolidator.expand_summary(public, summary.id)  # all of it is here
    assert "SECRET-42" in in_its_thread and "Original messages (2), oldest first" in in_its_thread
