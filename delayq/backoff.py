"""Retry delays. Pure: the random source is injectable for tests."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from delayq import check
from delayq.errors import ConfigurationError, InvalidTaskError

# The field's rule of thumb for flaky dependencies: 30 s, 2 min, 10 min, then every 10 min.
DEFAULT_BACKOFF: tuple[float, ...] = (30.0, 120.0, 600.0)
DEFAULT_JITTER = 0.1
# The longest wait before a retry, whatever the backoff says: ``lambda n: 2 ** n`` would
# otherwise put attempt 40 some 35,000 years away. A task that should wait longer than a
# week is better rescheduled by the application than retried.
MAX_BACKOFF_S = 7 * 24 * 3600.0

Backoff = Sequence[float] | Callable[[int], float]


def validate_backoff(backoff: Backoff) -> Backoff:
    if callable(backoff):
        return backoff
    steps = check.many(backoff, "backoff", what="seconds (or pass a function of the attempt)")
    if not steps or not all(
        isinstance(s, int | float) and not isinstance(s, bool) and 0 <= s < math.inf for s in steps
    ):
        raise ConfigurationError(
            f"backoff must be a non-empty sequence of seconds >= 0, or a callable; got "
            f"{check.shown(backoff)}"
        )
    return tuple(float(s) for s in steps)


def delay_for(
    attempt: int,
    backoff: Backoff = DEFAULT_BACKOFF,
    jitter: float = DEFAULT_JITTER,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based).

    Jitter spreads retries of tasks that failed together (say, a database blip) by
    ±``jitter`` of the delay, so they do not all hit the recovering service at once. The
    result is at most MAX_BACKOFF_S. Raises InvalidTaskError when a backoff function
    returns something other than a number >= 0 (infinity counts as the cap).
    """
    steps = backoff
    if callable(steps):
        value = steps(attempt)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
            raise InvalidTaskError(
                f"the backoff function returned {value!r} for attempt {attempt}; "
                "it must return seconds >= 0"
            )
        base = MAX_BACKOFF_S if value > MAX_BACKOFF_S else float(value)  # 2**2000 too
    else:
        base = steps[min(attempt, len(steps)) - 1]
    return min(MAX_BACKOFF_S, max(0.0, base * (1 + jitter * (2 * rand() - 1))))
