"""A worker app that imports once, then fails at every later import: the supervisor of
``delayq worker --processes N`` imports it fine, its worker processes cannot. DQ_COUNT is a
file the imports are counted in (one line each)."""

from __future__ import annotations

import os

from delayq import Queue, Worker

with open(os.environ["DQ_COUNT"], "a") as f:
    f.write("import\n")
with open(os.environ["DQ_COUNT"]) as f:
    if len(f.read().splitlines()) > 1:
        raise RuntimeError("this app cannot start in a worker process (on purpose)")

worker = Worker(Queue(os.environ.get("DQ_QUEUE", "fails")))
