"""Benchmark child processes never outlive their runner: they stop when their stdin closes
(the runner went away) or when their time limit passes, whichever comes first."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import Any


def stop_when_orphaned(request_stop: Callable[[], None], max_seconds: float) -> None:
    def watch_stdin() -> None:
        # Raw reads on fd 0 (not sys.stdin's buffered reader, whose lock a daemon thread
        # would still hold at interpreter shutdown).
        with contextlib.suppress(OSError):
            while os.read(0, 4096):
                pass
        request_stop()

    threading.Thread(target=watch_stdin, daemon=True).start()
    limit = threading.Timer(max_seconds, request_stop)
    limit.daemon = True
    limit.start()


def stop_worker_when_orphaned(worker: Any, max_seconds: float, grace: float = 60) -> None:
    """For a child serving a delayq Worker: stop it gracefully when orphaned (or out of
    time), and exit hard if stopping takes longer than ``grace`` seconds."""

    def hard_exit() -> None:
        os._exit(3)  # stop did not finish in time: never linger

    def request_stop() -> None:
        worker.stop()
        t = threading.Timer(grace, hard_exit)
        t.daemon = True
        t.start()

    stop_when_orphaned(request_stop, max_seconds)
