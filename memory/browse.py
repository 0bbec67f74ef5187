"""The memory page's reads: what a tenant's memory holds, each item with the audience it was
learned for (memory/scope.py), so the page shows each person only what they may see.

Every read takes the audiences its reader may see, or `None` for all of them (an admin's view),
and returns only items of those; nothing here decides who may see what beyond that.

`Browse` is the entry point, and the page's data classes are importable from here; the reads
live beside it, one module a part:
- memory/browse_threads.py: the thread list, a page of a thread (messages, summaries, tool
  calls), one message, summary or tool log; a thread's audience is its first message's;
- memory/browse_knowledge.py: papers and their passages, entities and workflows (a page of
  them at a time: `Listing`);
- memory/browse_search.py: search over past messages and passages (`Relevance`), and people's
  display names;
- memory/browse_reader.py: `Reader` and `sees`, what a reader may see.
"""

from __future__ import annotations

from memory.browse_knowledge import (
    EntityInfo,
    KnowledgeReads,
    Listing,
    PaperInfo,
    PassageView,
    WorkflowInfo,
)
from memory.browse_reader import Audiences, Reader, sees
from memory.browse_search import Relevance, SearchReads, SearchResults
from memory.browse_threads import (
    PAGE_SIZE,
    MessageView,
    ThreadInfo,
    ThreadPage,
    ThreadReads,
    channel_of,
)

__all__ = [
    "PAGE_SIZE",
    "Audiences",
    "Browse",
    "EntityInfo",
    "Listing",
    "MessageView",
    "PaperInfo",
    "PassageView",
    "Reader",
    "Relevance",
    "SearchResults",
    "ThreadInfo",
    "ThreadPage",
    "WorkflowInfo",
    "channel_of",
    "sees",
]


class Browse(ThreadReads, KnowledgeReads, SearchReads):
    """Reads for the memory page, over the stores of one `MemoryManager`."""
