"""A worker process started by the supervisor: tells it when it serves, and stops when the
supervisor is gone.

The supervisor passes the write end of a pipe in ``DELAYQ_READY_FD``; the child writes one
byte once serving has begun (its start-up hooks run), so a child that exits before that is
one that failed to start. Children run in a session of their own, so a terminal's Ctrl-C
reaches only the supervisor, which forwards it once: a child whose supervisor died (its
parent changed) stops gracefully by itself rather than run unsupervised.

With ``--recycle-stuck SECONDS`` a worker process watches the threads of its sync handlers
that outlive their attempt (``worker/overruns.py``: past their timeout, their lease lost, or
aborted; Python cannot stop a thread). When one has run on that long, the process stops
gracefully (its other running handlers finish within the grace, what it claimed and has not
started is handed back) and exits with :data:`RECYCLE_EXIT`; its supervisor starts a new
one at once, as Celery replaces a child whose task outlived its hard time limit.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from delayq.worker import Worker

READY_FD_ENV = "DELAYQ_READY_FD"
# Set by the supervisor when it serves the children's metrics: record them in the
# multiprocess directory (PROMETHEUS_MULTIPROC_DIR) for it to read.
METRICS_ENV = "DELAYQ_CHILD_METRICS"
PARENT_CHECK_S = 1.0
# A worker process recycled for a stuck sync handler exits with this (sysexits' EX_TEMPFAIL):
# its supervisor starts another at once, without the backoff of a process that died.
RECYCLE_EXIT = 75

log = logging.getLogger("delayq.processes")


def supervised() -> bool:
    """Whether this process was started by a ``--processes`` supervisor."""
    return READY_FD_ENV in os.environ


class Recycle:
    """Stops ``worker`` once a thread of its sync handlers has run ``after_s`` past its
    attempt (:meth:`watch`, a loop of the serving worker); :attr:`recycled` says it did."""

    def __init__(self, worker: Worker, after_s: float) -> None:
        self.worker = worker
        self.after_s = after_s
        self.recycled = False

    async def start(self, worker: Worker) -> None:
        """An on_startup hook: the watch runs beside the worker's loops, supervised."""
        engine = worker.engine
        assert engine is not None
        engine.ctx.supervise("recycle watch", self.watch)

    async def watch(self) -> None:
        import asyncio

        engine = self.worker.engine
        assert engine is not None
        overruns = engine.runs.overruns
        every = min(1.0, self.after_s / 4)
        while not self.check(overruns.stuck_for(), overruns.oldest()):
            await asyncio.sleep(every)

    def check(self, stuck_s: float, oldest: object) -> bool:
        """Whether the worker is stopped for a thread stuck ``stuck_s`` past its attempt."""
        if stuck_s < self.after_s:
            return False
        log.error(
            "a sync handler's thread has run %.1f s past its attempt (%r), over "
            "--recycle-stuck %g s: recycling this worker process (it stops gracefully and "
            "its supervisor starts another)",
            stuck_s,
            oldest,
            self.after_s,
        )
        self.recycled = True
        self.worker.stop()
        return True


def prepare(worker: Worker, recycle_stuck_s: float | None = None) -> Recycle | None:
    """Hook a supervised worker up: the ready byte, the parent watch, its metrics, and with
    ``recycle_stuck_s`` the watch of stuck handler threads (returned)."""
    fd = int(os.environ.pop(READY_FD_ENV))
    parent = os.getppid()

    async def ready(_: Worker) -> None:
        with contextlib.suppress(OSError):
            os.write(fd, b"r")
            os.close(fd)

    worker.on_startup(ready)
    if os.environ.get(METRICS_ENV) == "1":
        from delayq.processes.metrics import record

        record(worker)
    from delayq.processes.health import HEALTH_ENV, PulseFile

    if HEALTH_ENV in os.environ:  # the supervisor answers /livez and /readyz from these
        worker.health.sink = PulseFile(os.environ[HEALTH_ENV])

    def watch() -> None:
        stopped = threading.Event()
        while not stopped.wait(PARENT_CHECK_S):
            if os.getppid() != parent:
                worker.stop()
                return

    threading.Thread(target=watch, name="delayq-parent-watch", daemon=True).start()
    if recycle_stuck_s is None:
        return None
    recycle = Recycle(worker, recycle_stuck_s)
    worker.on_startup(recycle.start)
    return recycle
