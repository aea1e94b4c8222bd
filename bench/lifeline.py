"""Benchmark child processes never outlive their runner: they stop when their stdin closes
(the runner went away) or when their time limit passes, whichever comes first."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable


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
