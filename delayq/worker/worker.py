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
import itertools
import json
import logging
import math
import os
import secrets
import signal
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

from delayq import controls, hooks, leasing
from delayq.connection import async_client
from delayq.cron.worker import Schedules
from delayq.errors import ConfigurationError, ConnectionFailed, DelayqError
from delayq.expiring.ops import EXPIRE_KIND
from delayq.expiring.worker import ExpireFn, ExpiryWatcher
from delayq.hooks import Middleware
from delayq.leasing import Claimed
from delayq.queue import AsyncQueue, Queue
from delayq.runner import AsyncRunner
from delayq.timing import seconds
from delayq.worker.checks import check_eviction
from delayq.worker.clock import ServerClock
from delayq.worker.context import StartupHook, WorkerContext
from delayq.worker.events import Events, Listener
from delayq.worker.execute import Executor
from delayq.worker.heartbeat import Heartbeat
from delayq.worker.outcome import Finisher
from delayq.worker.registry import DEFAULT_MAX_ATTEMPTS, HandlerFn, Registry, make_handler
from delayq.worker.runs import Runs
from delayq.worker.supervise import Supervisor
from delayq.worker.threads import HandlerThreads
from delayq.worker.waker import Waker

log = logging.getLogger("delayq.worker")

HANDLER_THREAD_PREFIX = "delayq-handler"
REGISTER_EVERY_S = 5.0
# An unchanged registration is sent as "" (one ZADD); the whole of it at least this often.
REREGISTER_EVERY_S = 60.0
WORKER_SOCKET_TIMEOUT_S = 5.0
# One handler thread per slot is started up front: beyond this, more processes serve better.
MAX_CONCURRENCY = 10_000
# A claim held back by the rate limit looks again when its next token is there, but no
# sooner than this: a throttled worker takes a few tokens a claim, not one (at 100/s, 20
# claims a second of 5 tasks, rather than 100 of one).
THROTTLE_STEP_S = 0.05


def _checked_concurrency(concurrency: int) -> int:
    if (
        isinstance(concurrency, bool)
        or not isinstance(concurrency, int)
        or not 1 <= concurrency <= MAX_CONCURRENCY
    ):
        raise ConfigurationError(
            f"concurrency must be an int from 1 to {MAX_CONCURRENCY:,} (it is also the "
            f"number of handler threads), got {concurrency!r}"
        )
    return concurrency


def _checked_lease(lease: float | timedelta) -> float:
    lease_s = seconds(lease, "lease")
    if lease_s < 1:
        raise ConfigurationError(f"lease must be at least 1 second, got {lease_s}")
    return lease_s


def interleave(batches: list[list[Claimed]]) -> list[Claimed]:
    """One from each batch in turn: [a1, b1, a2, b2, a3]."""
    return [c for row in itertools.zip_longest(*batches) for c in row if c is not None]


