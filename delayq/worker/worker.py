"""The worker: claims due tasks, starts each on time, and writes what became of it.

Loops, each an asyncio task with one job: the claim loop (below), the wake-up listener
(waker.py), the lease heartbeat (heartbeat.py) and the result writer (outcome.py), all
under supervision (supervise.py). Async handlers run on the event loop; sync handlers in a
bounded thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import Any

from delayq import check, controls, hooks, leasing
from delayq.cancel import cancel_and_wait
from delayq.connection import async_client
from delayq.cron.worker import Schedules
from delayq.errors import ConfigurationError, ConnectionFailed, DelayqError
from delayq.expiring.ops import EXPIRE_KIND
from delayq.expiring.worker import ExpireFn, ExpiryWatcher
from delayq.hooks import Middleware
from delayq.queue import AsyncQueue, Queue
from delayq.runner import AsyncRunner
from delayq.timing import config_seconds
from delayq.worker.alarm import make_alarm
from delayq.worker.checks import check_eviction
from delayq.worker.claimer import Claimer, Source, sources_of
from delayq.worker.clock import ServerClock, loop_clock
from delayq.worker.collector import freeze_once
from delayq.worker.context import WorkerContext
from delayq.worker.events import Events, Listener
from delayq.worker.execute import Executor
from delayq.worker.heartbeat import Heartbeat
from delayq.worker.lane import REGISTER_EVERY_S, Lane, QueueLike, checked_queues
from delayq.worker.options import (
    checked_client,
    checked_concurrency,
    checked_hook,
    checked_lease,
)
from delayq.worker.outcome import Finisher
from delayq.worker.registry import DEFAULT_MAX_ATTEMPTS, HandlerFn, make_handler
from delayq.worker.runs import Runs
from delayq.worker.supervise import Supervisor
from delayq.worker.threads import HandlerThreads
from delayq.worker.waker import Waker

log = logging.getLogger("delayq.worker")

HANDLER_THREAD_PREFIX = "delayq-handler"
WORKER_SOCKET_TIMEOUT_S = 5.0


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
        max_wait: cap on any idle wait (15 s): how often an idle worker looks at the queue
            anyway, in case a wake-up was lost without its connection dropping (a dropped
            one is noticed, and the queue looked at, at once). It is the bound on how late a
            silently lost wake-up can make a task: at most ``max_wait`` (plus the look's
            round trip); a look that finds such a task subscribes again, in case the
            subscription died without its connection knowing. Each look executes four
            commands on the server (the claim script, ``TIME`` and the two heads), five when
            it carries the worker's registration, so an idle worker costs about
            ``5 / max_wait`` commands a second. It also sets how
            often a worker held back by a rate limit looks at the limit again, and how often
            each shard of a sharded queue is looked at while nothing is known to be due there.
        client: an existing ``redis.asyncio`` client (made with ``decode_responses=False``)
            for the worker's loops, instead of one it makes from the queue's URL; the worker
            does not close it.
        configure_notifications: with ``on_expire`` callbacks, add the ``E`` and ``x``
            flags to the server's ``notify-keyspace-events`` when they are missing (default);
            ``False`` only checks them (docs/expiring.md).
        freeze_gc: once start-up is done, collect garbage and move what is left into the
            garbage collector's permanent generation (``gc.freeze()``, the first time any
            worker in the process serves), so the collector's full passes no longer walk
            the modules and the app and hold the loop for milliseconds while tasks fall due
            (``delayq/worker/collector.py``). ``False`` leaves the collector alone.
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
        client: Any = None,
        configure_notifications: bool = True,
        freeze_gc: bool = True,
    ) -> None:
        self.queues = checked_queues(queue)
        self.queue = self.queues[0]  # the first: the only one, usually
        self.core = self.queue.core
        self.concurrency = checked_concurrency(concurrency)
        self.lease_s = checked_lease(lease)
        self.grace_s = config_seconds(grace, "grace")
        self.lookahead_s = config_seconds(lookahead, "lookahead")
        self.max_wait_s = config_seconds(max_wait, "max_wait")
        self._client_arg = checked_client(client)
        self.freeze_gc = check.flag(freeze_gc, "freeze_gc")
        # One lane per queue: its registry (the lanes share the on_dead hooks), start-up
        # hooks (on_startup's go with the first), registration and, serving, its parts.
        self.lanes = tuple(Lane(q, i) for i, q in enumerate(self.queues))
        for lane in self.lanes[1:]:
            lane.registry.on_dead = self.lanes[0].registry.on_dead
        self._loop: asyncio.AbstractEventLoop | None = None  # the serving loop
        self._stopping: asyncio.Event | None = None  # events are made on the serving loop
        self._force: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        # What the worker's parts share while serving; set, with the attributes of serve()
        # (runner, runs, ...), before anything can stop or look at the worker.
        self._ctx: WorkerContext | None = None
        self.clock = ServerClock()
        self.events = Events()
        configure = check.flag(configure_notifications, "configure_notifications")
        self.expiry = ExpiryWatcher(configure=configure)
        self._expiry_lane: int | None = None  # the queue whose keys on_expire watches
        # Runs the background loops; one that keeps failing stops the worker (WorkerFailed).
        self.supervisor = Supervisor(lambda failed: self._begin_stop())
        self._schedules: dict[int, Schedules] = {}
        self._middleware: list[Middleware] = []
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._started_at = time.time()

    # -- registration ---------------------------------------------------------------------

    def handler(
        self,
        kind: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Any = None,
        jitter: float | None = None,
        timeout: float | timedelta | None = None,
        concurrency: int | None = None,
        queue: QueueLike | str | None = None,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Register the decorated function (sync or async) as the handler of ``kind``.

        Args:
            kind: the kind of task it runs (``queue.schedule(kind, ...)``).
            max_attempts: after this many failed attempts a task is dead (default 5;
                ``schedule(..., max_attempts=N)`` wins for one task).
            backoff: the wait before each retry: a list of seconds (the last repeats) or a
                function of the attempt number (default 30 s, 2 min, then 10 min).
            jitter: spread each backoff by this share either way (default 0.1).
            timeout: seconds (or a ``timedelta``) a run may take before it fails with
                ``TimeoutError`` (default: no limit).
            concurrency: at most this many tasks of ``kind`` held by this worker at once
                (running, or claimed and waiting to start); the rest stay scheduled, for
                other workers (default: only the worker's ``concurrency`` bounds them).
            queue: the worker's queue (or its name) whose tasks of ``kind`` it runs; by
                default every queue of the worker's (the only one, usually).
        """
        lanes = self._lanes(queue)
        options: dict[str, Any] = {"max_attempts": max_attempts, "timeout": timeout}
        if concurrency is not None:
            options["concurrency"] = controls.checked_concurrency(
                kind, concurrency, self.concurrency
            )
        if backoff is not None:
            options["backoff"] = backoff
        if jitter is not None:
            options["jitter"] = jitter

        def register(fn: HandlerFn) -> HandlerFn:
            handler = make_handler(kind, fn, **options)
            taken = [self.queues[i].name for i in lanes if self.lanes[i].registry.get(kind)]
            if taken:  # checked first: nothing half-registered
                where = f" on queue {taken[0]!r}" if len(self.queues) > 1 else ""
                raise ConfigurationError(f"a handler for {kind!r} is already registered{where}")
            for i in lanes:
                self.lanes[i].registry.add(handler)
            return fn

        return register

    def _lane(self, queue: QueueLike | str) -> int:
        """The index of one of the worker's queues, given as itself or by name."""
        for i, q in enumerate(self.queues):
            if (
                q is queue
                or q.name == queue
                or (isinstance(queue, (Queue, AsyncQueue)) and q.name == queue.name)
            ):
                return i
        name = queue.name if isinstance(queue, (Queue, AsyncQueue)) else queue
        raise ConfigurationError(
            f"queue={name!r} is not one of this worker's queues "
            f"({', '.join(repr(q.name) for q in self.queues)}): pass one of them"
        )

    def _lanes(self, queue: QueueLike | str | None) -> list[int]:
        return list(range(len(self.queues))) if queue is None else [self._lane(queue)]

    def _one_lane(self, queue: QueueLike | str | None, what: str) -> int:
        """The queue a cron schedule or an expiry callback belongs to: ``queue=``, else the
        only one; a worker of several queues must be told which."""
        if queue is not None:
            return self._lane(queue)
        if len(self.queues) > 1:
            raise ConfigurationError(
                f"this worker serves several queues ({', '.join(q.name for q in self.queues)}):"
                f" pass queue= to {what} to say which queue it belongs to"
            )
        return 0

    def on_expire(
        self,
        pattern: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        queue: QueueLike | str | None = None,
    ) -> Callable[[ExpireFn], ExpireFn]:
        """Call the decorated function (sync or async) with an :class:`Expired` when a key
        matching ``pattern`` (``*``, ``?``, ``[...]`` as in Redis) expires; keys set with
        ``queue.expiring.set`` are guaranteed, others best-effort. Outcomes follow the
        handler rules: raise to retry, ``Fail`` for the dead set. A worker of several queues
        watches the keys of one of them: name it with ``queue=``."""
        lane = self._one_lane(queue, "on_expire")
        if self._expiry_lane is not None and lane != self._expiry_lane:
            raise ConfigurationError(
                f"on_expire callbacks of this worker already watch queue "
                f"{self.queues[self._expiry_lane].name!r}: a worker watches the keys of one "
                "queue (run another worker for the other queue's keys)"
            )
        registry = self.lanes[lane].registry

        def register(fn: ExpireFn) -> ExpireFn:
            self._expiry_lane = lane
            if registry.get(EXPIRE_KIND) is None:
                registry.add(
                    make_handler(
                        EXPIRE_KIND, self.expiry.handle, max_attempts=max_attempts, internal=True
                    )
                )
            self.expiry.add(pattern, fn)
            return fn

        return register

    def cron(
        self, expression: str, *, queue: QueueLike | str | None = None, **options: Any
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Run the decorated function at each time a cron expression matches, once across all
        workers: ``@worker.cron("0 2 * * *", tz="Asia/Shanghai", name="daily-report")``.
        Options (catch_up, max_running, ...): :meth:`delayq.cron.worker.Schedules.cron`.
        A worker of several queues keeps the schedule on the one named by ``queue=``."""
        return self.schedules_of(queue, "cron").cron(expression, **options)

    def every(
        self, *interval: Any, queue: QueueLike | str | None = None, **options: Any
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Run the decorated function every interval, once across all workers:
        ``@worker.every(minutes=5, name="sweep")`` or ``@worker.every(timedelta(...))``.
        Options: :meth:`delayq.cron.worker.Schedules.every`. A worker of several queues
        keeps the schedule on the one named by ``queue=``."""
        return self.schedules_of(queue, "every").every(*interval, **options)

    @property
    def schedules(self) -> Schedules:
        """The periodic schedules declared with :meth:`cron` and :meth:`every` (on the first
        queue; :meth:`schedules_of` for another)."""
        return self.schedules_of(self.queue)

    def schedules_of(self, queue: QueueLike | str | None, what: str = "cron") -> Schedules:
        """The periodic schedules kept on one of the worker's queues (``None``: the only
        one)."""
        lane = self._one_lane(queue, what)
        if lane not in self._schedules:
            self._schedules[lane] = Schedules(self.lanes[lane].registry, self.lanes[lane].startup)
        return self._schedules[lane]

    def middleware(self, fn: Middleware) -> Middleware:
        """Register ``async def fn(task, call_next)`` around every handler invocation: a
        task's handler, a cron occurrence's function, an expiring key's callback (the
        middleware sees the :class:`Task`; the callback still gets its ``Expired``).
        ``return await call_next(task)`` runs the rest of the chain and the handler; each
        call runs them again (twice: the handler runs twice in the attempt).

        Several compose in registration order, the first outermost, inside the process-wide
        ``delayq.hooks.middleware``. A sync handler's middleware runs on the event loop around
        its thread call. An exception from a middleware is taken as the handler's would be
        (``Retry``, ``Discard``, ``Fail``, ``Defer``, or an error). The chain is built when
        the worker starts serving: register before that. See docs/observability.md."""
        self._middleware.append(hooks.check_middleware(fn))
        return fn

    def add_listener(self, listener: Listener) -> None:
        """Call ``listener(TaskEvent)`` for every attempt's start and outcome (metrics, logs)."""
        self.events.listeners.append(
            checked_hook(listener, "add_listener(listener)", "a TaskEvent")
        )

    def on_startup(
        self, fn: Callable[[Worker], Awaitable[None]]
    ) -> Callable[[Worker], Awaitable[None]]:
        """Run ``await fn(worker)`` once serving has begun, before the first claim (extensions
        use it to make sure their tasks exist)."""
        self.lanes[0].startup.append(
            _WorkerHook(checked_hook(fn, "on_startup(fn)", "async, the worker"), self)
        )
        return fn

    @property
    def startup(self) -> list[Callable[[Worker], Awaitable[None]]]:
        """The functions given to :meth:`on_startup`, in order (a copy)."""
        return [h.fn for h in self.lanes[0].startup if isinstance(h, _WorkerHook)]

    def _registration_of(self, lane: Lane) -> Callable[[], str]:
        """:meth:`registration` on ``lane`` (the first as it always was called: a subclass
        may override it)."""
        return functools.partial(self.registration, lane.index) if lane.index else self.registration

    def registration(self, lane: int = 0) -> str:
        """What this worker publishes about itself on every claim and heartbeat (on the
        queue of ``lane``: its kinds are that queue's)."""
        return json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "concurrency": self.concurrency,
                "in_flight": self.runs.busy if self._ctx is not None else 0,
                "kinds": self.lanes[lane].registry.kinds(),
                "started": round(self._started_at, 3),
                # Registrations arrive at least this often; three missed ones mean dead.
                "beat": round(max(REGISTER_EVERY_S, self.max_wait_s, self.lease_s / 3), 3),
            },
            separators=(",", ":"),
        )

    def on_dead(self, fn: HandlerFn) -> HandlerFn:
        """Register ``fn(task_id, reason, task)`` to be called whenever a task goes dead."""
        self.lanes[0].registry.on_dead.append(
            checked_hook(fn, "on_dead(fn)", "task_id, reason, task")
        )
        return fn

    def configure(
        self, *, concurrency: int | None = None, lease: float | timedelta | None = None
    ) -> None:
        """Change ``concurrency`` or ``lease`` (checked as in the constructor) before the
        worker serves; ``delayq worker --concurrency/--lease`` override the app's this way."""
        if self._loop is not None:
            raise ConfigurationError("configure() a worker before it serves, not while")
        # Everything is checked before anything changes: a refusal leaves the worker as it was.
        most = self.concurrency if concurrency is None else checked_concurrency(concurrency)
        for lane in self.lanes:
            for kind, cap in lane.registry.caps().items():
                controls.checked_concurrency(kind, cap, most)
        lease_s = self.lease_s if lease is None else checked_lease(lease)
        self.concurrency, self.lease_s = most, lease_s

    # -- serving ----------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (a second signal skips the grace period)."""
        asyncio.run(self.serve(install_signals=True))

    def stop(self) -> None:
        """Ask a serving worker to shut down gracefully (thread-safe)."""
        self._stop_requested.set()
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._begin_stop)

    def _begin_stop(self) -> None:
        if self._ctx is not None:
            self._ctx.stop()  # stopping set, and the claim loop woken to see it
        elif self._stopping is not None:  # still starting: nothing to wake yet
            self._stopping.set()

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
        """The runtime this worker's parts share while serving (see ``WorkerContext``), on
        ``runner``'s connection, with the expiry watcher attached: the first queue's (see
        :meth:`contexts`). ``serve()`` builds them; ``delayq.testing.drain`` builds its own,
        with handler calls made inline."""
        return self.contexts(runner, threads, stopping)[0]

    def contexts(
        self, runner: AsyncRunner, threads: HandlerThreads, stopping: asyncio.Event
    ) -> list[WorkerContext]:
        """One context per queue (its shards, its registry and start-up hooks), sharing the
        runner, the threads, the clock, one waker subscribed to every source's channel, and
        the rest."""
        sources = self.sources()
        waker = Waker(
            runner.client,
            self.core.keys.wake_channel,
            tuple(s.core.keys.wake_channel for s in sources) if len(sources) > 1 else (),
        )
        middleware = self.middleware_in_use()
        ctxs = [
            WorkerContext(
                shards=q.shards,
                runner=runner,
                threads=threads,
                clock=self.clock,
                stopping=stopping,
                registry=lane.registry,
                startup=lane.startup,
                events=self.events,
                waker=waker,
                supervisor=self.supervisor,
                worker_id=self.id,
                middleware=middleware,
            )
            for lane in self.lanes
            for q in (lane.queue,)
        ]
        # The bell: the waker's channel, or one per primary (one queue's keys are watched).
        self.expiry.attach(ctxs[self._expiry_lane or 0])
        return ctxs

    async def serve(self, *, install_signals: bool = False) -> None:
        """Serve on the running event loop until :meth:`stop` (or a signal)."""
        check.flag(install_signals, "install_signals")
        self.middleware_in_use()  # a bad process-wide middleware: refused before connecting
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._ctx = None  # from an earlier serve(), if any
        stopping = self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        # Handlers may each hold a connection briefly (expiry checks); leave room for the loops.
        client = self._client_arg or async_client(
            self.queue.url,
            max_connections=max(100, 2 * self.concurrency + 16),
            # Scripts answer in milliseconds: a link that goes silent is noticed (and the
            # connection replaced) within seconds, not after the 30 s client default.
            socket_timeout=WORKER_SOCKET_TIMEOUT_S,
        )
        self.runner = AsyncRunner(client)
        self.eviction_policy = await check_eviction(client)
        try:
            await self._check_shards()
        except DelayqError:  # a wrong shard count, or scripts refused
            if self._client_arg is None:
                await client.aclose()
            raise
        self.threads = HandlerThreads(self.concurrency, loop, HANDLER_THREAD_PREFIX)
        ctxs = self.contexts(self.runner, self.threads, stopping)
        ctx = ctxs[0]
        self.waker = ctx.waker
        self._build(ctxs)  # (its alarm, a timerfd, is closed below)
        self._ctx = ctx
        try:
            if install_signals:
                self._install_signals(loop)
            self._start_loops(ctxs)
            await self._run_startup(ctxs)
            if self.freeze_gc:
                freeze_once()
            claim_loop = self.supervisor.start(
                "claim", functools.partial(self.claimer.run, stopping)
            )
            if self._stop_requested.is_set():
                self._begin_stop()
            for lane in self.lanes:
                log.info(
                    "worker on queue %r: kinds %s, concurrency %d",
                    lane.name,
                    lane.registry.kinds(),
                    self.concurrency,
                )
            await claim_loop
        finally:
            await self._shutdown()
            loops = [t for c in ctxs for t in c.loops]  # the cron tickers too (start-up hooks)
            await cancel_and_wait(loops)
            if self.runs.alarm is not None:
                self.runs.alarm.close()
            self.threads.shutdown()
            if self.threads.busy:
                log.warning(
                    "%d sync handler(s) still running after the grace period; their tasks "
                    "were handed back, and the process may exit without waiting for them",
                    self.threads.busy,
                )
            if self._client_arg is None:
                await client.aclose()
            log.info("worker on queue %s stopped", ", ".join(repr(q.name) for q in self.queues))
        if self.supervisor.failed is not None:
            raise self.supervisor.failed

    def _build(self, ctxs: list[WorkerContext]) -> None:
        """The engine's parts: one Runs; per lane an Executor, a Finisher and a heartbeat."""
        self.runs = Runs(
            self._to_loop,
            self.waker.poke,
            concurrency=self.concurrency,
            lookahead=self.lookahead_s,
        )
        loop = asyncio.get_running_loop()
        self._now, self.runs.timer_margin = loop_clock(loop)
        self.runs.now = self._now
        self.runs.alarm = make_alarm(loop)
        several = len(self.lanes) > 1
        for lane, c in zip(self.lanes, ctxs, strict=True):
            lane.open(
                c,
                Executor(c),
                Finisher(
                    c.shards,
                    self.runner,
                    functools.partial(self.runs.written, lane),
                    functools.partial(self.runs.dropped, lane),
                ),
                Heartbeat(
                    c.shards,
                    self.runner,
                    lane.leases,
                    round(self.lease_s * 1000),
                    max(self.lease_s / 3, 0.2),
                    functools.partial(self.runs.leases_lost, lane),
                    self.id,
                    self._registration_of(lane),
                    self._holds_leases if several else None,
                ),
            )
            self.runs.add_lane(lane)
            # A running task aborted (queue.abort): found by the heartbeat when the wake
            # channel's message was missed.
            lane.heartbeat.on_aborted = functools.partial(self.runs.abort, lane)
        self.claimer = Claimer(
            self.lanes,
            self.runs,
            self.waker,
            self.runner,
            self.clock,
            self._now,
            worker_id=self.id,
            registration=self._registration_of,
            lease_ms=round(self.lease_s * 1000),
            lookahead_s=self.lookahead_s,
            max_wait_s=self.max_wait_s,
        )
        # ... or told on the wake channel.
        if several:
            self.waker.on_abort = self._heard_abort
        else:
            self.waker.on_abort = functools.partial(self.runs.abort, self.lanes[0])

    def _start_loops(self, ctxs: list[WorkerContext]) -> None:
        """The waker, each queue's finisher and heartbeat, the expiry bells: supervised."""
        ctx = ctxs[0]
        several = len(ctxs) > 1
        ctx.supervise("waker", self.waker.run)
        for lane in self.lanes:
            suffix = f" ({lane.name})" if several else ""
            ctx.supervise("finisher" + suffix, lane.finisher.run)
            ctx.supervise("heartbeat" + suffix, lane.heartbeat.run)
        for name, bell_loop in self.expiry.loops():
            ctx.supervise(name, bell_loop)

    @staticmethod
    async def _run_startup(ctxs: list[WorkerContext]) -> None:
        """Each queue's start-up hooks, in order, with its context."""
        for c in ctxs:
            for hook in c.startup:
                try:
                    await hook(c)
                except Exception:
                    log.exception("start-up hook %r failed; serving anyway", hook)

    def _heard_abort(self, task_id: str, token: int) -> None:
        """An abort message on a source's wake channel: the run of that queue stops."""
        self.runs.abort(self.claimer.sources[self.waker.heard_from].lane, task_id, token)

    def _holds_leases(self) -> bool:
        return any(lane.leases for lane in self.lanes)

    def _install_signals(self, loop: asyncio.AbstractEventLoop) -> None:
        def on_signal() -> None:
            if self._stopping is not None and self._stopping.is_set() and self._force:
                log.warning("second signal: handing back running tasks now")
                self._force.set()
            else:
                log.info("signal received: finishing running tasks (grace %.0f s)", self.grace_s)
                self._begin_stop()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)

    async def _check_shards(self) -> None:
        """Serving a queue with the wrong shard count would leave some shards unserved:
        refuse to start (ConfigurationError). Redis not there yet: wait for it, as claims do."""
        assert self._stopping is not None
        delay = 0.1
        unchecked = list(self.queues)
        while unchecked and not self._stopping.is_set() and not self._stop_requested.is_set():
            try:
                stored = await self.runner.run(unchecked[0].shards.check_op())
            except ConnectionFailed as e:
                log.warning("cannot read the queue's shard count (%s); retrying", e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            unchecked.pop(0).shards.verify(stored)

    def _to_loop(self, server_ms: float) -> float:
        return self.clock.to_loop(server_ms, asyncio.get_running_loop().time())

    # -- shutdown ---------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Stop claiming, hand back what has not started, let running handlers finish within
        the grace period, hand back the rest, and write every result before returning."""
        assert self._force is not None
        self.runs.release_unstarted()
        await self.runs.wait_running(self.grace_s, self._force)
        await self.runs.cancel_running()
        try:
            await asyncio.wait_for(
                asyncio.gather(*(lane.finisher.drained() for lane in self.lanes)), timeout=10
            )
        except TimeoutError:
            log.error(
                "could not write %d results before exiting; their leases will expire "
                "and the tasks run again",
                sum(lane.finisher.pending for lane in self.lanes),
            )
        with contextlib.suppress(DelayqError):
            await self.runner.run_many([leasing.unregister(q.core, self.id) for q in self.queues])


class _WorkerHook:
    """A function given to :meth:`Worker.on_startup`: awaited with the worker, not the
    context."""

    def __init__(self, fn: Callable[[Worker], Awaitable[None]], worker: Worker) -> None:
        self.fn = fn
        self.worker = worker

    def __call__(self, ctx: WorkerContext) -> Awaitable[None]:
        return self.fn(self.worker)

    def __repr__(self) -> str:
        return repr(self.fn)
