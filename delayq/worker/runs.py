"""The tasks this worker holds, from claim to written result.

A :class:`Run` is one claim of one task. Its life is the table of ``lifecycle.py``: it waits
for its time (when it was claimed ahead of it), then for one of the worker's concurrency
slots (when it was claimed ahead of a free one, see :meth:`Runs.allowance`), runs its
handler, and ends finished (its outcome handed to the Finisher), handed back (released
unrun) or lost (its lease gone, or aborted). :meth:`Runs._move` is the one place a run
changes state, and what each state holds (a slot, a place in its kind's count, its lease
extended) is taken and given back there, from the table, and nowhere else. A run stays its
task's run here until its result is written, or at once if its lease is lost. Runs are
tracked as objects, not by task id alone: a worker can re-claim a task whose earlier run
here lost its lease (stalled past it), and the two runs must not be confused.

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
from typing import Any

from delayq.leasing import Claimed
from delayq.task import mark_aborted
from delayq.worker.aborts import RecentAborts
from delayq.worker.alarm import Alarm
from delayq.worker.batches import Batches
from delayq.worker.lifecycle import (
    ABORTED,
    AHEAD,
    DONE,
    ENDED,
    LAUNCH,
    LOST,
    MOVES,
    OUTLIVED,
    QUEUE,
    QUEUED,
    RELEASE,
    RETURNED,
    RUNNING,
    SHUTDOWN,
    START,
    STOP,
    TELL,
    TIMED,
    WAIT_SLOT,
    WAIT_TIME,
    WAITED,
    Run,
    RunLane,
)
from delayq.worker.outcome import Outcome
from delayq.worker.overruns import Overruns

log = logging.getLogger("delayq.worker")

INTERNAL_RETRY_MS = 30_000
# Claimed ahead of a free slot: at most this many runs, and handed back (not run) when one
# has waited this long for a slot (the handlers turned slow after it was claimed), or a
# sixth of the lease if that is shorter: a run waiting for a slot has its lease no longer
# extended, so what is left of it when it starts must outlast the next heartbeat.
MAX_AHEAD = 1000
MAX_QUEUED_S = 1.0
SERVICE_WEIGHT = 0.05  # the mean handler time is a moving average over ~20 runs
# A kind whose handler waited starts its runs in tasks of their own; every this many, one
# goes through a shared task again, to notice if its handler stopped waiting.
PROBE_EVERY = 16


class Runs:
    def __init__(
        self,
        to_loop: Callable[[float], float],
        on_slot_free: Callable[[], None],
        *,
        concurrency: int | None = None,
        lookahead: float = 0.0,
        lease_s: float | None = None,
    ) -> None:
        self.to_loop = to_loop
        self.on_slot_free = on_slot_free
        self.concurrency = concurrency  # None: a slot for every run
        self.lookahead = lookahead
        # How long a due run may wait for a slot before it is handed back (MAX_QUEUED_S).
        self.queued_s = MAX_QUEUED_S if lease_s is None else min(MAX_QUEUED_S, lease_s / 6)
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
        # Due runs waiting for a slot, in the order they began to: the one that waited
        # longest takes the next slot free; one timer (the earliest's allowance) hands
        # back those that waited too long, whether or not a slot ever frees. A run that
        # stops waiting leaves its entry, skipped when it comes up.
        self.queued: deque[Run] = deque()
        self._hand_back: asyncio.TimerHandle | None = None
        # time.monotonic() as of the moves being made: read once per claim taken in, per
        # timer that goes off, per slot freed, not once per run.
        self.moved_at = 0.0
        self.busy = 0  # slots held (lifecycle.SLOT): running, stopping, overrun
        self.waiting = 0  # claimed, not started (lifecycle.WAITING): timed, queued
        self.started = 0
        self.service_s: float | None = None  # mean time a handler holds its slot
        self.batches: Batches[Run] = Batches(self._begin, self._abandon, self._stepped)
        self._alone: dict[str, int] = {}  # kind -> runs left to start alone before a probe
        self.capped = False  # some lane has a capped kind: runs are counted
        # Whether a freed slot wakes the claim loop (on_slot_free). The claim loop says: its
        # claims were cut short for want of room, or per-kind caps may leave tasks waiting;
        # else a freed slot changes nothing until more tasks fall due.
        self.room_wanted = True
        # Aborts heard for no run here: the claim that took the task may be on its way.
        self.aborts = RecentAborts()
        # The runs whose handler's thread outlived its attempt.
        self.overruns = Overruns()

    def add_lane(self, lane: RunLane) -> None:
        """A queue whose tasks :meth:`start_many` takes in (its caps as they are now)."""
        self.lanes.append(lane)
        self.capped = self.capped or bool(lane.caps)

    @property
    def held(self) -> int:
        """Runs that hold a slot or wait for one: what counts against :meth:`allowance`."""
        return self.busy + self.waiting

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
        and drained slower: docs/benchmarks.md, "Figures behind the worker's constants");
        with only the slots to fill, any free slot is claimed for."""
        if self.concurrency is None:
            return 1
        allowed = self.allowance()
        free = allowed - self.held
        if free <= 0 or free < (allowed - self.concurrency) // 4:
            return 0
        return free

    # -- the table, applied ----------------------------------------------------------------

    def _move(self, run: Run, event: int) -> bool:
        """Move ``run`` by ``event`` as lifecycle.TABLE says; False when it changes nothing.
        What the new state holds and the old one did not is taken, and the other way round
        given back: the slot (to the run waiting longest for one), the lease extension, the
        kind's place, the count of runs waiting to start. Then the move's effect is done.
        (Runs start by the ten thousand a second: lifecycle.MOVES has each move worked out,
        and no call, tuple or hash is spent here that the move does not need.)"""
        found = MOVES[run.state][event]
        if found is None:
            return False
        new, slot, waiting, lease, count, effect = found
        run.state = new
        self.busy += slot
        self.waiting += waiting
        if lease:
            leases, claimed = run.lane.leases, run.claimed
            if lease > 0:
                leases[claimed.id] = claimed
            elif leases.get(claimed.id) is claimed:
                del leases[claimed.id]
        if count and self.capped:
            self._count(run, count > 0)
        if effect == LAUNCH:
            self._launch(run)
        elif effect == WAIT_SLOT:  # (a drain's runs claimed ahead: inline, as LAUNCH)
            run.queued_at = self.moved_at
            self.queued.append(run)
            if self._hand_back is None:
                self._arm_hand_back(self.queued_s)
        elif effect:
            self._effect(run, effect, event)
        if slot < 0 and self.queued:
            self._give_slot()
        if new == DONE and self.room_wanted and self.room() > 0:  # else nothing to do for it
            self.on_slot_free()
        return True

    @staticmethod
    def _count(run: Run, counted: bool) -> None:
        """The run takes (``counted``) or gives back its place in its kind's count."""
        of_kind = run.lane.of_kind.get(run.claimed.header.kind)
        if of_kind is not None:
            if counted:
                of_kind.add(run)
            else:
                of_kind.discard(run)

    def _effect(self, run: Run, effect: int, event: int) -> None:
        claimed = run.claimed
        if effect == WAIT_TIME:
            self._timed_seq += 1
            heapq.heappush(self._timed, (run.at, self._timed_seq, run))
            if run.at < self._timer_at:
                self._set_timer(asyncio.get_running_loop(), run.at)
        elif effect == RELEASE:
            self._hand(run, self._release(claimed))
        elif effect == TELL:
            if run.task is not None:
                mark_aborted(run.task)
        else:  # FORGET, STOP: no longer the task's run here
            by_id = run.lane.by_id
            if by_id.get(claimed.id) is run:
                del by_id[claimed.id]
            if effect == STOP:
                self._stop(run, aborted=event == ABORTED)

    def _stop(self, run: Run, aborted: bool) -> None:
        """Lost while running: an async handler is cancelled, a sync one told (its task's
        ``lease_lost``, and ``aborted``). One whose handler was not yet called ends now."""
        task = run.task
        if task is not None:
            if aborted:
                mark_aborted(task)  # (lease_lost is set too)
            else:
                task.lease_lost.set()
        if run.handle is not None:
            run.handle.cancel()
        if task is None:
            # Nothing of the user's runs: a task cancelled before its first step never runs
            # its coroutine (whose end would say so), and a shared one skips it (_begin).
            run.handle = None
            self.running.discard(run)
            self._move(run, ENDED)

    def _give_slot(self) -> None:
        """A slot is free: to the run that has waited longest for one, unless it waited
        longer than it may (then it is handed back, and the next one is looked at)."""
        queued = self.queued
        self.moved_at = now = time.monotonic()
        while queued:
            nxt = queued.popleft()
            if nxt.state != QUEUED:
                continue
            if now - nxt.queued_at > self.queued_s:
                self._waited_out(nxt)
                continue
            self._move(nxt, START)
            return

    def _arm_hand_back(self, delay: float) -> None:
        self._hand_back = asyncio.get_running_loop().call_later(delay, self._hand_back_waited)

    def _hand_back_waited(self) -> None:
        """The hand-back timer: every run that waited longer than it may for a slot is
        handed back (claimed ahead for handlers that then slowed down, or hang: another
        worker runs it); then the timer is set for the next to run out of time."""
        self._hand_back = None
        queued = self.queued
        self.moved_at = now = time.monotonic()
        while queued:
            head = queued[0]
            if head.state != QUEUED:
                queued.popleft()
                continue
            left = head.queued_at + self.queued_s - now
            if left > 0:
                self._arm_hand_back(left)
                return
            queued.popleft()
            self._waited_out(head)

    def _waited_out(self, run: Run) -> None:
        """``run`` waited for a slot longer than it may: it is handed back. The handlers
        hold their slots at least that long, whatever their mean time said (hung ones never
        finish to say so): nothing more is claimed ahead until a handler is seen to finish
        again (the mean starts afresh from it), or the worker would claim back what it just
        handed back. (Setting the mean to the allowance was not enough: with 50 slots and
        the default lookahead it still left room for one.)"""
        self.service_s = None
        self._move(run, WAITED)

    def _due(self) -> int:
        """The event of a run whose time has come: it starts if a slot is free."""
        return START if self.concurrency is None or self.busy < self.concurrency else QUEUE

    # -- taking claims in ------------------------------------------------------------------

    def start(self, claimed: Claimed, lane: RunLane) -> None:
        self.start_many(lane, [claimed])

    def start_many(
        self,
        lanes: RunLane | Sequence[RunLane],
        batch: list[Claimed],
        server_now_ms: int | None = None,
    ) -> None:
        """Take in a claim's tasks from ``lanes`` (the queue they came from; a list: each
        task's): each starts, or waits for its time or a slot. ``server_now_ms`` (the
        claim's server time) spares working out a timer for tasks already due."""
        each = lanes if isinstance(lanes, list | tuple) else repeat(lanes)
        self.moved_at = time.monotonic()
        aborts = self.aborts
        heard = aborts.heard
        for claimed, lane in zip(batch, each, strict=False):
            by_id = lane.by_id
            tid = claimed.id
            earlier = by_id.get(tid)
            if earlier is not None:
                if earlier.finishing:
                    # Its result (say, a release to a new due time) is written but not yet
                    # confirmed here; the server moved on, and so do we.
                    del by_id[tid]
                else:
                    self._lose(earlier)  # we re-claimed it: that run's lease is gone
            run = Run(claimed, lane, self)
            if heard and aborts.take(lane, tid, claimed.token):
                log.info("task %s was aborted before its claim reached Runs; not running it", tid)
                self._move(run, ABORTED)
                continue
            by_id[tid] = run
            due = claimed.header.due_ms
            if due is None or (server_now_ms is not None and due <= server_now_ms):
                concurrency = self.concurrency  # (self._due(), without the call)
                self._move(run, START if concurrency is None or self.busy < concurrency else QUEUE)
                continue
            loop = asyncio.get_running_loop()
            now = self.now() if self.now is not None else loop.time()
            at = self.to_loop(due)
            if at > now:
                run.at = at + self.timer_margin
                self._move(run, AHEAD)
            else:
                self._move(run, self._due())

    # -- the timer for runs waiting for their time -----------------------------------------

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
        """The timer went off: every run whose time has come (the timer's, or the clock's:
        never before its own) starts or waits for a slot; then the timer is set for the
        next."""
        loop = asyncio.get_running_loop()
        now = self.now() if self.now is not None else loop.time()
        come = max(self._timer_at, now)
        if self.alarm is not None:
            self.alarm.ran(self._timer_at)
        self._timer, self._timer_at = None, math.inf
        self.moved_at = time.monotonic()
        timed = self._timed
        while timed and (timed[0][0] <= come or timed[0][2].state != TIMED):
            run = heapq.heappop(timed)[2]
            if run.state == TIMED:  # (else it stopped waiting)
                self._move(run, self._due())
        if timed:
            self._set_timer(loop, timed[0][0])

    # -- running ---------------------------------------------------------------------------

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
        if run.state != RUNNING:  # lost while it waited to start: it ended then
            self.running.discard(run)
            return None
        run.handle = task
        return self._execute(run)

    def _abandon(self, run: Run) -> None:
        """Launched, never started (shutdown cancelled its shared task): hand it back."""
        self.running.discard(run)
        if run.state == RUNNING:
            self._hand(run, self._release(run.claimed))
            self._move(run, ENDED)

    async def _execute(self, run: Run) -> None:
        claimed = run.claimed
        t0 = time.perf_counter()
        try:
            outcome = await run.lane.executor.run(claimed, run.started, run)
            took = time.perf_counter() - t0
            mean = self.service_s
            self.service_s = took if mean is None else mean + (took - mean) * SERVICE_WEIGHT
        except asyncio.CancelledError:
            if run.state == RUNNING:
                # Shutdown after the grace period: hand it back so it runs again promptly.
                self._hand(run, self._release(claimed))
        except Exception as e:
            # A bug in delayq, not the handler: count the attempt and retry later, so a
            # task that trips it ends in the dead set instead of looping.
            log.exception("internal error running task %s; retrying it later", claimed.id)
            if run.state == RUNNING:
                reason = f"internal error in the worker: {e!r}"
                due = f"+{INTERNAL_RETRY_MS}"
                retry = Outcome("retry", claimed.id, claimed.token, due, reason, claimed.shard)
                self._hand(run, retry)
        else:
            if run.state == RUNNING:  # (lost meanwhile: nothing is written)
                run.finishing = True  # (self._hand, without the call)
                run.lane.finisher.add(outcome)
        finally:
            run.handle = None  # its task may go on with other runs
            self.running.discard(run)
            self._move(run, OUTLIVED if run.threads else ENDED)

    @staticmethod
    def _release(claimed: Claimed) -> Outcome:
        return Outcome("release", claimed.id, claimed.token, "", "", claimed.shard)

    def _hand(self, run: Run, outcome: Outcome) -> None:
        """Hand the run's outcome to its lane's Finisher (the run's state says whether it
        may have one: only a run that holds its lease)."""
        run.finishing = True
        run.lane.finisher.add(outcome)

    def outlived(self, run: Run, fut: asyncio.Future[Any], timeout: float | None) -> None:
        """A thread of the run's handler runs on past its call (see Overruns.outlived)."""
        self.overruns.outlived(run, fut, timeout, self._returned)

    def _returned(self, run: Run) -> None:
        self._move(run, RETURNED)

    # -- what the Finisher, the heartbeat and the waker report -----------------------------

    def written(self, lane: RunLane, outcomes: list[Outcome], refused: set[str]) -> None:
        """The Finisher's callback: these results (of ``lane``) are stored (or refused)."""
        by_id = lane.by_id
        for o in outcomes:
            run = by_id.get(o.id)
            if run is not None and run.claimed.token == o.token:
                del by_id[o.id]
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
        by_id = lane.by_id
        for o in outcomes:
            run = by_id.get(o.id)
            if run is not None and run.claimed.token == o.token:
                del by_id[o.id]

    def leases_lost(self, lane: RunLane, lost: list[tuple[str, int]]) -> None:
        """The heartbeat's callback: these leases (id, token) of ``lane`` are no longer ours.
        Matched by token: a newer claim of the same task is a different, valid lease."""
        by_id = lane.by_id
        for tid, token in lost:
            run = by_id.get(tid)
            if run is not None and run.claimed.token == token:
                self._lose(run)

    def abort(self, lane: RunLane, task_id: str, token: int | None = None) -> bool:
        """The task was aborted (``queue.abort``: the waker heard it, or the heartbeat found
        the lease gone to an abort): stop this worker's run of it, of the claim ``token``
        only when given. Its handler is cancelled, or, in a thread, sees ``task.aborted``;
        nothing is written for it (the abort took its lease). Returns whether a run here
        was stopped (or told). ``lane``: the queue it was aborted on. An abort of a claim
        not (yet) a run here is remembered a while: the claim's reply may be on its way."""
        run = lane.by_id.get(task_id)
        if run is None or (token is not None and run.claimed.token != token):
            if token is not None:
                self.aborts.remember(lane, task_id, token)
            return False
        return self._lose(run, aborted=True)

    def _lose(self, run: Run, aborted: bool = False) -> bool:
        """Its lease is gone (or aborted): as the table says for its state. The claim loop
        looks at once: a lost lease has expired, and a claim reaps it."""
        waited = run.state in (TIMED, QUEUED)
        if not self._move(run, ABORTED if aborted else LOST):
            return False
        tid = run.claimed.id
        what = "not running it" if waited else "stopping its handler"
        if aborted:
            log.info("task %s was aborted; %s", tid, what)
        else:
            log.warning("lease of task %s lost; %s", tid, what)
        if self.room() > 0:
            self.on_slot_free()
        return True

    # -- shutdown ---------------------------------------------------------------------------

    def release_unstarted(self) -> None:
        """Hand back tasks claimed ahead of their due time or of a free slot: another worker
        runs them."""
        for run in [r for lane in self.lanes for r in lane.by_id.values()]:
            self._move(run, SHUTDOWN)
        self.queued.clear()
        if self._hand_back is not None:
            self._hand_back.cancel()
            self._hand_back = None
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


__all__ = ["MAX_AHEAD", "MAX_QUEUED_S", "PROBE_EVERY", "Run", "RunLane", "Runs"]
