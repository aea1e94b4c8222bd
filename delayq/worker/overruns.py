"""Handler threads that outlive their attempt.

A sync handler runs in a thread, and a thread cannot be stopped: past its timeout its
attempt ends (the retry is written, ``task.lease_lost`` set), and when its lease is lost,
it is aborted or the worker stops, the call is abandoned; either way the thread runs on.
Such a run is *overrun* (lifecycle.OVERRUN): it keeps its slot and its place in its kind's
count until the thread has really returned, so a kind's cap and the worker's concurrency
hold however long it takes. Each is logged (a warning when it begins, a line when it ends),
reported to the listeners (``overrunning``, ``overrun_ended``: the metric
``delayq_sync_handlers_overrunning``), and :meth:`Overruns.stuck_for` says how long the
oldest has run on (``delayq worker --recycle-stuck``).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from delayq.worker.lifecycle import STOPPING, Run

log = logging.getLogger("delayq.worker")

# A thread whose call was cancelled (its lease lost, an abort, shutdown) is reported as
# overrunning only if it has not returned this long after: a cooperative handler that stops
# when told (task.lease_lost, task.aborted) is not news. One past its timeout is at once.
TOLD_S = 1.0


class Overruns:
    def __init__(self) -> None:
        self.runs: set[Run] = set()  # with a thread that outlived its call, not yet returned
        # Those told to stop, not yet reported: the timer that reports them (TOLD_S).
        self._told: dict[Run, asyncio.TimerHandle] = {}

    def __len__(self) -> int:
        return len(self.runs)

    def stuck_for(self) -> float:
        """How long (s) the oldest thread that outlived its attempt has run on since; 0 when
        none does. A handler told to stop (a lost lease, an abort) counts once its TOLD_S to
        stop has passed and it was reported: before that it may still stop as told."""
        stuck = [r.overrun_at for r in self.runs if r not in self._told]
        return time.monotonic() - min(stuck) if stuck else 0.0

    def oldest(self) -> Run | None:
        return min(self.runs, key=lambda r: r.overrun_at, default=None)

    def outlived(
        self,
        run: Run,
        fut: asyncio.Future[Any],
        timeout: float | None,
        returned: Callable[[Run], None],
    ) -> None:
        """A thread of ``run``'s handler runs on past its call: past ``timeout`` (its
        outcome is written as usual), or (None) the call was cancelled (its lease lost, an
        abort, shutdown). ``returned(run)`` once the last such thread of it has returned
        (``fut`` done)."""
        run.threads += 1
        fut.add_done_callback(functools.partial(self._thread_returned, run, returned))
        if run.threads > 1:
            return
        run.overrun_at = time.monotonic()
        self.runs.add(run)
        if timeout is not None:
            self._report(run, f"runs on past its timeout of {timeout:g} s")
            return
        if run.task is not None and run.task.aborted:
            why = "was aborted"
        elif run.state == STOPPING:
            why = "lost its lease"
        else:
            why = "was handed back (the worker stops)"
        why = f"{why} but runs on {TOLD_S:g} s after it was told to stop"
        loop = asyncio.get_running_loop()
        self._told[run] = loop.call_later(TOLD_S, self._report_told, run, why)

    def _report_told(self, run: Run, why: str) -> None:
        del self._told[run]
        self._report(run, why)

    def _report(self, run: Run, why: str) -> None:
        log.warning(
            "task %s (%s) %s in its thread (a thread cannot be stopped): it keeps its slot "
            "and its place in its kind's count until it returns",
            run.claimed.id,
            run.claimed.header.kind,
            why,
        )
        run.lane.executor.emit("overrunning", run.claimed)

    def _thread_returned(
        self, run: Run, returned: Callable[[Run], None], fut: asyncio.Future[Any]
    ) -> None:
        if not fut.cancelled():
            fut.exception()  # (retrieved: what a thread past its attempt raised is moot)
        run.threads -= 1
        if run.threads:
            return
        self.runs.discard(run)
        told = self._told.pop(run, None)
        if told is not None:  # it stopped when told: never reported
            told.cancel()
            returned(run)
            return
        took = time.monotonic() - run.overrun_at
        log.info(
            "task %s (%s): its handler's thread returned, %.1f s after its attempt ended; "
            "its slot is free",
            run.claimed.id,
            run.claimed.header.kind,
            took,
        )
        run.lane.executor.emit("overrun_ended", run.claimed, duration=took)
        returned(run)
