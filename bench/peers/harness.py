"""What every peer adapter shares: the task items, the handler's recorder, the registry.

An adapter module (``<name>_peer.py``) defines:

- ``NAME``, ``DISTS`` (the PyPI distributions whose versions are reported), ``MODULES``
  (what must import), ``SETTINGS`` (the settings used, as text), ``POLL`` (how its worker
  learns a delayed task is due), ``PRODUCE`` (which call schedules a task);
- ``class Producer(url)`` with ``send(items)`` and ``close()``: schedules tasks;
- ``serve(url)``: runs one worker in this process until SIGTERM (or SIGINT), with a
  no-op handler whose first line is ``record(task_id, due)``.

The modules are imported by ``producer_main.py`` and ``worker_main.py``, each in its own
process, so the peers' global state (Celery apps, Dramatiq brokers) never meets.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass
from importlib import import_module
from types import ModuleType

PEERS = ("delayq", "arq", "rq", "dramatiq", "celery", "huey", "saq", "bullmq", "floor")
QUEUE = "bench"  # the queue name every peer uses (each runs on its own fresh server)


@dataclass(frozen=True, slots=True)
class Item:
    """One task to schedule: our id, and either an absolute due time or a delay."""

    id: str
    due_at: float | None = None  # Unix time
    delay_s: float | None = None  # seconds from the moment it is sent

    def timing(self, min_delay: float = 0.001) -> tuple[float, float]:
        """``(due, delay)`` from one clock reading, as the item is sent.

        The delay is at least ``min_delay``, so a delay-based API never takes the
        "run now" path (a producer slower than the lead it was given shows as lateness).
        """
        now = time.time()
        if self.due_at is not None:
            return self.due_at, max(self.due_at - now, min_delay)
        d = self.delay_s or 0.0
        return now + d, max(d, min_delay)


def load(name: str) -> ModuleType:
    if name not in PEERS:
        raise ValueError(f"unknown peer {name!r}")
    return import_module(f"{name}_peer")


# -- the handler's side: every start is one line appended to a file -----------------------

_fd: int | None = None


def open_record(path: str) -> None:
    """Open the record file (O_APPEND: lines from threads and forked children never mix)."""
    global _fd
    _fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def record(task_id: str, due: float) -> None:
    """The first line of every peer's handler: ``<id> <due> <start>``, one write(2)."""
    now = time.time()
    if _fd is not None:
        os.write(_fd, f"{task_id} {due!r} {now!r}\n".encode())


# -- stopping -----------------------------------------------------------------------------


def wait_for_signal() -> int:
    """Block the main thread until SIGTERM or SIGINT; returns the signal number."""
    got = threading.Event()
    which = [0]

    def on_signal(signum: int, frame: object) -> None:
        which[0] = signum
        got.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    while not got.wait(0.5):
        pass
    return which[0]
