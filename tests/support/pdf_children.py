"""A stand-in for the PDF reader child, run through its module seam (`CHILD_MODULE_ENV`):
after the child's own preparation, a file named hang.pdf never finishes, any other is refused
with the child's oom_score_adj (what the test reads)."""

from __future__ import annotations

import json
import sys
import time

from memory.ingest.pdf_child import prepare


def main() -> None:
    limits = json.loads(sys.argv[1])
    sys.stdin.buffer.read()
    prepare(int(limits["memory_mb"]))
    if limits["name"] == "hang.pdf":
        time.sleep(3600)
    with open("/proc/self/oom_score_adj") as score:
        sys.stdout.write(json.dumps({"refused": f"oom_score_adj {score.read().strip()}"}))


if __name__ == "__main__":
    main()
