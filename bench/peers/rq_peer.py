"""RQ 2.x: ``Queue.enqueue_in`` and one ``Worker`` started with its scheduler."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from harness import QUEUE, Item, record

NAME = "rq"
DISTS = ("rq", "redis")
MODULES = ("rq",)
PRODUCE = "Queue.enqueue_in(timedelta(seconds=delay), noop, ...), one call per task"
SETTINGS = (
    "Worker defaults (rq worker --with-scheduler): forks a work horse per job, one job at a "
    "time, scheduler interval 1 s; logging at WARNING"
)
POLL = (
    "the worker's scheduler moves due jobs to the queue every 1 s; scheduled times are "
    "stored in whole seconds (rounded down), so a job can start up to 1 s early"
)


def noop(task_id: str, due: float) -> None:
    record(task_id, due)


class Producer:
    def __init__(self, url: str) -> None:
        from redis import Redis
        from rq import Queue

        self.conn = Redis.from_url(url)
        self.queue = Queue(QUEUE, connection=self.conn)

    def send(self, items: list[Item]) -> None:
        for it in items:
            due, delay = it.timing()
            self.queue.enqueue_in(timedelta(seconds=delay), noop, it.id, due)

    def close(self) -> None:
        self.conn.close()


def serve(url: str, ready: Callable[[], None]) -> None:
    from redis import Redis
    from rq import Queue, Worker

    conn = Redis.from_url(url)
    worker = Worker([Queue(QUEUE, connection=conn)], connection=conn)
    ready()
    worker.work(with_scheduler=True, logging_level="WARNING")  # SIGTERM: warm shutdown
