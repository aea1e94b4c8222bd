"""A worker app with a sync handler that hangs past its timeout, for ``delayq worker
--recycle-stuck`` (tests/test_processes.py).

Configured by DQ_QUEUE, DELAYQ_REDIS_URL and DQ_LOG (a file each worker process appends
"<kind> <task id> <pid>" lines to). ``stuck`` records its run and sleeps for good (past its
0.3 s timeout; retried a minute later); ``rec`` records its run. The worker claims up to 5 s
ahead, so a task due a few seconds later waits in the process that claimed it.
"""

from __future__ import annotations

import os
import time

from delayq import Queue, Task, Worker

queue = Queue(os.environ.get("DQ_QUEUE", "stuck"))
worker = Worker(queue, concurrency=4, lease=5, grace=20, lookahead=5)


def _log(task: Task) -> None:
    fd = os.open(os.environ["DQ_LOG"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, f"{task.kind} {task.id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)


@worker.handler("stuck", timeout=0.3, backoff=[60])
def stuck(task: Task) -> None:
    _log(task)
    time.sleep(600)  # a call that never returns, and ignores task.lease_lost


@worker.handler("rec")
def rec(task: Task) -> None:
    _log(task)
