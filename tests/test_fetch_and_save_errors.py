"""`fetch_and_save` (the agent's tool, the Save button) raises a service's failure as it was
raised, not as an IngestError carrying the provider's text; each caller says it in its own
words: the Save task "press Save again in a minute", the agent's tool `fetch_and_save_paper_to_kb`
a plain `SaveFailed` naming only which service failed (the toolbox writes a tool's error into
its result and log, before the model, which may repeat it): a masked key or an internal address
never becomes a message for the channel. A paper's own problem (no such id) is still an
IngestError, said as is. A real arXiv replay and a scripted embeddings server that refuses the
key."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.llm import openai_client
from bot.tools import ToolContext, save_failed, toolbox
from memory.embeddings import EmbeddingError, OpenAIEmbedder
from memory.ingest.errors import IngestError
from memory.ingest.pipeline import fetch_and_save, ingest
from memory.manager import MemoryManager
from memory.scope import Scope
from tests.support.arxiv_replay import MEMGPT_ID
from tests.test_arxiv_ingest_s24 import enc as enc
from tests.test_arxiv_ingest_s24 import kb as kb
from tests.test_arxiv_ingest_s24 import replay as replay
from tests.test_arxiv_ingest_s24 import source as source
from tests.test_turn_endings_s25 import SECRET, Embeddings


@pytest.fixture
async def refusing():
    """An OpenAI embedder whose server answers 401 with a masked key in its text."""
    server = Embeddings()
    await server.start()
    server.status = 401
    embedder = OpenAIEmbedder(openai_client("k", server.base_url, 5.0, max_retries=0))
    yield embedder
    await embedder.aclose()
    await server.close()


async def test_an_embedding_failure_is_raised_as_itself_not_as_an_ingest_error(
    replay, source, kb, enc, tenant, refusing
):
    with pytest.raises(EmbeddingError) as caught:
        await fetch_and_save(MEMGPT_ID, Scope(tenant), kb, refusing, enc, source)
    assert not isinstance(caught.value, IngestError)
    assert await kb.paper(Scope(tenant), MEMGPT_ID) is None
    await kb.drop_tenant(tenant)


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (401, "could not save arXiv:{id}: the embedding service refused it; the operator must "
              "fix its setup"),
        (503, "could not save arXiv:{id} right now (the embedding service failed); try again in "
              "a minute"),
        ("refused", "could not save arXiv:{id} right now (the embedding service failed); try "
                    "again in a minute"),
    ],
)  # fmt: skip
async def test_the_tool_says_only_which_service_failed(
    replay, source, kb, enc, tenant, failure, said
):
    """Through the toolbox, as the agent calls it: the result and its error name the embedding
    service, not the provider's text (the masked key), nor the arXiv mirror's address; "try
    again in a minute" only where that may help (a 503, the connection refused), a refused key
    is the operator's to fix."""
    server = Embeddings()
    await server.start()
    embedder = OpenAIEmbedder(openai_client("k", server.base_url, 5.0, max_retries=0))
    if failure == "refused":
        await server.close()  # its port closed: the connection is refused
    else:
        server.status = failure
    memory = MemoryManager(kb.redis, embedder)
    no_consolidator: Any = None  # the tool never consolidates
    ctx = ToolContext(Scope(tenant), memory, source, consolidator=no_consolidator, encoding=enc)
    arguments = json.dumps({"arxiv_id": MEMGPT_ID})
    try:
        result = await toolbox.execute("fetch_and_save_paper_to_kb", arguments, ctx)
    finally:
        await embedder.aclose()
        await server.close()
    assert result.status == "error"
    assert said.format(id=MEMGPT_ID) in result.output
    for text in (result.output, result.error or ""):
        assert SECRET not in text and "EmbeddingError" not in text and "401" not in text
    assert await kb.paper(Scope(tenant), MEMGPT_ID) is None
    await kb.drop_tenant(tenant)


async def test_a_papers_own_problem_is_still_an_ingest_error(replay, source, kb, enc, tenant):
    with pytest.raises(IngestError, match=r"no paper with id 2401\.99999"):
        await fetch_and_save("2401.99999", Scope(tenant), kb, kb.embedder, enc, source)


async def test_the_command_line_ingest_still_reports_every_failure_and_goes_on(
    replay, source, kb, enc, tenant, refusing
):
    """The operator's `ingest` never raises per paper: the failure is in its report."""
    report = await ingest([MEMGPT_ID], Scope(tenant), kb, refusing, enc, source, progress=False)
    [(failed, message)] = report.failed
    assert failed == MEMGPT_ID and message.startswith("EmbeddingError") and SECRET in message
    await kb.drop_tenant(tenant)


def test_the_pdf_reader_not_started_is_said_to_pass_and_a_bug_is_not():
    """The PDF reader's process not started (out of pids or memory, an OSError under it, as
    memory/ingest/pdf_child.py raises it) may pass: "try again in a minute", naming the
    reader; a bug names no service and gives no such hope."""
    unstarted = RuntimeError("could not start the PDF reader for 2310.08560.pdf")
    unstarted.__cause__ = BlockingIOError(11, "Resource temporarily unavailable")
    assert save_failed(MEMGPT_ID, unstarted) == (
        f"could not save arXiv:{MEMGPT_ID} right now (the PDF reader could not run); try again "
        "in a minute"
    )
    bug = save_failed(MEMGPT_ID, KeyError("chunks"))
    assert bug == f"could not save arXiv:{MEMGPT_ID}: something went wrong on my side"
