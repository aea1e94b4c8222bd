"""Dramatiq: ``actor.send_with_options(delay=ms)`` on the Redis broker, one ``Worker``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import QUEUE, Item, record, wait_for_signal

NAME = "dramatiq"
DISTS = ("dramatiq", "redis")
MODULES = ("dramatiq",)
PRODUCE = "actor.send_with_options(args=..., delay=ms), one call per task"
SETTINGS = (
    "RedisBroker defaults, default middleware; Worker defaults: 8 threads, worker_timeout "
    "1000 ms, delay-queue prefetch 8000 (one process, as `dramatiq --processes 1`)"
)
POLL = (
    "delayed messages sit in the delay queue; the worker prefetches them and re-enqueues each "
    "once its eta passes; both consumers back off to 1 s (worker_timeout) between empty polls"
)


def noop(task_id: str, due: float) -> None:
    record(task_id, due)


def _setup(url: str) -> tuple[Any, Any]:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = RedisBroker(url=url)
    dramatiq.set_broker(broker)
    actor = dramatiq.actor(noop, actor_name="noop", queue_name=QUEUE, broker=broker)
    return broker, actor


class Producer:
    def __init__(self, url: str) -> None:
        self.broker, self.actor = _setup(url)

    def send(self, items: list[Item]) -> None:
        for it in items:
            due, delay = it.timing()
            self.actor.send_with_options(args=(it.id, due), delay=max(1, round(delay * 1000)))

    def close(self) -> None:
        self.broker.close()


def serve(url: str, ready: Callable[[], None]) -> None:
    from dramatiq import Worker

    broker, _ = _setup(url)
    worker = Worker(broker)
    worker.start()
    ready()
    try:
        wait_for_signal()
    finally:
        worker.stop(timeout=10_000)
        broker.close()
