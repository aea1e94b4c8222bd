"""The tasks this worker holds, from claim to written result.

A :class:`Run` is one claim of one task. It waits for one of the worker's concurrency
slots (when it was claimed ahead, see :meth:`Runs.allowance`), then on a local timer until
its due time, runs its handler, and hands the outcome to the Finisher; it is forgotten once
that write is confirmed, or at once if its lease is lost. Runs are tracked as objects, not
by task id alone: a worker can re-claim a task whose earlier run here lost its lease
(stalled past it), and the two runs must not be confused.

Each run belongs to a *lane*, one queue of the worker (``lane.py``): its executor runs the
handler, its Finisher writes the result, and its books (the current run of each task, the
leases held, the runs of each capped kind) are kept on it, since the same task id may be
held in two queues at once. The slots are shared: concurrency is the worker's, not a
queue's.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from itertools import repeat
from typing import Any, Protocol

from delayq.leasing import Claimed
from delayq.task import Task, mark_aborted
from delayq.worker.alarm import Alarm
from delayq.worker.batches import Batches
from delayq.worker.execute import Executor
from delayq.worker.outcome import Finisher, Outcome

log = logging.getLogger("delayq.worker")

INTERNAL_RETRY_MS = 30_000
# Claimed ahead of a free slot: at most this many runs, and handed back (not run) when one
# has waited this long for a slot (the handlers turned slow after it was claimed).
MAX_AHEAD = 1000
MAX_QUEUED_S = 1.0
SERVICE_WEIGHT = 0.05  # the mean handler time is a moving average over ~20 runs
# A kind whose handler waited starts its runs in tasks of their own; every this many, one
# goes through a shared task again, to notice if its handler stopped waiting.
PROBE_EVERY = 16


class RunLane(Protocol):
    """What Runs needs of a run's lane (:class:`~delayq.worker.lane.Lane`)."""

    executor: Executor
    finisher: Finisher
    by_id: dict[str, Run]  # the current run of each task held
    leases: dict[str, int]  # id -> token: what the heartbeat extends
    caps: dict[str, int]  # kind -> its cap, for the kinds with one
    of_kind: dict[str, set[Run]]  # capped kind -> its runs held (claimed, not finished)


class Run:
    __slots__ = (
        "at",
        "claimed",
        "due_now",
        "finishing",
        "handle",
        "lane",
        "lost",
        "queued_at",
        "slot",
        "task",
    )

    def __init__(self, claimed: Claimed, lane: RunLane) -> None:
        self.claimed = claimed
        self.lane = lane  # the queue it was claimed from
        self.slot = True  # holds one of the worker's concurrency slots
        self.queued_at = 0.0  # time.monotonic() when it began to wait for a slot
        self.due_now = False  # already due when claimed: no timer to work out
        self.at: float | None = None  # the loop time it waits for (Runs._timed), if it waits
        self.handle: asyncio.Task[None] | None = None
        self.task: Task | None = None
        self.lost = False
        self.finishing = False  # outcome handed to the Finisher, not yet written


