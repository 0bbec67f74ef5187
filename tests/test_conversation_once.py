"""`ConversationStore.append(once=)` knows the message an earlier run stored by its id, not only
by its position: a thread forgotten whole that grows again to the same position, with the same
role, does not pass another person's message off as the re-run's question. A record from
before ids were kept (its position alone) is still read. Real Redis."""

from __future__ import annotations

from memory.keys import appended_key
from memory.scope import Scope


async def test_a_thread_forgotten_whole_and_grown_again_is_not_the_first_runs(memory, tenant):
    conversation = memory.conversation
    scope = Scope(tenant, "t1", user="U1")
    first = await conversation.append(scope, "user", "my secret okapi plan", once="job-1:q")
    await memory.governance.forget_thread(tenant, "t1")
    other = await conversation.append(Scope(tenant, "t1", user="U2"), "user", "hello there")
    assert other.seq == first.seq  # the same position, the same role

    again = await conversation.append(scope, "user", "my secret okapi plan", once="job-1:q")
    assert again.duplicate and again.forgotten and again.id == first.id
    assert again.content == "" and again.author == ""
    seen = await conversation.appended(scope, "job-1:q")
    assert seen is not None and seen.forgotten and seen.id == first.id
    assert [m.content for m in await conversation.all(scope)] == ["hello there"]


async def test_a_re_run_finds_its_message_by_id_while_it_is_stored(memory, tenant):
    conversation = memory.conversation
    scope = Scope(tenant, "t1", user="U1")
    first = await conversation.append(scope, "user", "what is MemGPT?", once="job-2:q")
    again = await conversation.append(scope, "user", "what is MemGPT?", once="job-2:q")
    assert again.duplicate and not again.forgotten
    assert (again.id, again.content, again.seq) == (first.id, "what is MemGPT?", first.seq)
    assert len(await conversation.all(scope)) == 1
    # the position stays a bare number: a process of the version before reads it as it did
    assert int(await memory.redis.get(appended_key(tenant, "job-2:q"))) == first.seq


async def test_a_record_from_before_ids_is_read_by_position(memory, tenant):
    conversation = memory.conversation
    scope = Scope(tenant, "t1", user="U1")
    first = await conversation.append(scope, "user", "what is MemGPT?")
    await memory.redis.set(appended_key(tenant, "job-3:q"), first.seq)  # as recorded before
    again = await conversation.append(scope, "user", "what is MemGPT?", once="job-3:q")
    assert again.duplicate and not again.forgotten and again.id == first.id
    answer = await conversation.appended(scope, "job-3:q", role="assistant")
    assert answer is not None and answer.forgotten  # another role there: not it
