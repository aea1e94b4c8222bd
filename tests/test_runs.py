"""The worker's bookkeeping of the runs it holds (worker/runs.py)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from delayq import Queue, Task, Worker
from delayq.codec import Header
from delayq.errors import Defer
from delayq.leasing import Claimed
from delayq.worker.runs import Run, Runs

from .helpers import wait_for


def claimed(tid: str, token: int) -> Claimed:
    return Claimed(tid, Header("k", 1, 0, token, 0, 0, "json"), b"null")


def test_a_lost_lease_is_matched_by_token_not_by_task_id() -> None:
    """The heartbeat reports (id, token): a report about an older claim of a task must not
    stop the newer run of the same task."""
    freed: list[int] = []
    runs = Runs(None, None, lambda ms: 0.0, lambda: freed.append(1))  # type: ignore[arg-type]
    run = Run(claimed("A", 2))
    runs.by_id["A"], runs.leases["A"], runs.busy = run, 2, 1
    runs.leases_lost([("A", 1)])
    assert not run.lost and runs.busy == 1 and runs.leases == {"A": 2}
    runs.leases_lost([("A", 2)])
    assert run.lost and runs.busy == 0 and runs.leases == {} and freed == [1]
    runs.leases_lost([("A", 2)])  # reported twice: the slot is freed once
    assert runs.busy == 0 and freed == [1]


def test_deferring_tasks_never_overdraw_the_worker(queue: Queue, run_worker: Any) -> None:
    """Tasks handed back to run again soon (Defer, as a re-armed watched key is) are often
    claimed again before the hand-back is confirmed: the worker's slot count must hold."""
    worker = Worker(queue, concurrency=4)
    runs_seen: dict[str, int] = {}
    lowest: list[int] = [0]
    lock = threading.Lock()

    @worker.handler("k")
    async def k(task: Task) -> None:
        with lock:
            runs_seen[task.id] = runs_seen.get(task.id, 0) + 1
            lowest[0] = min(lowest[0], worker.runs.busy)
        if runs_seen[task.id] <= 3:
            raise Defer(1)
        await asyncio.sleep(0)

    with run_worker(worker):
        for i in range(150):
            queue.schedule("k", i, task_id=f"d{i}")
        wait_for(lambda: queue.stats().done == 150, timeout=30)
        wait_for(lambda: worker.runs.busy == 0, timeout=5)
    assert lowest[0] >= 0
    assert set(runs_seen.values()) == {4}  # three defers and one run each, no extra runs
    assert queue.stats().counters.get("leases_expired", 0) == 0
