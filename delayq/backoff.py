"""Retry delays. Pure: the random source is injectable for tests."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from .errors import ConfigurationError

# The field's rule of thumb for flaky dependencies: 30 s, 2 min, 10 min, then every 10 min.
DEFAULT_BACKOFF: tuple[float, ...] = (30.0, 120.0, 600.0)
DEFAULT_JITTER = 0.1

Backoff = Sequence[float] | Callable[[int], float]


def validate_backoff(backoff: Backoff) -> Backoff:
    if callable(backoff):
        return backoff
    steps = tuple(float(s) for s in backoff)
    if not steps or any(s < 0 for s in steps):
        raise ConfigurationError(
            f"backoff must be a non-empty sequence of seconds >= 0, or a callable; got {backoff!r}"
        )
    return steps


def delay_for(
    attempt: int,
    backoff: Backoff = DEFAULT_BACKOFF,
    jitter: float = DEFAULT_JITTER,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based).

    Jitter spreads retries of tasks that failed together (say, a database blip) by
    ±``jitter`` of the delay, so they do not all hit the recovering service at once.
    """
    steps = backoff
    base = float(steps(attempt)) if callable(steps) else steps[min(attempt, len(steps)) - 1]
    return max(0.0, base * (1 + jitter * (2 * rand() - 1)))
