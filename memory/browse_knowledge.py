"""The memory page's reads of what the tenant knows beside its threads: papers with their
passages (the whole team's), and the entities and workflows each reader may see, with where
they were learned (threads, people)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

from redisvl.query import FilterQuery

from memory.browse_reader import Audiences, Reads, sees
from memory.keys import papers_key
from memory.links import web_link
from memory.scope import PUBLIC, Scope
from memory.stores.base import decode, search_rows
from memory.stores.knowledge_base import (
    base_arxiv_id,
    is_from_arxiv,
    is_shared_pdf,
    paper_label,
    shares_of,
)


def _split_ids(value: Any) -> list[str]:
    """A provenance field: comma-separated ids (a tag field), or a JSON list."""
    text = (decode(value) or "").strip()
    if text.startswith("["):
        try:
            return [str(v) for v in json.loads(text)]
        except ValueError:
            pass
    return [v.strip() for v in text.split(",") if v.strip()]


@dataclass
class PaperInfo:
    arxiv_id: str
    title: str
    authors: list[str]
    published: str
    categories: list[str]
    abstract: str
    url: str
    source: str
    chunks: int
    ingested_at: float
    audience: str = PUBLIC  # the whole team's, but for PDFs shared in a private place
    file_name: str = ""  # a shared PDF's, as it was shared
    sharer: str = ""  # who shared a PDF (a platform user id; "" for papers from arXiv)
    shares: list[dict[str, Any]] = field(default_factory=list)  # a shared PDF's (`shares_of`)

    def origins_of(self, user: str) -> list[str]:
        """The shares of this PDF `user` made (`SharedFile.origin`): what they may take back."""
        return [s["origin"] for s in self.shares if user and s.get("sharer") == user]

    @property
    def shared_pdf(self) -> bool:
        return is_shared_pdf(self.arxiv_id)

    @property
    def name(self) -> str:
        """What the page calls it: its title, else a shared PDF's file name, else its id."""
        return self.title or (self.file_name if self.shared_pdf else "") or self.arxiv_id

    @property
    def label(self) -> str:
        """`arXiv:<id>` for a paper from arXiv; a PDF's id is no arXiv id."""
        return paper_label(self.arxiv_id, self.file_name)

    @classmethod
    def of(cls, record: dict[str, Any]) -> PaperInfo:
        arxiv_id = str(record.get("arxiv_id", ""))
        arxiv_link = f"https://arxiv.org/abs/{arxiv_id}" if is_from_arxiv(arxiv_id) else ""
        return cls(
            arxiv_id=arxiv_id, title=str(record.get("title", "")),
            authors=list(record.get("authors") or []), published=str(record.get("published", "")),
            categories=list(record.get("categories") or []),
            abstract=str(record.get("abstract", "")),
            url=web_link(str(record.get("url") or ""), arxiv_link),
            source=str(record.get("source", "")), chunks=int(record.get("chunks") or 0),
            ingested_at=float(record.get("ingested_at") or 0.0),
            audience=str(record.get("audience") or PUBLIC),
            file_name=str(record.get("file_name") or ""), sharer=str(record.get("sharer") or ""),
            shares=shares_of(record) if is_shared_pdf(arxiv_id) else [],
        )  # fmt: skip


@dataclass
class PassageView:
    arxiv_id: str
    title: str
    section: str
    chunk_index: int
    content: str
    url: str = ""
    audience: str = PUBLIC

    @property
    def label(self) -> str:
        """`arXiv:<id>`, or what kind of PDF it is (its id is no arXiv id)."""
        return paper_label(self.arxiv_id)


@dataclass
class EntityInfo:
    id: str  # the key after the tenant's index prefix
    name: str
    type: str
    description: str
    updated_at: float
    audience: str
    threads: list[str] = field(default_factory=list)  # where it was learned
    authors: list[str] = field(default_factory=list)  # from whose messages
    FIELDS: ClassVar[tuple[str, ...]] = (
        "name", "type", "description", "updated_at", "audience", "threads", "authors"
    )  # fmt: skip
    NEWEST: ClassVar[str] = "updated_at"

    @classmethod
    def of(cls, entity_id: str, row: dict[str, Any]) -> EntityInfo:
        """From its stored fields (FIELDS; a missing one is empty)."""
        return cls(
            id=entity_id, name=decode(row.get("name")) or "", type=decode(row.get("type")) or "",
            description=decode(row.get("description")) or "",
            updated_at=float(decode(row.get("updated_at")) or 0.0),
            audience=decode(row.get("audience")) or PUBLIC,
            threads=_split_ids(row.get("threads")), authors=_split_ids(row.get("authors")),
        )  # fmt: skip


@dataclass
class WorkflowInfo:
    id: str  # the key after the tenant's index prefix (its digest)
    text: str
    created_at: float
    audience: str
    thread: str = ""
    authors: list[str] = field(default_factory=list)
    FIELDS: ClassVar[tuple[str, ...]] = ("text", "created_at", "audience", "thread", "authors")
    NEWEST: ClassVar[str] = "created_at"

    @classmethod
    def of(cls, workflow_id: str, row: dict[str, Any]) -> WorkflowInfo:
        """From its stored fields (FIELDS; a missing one is empty)."""
        return cls(
            id=workflow_id, text=decode(row.get("text")) or "",
            created_at=float(decode(row.get("created_at")) or 0.0),
            audience=decode(row.get("audience")) or PUBLIC,
            thread=decode(row.get("thread")) or "", authors=_split_ids(row.get("authors")),
        )  # fmt: skip


Learned = TypeVar("Learned", EntityInfo, WorkflowInfo)


