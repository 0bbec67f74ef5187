"""A walled person's turn (a guest: memory/scope.py `walled`) keeps its wall when it is learned
again after an edit: its turn record keeps whether it was walled (`TurnRecord.walled`), and
`scope_of` gives it back, so the edit's entity task runs with a walled scope, as the turn's did.
A record stored before that was kept reads as walled unless it was public (a walled scope is
never public; any other may have been a guest's).

Through the Slack adapter over real HTTP, a real Redis and the scripted model
(tests/test_slack_walls.py's world)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from adapters.slack import thread_id
from bot.harness import ARTIFACTS, ENTITY_INSTRUCTIONS
from memory.keys import turn_record_key
from memory.scope import Scope, Visibility, scope_of
from memory.stores.entity import Entity
from memory.stores.turn_records import TurnRecord
from tests.support.scripted_openai import text
from tests.support.slack_api import BOT_USER, mention
from tests.test_platform_edits import edited
from tests.test_slack_walls import GUEST, ts, walled_world

WAIT = 30.0
PUBLIC_FACT = "a satellite launch funded with 9 million"  # the team's, learned in public C2
GUESTS_FACT = "a guest's garden club in Zanzibar"
EDITED_FACT = "a guest's rowing club in Zanzibar"


@pytest.fixture
async def walled(redis_url, tmp_path):
    async with walled_world(redis_url, tmp_path) as env:
        yield env


def entity_calls(env) -> int:
    return sum(r["messages"][0]["content"] == ENTITY_INSTRUCTIONS for r in env.world.model.requests)


async def artifacts_scopes(env) -> list[dict]:
    """The scopes of the entity tasks in the harness's stream (read, not yet done)."""
    background = env.world.runtime.harness.background
    entries = await env.memory.redis.xrange(background.stream.stream)
    tasks = [{k.decode(): v.decode() for k, v in fields.items()} for _, fields in entries]
    return [json.loads(t["payload"])["scope"] for t in tasks if t["kind"] == ARTIFACTS]


async def test_a_guest_s_edited_question_is_learned_again_walled(walled):
    team = f"T{time.time_ns()}"
    public = Scope(team, thread_id(team, "C2", ts(1)), "C2", Visibility.PUBLIC, "U1", "Ada")
    await walled.memory.entities.upsert(public, [Entity("Zanzibar", "project", PUBLIC_FACT)])
    walled.world.entities = [{"name": "Zanzibar", "type": "club", "description": GUESTS_FACT}]
    walled.world.model.script(text("Zanzibar sounds lovely."))
    asked = mention("What is Zanzibar?", ts(2), channel="C1", user=GUEST)
    await walled.a.event(asked, team=team)
    await walled.settle()
    thread = thread_id(team, "C1", ts(2))
    [record] = await walled.memory.turn_records.of_thread(team, thread)
    assert record.audience == "private:C1" and record.walled is True
    assert scope_of(record).walled

    # the guest edits the question: its entities are learned again, held at the model
    release = asyncio.Event()
    walled.world.hold_entities = release
    walled.world.entities = [{"name": "Zanzibar", "type": "club", "description": EDITED_FACT}]
    before = entity_calls(walled)
    edit = edited(ts(2), f"<@{BOT_USER}> What is Zanzibar now?", asked["text"], user=GUEST)
    assert (await walled.a.event(edit, team=team)).status == 200
    try:
        async with asyncio.timeout(WAIT):
            while entity_calls(walled) == before:
                await asyncio.sleep(0.05)
        [learning] = await artifacts_scopes(walled)
    finally:
        release.set()
    assert (learning["thread"], learning["user"]) == (thread, GUEST)
    assert learning["walled"] is True  # read as the guest's turn was: its place's memory only
    await walled.settle()

    guest = Scope(team, thread, "C1", Visibility.PRIVATE, GUEST, walled=True)
    learned = await walled.memory.entities.all(guest)
    assert [(e.name, e.description) for e in learned] == [("Zanzibar", EDITED_FACT)]
    team_sees = await walled.memory.entities.all(Scope(team, channel="C2", user="U1"))
    assert {e.description for e in team_sees} == {PUBLIC_FACT}


async def test_a_record_from_before_walls_were_kept_is_walled_unless_public(memory, tenant):
    records = memory.turn_records
    for turn, audience in (("r-public", "public"), ("r-private", "private:C1"), ("r-dm", "dm:D1")):
        await records.save(TurnRecord(turn, tenant, f"t-{turn}", "q", "a", audience=audience,
                                      channel="C1", asker="U1", walled=False))  # fmt: skip
        await memory.redis.hdel(turn_record_key(tenant, turn), "walled")  # as stored before
    found = await records.get_many(tenant, ["r-public", "r-private", "r-dm"])
    assert {turn: r.walled for turn, r in found.items()} == dict.fromkeys(found, None)
    walls = {turn: scope_of(r).walled for turn, r in found.items()}
    assert walls == {"r-public": False, "r-private": True, "r-dm": True}

    await records.save(TurnRecord("r-member", tenant, "t-m", "q", "a", audience="private:C1",
                                  channel="C1", asker="U1", walled=False))  # fmt: skip
    member = await records.get(tenant, "r-member")
    assert member.walled is False and not scope_of(member).walled
    assert scope_of(member).audiences == ("public", "private:C1")
