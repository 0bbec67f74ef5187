"""A stand-in for the PDF reader child (run through `read_pdf_in_child(..., module=STOPPED)`)
that is stopped from outside as it reads: SIGTERM, as Heroku sends to every process of a dyno.
It does not ignore SIGTERM the way the real child does, so it dies of it."""

from __future__ import annotations

import json
import os
import signal
import sys
import time

STOPPED = "tests.support.pdf_child_stopped"  # this module, as the child runs it


def main() -> None:
    sys.stdin.buffer.read()
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)  # not reached: SIGTERM's default ends the process
    sys.stdout.write(json.dumps({"refused": "SIGTERM did not stop the stand-in"}))


if __name__ == "__main__":
    main()
