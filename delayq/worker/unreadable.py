"""Claimed rows that cannot become tasks (:class:`delayq.leasing.Unreadable`): records
another program wrote whose id, kind or payload format is not UTF-8.

The claim parse finds them (a failed decode, which costs nothing until it happens) and
leaves them out of the claim's tasks: they never become runs, whose ids are text from end to
end (the heartbeat, the Finisher, hand-backs, logs). Each is buried at once, by its raw id,
on the shard it was claimed from, with a reason naming the field; a write that fails leaves
the lease to end, and the next claim of the task buries it then.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from delayq import leasing
from delayq.core import QueueCore
from delayq.errors import DelayqError
from delayq.leasing import Unreadable
from delayq.runner import AsyncRunner
from delayq.worker.execute import Executor

log = logging.getLogger("delayq.worker")


async def bury(
    runner: AsyncRunner, core: QueueCore, executor: Executor, rows: Sequence[Unreadable]
) -> None:
    """Bury ``rows``, claimed from ``core``'s shard, and tell of each as ``executor`` tells
    of the tasks it buries (log, event, on_dead hooks)."""
    op = leasing.bury(core, [(row.id, row.token, row.reason) for row in rows])
    try:
        refused = await runner.run(op)
    except DelayqError as e:
        log.warning(
            "could not bury %d claimed task(s) that cannot be read (%s); they come back "
            "when their lease ends, and are buried then",
            len(rows),
            e,
        )
        return
    for row in rows:
        if row.claimed.id not in refused:  # (refused: its lease is gone, so not ours to tell)
            executor.buried_unread(row.claimed, row.reason)
