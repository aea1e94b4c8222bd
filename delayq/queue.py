"""The producer and admin API: ``Queue`` (blocking) and ``AsyncQueue`` (asyncio).

Both are thin: each method asks the pure :class:`~delayq.core.QueueCore` for a script call,
or :class:`~delayq.base.QueueBase` for a plan of several, and runs it, so the two differ
only in how they wait.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any, TypeVar, Unpack, overload

import redis
import redis.asyncio as aredis

from delayq import controls
from delayq.base import Progress, QueueBase, T
from delayq.connection import RETRIES, async_client, sync_client
from delayq.controls import Controls, RateLimit
from delayq.core import Op
from delayq.cron import facade as cron
from delayq.errors import ConfigurationError
from delayq.expiring.facade import AsyncExpiring, Expiring
from delayq.runner import (
    AsyncRunner,
    Plan,
    SyncRunner,
    check_plan,
)
from delayq.settings import QueueSettings
from delayq.spec import ScheduleOptions, TaskSpec, TaskType
from delayq.task import QueueStats, Scheduled, TaskInfo, TaskPage, WorkerInfo
from delayq.timing import Duration
from delayq.waits import AsyncWaits, SyncWaits

X = TypeVar("X")  # a typed task's payload type


class Queue(QueueBase[redis.Redis]):
    """A named queue of delayed tasks, used from blocking code.

    Args:
        name: the queue's name; all its keys live under the hash tag ``{name}``.
        url: Redis URL; default ``DELAYQ_REDIS_URL``, else ``REDIS_URL``, else localhost.
        client: an existing client (made with ``decode_responses=False``) instead of ``url``.
        prefix: the first part of every key of the queue (default ``"dq"``: keys
            ``dq:{name}:...``); every process must use the same one.
        dedupe_window: how long a finished task id is remembered (default 24 h): scheduling
            the id again within it changes nothing.
        history_window: how long the dashboard's per-minute history of outcomes and
            lateness is kept (default 24 h, at most 7 days; 0 keeps none). Workers write
            it: theirs is the queue's that counts.
        max_payload: largest encoded payload accepted, in bytes (default 64 KiB).
        codec: ``"json"`` (default) or ``"msgpack"``.

            These three are the queue's settings, which every producer must share: when
            the queue stores them (``delayq settings``, :meth:`update_settings`), a
            queue opened without them follows the stored ones, read with the shard count on
            its first call, and one given a different value is refused (ConfigurationError
            naming both). None (the default) is "not given": the stored value, else the
            default above.
        durable_timeout: with ``schedule(..., durable=True)``, how long to wait for the
            server to confirm the write is fsynced to its append-only file (default 1 s; 3 s
            with ``durable_replicas``).
        durable_replicas: with ``durable=True``, also wait for this many replicas to fsync
            it (WAITAOF; on servers without WAITAOF, WAIT for their acknowledgement).
        shards: split the queue over this many hash tags (Redis Cluster spreads them over
            its primaries); every process must open the queue with the same number.
            ``"stored"`` (``Queue`` only): the number the queue stored (1 if none), read when
            the queue is opened, for tools that open a queue someone else split.
        clock: for tests, a ``delayq.testing.VirtualClock``: every time this queue and a
            worker on it use (due times, leases, backoff, the dedupe window, cron, expiring
            keys) is read from it instead of the server's clock (docs/testing.md).
        before_schedule: functions ``fn(spec)`` given each :class:`TaskSpec` of
            ``schedule`` and ``schedule_many`` before it is validated, after those of
            ``delayq.hooks.before_schedule`` (process-wide, read at each call). ``spec``
            is frozen, but its ``headers`` is always a dict of the hook's own (a copy of
            the caller's, or a new empty one): add to it in place and return None, or
            return a new spec (``dataclasses.replace(spec, payload=...)``). An exception
            from a hook refuses the call, unwritten.
        keep_finished: what a done or aborted task keeps for the dedupe window:
            ``"tombstone"`` (default: its state, finish time, attempts and kind, a few
            bytes; ``get()`` answers those, with a payload of None) or ``"record"`` (its
            whole record, payload included, for those who inspect finished payloads). The
            worker's queue decides for its acks, the producer's for its aborts.
        max_result: the largest result a handler may return, in bytes of JSON (default
            64 KiB); one over it makes the task dead with the reason.
    """

    _client_kinds = (redis.Redis, redis.RedisCluster)
    _waits: SyncWaits | None = None

    def _new_client(self, url: str) -> redis.Redis:
        return sync_client(url, retries=RETRIES)

    @property
    def expiring(self) -> Expiring:
        """Keys with a TTL whose expiry runs a callback: ``set``, ``touch``, ``delete``."""
        return Expiring(self)

    @property
    def runner(self) -> SyncRunner:
        """Runs script calls and plans on this queue's connection (no shard count check)."""
        return self._runner_of(SyncRunner)

    def drive(self, plan: Plan[T]) -> T:
        """Run a plan (``delayq.runner``) on this queue's connection: ``checked`` ones, the
        expiring keys' or an admin's."""
        return self.runner.drive(check_plan(plan))

    def _read_stored(self, op: Op[T]) -> T:
        return self.runner.run(op)

    def _drop_client(self) -> None:
        self.close()

    @overload
    def schedule(
        self, kind: TaskType[X, Any], payload: X, **options: Unpack[ScheduleOptions]
    ) -> Scheduled: ...

    @overload
    def schedule(
        self, kind: str, payload: Any = None, **options: Unpack[ScheduleOptions]
    ) -> Scheduled: ...

    def schedule(
        self,
        kind: str | TaskType[Any, Any],
        payload: Any = None,
        **options: Unpack[ScheduleOptions],
    ) -> Scheduled:
        """Schedule ``kind`` with ``payload`` after ``delay`` seconds or ``at`` a time.

        Returns the task id, a :class:`Scheduled` (a ``str``) whose ``.status`` says what
        happened: ``created``, ``replaced``, ``unchanged`` or ``running``. An id already
        waiting, running, finished within the dedupe window, or dead is left unchanged
        unless ``replace=True``, which moves a waiting task (keeping the attempts it has
        made) and re-creates a finished or dead one; a running task is never replaced, and
        its status is then ``running``. With ``durable=True`` it returns only once the
        server's AOF is fsynced (DurabilityError otherwise).

        Args:
            kind: which handler runs it (``@worker.handler(kind)``), or a
                :class:`~delayq.TaskType`, whose payload type ``payload`` must be of: it is
                written as its kind and the JSON value a plain dict of its fields gives.
            payload: the handler's ``task.payload``: anything the queue's codec encodes
                (for a TaskType, a value of its payload type).
            **options: keyword-only; each is optional.

                - ``delay``: seconds (or a ``timedelta``) from now on the server's clock;
                  with neither ``delay`` nor ``at`` the task is due at once.
                - ``at``: an absolute time, an aware ``datetime`` or a Unix timestamp
                  (not with ``delay``).
                - ``task_id``: the task's id, a business key such as ``"order-close:42"``
                  (default: a new random id).
                - ``replace``: move or re-create a task that has this id (above).
                - ``max_attempts``: this task's limit of attempts, which wins over the
                  handler's (0, the default: the handler's).
                - ``durable``: wait for the server's AOF fsync (see ``durable_timeout``
                  and ``durable_replicas`` of :class:`Queue`).
                - ``headers``: a dict of str to str that travels with the task (trace
                  context, a tenant): ``task.headers`` in the handler, ``TaskInfo.headers``,
                  shown by ``delayq task show`` and the dashboard. At most 4 KiB as JSON;
                  kept across retries, replays and reschedules (``replace=True`` writes the
                  new call's).
                - ``priority``: 0-9; among the tasks due, the higher is claimed first (0,
                  the default, is none: after every prioritised due task, by due time).
                  Never before its due time. Kept across retries and reschedules; a
                  ``replace=True`` that gives none keeps a waiting task's
                  (docs/priorities.md).
        """
        if self.shards.write_checked and not options.get("durable", False):
            # The common case: one call, nothing to plan.
            return self.runner.run(self._schedule_op(kind, payload, options))
        return self.runner.drive(self._schedule_plan(kind, payload, options))

    def schedule_many(
        self,
        tasks: Iterable[TaskSpec | Mapping[str, Any]],
        *,
        replace: bool = False,
        durable: bool = False,
    ) -> list[Scheduled]:
        """Schedule many tasks in a few round trips; all are validated before any is sent.
        Returns a :class:`Scheduled` per task, in the order given (see :meth:`schedule`).

        ``tasks``: :class:`TaskSpec` objects, or dicts of their fields. mypy checks a typed
        task's payload in a ``TaskSpec`` only; in a dict it is checked at run time."""
        return self.runner.drive(self._schedule_many_plan(tasks, replace, durable))

    def cancel(self, task_id: str) -> bool:
        """Remove a waiting task; True if it was still waiting."""
        return self.runner.drive(self._checked(self._of(task_id).cancel(task_id)))

    def abort(self, task_id: str) -> bool:
        """End a task for good, waiting or running; True if it was either. A running
        attempt is stopped: an async handler is cancelled, a sync one sees ``task.aborted``;
        its result is discarded and it is not retried. The task shows as ``"aborted"`` for
        the dedupe window. False for a task that is done, dead, aborted or unknown."""
        return self.runner.drive(self._checked(self._of(task_id).abort(task_id)))

    def reschedule(
        self, task_id: str, *, delay: Duration | None = None, at: datetime | float | None = None
    ) -> bool:
        """Move a waiting task to a new due time; True if it was waiting."""
        op = self._of(task_id).reschedule(task_id, delay=delay, at=at)
        return self.runner.drive(self._checked(op))

    def get(self, task_id: str) -> TaskInfo | None:
        """The task with this id (its state, times, attempts, headers, payload, last error
        and result), or None if the queue holds no such task. A done or aborted task answers
        from its tombstone (see :class:`~delayq.task.TaskInfo`)."""
        return self.runner.drive(self._checked(self._of(task_id).get(task_id)))

    def wait(self, task_id: str, timeout: Duration = 30.0) -> TaskInfo:
        """Block until the task is done, dead or aborted, and return it as :meth:`get`
        does (``result`` holds what its handler returned). No polling: the script that
        finishes it tells this queue (docs/concepts.md, "Results").

        Raises:
            TimeoutError: it has not finished within ``timeout`` (seconds, or a timedelta).
            TaskNotFound: the queue holds no such task (never scheduled, cancelled, even
                while waited for, or forgotten after its dedupe window); at once.
        """
        if self._waits is None:
            self._waits = SyncWaits(self.client, self._of)
        return self._waits.wait(
            self._of(task_id), task_id, timeout, lambda op: self.runner.drive(self._checked(op))
        )

    def stats(self) -> QueueStats:
        """How many tasks are in each state, the head of the schedule and the queue's
        counters, as of the server's clock (every shard of a split queue added up)."""
        return self.runner.drive(self._stats_plan())

    def dead(self, offset: int = 0, limit: int = 100) -> list[TaskInfo]:
        """A page of the dead set, most recent first."""
        return self.runner.drive(self._dead_plan(offset, limit))

    def page(self, state: str, *, limit: int = 100, after: str | None = None) -> TaskPage:
        """A page of the tasks in one state: ``"scheduled"`` (by due time), ``"active"`` (by
        lease deadline), ``"done"`` (by finish time), ``"aborted"`` (by abort time) or
        ``"dead"`` (most recent first). Pass
        the page's ``next`` as ``after`` for the following one: every page costs about the
        same however deep it is (on a sharded queue, at most ``limit`` from each shard),
        unlike ``dead(offset=...)``."""
        return self.runner.drive(self._page_plan(state, limit, after))

    def schedules(self) -> list[cron.ScheduleInfo]:
        """The periodic schedules stored on this queue (``delayq cron list``), by name."""
        return self.runner.drive(self._schedules_plan())

    def workers(self) -> list[WorkerInfo]:
        """Workers registered on this queue, most recently seen first, dead ones included."""
        return self.runner.drive(self._checked(self.core.workers()))

    def protocol_version(self) -> str:
        """The delayq protocol version the queue speaks, as stored in Redis (``"1.0"``), or
        ``""`` when it has none: nothing has written to it yet, or only a delayq from
        before versions were stored (it speaks protocol 1). Refuses, as every operation
        does, a queue of another major (ProtocolVersionError) or shard count. One round
        trip, every call; writes nothing."""
        return self.runner.drive(self._protocol_plan())

    def settings(self) -> QueueSettings:
        """The settings this queue's producers follow (``delayq settings``): the dedupe
        window, the largest payload and the codec, each as stored with the queue, else as
        this process was given it, else the default; ``.stored`` names those stored. Read
        now (one round trip, every call), and followed by this queue object from now on;
        an argument of this queue that disagrees with a stored value is refused
        (ConfigurationError naming both), as on any first call. Writes nothing."""
        return self.runner.drive(self._settings_plan())

    def update_settings(
        self,
        *,
        dedupe_window: Duration | None = None,
        max_payload: int | None = None,
        codec: str | None = None,
    ) -> QueueSettings:
        """Store settings with the queue, for every process of it (None: leave it as it
        is); returns the settings this queue object follows from now on. A process that
        has already made a call keeps those it read (docs/configuration.md): restart the
        others. Setting begins a queue, as its first write does."""
        return self.runner.drive(self._update_settings_plan(dedupe_window, max_payload, codec))

    def execute(self, op: Op[T], *, write: bool = False) -> T:
        """Run one script call built by delayq's builders (``delayq.expiring``'s ops, say)
        on this queue, after the check that the queue is opened with its stored shard
        count. ``write``: the call writes, and stores the count when none is stored."""
        return self.runner.drive(self.checked(op, write=write))

    def replay(self, ids: Iterable[str] | None = None, *, progress: Progress | None = None) -> int:
        """Run dead tasks again (all of them when ``ids`` is None); returns how many.
        ``progress`` hears how many each batch (one script call) replayed."""
        return self.runner.drive(self._replay_plan(ids, progress))

    def purge_dead(
        self,
        ids: Iterable[str] | None = None,
        *,
        older_than: Duration | None = None,
        progress: Progress | None = None,
    ) -> int:
        """Delete dead tasks for good: these ids, or all (that died ``older_than`` ago).
        ``progress`` hears how many each batch deleted."""
        return self.runner.drive(self._purge_plan(ids, older_than, progress))

    # -- admission controls (docs/controls.md) ------------------------------------------

    def set_rate_limit(self, rate: str, burst: int | None = None) -> RateLimit:
        """Let workers start at most ``rate`` tasks ("100/s", "30/m", "2/h") of this queue,
        all workers together, with bursts of up to ``burst`` (default: one second's worth,
        at least 1). Tasks over the limit wait, scheduled; nothing is retried for it.
        Raises ConfigurationError for a bad rate or burst, before anything is written."""
        return self.runner.drive(self._set_limit_plan(controls.rate_limit(rate, burst)))

    def rate_limit(self) -> RateLimit | None:
        """The queue's rate limit, None when it has none."""
        return self.controls().limit

    def clear_rate_limit(self) -> None:
        """Remove the rate limit: claims take every due task again."""
        self.runner.drive(self._set_limit_plan(None))

    def pause(self) -> bool:
        """Stop workers claiming this queue's tasks (running ones finish and are written;
        expired leases are still reaped); True unless it was paused already."""
        return self.runner.drive(self._pause_plan(True))

    def resume(self) -> bool:
        """Let workers claim again; idle workers hear of it at once (a wake-up). True unless
        it was not paused."""
        return self.runner.drive(self._pause_plan(False))

    def paused(self) -> bool:
        """Whether the queue is paused (:meth:`pause`)."""
        return self.controls().paused

    def controls(self) -> Controls:
        """The queue's admission controls: paused, the rate limit and its tokens now."""
        return self.runner.drive(self._read_controls_plan())

    def close(self) -> None:
        """Close the connections the queue opened (a ``client=`` given stays open); ``with
        Queue(...) as queue:`` closes them at the end."""
        if self._waits is not None:
            self._waits.close()
        if self._owns_client:
            if self._runner is not None and self._runner.held is not None:
                self._runner.held.close()
            self.client.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncQueue(QueueBase[aredis.Redis]):
    """The same queue for asyncio code: every method of :class:`Queue`, as a coroutine.

    It takes the arguments of :class:`Queue`, except ``shards="stored"`` (an asyncio
    client cannot read the stored count while the queue is opened): pass the number.
    ``client``, if given, is a ``redis.asyncio`` client.
    """

    _client_kinds = (aredis.Redis, aredis.RedisCluster)
    _awaits: AsyncWaits | None = None

    def _new_client(self, url: str) -> aredis.Redis:
        return async_client(url, retries=RETRIES)

    @property
    def expiring(self) -> AsyncExpiring:
        return AsyncExpiring(self)

    @property
    def runner(self) -> AsyncRunner:
        return self._runner_of(AsyncRunner)

    async def drive(self, plan: Plan[T]) -> T:
        """Run a plan on this queue's connection (see :meth:`Queue.drive`)."""
        return await self.runner.drive(check_plan(plan))

    def _read_stored(self, op: Op[T]) -> T:
        raise ConfigurationError(
            'shards="stored" reads the count as the queue is opened, which an AsyncQueue '
            'cannot do: pass the number (Queue(name, shards="stored").shards.n tells it)'
        )

    def _drop_client(self) -> None:
        pass  # not connected yet: an asyncio client connects on its first command

    @overload
    async def schedule(
        self, kind: TaskType[X, Any], payload: X, **options: Unpack[ScheduleOptions]
    ) -> Scheduled: ...

    @overload
    async def schedule(
        self, kind: str, payload: Any = None, **options: Unpack[ScheduleOptions]
    ) -> Scheduled: ...

    async def schedule(
        self,
        kind: str | TaskType[Any, Any],
        payload: Any = None,
        **options: Unpack[ScheduleOptions],
    ) -> Scheduled:
        if self.shards.write_checked and not options.get("durable", False):
            return await self.runner.run(self._schedule_op(kind, payload, options))  # as Queue's
        return await self.runner.drive(self._schedule_plan(kind, payload, options))

    async def schedule_many(
        self,
        tasks: Iterable[TaskSpec | Mapping[str, Any]],
        *,
        replace: bool = False,
        durable: bool = False,
    ) -> list[Scheduled]:
        return await self.runner.drive(self._schedule_many_plan(tasks, replace, durable))

    async def cancel(self, task_id: str) -> bool:
        return await self.runner.drive(self._checked(self._of(task_id).cancel(task_id)))

    async def abort(self, task_id: str) -> bool:
        return await self.runner.drive(self._checked(self._of(task_id).abort(task_id)))

    async def reschedule(
        self, task_id: str, *, delay: Duration | None = None, at: datetime | float | None = None
    ) -> bool:
        op = self._of(task_id).reschedule(task_id, delay=delay, at=at)
        return await self.runner.drive(self._checked(op))

    async def get(self, task_id: str) -> TaskInfo | None:
        return await self.runner.drive(self._checked(self._of(task_id).get(task_id)))

    async def wait(self, task_id: str, timeout: Duration = 30.0) -> TaskInfo:
        if self._awaits is None:
            self._awaits = AsyncWaits(self.client, self._of)
        return await self._awaits.wait(
            self._of(task_id), task_id, timeout, lambda op: self.runner.drive(self._checked(op))
        )

    async def stats(self) -> QueueStats:
        return await self.runner.drive(self._stats_plan())

    async def dead(self, offset: int = 0, limit: int = 100) -> list[TaskInfo]:
        return await self.runner.drive(self._dead_plan(offset, limit))

    async def page(self, state: str, *, limit: int = 100, after: str | None = None) -> TaskPage:
        return await self.runner.drive(self._page_plan(state, limit, after))

    async def schedules(self) -> list[cron.ScheduleInfo]:
        return await self.runner.drive(self._schedules_plan())

    async def workers(self) -> list[WorkerInfo]:
        return await self.runner.drive(self._checked(self.core.workers()))

    async def protocol_version(self) -> str:
        """The queue's protocol version (see :meth:`Queue.protocol_version`)."""
        return await self.runner.drive(self._protocol_plan())

    async def settings(self) -> QueueSettings:
        """The queue's settings (see :meth:`Queue.settings`)."""
        return await self.runner.drive(self._settings_plan())

    async def update_settings(
        self,
        *,
        dedupe_window: Duration | None = None,
        max_payload: int | None = None,
        codec: str | None = None,
    ) -> QueueSettings:
        """Store settings with the queue (see :meth:`Queue.update_settings`)."""
        return await self.runner.drive(
            self._update_settings_plan(dedupe_window, max_payload, codec)
        )

    async def execute(self, op: Op[T], *, write: bool = False) -> T:
        """Run one script call on this queue after the shard count check (see
        :meth:`Queue.execute`)."""
        return await self.runner.drive(self.checked(op, write=write))

    async def replay(
        self, ids: Iterable[str] | None = None, *, progress: Progress | None = None
    ) -> int:
        return await self.runner.drive(self._replay_plan(ids, progress))

    async def purge_dead(
        self,
        ids: Iterable[str] | None = None,
        *,
        older_than: Duration | None = None,
        progress: Progress | None = None,
    ) -> int:
        return await self.runner.drive(self._purge_plan(ids, older_than, progress))

    # -- admission controls: as on Queue ------------------------------------------------

    async def set_rate_limit(self, rate: str, burst: int | None = None) -> RateLimit:
        return await self.runner.drive(self._set_limit_plan(controls.rate_limit(rate, burst)))

    async def rate_limit(self) -> RateLimit | None:
        return (await self.controls()).limit

    async def clear_rate_limit(self) -> None:
        await self.runner.drive(self._set_limit_plan(None))

    async def pause(self) -> bool:
        return await self.runner.drive(self._pause_plan(True))

    async def resume(self) -> bool:
        return await self.runner.drive(self._pause_plan(False))

    async def paused(self) -> bool:
        return (await self.controls()).paused

    async def controls(self) -> Controls:
        return await self.runner.drive(self._read_controls_plan())

    async def close(self) -> None:
        if self._awaits is not None:
            await self._awaits.close()
        if self._owns_client:
            if self._runner is not None and self._runner.held is not None:
                await self._runner.held.close()
            await self.client.aclose()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
