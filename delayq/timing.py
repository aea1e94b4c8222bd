"""Turning the caller's delays, deadlines and durations into milliseconds. Pure: no I/O.

Due times are compared on the Redis server's clock: a relative ``delay`` is sent as an
offset and added to the server's ``TIME`` inside the script, so a producer with a skewed
clock still schedules "15 minutes from now". ``at=`` is the caller's absolute wall time.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta
from typing import Protocol

from delayq.errors import ConfigurationError, InvalidTaskError

# Ten years: anything longer is almost certainly a unit mistake (ms passed as seconds).
MAX_DELAY_S = 10 * 365 * 24 * 3600

Duration = float | int | timedelta


def seconds(value: Duration, what: str = "delay") -> float:
    """Validate a non-negative, finite duration given as seconds or a timedelta."""
    if (type(value) is int or type(value) is float) and 0 <= value <= MAX_DELAY_S:
        return float(value)  # the common case, on every schedule call (NaN fails the test)
    if isinstance(value, timedelta):
        secs = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidTaskError(
            f"{what} must be seconds (int or float) or a timedelta, not {type(value).__name__}"
        )
    else:
        secs = float(value)
    if not math.isfinite(secs):
        raise InvalidTaskError(f"{what} must be finite, got {value!r}")
    if secs < 0:
        raise InvalidTaskError(f"{what} must not be negative, got {value!r}")
    if secs > MAX_DELAY_S:
        raise InvalidTaskError(f"{what} of {secs:.0f} s is over ten years; check the unit")
    return secs


def config_seconds(value: Duration, what: str, least: float = 0.0, why: str = "") -> float:
    """An option's duration (a worker's lease, grace, lookahead, max_wait, a handler's
    timeout): :func:`seconds`' checks, but a bad one is a ConfigurationError, as every
    other bad option is, not a task's InvalidTaskError. ``least``: the shortest that makes
    sense (``why`` says why), refused below it."""
    try:
        s = seconds(value, what)
    except InvalidTaskError as e:
        raise ConfigurationError(str(e)) from None
    if s < least:
        raise ConfigurationError(f"{what} must be at least {least:g} s{why}, got {value!r}")
    return s


def at_ms(at: datetime | float | int) -> int | float:
    """An absolute due time in ms, to the microsecond (a whole number stays an int): an aware
    datetime or a Unix timestamp in seconds. Workers time a task to the microsecond, so a
    due time rounded to the millisecond would start tasks up to half a millisecond before
    (or after) the time asked for."""
    if isinstance(at, datetime):
        if at.tzinfo is None or at.utcoffset() is None:
            raise InvalidTaskError(
                f"at={at!r} is a naive datetime; pass an aware one, "
                "e.g. datetime(..., tzinfo=timezone.utc)"
            )
        ts = at.timestamp()
    elif isinstance(at, bool) or not isinstance(at, int | float):
        raise InvalidTaskError(
            f"at= must be an aware datetime or a Unix timestamp, not {type(at).__name__}"
        )
    else:
        ts = float(at)
    if not math.isfinite(ts) or ts < 0:
        raise InvalidTaskError(f"at= must be a finite, non-negative timestamp, got {at!r}")
    if ts > 253402300799:  # 9999-12-31
        raise InvalidTaskError(f"at={at!r} is beyond year 9999; is it in milliseconds?")
    ms = round(ts * 1000, 3)
    return int(ms) if ms.is_integer() else ms


def due_spec(delay: Duration | None, at: datetime | float | int | None) -> str:
    """The due argument the scripts take: ``+<ms>`` relative to server time, or absolute ms."""
    if at is None:
        return "+" + str(round(seconds(delay if delay is not None else 0) * 1000))
    if delay is not None:
        raise InvalidTaskError("pass either delay= or at=, not both")
    return str(at_ms(at))


def stored_due_ms(due: str, now: float) -> float:
    """The due time, ms, that the scripts store for a due argument (:func:`due_spec`'s form)
    when they run at ``now``, the ms they reply (protocol 1.1): ``lib/due.lua``'s
    ``dq_due`` in Python, so that what a call answers is the stored score exactly, on the
    server's clock."""
    if due[0] == "+":
        return now + float(due[1:])
    return float(due)


_MAX_MS = 253_402_300_799_000  # 9999-12-31T23:59:59Z, the last second datetime can hold


def ms_to_datetime(ms: int | float) -> datetime:
    """Clamped into datetime's range: a corrupt stored time must not break reading a task."""
    return datetime.fromtimestamp(min(max(ms, 0), _MAX_MS) / 1000, tz=UTC)


_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Human durations for the CLI: ``90``, ``90s``, ``15m``, ``2h``, ``1d``, ``250ms``."""
    m = _DURATION_RE.match(text)
    if not m:
        raise InvalidTaskError(
            f"cannot read duration {text!r}: write a number with an optional unit "
            "(ms, s, m, h, d), e.g. 90s, 15m, 2h"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2)]


class Clock(Protocol):
    """A queue's clock when it is not the server's: ``delayq.testing.VirtualClock``. Every
    script takes its ``now`` from it (see ``QueueCore.now_arg``)."""

    def now_ms(self) -> int: ...
