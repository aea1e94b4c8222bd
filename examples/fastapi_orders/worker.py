"""The worker that closes unpaid orders.

Run it: ``delayq worker examples.fastapi_orders.worker:make_worker``

delayq runs each close at least once: a worker that crashes after closing the order but
before recording the task as done leaves the task to run again. The handler is therefore
written so that running it twice is the same as running it once — the gate in
:meth:`Store.close_if_pending`.
"""

from __future__ import annotations

from delayq import Discard, Queue, Task, Worker

from .settings import CLOSE_KIND, Settings
from .store import Store


def make_worker(settings: Settings | None = None) -> Worker:
    """Build the worker (``delayq worker`` calls this with no arguments: settings from env)."""
    settings = settings or Settings.from_env()
    store = Store(settings.database)
    store.init()
    queue = Queue(settings.queue, url=settings.redis_url, clock=settings.clock)
    worker = Worker(queue, concurrency=8)

    @worker.handler(CLOSE_KIND, max_attempts=10)
    def close_order(task: Task) -> None:
        # A sync handler: it runs in the worker's thread pool, so blocking SQLite is fine.
        # An exception here (database locked, disk full) is retried with the default backoff
        # (30 s, 2 min, 10 min); the gate makes every retry safe.
        if not store.close_if_pending(task.payload["order_id"]):
            # Paid in time, closed by an earlier run, or never written: nothing to do.
            raise Discard("order is no longer pending")

    return worker
