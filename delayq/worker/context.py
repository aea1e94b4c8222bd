"""What the worker's parts share while it serves: the :class:`WorkerContext`.

The engine (``execute.py``) and the features built on it (``features/cron.py``,
``features/expiring.py``) receive the context, never the :class:`~delayq.worker.Worker`; this
module imports none of them. It also holds the one way a handler is called
(:meth:`WorkerContext.invoke`: through the middleware, then on the loop or in a handler
thread, with its timeout) and the one reading of what a handler's exception means
(:func:`classify`).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from delayq.core import QueueCore
from delayq.errors import Defer, Discard, Fail, Retry
from delayq.hooks import CallNext, Middleware
from delayq.runner import AsyncRunner
from delayq.shards import Shards
from delayq.task import Task
from delayq.worker.clock import ServerClock
from delayq.worker.events import Events
from delayq.worker.registry import HandlerFn, Registry
from delayq.worker.supervise import Supervisor
from delayq.worker.threads import HandlerThreads
from delayq.worker.waker import Waker

StartupHook = Callable[["WorkerContext"], Awaitable[None]]
Loop = Callable[[], Coroutine[Any, Any, None]]
# The middleware composed: ``chain(task, terminal)`` runs each middleware, outermost first,
# and the innermost one's ``call_next`` is ``terminal`` (the handler's call).
Chain = Callable[[Task, CallNext], Awaitable[Any]]


class Invocable(Protocol):
    """What :meth:`WorkerContext.invoke` calls: a registry :class:`Handler`, a schedule's
    function, an expiry callback."""

    @property
    def fn(self) -> HandlerFn: ...

    @property
    def is_async(self) -> bool: ...

    @property
    def timeout(self) -> float | None: ...


class ThreadOwner(Protocol):
    """What holds a handler thread's slot (a :class:`~delayq.worker.runs.Run`): told when
    the thread outlives its call, so the slot stays held until the thread returns."""

    def outlived(self, fut: asyncio.Future[Any], timeout: float | None) -> None: ...


# The attempt a handler is called in, set by the executor (in the attempt's own context,
# for the handlers that may call a thread: sync ones and the internal ones that call the
# user's function), read by :meth:`WorkerContext.call` when a thread outlives its call.
ATTEMPT: contextvars.ContextVar[ThreadOwner | None] = contextvars.ContextVar(
    "delayq_attempt", default=None
)


@dataclass(frozen=True, slots=True)
class Verdict:
    """What an exception from a handler means for its task (execute.py's docstring)."""

    outcome: Literal["deferred", "discarded", "dead", "retrying"]
    error: str  # one line: how the outcome is recorded ("" for a deferral)
    failed: bool = False  # a failure of the handler: reported as a "failed" event
    due_ms: int = 0  # deferred: run again this many ms from now
    after: float | None = None  # retrying: the delay the handler asked for (Retry(after=))
    # dead: why; None for an exception the handler did not mean (its traceback says why)
    reason: str | None = None


def classify(e: BaseException, task: Task) -> Verdict:
    """Whether the attempt that raised ``e`` leaves ``task`` deferred, discarded, dead or to
    be retried, and the error recorded: ``Defer`` hands it back without using an attempt,
    ``Discard`` ends it, ``Fail`` buries it, ``Retry`` and any other exception retry it while
    attempts are left."""
    if isinstance(e, Defer):
        return Verdict("deferred", "", due_ms=max(e.after_ms, 1))
    if isinstance(e, Discard):
        return Verdict("discarded", e.reason)
    if isinstance(e, Fail):
        reason = f"Fail: {e.reason or 'no reason given'}"
        return Verdict("dead", f"Fail: {e.reason}", failed=True, reason=reason)
    will_retry = task.attempt < task.max_attempts
    if isinstance(e, Retry):
        if will_retry:
            return Verdict("retrying", f"Retry: {e}", after=e.after)
        reason = f"Retry requested, but no attempts left: {e}"
        return Verdict("dead", f"Retry: {e}", reason=reason)
    return Verdict("retrying" if will_retry else "dead", f"{type(e).__name__}: {e}", failed=True)


def compose(middleware: Sequence[Middleware]) -> Chain | None:
    """The middleware as one chain, the first outermost; None when there is none (the
    handler is then called directly). Built once per serving worker: a call through it makes
    one small ``call_next`` per middleware but the innermost (which gets the handler's call)."""
    if not middleware:
        return None
    *outer, innermost = middleware
    chain: Chain = innermost  # its call_next is the handler's call
    for mw in reversed(outer):
        chain = _layer(mw, chain)
    return chain


def _layer(mw: Middleware, inner: Chain) -> Chain:
    async def layer(task: Task, terminal: CallNext) -> Any:
        return await mw(task, lambda t: inner(t, terminal))

    return layer


class WorkerContext:
    """The runtime of one serving worker, built once when serving begins.

    Holds the queue's shards (``core`` is the home shard), the runner, the handler threads,
    the server clock, the ``stopping`` event (set when the worker begins to shut down), the
    handler registry, the start-up hooks (each awaited with the context, in order, before
    the first claim), the event listeners, the wake-up listener, the worker's id and its
    middleware (the process-wide ``delayq.hooks.middleware`` first, then the worker's own),
    composed here once.
    """

    def __init__(
        self,
        *,
        shards: Shards,
        runner: AsyncRunner,
        threads: HandlerThreads,
        clock: ServerClock,
        stopping: asyncio.Event,
        registry: Registry,
        startup: list[StartupHook],
        events: Events,
        waker: Waker,
        supervisor: Supervisor,
        worker_id: str,
        middleware: Sequence[Middleware] = (),
    ) -> None:
        self.shards = shards
        self.core: QueueCore = shards.home
        self.runner = runner
        self.threads = threads
        self.clock = clock
        self.stopping = stopping
        self.registry = registry
        self.startup = startup
        self.events = events
        self.waker = waker
        self.supervisor = supervisor
        self.worker_id = worker_id
        self.middleware = tuple(middleware)
        self.chain = compose(self.middleware)
        # The background loops, each under supervision: cancelled when the worker exits.
        self.loops: list[asyncio.Task[None]] = []

    classify = staticmethod(classify)

    def now_ms(self) -> int:
        """Now on the queue's clock without a round trip: a test's virtual clock, else the
        server's as the worker tracks it from claim replies, else this machine's."""
        virtual = self.core.clock
        if virtual is not None:
            return virtual.now_ms()
        offset = self.clock.offset
        if offset is None:
            return round(time.time() * 1000)
        return round((asyncio.get_running_loop().time() + offset) * 1000)

    def stop(self) -> None:
        """Begin the shutdown: ``stopping`` is set and the claim loop woken to see it."""
        self.stopping.set()
        self.waker.poke()

    def supervise(self, name: str, loop: Loop) -> asyncio.Task[None]:
        """Run ``loop()`` under the worker's supervision (restarted when it raises; one that
        keeps failing stops the worker with WorkerFailed); cancelled when the worker exits."""
        task = self.supervisor.start(name, loop)
        self.loops.append(task)
        return task

    async def invoke(
        self, handler: Invocable, task: Task, arg: Any = None, what: str = "handler"
    ) -> Any:
        """Call ``handler.fn(arg)`` (``arg`` None: the task) through the middleware and
        return its result (see :meth:`call`). Each middleware gets the task and ``call_next``;
        the handler gets the task the innermost passes on (an expiry callback its ``arg``).
        An exception from the handler or a middleware is the caller's to :func:`classify`."""
        chain = self.chain
        if chain is None:
            return await self.call(handler, task, arg, what)
        if arg is None and handler.is_async and handler.timeout is None:
            # What call() would do for it: await handler.fn(task). Handed to the innermost
            # middleware as its call_next, two coroutine frames and a partial fewer a call.
            return await chain(task, handler.fn)
        return await chain(task, functools.partial(self._terminal, handler, arg, what))

    async def _terminal(self, handler: Invocable, arg: Any, what: str, task: Task) -> Any:
        return await self.call(handler, task, arg, what)

    async def call(
        self, handler: Invocable, task: Task, arg: Any = None, what: str = "handler"
    ) -> Any:
        """Call ``handler.fn(arg)`` (``arg`` None: the task) without the middleware, and
        return its result: an async function on the loop, a sync one in a handler thread.

        Past ``handler.timeout`` an async function is cancelled. A sync one cannot be
        stopped: the call raises ``TimeoutError`` (its outcome, a retry, is written then),
        ``task.lease_lost`` is set so a cooperative function gives up, and whatever it
        returns is ignored; its thread runs on. So does it when the call is cancelled (a
        lost lease, an abort, shutdown). Either way the attempt's owner (:data:`ATTEMPT`)
        is told, and keeps its slot and its kind's place until the thread returns."""
        if arg is None:
            arg = task
        timeout = handler.timeout
        if handler.is_async:
            coro = handler.fn(arg)
            if timeout is None:
                return await coro
            try:
                return await asyncio.wait_for(coro, timeout)
            except TimeoutError as e:
                if not isinstance(e.__cause__, asyncio.CancelledError):
                    raise  # the function's own TimeoutError: wait_for's comes from cancelling
                raise TimeoutError(f"{what} took longer than its timeout of {timeout} s") from None
        job = self.threads.submit(handler.fn, arg)
        overran: float | None = None
        try:
            # Cancelling the call (a lost lease, shutdown) cancels job.fut, not the thread:
            # job.returned and job.ended() say when the thread has really returned.
            if timeout is None:
                return await job.fut
            return await asyncio.wait_for(job.fut, timeout)
        except TimeoutError:
            if job.returned:
                raise  # the function's own TimeoutError
            overran = timeout
            task.lease_lost.set()
            raise TimeoutError(f"{what} took longer than its timeout of {timeout} s") from None
        finally:
            if not job.returned and (owner := ATTEMPT.get()) is not None:
                owner.outlived(job.ended(), overran)
