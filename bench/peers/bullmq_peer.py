"""BullMQ's Python port: ``Queue.add(name, data, {"delay": ms})`` and one ``Worker``."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from typing import Any

from harness import QUEUE, Item, record

NAME = "bullmq"
DISTS = ("bullmq", "redis")
MODULES = ("bullmq",)
PRODUCE = (
    "await queue.addBulk([{'name': 'noop', 'data': {...}, 'opts': {'delay': ms}}, ...]) "
    "(its batch call: one MULTI pipeline per 1,000 tasks); one call per task: "
    "await queue.add('noop', {...}, {'delay': ms})"
)
SETTINGS = (
    "Worker defaults: concurrency 1, drainDelay 5 s, lockDuration 30 s, stalledInterval "
    "30 s; completed jobs kept (removeOnComplete unset); async processor"
)
POLL = (
    "no polling of the delayed set by clients: the worker blocks on the marker key "
    "(BZPOPMIN) with a timeout up to the next delayed job's time (at most drainDelay, 5 s); "
    "delays are whole milliseconds"
)


async def noop(job: Any, token: str) -> None:
    record(job.data["id"], job.data["due"])


class Producer:
    def __init__(self, url: str) -> None:
        from bullmq import Queue

        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.queue = Queue(QUEUE, {"connection": url})

    async def asend_one(self, it: Item) -> None:
        due, delay = it.timing()
        await self.queue.add("noop", {"id": it.id, "due": due}, {"delay": round(delay * 1000)})

    async def _send(self, items: list[Item]) -> None:
        jobs = []
        for it in items:
            due, delay = it.timing()
            opts = {"delay": round(delay * 1000)}
            jobs.append({"name": "noop", "data": {"id": it.id, "due": due}, "opts": opts})
        await self.queue.addBulk(jobs)

    def send(self, items: list[Item]) -> None:
        self.loop.run_until_complete(self._send(items))

    def close(self) -> None:
        self.loop.run_until_complete(self.queue.close())
        self.loop.close()


def serve(url: str, ready: Callable[[], None]) -> None:
    from bullmq import Worker

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        worker = Worker(QUEUE, noop, {"connection": url})  # autorun: starts its loop
        loop.call_later(0.2, ready)
        await stop.wait()
        await worker.close()

    asyncio.run(main())
