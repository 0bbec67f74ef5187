"""One rule for the addresses shown as links (memory/links.py `web_link`): citations, the
model's knowledge segment and the memory page show http(s) addresses only, so an old local
PDF's server path (`file:`, in any case) or an import's `javascript:` is never shown."""

from __future__ import annotations

from bot.citations import passage_link
from memory.links import web_link
from memory.stores.knowledge_base import KnowledgeBase, Passage

NOT_WEB = ["FILE:///srv/papers/notes.pdf", "file:///srv/papers/notes.pdf", "javascript:alert(1)"]


def passage(url: str) -> Passage:
    return Passage("local-abc123", "Team notes", "", 0, "Notes.", url, None, 0.5, page=3)


def test_only_web_addresses_are_linked_anywhere():
    for url in NOT_WEB:
        assert web_link(url) == "" and passage_link(passage(url)) == "", url
        shown = KnowledgeBase.segment([passage(url)]).render()
        assert "Link: \n" in shown and url not in shown, url
    web = "https://example.org/notes.pdf"
    assert passage_link(passage(web)) == f"{web}#page=3"
    assert f"Link: {web}\n" in KnowledgeBase.segment([passage(web)]).render()
