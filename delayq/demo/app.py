"""The demo's worker app: ``delayq worker delayq.demo.app:make_worker --url URL --lease 2s``
(the rest configured by env)."""

from __future__ import annotations

import os
import threading
import time

from delayq.demo.shop import Shop
from delayq.errors import Discard
from delayq.queue import Queue
from delayq.task import Task
from delayq.worker.worker import Worker

QUEUE_ENV = "DELAYQ_DEMO_QUEUE"
DB_ENV = "DELAYQ_DEMO_DATABASE_URL"
WORK_ENV = "DELAYQ_DEMO_WORK_MS"


def make_worker() -> Worker:
    queue = Queue(os.environ.get(QUEUE_ENV, "demo-orders"))  # URL: from delayq worker --url
    worker = Worker(queue, concurrency=16, lease=2, grace=5)
    db_url = os.environ[DB_ENV]
    work_s = float(os.environ.get(WORK_ENV, "200")) / 1000
    local = threading.local()  # one database connection per handler thread

    def shop() -> Shop:
        if not hasattr(local, "shop"):
            local.shop = Shop(db_url)
        return local.shop  # type: ignore[no-any-return]

    @worker.handler("order.close", max_attempts=10, backoff=[0.2, 0.5, 1.0])
    def close_order(task: Task) -> None:
        # Against the business deadline, not this run's due time: a close that waited for a
        # dead worker's lease to expire is late, and the report should say so.
        lateness_ms = (time.time() - task.payload["deadline"]) * 1000
        time.sleep(work_s)  # stands in for a call to the payment provider
        if not shop().close_order(task.payload["order_id"], lateness_ms, task.attempt):
            raise Discard("order already paid or closed")

    return worker
