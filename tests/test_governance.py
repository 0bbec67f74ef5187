"""Forgetting and correcting memory (memory/governance.py), against the real Redis and MiniLM:
each kind of forget, a person's erasure across every store, retention, edits; and that what is
forgotten is gone from the next context, from search, from summaries and from the cache, while
every message stays in the recent window or under a summary."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict

import pytest

from bot.background import BackgroundWork
from bot.consolidation import MAX_TOP_SUMMARIES, Consolidator
from bot.harness import ENTITY_INSTRUCTIONS
from bot.upkeep import Upkeep, episode_of
from memory.context import ContextLimits, assemble_context
from memory.governance import Erasure, NotFound
from memory.governance_purge import Purge
from memory.governance_sweeps import Sweeps
from memory.governance_threads import ThreadEraser
from memory.keys import (
    erasing_key,
    joined_key,
    messages_key,
    papers_key,
    summarized_count_key,
    task_stream,
    threads_key,
)
from memory.scope import Scope, Visibility
from memory.stores.conversation import MarkConflict, Message
from memory.stores.entity import Entity
from memory.stores.summary import Summary, SummaryConflict
from memory.stores.tool_log import ToolLogEntry
from memory.tasks import TaskStream
from tests.agent_world import close_world, open_world
from tests.support.scripted_openai import call, text, tool_calls
from tests.test_memory_stores import add_memgpt


def word() -> str:
    """A word no other test writes: what a read must not find once it is forgotten."""
    return f"quux{uuid.uuid4().hex[:8]}"


def upkeep_of(memory) -> Upkeep:
    stream = TaskStream(memory.redis, task_stream(f"gov-{uuid.uuid4().hex[:6]}"))
    return Upkeep(memory, Consolidator(memory, None), BackgroundWork(stream))


def task_of(scope: Scope, messages: list[Message]) -> dict:
    """An indexing task as `Upkeep.after_messages` queues it."""
    return {"scope": scope.to_dict(), "messages": [asdict(m) for m in messages]}


async def say(memory, scope: Scope, texts: list[str], index: bool = True) -> list[Message]:
    """Messages of `scope.user` and the assistant in turn, indexed for episodic recall."""
    said = []
    for i, said_text in enumerate(texts):
        said.append(
            await memory.conversation.append(
                scope, "user" if i % 2 == 0 else "assistant", said_text
            )
        )
    if index:
        await upkeep_of(memory).index_episodes([task_of(scope, said)])
    return said


async def found(memory, scope: Scope, query: str) -> list[str]:
    """What episodic search finds for `query` from `scope`, as texts."""
    vector = (await memory.embedder.embed([query]))[0]
    return [e.text for e in await memory.episodes.search(scope, query, vector, k=20)]


async def context_text(memory, scope: Scope, question: str) -> str:
    """The memory the next turn would be given (without the question itself)."""
    return (await assemble_context(memory, scope, question, ContextLimits())).memory_text()


async def leaves(memory, tenant: str, summary: Summary) -> list[str]:
    if not summary.children:
        assert summary.level == 0
        return list(summary.message_ids)
    ids: list[str] = []
    kids = await memory.summaries.get_many(tenant, summary.children)
    for child_id in summary.children:
        child = kids[child_id]
        assert child.parent == summary.id and child.level < summary.level
        ids += await leaves(memory, tenant, child)
    return ids


async def check_invariant(memory, scope: Scope) -> None:
    """Every message, tombstones included, is unsummarized or under exactly one top-level
    summary; the summarized ones are a prefix, covered in order; the counter agrees."""
    messages = await memory.conversation.all(scope, forgotten=True)
    ids = [m.id for m in messages]
    window = await memory.conversation.unsummarized(scope)
    k = next((i for i, m in enumerate(messages) if not m.summary_id), len(messages))
    assert not any(m.summary_id for m in messages[k:])
    assert [m.id for m in window] == [m.id for m in messages[k:] if not m.forgotten]
    tops = await memory.summaries.for_thread(scope)
    covered: list[str] = []
    for top in tops:
        assert top.parent == ""
        assert await leaves(memory, scope.tenant, top) == top.message_ids
        covered += top.message_ids
    assert covered == ids[:k]
    for m in messages[:k]:
        assert m.id in (await memory.summaries.get(scope, m.summary_id)).message_ids
    count = await memory.redis.get(summarized_count_key(scope.tenant, scope.thread))
    assert count is None or int(count) == k


async def all_summary_text(memory, scope: Scope) -> str:
    """The text and descriptions of every summary of a thread, merged ones' children too."""
    out, pending = [], [s.id for s in await memory.summaries.for_thread(scope)]
    while pending:
        got = await memory.summaries.get_many(scope.tenant, pending)
        out += [f"{s.description}\n{s.text}" for s in got.values()]
        pending = [c for s in got.values() for c in s.children]
    return "\n".join(out)


