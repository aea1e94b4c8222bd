"""A worker app whose one handler always fails: ``--log-format json`` tests. DQ_QUEUE names
the queue; its URL comes from ``--url``."""

from __future__ import annotations

import os

from delayq import Queue, Task, Worker

queue = Queue(os.environ.get("DQ_QUEUE", "failing"))
worker = Worker(queue)


@worker.handler("charge", max_attempts=2, backoff=[0.05], jitter=0)
def charge_card(task: Task) -> None:
    raise ConnectionError(f"card service down (attempt {task.attempt})")
