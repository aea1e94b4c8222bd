"""A worker app for the probe tests (``/livez``, ``/readyz`` on ``--metrics-port``).

Configured by environment: DQ_QUEUE and DELAYQ_REDIS_URL. ``ok`` returns; ``block`` is an
async handler that blocks the event loop with ``time.sleep(payload["s"])``, as a handler
calling blocking code by mistake would; ``slow`` sleeps ``payload["s"]`` without blocking
it. ``max_wait=1``: a look at the queue every second. The grace: DQ_GRACE seconds (1).
"""

from __future__ import annotations

import asyncio
import os
import time

from delayq import Queue, Task, Worker

queue = Queue(os.environ.get("DQ_QUEUE", "health"))
worker = Worker(
    queue, concurrency=2, lease=60, max_wait=1, grace=float(os.environ.get("DQ_GRACE", "1"))
)


@worker.handler("ok")
def ok(task: Task) -> None:
    return None


@worker.handler("block")
async def block(task: Task) -> None:
    time.sleep(task.payload["s"])  # (blocking the loop is the point)


@worker.handler("slow")
async def slow(task: Task) -> None:
    await asyncio.sleep(task.payload["s"])
