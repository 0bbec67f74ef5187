"""Slack's App Home lists a thread's summaries only where the person may see each one, as the
memory page decides it: a guest's words in a public channel are that channel's own memory
(`private:C1`), and so is a summary over them, even in a thread the person may see."""

from __future__ import annotations

import json

from adapters.memory_page.access import DirectoryError
from adapters.memory_page.viewer import Viewer
from adapters.slack_home import SlackHome
from memory.scope import PUBLIC, Scope, Visibility
from memory.stores.summary import Summary
from tests.support.memory_seed import say

THREAD_TS = "100.1"
PUBLIC_NOTE = "Carol asked about MemGPT"
GUEST_NOTE = "Guest said the Initech deal closes Friday"


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
    for user in ("U3", "U4", "U5"):
        await memory.presence.join(Scope(tenant, thread, "C1", user=user), THREAD_TS)
    return thread


async def home_of(memory, tenant: str, user: str, people: People) -> str:
    home = SlackHome(memory, client=None, links=None, directory=people)
    return json.dumps(await home.view(tenant, user))


async def test_home_hides_a_summary_of_a_channel_s_own_memory_from_someone_outside_it(
    memory, tenant
):
    thread = await seed(memory, tenant)
    # Carol has left C1 since: she may see the team's public memory only
    carol = Viewer(tenant, "U3", "slack", False, frozenset({PUBLIC}), "Carol")
    view = await home_of(memory, tenant, "U3", People(carol))
    assert "<#C1>" in view and PUBLIC_NOTE in view
    assert "Initech" not in view
    # the memory page, by the same rule, does not show it either
    page = await memory.browse.thread(tenant, thread, carol.audiences)
    assert [s.description for s in page.summaries if carol.can_see(s.audience)] == [PUBLIC_NOTE]
    await memory.drop_tenant(tenant)


async def test_home_shows_a_member_of_the_channel_its_own_memory_s_summaries(memory, tenant):
    await seed(memory, tenant)
    dave = Viewer(tenant, "U4", "slack", False, frozenset({PUBLIC, "private:C1"}), "Dave")
    view = await home_of(memory, tenant, "U4", People(dave))
    assert PUBLIC_NOTE in view and GUEST_NOTE in view
    await memory.drop_tenant(tenant)


async def test_home_shows_only_public_summaries_when_the_viewer_cannot_be_asked(memory, tenant):
    await seed(memory, tenant)
    view = await home_of(memory, tenant, "U5", People())  # Slack does not answer for Erin
    assert "Private channels are left out for now" in view
    assert "<#C1>" in view and PUBLIC_NOTE in view
    assert "Initech" not in view
    await memory.drop_tenant(tenant)