@dataclass
class Listing(Generic[Learned]):
    """Some of a list, newest first (`limit` from `offset`), and how long the whole list is
    (what the reader may see): the page says the real count and how many pages there are."""

    items: list[Learned]
    total: int


class KnowledgeReads(Reads):
    # -- papers --------------------------------------------------------------------------------

    async def papers(self, tenant: str, audiences: Audiences = None) -> list[PaperInfo]:
        """The tenant's papers `audiences` may see, latest saved first."""
        records = await self.memory.knowledge_base.papers(Scope(tenant), everywhere=True)
        papers = [PaperInfo.of(r) for r in reversed(records)]
        return [p for p in papers if sees(audiences, p.audience)]

    async def paper_info(self, tenant: str, arxiv_id: str) -> PaperInfo | None:
        """A paper's entry, without its passages."""
        raw = await self.redis.hget(papers_key(tenant), base_arxiv_id(arxiv_id))
        return PaperInfo.of(json.loads(raw)) if raw else None

    async def paper(self, tenant: str, arxiv_id: str) -> tuple[PaperInfo, list[PassageView]] | None:
        """A paper and its passages, in order."""
        paper = await self.paper_info(tenant, arxiv_id)
        if paper is None:
            return None
        kb, fields = self.memory.knowledge_base, ["section", "chunk_index", "content"]
        pipe = self.redis.pipeline(transaction=False)
        for i in range(paper.chunks):
            pipe.hmget(kb.chunk_key(tenant, paper.arxiv_id, i), fields)
        passages = [
            PassageView(paper.arxiv_id, paper.title, decode(section) or "",
                        int(float(decode(index) or i)), decode(content) or "", paper.url,
                        paper.audience)
            for i, (section, index, content) in enumerate(await pipe.execute())
            if content is not None
        ]  # fmt: skip
        return paper, passages

    # -- workflows and entities ------------------------------------------------------------------

    async def entities(
        self, tenant: str, audiences: Audiences, limit: int = 500
    ) -> list[EntityInfo]:
        """The entities `audiences` may see, latest updated first."""
        return (await self.entity_listing(tenant, audiences, limit)).items

    async def workflows(
        self, tenant: str, audiences: Audiences, limit: int = 500
    ) -> list[WorkflowInfo]:
        """The workflows `audiences` may see, latest first."""
        return (await self.workflow_listing(tenant, audiences, limit)).items

    async def entity_listing(
        self, tenant: str, audiences: Audiences, limit: int, offset: int = 0
    ) -> Listing[EntityInfo]:
        """`limit` of the entities `audiences` may see from `offset`, and how many there are."""
        store = self.memory.entities
        return await self._listed(store, EntityInfo, tenant, audiences, limit, offset)

    async def workflow_listing(
        self, tenant: str, audiences: Audiences, limit: int, offset: int = 0
    ) -> Listing[WorkflowInfo]:
        """`limit` of the workflows `audiences` may see from `offset`, and how many there are."""
        store = self.memory.workflows
        return await self._listed(store, WorkflowInfo, tenant, audiences, limit, offset)

    async def entity(self, tenant: str, entity_id: str, audiences: Audiences) -> EntityInfo | None:
        """One entity by its id, when `audiences` may see it."""
        return await self._item(self.memory.entities, EntityInfo, tenant, entity_id, audiences)

    async def workflow(
        self, tenant: str, workflow_id: str, audiences: Audiences
    ) -> WorkflowInfo | None:
        """One workflow by its id, when `audiences` may see it."""
        return await self._item(self.memory.workflows, WorkflowInfo, tenant, workflow_id, audiences)

    async def _listed(
        self,
        store: Any,
        info: type[Learned],
        tenant: str,
        audiences: Audiences,
        limit: int,
        offset: int,
    ) -> Listing[Learned]:
        """The store's records `audiences` may see, newest first (`info.NEWEST`): one FT.SEARCH
        (LIMIT offset limit), whose reply counts them all too."""
        if audiences is not None and not audiences:
            return Listing([], 0)  # an empty tag filter would match everything
        scope = self.reader(tenant, audiences)
        where = None if audiences is None else store.audience_filter(scope)
        query = FilterQuery(
            filter_expression=where if where is not None else "*",
            return_fields=list(info.FIELDS), sort_by=(info.NEWEST, "DESC"),
        )  # fmt: skip
        query.paging(max(0, offset), max(0, limit))
        reply = await store._search(tenant, "FT.SEARCH", *query.get_args())
        prefix = store.key_prefix(tenant)
        items = [
            info.of(r["id"][len(prefix) :], r)
            for r in search_rows(reply, query)
            if r["id"].startswith(prefix) and scope.can_see(decode(r.get("audience")) or PUBLIC)
        ]
        return Listing(items, _total(reply))

    async def _item(
        self, store: Any, info: type[Learned], tenant: str, item_id: str, audiences: Audiences
    ) -> Learned | None:
        """One record by its id, when it exists and `audiences` may see it."""
        values = await self.redis.hmget(store.key_of(tenant, item_id), list(info.FIELDS))
        if all(v is None for v in values):
            return None
        row = dict(zip(info.FIELDS, values, strict=True))
        if not sees(audiences, decode(row["audience"]) or PUBLIC):
            return None
        return info.of(item_id, row)


def _total(reply: Any) -> int:
    """How many records an FT.SEARCH matched, whatever its LIMIT (RESP2 or RESP3)."""
    if isinstance(reply, dict):
        return int(reply.get(b"total_results", reply.get("total_results", 0)))
    return int(reply[0]) if reply else 0
