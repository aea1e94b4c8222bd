"""Operator actions shared by the CLI and the dashboard: run a task now, cancel or abort one,
replay or purge dead tasks in bounded batches with progress, change a queue's shard count.
Each batch is one script call of the queue API."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from delayq.admin.inspect import Admin
from delayq.admin.reshard import BATCH, ReshardResult, reshard_plan
from delayq.base import Progress
from delayq.queue import Queue
from delayq.timing import Duration


@dataclass(frozen=True)
class ActionResult:
    ok: bool
    message: str


def run_now(queue: Queue, task_id: str) -> ActionResult:
    """A waiting task becomes due now; a dead one is replayed (fresh attempts, due now)."""
    info = queue.get(task_id)
    if info is None:
        return ActionResult(False, f"no task {task_id!r} in queue {queue.name!r}")
    if info.state == "scheduled" and queue.reschedule(task_id, delay=0):
        return ActionResult(True, f"task {task_id!r} is due now")
    if info.state == "dead" and queue.replay([task_id]):
        return ActionResult(True, f"dead task {task_id!r} replayed: due now")
    info = queue.get(task_id) or info
    return ActionResult(False, f"task {task_id!r} is {info.state}: nothing to run now")


def cancel(queue: Queue, task_id: str) -> ActionResult:
    if queue.cancel(task_id):
        return ActionResult(True, f"task {task_id!r} cancelled")
    info = queue.get(task_id)
    if info is None:
        return ActionResult(False, f"no task {task_id!r} in queue {queue.name!r}")
    return ActionResult(
        False, f"task {task_id!r} is {info.state}: only a waiting task can be cancelled"
    )


def abort(queue: Queue, task_id: str) -> ActionResult:
    """End a waiting or running task for good (``Queue.abort``)."""
    before = queue.get(task_id)
    if queue.abort(task_id):
        if before is not None and before.state == "active":
            return ActionResult(True, f"task {task_id!r} aborted; its running handler is stopped")
        return ActionResult(True, f"task {task_id!r} aborted; it will not run")
    info = queue.get(task_id)
    if info is None:
        return ActionResult(False, f"no task {task_id!r} in queue {queue.name!r}")
    return ActionResult(
        False, f"task {task_id!r} is {info.state}: only a waiting or running task can be aborted"
    )


def replay_dead(
    queue: Queue, ids: Sequence[str] | None = None, progress: Progress | None = None
) -> int:
    """Replay these dead tasks, or all of them (oldest first); returns how many."""
    return queue.replay(ids, progress=progress)


def purge_dead(
    queue: Queue,
    ids: Sequence[str] | None = None,
    *,
    older_than: Duration | None = None,
    progress: Progress | None = None,
) -> int:
    """Delete these dead tasks, or all (that died ``older_than`` ago); returns how many."""
    return queue.purge_dead(ids, older_than=older_than, progress=progress)


def reshard(admin: Admin, name: str, shards: int, *, batch: int = BATCH) -> ReshardResult:
    """Change queue ``name``'s shard count to ``shards``, carrying over what it remembers:
    finished tasks kept for the dedupe window go to their new shards, and cron schedules and
    watched keys (with their waiting tasks) to the new home shard. Refused, with what is in
    the way, while tasks wait (other than those), run or are dead, or a worker is alive.
    A move cut short is finished by calling this again with the same count (see reshard.py).
    """
    try:
        return admin.runner.drive(reshard_plan(name, shards, prefix=admin.prefix, batch=batch))
    finally:
        admin.forget(name)  # its cached Queue knew the old count
