"""Slack's App Home lists a thread's summaries only where the person may see each one, as the
memory page decides it: a guest's words in a public channel are that channel's own memory
(`private:C1`), and so is a summary over them, even in a thread the person may see. When
Slack's directory cannot say who the person is: public summaries unless they are a guest, and
their own DM's summaries in their DM; a thread whose summaries are all hidden says so, not
that it has none."""

from __future__ import annotations

import json

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from adapters.memory_page.access import DirectoryError
from adapters.memory_page.pages import Pages
from adapters.memory_page.viewer import Viewer
from adapters.slack_delivery import DM
from adapters.slack_home import SUMMARIES_ELSEWHERE, SlackHome
from adapters.slack_walls import SlackWalls
from memory.scope import NOWHERE, PUBLIC, Scope, Visibility
from memory.stores.summary import Summary
from tests.support.memory_seed import say
from tests.support.slack_api import MockSlackApi

THREAD_TS = "100.1"
PUBLIC_NOTE = "Carol asked about MemGPT"
GUEST_NOTE = "Guest said the Initech deal closes Friday"
NOWHERE_NOTE = "Two places met over the Hooli merger"
DM_NOTE = "Frank asked for his reading list"
NO_SUMMARIES = "no summaries yet"


class People:
    """A directory that knows the people a test names and fails for anyone else (as Slack's
    does when it cannot be reached)."""

    def __init__(self, *viewers: Viewer) -> None:
        self.known = {v.user: v for v in viewers}

    async def viewer(self, tenant: str, user: str, platform: str) -> Viewer:
        if user not in self.known:
            raise DirectoryError("Slack cannot be reached right now.")
        return self.known[user]


async def seed(memory, tenant: str) -> str:
    """A thread of public C1 with a summary of Carol's words (public) and one of a guest's
    (C1's own); Carol, Dave and Erin have each spoken in it."""
    thread = f"slack:{tenant}:C1:{THREAD_TS}"
    carol = Scope(tenant, thread, "C1", Visibility.PUBLIC, "U3", "Carol")
    guest = Scope(tenant, thread, "C1", Visibility.PUBLIC, "W9", "Guest", walled=True)
    asked = await say(memory, carol, "user", "What is MemGPT?", 1_700_000_000.0)
    told = await say(memory, guest, "user", "Our Initech deal closes Friday", 1_700_000_010.0)
    await memory.summaries.save(carol, Summary(thread, PUBLIC_NOTE, "MemGPT?", [asked.id]))
    await memory.summaries.save(guest, Summary(thread, GUEST_NOTE, "Initech.", [told.id]))
    hooli = Summary(thread, NOWHERE_NOTE, "Hooli.", [asked.id], audience=NOWHERE)
    await memory.summaries.save(carol, hooli)
    for user in ("U3", "U4", "U5"):
        await memory.presence.join(Scope(tenant, thread, "C1", user=user), THREAD_TS)
    return thread


async def home_of(
    memory, tenant: str, user: str, people: People, walls: SlackWalls | None = None
) -> str:
    home = SlackHome(memory, client=None, links=None, directory=people, walls=walls)
    return json.dumps(await home.view(tenant, user))


async def page_notes(memory, thread: str, viewer: Viewer) -> list[str]:
    """The descriptions of the thread's summaries its memory page shows `viewer`."""
    page = await memory.browse.thread(viewer.tenant, thread, Pages.seen(viewer))
    return sorted(s.description for s in page.summaries)


@pytest.fixture
async def api():
    api = MockSlackApi()
    await api.start()
    yield api
    await api.close()


async def test_home_hides_a_summary_of_a_channel_s_own_memory_from_someone_outside_it(
    memory, tenant
):
    thread = await seed(memory, tenant)
    # Carol has left C1 since: she may see the team's public memory only
    carol = Viewer(tenant, "U3", "slack", False, frozenset({PUBLIC}), "Carol")
    view = await home_of(memory, tenant, "U3", People(carol))
    assert "<#C1>" in view and PUBLIC_NOTE in view
    assert "Initech" not in view and "Hooli" not in view
    # the memory page, by the same rule, does not show it either
    assert await page_notes(memory, thread, carol) == [PUBLIC_NOTE]
    await memory.drop_tenant(tenant)


async def test_home_shows_a_member_of_the_channel_its_own_memory_s_summaries(memory, tenant):
    await seed(memory, tenant)
    dave = Viewer(tenant, "U4", "slack", False, frozenset({PUBLIC, "private:C1"}), "Dave")
    view = await home_of(memory, tenant, "U4", People(dave))
    assert PUBLIC_NOTE in view and GUEST_NOTE in view
    assert "Hooli" not in view  # of two places: no place's members see it
    await memory.drop_tenant(tenant)


async def test_home_shows_an_admin_every_summary_as_the_memory_page_does(memory, tenant):
    thread = await seed(memory, tenant)
    admin = Viewer(tenant, "U4", "slack", True, frozenset({PUBLIC}), "Dave")
    view = await home_of(memory, tenant, "U4", People(admin))
    assert PUBLIC_NOTE in view and GUEST_NOTE in view and NOWHERE_NOTE in view
    assert await page_notes(memory, thread, admin) == sorted(
        [PUBLIC_NOTE, GUEST_NOTE, NOWHERE_NOTE]
    )
    await memory.drop_tenant(tenant)


async def test_home_shows_only_public_summaries_when_the_viewer_cannot_be_asked(memory, tenant):
    await seed(memory, tenant)
    view = await home_of(memory, tenant, "U5", People())  # Slack does not answer for Erin
    assert "Private channels are left out for now" in view
    assert "<#C1>" in view and PUBLIC_NOTE in view
    assert "Initech" not in view and "Hooli" not in view
    await memory.drop_tenant(tenant)


async def test_home_shows_a_person_their_own_dm_s_summaries_when_the_viewer_cannot_be_asked(
    memory, tenant
):
    """The person's DM is their own: its summaries are theirs, whatever Slack's directory."""
    thread = f"slack:{tenant}:DU6:{DM}"
    frank = Scope(tenant, thread, "DU6", Visibility.DM, "U6", "Frank")
    asked = await say(memory, frank, "user", "What should I read next?", 1_700_000_000.0)
    await memory.summaries.save(frank, Summary(thread, DM_NOTE, "Reading.", [asked.id]))
    await memory.presence.join(frank, DM)
    view = await home_of(memory, tenant, "U6", People())  # Slack does not answer for Frank
    assert "Private channels are left out for now" in view
    assert "Our direct messages" in view and DM_NOTE in view
    assert NO_SUMMARIES not in view
    await memory.drop_tenant(tenant)


async def test_home_shows_a_guest_no_public_summary_and_says_where_they_are(memory, tenant, api):
    """A guest is shown no public memory on the memory page: nor here when the directory
    cannot say who they are (Slack's users.info can); the thread's summaries are hidden,
    and the tab does not say it has none."""
    await seed(memory, tenant)
    api.users["U5"] = "Erin"
    api.guests.add("U5")
    walls = SlackWalls(AsyncWebClient(token="xoxb-test", base_url=api.base_url))
    view = await home_of(memory, tenant, "U5", People(), walls)
    assert "<#C1>" in view
    assert "MemGPT" not in view and "Initech" not in view and "Hooli" not in view
    assert SUMMARIES_ELSEWHERE in view and NO_SUMMARIES not in view
    await memory.drop_tenant(tenant)
