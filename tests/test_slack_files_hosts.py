"""The bot token goes to Slack's file host only: a file kept outside Slack (Google Drive, a link
an app added with files.remote.add, maybe from another organisation in a Slack Connect channel)
or one whose address is elsewhere is declined before any request, a redirect away from the
file host is not followed, and the question sent with the file is answered all the same
(adapters/slack_files.py, adapters/shared_files.py). Against the local Slack of tests/support
and a second local server standing for the other host."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

from adapters.shared_files import FetchError
from adapters.slack import thread_id
from adapters.slack_files import FileHost, SlackFileEnd
from memory.scope import Scope, Visibility
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, file_share
from tests.test_shared_pdfs import Env, join_thread, shared_pdf, shared_world, ts

DRIVE_REFUSAL = (
    "I cannot read notes.pdf: it is kept outside Slack (in Google Drive), and I read only PDFs "
    "uploaded to Slack. Upload the PDF itself to Slack and I will read it."
)


class OtherHost:
    """A host that is not Slack's file host (a third-party service, an internal address):
    every request that reaches it is kept, with its headers."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.url = ""

    async def start(self) -> None:
        async def answer(request: web.Request) -> web.Response:
            self.requests.append((request.path, dict(request.headers)))
            return web.Response(body=shared_pdf("Elsewhere"), content_type="application/pdf")

        app = web.Application()
        app.router.add_get("/{tail:.*}", answer)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}/"

    def authorizations(self) -> list[str]:
        return [h["Authorization"] for _, h in self.requests if "Authorization" in h]


@pytest.fixture
async def env(redis_url, tmp_path) -> AsyncIterator[Env]:
    async with shared_world(redis_url, tmp_path) as env:
        yield env


@pytest.fixture
async def other() -> AsyncIterator[OtherHost]:
    host = OtherHost()
    await host.start()
    yield host
    await host.runner.cleanup()


async def test_a_google_drive_pdf_is_declined_unasked_and_the_question_answered(env, other):
    team = f"T{time.time_ns()}"
    env.world.model.script(text("Send me the PDF itself."))
    drive = env.api.add_remote_file(
        "notes.pdf", f"{other.url}file/d/1abc/view", "application/pdf", "pdf", "gdrive"
    )
    event = file_share([drive], ts(1), text="what does it say?", channel="D5", channel_type="im")
    await env.slack.event(event, team=team)
    await env.settle(until=lambda: len(env.world.model_requests()) == 1)
    await env.settle()

    assert other.authorizations() == [] and other.requests == []  # no token, no request
    texts = env.api.thread_texts("D5", None)
    assert texts == [DRIVE_REFUSAL, "Send me the PDF itself."]  # said, then the question
    assert env.api.downloads == []
    dm = Scope(team, thread_id(team, "D5", "dm"), channel="D5", visibility=Visibility.DM)
    assert await env.world.runtime.memory.knowledge_base.papers(dm) == []


async def test_a_remote_file_with_no_type_in_a_joined_thread_is_declined_unasked(env, other):
    team = f"T{time.time_ns()}"
    await join_thread(env, team, "C1", 10)
    # files.remote.add with an internal address; no declared type, a name that looks a PDF's
    internal = env.api.add_remote_file("report.pdf", f"{other.url}admin/report.pdf")
    await env.slack.event(file_share([internal], ts(11), thread_ts=ts(10)), team=team)
    await env.settle()
    assert other.authorizations() == [] and other.requests == []
    assert env.api.thread_texts("C1", ts(10))[-1] == (
        "I cannot read report.pdf: it is kept outside Slack, and I read only PDFs uploaded to "
        "Slack. Upload the PDF itself to Slack and I will read it."
    )


