"""Stopping background tasks even when a cancellation is lost on the way.

``task.cancel()`` asks once. A library awaited inside the task may swallow that one
request: redis-py's connection set-up, cancelled at the wrong instant under Python 3.11,
was seen to do so about once in 25 starts of a loaded machine, and the pub/sub loop then
ran on, so ``gather()`` on it waited for ever and the worker never stopped. Here a task
still running after a while is asked again, until every one has finished.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("delayq")

AGAIN_AFTER_S = 1.0  # how long a cancelled task has to finish before it is asked again
WARN_AFTER = 3  # asked this many times: say which task keeps running


async def cancel_and_wait(
    tasks: Iterable[asyncio.Future[Any]], again_after: float = AGAIN_AFTER_S
) -> None:
    """Cancel ``tasks`` and wait until all have finished, cancelling again those still
    running every ``again_after`` seconds. Their results and errors are not raised."""
    tasks = list(tasks)
    pending = {t for t in tasks if not t.done()}
    asked = 0
    while pending:
        for t in pending:
            t.cancel()
        asked += 1
        if asked == WARN_AFTER:
            log.warning(
                "still running after %d cancellations: %s",
                asked,
                ", ".join(sorted(repr(t) for t in pending)),
            )
        _, pending = await asyncio.wait(pending, timeout=again_after)
    for t in tasks:
        if not t.cancelled():
            t.exception()  # retrieved, as gather(return_exceptions=True) would
