"""`search_conversations(author=...)`: the tool says "their name or user id"; both find the
person's messages, and the place's privacy filter still holds."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.tools import ToolContext, search_conversations
from memory.scope import Scope, Visibility
from memory.stores.episodic import Episode

START = datetime(2024, 3, 1, 9, tzinfo=UTC).timestamp()
SAID = "The quarterly budget review moves to the big room."


def _said(i: int, author: str, name: str, thread: str, audience: str = "public") -> Episode:
    return Episode(
        id=f"m-{i}", thread=thread, channel=thread.removeprefix("t-"), audience=audience,
        author=author, author_name=name, text=f"{SAID} ({i})", ts=START + i * 60, seq=i,
    )  # fmt: skip


async def test_search_conversations_finds_a_person_by_user_id_and_by_name(memory, tenant):
    await memory.episodes.add(
        Scope(tenant),
        [
            _said(0, "U0ANA", "Ana Lima", "t-general"),
            _said(1, "U0BEN", "Ben Okafor", "t-general"),
            _said(2, "U0ANA", "Ana Lima", "t-general"),
            _said(3, "U0ANA", "Ana Lima", "t-secret", audience="private:secret"),
        ],
    )
    scope = Scope(tenant, "t-general", channel="general", visibility=Visibility.PUBLIC)
    ctx = ToolContext(scope, memory, arxiv=None, consolidator=None, encoding=None)  # type: ignore[arg-type]

    async def by(author: str) -> str:
        return await search_conversations(ctx, "budget review", author=author, k=10)

    for person in ["U0ANA", "Ana Lima", "ana", "@Ana", "<@U0ANA>"]:
        found = await by(person)
        assert "(0)" in found and "(2)" in found, (person, found)
        assert "(1)" not in found, person  # Ben's
        assert "(3)" not in found, person  # said in a private channel this place cannot see
    assert "(1)" in await by("Ben Okafor") and "(0)" not in await by("Ben Okafor")
    assert await by("Cem") == "No matching messages."
    assert await by("Ana Okafor") == "No matching messages."  # every word of the name