async def test_a_file_whose_address_is_off_slacks_file_host_is_refused_unasked(env, other):
    team = f"T{time.time_ns()}"
    env.world.model.script(text("Answered anyway."))
    pdf = env.api.add_file("odd.pdf", shared_pdf("Odd"))
    pdf["url_private_download"] = pdf["url_private"] = f"{other.url}odd.pdf"  # not flagged
    event = file_share([{"id": pdf["id"]}], ts(20), text=f"<@{BOT_USER}> and?")
    await env.slack.event(event, team=team)  # its details come from files.info
    await env.settle(until=lambda: len(env.world.model_requests()) == 1)
    await env.settle()
    assert other.authorizations() == [] and other.requests == []
    assert env.api.thread_texts("C1", ts(20)) == [
        "I could not download odd.pdf: its address is not on Slack's file host, and I download "
        "only from there. Upload the PDF itself to Slack and I will read it.",
        "Answered anyway.",
    ]
    # the download itself refuses such an address, whatever the file's details say
    end = SlackFileEnd("xoxb-test", env.api.base_url)
    for address in (f"{other.url}odd.pdf", "https://files.slack.com/x.pdf"):
        with pytest.raises(FetchError, match="not on Slack's file host"):
            await end.fetch({"name": "odd.pdf", "url": address}, 10**7)
    assert other.requests == [] and env.api.downloads == []


async def test_a_redirect_is_followed_on_the_file_host_only(env, other):
    team = f"T{time.time_ns()}"
    await join_thread(env, team, "C1", 30)
    moved = env.api.add_file("moved.pdf", b"")
    served = env.api.add_file("served.pdf", shared_pdf("Moved Here"))
    env.api.redirects[moved["id"]] = served["url_private_download"]  # on the file host: followed
    away = env.api.add_file("away.pdf", shared_pdf("Away"))
    env.api.redirects[away["id"]] = f"{other.url}internal"  # elsewhere: not followed
    mention = f"<@{BOT_USER}>"
    await env.slack.event(file_share([moved, away], ts(31), mention, thread_ts=ts(30)), team=team)
    await env.settle()
    assert other.requests == []  # not followed there, with the token or without it
    replies = env.api.thread_texts("C1", ts(30))[-2:]
    assert replies[0].startswith("Saved *Moved Here*")  # an ordinary Slack-hosted PDF is read
    assert replies[1] == (
        "I could not download away.pdf: Slack sent me away from its file host, and I do not "
        "follow that."
    )
    assert env.api.downloads == [served["id"]]
    # Slack's sign-in page (no files:read) is said as such, and not asked either
    env.api.redirects[away["id"]] = "https://test.slack.com/?redir=%2Ffiles-pri"
    with pytest.raises(FetchError, match=r"sign-in page instead of away\.pdf: .*files:read"):
        await SlackFileEnd("xoxb-test", env.api.base_url).fetch(
            {"name": "away.pdf", "url": away["url_private_download"]}, 10**7
        )


def test_the_file_host_is_slacks_or_the_configured_api_bases_own():
    slack = FileHost(None)  # Slack's API: its files come from files.slack.com, over https
    assert slack.holds("https://files.slack.com/files-pri/T1-F1/download/a.pdf")
    assert slack.holds("https://files.slack.com:443/files-pri/T1-F1/a.pdf")
    for elsewhere in (
        "http://files.slack.com/files-pri/T1-F1/a.pdf", "https://files.slack.com.evil.test/a",
        "https://files.slack.com@evil.test/a", "https://user@files.slack.com/a",
        "https://files.slack.com:8443/a", "https://slack.com/a", "https://drive.google.com/a",
        "http://169.254.169.254/latest/meta-data", "files.slack.com/a", "", "not a url",
    ):  # fmt: skip
        assert not slack.holds(elsewhere), elsewhere
    gov = FileHost("https://slack-gov.com/api/")  # GovSlack
    assert gov.holds("https://files.slack-gov.com/files-pri/T1-F1/a.pdf")
    assert not gov.holds("https://files.slack.com/files-pri/T1-F1/a.pdf")
    local = FileHost("http://127.0.0.1:8123/api/")  # SLACK_API_URL: a Slack of our own
    assert local.holds("http://127.0.0.1:8123/files-pri/T1-F1/a.pdf")
    assert not local.holds("http://127.0.0.1:8124/files-pri/T1-F1/a.pdf")
    assert not local.holds("https://files.slack.com/files-pri/T1-F1/a.pdf")