# -- one message ------------------------------------------------------------------------------


async def test_a_forgotten_message_is_gone_from_the_next_context_and_keeps_its_place(
    memory, tenant
):
    scope = Scope(tenant, "t1", "C1", user="U1", user_name="Ada")
    secret = word()
    said = await say(memory, scope, [
        "Which paper introduced paging for language model memory?",
        "MemGPT did: arXiv 2310.08560.",
        f"My badge code is {secret}, keep it for the booking.",
        "Noted.",
        "Thanks, and what about retrieval?",
    ])  # fmt: skip
    question = f"What is my badge code {secret}?"
    await memory.embedder.embed([said[2].content])  # its vector, as a turn's question, cached
    assert secret in await context_text(memory, scope, question)
    assert any(secret in t for t in await found(memory, scope, secret))

    erasure = await memory.governance.forget_message(tenant, "t1", said[2].id)

    assert erasure.messages == 1 and erasure.episodes == 1 and erasure.cached_embeddings >= 2
    stored = await memory.conversation.all(scope, forgotten=True)
    assert [m.id for m in stored] == [m.id for m in said]  # nothing moved
    tomb = stored[2]
    assert tomb.forgotten and tomb.content == "" and tomb.author == "" and tomb.author_name == ""
    assert tomb.role == "user" and tomb.seq == 2 and tomb.timestamp == said[2].timestamp
    assert said[2].id not in [m.id for m in await memory.conversation.all(scope)]
    assert secret not in await context_text(memory, scope, question)
    assert not any(secret in t for t in await found(memory, scope, secret))  # hidden at once
    await memory.governance.settle()  # and its documents deleted in the background
    assert not await memory.redis.exists(memory.episodes.key(tenant, said[2].id))
    assert not await memory.redis.exists(erasing_key(tenant))
    assert not await memory.redis.exists(memory.embedder._key(said[2].content))
    assert await memory.redis.exists(memory.embedder._key(question))  # others' stay
    # again: nothing left to erase, still answered; an unknown id is not found
    assert (await memory.governance.forget_message(tenant, "t1", said[2].id)).messages == 0
    with pytest.raises(NotFound):
        await memory.governance.forget_message(tenant, "t1", "msg_nope")
    with pytest.raises(NotFound):
        await memory.governance.forget_message(tenant, "nope", said[2].id)


async def test_summaries_over_a_forgotten_message_are_rewritten_and_the_invariant_holds(
    memory, tenant
):
    scope = Scope(tenant, "t", user="U1", user_name="Ada")
    secret = word()
    consolidator = Consolidator(memory, None)
    said = []
    for batch in range(MAX_TOP_SUMMARIES + 2):  # enough summaries to merge some
        texts = [f"batch {batch} question", f"batch {batch} answer"]
        if batch == 1:
            texts[0] = f"batch 1: the launch code is {secret}"
        said += await say(memory, scope, texts, index=batch == 1)
        await consolidator.compact(scope)
    merged = await consolidator._merge_summaries(scope, 1000, renew=None)
    assert merged is not None and merged.level == 1
    await say(memory, scope, ["recent question", "recent answer"])
    leaf_id = (await memory.conversation.all(scope))[2].summary_id
    assert secret in await all_summary_text(memory, scope)
    await check_invariant(memory, scope)

    erasure = await memory.governance.forget_message(tenant, "t", said[2].id)

    assert erasure.summaries == 2  # its summary and the one it was merged into
    assert secret not in await all_summary_text(memory, scope)
    leaf = await memory.summaries.get(scope, leaf_id)
    assert leaf.parent == merged.id and leaf.message_ids == [said[2].id, said[3].id]
    assert secret not in await context_text(memory, scope, f"launch code {secret}")
    await check_invariant(memory, scope)
    # the window rolls on over tombstones: marked by position, never in a note
    secret2 = word()
    fresh = await say(memory, scope, [f"window secret {secret2}", "ok"])
    await memory.governance.forget_message(tenant, "t", fresh[0].id)
    summary = await consolidator.compact(scope)
    assert summary is not None and fresh[0].id in summary.message_ids
    assert secret2 not in summary.text + summary.description
    await check_invariant(memory, scope)


