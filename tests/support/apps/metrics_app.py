"""A worker app for the metrics exporter test (``delayq worker ... --metrics-port``).

Configured by environment: DQ_QUEUE and DELAYQ_REDIS_URL. ``ok`` succeeds, ``boom`` fails
for good (max_attempts=1).
"""

from __future__ import annotations

import os

from delayq import Queue, Task, Worker

queue = Queue(os.environ.get("DQ_QUEUE", "metrics"))
worker = Worker(queue, concurrency=2, lease=5)


@worker.handler("ok")
def ok(task: Task) -> None:
    return None


@worker.handler("boom", max_attempts=1)
def boom(task: Task) -> None:
    raise RuntimeError("boom")
