"""A worker process started by the supervisor: tells it when it serves, and stops when the
supervisor is gone.

The supervisor passes the write end of a pipe in ``DELAYQ_READY_FD``; the child writes one
byte once serving has begun (its start-up hooks run), so a child that exits before that is
one that failed to start. Children run in a session of their own, so a terminal's Ctrl-C
reaches only the supervisor, which forwards it once: a child whose supervisor died (its
parent changed) stops gracefully by itself rather than run unsupervised.
"""

from __future__ import annotations

import contextlib
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


def supervised() -> bool:
    """Whether this process was started by a ``--processes`` supervisor."""
    return READY_FD_ENV in os.environ


def prepare(worker: Worker) -> None:
    """Hook a supervised worker up: the ready byte, the parent watch, and its metrics."""
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

    def watch() -> None:
        stopped = threading.Event()
        while not stopped.wait(PARENT_CHECK_S):
            if os.getppid() != parent:
                worker.stop()
                return

    threading.Thread(target=watch, name="delayq-parent-watch", daemon=True).start()
