"""The engine: one ``serve()`` of a worker, built whole, started and stopped in one order.

:class:`Engine` builds everything a serving worker is made of when it is made (as Asynq's
``NewServer`` does): the runner on the worker's connection, the handler threads, one
context per lane (:func:`contexts`, which attaches the lanes' extensions), the waker, the
runs and the alarm that wakes the loop at their timers, each lane's parts
(:meth:`Lane.open <delayq.worker.lane.Lane.open>`: Executor, Finisher, heartbeat) and the
claim loop. :meth:`Engine.serve` then states the order, as Asynq's ``server.go`` states its
own:

start
    1. the server's checks: the eviction policy (a warning), each queue's shard count and
       protocol (a refusal: nothing else has run);
    2. the signal handlers;
    3. the loops, supervised: the waker, each lane's finisher and heartbeat, the
       extensions' own loops;
    4. the start-up hooks, lane by lane, in the order declared;
    5. the garbage collector's freeze;
    6. the claim loop, last: nothing is claimed before all of the above runs.

stop (when the claim loop ends: stopped, a signal, a loop that kept failing, or cancelled)
    1. the runs not yet started are handed back;
    2. running handlers get the grace period, then are cancelled and handed back;
    3. every result is written (the finishers drained, 10 s at most);
    4. the worker's registrations are removed;
    5. the loops are cancelled;
    6. the alarm, the handler threads and the connection are closed.

The engine knows no feature by name: extensions plug in through their hooks
(:class:`~delayq.worker.lane.Extension`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import signal
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from delayq import leasing
from delayq.cancel import cancel_and_wait
from delayq.connection import async_client
from delayq.errors import ConfigurationError, ConnectionFailed, DelayqError
from delayq.hooks import Middleware
from delayq.runner import AsyncRunner
from delayq.worker.alarm import make_alarm
from delayq.worker.checks import check_eviction
from delayq.worker.claimer import Claimer, sources_of
from delayq.worker.clock import ServerClock, loop_clock
from delayq.worker.collector import freeze_once
from delayq.worker.context import WorkerContext
from delayq.worker.events import Events
from delayq.worker.execute import Executor
from delayq.worker.health import Health
from delayq.worker.heartbeat import Heartbeat
from delayq.worker.lane import Lane
from delayq.worker.lifecycle import RUNNING
from delayq.worker.outcome import Finisher
from delayq.worker.runs import Runs
from delayq.worker.supervise import Supervisor
from delayq.worker.threads import HandlerThreads
from delayq.worker.waker import Waker

HAND_BACK_SHOWN = 100  # ids named in the hand-back line (all of them are in its task_ids)
log = logging.getLogger("delayq.worker")

HANDLER_THREAD_PREFIX = "delayq-handler"
WORKER_SOCKET_TIMEOUT_S = 5.0
DRAIN_TIMEOUT_S = 10.0  # at shutdown, results not written by then are given up


class Host(Protocol):
    """What the engine reads of the :class:`~delayq.worker.Worker` that serves."""

    lanes: tuple[Lane, ...]
    id: str
    concurrency: int
    lease_s: float
    grace_s: float
    lookahead_s: float
    max_wait_s: float
    unknown_kind_grace_s: float
    weighted: bool
    strict: bool
    freeze_gc: bool
    clock: ServerClock
    events: Events
    supervisor: Supervisor
    health: Health

    def registration(self, lane: int = 0) -> str: ...


MIN_WORKER_CONNECTIONS = 2  # the wake-up subscription holds one; the claims need another


def worker_client(url: str, concurrency: int) -> Any:
    """The connection a worker makes for itself (``Worker(client=)`` not given). A
    ``?max_connections=`` in the URL wins over the room made here: one under
    MIN_WORKER_CONNECTIONS is refused, since the wake-up subscription would hold the only
    connection and no claim could be sent."""
    client = async_client(
        url,
        # Handlers may each hold a connection briefly (expiry checks): room for the loops.
        max_connections=max(100, 2 * concurrency + 16),
        # Scripts answer in milliseconds: a link that goes silent is noticed (and the
        # connection replaced) within seconds, not after the 30 s client default.
        socket_timeout=WORKER_SOCKET_TIMEOUT_S,
    )
    limit = getattr(getattr(client, "connection_pool", None), "max_connections", None)
    if isinstance(limit, int) and limit < MIN_WORKER_CONNECTIONS:
        raise ConfigurationError(
            f"a worker needs at least {MIN_WORKER_CONNECTIONS} connections, and its queue's "
            f"URL allows {limit} (?max_connections={limit}): its wake-up subscription holds "
            "one; raise max_connections in the URL the worker is given, or leave it out"
        )
    return client


def registration_of(host: Host, lane: Lane) -> Callable[[], str]:
    """``host.registration`` on ``lane`` (the first as it always was called: a subclass of
    the Worker may override it)."""
    return functools.partial(host.registration, lane.index) if lane.index else host.registration


def contexts(
    host: Host,
    runner: AsyncRunner,
    threads: HandlerThreads,
    stopping: asyncio.Event,
    middleware: Sequence[Middleware],
) -> list[WorkerContext]:
    """One context per lane (its shards, its registry and start-up hooks), sharing the
    runner, the threads, the clock, one waker subscribed to every source's channel, and the
    rest; each lane's extensions attached to its own."""
    sources = sources_of(host.lanes)
    home = host.lanes[0].queue.core
    waker = Waker(
        runner.client,
        home.keys.wake_channel,
        tuple(s.core.keys.wake_channel for s in sources) if len(sources) > 1 else (),
    )
    ctxs = [
        WorkerContext(
            shards=lane.queue.shards,
            runner=runner,
            threads=threads,
            clock=host.clock,
            stopping=stopping,
            registry=lane.registry,
            startup=lane.startup,
            events=host.events,
            waker=waker,
            supervisor=host.supervisor,
            worker_id=host.id,
            middleware=middleware,
        )
        for lane in host.lanes
    ]
    for lane, ctx in zip(host.lanes, ctxs, strict=True):
        for extension in lane.extensions:
            extension.attach(ctx)
    return ctxs


