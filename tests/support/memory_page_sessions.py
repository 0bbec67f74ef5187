"""A memory page session as a test handles it, for the page's tests (tests/test_memory_access.py,
tests/test_memory_page_signin.py): which session a browser holds, and its viewer made due to be
asked again without waiting minutes for it."""

from __future__ import annotations

from aiohttp.test_utils import TestClient

from adapters.memory_page.server import SESSION_COOKIE, VIEWER_REFRESH_SECONDS
from memory.web_sessions import WebState


def session_of(client: TestClient) -> str:
    """The session the client's browser holds (its session cookie)."""
    return client.session.cookie_jar.filter_cookies(client.make_url("/memory"))[
        SESSION_COOKIE
    ].value


async def due_to_ask_again(memory, session: str) -> None:
    """The session's record says who its viewer is was asked longer ago than the page keeps
    that answer: its next request asks the directory again (as a few minutes later would)."""
    sessions = WebState(memory.redis).sessions
    record = await sessions.get(session)
    record["resolved_at"] -= VIEWER_REFRESH_SECONDS + 1
    assert await sessions.update(session, record)
