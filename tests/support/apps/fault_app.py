"""A worker app for fault tests: ``python -m delayq worker tests.support.apps.fault_app:worker``.

Configured by environment: DQ_QUEUE, DELAYQ_REDIS_URL, DQ_LEASE, DQ_GRACE, DQ_SLEEP. Each
run of ``slow`` records its start and its end in lists the test reads (test-only keys).
"""

from __future__ import annotations

import os
import time

import redis

from delayq import Queue, Task, Worker

QUEUE = os.environ.get("DQ_QUEUE", "faults")
queue = Queue(QUEUE)
worker = Worker(
    queue,
    concurrency=4,
    lease=float(os.environ.get("DQ_LEASE", "2")),
    grace=float(os.environ.get("DQ_GRACE", "30")),
)
_side = redis.Redis.from_url(queue.url)


def started_key(queue_name: str) -> str:
    return f"test:{queue_name}:started"


def finished_key(queue_name: str) -> str:
    return f"test:{queue_name}:finished"


@worker.handler("slow", max_attempts=5)
def slow(task: Task) -> None:
    """Sleeps DQ_SLEEP seconds on the first attempt only, so a kill lands mid-task."""
    _side.rpush(started_key(QUEUE), f"{task.id}:{task.attempt}:{os.getpid()}")
    if task.attempt == 1:
        time.sleep(float(os.environ.get("DQ_SLEEP", "30")))
    _side.rpush(finished_key(QUEUE), f"{task.id}:{task.attempt}:{os.getpid()}")
