"""What an erasure that finds little says: a person whose messages retention already took
still had a watch, which goes and is counted (not "no such person"); a tenant id with no
memory (a typo) is an error, as an unknown id is, not "Forgot tenant 'x'. Removed: nothing."."""

from __future__ import annotations

import time
import uuid

import pytest

from memory.governance import NotFound
from memory.scope import Scope, Visibility
from memory.stores.watches import WatchStore
from tests.test_cli_memory import arxivscout

DAY = 86_400
LATER = time.time() + 1000 * DAY  # never due while the test runs


async def test_a_person_with_only_a_watch_left_is_found(memory, tenant):
    store = WatchStore(memory.redis)
    dm = Scope(tenant, "dm-u1", channel="D1", user="U1", visibility=Visibility.DM)
    made = await store.create(dm, "diffusion models", DAY, platform="slack", channel="D1",
                              now=LATER)  # fmt: skip

    erasure = await memory.governance.forget_person(tenant, "U1")

    assert erasure.watches == 1 and erasure.total == 1
    assert await store.get(tenant, made.id) is None
    with pytest.raises(NotFound):  # nothing of theirs is left
        await memory.governance.forget_person(tenant, "U1")


async def test_forgetting_a_tenant_that_holds_nothing_says_so(memory, capsys):
    typo = f"t-{uuid.uuid4().hex[:10]}"
    code, out, err = await arxivscout(capsys, "memory", "forget", "tenant", typo, "--yes")
    assert code == 2
    assert f"tenant {typo!r} holds no memory" in err and "Forgot" not in out
