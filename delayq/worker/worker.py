"""The worker: claims due tasks, starts each on time, and writes what became of it.

Loops, each an asyncio task with one job: the claim loop (below), the wake-up listener
(waker.py), the lease heartbeat (heartbeat.py) and the result writer (outcome.py). Async
handlers run on the event loop; sync handlers in a bounded thread pool.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

from .. import leasing
from ..connection import async_client
from ..errors import ConfigurationError, DelayqError
from ..leasing import Claimed
from ..queue import AsyncQueue, Queue
from ..runner import AsyncRunner
from ..task import Task
from ..timing import seconds
from .clock import ServerClock
from .execute import Executor
from .heartbeat import Heartbeat
from .outcome import Finisher, Outcome
from .registry import DEFAULT_MAX_ATTEMPTS, HandlerFn, Registry, make_handler
from .waker import Waker

log = logging.getLogger("delayq.worker")

HANDLER_THREAD_PREFIX = "delayq-handler"


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
        max_wait: cap on any idle wait, bounding the cost of a wake-up lost on a reconnect.
    """

    def __init__(
        self,
        queue: Queue | AsyncQueue,
        *,
        concurrency: int = 16,
        lease: float | timedelta = 30,
        grace: float | timedelta = 30,
        lookahead: float = 0.02,
        max_wait: float = 1.0,
        client: Any = None,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigurationError(f"concurrency must be an int >= 1, got {concurrency!r}")
        self.queue = queue
        self.core = queue.core
        self.concurrency = concurrency
        self.lease_s = seconds(lease, "lease")
        if self.lease_s < 1:
            raise ConfigurationError(f"lease must be at least 1 second, got {self.lease_s}")
        self.grace_s = seconds(grace, "grace")
        self.lookahead_s = seconds(lookahead, "lookahead")
        self.max_wait_s = seconds(max_wait, "max_wait")
        self._client_arg = client
        self.registry = Registry()
        # Live state, valid while serving.
        self.leases: dict[str, int] = {}  # every lease this worker holds: id -> token
        self.running: dict[str, asyncio.Task[None]] = {}
        self.tasks: dict[str, Task] = {}
        self._timers: dict[str, tuple[asyncio.TimerHandle, Claimed]] = {}
        self._lost: set[str] = set()
        self._finishing: set[str] = set()  # result handed to the Finisher, not yet written
        self._busy = 0
        self._stopping: asyncio.Event | None = None  # events are made on the serving loop
        self._force: asyncio.Event | None = None
        self._stop_requested = threading.Event()
        self.clock = ServerClock()
        self.started_count = 0

    # -- registration ---------------------------------------------------------------------

    def handler(
        self,
        kind: str,
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        backoff: Any = None,
        jitter: float | None = None,
        timeout: float | timedelta | None = None,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Register the decorated function (sync or async) as the handler of ``kind``."""
        options: dict[str, Any] = {"max_attempts": max_attempts, "timeout": timeout}
        if backoff is not None:
            options["backoff"] = backoff
        if jitter is not None:
            options["jitter"] = jitter

        def register(fn: HandlerFn) -> HandlerFn:
            self.registry.add(make_handler(kind, fn, **options))
            return fn

        return register

    def on_dead(self, fn: HandlerFn) -> HandlerFn:
        """Register ``fn(task_id, reason, task)`` to be called whenever a task goes dead."""
        self.registry.on_dead.append(fn)
        return fn

    # -- serving ----------------------------------------------------------------------------

    def run(self) -> None:
        """Serve until SIGINT/SIGTERM (a second signal skips the grace period)."""
        asyncio.run(self.serve(install_signals=True))

    def stop(self) -> None:
        """Ask a serving worker to shut down gracefully (thread-safe)."""
        self._stop_requested.set()
        loop = getattr(self, "_loop", None)
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._begin_stop)

    def _begin_stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
            self.waker.poke()

    async def serve(self, *, install_signals: bool = False) -> None:
        """Serve on the running event loop until :meth:`stop` (or a signal)."""
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._stopping = asyncio.Event()
        self._force = asyncio.Event()
        client = self._client_arg or async_client(self.queue.url)
        self.runner = AsyncRunner(client)
        self.pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=HANDLER_THREAD_PREFIX)
        self.waker = Waker(client, self.core.keys.wake_channel)
        self.finisher = Finisher(self.core, self.runner, self._written)
        self.executor = Executor(
            self.registry, self.core.name, self.core.codecs, self.pool, self._fire_on_dead
        )
        lease_ms = round(self.lease_s * 1000)
        self.heartbeat = Heartbeat(
            self.core,
            self.runner,
            self.leases,
            lease_ms,
            max(self.lease_s / 3, 0.2),
            self._leases_lost,
        )
        if install_signals:
            self._install_signals(loop)
        loops = [
            asyncio.create_task(self.waker.run(), name="delayq-waker"),
            asyncio.create_task(self.finisher.run(), name="delayq-finisher"),
            asyncio.create_task(self.heartbeat.run(), name="delayq-heartbeat"),
        ]
        claim_loop = asyncio.create_task(self._claim_loop(lease_ms), name="delayq-claim")
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
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            self.pool.shutdown(wait=False, cancel_futures=True)
            if self._client_arg is None:
                await client.aclose()
            log.info("worker on queue %r stopped", self.core.name)

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

    async def _claim_loop(self, lease_ms: int) -> None:
        loop = asyncio.get_running_loop()
        assert self._stopping is not None
        lookahead_ms = round(self.lookahead_s * 1000)
        error_delay = 0.1
        while not self._stopping.is_set():
            free = self.concurrency - self._busy
            if free <= 0:
                # Full: announcements do not matter until a handler finishes and pokes. Any
                # poke so far is answered: we looked, and we are full (and not stopping).
                self.waker.reset()
                await self.waker.sleep_until(loop.time() + self.max_wait_s)
                continue
            self.waker.reset()
            sent = loop.time()
            try:
                result = await self.runner.run(
                    leasing.claim(
                        self.core, limit=free, lease_ms=lease_ms, lookahead_ms=lookahead_ms
                    )
                )
            except DelayqError as e:
                log.warning("claim failed (%s); retrying in %.1f s", e, error_delay)
                await self.waker.sleep_until(loop.time() + error_delay)
                error_delay = min(error_delay * 2, 5.0)
                continue
            error_delay = 0.1
            self.clock.observe(result.now_ms, sent, loop.time())
            for claimed in result.tasks:
                self._start(claimed)
            if len(result.tasks) >= free:
                continue  # a full batch: more may be due right now
            deadline = loop.time() + self.max_wait_s
            if result.next_due_ms is not None:
                deadline = min(deadline, self._to_loop(result.next_due_ms) - self.lookahead_s)
            if result.next_lease_ms is not None:
                deadline = min(deadline, self._to_loop(result.next_lease_ms) + 0.001)
            await self.waker.sleep_until(deadline, self._to_loop, self.lookahead_s)

    def _to_loop(self, server_ms: float) -> float:
        return self.clock.to_loop(server_ms, asyncio.get_running_loop().time())

    # -- one task's life -------------------------------------------------------------------

    def _start(self, claimed: Claimed) -> None:
        self.leases[claimed.id] = claimed.token
        self._busy += 1
        loop = asyncio.get_running_loop()
        due = claimed.header.due_ms
        at = self._to_loop(due) if due is not None else loop.time()
        if at - loop.time() > 0.0002:
            self._timers[claimed.id] = (loop.call_at(at, self._launch, claimed), claimed)
        else:
            self._launch(claimed)

    def _launch(self, claimed: Claimed) -> None:
        self._timers.pop(claimed.id, None)
        self.running[claimed.id] = asyncio.create_task(self._execute(claimed))

    def _note_start(self, task: Task) -> None:
        self.tasks[task.id] = task
        self.started_count += 1

    def _finish(self, outcome: Outcome) -> None:
        self._finishing.add(outcome.id)
        self.finisher.add(outcome)

    async def _execute(self, claimed: Claimed) -> None:
        try:
            outcome = await self.executor.run(claimed, self._note_start)
        except asyncio.CancelledError:
            if claimed.id not in self._lost:
                # Shutdown after the grace period: hand it back so it runs again promptly.
                self._finish(Outcome("release", claimed.id, claimed.token))
        except Exception:
            log.exception("internal error running task %s; handing it back", claimed.id)
            self._finish(Outcome("release", claimed.id, claimed.token))
        else:
            self._finish(outcome)
        finally:
            self.running.pop(claimed.id, None)
            self.tasks.pop(claimed.id, None)
            self._lost.discard(claimed.id)
            self._busy -= 1
            self.waker.poke()

    def _written(self, outcomes: list[Outcome], refused: set[str]) -> None:
        for o in outcomes:
            self._finishing.discard(o.id)
            if self.leases.get(o.id) == o.token:
                del self.leases[o.id]
            if o.id in refused:
                log.warning(
                    "result %r of task %s was refused: the lease was lost (expired or taken "
                    "over), so the task runs again or already has",
                    o.action,
                    o.id,
                )

    def _leases_lost(self, ids: list[str]) -> None:
        for tid in ids:
            if tid in self._finishing:
                continue  # its result is being written; that write tells whether it counted
            log.warning("lease of task %s lost; stopping its handler", tid)
            self.leases.pop(tid, None)
            task = self.tasks.get(tid)
            if task is not None:
                task.lease_lost.set()
            timer = self._timers.pop(tid, None)
            if timer is not None:
                timer[0].cancel()
                self._busy -= 1
                continue
            running = self.running.get(tid)
            if running is not None:
                self._lost.add(tid)
                running.cancel()

    async def _fire_on_dead(self, task: Task | None, task_id: str, reason: str) -> None:
        log.error("task %s is dead: %s", task_id, reason.splitlines()[0] if reason else "")
        for hook in self.registry.on_dead:
            try:
                result = hook(task_id, reason, task)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("on_dead hook %r failed", hook)

    # -- shutdown ---------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Stop claiming, hand back what has not started, let running handlers finish within
        the grace period, hand back the rest, and write every result before returning."""
        for tid, (handle, claimed) in list(self._timers.items()):
            handle.cancel()
            self._timers.pop(tid, None)
            self._busy -= 1
            self._finish(Outcome("release", tid, claimed.token))
        if self.running and self._force is not None:

            async def all_finished() -> None:
                while self.running:
                    await asyncio.wait(list(self.running.values()))

            waits = [asyncio.create_task(all_finished()), asyncio.create_task(self._force.wait())]
            await asyncio.wait(waits, timeout=self.grace_s, return_when=asyncio.FIRST_COMPLETED)
            for w in waits:
                w.cancel()
        leftover = list(self.running.values())
        for t in leftover:
            t.cancel()
        await asyncio.gather(*leftover, return_exceptions=True)
        try:
            await asyncio.wait_for(self.finisher.drained(), timeout=10)
        except TimeoutError:
            log.error(
                "could not write %d results before exiting; their leases will expire "
                "and the tasks run again",
                len(self.leases),
            )
