"""delayq: ``Queue.schedule_many`` and one ``Worker`` with its defaults."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable

from harness import QUEUE, Item, record

from delayq import AsyncQueue, Queue, Task, TaskSpec, Worker

NAME = "delayq"
DISTS = ("delayq", "redis")
MODULES = ("delayq",)
PRODUCE = "Queue.schedule_many([TaskSpec(kind, payload, at=due), ...]) (its batch call)"
SETTINGS = (
    "Worker(queue) defaults: concurrency 16, lease 30 s, lookahead 20 ms, max_wait 15 s; "
    "async handler"
)
POLL = (
    "no polling: claims tasks due within 20 ms and starts each on a local timer at its due "
    "time (and, for handlers that fast, as many as it will start within 20 ms, up to 1,000 "
    "ahead); sleeps until the next due time, lease deadline or pub/sub wake-up, at most 15 s "
    "(max_wait)"
)
KIND = "bench.noop"


class Producer:
    def __init__(self, url: str) -> None:
        self.queue = Queue(QUEUE, url=url)

    def send(self, items: list[Item]) -> None:
        specs = []
        for it in items:
            if it.due_at is not None:
                specs.append(TaskSpec(KIND, {"id": it.id, "due": it.due_at}, at=it.due_at))
            else:
                due, delay = it.timing()
                specs.append(TaskSpec(KIND, {"id": it.id, "due": due}, delay=delay))
        self.queue.schedule_many(specs)

    def close(self) -> None:
        self.queue.close()


class LoopProducer(Producer):
    """``Queue.schedule`` once per task: the per-call figure shown next to the batch one."""

    def send_one(self, it: Item) -> None:
        due, delay = it.timing()
        if it.due_at is not None:
            self.queue.schedule(KIND, {"id": it.id, "due": due}, at=due)
        else:
            self.queue.schedule(KIND, {"id": it.id, "due": due}, delay=delay)

    def send(self, items: list[Item]) -> None:
        for it in items:
            self.send_one(it)


class AsyncLoopProducer:
    """``await AsyncQueue.schedule`` once per task, on one event loop (a web handler's way)."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.queue = AsyncQueue(QUEUE, url=url)

    async def asend_one(self, it: Item) -> None:
        due, delay = it.timing()
        if it.due_at is not None:
            await self.queue.schedule(KIND, {"id": it.id, "due": due}, at=due)
        else:
            await self.queue.schedule(KIND, {"id": it.id, "due": due}, delay=delay)

    async def _send(self, items: list[Item]) -> None:
        for it in items:
            await self.asend_one(it)

    def send(self, items: list[Item]) -> None:
        self.loop.run_until_complete(self._send(items))

    def close(self) -> None:
        self.loop.run_until_complete(self.queue.close())
        self.loop.close()


# producer_main.py --variant NAME: the one-call-per-task producers shown beside the peers'
VARIANTS = {"sync": LoopProducer, "async": AsyncLoopProducer}


def serve(url: str, ready: Callable[[], None]) -> None:
    queue = Queue(QUEUE, url=url)
    # The table uses Worker's defaults; BENCH_DELAYQ_CONCURRENCY is for probing by hand.
    conc = os.environ.get("BENCH_DELAYQ_CONCURRENCY")
    worker = Worker(queue, concurrency=int(conc)) if conc else Worker(queue)

    @worker.handler(KIND)
    async def noop(task: Task) -> None:
        record(task.payload["id"], task.payload["due"])

    async def main() -> None:
        task = asyncio.create_task(worker.serve(install_signals=True))
        deadline = time.monotonic() + 10  # ready once the wake-up subscription is live
        while time.monotonic() < deadline and not task.done():
            subscribed = getattr(getattr(worker, "waker", None), "subscribed", None)
            if subscribed is None or subscribed.is_set():
                break
            await asyncio.sleep(0.005)
        ready()
        await task

    try:
        asyncio.run(main())
    finally:
        with contextlib.suppress(Exception):
            queue.close()
