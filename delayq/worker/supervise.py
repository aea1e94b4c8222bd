"""Supervision of the worker's background loops: none of them dies silently.

A loop (claims, result writes, heartbeat, wake-ups, the expiry bell) catches the errors it
expects, a connection dropping, and goes on by itself. Anything else is a bug or a broken
environment: the supervisor logs it with its traceback and starts the loop again after a
backoff. A loop that keeps failing cannot recover, and a worker missing one of its loops
must not go on as if it were whole (a worker whose results are never written would run
every task it claims a second time after it stops): the supervisor then stops the worker,
whose ``serve()`` raises :class:`WorkerFailed`, and the process exits non-zero.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from delayq.errors import WorkerFailed

__all__ = ["Supervisor", "WorkerFailed"]

log = logging.getLogger("delayq.worker")

Loop = Callable[[], Coroutine[Any, Any, None]]

FIRST_DELAY_S = 0.1
MAX_DELAY_S = 5.0
# This many failures in a row (about 16 s of backoff) and the loop is taken as unable to
# recover; a loop that ran this long without failing starts counting again.
MAX_FAILURES = 8
HEALTHY_AFTER_S = 60.0


class Supervisor:
    """Starts loops as tasks and restarts one that raises.

    Args:
        on_fatal: called once, with the loop's name and error, when a loop has failed
            ``max_failures`` times in a row; the worker stops.
    """

    def __init__(
        self,
        on_fatal: Callable[[WorkerFailed], None],
        *,
        max_failures: int = MAX_FAILURES,
        first_delay: float = FIRST_DELAY_S,
        max_delay: float = MAX_DELAY_S,
        healthy_after: float = HEALTHY_AFTER_S,
    ) -> None:
        self.on_fatal = on_fatal
        self.max_failures = max_failures
        self.first_delay = first_delay
        self.max_delay = max_delay
        self.healthy_after = healthy_after
        self.failed: WorkerFailed | None = None
        self.restarts = 0  # every restart of every loop, for tests and metrics

    def start(self, name: str, loop: Loop) -> asyncio.Task[None]:
        """Run ``loop()`` in a task of its own, under supervision."""
        return asyncio.create_task(self.run(name, loop), name=f"delayq-{name}")

    async def run(self, name: str, loop: Loop) -> None:
        """Run ``loop()`` until it returns, restarting it when it raises; returns early when
        it is taken as unable to recover (after calling ``on_fatal``)."""
        clock = asyncio.get_running_loop()
        failures, delay = 0, self.first_delay
        while True:
            began = clock.time()
            try:
                await loop()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if clock.time() - began >= self.healthy_after:
                    failures, delay = 0, self.first_delay
                failures += 1
                if failures >= self.max_failures:
                    log.critical(
                        "worker loop %r failed %d times in a row; stopping the worker",
                        name,
                        failures,
                        exc_info=e,
                    )
                    self._fatal(name, failures, e)
                    return
                log.error("worker loop %r failed; restarting it in %.1f s", name, delay, exc_info=e)
                self.restarts += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_delay)

    def _fatal(self, name: str, failures: int, e: Exception) -> None:
        if self.failed is not None:
            return
        self.failed = WorkerFailed(
            f"worker loop {name!r} failed {failures} times in a row, last with "
            f"{type(e).__name__}: {e}; the worker stopped (the log has the tracebacks)"
        )
        self.failed.__cause__ = e
        self.on_fatal(self.failed)
