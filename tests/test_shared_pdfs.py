"""PDFs shared in chat: Slack file shares and Discord attachments read into the knowledge base,
with the privacy of the place, through the real adapters, the task stream and local mocks."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator

import aiohttp
import discord
import pytest
from aiohttp import web

from adapters.discord import DiscordAdapter
from adapters.shared_files import MAX_DELIVERIES, SHARED_FILES, FetchError, ShareBusy, SharedFiles
from adapters.slack import SlackAdapter, thread_id
from adapters.slack_files import SlackFileEnd
from adapters.spine import Job
from adapters.web import build_web_app
from app.runtime import shared_files
from bot.background import BackgroundWork
from memory.ingest.errors import IngestError
from memory.ingest.shared_pdf import SharedFile, save_shared_pdf, shared_pdf_id
from memory.keys import task_stream
from memory.scope import PUBLIC, Scope, Visibility
from memory.tasks import TaskStream
from memory.tokens import encoding_for
from tests.agent_world import close_world, open_world
from tests.support.discord_api import BOT_TOKEN, MockDiscordApi
from tests.support.discord_fakes import FakeDiscord, spec
from tests.support.pdfs import make_blank_pdf, make_encrypted_pdf, make_pdf
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, MockSlackApi, SlackSender, file_share, mention

SECRET = "test-signing-secret"
PHRASE = "Quokka tessellation lemmas bound the glacier entropy of sparse attention heads."
SECTIONS = [
    ("1 Introduction", ["We study how research teams share papers in chat. " * 3]),
    ("2 Method", [PHRASE, "The method is evaluated on many long documents. " * 3]),
]


def shared_pdf(title: str = "A Shared Paper") -> bytes:
    return make_pdf(SECTIONS, title=title)


def ts(n: int) -> str:
    return f"1700000000.{n:06d}"


class Env:
    """One Slack bot process over a mock Slack, and (for Discord) a mock Discord REST."""

    world: object
    api: MockSlackApi
    discord_api: MockDiscordApi
    slack: SlackSender
    adapter: SlackAdapter

    async def settle(self, until=None, timeout: float = 30.0) -> None:
        """Wait for turns, the file tasks and the turns they queue (until `until()` holds)."""
        deadline = time.monotonic() + timeout
        while True:
            await self.adapter.wait_idle()
            await self.world.runtime.harness.drain()
            await self.world.runtime.files.drain()
            if until is None or until():
                return
            assert time.monotonic() < deadline, "timed out waiting"
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def shared_world(redis_url: str, tmp_path) -> AsyncIterator[Env]:
    api = MockSlackApi(streaming=True)
    await api.start()
    rest = MockDiscordApi()
    await rest.start()
    world = await open_world(
        redis_url, tmp_path, slack_bot_token="xoxb-test", slack_api_url=api.base_url,
        discord_token=BOT_TOKEN, discord_api_url=rest.base_url,
    )  # fmt: skip
    adapter = SlackAdapter(world.runtime.turns(), "xoxb-test", SECRET, api_url=api.base_url)
    await adapter.check_token()
    adapter.pipeline.recover_every = 0.1  # a turn a file task queued is found at once
    runner = web.AppRunner(build_web_app(world.runtime.memory, adapter.app))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    session = aiohttp.ClientSession()
    env = Env()
    env.world, env.api, env.discord_api, env.adapter = world, api, rest, adapter
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/slack/events"
    env.slack = SlackSender(url, SECRET, session, api)
    try:
        yield env
    finally:
        await env.settle()
        await session.close()
        await runner.cleanup()
        await adapter.close()
        await close_world(world)
        await api.close()
        await rest.close()


@pytest.fixture
async def env(redis_url, tmp_path):
    async with shared_world(redis_url, tmp_path) as env:
        yield env


async def found(env: Env, scope: Scope, query: str = PHRASE) -> list[str]:
    """Titles of the passages a search from `scope` finds for `query`."""
    memory = env.world.runtime.memory
    vector = (await memory.embedder.embed([query]))[0]
    return [p.title for p in await memory.knowledge_base.search(scope, query, vector, k=3)]


def slack_scope(team: str, channel: str, thread_ts: str, visibility=Visibility.PUBLIC) -> Scope:
    return Scope(team, thread_id(team, channel, thread_ts), channel=channel, visibility=visibility)


async def join_thread(env: Env, team: str, channel: str, n: int) -> None:
    """Mention the bot, so it takes part in the thread under message `n`."""
    env.world.model.script(text(f"hello in {channel}"))
    await env.slack.event(mention("hello", ts(n), channel=channel), team=team)
    await env.settle()


# -- Slack ----------------------------------------------------------------------------------------


async def test_a_pdf_shared_in_a_private_thread_is_found_there_only(env):
    team = f"T{time.time_ns()}"
    env.api.private_channels.add("C9")
    await join_thread(env, team, "C9", 1)
    data = shared_pdf()  # reportlab stamps the time: the same bytes are shared each time
    pdf = env.api.add_file("shared.pdf", data)
    response = await env.slack.event(
        file_share([pdf], ts(2), channel="C9", thread_ts=ts(1), channel_type="group"), team=team
    )  # Slack's channel_type of a private channel
    assert response.status == 200
    await env.settle()

    # "Reading …" was posted in the thread, then edited to the outcome
    posted = [p for p in env.api.of("chat.postMessage") if p.get("thread_ts") == ts(1)]
    assert posted[-1]["text"] == "_Reading shared.pdf…_"
    shown = env.api.thread_texts("C9", ts(1))[-1]
    assert re.fullmatch(
        r"Saved \*A Shared Paper\* \(2 pages, \d+ passages\) to the knowledge base of this "
        r"channel \(found only here\)\.",
        shown,
    ), shown
    assert env.api.downloads == [pdf["id"]]  # fetched with the bot token

    here = slack_scope(team, "C9", ts(1), Visibility.PRIVATE)
    assert "A Shared Paper" in await found(env, here)
    elsewhere = slack_scope(team, "C1", ts(50))
    assert "A Shared Paper" not in await found(env, elsewhere)
    memory = env.world.runtime.memory
    assert await memory.knowledge_base.papers(elsewhere) == []  # not listed in public either
    [record] = await memory.knowledge_base.papers(here)
    assert record["audience"] == "private:C9" and record["url"] == pdf["permalink"]
    assert record["source"] == "pdf" and record["pages"] == 2

    # shared again in the same thread: recognised by its content
    again = env.api.add_file("copy.pdf", data)
    await env.slack.event(
        file_share([again], ts(3), channel="C9", thread_ts=ts(1), channel_type="group"), team=team
    )
    await env.settle()
    assert env.api.thread_texts("C9", ts(1))[-1] == (
        "Already in the knowledge base as *A Shared Paper*."
    )
    # shared in a public thread: the private copy is not revealed, the team gets its own
    await join_thread(env, team, "C1", 10)
    public = env.api.add_file("same.pdf", data)
    await env.slack.event(file_share([public], ts(11), channel="C1", thread_ts=ts(10)), team=team)
    await env.settle()
    assert env.api.thread_texts("C1", ts(10))[-1].endswith("to the knowledge base of this team.")
    assert "A Shared Paper" in await found(env, elsewhere)
    audiences = {p["audience"] for p in await memory.knowledge_base.papers(here)}
    assert audiences == {PUBLIC, "private:C9"}


async def test_a_dm_pdf_with_a_question_is_read_before_the_question_is_answered(env):
    team = f"T{time.time_ns()}"
    env.world.model.script(text("It bounds the glacier entropy."))
    pdf = env.api.add_file("notes.pdf", shared_pdf("Notes on Quokkas"))
    event = file_share(
        [pdf], ts(20), text="what do the quokka lemmas bound?", channel="D7", channel_type="im"
    )
    await env.slack.event(event, team=team)
    await env.settle(until=lambda: len(env.world.model_requests()) == 1)
    await env.settle()

    texts = env.api.thread_texts("D7", None)
    assert texts[0].startswith("Saved *Notes on Quokkas*") and "this conversation" in texts[0]
    assert texts[-1] == "It bounds the glacier entropy."
    # the question's context already held the PDF's passage
    context = env.world.model_requests()[0]["messages"][1]["content"]
    assert "glacier entropy" in context and "Notes on Quokkas" in context
    dm = Scope(team, thread_id(team, "D7", "dm"), channel="D7", visibility=Visibility.DM)
    assert "Notes on Quokkas" in await found(env, dm)
    assert "Notes on Quokkas" not in await found(env, slack_scope(team, "C1", ts(1)))


async def test_files_that_cannot_be_read_get_a_clear_reply(env):
    team = f"T{time.time_ns()}"
    await join_thread(env, team, "C1", 30)
    files = [
        env.api.add_file("photo.png", b"\x89PNG\r\n", "image/png", "png", "PNG"),
        env.api.add_file("huge.pdf", b"%PDF-1.4 small", size=60_000_000),
        env.api.add_file("locked.pdf", make_encrypted_pdf()),
        env.api.add_file("garbage.pdf", b"this is not a pdf at all"),
        env.api.add_file("scan.pdf", make_blank_pdf()),
        env.api.add_file("gone.pdf", shared_pdf("Gone")),
    ]
    del env.api.files[files[-1]["id"]]  # deleted on Slack before the task ran
    event = file_share(files, ts(31), text=f"<@{BOT_USER}>", thread_ts=ts(30))  # addressed
    await env.slack.event(event, team=team)
    await env.settle()
    replies = env.api.thread_texts("C1", ts(30))[-6:]
    assert replies[0] == "I can read PDFs only; photo.png is a PNG file."
    assert replies[1] == "huge.pdf is 60.0 MB; I read PDFs up to 50.0 MB."
    assert replies[2] == "I could not read locked.pdf: cannot open the PDF (it is encrypted)."
    assert replies[3] == (
        "I could not read garbage.pdf: not a PDF file (it does not start with %PDF)."
    )
    assert replies[4].startswith("I could not read scan.pdf: no extractable text in 2 pages")
    assert replies[5] == "I could not download gone.pdf: it is gone from Slack."
    assert env.api.downloads == [f["id"] for f in files[2:5]]  # not the refused ones
    assert await env.world.runtime.memory.knowledge_base.papers(Scope(team)) == []


async def test_files_in_a_channel_or_a_thread_the_bot_is_not_in_are_left_alone(env):
    team = f"T{time.time_ns()}"
    pdf = env.api.add_file("x.pdf", shared_pdf())
    await env.slack.event(file_share([pdf], ts(40)), team=team)
    await env.slack.event(file_share([pdf], ts(41), thread_ts=ts(39)), team=team)
    await env.settle()
    assert env.api.downloads == [] and env.api.of("chat.postMessage") == []


async def test_the_event_without_file_details_is_completed_by_files_info(env):
    team = f"T{time.time_ns()}"
    await join_thread(env, team, "C1", 60)
    pdf = env.api.add_file("bare.pdf", shared_pdf("Bare"))
    await env.slack.event(
        file_share([{"id": pdf["id"]}], ts(61), thread_ts=ts(60)), team=team
    )  # some events carry the file's id only
    await env.settle()
    assert env.api.of("files.info")[-1]["file"] == pdf["id"]
    assert env.api.thread_texts("C1", ts(60))[-1].startswith("Saved *Bare*")


async def test_a_task_left_by_a_dead_consumer_is_finished_by_another(env, redis_url):
    team = f"T{time.time_ns()}"
    memory = env.world.runtime.memory
    await join_thread(env, team, "C1", 70)
    pdf = env.api.add_file("orphan.pdf", shared_pdf("Orphan"))
    scope = slack_scope(team, "C1", ts(70))
    stream_name = task_stream(f"pdf-test-{time.time_ns()}")
    dead = TaskStream(memory.redis, stream_name, consumer="dead")
    await dead.ensure_group()
    await dead.add(SHARED_FILES, {
        "platform": "slack", "scope": scope.to_dict(),
        "reply": {"channel": "C1", "thread_ts": ts(70)}, "share": f"slack:C1:{ts(71)}",
        "files": [{"id": pdf["id"], "name": "orphan.pdf", "mimetype": "application/pdf",
                   "size": len(env.api.files[pdf["id"]][1]), "url": pdf["url_private_download"],
                   "link": pdf["permalink"]}],
        "turn": None, "turn_event": "x",
    })  # fmt: skip
    assert len(await dead.read(10, 100)) == 1  # taken, then its process died
    runner = shared_files_for(env)
    alive = BackgroundWork(
        TaskStream(memory.redis, stream_name, consumer="alive"), {SHARED_FILES: runner.run},
        claim_idle_ms=200,
    )  # fmt: skip
    try:
        alive.start()
        await alive.drain()
    finally:
        await alive.close()
        await dead.destroy()
    assert env.api.thread_texts("C1", ts(70))[-1].startswith("Saved *Orphan*")
    assert "Orphan" in await found(env, scope)


def shared_files_for(env: Env) -> SharedFiles:
    memory = env.world.runtime.memory
    return SharedFiles(memory, encoding_for("gpt-5-mini"),
                       {"slack": SlackFileEnd("xoxb-test", env.api.base_url)},
                       max_bytes=50_000_000)  # fmt: skip


def test_the_runtime_wires_the_platforms_it_has_tokens_for(tmp_path):
    from app.settings import Settings

    settings = Settings(data_dir=tmp_path, slack_bot_token="xoxb-1", max_pdf_mb=2)
    wired = shared_files(settings, memory=type("M", (), {"redis": None})())
    assert set(wired.ends) == {"slack"} and wired.max_bytes == 2_000_000


async def test_ingestion_core_is_idempotent_and_refuses_oversized(memory, tenant):
    scope = Scope(tenant, "t1", channel="G1", visibility=Visibility.PRIVATE)
    data = shared_pdf("Core")
    shared = SharedFile("core.pdf", "https://example.com/core", "share-1")
    kb, encoding = memory.knowledge_base, encoding_for("gpt-5-mini")
    first = await save_shared_pdf(data, shared, scope, kb, memory.embedder, encoding, 10**7)
    assert not first.already and first.arxiv_id == shared_pdf_id(first_hash(data), "private:G1")
    redelivered = await save_shared_pdf(data, shared, scope, kb, memory.embedder, encoding, 10**7)
    assert not redelivered.already and redelivered.passages == first.passages
    other = SharedFile("core.pdf", "", "share-2")
    assert (await save_shared_pdf(data, other, scope, kb, memory.embedder, encoding, 10**7)).already
    with pytest.raises(IngestError, match=r"it is 0\.\d MB, and I read PDFs up to 0\.0 MB"):
        await save_shared_pdf(data, other, scope, kb, memory.embedder, encoding, 10)
    assert not await kb.has_paper(Scope(tenant), first.arxiv_id)  # not from a public place


def first_hash(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


# -- Discord --------------------------------------------------------------------------------------


async def test_a_discord_attachment_in_a_thread_is_read_and_then_the_question(env):
    world, rest, fake = env.world, env.discord_api, FakeDiscord()
    adapter = DiscordAdapter(world.runtime.turns(), sync=False)
    fake.attach(adapter.client)
    adapter.pipeline.recover_every = 0.1
    adapter.pipeline.start()
    world.model.script(text("The lemmas bound glacier entropy."))
    guild = fake.guild()
    thread = fake.thread(guild, owner_id=fake.bot.id)  # a thread the bot opened
    data = shared_pdf("Discord Paper")
    attachment = spec(
        discord.Attachment, id=fake.snowflake(), filename="paper.pdf",
        content_type="application/pdf", size=len(data),
        url=rest.attachment(thread.id, "paper.pdf", data),
    )  # fmt: skip
    image = spec(discord.Attachment, id=fake.snowflake(), filename="cat.png",
                 content_type="image/png", size=10, url="http://127.0.0.1:9/none")  # fmt: skip
    message = fake.message(thread, fake.user(), "what do the lemmas bound?")
    message.attachments = [image, attachment]
    message.jump_url = f"https://discord.com/channels/{guild.id}/{thread.id}/{message.id}"
    try:
        await adapter.handle_message(message)
        await world.runtime.harness.drain()
        deadline = time.monotonic() + 30
        while not fake.texts(thread.id) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await adapter.pipeline.wait_idle()
    finally:
        await adapter.pipeline.close()
    [progress] = rest.texts(thread.id)  # posted over REST, then edited
    assert re.fullmatch(r"Saved \*Discord Paper\* \(2 pages, \d+ passages\) to the knowledge "
                        r"base of this team\.", progress), progress  # fmt: skip
    assert fake.texts(thread.id) == ["The lemmas bound glacier entropy."]
    context = world.model_requests()[-1]["messages"][1]["content"]
    assert "glacier entropy" in context
    scope = Scope(str(guild.id), f"discord:{guild.id}:{thread.id}", str(thread.id))
    assert "Discord Paper" in await found(env, scope)
    [record] = await world.runtime.memory.knowledge_base.papers(scope)
    assert record["url"] == message.jump_url


async def test_shared_passages_know_their_page(memory, tenant):
    scope = Scope(tenant, "t2", channel="D3", visibility=Visibility.DM)
    shared = SharedFile("paged.pdf", "https://example.com/paged", "share-3")
    saved = await save_shared_pdf(shared_pdf("Paged"), shared, scope, memory.knowledge_base,
                                  memory.embedder, encoding_for("gpt-5-mini"), 10**7)  # fmt: skip
    vector = (await memory.embedder.embed([PHRASE]))[0]
    [hit, *_] = await memory.knowledge_base.search(scope, PHRASE, vector, k=1)
    assert hit.arxiv_id == saved.arxiv_id and hit.page == 2 and hit.audience == "dm:D3"


async def test_download_failures_are_said_in_words(env):
    from adapters.discord_files import DiscordFileEnd
    from tests.support.slack_api import INVALID_TOKEN

    pdf = env.api.add_file("private.pdf", shared_pdf())
    file = {"name": "private.pdf", "url": pdf["url_private_download"]}
    with pytest.raises(FetchError, match=r"sign-in page instead of private\.pdf: .*files:read"):
        await SlackFileEnd(INVALID_TOKEN, env.api.base_url).fetch(file, 10**7)
    with pytest.raises(FetchError, match=r"private\.pdf is over 0\.0 MB; I read PDFs up to"):
        await SlackFileEnd("xoxb-test", env.api.base_url).fetch(file, 100)
    expired = {"name": "old.pdf", "url": f"{env.discord_api.cdn_url}1/2/old.pdf"}
    with pytest.raises(FetchError, match="Discord no longer serves it"):
        await DiscordFileEnd(BOT_TOKEN, env.discord_api.base_url).fetch(expired, 10**7)
    unreachable = {"name": "x.pdf", "url": "http://127.0.0.1:9/x.pdf"}
    with pytest.raises(FetchError, match=r"I could not download x\.pdf from Discord"):
        await DiscordFileEnd(BOT_TOKEN).fetch(unreachable, 10**7)


# -- delivery: per-platform streams, redeliveries, failures that pass, messages that vanish ---


class StubEnd:
    """A platform side whose answers the test chooses (a FileEnd, not our code patched)."""

    def __init__(self, data: bytes = b"", fail_fetch: int = 0, edit_fails: bool = False) -> None:
        self.data, self.fail_fetch, self.edit_fails = data, fail_fetch, edit_fails
        self.posts: list[str] = []
        self.edits: list[tuple[str, str]] = []

    async def describe(self, file):
        return file

    async def fetch(self, file, max_bytes):
        if self.fail_fetch:
            self.fail_fetch -= 1
            raise FetchError("I could not download x.pdf: Slack took too long.", retryable=True)
        return self.data

    async def post(self, reply, text):
        self.posts.append(text)
        return str(len(self.posts))

    async def edit(self, reply, message, text):
        if self.edit_fails:
            raise RuntimeError("Discord answered 404: Unknown Message")
        self.edits.append((message, text))


def share_payload(scope: Scope, share: str, name: str = "x.pdf", turn: str | None = None,
                  platform: str = "slack") -> dict:  # fmt: skip
    reply = {"channel": scope.channel, "thread_ts": None}
    job = Job("turn", scope, turn, event_id=f"{share}:turn", reply=reply) if turn else None
    return {
        "platform": platform, "scope": scope.to_dict(), "reply": reply, "share": share,
        "files": [{"id": "F1", "name": name, "mimetype": "application/pdf", "size": 10,
                   "url": "http://127.0.0.1:9/x.pdf", "link": ""}],
        "turn": job.to_json() if job else None, "turn_event": f"{share}:turn",
    }  # fmt: skip


def stub_files(memory, end: StubEnd, **options) -> SharedFiles:
    """A SharedFiles over `end`; a failure that may pass is not tried again within the task
    unless `retry_delays` is given (tests/test_shared_files_retry.py): each run is one try."""
    options.setdefault("retry_delays", ())
    return SharedFiles(memory, encoding_for("gpt-5-mini"), {"slack": end},
                       max_bytes=10**7, **options)  # fmt: skip


async def test_a_redelivered_task_edits_its_own_message_instead_of_posting(memory, tenant):
    end = StubEnd(shared_pdf("Twice"))
    files = stub_files(memory, end)
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}")
    await files.one(payload)
    await files.one(payload)  # delivered again (its ack was lost)
    assert end.posts == ["_Reading x.pdf…_"]
    assert [m for m, _ in end.edits] == ["1", "1"] and end.edits[0][1] == end.edits[1][1]


async def test_a_pdf_whose_message_was_deleted_is_not_read(memory, tenant):
    """Deleted on the platform before its task ran (a share is named as its message is), the
    message's files are not read or saved, nothing is posted, and its text is not answered."""
    end = StubEnd(shared_pdf("Gone"))
    files = stub_files(memory, end)
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    share = f"slack:D1:{time.time_ns()}"
    await memory.governance.note_deleted(tenant, share)
    await files.one(share_payload(scope, share, turn="what does it say?"))
    assert end.posts == [] and end.edits == []
    assert await memory.knowledge_base.papers(scope) == []


