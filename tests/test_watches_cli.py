"""`arxivscout watch add|list|remove|run` in-process against the test Redis and a replayed arXiv
with a feed of new papers."""

from __future__ import annotations

import time

import pytest

from tests.support.arxiv_replay import ArxivReplay
from tests.test_cli_memory import arxivscout
from tests.test_watches import OFF_TOPIC, ON_TOPIC, entry


@pytest.fixture
def new_papers(monkeypatch):
    replay = ArxivReplay().start()
    now = time.time()
    replay.add_feed([entry(t, a, now - (i + 1) * 3600) for i, (t, a) in enumerate(ON_TOPIC[:2])])
    replay.add_feed([entry(*OFF_TOPIC[0], now - 7200)])
    monkeypatch.setenv("ARXIV_API_URL", replay.api_url)
    monkeypatch.setenv("ARXIV_DELAY_SECONDS", "0")
    yield replay
    replay.stop()


async def test_watch_add_list_run_remove(memory, tenant, capsys, new_papers):
    code, out, _ = await arxivscout(
        capsys, "watch", "add", "state space models", "--period", "weekly",
        "--category", "cs.LG", "--tenant", tenant,
    )  # fmt: skip
    assert code == 0 and out.startswith("Watching “state space models” cat:cs.LG, weekly")
    watch_id = out.strip().rsplit("id ", 1)[1]

    code, out, _ = await arxivscout(capsys, "watch", "list", "--tenant", tenant)
    assert code == 0 and out.startswith(f"{watch_id}  “state space models”") and "[terminal" in out

    code, out, _ = await arxivscout(capsys, "watch", "run", watch_id, "--tenant", tenant)
    lines = out.splitlines()
    assert code == 0 and lines[0].startswith(f"[{watch_id}] New on “state space models”")
    titles = [line.split(". ", 1)[1] for line in lines if line[:3] in ("1. ", "2. ", "3. ")]
    assert set(titles[:2]) == {t for t, _ in ON_TOPIC[:2]} and titles[2] == OFF_TOPIC[0][0]
    assert (
        "Ada Lovelace, Alan Turing, Grace Hopper et al." in out and "https://arxiv.org/abs/" in out
    )

    # a terminal watch's run is its delivery: the next run has nothing new
    code, out, _ = await arxivscout(capsys, "watch", "run", "--tenant", tenant)
    assert code == 0 and "Nothing new on “state space models”" in out
    assert "(3 found: 0 already saved, 0 already shown, 3 in an earlier digest)" in out
    # --since shows a window again, without what was shown
    code, out, _ = await arxivscout(
        capsys, "watch", "run", watch_id, "--since", "2020-01-01", "--tenant", tenant
    )
    assert code == 0 and "Nothing new" in out

    code, out, _ = await arxivscout(capsys, "watch", "add", "x", "--period", "3",
                                    "--tenant", tenant)  # fmt: skip
    assert code == 0 and out.startswith("Watching “x”, every 3 days"), out  # a bare N: N days
    code, _, _ = await arxivscout(capsys, "watch", "remove", out.strip().rsplit("id ", 1)[1],
                                  "--tenant", tenant)  # fmt: skip
    assert code == 0
    code, _, err = await arxivscout(capsys, "watch", "add", "x", "--period", "hourly",
                                    "--tenant", tenant)  # fmt: skip
    assert code == 2 and err.count("\n") == 1 and "--period is daily, weekly" in err
    code, _, err = await arxivscout(capsys, "watch", "run", "nope", "--tenant", tenant)
    assert code == 2 and "no watch 'nope'" in err

    code, out, _ = await arxivscout(capsys, "watch", "remove", watch_id, "--tenant", tenant)
    assert code == 0 and out.startswith("Stopped watching")
    code, out, _ = await arxivscout(capsys, "watch", "list", "--tenant", tenant)
    assert "(no watches" in out
