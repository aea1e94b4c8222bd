"""The producer and admin API: ``Queue`` (blocking) and ``AsyncQueue`` (asyncio).

Both are thin: each method asks the pure :class:`~delayq.core.QueueCore` for a script call
and runs it, so the two differ only in how they wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from itertools import islice
from typing import Any, Generic, TypeVar, Unpack

import redis
import redis.asyncio as aredis

from .codec import DEFAULT_MAX_PAYLOAD
from .connection import async_client, check_client, resolve_url, sync_client
from .core import (
    DEFAULT_DEDUPE_WINDOW,
    REPLY_BATCH,
    Op,
    QueueCore,
    ScheduleOptions,
    TaskSpec,
)
from .errors import InvalidTaskError
from .expiring import AsyncExpiring, Expiring
from .keys import DEFAULT_PREFIX
from .runner import AsyncRunner, Plan, SyncRunner, batch_plan
from .task import QueueStats, TaskInfo, WorkerInfo
from .timing import Duration, seconds

T = TypeVar("T")
C = TypeVar("C", redis.Redis, aredis.Redis)

SCHEDULE_BATCH = 1000  # tasks per script call in schedule_many
CALLS_PER_ROUND_TRIP = 8


def _spec(kind: str, payload: Any, options: ScheduleOptions) -> TaskSpec:
    unknown = set(options) - {"delay", "at", "task_id", "replace", "max_attempts", "durable"}
    if unknown:
        raise InvalidTaskError(f"unknown schedule option(s): {', '.join(sorted(unknown))}")
    return TaskSpec(
        kind,
        payload,
        delay=options.get("delay"),
        at=options.get("at"),
        task_id=options.get("task_id"),
        max_attempts=options.get("max_attempts", 0),
    )


def _as_spec(item: TaskSpec | Mapping[str, Any]) -> TaskSpec:
    if isinstance(item, TaskSpec):
        return item
    try:
        return TaskSpec(**item)
    except TypeError as e:
        raise InvalidTaskError(f"schedule_many item {item!r} is not a task: {e}") from None


def _chunks(items: Iterable[T], size: int) -> Iterator[list[T]]:
    it = iter(items)
    while chunk := list(islice(it, size)):
        yield chunk


class _Base(Generic[C]):
    """A named queue of delayed tasks (configuration shared by both flavours).

    Args:
        name: the queue's name; all its keys live under the hash tag ``{name}``.
        url: Redis URL; default ``DELAYQ_REDIS_URL``, else ``REDIS_URL``, else localhost.
        client: an existing client (made with ``decode_responses=False``) instead of ``url``.
        dedupe_window: how long a finished task id is remembered (default 24 h): scheduling
            the id again within it changes nothing.
        max_payload: largest encoded payload accepted, in bytes (default 64 KiB).
        codec: ``"json"`` (default) or ``"msgpack"``.
        durable_timeout: with ``schedule(..., durable=True)``, how long to wait for the
            server to confirm the write is fsynced to its append-only file.
    """

    def __init__(
        self,
        name: str,
        url: str | None = None,
        *,
        client: C | None = None,
        prefix: str = DEFAULT_PREFIX,
        codec: str = "json",
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        dedupe_window: Duration = DEFAULT_DEDUPE_WINDOW,
        durable_timeout: Duration = 1.0,
    ) -> None:
        # durable=True waits this long for the server's AOF fsync (everysec: up to ~1 s).
        self.durable_ms = max(1, round(seconds(durable_timeout, "durable_timeout") * 1000))
        self.core = QueueCore(
            name, prefix=prefix, codec=codec, max_payload=max_payload, dedupe_window=dedupe_window
        )
        self.url = resolve_url(url)
        if client is not None:
            check_client(client)
        self._owns_client = client is None
        self.client: C = client if client is not None else self._new_client(self.url)

    def _new_client(self, url: str) -> C:
        raise NotImplementedError

    @property
    def name(self) -> str:
        return self.core.name

    def _schedule_ops(
        self, tasks: Iterable[TaskSpec | Mapping[str, Any]], replace: bool
    ) -> list[Op[list[str]]]:
        # Validate and encode everything first: a bad task refuses the whole call unwritten.
        specs = [_as_spec(t) for t in tasks]
        ops = [self.core.schedule(c, replace=replace) for c in _chunks(specs, SCHEDULE_BATCH)]
        ids = [i for op in ops for i in op.parse(None)]
        if len(set(ids)) != len(ids):
            raise InvalidTaskError("the same task_id appears twice in one schedule_many call")
        return ops

    # Multi-step operations, written once as plans (see runner.py); each flavour drives them.

    def _schedule_many_plan(
        self, tasks: Iterable[TaskSpec | Mapping[str, Any]], replace: bool, durable: bool
    ) -> Plan[list[str]]:
        ops = self._schedule_ops(tasks, replace)
        ids: list[str] = []
        wait = self.durable_ms if durable else None
        for group in _chunks(ops, CALLS_PER_ROUND_TRIP):
            for reply in (yield from batch_plan(group, wait)):
                ids.extend(reply)
        return ids

    def _replay_plan(self, ids: Iterable[str] | None) -> Plan[int]:
        total = 0
        if ids is not None:
            for chunk in _chunks(ids, REPLY_BATCH):
                total += yield ("run", self.core.replay(chunk))
            return total
        while n := (yield ("run", self.core.replay(None))):
            total += n
        return total

    def _purge_plan(self, ids: Iterable[str] | None, older_than: Duration | None) -> Plan[int]:
        total = 0
        if ids is not None:
            for chunk in _chunks(ids, REPLY_BATCH):
                total += yield ("run", self.core.purge_dead(chunk))
            return total
        before = None
        if older_than is not None:
            stats: QueueStats = yield ("run", self.core.stats())
            before = int(stats.now.timestamp() * 1000 - seconds(older_than, "older_than") * 1000)
        while n := (yield ("run", self.core.purge_dead(None, before_ms=before))):
            total += n
        return total

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Queue(_Base[redis.Redis]):
    """A named queue of delayed tasks, used from blocking code (arguments: see ``_Base``)."""

    def _new_client(self, url: str) -> redis.Redis:
        return sync_client(url)

    @property
    def expiring(self) -> Expiring:
        """Keys with a TTL whose expiry runs a callback: ``set``, ``touch``, ``delete``."""
        return Expiring(self)

    @property
    def _runner(self) -> SyncRunner:
        return SyncRunner(self.client)

    def schedule(self, kind: str, payload: Any = None, **options: Unpack[ScheduleOptions]) -> str:
        """Schedule ``kind`` with ``payload`` after ``delay`` seconds or ``at`` a time.

        Returns the task id. An id already waiting, running, finished within the dedupe
        window, or dead is left unchanged unless ``replace=True``. With ``durable=True`` it
        returns only once the server's AOF is fsynced (DurabilityError otherwise).
        """
        op = self.core.schedule(
            [_spec(kind, payload, options)], replace=options.get("replace", False)
        )
        if options.get("durable"):
            ids: list[str] = self._runner.run_many([op], durable_ms=self.durable_ms)[0]
            return ids[0]
        return self._runner.run(op)[0]

    def schedule_many(
        self,
        tasks: Iterable[TaskSpec | Mapping[str, Any]],
        *,
        replace: bool = False,
        durable: bool = False,
    ) -> list[str]:
        """Schedule many tasks in a few round trips; all are validated before any is sent."""
        return self._runner.drive(self._schedule_many_plan(tasks, replace, durable))

    def cancel(self, task_id: str) -> bool:
        """Remove a waiting task; True if it was still waiting."""
        return self._runner.run(self.core.cancel(task_id))

    def reschedule(
        self, task_id: str, *, delay: Duration | None = None, at: datetime | float | None = None
    ) -> bool:
        """Move a waiting task to a new due time; True if it was waiting."""
        return self._runner.run(self.core.reschedule(task_id, delay=delay, at=at))

    def get(self, task_id: str) -> TaskInfo | None:
        return self._runner.run(self.core.get(task_id))

    def stats(self) -> QueueStats:
        return self._runner.run(self.core.stats())

    def dead(self, offset: int = 0, limit: int = 100) -> list[TaskInfo]:
        """A page of the dead set, most recent first."""
        return self._runner.run(self.core.dead(offset, limit))

    def workers(self) -> list[WorkerInfo]:
        """Workers registered on this queue, most recently seen first, dead ones included."""
        return self._runner.run(self.core.workers())

    def replay(self, ids: Iterable[str] | None = None) -> int:
        """Run dead tasks again (all of them when ``ids`` is None); returns how many."""
        return self._runner.drive(self._replay_plan(ids))

    def purge_dead(
        self, ids: Iterable[str] | None = None, *, older_than: Duration | None = None
    ) -> int:
        """Delete dead tasks for good: these ids, or all (that died ``older_than`` ago)."""
        return self._runner.drive(self._purge_plan(ids, older_than))

    def close(self) -> None:
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncQueue(_Base[aredis.Redis]):
    """The same queue for asyncio code: every method of :class:`Queue`, as a coroutine."""

    def _new_client(self, url: str) -> aredis.Redis:
        return async_client(url)

    @property
    def expiring(self) -> AsyncExpiring:
        return AsyncExpiring(self)

    @property
    def _runner(self) -> AsyncRunner:
        return AsyncRunner(self.client)

    async def schedule(
        self, kind: str, payload: Any = None, **options: Unpack[ScheduleOptions]
    ) -> str:
        op = self.core.schedule(
            [_spec(kind, payload, options)], replace=options.get("replace", False)
        )
        if options.get("durable"):
            ids: list[str] = (await self._runner.run_many([op], durable_ms=self.durable_ms))[0]
            return ids[0]
        return (await self._runner.run(op))[0]

    async def schedule_many(
        self,
        tasks: Iterable[TaskSpec | Mapping[str, Any]],
        *,
        replace: bool = False,
        durable: bool = False,
    ) -> list[str]:
        return await self._runner.drive(self._schedule_many_plan(tasks, replace, durable))

    async def cancel(self, task_id: str) -> bool:
        return await self._runner.run(self.core.cancel(task_id))

    async def reschedule(
        self, task_id: str, *, delay: Duration | None = None, at: datetime | float | None = None
    ) -> bool:
        return await self._runner.run(self.core.reschedule(task_id, delay=delay, at=at))

    async def get(self, task_id: str) -> TaskInfo | None:
        return await self._runner.run(self.core.get(task_id))

    async def stats(self) -> QueueStats:
        return await self._runner.run(self.core.stats())

    async def dead(self, offset: int = 0, limit: int = 100) -> list[TaskInfo]:
        return await self._runner.run(self.core.dead(offset, limit))

    async def workers(self) -> list[WorkerInfo]:
        return await self._runner.run(self.core.workers())

    async def replay(self, ids: Iterable[str] | None = None) -> int:
        return await self._runner.drive(self._replay_plan(ids))

    async def purge_dead(
        self, ids: Iterable[str] | None = None, *, older_than: Duration | None = None
    ) -> int:
        return await self._runner.drive(self._purge_plan(ids, older_than))

    async def close(self) -> None:
        if self._owns_client:
            await self.client.aclose()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
