"""Huey: ``task.schedule(delay=...)`` with ``RedisHuey``, one consumer with its defaults."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import QUEUE, Item, record

NAME = "huey"
DISTS = ("huey", "redis")
MODULES = ("huey",)
PRODUCE = "task.schedule(args=..., delay=delay), one call per task"
SETTINGS = (
    "RedisHuey defaults (blocking BRPOP, read_timeout 1 s); consumer defaults: 1 worker "
    "thread, scheduler interval 1 s, periodic on, health checks on"
)
POLL = (
    "a scheduled task is queued at once; the worker moves it to the schedule sorted set, and "
    "the scheduler re-queues due tasks once a second (its minimum interval)"
)


def _huey(url: str) -> tuple[Any, Any]:
    from huey import RedisHuey

    huey = RedisHuey(QUEUE, url=url)

    @huey.task(name="noop")  # type: ignore[untyped-decorator]
    def noop(task_id: str, due: float) -> None:
        record(task_id, due)

    return huey, noop


class Producer:
    def __init__(self, url: str) -> None:
        self.huey, self.task = _huey(url)

    def send(self, items: list[Item]) -> None:
        for it in items:
            due, delay = it.timing()
            self.task.schedule(args=(it.id, due), delay=delay)

    def close(self) -> None:
        self.huey.storage.conn.close()


def serve(url: str, ready: Callable[[], None]) -> None:
    huey, _ = _huey(url)
    consumer = huey.create_consumer()
    ready()
    consumer.run()  # SIGTERM: stop now; SIGINT: graceful
