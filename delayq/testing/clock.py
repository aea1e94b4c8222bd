"""A clock for tests that moves only when told: ``VirtualClock``."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

from delayq.errors import ConfigurationError
from delayq.timing import MAX_DELAY_S, ms_to_datetime

# The longest advance(): the longest delay a task can be given.
MAX_STEP_S = float(MAX_DELAY_S)
# The last millisecond the clock can show (a datetime ends with the year 9999).
LAST_MS = round(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp() * 1000)


def ms_of(when: datetime, what: str, *, floor: bool = False) -> int:
    """An aware datetime in Unix ms (rounded, or with ``floor`` cut down); anything else is
    refused, naming ``what``."""
    if not isinstance(when, datetime):
        raise ConfigurationError(f"{what} must be a datetime, got {type(when).__name__}")
    if when.tzinfo is None or when.utcoffset() is None:
        raise ConfigurationError(
            f"{what}={when!r} is a naive datetime; pass an aware one, "
            "e.g. datetime(2026, 1, 1, tzinfo=timezone.utc)"
        )
    ms = when.timestamp() * 1000
    return math.floor(ms) if floor else round(ms)


class VirtualClock:
    """Virtual time for a queue and its worker: ``Queue(name, url=..., clock=clock)``.

    Every time delayq uses for that queue (due times, ``delay=``, leases, backoff, the
    dedupe window, cron occurrences, expiring keys' deadlines) is read from this clock, to
    the millisecond, instead of the server's. It stands still until :meth:`advance` (or
    ``delayq.testing.drain``) moves it, and never moves back.

    ``start``: an aware datetime; by default the real now.
    """

    def __init__(self, start: datetime | None = None) -> None:
        self._ms = round(time.time() * 1000) if start is None else ms_of(start, "start")

    def now(self) -> datetime:
        """The virtual now (UTC)."""
        return ms_to_datetime(self._ms)

    def now_ms(self) -> int:
        """The virtual now in Unix milliseconds: what the queue's scripts are given."""
        return self._ms

    def advance(self, delta: timedelta | float | int) -> datetime:
        """Move the clock forward by ``delta`` (a timedelta, or seconds): at least 0 and at
        most :data:`MAX_STEP_S` (ten years, the longest delay a task takes), and never past
        the year 9999; returns the new now. Tasks that come due are not run: ``drain`` runs
        them. ``advance_to`` moves it to a given (later) time."""
        largest = min(MAX_STEP_S, (LAST_MS - self._ms) / 1000)
        if isinstance(delta, timedelta):
            seconds: float = delta.total_seconds()
        elif isinstance(delta, int | float) and not isinstance(delta, bool):
            seconds = delta
        else:
            seconds = math.nan  # refused below, with the bounds
        if not 0 <= seconds <= largest:  # (NaN too)
            raise ConfigurationError(
                f"advance(delta={delta!r:.100}): the clock moves forward by seconds (an int or "
                f"float) or a timedelta, from 0 to {largest:,.0f} s a step (ten years, and "
                "never past the year 9999); advance_to(when) moves it to a later time"
            )
        self._ms += round(seconds * 1000)
        return self.now()

    def advance_to(self, when: datetime) -> datetime:
        """Move the clock forward to ``when`` (an aware datetime, never past the year 9999);
        returns the new now."""
        ms = ms_of(when, "when")
        if ms < self._ms:
            raise ConfigurationError(
                f"the clock only moves forward: {when.isoformat()} is before its now, "
                f"{self.now().isoformat()}"
            )
        if ms > LAST_MS:
            raise ConfigurationError(
                f"advance_to({when.isoformat()}): the clock never moves past "
                f"{ms_to_datetime(LAST_MS).isoformat()}, the end of the year 9999"
            )
        self._ms = ms
        return self.now()

    def __repr__(self) -> str:
        return f"VirtualClock({self.now().isoformat()})"