class Worker:
    """Runs the handlers of one queue.

    Args:
        queue: the :class:`Queue` or :class:`AsyncQueue` to work on.
        concurrency: most handlers running at once (also the thread pool's size).
        lease: seconds (or a timedelta) a claim is valid without a heartbeat; a crashed
            worker's tasks run again this long after its last heartbeat.
        grace: on shutdown, how long running handlers may finish before they are handed back.
        lookahead: claim tasks due this soon and start each on a local timer, so handlers
            start within a millisecond or two of their due time.
        max_wait: cap on any idle wait: how often an idle worker looks at the queue anyway,
            in case a wake-up was lost without its connection dropping (a dropped one is
            noticed, and the queue looked at, at once). Each look is a few commands.
        client: an existing ``redis.asyncio`` client (made with ``decode_responses=False``)
            for the worker's loops, instead of one it makes from the queue's URL; the worker
            does not close it.
        configure_notifications: with ``on_expire`` callbacks, add the ``E`` and ``x``
            flags to the server's ``notify-keyspace-events`` when they are missing (default);
            ``False`` only checks them (docs/expiring.md).
    """

    def __init__(
        self,
        queue: Queue | AsyncQueue,
        *,
        concurrency: int = 16,
        lease: float | timedelta = 30,
        grace: float | timedelta = 30,
        lookahead: float = 0.02,
        max_wait: float = 5.0,
        client: Any = None,
        configure_notifications: bool = True,
    ) -> None:
        self.queue = queue
        self.core = queue.core
        self.concurrency = _checked_concurrency(concurrency)
        self.lease_s = _checked_lease(lease)
        self.grace_s = seconds(grace, "grace")
        self.lookahead_s = seconds(lookahead, "lookahead")
        self.max_wait_s = seconds(max_wait, "max_wait")
        self._client_arg = client
        self.registry = Registry()
        self._loop: asyncio.AbstractEventLoop | None = None  # the serving loop
        self._stopping: asyncio.Event | None = None  # events are made on the serving loop
        self._force: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        # What the worker's parts share while serving; set, with the attributes of serve()
        # (runner, runs, ...), before anything can stop or look at the worker.
        self._ctx: WorkerContext | None = None
        self.clock = ServerClock()
        self.events = Events()
        self.expiry = ExpiryWatcher(configure=configure_notifications)
        # Runs the background loops; one that keeps failing stops the worker (WorkerFailed).
        self.supervisor = Supervisor(lambda failed: self._begin_stop())
        # Run in order once serving has begun: on_startup's and the extensions' own (cron).
        self._startup: list[StartupHook] = []
        self._middleware: list[Middleware] = []
        self.id = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._started_at = time.time()
        self._registered_at = -REGISTER_EVERY_S
        self._registered_info = ""  # the last whole registration sent, and when
        self._registered_full_at = -REREGISTER_EVERY_S
        # Per shard: until when (loop time) the rate limit holds its claims back. Neither a
        # poke (a handler finished) nor a wake-up ends it: a claim could take no more (and
        # a claim's own wake-up would wake this worker again).
        self._throttled_until: dict[int, float] = {}

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
        """
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
            self.registry.add(make_handler(kind, fn, **options))
            return fn

        return register

    def on_expire(
        self, pattern: str, *, max_attempts: int = DEFAULT_MAX_ATTEMPTS
    ) -> Callable[[ExpireFn], ExpireFn]:
        """Call the decorated function (sync or async) with an :class:`Expired` when a key
        matching ``pattern`` (``*``, ``?``, ``[...]`` as in Redis) expires; keys set with
        ``queue.expiring.set`` are guaranteed, others best-effort. Outcomes follow the
        handler rules: raise to retry, ``Fail`` for the dead set."""

        def register(fn: ExpireFn) -> ExpireFn:
            if self.registry.get(EXPIRE_KIND) is None:
                self.registry.add(
                    make_handler(
                        EXPIRE_KIND, self.expiry.handle, max_attempts=max_attempts, internal=True
                    )
                )
            self.expiry.add(pattern, fn)
            return fn

        return register

    def cron(self, expression: str, **options: Any) -> Callable[[HandlerFn], HandlerFn]:
        """Run the decorated function at each time a cron expression matches, once across all
        workers: ``@worker.cron("0 2 * * *", tz="Asia/Shanghai", name="daily-report")``.
        Options (catch_up, max_running, ...): :meth:`delayq.cron.worker.Schedules.cron`."""
        return self.schedules.cron(expression, **options)

    def every(self, *interval: Any, **options: Any) -> Callable[[HandlerFn], HandlerFn]:
        """Run the decorated function every interval, once across all workers:
        ``@worker.every(minutes=5, name="sweep")`` or ``@worker.every(timedelta(...))``.
        Options: :meth:`delayq.cron.worker.Schedules.every`."""
        return self.schedules.every(*interval, **options)

    @functools.cached_property
    def schedules(self) -> Schedules:
        """The periodic schedules declared with :meth:`cron` and :meth:`every`."""
        return Schedules(self.registry, self._startup)

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
        self.events.listeners.append(listener)

    def on_startup(
        self, fn: Callable[[Worker], Awaitable[None]]
    ) -> Callable[[Worker], Awaitable[None]]:
        """Run ``await fn(worker)`` once serving has begun, before the first claim (extensions
        use it to make sure their tasks exist)."""
        self._startup.append(_WorkerHook(fn, self))
        return fn

    @property
    def startup(self) -> list[Callable[[Worker], Awaitable[None]]]:
        """The functions given to :meth:`on_startup`, in order (a copy)."""
        return [h.fn for h in self._startup if isinstance(h, _WorkerHook)]

    def _registration_due(self) -> tuple[str, str]:
        """Register with this claim only every REGISTER_EVERY_S, and send the registration
        itself only when it changed (or once a minute): an idle worker's registration is
        then one ZADD every few seconds."""
        now = time.monotonic()
        if now - self._registered_at < REGISTER_EVERY_S:
            return "", ""
        self._registered_at = now
        info = self.registration()
        if info == self._registered_info and now - self._registered_full_at < REREGISTER_EVERY_S:
            return self.id, ""
        self._registered_info, self._registered_full_at = info, now
        return self.id, info

    def registration(self) -> str:
        """What this worker publishes about itself on every claim and heartbeat."""
        return json.dumps(
            {
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "concurrency": self.concurrency,
                "in_flight": self.runs.busy if self._ctx is not None else 0,
                "kinds": self.registry.kinds(),
                "started": round(self._started_at, 3),
                # Registrations arrive at least this often; three missed ones mean dead.
                "beat": round(max(REGISTER_EVERY_S, self.max_wait_s, self.lease_s / 3), 3),
            },
            separators=(",", ":"),
        )

    def on_dead(self, fn: HandlerFn) -> HandlerFn:
        """Register ``fn(task_id, reason, task)`` to be called whenever a task goes dead."""
        self.registry.on_dead.append(fn)
        return fn

    def configure(
        self, *, concurrency: int | None = None, lease: float | timedelta | None = None
    ) -> None:
        """Change ``concurrency`` or ``lease`` (checked as in the constructor) before the
        worker serves; ``delayq worker --concurrency/--lease`` override the app's this way."""
        if self._loop is not None:
            raise ConfigurationError("configure() a worker before it serves, not while")
        if concurrency is not None:
            self.concurrency = _checked_concurrency(concurrency)
            for kind, cap in self.registry.caps().items():
                controls.checked_concurrency(kind, cap, self.concurrency)
        if lease is not None:
            self.lease_s = _checked_lease(lease)

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

    def context(
        self, runner: AsyncRunner, threads: HandlerThreads, stopping: asyncio.Event
    ) -> WorkerContext:
        """The runtime this worker's parts share while serving (see ``WorkerContext``), on
        ``runner``'s connection, with the expiry watcher attached. ``serve()`` builds one;
        ``delayq.testing.drain`` builds its own, with handler calls made inline."""
        shards = self.queue.shards
        waker = Waker(
            runner.client,
            self.core.keys.wake_channel,
            tuple(c.keys.wake_channel for c in shards.cores) if shards.n > 1 else (),
        )
        ctx = WorkerContext(
            shards=shards,
            runner=runner,
            threads=threads,
            clock=self.clock,
            stopping=stopping,
            registry=self.registry,
            startup=self._startup,
            events=self.events,
            waker=waker,
            supervisor=self.supervisor,
            worker_id=self.id,
            middleware=self.middleware_in_use(),
        )
        self.expiry.attach(ctx)  # the bell: the waker's channel, or one per primary
        return ctx

    async def serve(self, *, install_signals: bool = False) -> None:
        """Serve on the running event loop until :meth:`stop` (or a signal)."""
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
        shards = self.queue.shards
        ctx = self.context(self.runner, self.threads, stopping)
        self.waker = ctx.waker
        self.finisher = Finisher(
            shards,
            self.runner,
            lambda o, r: self.runs.written(o, r),
            lambda o: self.runs.dropped(o),
        )
        self.executor = Executor(ctx)
        self.runs = Runs(
            self.executor,
            self.finisher,
            self._to_loop,
            self.waker.poke,
            concurrency=self.concurrency,
            lookahead=self.lookahead_s,
            caps=self.registry.caps(),
        )
        lease_ms = round(self.lease_s * 1000)
        self.heartbeat = Heartbeat(
            shards,
            self.runner,
            self.runs.leases,
            lease_ms,
            max(self.lease_s / 3, 0.2),
            self.runs.leases_lost,
            self.id,
            self.registration,
        )
        # A running task aborted (queue.abort): told on the wake channel, or found by the
        # heartbeat when the message was missed.
        self.waker.on_abort = self.heartbeat.on_aborted = self.runs.abort
        self._ctx = ctx
        if install_signals:
            self._install_signals(loop)
        ctx.supervise("waker", self.waker.run)
        ctx.supervise("finisher", self.finisher.run)
        ctx.supervise("heartbeat", self.heartbeat.run)
        for name, bell_loop in self.expiry.loops():
            ctx.supervise(name, bell_loop)
        for hook in ctx.startup:
            try:
                await hook(ctx)
            except Exception:
                log.exception("start-up hook %r failed; serving anyway", hook)
        claim_loop = self.supervisor.start(
            "claim", functools.partial(self._claim_loop, stopping, lease_ms)
        )
        if self._stop_requested.is_set():
            self._begin_stop()
        log.info(
            "worker on queue %r: kinds %s, concurrency %d",
            self.core.name,
            self.registry.kinds(),
            self.concurrency,
        )
        try:
            await claim_loop
        finally:
            await self._shutdown()
            loops = list(ctx.loops)  # the cron ticker too, started by a start-up hook
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            self.threads.shutdown()
            if self.threads.busy:
                log.warning(
                    "%d sync handler(s) still running after the grace period; their tasks "
                    "were handed back, and the process may exit without waiting for them",
                    self.threads.busy,
                )
            if self._client_arg is None:
                await client.aclose()
            log.info("worker on queue %r stopped", self.core.name)
        if self.supervisor.failed is not None:
            raise self.supervisor.failed

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

    # -- the claim loop ------------------------------------------------------------------------

    async def _claim_loop(self, stopping: asyncio.Event, lease_ms: int) -> None:
        loop = asyncio.get_running_loop()
        cores = self.queue.shards.cores
        # Per shard: the loop time its earliest due task or lease deadline falls due (inf:
        # nothing known), and when it was last looked at. One shard: looked at every time.
        next_at = [0.0] * len(cores)
        seen_at = [0.0] * len(cores)
        # A shard whose claim failed is left alone until its backoff has passed, so one
        # unreachable shard (a failing-over primary) does not hold up the others.
        backoff = [0.1] * len(cores)
        resting_until = [0.0] * len(cores)
        turn = 0  # which shard goes first: rotates, so no shard's backlog starves another
        while not stopping.is_set():
            free = self.runs.room()
            if free <= 0:
                # Full: announcements do not matter until a handler finishes and pokes. Any
                # poke so far is answered: we looked, and we are full (and not stopping).
                self.waker.reset()
                await self.waker.sleep_until(loop.time() + self.max_wait_s)
                continue
            poked, woken = self.waker.reset()
            if poked and len(cores) == 1:
                resting_until[0] = 0.0  # e.g. the wake-up link is back: so may the server be
            now = loop.time()
            soon = now + self.lookahead_s
            order = [(turn + k) % len(cores) for k in range(len(cores))]
            turn += 1
            visit = [
                i
                for i in order
                if resting_until[i] <= now
                and (not self._throttled_until or self._admitted(i, now))
                and (
                    len(cores) == 1
                    or poked
                    or i in woken
                    or next_at[i] <= soon
                    or now - seen_at[i] >= self.max_wait_s
                )
            ]
            full = False
            # Each shard visited gets its share, and their tasks start interleaved: a batch
            # claimed ahead from one shard must not run before every other shard's tasks.
            share = -(-free // max(len(visit), 1))
            batches: list[list[Claimed]] = []
            for i in visit:
                seen_at[i] = loop.time()
                limit = min(share, free)
                try:
                    next_at[i], got = await self._claim_from(i, limit, lease_ms, batches)
                except DelayqError as e:
                    where = f" on shard {i}" if len(cores) > 1 else ""
                    log.warning("claim failed%s (%s); retrying in %.1f s", where, e, backoff[i])
                    resting_until[i] = loop.time() + backoff[i]
                    next_at[i] = resting_until[i] + self.lookahead_s
                    backoff[i] = min(backoff[i] * 2, 5.0)
                    continue
                backoff[i] = 0.1
                batches.append(got)
                free -= len(got)
                full = full or len(got) >= limit  # a full batch: more may be due right now
                if free <= 0:
                    break
            if batches:
                self.runs.start_many(
                    batches[0] if len(batches) == 1 else interleave(batches),
                    self.clock.server_now_ms,
                )
            if full:
                continue
            deadline = min(
                [loop.time() + self.max_wait_s, *(t - self.lookahead_s for t in next_at)]
            )
            await self.waker.sleep_until(deadline, self._to_loop, self.lookahead_s)

    async def _claim_from(
        self, shard: int, free: int, lease_ms: int, pending: list[list[Claimed]] | None = None
    ) -> tuple[float, list[Claimed]]:
        """Claim up to ``free`` tasks from one shard; returns (loop time the shard next needs
        a look, the tasks claimed). Registration rides on the home shard. ``pending``: tasks
        claimed from other shards in this pass, not yet started (they use kinds' rooms)."""
        loop = asyncio.get_running_loop()
        core = self.queue.shards.cores[shard]
        worker, info = self._registration_due() if shard == 0 else ("", "")
        sent = loop.time()
        try:
            result = await self.runner.run(
                leasing.claim(
                    core,
                    limit=free,
                    lease_ms=lease_ms,
                    lookahead_ms=round(self.lookahead_s * 1000),
                    worker=worker,
                    worker_info=info,
                    rooms=self._kind_rooms(pending) if self.runs.caps else (),
                )
            )
        except DelayqError:
            if info:
                self._registered_full_at = -REREGISTER_EVERY_S  # not stored: send it again
            raise
        self.clock.observe(result.now_us / 1000, sent, loop.time())
        next_at = math.inf
        if result.next_due_ms is not None:
            next_at = self._to_loop(result.next_due_ms)
        if result.next_token_ms is not None:
            next_at = self._throttled(shard, result.next_token_ms, next_at)
        elif self._throttled_until:
            self._throttled_until.pop(shard, None)
        if result.next_lease_ms is not None:
            next_at = min(next_at, self._to_loop(result.next_lease_ms) + 0.001 + self.lookahead_s)
        return next_at, result.tasks

    def _kind_rooms(self, pending: list[list[Claimed]] | None) -> list[Any]:
        """Claim's per-kind rooms: each capped kind's cap less the runs of it held and those
        claimed in this pass (``pending``)."""
        held = self.runs.held_of_kind()
        for batch in pending or ():
            for c in batch:
                if c.header.kind in held:
                    held[c.header.kind] += 1
        return controls.kind_rooms(self.runs.caps, held)

    def _throttled(self, shard: int, token_ms: int, next_at: float) -> float:
        """Due tasks wait for the rate limit's next token (server ms): the loop time to look
        again (the claim loop wakes ``lookahead`` before a shard's time, hence the add), at
        most max_wait away (a wake-up lost: the limit may have changed)."""
        now = asyncio.get_running_loop().time()
        at = min(max(self._to_loop(token_ms), now + THROTTLE_STEP_S), now + self.max_wait_s)
        self._throttled_until[shard] = at
        at += self.lookahead_s
        return at if math.isinf(next_at) else max(next_at, at)

    def _admitted(self, shard: int, now: float) -> bool:
        """Whether the rate limit lets the claim loop visit ``shard`` now: the time of its
        next token has come (a changed limit is seen then, within max_wait)."""
        if self._throttled_until.get(shard, 0.0) <= now:
            self._throttled_until.pop(shard, None)
            return True
        return False

    async def _check_shards(self) -> None:
        """Serving a queue with the wrong shard count would leave some shards unserved:
        refuse to start (ConfigurationError). Redis not there yet: wait for it, as claims do."""
        assert self._stopping is not None
        delay = 0.1
        while not self._stopping.is_set() and not self._stop_requested.is_set():
            try:
                stored = await self.runner.run(self.queue.shards.check_op())
            except ConnectionFailed as e:
                log.warning("cannot read the queue's shard count (%s); retrying", e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            self.queue.shards.verify(stored)
            return

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
            await asyncio.wait_for(self.finisher.drained(), timeout=10)
        except TimeoutError:
            log.error(
                "could not write %d results before exiting; their leases will expire "
                "and the tasks run again",
                self.finisher.pending,
            )
        with contextlib.suppress(DelayqError):
            await self.runner.run(leasing.unregister(self.core, self.id))


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
