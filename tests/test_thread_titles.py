"""A thread's title on the memory page (the overview's list, the thread page's heading) is a
message its reader may see: a place turned private keeps its later messages from the readers
who saw it public, titles included."""

from __future__ import annotations

from memory.scope import PUBLIC, Scope, Visibility
from tests.support.memory_seed import say
from tests.test_memory_page import get, page_client, url

DAY = 1_700_000_000.0
SECRET = "Team G only: the narwhal acquisition closes Friday."


async def turned_private(memory, tenant: str) -> str:
    """A thread that started public, whose opener then forgot their first message, and whose
    channel turned private before Bob (a member of G1) spoke."""
    thread = f"slack:{tenant}:C5:500.1"
    public = Scope(tenant, thread, "C5", Visibility.PUBLIC, "U1", "Alice")
    private = Scope(tenant, thread, "G1", Visibility.PRIVATE, "U2", "Bob")
    opener = await say(memory, public, "user", "A harmless public opener.", DAY)
    await say(memory, public, "assistant", "Happy to help.", DAY + 1)
    await say(memory, private, "user", SECRET, DAY + 2)
    await memory.governance.forget_message(tenant, thread, opener.id)
    return thread


async def test_a_title_is_never_a_message_the_reader_may_not_see(memory, tenant):
    thread = await turned_private(memory, tenant)
    [listed] = await memory.browse.threads(tenant, (PUBLIC,))
    assert listed.audience == PUBLIC and listed.title == "(forgotten)"
    page = await memory.browse.thread(tenant, thread, (PUBLIC,))
    assert page is not None and page.thread.title == "(forgotten)"
    info = await memory.browse.thread_info(tenant, thread)  # no reader named: the thread's own
    assert info is not None and info.title == "(forgotten)"
    [member_listed] = await memory.browse.threads(tenant, (PUBLIC, "private:G1"))
    assert member_listed.title == SECRET  # a member of G1 may read it
    [admin_listed] = await memory.browse.threads(tenant, None)
    assert admin_listed.title == SECRET


async def test_the_pages_do_not_show_the_private_title_to_public_readers(memory, tenant):
    thread = await turned_private(memory, tenant)
    async with page_client(memory, tenant) as client:
        status, overview = await get(client, "/memory", "alice")
        assert status == 200 and url(thread).split("/")[-1] in overview
        assert "narwhal" not in overview
        status, thread_page = await get(client, url(thread), "alice")
        assert status == 200 and "narwhal" not in thread_page
        status, member_page = await get(client, url(thread), "bob")
        assert status == 200 and "narwhal" in member_page