async def test_a_share_being_read_is_not_read_again_at_once(memory, tenant):
    files = stub_files(memory, StubEnd(shared_pdf()))
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}")
    assert await files.progress.lock(tenant, payload["share"], "other", 60)
    with pytest.raises(ShareBusy):
        await files.one(payload)
    await files.progress.unlock(tenant, payload["share"], "other")
    await files.one(payload)


async def test_a_failure_that_may_pass_is_retried_then_said(memory, tenant):
    end = StubEnd(fail_fetch=10)
    files = stub_files(memory, end)
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}")
    for _ in range(MAX_DELIVERIES - 1):
        with pytest.raises(FetchError):
            await files.one(payload)  # the task stays pending: runs again
    await files.one(payload)  # the last delivery says it
    assert end.posts == ["_Reading x.pdf…_"]
    assert end.edits[-1][1] == (
        "I could not download x.pdf: Slack took too long. I tried several times; share it "
        "again later."
    )


async def test_a_failed_edit_posts_anew_and_still_queues_the_turn(env):
    team = f"T{time.time_ns()}"
    memory = env.world.runtime.memory
    env.world.model.script(text("Answered after the file."))
    end = StubEnd(shared_pdf("Vanished"), edit_fails=True)
    files = stub_files(memory, end)
    scope = Scope(team, thread_id(team, "D8", "dm"), channel="D8", visibility=Visibility.DM)
    await files.one(share_payload(scope, f"slack:D8:{time.time_ns()}", turn="and so?"))
    assert end.posts[0] == "_Reading x.pdf…_" and end.posts[1].startswith("Saved *Vanished*")
    await env.settle(until=lambda: env.api.thread_texts("D8", None))
    assert env.api.thread_texts("D8", None) == ["Answered after the file."]