class Engine:
    """One serving of ``host`` on ``client`` (closed at the end when ``owns_client``)."""

    def __init__(
        self,
        host: Host,
        client: Any,
        *,
        owns_client: bool,
        middleware: Sequence[Middleware],
        stop_requested: threading.Event,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.host = host
        self.lanes = host.lanes
        self.client = client
        self.owns_client = owns_client
        self.stop_requested = stop_requested  # Worker.stop() before the loop could be told
        self.loop = loop
        self.runner = AsyncRunner(client)
        self.stopping = asyncio.Event()  # set when the worker begins to shut down
        self.force = asyncio.Event()  # a second signal: no more grace
        self.eviction_policy: str | None = None  # the server's, once checked
        self.threads = HandlerThreads(host.concurrency, loop, HANDLER_THREAD_PREFIX)
        self.contexts = contexts(host, self.runner, self.threads, self.stopping, middleware)
        self.ctx = self.contexts[0]
        self.waker = self.ctx.waker
        self.now, timer_margin = loop_clock(loop)
        self.runs = Runs(
            self.to_loop,
            self.waker.poke,
            concurrency=host.concurrency,
            lookahead=host.lookahead_s,
            lease_s=host.lease_s,
        )
        self.runs.now, self.runs.timer_margin = self.now, timer_margin
        self.runs.alarm = make_alarm(loop)  # a timerfd: closed when serving ends
        lease_ms = round(host.lease_s * 1000)
        several = len(self.lanes) > 1
        for lane, ctx in zip(self.lanes, self.contexts, strict=True):
            executor = Executor(ctx, host.unknown_kind_grace_s)
            lane.open(
                ctx,
                executor,
                Finisher(
                    ctx.shards,
                    self.runner,
                    functools.partial(self.runs.written, lane),
                    functools.partial(self.runs.dropped, lane),
                    executor.unknown,
                ),
                Heartbeat(
                    ctx.shards,
                    self.runner,
                    lane.leases,
                    lease_ms,
                    max(host.lease_s / 3, 0.2),
                    functools.partial(self.runs.leases_lost, lane),
                    host.id,
                    registration_of(host, lane),
                    self.holds_leases if several else None,
                ),
            )
            self.runs.add_lane(lane)
            # A running task aborted (queue.abort): found by the heartbeat when the wake
            # channel's message was missed ...
            lane.heartbeat.on_aborted = functools.partial(self.runs.abort, lane)
            lane.heartbeat.health = host.health
        self.claimer = Claimer(
            self.lanes,
            self.runs,
            self.waker,
            self.runner,
            host.clock,
            self.now,
            worker_id=host.id,
            registration=functools.partial(registration_of, host),
            lease_ms=lease_ms,
            lookahead_s=host.lookahead_s,
            max_wait_s=host.max_wait_s,
            health=host.health,
            weighted=host.weighted,
            strict=host.strict,
        )
        self.claim_loop: asyncio.Task[None] | None = None
        # ... or told on the wake channel.
        if several:
            self.waker.on_abort = self.heard_abort
        else:
            self.waker.on_abort = functools.partial(self.runs.abort, self.lanes[0])

    @property
    def loops(self) -> list[asyncio.Task[None]]:
        """The supervised loops running, every lane's (the cron check too); not the claim
        loop's."""
        return [t for c in self.contexts for t in c.loops]

    def to_loop(self, server_ms: float) -> float:
        return self.host.clock.to_loop(server_ms, asyncio.get_running_loop().time())

    def heard_abort(self, task_id: str, token: int) -> None:
        """An abort message on a source's wake channel: the run of that queue stops."""
        self.runs.abort(self.claimer.sources[self.waker.heard_from].lane, task_id, token)

    def holds_leases(self) -> bool:
        return any(lane.leases for lane in self.lanes)

    def stop(self) -> None:
        """Begin the shutdown: ``stopping`` set, and the claim loop woken to see it."""
        self.host.health.stopping = True
        self.ctx.stop()

    def watched(self) -> list[asyncio.Task[None]]:
        """The loops whose end makes the worker not live: the supervised ones and the claim
        loop."""
        return [*self.loops, *([self.claim_loop] if self.claim_loop is not None else [])]

    # -- the order ------------------------------------------------------------------------

    async def serve(self, install_signals: bool = False) -> None:
        """Start, serve until stopped, stop: in the order of the module docstring. Raises
        what the checks refuse, or ``WorkerFailed`` when a loop kept failing."""
        health = self.host.health
        health.reset()
        pulse = self.host.supervisor.start("health", functools.partial(health.run, self.watched))
        try:
            self.eviction_policy = await check_eviction(self.client)
            await self.check_shards()
        except BaseException:  # a wrong shard count, scripts refused, cancelled
            await cancel_and_wait([pulse])
            health.ended()
            await self.close()
            raise
        try:
            if install_signals:
                self.install_signals()
            self.start_loops()
            await self.run_startup()
            if self.host.freeze_gc:
                freeze_once()
            claim_loop = self.claim_loop = self.host.supervisor.start(
                "claim", functools.partial(self.claimer.run, self.stopping)
            )
            if self.stop_requested.is_set():
                self.stop()
            for lane in self.lanes:
                log.info(
                    "worker on queue %r: kinds %s, concurrency %d",
                    lane.name,
                    lane.registry.kinds(),
                    self.host.concurrency,
                )
            await claim_loop
        finally:
            await self.hand_back()
            await cancel_and_wait(self.loops)  # the cron checks too (start-up hooks)
            await cancel_and_wait([pulse])
            health.ended()
            await self.close()
            names = ", ".join(repr(lane.name) for lane in self.lanes)
            log.info("worker on queue %s stopped", names)
        if self.host.supervisor.failed is not None:
            raise self.host.supervisor.failed

    async def check_shards(self) -> None:
        """Serving a queue with the wrong shard count would leave some shards unserved:
        refuse to start (ConfigurationError). Redis not there yet: wait for it, as claims do."""
        delay = 0.1
        unchecked = [lane.queue for lane in self.lanes]
        while unchecked and not self.stopping.is_set() and not self.stop_requested.is_set():
            try:
                stored = await self.runner.run(unchecked[0].shards.check_op())
            except ConnectionFailed as e:
                log.warning("%s; retrying", e)  # the error says it first: cannot reach Redis
                self.host.health.failed(e)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            unchecked.pop(0).shards.verify(stored)

    def install_signals(self) -> None:
        def on_signal() -> None:
            if self.stopping.is_set():
                log.warning("second signal: handing back running tasks now")
                self.force.set()
            else:
                grace = self.host.grace_s
                log.info("signal received: finishing running tasks (grace %.0f s)", grace)
                self.stop()

        for sig in (signal.SIGINT, signal.SIGTERM):
            self.loop.add_signal_handler(sig, on_signal)

    def start_loops(self) -> None:
        """The waker, each lane's finisher and heartbeat, the extensions' loops: supervised."""
        ctx = self.ctx
        several = len(self.lanes) > 1
        ctx.supervise("waker", self.waker.run)
        for lane in self.lanes:
            suffix = f" ({lane.name})" if several else ""
            ctx.supervise("finisher" + suffix, lane.finisher.run)
            ctx.supervise("heartbeat" + suffix, lane.heartbeat.run)
        for lane in self.lanes:
            for extension in lane.extensions:
                for name, loop in extension.loops():
                    lane.ctx.supervise(name, loop)

    async def run_startup(self) -> None:
        """Each lane's start-up hooks, in order, with its context."""
        for ctx in self.contexts:
            for hook in ctx.startup:
                try:
                    await hook(ctx)
                except Exception:
                    log.exception("start-up hook %r failed; serving anyway", hook)

    async def hand_back(self) -> None:
        """Stop claiming, hand back what has not started, let running handlers finish within
        the grace period, hand back the rest, write every result, and unregister."""
        self.runs.release_unstarted()
        await self.runs.wait_running(self.host.grace_s, self.force)
        self._log_hand_back()
        await self.runs.cancel_running()
        try:
            await asyncio.wait_for(
                asyncio.gather(*(lane.finisher.drained() for lane in self.lanes)),
                timeout=DRAIN_TIMEOUT_S,
            )
        except TimeoutError:
            log.error(
                "could not write %d results before exiting; their leases will expire "
                "and the tasks run again",
                sum(lane.finisher.pending for lane in self.lanes),
            )
        with contextlib.suppress(DelayqError):
            await self.runner.run_many(
                [leasing.unregister(lane.queue.core, self.host.id) for lane in self.lanes]
            )

    def _log_hand_back(self) -> None:
        """Say which tasks still run once the grace period is over (or a second signal cut
        it short): they are cancelled and handed back, to run again elsewhere."""
        ids = sorted(r.claimed.id for r in self.runs.running if r.state == RUNNING)
        if not ids:
            return
        why = (
            "second signal"
            if self.force.is_set()
            else f"grace period of {self.host.grace_s:g} s over"
        )
        shown = ", ".join(ids[:HAND_BACK_SHOWN])
        more = f" and {len(ids) - HAND_BACK_SHOWN} more" if len(ids) > HAND_BACK_SHOWN else ""
        log.warning(
            "%s: handing back %d task(s) still running, to run again: %s%s",
            why,
            len(ids),
            shown,
            more,
            extra={"task_ids": ids},
        )

    async def close(self) -> None:
        """The alarm, the handler threads and the connection (the worker's own)."""
        if self.runs.alarm is not None:
            self.runs.alarm.close()
        self.threads.shutdown()
        if self.threads.busy:
            log.warning(
                "%d sync handler(s) still running after the grace period; their tasks "
                "were handed back, and the process may exit without waiting for them",
                self.threads.busy,
            )
        if self.owns_client:
            await self.client.aclose()
