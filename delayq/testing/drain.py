"""Running a worker's due tasks in virtual time, in the calling thread: ``drain``.

``drain`` is the real worker on the real scripts: it claims with the queue's virtual
clock as "now", runs each task through the worker's own executor (so handlers, their
exceptions, backoff, ``max_attempts``, ``on_dead``, cron occurrences and expiring keys'
callbacks behave as they do in production), and writes each outcome with the same
scripts. What it leaves out is concurrency and waiting: it takes the tasks due by the
clock's now, runs them one after another, then moves the clock to the next due time, until
nothing is due by ``until``. A sync handler runs inline, in the thread that called drain.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from delayq import check, leasing
from delayq.cancel import cancel_and_wait
from delayq.connection import async_client
from delayq.core import QueueCore
from delayq.errors import ConfigurationError, Defer, Discard, Fail, Retry
from delayq.expiring.ops import EXPIRE_KIND
from delayq.info import as_str
from delayq.leasing import Claimed
from delayq.runner import AsyncRunner
from delayq.spec import TaskType
from delayq.task import Task, TaskInfo
from delayq.testing.clock import VirtualClock, ms_of
from delayq.timing import ms_to_datetime
from delayq.worker import unreadable
from delayq.worker.execute import Executor
from delayq.worker.outcome import Outcome, outcome_op
from delayq.worker.threads import HandlerThreads, Job

if TYPE_CHECKING:
    from delayq.worker.worker import Worker

log = logging.getLogger("delayq.testing")

RanOutcome = Literal["done", "retry", "discarded", "dead", "deferred", "lost"]
_OUTCOMES: dict[str, RanOutcome] = {
    "ack": "done",
    "discard": "discarded",
    "retry": "retry",
    "bury": "dead",
    "release": "deferred",  # handed back without using an attempt (Defer: a re-armed key)
    "handback": "deferred",  # no handler for its kind: handed back (or buried, its grace over)
}
OUTCOME_EXCEPTIONS = (Retry, Discard, Fail, Defer)
BATCH = 100  # tasks claimed at a time, all due by the virtual now
# A run's lease: a century of virtual time, so a handler that moves the clock itself (by
# days, say) cannot outlive it.
LEASE_MS = 100 * 365 * 86_400_000
MAX_RUNS = 100_000  # a drain that runs more has met a task that reschedules itself at once


class Ran(NamedTuple):
    """One attempt ``drain`` ran: its kind, task id, attempt number and how it ended
    (``done``, ``retry``, ``discarded``, ``dead``; ``deferred`` when it was handed back
    without using an attempt, as an expiring key whose TTL was extended is; ``lost`` when
    its outcome was refused because a handler moved the clock past its lease)."""

    kind: str
    task_id: str
    attempt: int
    outcome: RanOutcome


@dataclass
class Drained:
    """What one ``drain`` ran, in the order it ran, and the tasks as they were after it.

    ``done``, ``retried``, ``discarded``, ``dead`` and ``deferred``: the tasks (as
    ``TaskInfo``, read when the drain ended) that had that outcome in this drain, each
    once, in the order they first had it. A task finished longer ago than the queue's
    dedupe window is no longer recorded and is left out of these lists (not of ``ran``).
    """

    ran: list[Ran] = field(default_factory=list)
    infos: dict[str, TaskInfo] = field(default_factory=dict)

    def _with(self, outcome: RanOutcome) -> list[TaskInfo]:
        ids = dict.fromkeys(r.task_id for r in self.ran if r.outcome == outcome)
        return [self.infos[i] for i in ids if i in self.infos]

    @property
    def done(self) -> list[TaskInfo]:
        return self._with("done")

    @property
    def retried(self) -> list[TaskInfo]:
        return self._with("retry")

    @property
    def discarded(self) -> list[TaskInfo]:
        return self._with("discarded")

    @property
    def dead(self) -> list[TaskInfo]:
        return self._with("dead")

    @property
    def deferred(self) -> list[TaskInfo]:
        return self._with("deferred")

    def by_kind(self, kind: str | TaskType[Any, Any]) -> list[Ran]:
        """The attempts of tasks of ``kind``, a kind or a :class:`~delayq.TaskType` (a cron
        schedule's are ``cron:<name>``)."""
        if isinstance(kind, TaskType):
            kind = kind.kind
        check.text(kind, "kind")
        return [r for r in self.ran if r.kind == kind]

    def __iter__(self) -> Iterator[Ran]:
        return iter(self.ran)

    def __len__(self) -> int:
        return len(self.ran)


class InlineThreads(HandlerThreads):
    """Sync handlers run at once, in the calling thread (there are no handler threads)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(0, loop, "delayq-drain")
        self.loop = loop

    def submit(self, fn: Any, arg: Any) -> Job:
        job = Job(self.loop.create_future())
        try:
            job.fut.set_result(fn(arg))
        except Exception as e:
            job.fut.set_exception(e)
        except BaseException as e:  # sys.exit() in a handler fails the task, as in a worker
            job.fut.set_exception(RuntimeError(f"handler raised {e!r}"))
        job.returned = True
        return job


def _clock_of(worker: Worker) -> VirtualClock:
    from delayq.worker.worker import Worker  # (on first use, as delayq.worker imports it)

    check.instance(worker, "worker", Worker, "the Worker whose tasks to run")
    if len(worker.queues) > 1:
        names = ", ".join(repr(q.name) for q in worker.queues)
        raise ConfigurationError(
            f"drain() runs a worker of one queue; this one serves {names}: in a test, build "
            "a Worker per queue (the same handler functions registered on each) and drain "
            "each"
        )
    clock = worker.queue.core.clock
    if not isinstance(clock, VirtualClock):
        raise ConfigurationError(
            "drain() runs a worker in virtual time: open its queue with a VirtualClock, "
            "e.g. Queue(name, url=url, clock=VirtualClock()) (or use the delayq_queue "
            "fixture of delayq.testing's pytest plugin)"
        )
    return clock


def _target_ms(clock: VirtualClock, until: datetime | timedelta | None) -> int:
    now = clock.now_ms()
    if until is None:
        return now
    if isinstance(until, timedelta):
        ms = now + math.floor(until.total_seconds() * 1000)
    elif isinstance(until, datetime):
        ms = ms_of(until, "until", floor=True)
    else:
        raise ConfigurationError(
            f"until= takes a datetime or a timedelta from the clock's now, got "
            f"{type(until).__name__}"
        )
    if ms < now:
        raise ConfigurationError(
            f"until= is before the clock's now ({clock.now().isoformat()}): the clock only "
            "moves forward"
        )
    return ms


class _Drain:
    def __init__(self, worker: Worker, clock: VirtualClock, raise_errors: bool) -> None:
        self.worker = worker
        self.clock = clock
        self.raise_errors = raise_errors
        self.first_error: BaseException | None = None
        self.drained = Drained()

    def _failed(self, task: Task, e: BaseException) -> None:
        # Retry, Discard, Fail and Defer are outcomes a handler chose, not errors to show.
        if self.first_error is None and not isinstance(e, OUTCOME_EXCEPTIONS):
            self.first_error = e

    async def run(self, target_ms: int) -> Drained:
        loop = asyncio.get_running_loop()
        client = async_client(self.worker.queue.url)
        runner = AsyncRunner(client)
        stopping = asyncio.Event()
        ctx = self.worker.context(runner, InlineThreads(loop), stopping)
        executor = Executor(ctx)
        executor.on_failure = self._failed
        try:
            for hook in ctx.startup:  # on_startup's, and cron's (declaring its schedules)
                await hook(ctx)
            await self._loop(ctx.shards.cores, runner, executor, target_ms)
            if target_ms > self.clock.now_ms():  # a handler may have moved the clock past it
                self.clock.advance_to(ms_to_datetime(target_ms))
            ids = list(dict.fromkeys(r.task_id for r in self.drained.ran))
            infos = await runner.run_many([ctx.shards.of(i).get(i) for i in ids]) if ids else []
            self.drained.infos = {i: info for i, info in zip(ids, infos, strict=True) if info}
        finally:
            ctx.stop()
            await cancel_and_wait(ctx.loops)  # the cron ticker, started by its start-up hook
            await client.aclose()
        if self.raise_errors and self.first_error is not None:
            raise self.first_error
        return self.drained

    async def _loop(
        self, cores: list[QueueCore], runner: AsyncRunner, executor: Executor, target_ms: int
    ) -> None:
        while True:
            next_due: int | None = None
            ran_any = False
            for core in cores:
                claim = leasing.claim(core, limit=BATCH, lease_ms=LEASE_MS)
                result = await runner.run(claim)
                if result.unreadable:  # another program's rows, not UTF-8: buried at once
                    await unreadable.bury(runner, core, executor, result.unreadable)
                due = result.next_due_ms
                if result.next_token_ms is not None:  # a rate limit holds the rest till then
                    due = max(due or 0, result.next_token_ms)
                if due is not None:
                    next_due = min(next_due or due, due)
                ran_any = ran_any or bool(result.tasks)
                if not await self._run_batch(core, runner, executor, result.tasks):
                    return
            if ran_any:
                continue  # whatever came due meanwhile (a retry due now), at the same now
            if next_due is None:
                return
            # Nothing was due at now: at least a millisecond on (a due time with microseconds
            # comes due in the millisecond after it).
            step = max(next_due, self.clock.now_ms() + 1)
            if step > target_ms:
                return
            self.clock.advance_to(ms_to_datetime(step))

    async def _run_batch(
        self, core: QueueCore, runner: AsyncRunner, executor: Executor, batch: list[Claimed]
    ) -> bool:
        """Run a claimed batch; False when drain stops at a failure (raise_errors). What was
        claimed but not run, whatever stopped it, is handed back, its attempt not counted,
        or it would sit out LEASE_MS."""
        done = 0
        try:
            for claimed in batch:
                await self._run_one(core, runner, executor, claimed)
                done += 1
                if self.raise_errors and self.first_error is not None:
                    return False
            return True
        finally:
            if rest := [(c.id, c.token) for c in batch[done:]]:
                await runner.run(leasing.release(core, rest))

    async def _run_one(
        self, core: QueueCore, runner: AsyncRunner, executor: Executor, claimed: Claimed
    ) -> None:
        if len(self.drained.ran) >= MAX_RUNS:
            raise RuntimeError(
                f"drain() ran {MAX_RUNS:,} attempts without running out of due tasks: a "
                "handler that schedules work due at once, forever? (pass an earlier until=)"
            )
        if claimed.header.kind == EXPIRE_KIND:
            await self._expire_key(core, runner, claimed)
        outcome: Outcome = await executor.run(claimed, lambda task: None)
        refused = await runner.run(outcome_op(core, outcome.action, [outcome], executor.unknown))
        ran: RanOutcome = _OUTCOMES[outcome.action]
        if outcome.action == "handback" and outcome.id in executor.unknown.buried:
            ran = "dead"  # its unknown_kind_grace was over
        if refused:  # its lease ended: a handler moved the clock by more than LEASE_MS
            log.warning("the outcome of %s was refused: its lease was lost", claimed.id)
            ran = "lost"
        h = claimed.header
        self.drained.ran.append(Ran(h.kind, claimed.id, h.attempts, ran))

    async def _expire_key(self, core: QueueCore, runner: AsyncRunner, claimed: Claimed) -> None:
        """The key's virtual deadline has passed: expire it, as Redis would have, unless it
        was set again meanwhile (then its newer value is another task's to deliver)."""
        payload = json.loads(claimed.payload)
        if payload.get("foreign"):
            return
        key = payload["k"]
        latest = await runner.client.hget(core.keys.xkeys, key)
        if latest is not None and as_str(latest) == claimed.id:
            await runner.client.delete(key)


async def adrain(
    worker: Worker,
    *,
    until: datetime | timedelta | None = None,
    raise_errors: bool = False,
) -> Drained:
    """``drain`` for asyncio tests: the same, on the running event loop."""
    check.flag(raise_errors, "raise_errors")
    clock = _clock_of(worker)
    target = _target_ms(clock, until)
    return await _Drain(worker, clock, raise_errors).run(target)


def drain(
    worker: Worker,
    *,
    until: datetime | timedelta | None = None,
    raise_errors: bool = False,
) -> Drained:
    """Run every task of ``worker``'s queue due by ``until``, in due order, in virtual time.

    ``until``: an aware datetime, or a timedelta from the clock's now, taken to the
    millisecond (cut down); the clock advances to it. None: the tasks due by the clock's
    now. Retries come due after their backoff,
    cron occurrences at their times and watched keys at their deadlines (the key is
    expired then, and its callback gets the last value), each run when the clock reaches
    it: a task never runs before its virtual due time. ``raise_errors``: stop at the first
    exception a handler raises and raise it (its outcome written first), so pytest shows
    its traceback; ``Retry``, ``Discard``, ``Fail`` and ``Defer`` are outcomes the handler
    chose and do not stop it. Returns what ran (:class:`Drained`).

    Called from blocking code; from a coroutine, ``await adrain(...)``. On-startup hooks
    run at the start of each drain.
    """
    check.flag(raise_errors, "raise_errors")
    _target_ms(_clock_of(worker), until)  # (a wrong worker or until: refused before a loop)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(adrain(worker, until=until, raise_errors=raise_errors))
    raise RuntimeError("drain() was called on a running event loop: use await adrain(...)")