async def test_a_task_for_a_platform_not_configured_waits_on_its_own_stream(memory, tenant):
    prefix = f"pdf-test-{time.time_ns()}"
    files = stub_files(memory, StubEnd(shared_pdf()), stream_prefix=prefix)
    with pytest.raises(LookupError):
        files.attach("discord")  # no Discord token in this process: never reads its stream
    files.attach("slack")
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    try:
        await files.submit("discord", share_payload(scope, "discord:1", platform="discord"))
        await files.submit("slack", share_payload(scope, f"slack:D1:{time.time_ns()}"))
        await files.drain()
        assert await files.stream("discord").pending_count() == 1  # for a Discord process
        assert await memory.redis.xlen(files.stream("slack").dead_stream) == 0
    finally:
        await files.close()
        await files.stream("discord").destroy()
        await files.stream("slack").destroy()


async def test_a_pdf_over_the_page_limit_is_refused(memory, tenant):
    scope = Scope(tenant, "t3", channel="D3", visibility=Visibility.DM)
    shared = SharedFile("long.pdf", "", "share-4")
    with pytest.raises(IngestError, match=r"long\.pdf: it has 2 pages, and I read up to 1\."):
        await save_shared_pdf(shared_pdf(), shared, scope, memory.knowledge_base,
                              memory.embedder, encoding_for("gpt-5-mini"), 10**7, max_pages=1)  # fmt: skip


