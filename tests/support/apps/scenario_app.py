"""The worker app of the fault scenarios (tests/test_scenarios.py), run as
``python -m delayq worker tests.support.apps.scenario_app:worker``.

Configured by environment: DQ_QUEUE, DQ_SHARDS, DELAYQ_REDIS_URL, DQ_LEASE, DQ_RUNLOG (a
directory).
``job`` sleeps the milliseconds its payload names; with DQ_EXPIRE set, ``on_expire("sc:*")``
records the key.
Each start and finish is appended to the run log the checker reads.
"""

from __future__ import annotations

import os
import time

from delayq import Expired, Queue, Task, Worker

from ..checker import RunLog

queue = Queue(os.environ.get("DQ_QUEUE", "scenario"), shards=int(os.environ.get("DQ_SHARDS", "1")))
worker = Worker(
    queue,
    concurrency=int(os.environ.get("DQ_CONCURRENCY", "8")),
    lease=float(os.environ.get("DQ_LEASE", "2")),
    grace=1,
)
log = RunLog(os.environ.get("DQ_RUNLOG", "."))


@worker.handler("job", max_attempts=20)
def job(task: Task) -> None:
    log.start(task.id, task.attempt)
    time.sleep(int(task.payload) / 1000)
    log.finish(task.id, task.attempt)


def expired(e: Expired) -> None:
    log.start(e.key, e.task.attempt)
    log.finish(e.key, e.task.attempt)


if os.environ.get("DQ_EXPIRE"):
    worker.on_expire("sc:*", max_attempts=20)(expired)
