"""The worker's side of periodic schedules: ``@worker.cron`` and ``@worker.every``.

Every worker that declares schedules runs them; there is no leader. Each occurrence is a task
with a deterministic id, and a schedule is one chain of such tasks:

- **when an occurrence starts**, before the user's function, one script (cron/next.lua)
  checks the lease, applies ``max_running`` and, if this occurrence is the schedule's
  current one, creates the next occurrence (time chosen by the catch-up policy) and records
  the run. A crash before that script means the lease expires and the occurrence runs
  again, creating its successor then; a crash after it leaves the successor in place. The
  successor is never created at claim time itself (claim.lua knows nothing of schedules),
  but nothing is skipped in between: the occurrence stays leased until its outcome is
  written.
- **at start-up**, and every ``tick_s`` after, a pass (cron/sync.lua, compare-and-set per
  schedule) makes sure each declared schedule has its pending occurrence: it creates new
  schedules, replaces one whose times changed (start-up only), continues a chain whose
  occurrence was consumed unrun (buried by a worker without the handler, cancelled), and
  parks schedules that no live worker declares any more.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from delayq.cron import facade as cron_facade
from delayq.cron import ops as cron_ops
from delayq.cron.schedules import (
    DEFAULT_CATCH_UP_LIMIT,
    DEFAULT_MISFIRE_GRACE_S,
    CatchUp,
    Schedule,
    cron_schedule,
    every_schedule,
    interval_ms,
    occurrence_of,
    validate_name,
)
from delayq.errors import (
    ConfigurationError,
    Defer,
    DelayqError,
    Discard,
    Fail,
    raise_for,
)
from delayq.task import Task
from delayq.worker.context import Loop, WorkerContext
from delayq.worker.lane import Lane
from delayq.worker.registry import DEFAULT_MAX_ATTEMPTS, HandlerFn, make_handler

log = logging.getLogger("delayq.cron")

TICK_S = 30.0  # the periodic check
ORPHAN_GRACE_S = 120.0  # undeclared this long (and by no live worker): parked
FORGET_AFTER_S = 30 * 86400.0  # parked this long: forgotten
DEFER_MIN_MS, DEFER_MAX_MS = 50, 1000  # an occurrence waiting for a max_running slot
QUICK_RETRIES = (0.01, 0.02, 0.04, None)  # busy: look again after these pauses, then defer
# The handler options (Worker.handler's) a schedule takes with its own.
HANDLER_OPTIONS = frozenset(("max_attempts", "backoff", "jitter", "timeout"))


@dataclass(frozen=True)
class _Entry:
    """A declared schedule and its function (called with :meth:`WorkerContext.invoke`)."""

    sched: Schedule
    fn: HandlerFn
    is_async: bool
    timeout: float | None


def _default_name(fn: HandlerFn) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


class Schedules:
    """The periodic schedules declared on one lane of a worker, an extension
    (:class:`~delayq.worker.lane.Extension`): their handlers go in the lane's registry, and
    the first declared adds the start-up pass (:meth:`startup`) to the lane's start-up
    hooks; the pass starts the periodic check."""

    def __init__(self) -> None:
        self._lane: Lane | None = None  # (register)
        self._ctx: WorkerContext | None = None  # the serving worker's (attach)
        self.entries: dict[str, _Entry] = {}
        self.tick_s = TICK_S
        self.orphan_grace_s = ORPHAN_GRACE_S
        self.forget_after_s = FORGET_AFTER_S
        self._synced = False
        self._ticker: asyncio.Task[None] | None = None

    # -- the extension's hooks -------------------------------------------------------------

    def register(self, lane: Lane) -> None:
        self._lane = lane

    @property
    def lane(self) -> Lane:
        """The lane whose queue keeps these schedules (``Worker.schedules_of``)."""
        if self._lane is None:
            raise RuntimeError("these schedules are on no worker: declare them on one")
        return self._lane

    def attach(self, ctx: WorkerContext) -> None:
        self._ctx = ctx

    def loops(self) -> Sequence[tuple[str, Loop]]:
        return ()  # the periodic check follows the start-up pass, which starts it

    # -- declaring ------------------------------------------------------------------------

    def cron(
        self,
        expression: str,
        *,
        tz: str = "UTC",
        name: str | None = None,
        catch_up: CatchUp = "latest",
        max_running: int = 1,
        misfire_grace: float | timedelta = DEFAULT_MISFIRE_GRACE_S,
        catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT,
        **handler_options: Any,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Run the decorated function at each time matching a five-field cron ``expression``
        on the wall clock of ``tz``. A bad expression, zone or option raises
        ConfigurationError here. ``handler_options``: max_attempts, backoff, jitter, timeout.
        """

        def build(sched_name: str) -> Schedule:
            return cron_schedule(
                sched_name,
                expression,
                tz=tz,
                catch_up=catch_up,
                max_running=max_running,
                misfire_grace=misfire_grace,
                catch_up_limit=catch_up_limit,
            )

        return self._declare(name, build, handler_options)

    def every(
        self,
        interval: float | timedelta | None = None,
        *,
        seconds: float | None = None,
        minutes: float | None = None,
        hours: float | None = None,
        name: str | None = None,
        catch_up: CatchUp = "latest",
        max_running: int = 1,
        misfire_grace: float | timedelta = DEFAULT_MISFIRE_GRACE_S,
        catch_up_limit: int = DEFAULT_CATCH_UP_LIMIT,
        **handler_options: Any,
    ) -> Callable[[HandlerFn], HandlerFn]:
        """Run the decorated function every interval, on a grid counted from the Unix epoch
        (``every(minutes=5)`` runs at :00, :05, ... whenever the workers started)."""
        ms = interval_ms(interval, seconds=seconds, minutes=minutes, hours=hours)

        def build(sched_name: str) -> Schedule:
            return every_schedule(
                sched_name,
                ms,
                catch_up=catch_up,
                max_running=max_running,
                misfire_grace=misfire_grace,
                catch_up_limit=catch_up_limit,
            )

        return self._declare(name, build, handler_options)

    def _declare(
        self,
        name: str | None,
        build: Callable[[str], Schedule],
        handler_options: dict[str, Any],
    ) -> Callable[[HandlerFn], HandlerFn]:
        unknown = set(handler_options) - HANDLER_OPTIONS
        if unknown:
            raise ConfigurationError(f"unknown schedule option(s): {', '.join(sorted(unknown))}")
        options = {"max_attempts": DEFAULT_MAX_ATTEMPTS, **handler_options}
        timeout = options.pop("timeout", None)
        if name is not None:
            build(validate_name(name))  # every error surfaces here, before the decorator
        else:
            build("check")  # the expression and options, before a name exists

        def register(fn: HandlerFn) -> HandlerFn:
            if name is not None:
                sched = build(name)
            else:
                default = _default_name(fn)
                try:
                    validate_name(default)
                except ConfigurationError:
                    raise ConfigurationError(
                        f"a schedule is named after its function by default, and {default!r} "
                        "is not a valid name: pass name='...' (letters, digits, '_.:-')"
                    ) from None
                sched = build(default)
            if sched.name in self.entries:
                raise ConfigurationError(
                    f"a schedule named {sched.name!r} is already declared on this worker"
                )
            # The handler runs our wrapper, which applies the timeout to the function only
            # (an occurrence waiting for a max_running slot is not timed out).
            handler = make_handler(
                sched.kind, self._runner_for(sched.name), internal=True, **options
            )
            probe = make_handler(sched.kind, fn, timeout=timeout)
            self.lane.registry.add(handler)
            self.entries[sched.name] = _Entry(sched, fn, probe.is_async, probe.timeout)
            if len(self.entries) == 1:
                self.lane.startup.append(self.startup)
            return fn

        return register

    def _runner_for(self, name: str) -> Callable[[Task], Any]:
        async def run_occurrence(task: Task) -> None:
            await self.run(self.entries[name], task)

        return run_occurrence

    # -- running an occurrence -----------------------------------------------------------

    @property
    def ctx(self) -> WorkerContext:
        """The serving worker's context (occurrences run only once it serves)."""
        if self._ctx is None:
            raise RuntimeError("the schedules' worker is not serving")
        return self._ctx

    async def run(self, entry: _Entry, task: Task) -> None:
        sched = entry.sched
        occurrence = occurrence_of(task.id)
        if occurrence is None:
            raise Fail(f"task id {task.id!r} is not an occurrence of schedule {sched.name!r}")
        ctx = self.ctx
        for i, pause in enumerate(QUICK_RETRIES):
            now = ctx.now_ms()
            decision = sched.decide(occurrence, now)
            op = cron_ops.start(ctx.core, sched, task.id, task.token, occurrence, decision)
            status = await ctx.runner.run(op)
            if status not in ("busy", "waiting") or pause is None or (status, i) == ("waiting", 0):
                break
            # The run ahead may have just finished, its outcome not yet written (catch-up
            # runs queue up like this): look again shortly before handing the task back. One
            # that has waited before (a long run ahead) is handed back at once.
            await asyncio.sleep(pause)
        if status == "lost":
            task.lease_lost.set()
            raise_for("cron_next", status, id=task.id)
        if status in ("busy", "waiting"):
            # max_running runs are on: wait (delay, not skip). The running one's outcome moves
            # this back to now; the deferral is the fallback, longer the longer it waits.
            raise Defer(min(DEFER_MAX_MS, max(DEFER_MIN_MS, (now - occurrence) // 4)))
        if status == "skip":
            log.warning("schedule %r: occurrence %s %s", sched.name, task.id, decision.reason)
            raise Discard(decision.reason)
        try:
            await ctx.invoke(entry, task, what="schedule function")
        except Exception as e:
            # Recorded as the executor will take it (the same classify).
            verdict = ctx.classify(e, task)
            await self._record(sched.name, task.id, verdict.outcome, verdict.error)
            raise
        await self._record(sched.name, task.id, "succeeded", "")

    async def _record(self, name: str, task_id: str, outcome: str, error: str) -> None:
        ctx = self.ctx
        try:
            await ctx.runner.run(cron_ops.outcomes(ctx.core, [(name, task_id, outcome, error)]))
        except DelayqError as e:
            # Informational only: the run's slot is freed anyway once its lease is gone.
            log.warning("schedule %r: could not record the outcome of %s: %s", name, task_id, e)

    # -- the start-up pass and the periodic check ------------------------------------------------

    async def startup(self, ctx: WorkerContext) -> None:
        """The start-up pass, then the periodic check under the worker's supervision."""
        self._ctx = ctx
        try:
            await self.sync(startup=True)
            self._synced = True
        except DelayqError as e:
            log.warning("schedules: start-up pass failed (%s); retrying in %.0f s", e, self.tick_s)
        # Under the worker's supervision, like its other loops (task name "delayq-cron").
        self._ticker = ctx.supervise("cron", self._tick_loop)

    async def _tick_loop(self) -> None:
        stopping = self.ctx.stopping  # set when the worker begins to shut down
        while True:
            try:
                await asyncio.wait_for(stopping.wait(), self.tick_s * random.uniform(0.8, 1.2))
                return
            except TimeoutError:
                pass
            try:
                await self.sync(startup=not self._synced)
                self._synced = True
            except DelayqError as e:
                log.warning("schedules: periodic check failed (%s)", e)
            except Exception:
                log.exception("schedules: periodic check failed")

    async def sync(self, *, startup: bool) -> int:
        """Bring the stored schedules in line (see :func:`cron_ops.plan`); returns the number
        of changes applied. A change refused because another worker changed the schedule
        meanwhile is planned again from a fresh read."""
        ctx = self.ctx
        own = [e.sched for e in self.entries.values()]
        applied = 0
        for _ in range(5):
            state, registered = await ctx.runner.run_many(
                [cron_facade.read(ctx.core), ctx.core.workers(limit=1000)]
            )
            live = {k for w in registered if w.alive for k in w.kinds}
            changes = cron_ops.plan(
                ctx.core,
                own,
                state,
                live,
                startup=startup,
                orphan_grace_ms=round(self.orphan_grace_s * 1000),
                forget_after_ms=round(self.forget_after_s * 1000),
            )
            if not changes:
                return applied
            done = await ctx.runner.run(cron_ops.sync(ctx.core, changes))
            applied += sum(done)
            for change, ok in zip(changes, done, strict=True):
                if ok and change.meta is not None and "parked" in change.meta:
                    log.warning(
                        "schedule %r is declared by no live worker: its pending occurrence "
                        "is removed (parked) until a worker declaring it starts",
                        change.name,
                    )
            if all(done):
                return applied
        log.info("schedules kept changing during the check; trying again at the next one")
        return applied
