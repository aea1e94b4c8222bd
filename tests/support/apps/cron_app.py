"""A worker app for the multi-process cron test: ``python -m delayq worker
tests.support.apps.cron_app:worker``. Configured by DQ_QUEUE and DELAYQ_REDIS_URL; every run of the
every-second schedule records its occurrence, its start time and the process in a list the
test reads (a test-only key).
"""

from __future__ import annotations

import json
import os
import time

import redis

from delayq import Queue, Task, Worker

QUEUE = os.environ.get("DQ_QUEUE", "cron")
queue = Queue(QUEUE)
worker = Worker(queue, concurrency=4, lease=5)
_side = redis.Redis.from_url(queue.url)


def runs_key(queue_name: str) -> str:
    return f"test:{queue_name}:cron-runs"


@worker.every(seconds=1, name="tick")
async def tick(task: Task) -> None:
    started = time.time()
    record = {"id": task.id, "at": task.payload["at"], "start": started, "pid": os.getpid()}
    _side.rpush(runs_key(QUEUE), json.dumps(record))