async def test_a_summary_read_before_a_forget_cannot_mark_it(memory, tenant):
    scope = Scope(tenant, "t", user="U1")
    secret = word()
    said = await say(memory, scope, [f"roll me {secret}", "ok", "more"], index=False)
    first, raw = await memory.conversation.unsummarized_snapshot(scope)  # a roll reads...
    await memory.governance.forget_message(tenant, "t", said[0].id)  # ...a forget runs...
    with pytest.raises(MarkConflict):  # ...and the roll's marking finds the message changed
        await memory.conversation.mark_summarized(scope, first, raw, "sum_stale")
    assert not any(m.summary_id for m in await memory.conversation.all(scope, forgotten=True))
    summary = await Consolidator(memory, None).compact(scope)  # read again: marked, not quoted
    assert summary.message_ids == [m.id for m in said] and secret not in summary.text
    await check_invariant(memory, scope)


async def test_a_merge_from_a_rewritten_child_is_refused(memory, tenant):
    scope = Scope(tenant, "t", user="U1")
    consolidator = Consolidator(memory, None)
    for i in range(3):
        await say(memory, scope, [f"q{i}", f"a{i}"], index=False)
        await consolidator.compact(scope)
    children = await memory.summaries.for_thread(scope)  # read, then one is rewritten
    await memory.summaries.rewrite(tenant, {children[0].id: ("rewritten", "")})
    stale = Summary("t", "merged", "quotes the old text", [], level=1)
    with pytest.raises(SummaryConflict):
        await memory.summaries.merge(scope, stale, children)
    assert [s.id for s in await memory.summaries.for_thread(scope)] == [c.id for c in children]


async def test_a_queued_indexing_task_does_not_bring_a_forgotten_message_back(memory, tenant):
    scope = Scope(tenant, "t", user="U1", user_name="Ada")
    secret = word()
    said = await say(memory, scope, [f"the vault password is {secret}", "ok"], index=False)
    queued = task_of(scope, said)  # queued after the turn, run after the forget
    await memory.governance.forget_message(tenant, "t", said[0].id)
    await upkeep_of(memory).index_episodes([queued])
    assert not await memory.redis.exists(memory.episodes.key(tenant, said[0].id))
    assert await memory.redis.exists(memory.episodes.key(tenant, said[1].id))
    assert not any(secret in t for t in await found(memory, scope, secret))
    # nor does a task that was indexing it while it was forgotten (checked after the write)
    await memory.episodes.add(scope, [episode_of(said[0], "")])  # the write it raced with
    await upkeep_of(memory).index_episodes([queued])
    assert not await memory.redis.exists(memory.episodes.key(tenant, said[0].id))


# -- summaries, threads, tool logs, papers, entities, workflows ---------------------------------


