"""arq: ``ArqRedis.enqueue_job(..., _defer_by=delay)`` and one ``Worker`` with its defaults."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from harness import Item, record

NAME = "arq"
DISTS = ("arq", "redis")
MODULES = ("arq",)
PRODUCE = "await pool.enqueue_job('noop', ..., _defer_by=delay), one awaited call per task"
SETTINGS = (
    "Worker defaults: max_jobs 10, poll_delay 0.5 s, queue_read_limit 100, keep_result 3600 s "
    "(results stored), async handler"
)
POLL = "polls the queue sorted set for due jobs every 0.5 s (poll_delay)"


async def noop(ctx: dict[str, Any], task_id: str, due: float) -> None:
    record(task_id, due)


class Producer:
    def __init__(self, url: str) -> None:
        from arq.connections import RedisSettings, create_pool

        self.loop = asyncio.new_event_loop()
        self.pool = self.loop.run_until_complete(create_pool(RedisSettings.from_dsn(url)))

    async def asend_one(self, it: Item) -> None:
        due, delay = it.timing()
        await self.pool.enqueue_job("noop", it.id, due, _defer_by=delay)

    async def _send(self, items: list[Item]) -> None:
        for it in items:
            await self.asend_one(it)

    def send(self, items: list[Item]) -> None:
        self.loop.run_until_complete(self._send(items))

    def close(self) -> None:
        self.loop.run_until_complete(self.pool.aclose())
        self.loop.close()


def serve(url: str, ready: Callable[[], None]) -> None:
    from arq.connections import RedisSettings
    from arq.worker import Worker, func

    asyncio.set_event_loop(asyncio.new_event_loop())
    worker = Worker(functions=[func(noop, name="noop")], redis_settings=RedisSettings.from_dsn(url))
    ready()
    worker.run()  # handles SIGTERM/SIGINT itself
