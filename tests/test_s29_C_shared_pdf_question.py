"""A question sent with a PDF is about that PDF: its turn names the PDFs it came with, so its
knowledge-base search, and the thread's later turns, find that paper rather than another one
whose words better match "what are the key takeaways?" (adapters/shared_files.py
`shared_with`). Through the real Slack adapter, a real Redis and the scripted model."""

from __future__ import annotations

import time

import pytest

from adapters.shared_files import shared_with
from adapters.slack import thread_id
from adapters.spine import Job
from memory.context import assemble_context
from memory.ingest.shared_pdf import SharedFile, save_shared_pdf
from memory.scope import Scope, Visibility
from memory.tokens import encoding_for
from tests.support.pdfs import make_pdf
from tests.support.scripted_openai import text
from tests.support.slack_api import file_share
from tests.test_shared_pdfs import (
    Env,
    StubEnd,
    share_payload,
    shared_pdf,
    shared_world,
    stub_files,
    ts,
)

# another paper of the team's, whose every passage talks of key takeaways
TAKEAWAYS = [
    (
        f"{n} Key takeaways, part {n}",
        [f"The key takeaways of part {n}: what are the key takeaways of attention? " * 4],
    )
    for n in range(1, 15)
]


@pytest.fixture
async def env(redis_url, tmp_path):
    async with shared_world(redis_url, tmp_path) as env:
        yield env


async def save_takeaways_paper(env: Env, team: str) -> str:
    memory = env.world.runtime.memory
    saved = await save_shared_pdf(
        make_pdf(TAKEAWAYS, title="Key Takeaways of Attention"),
        SharedFile("takeaways.pdf", "", "share-takeaways"), Scope(team),
        memory.knowledge_base, memory.embedder, encoding_for("gpt-5-mini"), 10**7,
    )  # fmt: skip
    assert saved.passages >= 10  # enough to fill both halves of a search on its own
    return saved.arxiv_id


async def test_a_question_shared_with_a_pdf_is_answered_from_that_pdf(env):
    team = f"T{time.time_ns()}"
    other = await save_takeaways_paper(env, team)
    env.world.model.script(text("It bounds the glacier entropy."), text("Few limitations."))
    pdf = env.api.add_file("notes.pdf", shared_pdf("Notes on Quokkas"))
    event = file_share(
        [pdf], ts(20), text="What are the key takeaways?", channel="D7", channel_type="im"
    )
    await env.slack.event(event, team=team)
    await env.settle(until=lambda: len(env.world.model_requests()) == 1)

    memory = env.world.runtime.memory
    dm = Scope(team, thread_id(team, "D7", "dm"), channel="D7", visibility=Visibility.DM)
    [paper] = [p for p in await memory.knowledge_base.papers(dm) if p["arxiv_id"] != other]
    note = f"(shared with this message: *Notes on Quokkas* [PDF:{paper['arxiv_id']}])"
    # the question's passages hold the shared PDF's, not only the other paper's
    context = env.world.model_requests()[0]["messages"][1]["content"]
    passages = context.split("## Knowledge Base Memory")[1].split("## Workflow Memory")[0]
    assert f"[PDF:{paper['arxiv_id']}] Notes on Quokkas" in passages
    assert context.startswith(f"# Question\nWhat are the key takeaways?\n\n{note}\n")
    # the question is kept with its note: the thread's later turns know the PDF
    [question] = [m for m in await memory.conversation.all(dm) if m.role == "user"]
    assert question.content == f"What are the key takeaways?\n\n{note}"
    await env.slack.event(
        file_share([], ts(21), text="and its limitations?", channel="D7", channel_type="im"),
        team=team,
    )
    await env.settle(until=lambda: len(env.world.model_requests()) == 2)
    later = env.world.model_requests()[1]["messages"][1]["content"]
    assert note in later.split("## Conversation Memory")[1].split("## Episodic Memory")[0]


def test_the_note_names_each_saved_pdf_on_one_line():
    assert shared_with([]) == ""
    papers = [{"id": "pdf-1", "title": "A [draft]\nPaper"}, {"id": "pdf-2", "title": ""}]
    assert shared_with(papers) == (
        "(shared with this message: *A (draft) Paper* [PDF:pdf-1]; *an untitled PDF* [PDF:pdf-2])"
    )


async def queued_text(memory, scope: Scope) -> str:
    """The text of the turn a share queued (taken from the thread's real queue)."""
    assert await memory.turns.lease(scope, "test", 10_000)
    taken = await memory.turns.take(scope, "test")
    assert taken is not None
    return Job.from_json(taken.job).text