async def test_forgetting_a_summary_recovers_its_messages_deterministically(memory, tenant):
    scope = Scope(tenant, "t", user="U1")
    consolidator = Consolidator(memory, None)
    for i in range(MAX_TOP_SUMMARIES + 2):
        await say(memory, scope, [f"question {i}", f"answer {i}"], index=False)
        await consolidator.compact(scope)
    merged = await consolidator._merge_summaries(scope, 1000, renew=None)
    await memory.summaries.rewrite(tenant, {merged.id: ("model note", "a model-written secret")})
    child = merged.children[1]

    erasure = await memory.governance.forget_summary(tenant, child)
    assert erasure.summaries == 2  # it, and its parent rewritten
    with pytest.raises(NotFound):
        await memory.governance.forget_summary(tenant, child)
    parent = await memory.summaries.get(scope, merged.id)
    replacement = parent.children[1]
    assert replacement != child and "a model-written secret" not in parent.text
    assert (await memory.summaries.get(scope, replacement)).text.startswith("[U1] question 1")
    await check_invariant(memory, scope)

    erasure = await memory.governance.forget_summary(tenant, merged.id)  # a merged, top-level one
    assert erasure.summaries == 1
    tops = await memory.summaries.for_thread(scope)
    assert merged.id not in [s.id for s in tops] and tops[0].children == parent.children
    await check_invariant(memory, scope)


async def test_forgetting_a_thread_takes_everything_of_it(memory, tenant):
    scope = Scope(tenant, "t", user="U1", user_name="Ada")
    other = Scope(tenant, "u", user="U1", user_name="Ada")
    secret = word()
    said = await say(memory, scope, [f"thread secret {secret}", "answer", "more", "reply"])
    await say(memory, other, ["other thread stays", "yes"])
    await Consolidator(memory, None).compact(scope)
    await memory.tool_logs.write(
        scope, ToolLogEntry("t", "search", {"q": secret}, "out", "success")
    )
    await memory.presence.join(scope)

    erasure = await memory.governance.forget_thread(tenant, "t")

    assert erasure.threads == 1 and erasure.messages == 4 and erasure.episodes == 4
    assert erasure.summaries == 1 and erasure.tool_logs == 1
    assert not await memory.redis.exists(
        messages_key(tenant, "t"), summarized_count_key(tenant, "t"), joined_key(tenant, "t")
    )
    assert [t for t, _ in await memory.conversation.threads(tenant)] == ["u"]
    assert not await memory.summaries.for_thread(scope)
    assert not await memory.tool_logs.for_thread(scope)
    assert not any(secret in t for t in await found(memory, other, secret))
    await memory.governance.settle()
    assert not await memory.redis.exists(memory.episodes.key(tenant, said[0].id))
    with pytest.raises(NotFound):
        await memory.governance.forget_thread(tenant, "t")
    assert len(await memory.conversation.all(other)) == 2


async def test_forgetting_a_tool_log_paper_entity_and_workflow(memory, tenant):
    scope = Scope(tenant, "t", user="U1")
    log_id = await memory.tool_logs.write(scope, ToolLogEntry("t", "x", {}, "out", "success"))
    assert (await memory.governance.forget_tool_log(tenant, log_id)).tool_logs == 1
    assert not await memory.tool_logs.for_thread(scope)

    await add_memgpt(memory, tenant)
    erasure = await memory.governance.forget_paper(tenant, "2310.08560v2")
    assert erasure.papers == 1 and erasure.chunks == 3
    assert not await memory.knowledge_base.papers(scope)
    vector = (await memory.embedder.embed(["MemGPT virtual context"]))[0]
    assert not await memory.knowledge_base.search(scope, "MemGPT virtual context", vector)

    await memory.entities.upsert(scope, [Entity("Quokka", "project", "a launch")])
    await memory.workflows.add(scope, "plan quokka", ["search -> success"], "done")
    [entity] = await memory.browse.entities(tenant, None)
    [workflow] = await memory.browse.workflows(tenant, None)
    assert (await memory.governance.forget_entity(tenant, entity.id)).entities == 1
    assert (await memory.governance.forget_workflow(tenant, workflow.id)).workflows == 1
    assert not await memory.entities.all(scope, everywhere=True)
    assert not await memory.workflows.all(scope, everywhere=True)

    governance = memory.governance
    for forget, item in [
        (governance.forget_tool_log, log_id), (governance.forget_paper, "2310.08560"),
        (governance.forget_entity, entity.id), (governance.forget_workflow, workflow.id),
        (governance.forget_entity, ""), (governance.forget_summary, "sum_nope"),
        (governance.forget_thread, "nope"), (governance.forget_person, "U404"),
    ]:  # fmt: skip
        with pytest.raises(NotFound):
            await forget(tenant, item)
    with pytest.raises(NotFound):
        await governance.forget_entity(f"{tenant}x", entity.id)  # another tenant's id


