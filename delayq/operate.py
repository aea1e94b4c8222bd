"""Operator actions shared by the CLI and the dashboard: run a task now, replay or purge dead
tasks in bounded batches with progress. Each batch is one script call of the queue API."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .core import REPLY_BATCH, validate_task_id
from .queue import Queue
from .runner import SyncRunner
from .timing import Duration, seconds

Progress = Callable[[int], None]  # called with how many tasks the last batch handled


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


def _batches(ids: Sequence[str]) -> list[list[str]]:
    return [list(ids[i : i + REPLY_BATCH]) for i in range(0, len(ids), REPLY_BATCH)]


def replay_dead(
    queue: Queue, ids: Sequence[str] | None = None, progress: Progress | None = None
) -> int:
    """Replay these dead tasks, or all of them (oldest first); returns how many."""
    runner = SyncRunner(queue.client)
    total = 0
    if ids is not None:
        for core, in_shard in queue.shards.group(ids, validate_task_id):
            for batch in _batches(in_shard):
                total += runner.run(core.replay(batch))
                if progress:
                    progress(len(batch))
        return total
    for core in queue.shards.cores:
        while n := runner.run(core.replay(None)):
            total += n
            if progress:
                progress(n)
    return total


def purge_dead(
    queue: Queue,
    ids: Sequence[str] | None = None,
    *,
    older_than: Duration | None = None,
    progress: Progress | None = None,
) -> int:
    """Delete these dead tasks, or all (that died ``older_than`` ago); returns how many."""
    runner = SyncRunner(queue.client)
    total = 0
    if ids is not None:
        for core, in_shard in queue.shards.group(ids, validate_task_id):
            for batch in _batches(in_shard):
                total += runner.run(core.purge_dead(batch))
                if progress:
                    progress(len(batch))
        return total
    before = None
    if older_than is not None:
        now_ms = queue.stats().now.timestamp() * 1000
        before = int(now_ms - seconds(older_than, "older_than") * 1000)
    for core in queue.shards.cores:
        while n := runner.run(core.purge_dead(None, before_ms=before)):
            total += n
            if progress:
                progress(n)
    return total
