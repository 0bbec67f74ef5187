"""A share given up unrun (adapters/shared_files.py `given_up`, the dead-letter hook) whose file
had no message yet says its outcome once: the hook tried again (bot/spent_tasks.py
HOOK_DELIVERIES) edits the message it posted, never posts a second one."""

from __future__ import annotations

import time

from adapters.shared_files import went_wrong
from memory.scope import Scope, Visibility
from tests.test_shared_pdfs import StubEnd, share_payload, stub_files


async def test_a_hook_tried_again_edits_the_message_it_posted(memory, tenant):
    end = StubEnd()
    files = stub_files(memory, end)
    scope = Scope(tenant, "t", channel="D1", visibility=Visibility.DM)
    payload = share_payload(scope, f"slack:D1:{time.time_ns()}")
    await files.given_up(payload)
    await files.given_up(payload)  # the hook again (its first run failed after posting)
    assert end.posts == [went_wrong("x.pdf")]
    assert end.edits == [("1", went_wrong("x.pdf"))]