async def test_edits_are_embedded_again(memory, tenant):
    scope = Scope(tenant, "t", user="U1")
    await memory.entities.upsert(scope, [Entity("Kestrel", "system", "a billing service")])
    await memory.workflows.add(scope, "bill a customer", ["invoice -> success"], "sent")
    [entity] = await memory.browse.entities(tenant, None)
    [workflow] = await memory.browse.workflows(tenant, None)
    old_line = Entity("Kestrel", "system", "a billing service").line()
    await memory.embedder.embed([old_line])

    await memory.governance.edit_entity(tenant, entity.id, "a volcano eruption forecasting model")
    text = "QUERY: forecast volcano eruptions\nSTEPS:\n1. seismic -> success\n2. fit -> success"
    await memory.governance.edit_workflow(tenant, workflow.id, text)

    vector = (await memory.embedder.embed(["volcano eruption forecasting"]))[0]
    [best] = await memory.entities.similar(scope, vector, k=1)
    assert best.description == "a volcano eruption forecasting model" and best.name == "Kestrel"
    assert (await memory.workflows.similar(scope, vector, k=1)) == [text]
    assert not await memory.redis.exists(memory.embedder._key(old_line))
    stored = await memory.redis.hget(memory.workflows.key_of(tenant, workflow.id), "num_steps")
    assert int(stored) == 2
    with pytest.raises(NotFound):
        await memory.governance.edit_entity(tenant, "nope", "x")
    with pytest.raises(ValueError):
        await memory.governance.edit_workflow(tenant, workflow.id, "  ")


async def test_entities_and_workflows_keep_their_provenance(memory, tenant):
    a = Scope(tenant, "ta", user="U1")
    b = Scope(tenant, "tb", user="U2")
    await memory.entities.upsert(a, [Entity("Kestrel", "system", "billing")])
    await memory.entities.upsert(b, [Entity("kestrel", "system", "invoices")], authors=["U2", "U3"])
    await memory.workflows.add(b, "bill", ["x -> success"], "ok")
    [entity] = await memory.browse.entities(tenant, None)
    assert entity.threads == ["ta", "tb"] and entity.authors == ["U1", "U2", "U3"]
    [workflow] = await memory.browse.workflows(tenant, None)
    assert workflow.thread == "tb" and workflow.authors == ["U2"]


# -- a person -----------------------------------------------------------------------------------


