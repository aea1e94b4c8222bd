"""A worker whose claim loop cannot work: its registration (which rides on every claim
now and then) raises. Run as ``python -m delayq worker tests.support.apps.broken_app:worker``;
configured by DQ_QUEUE and DELAYQ_REDIS_URL."""

from __future__ import annotations

import os

from delayq import Queue, Task, Worker


class BrokenWorker(Worker):
    def registration(self) -> str:
        raise RuntimeError("registration is broken (on purpose, for the test)")


# It fails at each registration, which rides on a look: look every 5 s, not every 15 s.
worker = BrokenWorker(Queue(os.environ.get("DQ_QUEUE", "broken")), max_wait=5)
worker.supervisor.max_failures = 3
worker.supervisor.max_delay = 0.2


@worker.handler("k")
def k(task: Task) -> None:
    return None
