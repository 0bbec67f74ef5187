"""A stand-in for the PDF reader child, run through its module seam
(`read_pdf_in_child(..., module=STAND_IN)`): after the child's own preparation, a file named
hang.pdf never finishes, malformed.pdf gets a reply of the wrong shape, any other is refused
with the child's oom_score_adj (what the test reads)."""

from __future__ import annotations

import json
import sys
import time

from memory.ingest.pdf_child import prepare

STAND_IN = "tests.support.pdf_children"  # this module, as the child runs it


def main() -> None:
    limits = json.loads(sys.argv[1])
    sys.stdin.buffer.read()
    prepare(int(limits["memory_mb"]))
    if limits["name"] == "hang.pdf":
        time.sleep(3600)
    if limits["name"] == "malformed.pdf":  # exits 0 with what is not a PDF's text
        sys.stdout.write(json.dumps({"title": "x", "pages": 1, "paragraphs": [["only one"]]}))
        return
    with open("/proc/self/oom_score_adj") as score:
        sys.stdout.write(json.dumps({"refused": f"oom_score_adj {score.read().strip()}"}))


if __name__ == "__main__":
    main()
