"""A worker app for ``delayq worker --processes N`` (tests/test_processes.py).

Configured by DQ_QUEUE, DELAYQ_REDIS_URL and DQ_LOG (a file each worker process appends
"<start|end> <task id> <pid>" lines to). ``rec`` records its run and sleeps
``payload["sleep"]`` seconds (default 0).
"""

from __future__ import annotations

import os
import time

from delayq import Queue, Task, Worker

queue = Queue(os.environ.get("DQ_QUEUE", "processes"))
worker = Worker(queue, concurrency=4, lease=5, grace=20)


def _log(what: str, task: Task) -> None:
    fd = os.open(os.environ["DQ_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{what} {task.id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


@worker.handler("rec")
def rec(task: Task) -> None:
    _log("start", task)
    time.sleep(float((task.payload or {}).get("sleep", 0)))
    _log("end", task)