async def test_the_turn_names_a_pdf_already_saved_not_one_unread(memory, tenant):
    """The same PDF shared twice (the second "already in the knowledge base") names the copy
    both times; a file that could not be read is not named (its message says so)."""
    scope = Scope(tenant, "slack:T:D1:dm", channel="D1", visibility=Visibility.DM)
    first = share_payload(scope, f"slack:D1:{time.time_ns()}", turn="what is it?")
    data = shared_pdf("Twice Shared")  # reportlab stamps the time: these bytes both times
    await stub_files(memory, StubEnd(data)).one(first)
    [paper] = await memory.knowledge_base.papers(scope)
    named = f"*Twice Shared* [PDF:{paper['arxiv_id']}]"
    assert await queued_text(memory, scope) == (
        f"what is it?\n\n(shared with this message: {named})"
    )

    other = Scope(tenant, "slack:T:D1:later", channel="D1", visibility=Visibility.DM)
    again = share_payload(other, f"slack:D1:{time.time_ns()}", turn="and now?")
    end = StubEnd(data)
    await stub_files(memory, end).one(again)
    assert end.edits[-1][1] == "Already in the knowledge base as *Twice Shared*."
    assert await queued_text(memory, other) == f"and now?\n\n(shared with this message: {named})"

    broken = Scope(tenant, "slack:T:D3:dm", channel="D3", visibility=Visibility.DM)
    unread = share_payload(broken, f"slack:D3:{time.time_ns()}", turn="summarize this")
    await stub_files(memory, StubEnd(b"not a pdf at all")).one(unread)
    assert await queued_text(memory, broken) == "summarize this"


async def test_a_run_again_names_the_pdf_an_earlier_run_saved(memory, tenant):
    """A run that saved the PDF and died before queueing the turn: the run again finds the
    file's outcome kept (it does not read it again) and names the paper all the same."""
    scope = Scope(tenant, "slack:T:D5:dm", channel="D5", visibility=Visibility.DM)
    share = f"slack:D5:{time.time_ns()}"
    files = stub_files(memory, StubEnd(shared_pdf("Kept Paper")))
    await files.one(share_payload(scope, share))  # as far as a run that died got: no turn
    await files.one(share_payload(scope, share, turn="what does it show?"))
    [paper] = await memory.knowledge_base.papers(scope)
    assert await queued_text(memory, scope) == (
        f"what does it show?\n\n(shared with this message: *Kept Paper* [PDF:{paper['arxiv_id']}])"
    )


async def test_a_watch_command_sent_with_a_pdf_keeps_its_words(memory, tenant):
    """The note would join the watch's topic (or make "watch list" take more words)."""
    scope = Scope(tenant, "slack:T:D6:dm", channel="D6", visibility=Visibility.DM)
    payload = share_payload(scope, f"slack:D6:{time.time_ns()}", turn="watch quokka models weekly")
    await stub_files(memory, StubEnd(shared_pdf("Watched Paper"))).one(payload)
    assert [p["title"] for p in await memory.knowledge_base.papers(scope)] == ["Watched Paper"]
    assert await queued_text(memory, scope) == "watch quokka models weekly"


async def test_a_requeued_share_whose_read_now_fails_names_no_paper(memory, tenant):
    """A share requeued (its outcome forgotten) whose file cannot be read this time: its note
    does not name the paper the run before saved (it may have been forgotten since)."""
    scope = Scope(tenant, "slack:T:D8:dm", channel="D8", visibility=Visibility.DM)
    share = f"slack:D8:{time.time_ns()}"
    await stub_files(memory, StubEnd(shared_pdf("Earlier Read"))).one(share_payload(scope, share))
    files = stub_files(memory, StubEnd(b"not a pdf at all"))
    await files.progress.restart(tenant, share, 1, "requeue-1")  # as `tasks requeue` does
    await files.one(share_payload(scope, share, turn="what does it show?"))
    assert await queued_text(memory, scope) == "what does it show?"


async def test_a_question_naming_a_pdf_reads_its_passages_where_it_may(memory, tenant):
    """The note's label narrows half the Knowledge Base segment to that paper, however much
    better another paper matches the question's words; a label of a paper the asker may not
    read (another person's DM copy) finds none of it."""
    kb = memory.knowledge_base
    saved_as = {}
    for name, data, scope in (
        ("takeaways.pdf", make_pdf(TAKEAWAYS, title="Key Takeaways of Attention"), Scope(tenant)),
        ("quokkas.pdf", shared_pdf("Notes on Quokkas"), dm := Scope(
            tenant, "slack:T:D9:dm", channel="D9", user="U9", visibility=Visibility.DM)),
    ):  # fmt: skip
        saved = await save_shared_pdf(
            data, SharedFile(name, "", f"share-{name}"), scope, kb, memory.embedder,
            encoding_for("gpt-5-mini"), 10**7,
        )  # fmt: skip
        saved_as[name] = saved.arxiv_id
    pdf = saved_as["quokkas.pdf"]
    question = f"What are the key takeaways?\n\n{shared_with([{'id': pdf, 'title': 'Notes'}])}"

    shown = await assemble_context(memory, dm, question)
    ids = [p.arxiv_id for p in shown.passages]
    assert pdf in ids and saved_as["takeaways.pdf"] in ids, ids

    other = Scope(tenant, "slack:T:D8:dm", channel="D8", user="U8", visibility=Visibility.DM)
    assert pdf not in [
        p.arxiv_id for p in (await assemble_context(memory, other, question)).passages
    ]