async def test_forgetting_a_person_erases_them_from_every_store(memory, tenant):
    ada_public = Scope(tenant, "slack:T:C1:1.0", "C1", Visibility.PUBLIC, "U1", "Ada")
    bo_public = Scope(tenant, "slack:T:C1:1.0", "C1", Visibility.PUBLIC, "U2", "Bo")
    ada_dm = Scope(tenant, "slack:T:D1:1.0", "D1", Visibility.DM, "U1", "Ada")
    bo_dm = Scope(tenant, "slack:T:D2:1.0", "D2", Visibility.DM, "U2", "Bo")
    hers, dm_secret, his = word(), word(), word()
    consolidator = Consolidator(memory, None)
    public = []
    for i in range(3):
        public += await say(
            memory, ada_public, [f"Ada asks about {hers} number {i}", f"answer {i}"]
        )
        public += await say(memory, bo_public, [f"Bo asks about {his} number {i}", f"reply {i}"])
        if i == 0:
            await consolidator.compact(ada_public)
    dm = await say(memory, ada_dm, [f"private to Ada: {dm_secret}", "dm answer"])
    await say(memory, bo_dm, [f"private to Bo: {his}", "his dm answer"])
    await memory.embedder.embed([public[0].content, dm[0].content])  # cached as questions
    # tool logs: one with her as author, one of hers from before authors were kept, one of Bo's
    mine = await memory.tool_logs.write(
        ada_public, ToolLogEntry(ada_public.thread, "s", {"q": hers}, "o", "success", author="U1")
    )
    legacy = ToolLogEntry(ada_public.thread, "s", {}, "o", "success",
                          created_at=public[4].timestamp + 0.0001)  # fmt: skip  # Ada's 2nd turn
    await memory.tool_logs.write(ada_public, legacy)
    his_log = await memory.tool_logs.write(
        bo_public, ToolLogEntry(bo_public.thread, "s", {}, "o", "success", author="U2")
    )
    await memory.entities.upsert(ada_public, [Entity("Hers", "project", f"about {hers}")])
    await memory.entities.upsert(ada_dm, [Entity("Diary", "project", "old, no authors")], [])
    await memory.entities.upsert(bo_public, [Entity("His", "project", f"about {his}")])
    await memory.workflows.add(ada_public, f"find {hers}", ["search -> success"], "found")
    await memory.workflows.add(bo_public, f"find {his}", ["search -> success"], "found")
    await memory.presence.join(ada_public, "1.0")

    erasure = await memory.governance.forget_person(tenant, "U1")

    assert erasure.threads == 1 and erasure.messages == 3 + 2  # her 3 + her DM's 2
    assert erasure.tool_logs == 2 and erasure.entities == 2 and erasure.workflows == 1
    # conversation: no message of hers anywhere, her DM gone, Bo's kept
    threads = [t for t, _ in await memory.conversation.threads(tenant)]
    assert sorted(threads) == sorted([ada_public.thread, bo_dm.thread])
    for thread in threads:
        for m in await memory.conversation.all(Scope(tenant, thread), forgotten=True):
            assert m.author != "U1" and "Ada" not in m.author_name
            assert hers not in m.content and dm_secret not in m.content
    kept = await memory.conversation.all(bo_public)
    assert sum(his in m.content for m in kept) == 3 and len(kept) == 9
    await check_invariant(memory, ada_public)
    # episodic search, from every place, by her words and her name
    for scope in (ada_public, ada_dm, bo_dm):
        for query in (hers, dm_secret, "Ada asks"):
            assert not any(hers in t or dm_secret in t for t in await found(memory, scope, query))
    assert any(his in t for t in await found(memory, bo_public, his))
    await memory.governance.settle()
    index = memory.episodes.index_name(tenant)
    reply = await memory.redis.execute_command("FT.SEARCH", index, "@author:{U1}", "NOCONTENT")
    total = reply[0] if isinstance(reply, list) else reply[b"total_results"]
    assert total == 0  # her documents are deleted, not only hidden
    # summaries, the next context
    assert hers not in await all_summary_text(memory, ada_public)
    assert hers not in await context_text(memory, bo_public, f"what about {hers}?")
    # entities and workflows: hers and her DM's gone, Bo's kept
    names = [e.name for e in await memory.entities.all(ada_public, everywhere=True)]
    assert names == ["His"]
    workflows = await memory.workflows.all(ada_public, everywhere=True)
    assert len(workflows) == 1 and his in workflows[0]
    # tool logs, the cache, the bot's pointer to her latest thread
    logs = await memory.tool_logs.for_thread(ada_public)
    assert [log.id for log in logs] == [his_log] and mine not in [log.id for log in logs]
    for question in (public[0].content, dm[0].content):
        assert not await memory.redis.exists(memory.embedder._key(question))
    assert await memory.presence.last_thread(ada_public) is None
    # once more: nothing of hers is left
    with pytest.raises(NotFound):
        await memory.governance.forget_person(tenant, "U1")


# -- retention ----------------------------------------------------------------------------------


