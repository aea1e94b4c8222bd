"""SAQ: ``Queue.enqueue(..., scheduled=due)`` on Redis, one ``Worker`` with its defaults."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from harness import QUEUE, Item, record

NAME = "saq"
DISTS = ("saq", "redis")
MODULES = ("saq",)
PRODUCE = "await queue.enqueue('noop', scheduled=due, ...), one awaited call per task"
SETTINGS = (
    "Worker defaults: concurrency 10, timers schedule 1 s / sweep 60 s / abort 1 s / "
    "worker_info 10 s, async handler"
)
POLL = "a timer moves due jobs from the scheduled set to the queue every 1 s (timers.schedule)"


async def noop(ctx: dict[str, Any], *, tid: str, due: float) -> None:
    record(tid, due)


class Producer:
    def __init__(self, url: str) -> None:
        from saq import Queue

        self.loop = asyncio.new_event_loop()
        self.queue = Queue.from_url(url, name=QUEUE)
        self.loop.run_until_complete(self.queue.connect())

    async def asend_one(self, it: Item) -> None:
        due, _ = it.timing()
        # `scheduled` is documented as int epoch seconds; a float keeps sub-second due times
        await self.queue.enqueue("noop", scheduled=due, tid=it.id, due=due)

    async def _send(self, items: list[Item]) -> None:
        for it in items:
            await self.asend_one(it)

    def send(self, items: list[Item]) -> None:
        self.loop.run_until_complete(self._send(items))

    def close(self) -> None:
        self.loop.run_until_complete(self.queue.disconnect())
        self.loop.close()


def serve(url: str, ready: Callable[[], None]) -> None:
    from saq import Queue, Worker

    async def main() -> None:  # as the `saq` command runs a worker
        queue = Queue.from_url(url, name=QUEUE)
        worker = Worker(queue, functions=[noop])
        try:
            await queue.connect()
            loop = asyncio.get_running_loop()
            loop.call_later(0.2, ready)  # start() installs SIGTERM/SIGINT handlers first
            await worker.start()
        finally:
            await queue.disconnect()

    asyncio.run(main())
