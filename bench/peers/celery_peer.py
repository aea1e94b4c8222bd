"""Celery: ``task.apply_async(countdown=delay)`` on the Redis broker, one worker process."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from harness import Item, record

NAME = "celery"
DISTS = ("celery", "kombu", "redis")
MODULES = ("celery",)
PRODUCE = "task.apply_async(args=..., countdown=delay), one call per task"
SETTINGS = (
    "defaults (prefetch multiplier 4, visibility_timeout 1 h, gossip/mingle/heartbeat on, no "
    "result backend) except --pool=threads, so one process runs the tasks (concurrency = "
    "nproc threads); loglevel WARNING"
)
POLL = (
    "the worker fetches countdown tasks at once (BRPOP, 1 s timeout) and holds them in memory "
    "as unacked messages, firing each from its own timer at the eta"
)


def _app(url: str) -> tuple[Any, Any]:
    from celery import Celery

    app = Celery("bench", broker=url)

    @app.task(name="noop")  # type: ignore[untyped-decorator]
    def noop(task_id: str, due: float) -> None:
        record(task_id, due)

    return app, noop


class Producer:
    def __init__(self, url: str) -> None:
        self.app, self.task = _app(url)

    def send(self, items: list[Item]) -> None:
        for it in items:
            due, delay = it.timing()
            self.task.apply_async(args=(it.id, due), countdown=delay)

    def close(self) -> None:
        self.app.close()


def serve(url: str, ready: Callable[[], None]) -> None:
    from celery.signals import worker_ready

    app, _ = _app(url)
    worker_ready.connect(lambda **kw: ready(), weak=False)
    app.worker_main(["worker", "--pool=threads", "--loglevel=WARNING"])  # SIGTERM: warm stop
