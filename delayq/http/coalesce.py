"""Single schedule requests that arrive together go to Redis together.

Each ``POST /v1/queues/{queue}/tasks`` is one task. Sent one by one, every request costs a
round trip of its own; concurrent requests for the same queue (and the same ``replace`` and
``durable``) are instead gathered and sent as one ``schedule_many``: the first to arrive
starts a flush on the loop's next pass, and whatever arrives while a flush is in flight
goes in the next one (the worker's ``Finisher`` batches outcomes the same way). A request
still gets its own answer: a ``schedule_many`` refused because of one task (a payload over
the limit, the same id twice) is sent again task by task, so each request gets its own
result or error.
"""

from __future__ import annotations

import asyncio
from typing import Any

from delayq.base import SCHEDULE_BATCH
from delayq.errors import InvalidTaskError
from delayq.queue import AsyncQueue
from delayq.spec import TaskSpec
from delayq.task import Scheduled

Key = tuple[AsyncQueue, bool, bool]  # the queue, replace, durable
Waiting = tuple[TaskSpec, "asyncio.Future[Scheduled]"]


class Coalescer:
    def __init__(self) -> None:
        self._pending: dict[Key, list[Waiting]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def schedule(
        self, queue: AsyncQueue, spec: TaskSpec, *, replace: bool, durable: bool
    ) -> Scheduled:
        """``queue.schedule`` of one task, sent with the others waiting to go."""
        key = (queue, replace, durable)
        future: asyncio.Future[Scheduled] = asyncio.get_running_loop().create_future()
        waiting = self._pending.get(key)
        if waiting is None:
            self._pending[key] = waiting = []
            task = asyncio.create_task(self._flush(key))
            self._tasks.add(task)  # (held until done: the loop keeps only weak references)
            task.add_done_callback(self._tasks.discard)
        waiting.append((spec, future))
        return await future

    async def _flush(self, key: Key) -> None:
        """Send what waits for ``key``, in calls of at most SCHEDULE_BATCH tasks; what
        arrives meanwhile starts the next flush."""
        batch = self._pending.pop(key)
        for start in range(0, len(batch), SCHEDULE_BATCH):
            await _send(key, batch[start : start + SCHEDULE_BATCH])


async def _send(key: Key, batch: list[Waiting]) -> None:
    queue, replace, durable = key
    try:
        done = await queue.schedule_many([s for s, _ in batch], replace=replace, durable=durable)
    except InvalidTaskError as e:
        if len(batch) == 1:
            _settle(batch[0][1], error=e)
            return
        # One task spoiled the call (nothing was written): each on its own.
        for spec, future in batch:
            await _send(key, [(spec, future)])
        return
    except Exception as e:  # each request answers with it
        for _, future in batch:
            _settle(future, error=e)
        return
    for (_, future), result in zip(batch, done, strict=True):
        _settle(future, result)


def _settle(
    future: asyncio.Future[Scheduled], result: Any = None, error: BaseException | None = None
) -> None:
    if future.done():  # the request went away
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
