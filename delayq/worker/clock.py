"""Mapping the Redis server's clock onto the event loop's monotonic clock.

Due times are server milliseconds; timers run on ``loop.time()``. Each claim reply carries
the server's ``TIME``, read at some moment between sending the claim and receiving the
reply. So ``server_ms - received`` is a lower bound of the offset between the two clocks:
timers set from it can fire late by up to one round trip, never early. A task must not
start before its due time — a handler may rely on that — so we use the best (largest)
lower bound seen over the last minute, which tracks a fast reply within a few samples and
forgets a clock step after a minute.

Both bounds hold only if "received" is read after the reply arrived. asyncio's own loop
reads ``time.monotonic()`` afresh on every ``loop.time()``; uvloop's ``loop.time()`` is the
time its current pass began, to the millisecond, so it reads too early, and its timers,
whose delays it rounds to whole milliseconds, fire up to half a millisecond before the
time asked for (bench/peers_rate.py saw half its tasks start early: docs/benchmarks.md,
"Where the difference from the table comes from"). :func:`loop_clock` gives such a loop a
fresh reading of the same clock and a margin for its timers.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable

WINDOW_S = 60.0
# Added to timers on a loop that is not asyncio's own (see the module docstring).
COARSE_TIMER_MARGIN_S = 0.001


def loop_clock(loop: asyncio.AbstractEventLoop) -> tuple[Callable[[], float], float]:
    """A reading of ``loop``'s clock as of the moment it is called (never behind it), and
    how much later than a due time a timer on that loop must be set for it never to fire
    before the due time."""
    if type(loop).time is asyncio.BaseEventLoop.time:
        return loop.time, 0.0  # time.monotonic(), read afresh; timers never early
    if abs(loop.time() - time.monotonic()) < 0.05:  # the same clock, read at each pass
        return time.monotonic, COARSE_TIMER_MARGIN_S
    return loop.time, COARSE_TIMER_MARGIN_S


class ServerClock:
    def __init__(self) -> None:
        self._samples: deque[tuple[float, float]] = deque()  # (received, lower bound)
        self.offset: float | None = None  # server seconds minus loop seconds
        self.server_now_ms: int | None = None  # the server's time in the latest reply (ms)

    def observe(self, server_ms: float, sent: float, received: float) -> None:
        self.server_now_ms = int(server_ms)
        bound = server_ms / 1000 - received
        while self._samples and (
            self._samples[-1][1] <= bound or self._samples[0][0] < received - WINDOW_S
        ):
            # Drop samples that are worse than this one (from the right) or too old (left).
            if self._samples[-1][1] <= bound:
                self._samples.pop()
            else:
                self._samples.popleft()
        self._samples.append((received, bound))
        self.offset = self._samples[0][1]

    def to_loop(self, server_ms: float, default: float) -> float:
        """The loop time at which the server's clock reads ``server_ms`` (or just after)."""
        if self.offset is None:
            return default
        return server_ms / 1000 - self.offset