async def test_slack_images_in_a_joined_thread_are_for_people_not_the_bot(env):
    team = f"T{time.time_ns()}"
    await join_thread(env, team, "C1", 80)
    before = len(env.api.of("chat.postMessage"))
    png = env.api.add_file("photo.png", b"\x89PNG\r\n", "image/png", "png", "PNG")
    await env.slack.event(file_share([png], ts(81), thread_ts=ts(80)), team=team)
    await env.settle()
    assert len(env.api.of("chat.postMessage")) == before  # nobody addressed the bot


async def test_a_discord_mention_with_only_an_image_is_answered_about_it(env):
    world, rest, fake = env.world, env.discord_api, FakeDiscord()
    adapter = DiscordAdapter(world.runtime.turns(), sync=False)
    fake.attach(adapter.client)
    guild = fake.guild()
    thread = fake.thread(guild, owner_id=fake.bot.id)
    image = spec(discord.Attachment, id=fake.snowflake(), filename="cat.png",
                 content_type="image/png", size=10, url="http://127.0.0.1:9/none")  # fmt: skip
    quiet = fake.message(thread, fake.user(), "")
    quiet.attachments = [image]  # in the bot's thread, not addressed: left alone
    await adapter.handle_message(quiet)
    asked = fake.message(thread, fake.user(), f"<@{fake.bot.id}>", mentions=[fake.bot])
    asked.attachments = [image]
    asked.jump_url = f"https://discord.com/channels/{guild.id}/{thread.id}/{asked.id}"
    try:
        await adapter.handle_message(asked)
        await world.runtime.files.drain()
    finally:
        await adapter.pipeline.close()
    assert rest.texts(thread.id) == ["I can read PDFs only; cat.png is an image (image/png)."]
    assert fake.texts(thread.id) == []  # no EMPTY_MENTION


