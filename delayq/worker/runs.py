"""The tasks this worker holds, from claim to written result.

A :class:`Run` is one claim of one task. It waits on a local timer until its due time,
runs its handler, and hands the outcome to the Finisher; it is forgotten once that write
is confirmed, or at once if its lease is lost. Runs are tracked as objects, not by task id
alone: a worker can re-claim a task whose earlier run here lost its lease (stalled past it),
and the two runs must not be confused.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ..leasing import Claimed
from ..task import Task
from .execute import Executor
from .outcome import Finisher, Outcome

log = logging.getLogger("delayq.worker")

INTERNAL_RETRY_MS = 30_000


class Run:
    __slots__ = ("claimed", "finishing", "handle", "lost", "slot", "task", "timer")

    def __init__(self, claimed: Claimed) -> None:
        self.claimed = claimed
        self.slot = True  # holds one of the worker's concurrency slots
        self.timer: asyncio.TimerHandle | None = None
        self.handle: asyncio.Task[None] | None = None
        self.task: Task | None = None
        self.lost = False
        self.finishing = False  # outcome handed to the Finisher, not yet written


class Runs:
    def __init__(
        self,
        executor: Executor,
        finisher: Finisher,
        to_loop: Callable[[float], float],
        on_slot_free: Callable[[], None],
    ) -> None:
        self.executor = executor
        self.finisher = finisher
        self.to_loop = to_loop
        self.on_slot_free = on_slot_free
        self.by_id: dict[str, Run] = {}  # the current run of each task held
        self.leases: dict[str, int] = {}  # id -> token: what the heartbeat extends
        self.running: set[Run] = set()  # handlers executing, superseded ones included
        self.busy = 0  # slots taken: claimed and not finished
        self.started = 0

    def start(self, claimed: Claimed) -> None:
        earlier = self.by_id.get(claimed.id)
        if earlier is not None:
            if earlier.finishing:
                # Its result (say, a release to a new due time) is written but not yet
                # confirmed here; the server moved on, and so do we.
                del self.by_id[claimed.id]
            else:
                self._lose(earlier)  # we re-claimed it: that run's lease is gone
        run = Run(claimed)
        self.by_id[claimed.id] = run
        self.leases[claimed.id] = claimed.token
        self.busy += 1
        loop = asyncio.get_running_loop()
        due = claimed.header.due_ms
        at = self.to_loop(due) if due is not None else loop.time()
        if at - loop.time() > 0.0002:
            run.timer = loop.call_at(at, self._launch, run)
        else:
            self._launch(run)

    def _launch(self, run: Run) -> None:
        run.timer = None
        self.running.add(run)
        run.handle = asyncio.create_task(self._execute(run))

    def _started(self, run: Run, task: Task) -> None:
        run.task = task
        self.started += 1

    async def _execute(self, run: Run) -> None:
        claimed = run.claimed
        try:
            outcome = await self.executor.run(claimed, lambda task: self._started(run, task))
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
            self.running.discard(run)
            self._free_slot(run)

    def _free_slot(self, run: Run) -> None:
        """Give back the run's concurrency slot, exactly once."""
        if run.slot:
            run.slot = False
            self.busy -= 1
            self.on_slot_free()

    def _finish(self, run: Run, outcome: Outcome) -> None:
        run.finishing = True
        self.finisher.add(outcome)

    def written(self, outcomes: list[Outcome], refused: set[str]) -> None:
        """The Finisher's callback: these results are stored (or refused)."""
        for o in outcomes:
            run = self.by_id.get(o.id)
            if run is not None and run.claimed.token == o.token:
                del self.by_id[o.id]
                del self.leases[o.id]
            if o.id in refused:
                log.warning(
                    "result %r of task %s was refused: the lease was lost (expired or taken "
                    "over), so the task runs again or already has",
                    o.action,
                    o.id,
                )

    def leases_lost(self, lost: list[tuple[str, int]]) -> None:
        """The heartbeat's callback: these leases (id, token) are no longer ours. Matched by
        token: a newer claim of the same task is a different, valid lease."""
        for tid, token in lost:
            run = self.by_id.get(tid)
            if run is not None and run.claimed.token == token and not run.finishing:
                self._lose(run)

    def _lose(self, run: Run) -> None:
        tid = run.claimed.id
        log.warning("lease of task %s lost; stopping its handler", tid)
        run.lost = True
        if self.by_id.get(tid) is run:
            del self.by_id[tid]
            del self.leases[tid]
        if run.task is not None:
            run.task.lease_lost.set()
        if run.timer is not None:
            run.timer.cancel()
            run.timer = None
        elif run.handle is not None:
            run.handle.cancel()
        self._free_slot(run)  # free now, even if a sync handler runs on in its thread

    # -- shutdown ---------------------------------------------------------------------------

    def release_unstarted(self) -> None:
        """Hand back tasks claimed ahead of their due time: another worker runs them."""
        for run in list(self.by_id.values()):
            if run.timer is not None:
                run.timer.cancel()
                run.timer = None
                self._free_slot(run)
                self._finish(run, Outcome("release", run.claimed.id, run.claimed.token))

    async def wait_running(self, timeout: float, force: asyncio.Event) -> None:
        """Let running handlers finish, until ``timeout`` or ``force`` (a second signal)."""
        if not self.running:
            return

        async def all_finished() -> None:
            while self.running:
                await asyncio.wait([r.handle for r in self.running if r.handle])

        waits = [asyncio.create_task(all_finished()), asyncio.create_task(force.wait())]
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()

    async def cancel_running(self) -> None:
        """Cancel what still runs; each hands its task back (see ``_execute``)."""
        handles = [r.handle for r in self.running if r.handle]
        for h in handles:
            h.cancel()
        await asyncio.gather(*handles, return_exceptions=True)
