"""Starting many short attempts without an asyncio task each.

A task per attempt is a third of the worker's cost for a handler that finishes at once (a
no-op, a cache write): creating it, registering it, scheduling and stepping it. So runs
are started one after another inside a shared task, each coroutine stepped by hand in a
context of its own, for as long as each finishes without waiting. The first one that does
wait keeps that task to itself until it ends (its ``current_task()``, timeouts and cancel
scopes stay its own, as in a task of its own), and the runs after it go on in a new
shared task. A shared task hands the loop over every millisecond, so claims, result
writes and timers are not held up by a long batch. Since a new task starts only on the
loop's next pass, runs whose handlers wait (sync handlers, which wait for their thread, and
I/O-bound ones) would start one per pass that way: the owner starts those in tasks of
their own (``alone``), as they would have been anyway.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import types
from collections import deque
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Generic, TypeVar

R = TypeVar("R")
Attempt = Coroutine[Any, Any, None]

SLICE_S = 0.001  # a shared task hands the loop over at least this often


@types.coroutine
def _resume(coro: Attempt, waiting: Any, ctx: contextvars.Context) -> Generator[Any, Any, None]:
    """Go on with a coroutine that was stepped by hand until it first waited on ``waiting``:
    the running task waits on what it waits on, and each result or exception goes back to
    the coroutine, in its own context, exactly as a task of its own would step it."""
    while True:
        try:
            value = yield waiting
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # a cancellation, most often: the coroutine decides
            try:
                waiting = ctx.run(coro.throw, e)
            except StopIteration:
                return
        else:
            try:
                waiting = ctx.run(coro.send, value)
            except StopIteration:
                return


class Batches(Generic[R]):
    """Starts runs in shared tasks.

    Args:
        begin: called as a run starts, with the task it starts in: the run's coroutine, or
            None to skip it (its lease was lost while it waited to start).
        abandon: called for a run that never started because its shared task was
            cancelled (shutdown), so it can be handed back.
        stepped: called with each run once its first step is done, and whether it waited
            (so kept its shared task, and the runs after it had to wait for a new task, one
            more pass of the loop).
    """

    def __init__(
        self,
        begin: Callable[[R, asyncio.Task[None]], Attempt | None],
        abandon: Callable[[R], None],
        stepped: Callable[[R, bool], None] = lambda run, waited: None,
    ) -> None:
        self.begin = begin
        self.abandon = abandon
        self.stepped = stepped
        # The shared tasks still going, each with the runs it is to start (emptied when it
        # hands them on to a new task).
        self.owned: dict[asyncio.Task[None], deque[R]] = {}
        self._open: deque[R] | None = None  # where new runs join: a shared task takes them
        # Every run starts in a fresh copy of this context (the worker's), never in one that
        # an earlier handler changed, whichever handler's exit happens to start it.
        self._context = contextvars.copy_context()

    @property
    def tasks(self) -> set[asyncio.Task[None]]:
        return set(self.owned)

    def alone(self, coro: Attempt) -> asyncio.Task[None]:
        """A task of its own for a run expected to wait, in a fresh copy of the context."""
        return asyncio.get_running_loop().create_task(coro, context=self._context.copy())

    def start(self, run: R) -> None:
        if self._open is None:
            self._open = deque()
            self._spawn(self._open)
        self._open.append(run)

    def _spawn(self, runs: deque[R]) -> None:
        task = asyncio.get_running_loop().create_task(
            self._serve(runs), context=self._context.copy()
        )
        self.owned[task] = runs
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """A shared task ended. Cancelled (shutdown), even before it began: the runs it had
        not started are handed back."""
        runs = self.owned.pop(task)
        self._close(runs)
        while runs:
            self.abandon(runs.popleft())

    async def _serve(self, runs: deque[R]) -> None:
        task = asyncio.current_task()
        assert task is not None
        sliced = time.perf_counter()
        first = True
        while runs:
            if not first and time.perf_counter() - sliced > SLICE_S:
                try:
                    await asyncio.sleep(0)
                except asyncio.CancelledError:
                    self._close(runs)  # what it holds is handed back when it has ended
                    raise
                sliced, first = time.perf_counter(), True  # at least one run per slice
                continue
            first = False
            run = runs.popleft()
            coro = self.begin(run, task)
            if coro is None:
                continue
            ctx = self._context.copy()
            try:
                waiting = ctx.run(coro.send, None)
            except StopIteration:
                self.stepped(run, False)
                continue  # finished without waiting: on to the next run, same task
            # It waits: it keeps this task, and the rest (new runs joining them) go on in a
            # new one; with none left, new runs start a batch of their own.
            self.stepped(run, True)
            self.owned[task] = deque()
            if runs:
                self._spawn(runs)
            else:
                self._close(runs)
            await _resume(coro, waiting, ctx)
            return
        self._close(runs)

    def _close(self, runs: deque[R]) -> None:
        """No more runs join these: the next run opens a new batch."""
        if self._open is runs:
            self._open = None
