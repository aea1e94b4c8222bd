"""The public ``Worker``: its options, and the decorators that declare what it runs.

What it declares lives on its lanes (``lane.py``: one per queue, with its handlers and
start-up hooks); features plug into a lane as extensions (``features/``: cron, expiring
keys). Serving is the engine's (``engine.py``): ``serve()`` builds one :class:`Engine` and
hands over to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar, overload

from delayq import check, hooks
from delayq.errors import ConfigurationError
from delayq.expiring.facade import ExpireFn
from delayq.hooks import Middleware
from delayq.runner import AsyncRunner
from delayq.spec import TaskType
from delayq.task import Task
from delayq.timing import config_seconds
from delayq.worker import options as opt
from delayq.worker.claimer import Source, sources_of
from delayq.worker.clock import ServerClock
from delayq.worker.context import WorkerContext
from delayq.worker.engine import Engine, contexts, worker_client
from delayq.worker.events import Events, Listener
from delayq.worker.health import Health
from delayq.worker.lane import (
    Lane,
    QueueLike,
    WorkerHook,
    add_handler,
    checked_queues,
    lane_of,
    one_lane,
    registration_text,
    set_weights,
)
from delayq.worker.registry import DEFAULT_MAX_ATTEMPTS, HandlerFn, handler_options, make_handler
from delayq.worker.supervise import Supervisor
from delayq.worker.threads import HandlerThreads

P = TypeVar("P")  # a typed task's payload type
R = TypeVar("R")  # its result type (TaskType[P, R]): what its handler returns
TypedFn = Callable[[Task[P]], R | Awaitable[R]]  # a typed task's handler

if TYPE_CHECKING:
    from delayq.worker.features.cron import Schedules
    from delayq.worker.features.expiring import ExpiryWatcher


class Worker:
    """Runs the handlers of one queue, or of several.

    Args:
        queue: the :class:`Queue` or :class:`AsyncQueue` to work on, or a list of them (on
            one server): ``Worker([orders, emails])``. The worker's slots are shared, and
            claims are split fairly between the queues (docs/concepts.md, "Several queues
            in one worker"); handlers are registered per queue with ``queue=``.
        concurrency: most handlers running at once (also the thread pool's size).
        lease: seconds (or a timedelta) a claim is valid without a heartbeat; a crashed
            worker's tasks run again this long after its last heartbeat.
        grace: on shutdown, how long running handlers may finish before they are handed back.
        lookahead: claim tasks due this soon and start each on a local timer, so handlers
            start within a millisecond or two of their due time.
        max_wait: cap on any idle wait (15 s, at least 0.1 s): how often an idle worker
            looks at the queue anyway, in case a wake-up was lost without its connection
            dropping; the bound on how late such a loss makes a task. An idle worker costs
            about ``5 / max_wait`` commands a second (docs/architecture.md, "The worker's loops").
            It also paces looks at a rate limit and at the shards nothing is known due on.
        client: an existing ``redis.asyncio`` client (made with ``decode_responses=False``)
            for the worker's loops, instead of one it makes from the queue's URL; the worker
            does not close it.
        configure_notifications: with ``on_expire`` callbacks, add the ``E`` and ``x``
            flags to the server's ``notify-keyspace-events`` when they are missing (default);
            ``False`` only checks them (docs/expiring.md).
        unknown_kind_grace: seconds (or a timedelta) a task of a kind this worker has no
            handler for is handed back, its attempt not counted, before it is buried (1 h):
            counted from when it fell due (docs/concepts.md, "A kind no worker handles").
        weights: each queue's share of the claims (``{payments: 5, emails: 1}``; 1-1000, 1
            when left out); a queue with tasks due is never starved (docs/priorities.md).
        strict: claim the queues in order (by ``weights``, else as given), as Asynq's strict
            priority: a busy first queue starves the others, by design.
        freeze_gc: once start-up is done, ``gc.collect()`` then ``gc.freeze()`` (the first
            time any worker in the process serves), so the collector's full passes no longer
            hold the loop for milliseconds while tasks fall due (``worker/collector.py``).
    """

    def __init__(
        self,
        queue: QueueLike | Sequence[QueueLike],
        *,
        concurrency: int = 16,
        lease: float | timedelta = 30,
        grace: float | timedelta = 30,
        lookahead: float = 0.02,
        max_wait: float = 15.0,
        unknown_kind_grace: float | timedelta = 3600,
        client: Any = None,
        configure_notifications: bool = True,
        freeze_gc: bool = True,
        weights: Mapping[QueueLike | str, int] | None = None,
        strict: bool = False,
    ) -> None:
        self.queues = checked_queues(queue)
        self.queue = self.queues[0]  # the first: the only one, usually
        self.core = self.queue.core
        self.concurrency = opt.checked_concurrency(concurrency)
        self.lease_s = opt.checked_lease(lease)
        self.grace_s = config_seconds(grace, "grace")
        self.lookahead_s = config_seconds(lookahead, "lookahead")
        self.max_wait_s = config_seconds(max_wait, "max_wait", 0.1, " (the idle look's pace)")
        self.unknown_kind_grace_s = config_seconds(unknown_kind_grace, "unknown_kind_grace")
        self._client_arg = opt.checked_client(client)
        self.freeze_gc = check.flag(freeze_gc, "freeze_gc")
        self._configure = check.flag(configure_notifications, "configure_notifications")
        # One lane per queue: its registry (the lanes share the on_dead hooks), start-up
        # hooks (on_startup's go with the first), extensions and registration.
        self.lanes = tuple(Lane(q, i) for i, q in enumerate(self.queues))
        for lane in self.lanes[1:]:
            lane.registry.on_dead = self.lanes[0].registry.on_dead
        self.weighted = set_weights(self.lanes, weights)
        self.strict = check.flag(strict, "strict")
        self.clock = ServerClock()
        self.events = Events()
        # Runs the background loops; one that keeps failing stops the worker (WorkerFailed).
        self.supervisor = Supervisor(lambda failed: self._begin_stop())
        self._middleware: list[Middleware] = []
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._started_at = time.time()
        self._stop_requested = threading.Event()
        self.engine: Engine | None = None  # the serving one (the last, once it has served)
        self.health = Health(self.max_wait_s)  # what /livez and /readyz answer (health.py)

    # -- registration ---------------------------------------------------------------------

    @overload
    def handler(
        self,
        kind: TaskType[P, R],
        *,
        max_attempts: int | None = None,
        backoff: Any = None,
        jitter: float | None = None,
        timeout: float | timedelta | None = None,
        concurrency: int | None = None,
        queue: QueueLike | str | None = None,
    ) -> Callable[[TypedFn[P, R]], TypedFn[P, R]]: ...

    @overload
    def handler(
        self,
        kind: str,
        *,
        max_attempts: int | None = None,
        backoff: Any = None,
        jitter: float | None = None,
        timeout: float | timedelta | None = None,
        concurrency: int | None = None,
        queue: QueueLike | str | None = None,
    ) -> Callable[[HandlerFn], HandlerFn]: ...

    def handler(
        self,
        kind: str | TaskType[Any, Any],
        *,
        max_attempts: int | None = None,
        backoff: Any = None,
        jitter: float | None = None,
        timeout: float | timedelta | None = None,
        concurrency: int | None = None,
        queue: QueueLike | str | None = None,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Register the decorated function (sync or async) as the handler of ``kind``.

        Args:
            kind: the kind of task it runs, or a :class:`~delayq.TaskType`: its payload
                type's value is ``task.payload`` (one that does not match is dead, unrun), and
                its options are the defaults of those below.
            max_attempts: after this many failed attempts a task is dead (default 5;
                ``schedule(..., max_attempts=N)`` wins for one task).
            backoff: the wait before each retry: a list of seconds (the last repeats) or a
                function of the attempt number (default 30 s, 2 min, then 10 min).
            jitter: spread each backoff by this share either way (default 0.1).
            timeout: seconds (or a ``timedelta``) a run may take before it fails with
                ``TimeoutError`` (default: no limit).
            concurrency: at most this many tasks of ``kind`` held by this worker at once
                (running or claimed); the rest stay scheduled, for other workers.
            queue: the worker's queue (or its name) it runs ``kind`` on (default: all).
        """
        lanes = self.lanes if queue is None else (lane_of(self.lanes, queue),)
        given = {"max_attempts": max_attempts, "timeout": timeout, "backoff": backoff}
        given["jitter"] = jitter
        name, options = handler_options(kind, given, concurrency, self.concurrency)

        def register(fn: HandlerFn) -> HandlerFn:
            add_handler(self.lanes, lanes, make_handler(name, fn, **options))
            return fn

        return register

    def on_expire(
        self,
        pattern: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        queue: QueueLike | str | None = None,
    ) -> Callable[[ExpireFn], ExpireFn]:
        """Call the decorated function with an :class:`Expired` when a key matching
        ``pattern`` (as in Redis) expires: keys set with ``queue.expiring.set`` surely,
        others best-effort; raise to retry, ``Fail`` for the dead set. (``queue=``: which.)"""
        from delayq.worker.features import expiring

        lane = one_lane(self.lanes, queue, "on_expire")
        expiring.refuse_other_lane(self.lanes, lane)

        def register(fn: ExpireFn) -> ExpireFn:
            expiring.watcher_on(lane, self._configure).watch(pattern, fn, max_attempts)
            return fn

        return register

    @property
    def expiry(self) -> ExpiryWatcher:
        """The :meth:`on_expire` callbacks and, serving, their bell (or an empty watcher)."""
        from delayq.worker.features.expiring import watcher_of

        return watcher_of(self.lanes, self._configure)

    def cron(
        self, expression: str, *, queue: QueueLike | str | None = None, **options: Any
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Run the decorated function at each time a cron expression matches, once across all
        workers: ``@worker.cron("0 2 * * *", tz="Asia/Shanghai", name="daily-report")``.
        Options (catch_up, max_running, ...): :meth:`delayq.worker.features.cron.Schedules.cron`.
        A worker of several queues keeps the schedule on the one named by ``queue=``."""
        return self.schedules_of(queue, "cron").cron(expression, **options)

    def every(
        self, *interval: Any, queue: QueueLike | str | None = None, **options: Any
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Run the decorated function every interval, once across all workers:
        ``@worker.every(minutes=5, name="sweep")`` or ``@worker.every(timedelta(...))``.
        Options: :meth:`delayq.worker.features.cron.Schedules.every`. A worker of several
        queues keeps the schedule on the one named by ``queue=``."""
        return self.schedules_of(queue, "every").every(*interval, **options)

    @property
    def schedules(self) -> Schedules:
        """The :meth:`cron` and :meth:`every` schedules of the first queue (see schedules_of)."""
        return self.schedules_of(self.queue)

    def schedules_of(self, queue: QueueLike | str | None, what: str = "cron") -> Schedules:
        """The periodic schedules kept on one of the worker's queues (``None``: the only)."""
        from delayq.worker.features.cron import Schedules  # (croniter: loaded when used)

        lane = one_lane(self.lanes, queue, what)
        return lane.extension(Schedules) or lane.add(Schedules())

    def middleware(self, fn: Middleware) -> Middleware:
        """Register ``async def fn(task, call_next)`` around every handler invocation (a
        task's handler, a cron occurrence's, an expiring key's callback, which still gets its
        ``Expired``); ``return await call_next(task)`` runs the rest of the chain and the
        handler. Several compose in registration order, the first outermost, inside the
        process-wide ``delayq.hooks.middleware``; a sync handler's runs on the loop around
        its thread call. A middleware's exception is taken as the handler's would be.
        Register before the worker serves. See docs/observability.md."""
        self._middleware.append(hooks.check_middleware(fn))
        return fn

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(TaskEvent)`` for every attempt's start and outcome (metrics, logs)."""
        hook = opt.checked_hook(listener, "add_listener(listener)", "a TaskEvent")
        self.events.listeners.append(hook)

    def on_startup(
        self, fn: Callable[[Worker], Awaitable[None]]
    ) -> Callable[[Worker], Awaitable[None]]:
        """Run ``await fn(worker)`` once serving has begun, before the first claim (extensions
        use it to make sure their tasks exist)."""
        hook = opt.checked_hook(fn, "on_startup(fn)", "async, the worker")
        self.lanes[0].startup.append(WorkerHook(hook, self))
        return fn

    @property
    def startup(self) -> list[Callable[[Worker], Awaitable[None]]]:
        """The functions given to :meth:`on_startup`, in order (a copy)."""
        return [h.fn for h in self.lanes[0].startup if isinstance(h, WorkerHook)]

    def on_dead(self, fn: HandlerFn) -> HandlerFn:
        """Register ``fn(task_id, reason, task)`` to be called whenever a task goes dead."""
        hook = opt.checked_hook(fn, "on_dead(fn)", "task_id, reason, task")
        self.lanes[0].registry.on_dead.append(hook)
        return fn

    def registration(self, lane: int = 0) -> str:
        """What this worker publishes about itself on every claim and heartbeat (on the
        queue of ``lane``: its kinds are that queue's)."""
        in_flight = self.engine.runs.busy if self.engine is not None else 0
        beat = max(self.max_wait_s, self.lease_s / 3)
        kinds = self.lanes[lane].registry.kinds()
        return registration_text(self.concurrency, in_flight, kinds, self._started_at, beat)

    def configure(
        self,
        *,
        concurrency: int | None = None,
        lease: float | timedelta | None = None,
        unknown_kind_grace: float | timedelta | None = None,
    ) -> None:
        """Change ``concurrency``, ``lease`` or ``unknown_kind_grace`` (checked as in the
        constructor) before the worker serves; ``delayq worker --concurrency/--lease/
        --unknown-kind-grace`` override the app's this way."""
        if self.engine is not None:
            raise ConfigurationError("configure() a worker before it serves, not while")
        # Everything is checked before anything changes: a refusal leaves the worker as it was.
        caps = [cap for lane in self.lanes for cap in lane.registry.caps().items()]
        self.concurrency, self.lease_s, self.unknown_kind_grace_s = opt.configured(
            (self.concurrency, self.lease_s, self.unknown_kind_grace_s),
            (concurrency, lease, unknown_kind_grace),
            caps,
        )

    # -- serving: the engine's ----------------------------------------------------------

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (a second signal skips the grace period)."""
        asyncio.run(self.serve(install_signals=True))

    async def serve(self, *, install_signals: bool = False) -> None:
        """Serve on the running event loop until :meth:`stop` (or a signal)."""
        check.flag(install_signals, "install_signals")
        middleware = self.middleware_in_use()  # a bad process-wide one: refused first
        client = self._client_arg or worker_client(self.queue.url, self.concurrency)
        self.engine = Engine(
            self,
            client,
            owns_client=self._client_arg is None,
            middleware=middleware,
            stop_requested=self._stop_requested,
        )
        await self.engine.serve(install_signals)

    def stop(self) -> None:
        """Ask a serving worker to shut down gracefully (thread-safe)."""
        self._stop_requested.set()
        engine = self.engine
        if engine is not None and not engine.loop.is_closed():
            with contextlib.suppress(RuntimeError):
                engine.loop.call_soon_threadsafe(engine.stop)

    def _begin_stop(self) -> None:
        if self.engine is not None:
            self.engine.stop()

    @property
    def runner(self) -> AsyncRunner:
        """The serving worker's runner, on its connection (for ``on_startup`` hooks)."""
        if self.engine is None:
            raise RuntimeError("the worker is not serving: it has no connection yet")
        return self.engine.runner

    @property
    def eviction_policy(self) -> str | None:
        """The server's ``maxmemory-policy`` as read when serving began (None: unread)."""
        return self.engine.eviction_policy if self.engine is not None else None

    def middleware_in_use(self) -> list[Middleware]:
        """The middleware a worker starting now composes: the process-wide
        ``delayq.hooks.middleware`` (checked here: anyone may append to that list) first,
        then the worker's own."""
        return [*map(hooks.check_middleware, hooks.middleware), *self._middleware]

    def sources(self) -> list[Source]:
        """What the claim loop claims from, in order: each queue's shards, queue by queue."""
        return sources_of(self.lanes)

    def context(
        self, runner: AsyncRunner, threads: HandlerThreads, stopping: asyncio.Event
    ) -> WorkerContext:
        """The first queue's of :meth:`contexts` (``delayq.testing.drain`` builds its own,
        with handler calls made inline)."""
        return self.contexts(runner, threads, stopping)[0]

    def contexts(
        self, runner: AsyncRunner, threads: HandlerThreads, stopping: asyncio.Event
    ) -> list[WorkerContext]:
        """One context per queue (its shards, its registry and start-up hooks), sharing the
        runner, the threads, the clock, one waker subscribed to every source's channel, and
        the rest (``engine.contexts``)."""
        return contexts(self, runner, threads, stopping, self.middleware_in_use())