async def test_forgetting_what_is_older_than_a_date_keeps_papers_and_knowledge(memory, tenant):
    old, new = time.time() - 90 * 86400, time.time()
    stale = Scope(tenant, "stale", user="U1")
    mixed = Scope(tenant, "mixed", user="U1")
    secret = word()
    for i in range(2):
        await memory.conversation.append(stale, "user", f"stale {secret} {i}", timestamp=old + i)
    said = [
        await memory.conversation.append(mixed, "user", f"old {secret}", timestamp=old),
        await memory.conversation.append(mixed, "assistant", "old answer", timestamp=old + 1),
        await memory.conversation.append(mixed, "user", "new question", timestamp=new),
    ]
    await upkeep_of(memory).index_episodes([task_of(mixed, said)])
    await Consolidator(memory, None).compact(mixed)
    await memory.tool_logs.save(mixed, ToolLogEntry("mixed", "s", {}, "o", "success",
                                                    created_at=old))  # fmt: skip
    fresh_log = await memory.tool_logs.write(mixed, ToolLogEntry("mixed", "s", {}, "o", "success"))
    await add_memgpt(memory, tenant)
    await memory.entities.upsert(mixed, [Entity("Kestrel", "system", "billing")])
    await memory.workflows.add(mixed, "bill", ["x -> success"], "ok")

    erasure = await memory.governance.sweep_retention(tenant, time.time() - 30 * 86400)

    assert erasure.threads == 1 and erasure.messages == 2 + 2 and erasure.tool_logs == 1
    assert [t for t, _ in await memory.conversation.threads(tenant)] == ["mixed"]
    assert [m.content for m in await memory.conversation.all(mixed)] == ["new question"]
    assert secret not in await all_summary_text(memory, mixed)
    assert not any(secret in t for t in await found(memory, mixed, secret))
    assert [log.id for log in await memory.tool_logs.for_thread(mixed)] == [fresh_log]
    await check_invariant(memory, mixed)
    # papers, entities and workflows are kept
    assert await memory.redis.hexists(papers_key(tenant), "2310.08560")
    assert len(await memory.entities.all(mixed, everywhere=True)) == 1
    assert len(await memory.workflows.all(mixed, everywhere=True)) == 1
    # a second sweep finds nothing more
    assert await memory.governance.sweep_retention(tenant, time.time() - 30 * 86400) == Erasure()
    assert await memory.redis.zscore(threads_key(tenant), "mixed")


async def test_a_reply_in_an_old_thread_during_a_retention_sweep_is_kept(memory, tenant):
    """The sweep reads a thread whose every message is old; a reply comes before it deletes
    the thread (an append takes no erasure lock). The reply, its episodic entry and its tool
    log stay; the old messages are forgotten one by one."""
    old = time.time() - 90 * 86400
    scope = Scope(tenant, "old", user="U1", user_name="Ada")
    secret, fresh = word(), word()
    said = [
        await memory.conversation.append(scope, "user", f"old {secret}", timestamp=old),
        await memory.conversation.append(scope, "assistant", "old answer", timestamp=old + 1),
    ]
    await upkeep_of(memory).index_episodes([task_of(scope, said)])
    await Consolidator(memory, None).compact(scope)
    purge = Purge(memory)
    sweeps = Sweeps(memory, ThreadEraser(memory, purge), purge)
    expiry = await sweeps.expiry(tenant, time.time() - 30 * 86400)
    assert expiry.whole == ["old"]

    reply = await memory.conversation.append(scope, "user", f"a new question {fresh}")
    await upkeep_of(memory).index_episodes([task_of(scope, [reply])])
    log = await memory.tool_logs.write(scope, ToolLogEntry("old", "s", {}, "o", "success"))
    erasure = await sweeps.expire(tenant, expiry)

    assert erasure.threads == 0 and erasure.messages == 2 and erasure.tool_logs == 0
    assert [m.content for m in await memory.conversation.all(scope)] == [reply.content]
    assert await memory.redis.zscore(threads_key(tenant), "old")
    assert [t.id for t in await memory.tool_logs.for_thread(scope)] == [log]
    assert not await memory.redis.hexists(erasing_key(tenant), reply.id)
    assert any(fresh in t for t in await found(memory, scope, fresh))
    assert not any(secret in t for t in await found(memory, scope, secret))
    assert secret not in await all_summary_text(memory, scope)
    await check_invariant(memory, scope)


async def test_a_message_said_while_its_thread_is_forgotten_goes_with_it(memory, tenant):
    """An explicit erasure reads the thread again when it grew meanwhile: the thread goes
    whole, the late message's episodic entry with it; nothing of it is left half deleted."""
    scope = Scope(tenant, "t", user="U1", user_name="Ada")
    await say(memory, scope, ["first", "answer"])
    eraser = ThreadEraser(memory, Purge(memory))
    lists = await eraser.read(tenant, ["t"])
    late = word()
    racing = await say(memory, scope, [f"late {late}"])

    erasure = await eraser.erase_threads(tenant, lists)

    assert erasure.threads == 1 and erasure.messages == 3 and erasure.episodes == 3
    assert not await memory.redis.exists(messages_key(tenant, "t"))
    assert await memory.redis.zscore(threads_key(tenant), "t") is None
    assert await memory.redis.hexists(erasing_key(tenant), racing[0].id)
    assert not any(late in t for t in await found(memory, scope, late))


