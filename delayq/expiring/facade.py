"""``queue.expiring``: set, touch and delete watched keys, and what a callback receives.

Each call is two writes: delayq's record (one script on the queue's keys, ``ops.py``) and
the key itself (one command on the key); see ``ops.py`` for the order that never loses an
expiry.

Each method is one plan (``runner.py``), written once: ``Expiring`` and ``AsyncExpiring`` only
drive it on their queue. The facade knows a queue by what it needs of one (``PlanHost``), so it
does not import ``delayq.queue``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal, Protocol, TypeVar

from delayq.core import Op, QueueCore
from delayq.expiring.ops import delete_op, encode_value, set_op, touch_op
from delayq.runner import Plan, command
from delayq.task import Task
from delayq.timing import Duration, ms_to_datetime

T = TypeVar("T")
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


class PlanHost(Protocol):
    """What the plans need of a queue: its (home) core, and a script call after the queue's
    shard count check (``Queue.checked``)."""

    @property
    def core(self) -> QueueCore: ...

    def checked(self, op: Op[T], *, write: bool = False) -> Plan[T]: ...


class SyncHost(PlanHost, Protocol):
    def drive(self, plan: Plan[T]) -> T: ...


class AsyncHost(PlanHost, Protocol):
    async def drive(self, plan: Plan[T]) -> T: ...


# -- the plans -----------------------------------------------------------------------------------


def set_plan(queue: PlanHost, key: str, value: Any, ttl: Duration) -> Plan[datetime]:
    core = queue.core
    data = encode_value(core, value)
    deadline = yield from queue.checked(set_op(core, key, data, ttl), write=True)
    yield from command("SET", key, data, "PXAT", core.server_ms(deadline))
    return ms_to_datetime(deadline)


def touch_plan(queue: PlanHost, key: str, ttl: Duration) -> Plan[bool]:
    deadline = yield from queue.checked(touch_op(queue.core, key, ttl))
    if deadline < 0:
        return False
    return bool((yield from command("PEXPIREAT", key, queue.core.server_ms(deadline))))


def delete_plan(queue: PlanHost, key: str) -> Plan[bool]:
    cancelled = yield from queue.checked(delete_op(queue.core, key))
    yield from command("DEL", key)
    return cancelled


# -- the two flavours -------------------------------------------------------------------------


class Expiring:
    """``queue.expiring`` for blocking code."""

    def __init__(self, queue: SyncHost) -> None:
        self.queue = queue

    def set(self, key: str, value: Any, ttl: Duration) -> datetime:
        """Set ``key`` to ``value`` (JSON) with a TTL; the ``on_expire`` callback whose pattern
        matches gets the value once the key expires. Returns the deadline (server clock)."""
        return self.queue.drive(set_plan(self.queue, key, value, ttl))

    def touch(self, key: str, ttl: Duration) -> bool:
        """Give a watched key a new TTL; False if it is not watched or has expired (its
        callback then runs as it would have)."""
        return self.queue.drive(touch_plan(self.queue, key, ttl))

    def delete(self, key: str) -> bool:
        """Delete a watched key without a callback; True if it had not expired. An expiry
        that happened (waiting, running or retrying) is still delivered: False."""
        return self.queue.drive(delete_plan(self.queue, key))


class AsyncExpiring:
    """``queue.expiring`` for asyncio code: the same methods as coroutines."""

    def __init__(self, queue: AsyncHost) -> None:
        self.queue = queue

    async def set(self, key: str, value: Any, ttl: Duration) -> datetime:
        return await self.queue.drive(set_plan(self.queue, key, value, ttl))

    async def touch(self, key: str, ttl: Duration) -> bool:
        return await self.queue.drive(touch_plan(self.queue, key, ttl))

    async def delete(self, key: str) -> bool:
        return await self.queue.drive(delete_plan(self.queue, key))


# What ``Worker.on_expire`` decorates: called with the key's Expired, sync or async.
ExpireFn = Callable[[Expired], Any]
