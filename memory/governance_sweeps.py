"""Erasures that sweep a tenant's whole memory: one person, across every store (`person`), and
what is older than the retention period (`expiry`, then `expire`). Both find what to erase,
then leave the messages and threads to `ThreadEraser` (memory/governance_threads.py). The
caller holds the tenant's erasure lock (`Governance._exclusive`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from redisvl.query import FilterQuery
from redisvl.query.filter import FilterExpression, Tag

from memory.dead_letters import Forgotten
from memory.dm_people import DmAuthors
from memory.governance_erasure import Erasure, NotFound
from memory.governance_learned import mark_forgotten
from memory.governance_purge import Purge
from memory.governance_threads import ThreadEraser, Threads
from memory.keys import dm_people_key, tenant_key, threads_key
from memory.scope import Scope, TenantKind, legacy_audience, tenant_kind
from memory.stores.base import VectorStore, decode, delete_keys
from memory.stores.conversation import Message
from memory.stores.entity import Entity
from memory.stores.watches import WatchStore

PAGE = 1000  # records found (and deleted) per search
SCAN_COUNT = 10_000

# Delete the DM places (ARGV[2..]) of the DM-people hash (KEYS[1], `dm_people_key`) that still
# name the person ARGV[1]: not one recorded as someone else's. An append of theirs meanwhile
# wrote the same name: `Sweeps._record_spoken_again` records its place again.
_FORGET_DM_PLACES = """
local removed = 0
for i = 2, #ARGV do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[1] then
    removed = removed + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return removed
"""


async def delete_where(
    store: VectorStore, tenant: str, where: FilterExpression, fields: list[str]
) -> list[dict[str, Any]]:
    """Delete a vector store's records that match `where`, a page at a time; the rows."""
    if str(where).strip() in ("", "*"):  # redisvl's rendering of a tag filter on ""
        raise ValueError(f"refusing to delete every record of {tenant}: the filter is empty")
    deleted: list[dict[str, Any]] = []
    while True:
        query = FilterQuery(filter_expression=where, return_fields=fields, num_results=PAGE)
        rows = await store._run(tenant, query)
        rows = [r for r in rows if r["id"].startswith(store.key_prefix(tenant))]
        if not rows or not await delete_keys(store.redis, [r["id"] for r in rows]):
            return deleted
        deleted += rows


@dataclass
class Expiry:
    """What a retention sweep found: the threads as read (`lists`), those whose every message
    is older than `cutoff` (`whole`) and those with some older ones (`partly`); once expired,
    the whole ones that went (`dropped`: not those that grew meanwhile)."""

    cutoff: float
    lists: Threads
    whole: list[str]
    partly: list[str]
    dropped: list[str] = field(default_factory=list)


