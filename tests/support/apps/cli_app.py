"""A worker app for the ``delayq worker`` flag tests: ``python -m delayq worker
tests.support.apps.cli_app:worker``. DQ_QUEUE names the queue; its URL comes from the
environment (``--url``) unless DQ_FIXED_URL hard-codes one with ``url=``. Its own settings are
concurrency 16 and a 30 s lease, which the flags replace."""

from __future__ import annotations

import os
import time

from delayq import Queue, Task, Worker

queue = Queue(os.environ.get("DQ_QUEUE", "cli"), url=os.environ.get("DQ_FIXED_URL") or None)
worker = Worker(queue, concurrency=16, lease=30)


@worker.handler("hold")
def hold(task: Task) -> None:
    time.sleep(float(task.payload["seconds"]))
