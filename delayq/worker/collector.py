"""Keeping the garbage collector's full passes off the worker's timers.

A full collection (generation 2) walks every object the process holds: the modules, the
client, the app. Python runs one now and then as objects survive, and it holds the event
loop the whole time, for milliseconds in a worker process (docs/benchmarks.md, "A wait on
the CPU, and a frozen heap"), so the tasks due meanwhile started that late. Once a worker is
serving, almost all of those objects live as long as the process. :func:`freeze_once`
collects what is garbage, then moves every object left into the collector's permanent
generation (``gc.freeze()``), so later passes walk only what was made since. It runs once
per process: an object frozen and later dropped is never freed, so freezing again at every
``serve()`` (a test suite starting many workers) would keep more.
``Worker(freeze_gc=False)`` leaves the collector alone.
"""

from __future__ import annotations

import gc
import logging
import time

log = logging.getLogger("delayq.worker")

_frozen = False


def freeze_once() -> bool:
    """Collect, then freeze what is left (first call in the process only); returns whether
    this call froze."""
    global _frozen
    if _frozen:
        return False
    _frozen = True
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    log.debug(
        "froze %d objects for the garbage collector in %.1f ms",
        gc.get_freeze_count(),
        (time.perf_counter() - started) * 1000,
    )
    return True
