"""Mapping the Redis server's clock onto the event loop's monotonic clock.

Due times are server milliseconds; timers run on ``loop.time()``. Each claim reply carries
the server's ``TIME``; taking it as the midpoint of the round trip bounds the error by half
the round trip, a fraction of a millisecond on a LAN, whatever the two wall clocks say.
"""

from __future__ import annotations


class ServerClock:
    def __init__(self) -> None:
        self.offset: float | None = None  # server seconds minus loop seconds

    def observe(self, server_ms: int, sent: float, received: float) -> None:
        self.offset = server_ms / 1000 - (sent + received) / 2

    def to_loop(self, server_ms: float, default: float) -> float:
        """The loop time at which the server's clock reads ``server_ms``."""
        if self.offset is None:
            return default
        return server_ms / 1000 - self.offset