class Sweeps:
    def __init__(self, memory: Any, threads: ThreadEraser, purge: Purge) -> None:
        self.memory = memory
        self.redis = memory.redis
        self.threads = threads
        self.purge = purge
        self._forget_dm_places = memory.redis.register_script(_FORGET_DM_PLACES)

    async def person(self, tenant: str, user: str) -> Erasure:
        """Erase one person (a platform user id) from every store of the tenant: each message
        they wrote (a tombstone), their DM threads whole, the summaries over their messages
        (rewritten without them), the tool logs of their turns (by the log's author; a log from
        before authors were kept belongs to the turn of the latest question said before it),
        episodic entries, the entities and workflows whose authors include them or that were
        learned in their DMs (the whole record: a merged description cannot be taken apart),
        the watches made in their DMs (which would keep posting to them), the dead letters of
        tasks that name them, and the cached vectors of all those texts. Not what others said
        about them, nor the assistant's answers to them outside their DMs. Their DM places are
        known by the record appends keep (`_dm_places`), or, for a Discord person, by their DM
        tenant (`dm-<user>`): a DM thread goes whole even where only tombstones of their
        messages remain. `NotFound` when nothing is theirs."""
        threads = [t for t, _ in await self.memory.conversation.threads(tenant)]
        lists = await self.threads.read(tenant, threads)

        def theirs(m: Message) -> bool:
            return m.role == "user" and m.author == user and not m.forgotten

        spoke = {t for t in lists if any(map(theirs, lists.messages(t)))}
        place = {t: _audience(lists.messages(t)[0], t) for t in lists if lists.messages(t)}
        own = await self._dm_places(tenant, user, lists)
        whole_tenant = tenant == f"dm-{user}" and tenant_kind(tenant) is TenantKind.DISCORD_DM
        dms = {t for t in lists if whole_tenant or place.get(t, "") in own}
        dms |= {t for t in spoke if place[t].startswith("dm:")}
        own |= {place[t] for t in dms if t in place}
        others = lists.only(spoke - dms)
        logs = await self._tool_logs_of(tenant, others, user)
        asked = [m.id for t in spoke for m in filter(theirs, lists.messages(t))]  # before they go
        # their logs' copies (by `read_tool_log` calls), then their logs, then their messages:
        # a retry after a failure finds the logs by the messages still there, and their copies
        read_back = [i for ids in logs.values() for i in ids]
        erasure = Erasure(tool_logs=await self.memory.tool_logs.forget_showing(tenant, read_back))
        erasure += Erasure(tool_logs=await self.memory.tool_logs.remove(tenant, logs))
        erasure += await self.threads.erase_threads(tenant, lists.only(dms))
        erasure += await self.threads.forget_messages(tenant, others, theirs)
        erasure += await self._forget_learned(tenant, user, own)
        await mark_forgotten(self.redis, tenant, asked)  # what they taught went above
        await self._forget_last_threads(tenant, user)
        watches = WatchStore(self.redis)
        await watches.remove_in(tenant, own)
        await self.threads.drop_dead_letters(Forgotten(tenant, people=frozenset({user})))
        if own:  # last: a run again after a failure still finds their DMs
            await self._forget_dm_places(keys=[dm_people_key(tenant)], args=[user, *sorted(own)])
            await self._record_spoken_again(tenant, user, own, set(lists) - dms)
        if not erasure.total and not spoke and not dms:
            raise NotFound("person", user)
        return erasure

    async def expiry(self, tenant: str, cutoff: float) -> Expiry:
        """What a retention sweep finds: every thread, read; which go whole and which in part.
        `expire` then forgets what was said before `cutoff` (seconds since the epoch): messages
        (tombstones), summaries over them (rewritten), tool logs (and the later logs that read
        one back), episodic entries, cached vectors, the dead letters of tasks queued before it
        (or carrying older messages); a thread whose every message is older goes whole."""
        listed = await self.redis.zrange(threads_key(tenant), 0, -1, withscores=True)
        lists = await self.threads.read(tenant, [decode(t) for t, _ in listed])
        last = {decode(t): score for t, score in listed}
        whole, partly = [], []
        for thread in lists:
            stamps = [m.timestamp for m in lists.messages(thread)]
            if max(stamps, default=last[thread]) < cutoff:
                whole.append(thread)
            elif stamps and min(stamps) < cutoff:
                partly.append(thread)
        return Expiry(cutoff, lists, whole, partly)

    async def expire(self, tenant: str, expiry: Expiry) -> Erasure:
        """Erase what `expiry` found. A whole thread that changed since it was read (a message
        appended meanwhile: no lock keeps appends out) keeps what is new; its old messages
        are forgotten one by one."""
        lists, cutoff = expiry.lists, expiry.cutoff

        def old(m: Message) -> bool:
            return m.timestamp < cutoff and not m.forgotten

        def questions() -> set[str]:  # read before they are forgotten
            return {m.id for t in lists for m in lists.messages(t) if m.role == "user" and old(m)}

        asked = questions()
        erasure, grown = await self.threads.erase_unchanged(tenant, lists.only(expiry.whole))
        kept = set(grown)
        expiry.dropped = [t for t in expiry.whole if t not in kept]
        if grown:
            lists.update(await self.memory.conversation.raw_threads(tenant, grown))
            asked |= questions()
        erasure += await self.threads.forget_messages(
            tenant, lists.only([*expiry.partly, *grown]), old
        )
        await mark_forgotten(self.redis, tenant, list(asked))  # retention keeps what they taught
        store = self.memory.tool_logs
        logs = await store.listed(tenant, (set(lists) - set(expiry.whole)) | set(grown))
        expired = {t: [i for i, at in rows if at < cutoff] for t, rows in logs.items()}
        await self.threads.drop_dead_letters(Forgotten(tenant, before=cutoff))
        # their copies (by `read_tool_log`) first: the next sweep finds what a failure left
        read_back = [i for ids in expired.values() for i in ids]
        erasure += Erasure(tool_logs=await store.forget_showing(tenant, read_back))
        return erasure + Erasure(tool_logs=await store.remove(tenant, expired))

    # -- a person's other traces -----------------------------------------------------------------

    async def _tool_logs_of(self, tenant: str, lists: Threads, user: str) -> dict[str, list[str]]:
        """The tool logs of `user`'s turns in these threads (read before their messages are
        forgotten: a log without an author goes by the question said before it)."""
        store = self.memory.tool_logs
        listed = await store.listed(tenant, lists)
        authors = await store.authors(tenant, [i for rows in listed.values() for i, _ in rows])
        out: dict[str, list[str]] = {}
        for thread, rows in listed.items():
            questions = [m for m in lists.messages(thread) if m.role == "user"]
            for log_id, created in rows:
                author = authors.get(log_id, "")
                if not author:
                    asked = [m for m in questions if m.timestamp <= created]
                    author = asked[-1].author if asked else ""
                if author == user:
                    out.setdefault(thread, []).append(log_id)
        return out

    async def _dm_places(self, tenant: str, user: str, lists: Threads) -> set[str]:
        """The audiences of `user`'s DM places (`dm_people_key`). A DM place stored before
        the record was kept is recorded first, as an import does (memory/dm_people.py): by the
        one person who wrote there, whose messages are not all tombstones."""
        key = dm_people_key(tenant)
        known = {
            decode(a) or "": decode(u) or "" for a, u in (await self.redis.hgetall(key)).items()
        }
        writers = DmAuthors()
        for thread in lists:
            for m in lists.messages(thread):
                writers.add(thread, m.role, m.author, m.audience)
        found = {a: person for a, person in writers.people().items() if a not in known}
        if found:
            await self.redis.hset(key, mapping=found)
        return {audience for audience, person in {**known, **found}.items() if person == user}

    async def _record_spoken_again(
        self, tenant: str, user: str, places: set[str], kept: set[str]
    ) -> None:
        """Record again whose DM each of `places` is where a thread is listed now that the
        erasure did not read and keep (`kept`): one it erased whole and listed again, or a new
        one, was written meanwhile (a Slack DM's top-level `dm` thread comes back under the
        same id), and the place's record, deleted above, must find it."""
        listed = [decode(t) or "" for t in await self.redis.zrange(threads_key(tenant), 0, -1)]
        fresh = [t for t in listed if t not in kept]
        if not fresh:
            return
        pipe = self.redis.pipeline(transaction=False)
        for thread in fresh:
            pipe.lindex(self.memory.conversation.key(Scope(tenant, thread)), 0)
        firsts = zip(fresh, await pipe.execute(), strict=True)
        spoken = {_audience(Message.from_json(raw), t) for t, raw in firsts if raw is not None}
        again = dict.fromkeys(spoken & places, user)
        if again:
            await self.redis.hset(dm_people_key(tenant), mapping=again)

    async def _forget_learned(self, tenant: str, user: str, audiences: set[str]) -> Erasure:
        """Entities and workflows whose authors include `user` or learned in their DMs."""
        where: FilterExpression = Tag("authors") == user
        if audiences:
            where = where | (Tag("audience") == sorted(audiences))
        fields = ["name", "type", "description"]
        entities = await delete_where(self.memory.entities, tenant, where, fields)
        workflows = await delete_where(self.memory.workflows, tenant, where, ["text"])
        texts = [Entity(*(decode(r.get(f)) or "" for f in fields)).line() for r in entities]
        texts += [decode(r.get("text")) or "" for r in workflows]
        return Erasure(entities=len(entities), workflows=len(workflows),
                       cached_embeddings=await self.purge.uncache(texts))  # fmt: skip

    async def _forget_last_threads(self, tenant: str, user: str) -> None:
        """Their latest thread per channel (what `/summarize` defaults to)."""
        pattern = tenant_key(tenant, "channel", "*", "last-thread")
        keys = [k async for k in self.redis.scan_iter(match=pattern, count=SCAN_COUNT)]
        if keys:
            pipe = self.redis.pipeline(transaction=False)
            for key in keys:
                pipe.hdel(key, user)
            await pipe.execute()


def _audience(message: Message, thread: str) -> str:
    return message.audience or legacy_audience(thread)