async def test_a_forgotten_persons_name_is_not_shown_while_the_purge_runs(memory, tenant):
    ada = Scope(tenant, "t", user="U1", user_name="Ada Lovelace")
    bo = Scope(tenant, "t", user="U2", user_name="Bo")
    hers = await say(memory, ada, ["hello from Ada"])
    await say(memory, bo, ["hi from Bo"])
    assert await memory.browse.names(tenant, ["U1", "U2"]) == {"U1": "Ada Lovelace", "U2": "Bo"}
    await Purge(memory).hide(tenant, [hers[0].id], {})  # hidden; its document not deleted yet
    assert await memory.redis.exists(memory.episodes.key(tenant, hers[0].id))
    assert await memory.browse.names(tenant, ["U1", "U2"]) == {"U2": "Bo"}
    await memory.governance.forget_person(tenant, "U2")  # its purge runs in the background
    assert await memory.browse.names(tenant, ["U1", "U2"]) == {}
    await memory.governance.settle()
    assert await memory.browse.names(tenant, ["U1", "U2"]) == {}


async def test_tombstones_read_as_forgotten_by_the_page(memory, tenant):
    scope = Scope(tenant, "t", user="U1", user_name="Ada")
    said = await say(memory, scope, ["keep", "this one goes"], index=False)
    await memory.governance.forget_message(tenant, "t", said[1].id)
    raw = await memory.redis.lrange(messages_key(tenant, "t"), 0, -1)
    assert json.loads(raw[1])["forgotten"] is True and json.loads(raw[1])["seq"] == 1
    page = await memory.browse.thread(tenant, "t", None)
    assert [m.forgotten for m in page.messages] == [False, True]


# -- what a turn teaches ------------------------------------------------------------------------


@pytest.fixture
async def world(redis_url, tmp_path):
    world = await open_world(redis_url, tmp_path)
    yield world
    await close_world(world)


async def test_a_turn_teaches_with_provenance_and_nothing_from_a_forgotten_question(world, tenant):
    memory, harness = world.runtime.memory, world.runtime.harness
    scope = Scope(tenant, "t", "C1", user="U1", user_name="Ada")
    world.entities = [{"name": "MemGPT", "type": "system", "description": "Pages memory."}]
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": "MemGPT"})), text("Found MemGPT.")
    )
    await world.agent.run_turn(scope, "Find MemGPT")
    await harness.drain()
    [workflow] = await memory.browse.workflows(tenant, None)
    [entity] = await memory.browse.entities(tenant, None)
    assert workflow.thread == "t" and workflow.authors == ["U1"]
    assert entity.threads == ["t"] and entity.authors == ["U1"]
    [log] = await memory.tool_logs.for_thread(scope)
    assert log.author == "U1"

    # the next turn's question is forgotten while its entities are being extracted
    world.hold_entities = asyncio.Event()
    world.entities = [{"name": "Quokka", "type": "project", "description": "A secret launch."}]
    world.model.script(
        tool_calls(call("arxiv_search_candidates", {"query": "Quokka"})), text("Quokka is ours.")
    )
    await world.agent.run_turn(scope, "Find Quokka, our secret launch")
    while not any(r["messages"][0]["content"] == ENTITY_INSTRUCTIONS
                  for r in world.model.requests[-3:]):  # fmt: skip
        await asyncio.sleep(0.01)
    question = (await memory.conversation.all(scope))[-2]
    assert question.content == "Find Quokka, our secret launch"
    await memory.governance.forget_message(tenant, "t", question.id)
    world.hold_entities.set()
    await harness.drain()
    assert [w.id for w in await memory.browse.workflows(tenant, None)] == [workflow.id]
    assert [e.name for e in await memory.browse.entities(tenant, None)] == ["MemGPT"]