class Runs:
    def __init__(
        self,
        to_loop: Callable[[float], float],
        on_slot_free: Callable[[], None],
        *,
        concurrency: int | None = None,
        lookahead: float = 0.0,
    ) -> None:
        self.to_loop = to_loop
        self.on_slot_free = on_slot_free
        self.concurrency = concurrency  # None: a slot for every run
        self.lookahead = lookahead
        # Wakes the loop at each timer's time, not the next millisecond (alarm.py); None:
        # timers fire at the loop's own granularity.
        self.alarm: Alarm | None = None
        # The loop's clock read afresh, and what its timers need added never to fire early
        # (clock.loop_clock); None: loop.time(), exact on asyncio's own loop.
        self.now: Callable[[], float] | None = None
        self.timer_margin = 0.0
        # Runs waiting for their time, a heap of (loop time, sequence, run), and one loop
        # timer (and the alarm) for the earliest. When it goes off it starts every run whose
        # time has come, so runs due at one instant, or overdue by the time the loop gets to
        # them, cost one timer between them, not one each. A run that stops waiting (its
        # lease lost, or handed back) leaves its entry, skipped when it comes up.
        self._timed: list[tuple[float, int, Run]] = []
        self._timed_seq = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self.lanes: list[RunLane] = []  # (add_lane)
        self.running: set[Run] = set()  # handlers executing, superseded ones included
        self.queued: deque[Run] = deque()  # claimed ahead, waiting for a slot
        self.busy = 0  # slots taken: claimed and not finished
        self.started = 0
        self.service_s: float | None = None  # mean time a handler holds its slot
        self.batches: Batches[Run] = Batches(self._begin, self._abandon, self._stepped)
        self._alone: dict[str, int] = {}  # kind -> runs left to start alone before a probe
        self.capped = False  # some lane has a capped kind: runs are counted
        # Whether a freed slot wakes the claim loop (on_slot_free). The claim loop says: its
        # claims were cut short for want of room, or per-kind caps may leave tasks waiting;
        # else a freed slot changes nothing until more tasks fall due.
        self.room_wanted = True

    def add_lane(self, lane: RunLane) -> None:
        """A queue whose tasks :meth:`start_many` takes in (its caps as they are now)."""
        self.lanes.append(lane)
        self.capped = self.capped or bool(lane.caps)

    @property
    def held(self) -> int:
        """Runs that hold a slot or wait for one: what counts against :meth:`allowance`."""
        return self.busy + len(self.queued)

    def allowance(self) -> int:
        """How many runs the worker may hold: its slots, plus the tasks it expects to start
        within the lookahead because its handlers finish that fast (none until it has
        seen some finish). Claiming those ahead turns a drain of short tasks into claims of
        hundreds, not of a slot count; slow handlers get no tasks held back from other
        workers."""
        slots = self.concurrency or 0
        if not self.service_s or not self.lookahead:
            return slots
        ahead = slots * self.lookahead / self.service_s
        return slots + int(min(ahead, MAX_AHEAD))

    def room(self) -> int:
        """How many tasks to claim now. Runs claimed ahead are claimed in batches of a
        quarter of what may be held ahead or more, the next while the rest still waits, so
        a claim is in flight while handlers run (at a half, the loop sat waiting for replies
        and drained slower: docs/benchmarks.md, "Figures behind the worker's constants"); with only
        the slots to fill, any free slot is claimed for."""
        if self.concurrency is None:
            return 1
        allowed = self.allowance()
        free = allowed - self.held
        if free <= 0 or free < (allowed - self.concurrency) // 4:
            return 0
        return free

    def _uncount(self, run: Run) -> None:
        held = run.lane.of_kind.get(run.claimed.header.kind)
        if held is not None:
            held.discard(run)

    def start(self, claimed: Claimed, lane: RunLane) -> None:
        self.start_many(lane, [claimed])

    def start_many(
        self,
        lanes: RunLane | Sequence[RunLane],
        batch: list[Claimed],
        server_now_ms: int | None = None,
    ) -> None:
        """Take in a claim's tasks from ``lanes`` (the queue they came from; a list: each
        task's): each starts, or waits for a slot. ``server_now_ms`` (the claim's server
        time) spares working out a timer for tasks already due."""
        queued_at = time.monotonic()
        each = lanes if isinstance(lanes, list | tuple) else repeat(lanes)
        for claimed, lane in zip(batch, each, strict=False):
            by_id = lane.by_id
            earlier = by_id.get(claimed.id)
            if earlier is not None:
                if earlier.finishing:
                    # Its result (say, a release to a new due time) is written but not yet
                    # confirmed here; the server moved on, and so do we.
                    del by_id[claimed.id]
                else:
                    self._lose(earlier)  # we re-claimed it: that run's lease is gone
            run = Run(claimed, lane)
            if self.capped and (held := lane.of_kind.get(claimed.header.kind)) is not None:
                held.add(run)
            due = claimed.header.due_ms
            run.due_now = due is None or (server_now_ms is not None and due <= server_now_ms)
            by_id[claimed.id] = run
            lane.leases[claimed.id] = claimed.token
            if self.concurrency is not None and self.busy >= self.concurrency:
                run.slot = False
                run.queued_at = queued_at
                self.queued.append(run)
            else:
                self._take_slot(run)

    def _take_slot(self, run: Run) -> None:
        run.slot = True  # (already, unless it waited in the queue)
        self.busy += 1
        if run.due_now:
            self._launch(run)
            return
        loop = asyncio.get_running_loop()
        now = self.now() if self.now is not None else loop.time()
        due = run.claimed.header.due_ms
        at = self.to_loop(due) if due is not None else now
        if at > now:
            at += self.timer_margin
            run.at = at
            self._timed_seq += 1
            heapq.heappush(self._timed, (at, self._timed_seq, run))
            if at < self._timer_at:
                self._set_timer(loop, at)
        else:
            self._launch(run)

    def _set_timer(self, loop: asyncio.AbstractEventLoop, at: float) -> None:
        self._cancel_timer()
        self._timer = loop.call_at(at, self._ring)
        self._timer_at = at
        if self.alarm is not None:
            self.alarm.at(at, spin=True)  # (reported by _ring or _cancel_timer: Alarm.ran)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            if self.alarm is not None:
                self.alarm.ran(self._timer_at)
            self._timer, self._timer_at = None, math.inf

    def _ring(self) -> None:
        """The timer went off: start every run whose time has come (the timer's, or the
        clock's: never before its own), then set the timer for the next."""
        loop = asyncio.get_running_loop()
        now = self.now() if self.now is not None else loop.time()
        come = max(self._timer_at, now)
        if self.alarm is not None:
            self.alarm.ran(self._timer_at)
        self._timer, self._timer_at = None, math.inf
        timed = self._timed
        while timed and (timed[0][0] <= come or timed[0][2].at is None):
            run = heapq.heappop(timed)[2]
            if run.at is not None:  # (None: it stopped waiting)
                run.at = None
                self._launch(run)
        if timed:
            self._set_timer(loop, timed[0][0])

    def _launch(self, run: Run) -> None:
        self.running.add(run)
        kind = run.claimed.header.kind
        left = self._alone.get(kind)
        if left is None:
            self.batches.start(run)
        elif left:  # its handler waits: in a shared task it would hold up the runs after it
            self._alone[kind] = left - 1
            run.handle = self.batches.alone(self._execute(run))
        else:  # one goes through a shared task, the rest alone until it shows which it is
            self._alone[kind] = PROBE_EVERY
            self.batches.start(run)

    def _stepped(self, run: Run, waited: bool) -> None:
        if waited:
            self._alone[run.claimed.header.kind] = PROBE_EVERY
        elif self._alone:
            self._alone.pop(run.claimed.header.kind, None)

    def _begin(self, run: Run, task: asyncio.Task[None]) -> Coroutine[Any, Any, None] | None:
        """A run starts (in a task shared with other runs while theirs finish at once)."""
        if run.lost:  # lost while it waited to start: _lose freed its slot
            self.running.discard(run)
            return None
        run.handle = task
        return self._execute(run)

    def _abandon(self, run: Run) -> None:
        """Launched, never started (shutdown cancelled its shared task): hand it back."""
        self.running.discard(run)
        if not run.lost:
            self._finish(run, Outcome("release", run.claimed.id, run.claimed.token))
            self._free_slot(run)

    def _started(self, run: Run, task: Task) -> None:
        run.task = task
        self.started += 1

    async def _execute(self, run: Run) -> None:
        claimed = run.claimed
        t0 = time.perf_counter()
        try:
            outcome = await run.lane.executor.run(claimed, lambda task: self._started(run, task))
            took = time.perf_counter() - t0
            mean = self.service_s
            self.service_s = took if mean is None else mean + (took - mean) * SERVICE_WEIGHT
        except asyncio.CancelledError:
            if not run.lost:
                # Shutdown after the grace period: hand it back so it runs again promptly.
                self._finish(run, Outcome("release", claimed.id, claimed.token))
        except Exception as e:
            # A bug in delayq, not the handler: count the attempt and retry later, so a
            # task that trips it ends in the dead set instead of looping.
            log.exception("internal error running task %s; retrying it later", claimed.id)
            self._finish(
                run,
                Outcome(
                    "retry",
                    claimed.id,
                    claimed.token,
                    f"+{INTERNAL_RETRY_MS}",
                    f"internal error in the worker: {e!r}",
                ),
            )
        else:
            self._finish(run, outcome)
        finally:
            run.handle = None  # its task may go on with other runs
            self.running.discard(run)
            self._free_slot(run)

    def _free_slot(self, run: Run, look: bool = False) -> None:
        """Give back the run's concurrency slot, exactly once: to the next run claimed
        ahead, or to the claim loop (woken when it waits for room, or ``look``)."""
        if self.capped:
            self._uncount(run)  # (before the slot check: a run lost while queued has none)
        if not run.slot:
            return
        run.slot = False
        self.busy -= 1
        while self.queued:
            nxt = self.queued.popleft()
            if nxt.lost:
                continue
            if time.monotonic() - nxt.queued_at > MAX_QUEUED_S:
                # Claimed ahead for handlers that then slowed down: let another worker run it.
                self._uncount(nxt)
                self._finish(nxt, Outcome("release", nxt.claimed.id, nxt.claimed.token))
                continue
            self._take_slot(nxt)
            break
        if (self.room_wanted or look) and self.room() > 0:  # else nothing to do for it
            self.on_slot_free()

    def _finish(self, run: Run, outcome: Outcome) -> None:
        run.finishing = True
        lane = run.lane
        if lane.by_id.get(run.claimed.id) is run:
            lane.leases.pop(run.claimed.id, None)
        lane.finisher.add(outcome)

    def written(self, lane: RunLane, outcomes: list[Outcome], refused: set[str]) -> None:
        """The Finisher's callback: these results (of ``lane``) are stored (or refused)."""
        by_id, leases = lane.by_id, lane.leases
        for o in outcomes:
            run = by_id.get(o.id)
            if run is not None and run.claimed.token == o.token:
                del by_id[o.id]
                leases.pop(o.id, None)
            if o.id in refused:
                log.warning(
                    "result %r of task %s was refused: the lease was lost (expired, taken "
                    "over or aborted), so the task runs again, already has, or was aborted",
                    o.action,
                    o.id,
                )

    def dropped(self, lane: RunLane, outcomes: list[Outcome]) -> None:
        """The Finisher's callback: these results could not be written and were given up.
        Their leases end on their own (they are not extended), and the tasks run again."""
        by_id, leases = lane.by_id, lane.leases
        for o in outcomes:
            run = by_id.get(o.id)
            if run is not None and run.claimed.token == o.token:
                del by_id[o.id]
                leases.pop(o.id, None)

    def leases_lost(self, lane: RunLane, lost: list[tuple[str, int]]) -> None:
        """The heartbeat's callback: these leases (id, token) of ``lane`` are no longer ours.
        Matched by token: a newer claim of the same task is a different, valid lease."""
        by_id = lane.by_id
        for tid, token in lost:
            run = by_id.get(tid)
            if run is not None and run.claimed.token == token and not run.finishing:
                self._lose(run)

    def abort(self, lane: RunLane, task_id: str, token: int | None = None) -> bool:
        """The task was aborted (``queue.abort``: the waker heard it, or the heartbeat found
        the lease gone to an abort): stop this worker's run of it, of the claim ``token``
        only when given. Its handler is cancelled, or, in a thread, sees ``task.aborted``;
        nothing is written for it (the abort took its lease). Returns whether a run here
        was stopped. ``lane``: the queue it was aborted on."""
        run = lane.by_id.get(task_id)
        if run is None or run.finishing or (token is not None and run.claimed.token != token):
            return False  # not held here, or its result is already on its way (refused)
        self._lose(run, aborted=True)
        return True

    def _lose(self, run: Run, aborted: bool = False) -> None:
        tid = run.claimed.id
        if aborted:
            log.info("task %s was aborted; stopping its handler", tid)
        else:
            log.warning("lease of task %s lost; stopping its handler", tid)
        run.lost = True
        lane = run.lane
        if lane.by_id.get(tid) is run:
            del lane.by_id[tid]
            lane.leases.pop(tid, None)
        if run.task is not None:
            if aborted:
                mark_aborted(run.task)  # (lease_lost is set too)
            else:
                run.task.lease_lost.set()
        if run.at is not None:
            run.at = None  # it stops waiting (its entry in _timed is skipped)
        elif run.handle is not None:
            run.handle.cancel()
        # Free now, even if a sync handler runs on in its thread; and the claim loop looks at
        # once: a lost lease has expired, and a claim reaps it.
        self._free_slot(run, look=True)

    # -- shutdown ---------------------------------------------------------------------------

    def release_unstarted(self) -> None:
        """Hand back tasks claimed ahead of their due time or of a free slot: another worker
        runs them."""
        while self.queued:
            run = self.queued.popleft()
            self._uncount(run)
            if not run.lost:
                self._finish(run, Outcome("release", run.claimed.id, run.claimed.token))
        for run in [r for lane in self.lanes for r in lane.by_id.values()]:
            if run.at is not None:
                run.at = None
                self._free_slot(run)
                self._finish(run, Outcome("release", run.claimed.id, run.claimed.token))
        self._timed.clear()
        self._cancel_timer()

    async def wait_running(self, timeout: float, force: asyncio.Event) -> None:
        """Let running handlers finish, until ``timeout`` or ``force`` (a second signal)."""
        if not self.running:
            return

        async def all_finished() -> None:
            # Every run in ``running`` is in a task: its own, or a shared one that holds it.
            while self.running and (tasks := self._tasks()):
                await asyncio.wait(tasks)

        waits = [asyncio.create_task(all_finished()), asyncio.create_task(force.wait())]
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()

    def _tasks(self) -> set[asyncio.Task[None]]:
        """The tasks running handlers, and those about to start some."""
        return {r.handle for r in self.running if r.handle} | self.batches.tasks

    async def cancel_running(self) -> None:
        """Cancel what still runs; each hands its task back (see ``_execute`` and
        ``_abandon``)."""
        tasks = self._tasks()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
