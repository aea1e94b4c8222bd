"""A bounded pool of threads for sync handlers that hands results back in batches.

``loop.run_in_executor`` wakes the event loop once per finished call (a concurrent future,
a chained asyncio future, a write to the loop's self-pipe), and under load the loop and
the handler threads spend their time passing the GIL back and forth. Here a finished
call appends to a list, and only the first result since the loop last looked schedules
a wake-up: one wake-up delivers every result that finished meanwhile.

Threads are daemons: a handler still running when the worker exits (its task was handed
back after the grace period) does not keep the process alive.
"""

from __future__ import annotations

import asyncio
import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

_STOP = object()


class Job:
    """One call in a handler thread. ``fut`` is what the caller awaits: cancelled when the
    call is abandoned (its timeout, a lost lease, an abort, shutdown), while the thread runs
    on. ``returned`` says whether the thread has returned, and :meth:`ended` is a future done
    once it has, made only when asked (a call that outlives its attempt): awaiting ``fut``
    itself, not a shield of it, keeps the common call to one wake-up of the caller."""

    __slots__ = ("end", "fut", "returned")

    def __init__(self, fut: asyncio.Future[Any]) -> None:
        self.fut = fut
        self.returned = False
        self.end: asyncio.Future[None] | None = None

    def ended(self) -> asyncio.Future[None]:
        """A future done when the thread has returned (at once if it has)."""
        if self.end is None:
            self.end = self.fut.get_loop().create_future()
            if self.returned:
                self.end.set_result(None)
        return self.end


class HandlerThreads:
    def __init__(self, size: int, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self._loop = loop
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._results: list[tuple[Job, bool, Any]] = []
        self._lock = threading.Lock()
        self._wake_pending = False
        # Handlers running now: counted by the threads themselves, under the lock, as each
        # begins and returns (the shutdown's "still running" warning reads it).
        self.busy = 0
        self._threads = [
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True)
            for i in range(size)
        ]
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[[Any], Any], arg: Any) -> Job:
        """Run ``fn(arg)`` in a handler thread, in a copy of the caller's context (as
        ``asyncio.to_thread`` does): what a middleware set around the call (a trace's span,
        a request id) is what the handler sees. Await its ``fut`` for the result."""
        job = Job(self._loop.create_future())
        self._jobs.put((job, contextvars.copy_context().run, (fn, arg)))
        return job

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is _STOP:
                return
            call, fn, arg = job
            with self._lock:
                self.busy += 1
            try:
                result: tuple[Job, bool, Any] = (call, True, fn(*arg))
            except Exception as e:
                result = (call, False, e)
            except BaseException as e:  # sys.exit() in a handler fails the task, not the worker
                result = (call, False, RuntimeError(f"handler raised {e!r}"))
            with self._lock:
                self.busy -= 1
                self._results.append(result)
                if self._wake_pending:
                    continue
                self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:
                return  # the loop is closed: the worker is gone

    def _deliver(self) -> None:
        with self._lock:
            results, self._results = self._results, []
            self._wake_pending = False
        for job, ok, value in results:
            job.returned = True
            if job.end is not None:
                job.end.set_result(None)
            fut = job.fut
            if fut.done():
                continue  # cancelled: the call was abandoned (its timeout, a lost lease, ...)
            if ok:
                fut.set_result(value)
            else:
                fut.set_exception(value)

    def shutdown(self) -> None:
        """Stop idle threads; busy ones finish their handler first (they are daemons)."""
        for _ in self._threads:
            self._jobs.put(_STOP)

    def alive(self) -> int:
        return sum(1 for t in self._threads if t.is_alive())