async def test_forgetting_a_thread_or_a_person_forgets_the_private_pdfs_they_brought(
    memory, tenant
):
    encoding, kb = encoding_for("gpt-5-mini"), memory.knowledge_base
    here = Scope(tenant, "slack:T:G1:1", channel="G1", visibility=Visibility.PRIVATE)
    dm = Scope(tenant, "slack:T:D1:dm", channel="D1", visibility=Visibility.DM)
    team = Scope(tenant, "slack:T:C1:1", channel="C1")
    saved = {}
    for name, scope, sharer in (("thread", here, "U1"), ("dm", dm, "U2"), ("team", team, "U2")):
        shared = SharedFile(f"{name}.pdf", "", f"share-{name}", sharer=sharer)
        data = shared_pdf(f"Paper of the {name}")
        saved[name] = await save_shared_pdf(data, shared, scope, kb, memory.embedder, encoding,
                                            10**7)  # fmt: skip
    await memory.conversation.append(here, "user", "here is a paper")
    erasure = await memory.governance.forget_thread(tenant, here.thread)
    assert erasure.papers == 1 and not await kb.has_paper(here, saved["thread"].arxiv_id)
    erasure = await memory.governance.forget_person(tenant, "U2")
    assert erasure.papers == 1 and not await kb.has_paper(dm, saved["dm"].arxiv_id)
    assert await kb.has_paper(team, saved["team"].arxiv_id)  # the team's copy stays
    [record] = await kb.papers(team)
    assert record["sharer"] == "" and record["thread"] == team.thread  # unnamed, kept
