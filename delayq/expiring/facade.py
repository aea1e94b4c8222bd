"""``queue.expiring``: set, touch and delete watched keys, and what a callback receives.

Each call is two writes: delayq's record (one script on the queue's keys, ``ops.py``) and
the key itself (one command on the key); see ``ops.py`` for the order that never loses an
expiry.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from delayq.expiring.ops import delete_op, encode_value, set_op, touch_op
from delayq.task import Task
from delayq.timing import Duration, ms_to_datetime

if TYPE_CHECKING:
    from delayq.queue import AsyncQueue, Queue

Via = Literal["timer", "notification", "scan"]


@dataclass(frozen=True)
class Expired:
    """What an ``on_expire`` callback receives."""

    key: str
    value: Any  # the last value set through delayq (None for a foreign key)
    deadline: datetime  # the recorded deadline (for a foreign key: when the bell rang)
    via: Via
    guaranteed: bool  # False for keys delayq did not record (set by other programs)
    task: Task


class Expiring:
    """``queue.expiring`` for blocking code."""

    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def set(self, key: str, value: Any, ttl: Duration) -> datetime:
        """Set ``key`` to ``value`` (JSON) with a TTL; the ``on_expire`` callback whose pattern
        matches gets the value once the key expires. Returns the deadline (server clock)."""
        core = self._queue.core
        data = encode_value(core, value)
        deadline = self._queue.execute(set_op(core, key, data, ttl), write=True)
        self._queue.client.set(key, data, pxat=deadline)
        return ms_to_datetime(deadline)

    def touch(self, key: str, ttl: Duration) -> bool:
        """Give a watched key a new TTL; False if it is not watched or has expired (its
        callback then runs as it would have)."""
        deadline = self._queue.execute(touch_op(self._queue.core, key, ttl))
        if deadline < 0:
            return False
        return bool(self._queue.client.pexpireat(key, deadline))

    def delete(self, key: str) -> bool:
        """Delete a watched key without a callback; True if it had not expired. An expiry
        that happened (waiting, running or retrying) is still delivered: False."""
        cancelled = self._queue.execute(delete_op(self._queue.core, key))
        self._queue.client.delete(key)
        return cancelled


class AsyncExpiring:
    """``queue.expiring`` for asyncio code: the same methods as coroutines."""

    def __init__(self, queue: AsyncQueue) -> None:
        self._queue = queue

    async def set(self, key: str, value: Any, ttl: Duration) -> datetime:
        core = self._queue.core
        data = encode_value(core, value)
        deadline = await self._queue.execute(set_op(core, key, data, ttl), write=True)
        await self._queue.client.set(key, data, pxat=deadline)
        return ms_to_datetime(deadline)

    async def touch(self, key: str, ttl: Duration) -> bool:
        deadline = await self._queue.execute(touch_op(self._queue.core, key, ttl))
        if deadline < 0:
            return False
        return bool(await self._queue.client.pexpireat(key, deadline))

    async def delete(self, key: str) -> bool:
        cancelled = await self._queue.execute(delete_op(self._queue.core, key))
        await self._queue.client.delete(key)
        return cancelled
