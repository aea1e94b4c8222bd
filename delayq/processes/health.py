"""The health of a ``--processes`` supervisor's worker processes, for its ``/livez`` and
``/readyz`` (the supervisor answers for all of them on its one ``--metrics-port``).

Each worker process's event loop leaves a pulse every second (``worker/health.py``); a
child writes it to a file of its own, ``health-<pid>.json`` in the supervisor's metrics
directory (:data:`HEALTH_ENV`), replaced whole (``os.replace``) so a reader never sees half
of one. The supervisor's probe thread reads the files of the children running now and
judges each pulse's age as a single worker's thread does: a child whose loop hangs stops
writing, and its pulse goes stale. Files, rather than a pipe or shared memory: nothing has
to read them between probes (a pipe needs a reader thread, or its writer blocks when it is
full), a child restarted is a new pid and so a new file, a child that dies leaves nothing
to clean up but its file (removed when it is reaped), and the directory exists already for
the children's metrics.

Live: every child running is (a child restarting is the supervisor's to restart, not a
reason to restart the whole pod). Ready: every slot has a child running that is ready.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

from delayq.worker.health import Pulse, judge

HEALTH_ENV = "DELAYQ_HEALTH_DIR"


def path_of(directory: str, pid: int) -> Path:
    return Path(directory) / f"health-{pid}.json"


class PulseFile:
    """A worker process's sink for its pulses (``Health.sink``): each one written to its
    file, whole."""

    def __init__(self, directory: str) -> None:
        self.path = path_of(directory, os.getpid())
        self.tmp = self.path.with_suffix(".tmp")

    def __call__(self, pulse: Pulse) -> None:
        with contextlib.suppress(OSError):  # (the supervisor removed the directory: ending)
            self.tmp.write_text(json.dumps(list(pulse)), encoding="utf-8")
            os.replace(self.tmp, self.path)


def read(directory: str, pid: int) -> Pulse | None:
    """The last pulse of the worker process ``pid`` (None: none written yet)."""
    try:
        beat, live, ready = json.loads(path_of(directory, pid).read_text(encoding="utf-8"))
        return Pulse(float(beat), str(live), str(ready))
    except (OSError, ValueError, TypeError):
        return None


def forget(directory: str, pid: int) -> None:
    """A worker process exited: its pulse goes."""
    with contextlib.suppress(OSError):
        path_of(directory, pid).unlink()


class ChildrenHealth:
    """The supervisor's verdict on its children. ``children`` gives (slot index, pid of the
    child running in it or None) for every slot; ``stopping`` whether the supervisor
    stops. Both are set once the supervisor exists (until then: "starting")."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.children: Callable[[], list[tuple[int, int | None]]] | None = None
        self.stopping: Callable[[], bool] = lambda: False

    def verdict(self) -> tuple[str, str]:
        """(why not live, why not ready): "" for each that is."""
        if self.children is None:
            return "", "starting"
        if self.stopping():
            return "", "stopping"
        now = time.monotonic()
        dead: list[str] = []
        unready: list[str] = []
        for index, pid in self.children():
            who = f"worker process {index}"
            if pid is None:
                unready.append(f"{who}: restarting")
                continue
            who += f" (pid {pid})"
            pulse = read(self.directory, pid)
            if pulse is None:
                unready.append(f"{who}: starting")
                continue
            live, ready = judge(pulse, now)
            if live:
                dead.append(f"{who}: {live}")
            elif ready:
                unready.append(f"{who}: {ready}")
        return "; ".join(dead), "; ".join(dead + unready)
