"""delayq.testing's VirtualClock: advance() takes a bounded step forward and nothing else
(issue 28, finding 10: advance(inf) raised OverflowError, advance(1e20) was accepted)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

import pytest

from delayq import ConfigurationError
from delayq.testing import VirtualClock

TEN_YEARS_S = 10 * 365 * 24 * 3600


@pytest.mark.parametrize(
    "delta",
    [
        math.inf,
        -math.inf,
        math.nan,
        1e20,
        TEN_YEARS_S + 1,
        timedelta.max,
        timedelta(days=3651),
        -1,
        -0.001,
        timedelta(seconds=-1),
        True,
        False,
        "60",
        None,
        b"1",
        object(),
    ],
)
def test_advance_refuses_what_is_not_a_step_forward_naming_the_largest(delta: object) -> None:
    clock = VirtualClock(datetime(2026, 1, 1, tzinfo=UTC))
    before = clock.now()
    with pytest.raises(ConfigurationError, match="from 0 to 315,360,000 s a step"):
        clock.advance(delta)  # type: ignore[arg-type]
    assert clock.now() == before  # (unmoved)


@pytest.mark.parametrize("delta", [0, 0.0005, 1, 2.5, TEN_YEARS_S, timedelta(days=3650)])
def test_advance_takes_up_to_ten_years(delta: float | timedelta) -> None:
    clock = VirtualClock(datetime(2026, 1, 1, tzinfo=UTC))
    secs = delta.total_seconds() if isinstance(delta, timedelta) else delta
    assert clock.advance(delta) == datetime(2026, 1, 1, tzinfo=UTC) + timedelta(
        milliseconds=round(secs * 1000)
    )


def test_near_the_year_9999_the_largest_step_is_what_is_left() -> None:
    clock = VirtualClock(datetime(9999, 12, 31, 23, 59, 0, tzinfo=UTC))
    with pytest.raises(ConfigurationError, match="from 0 to 59 s a step"):
        clock.advance(60)
    assert clock.advance(59) == datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC)
    assert clock.advance(0) == clock.now()
    with pytest.raises(ConfigurationError, match="from 0 to 0 s"):
        clock.advance(0.001)


def test_advance_to_takes_an_aware_datetime_not_before_now() -> None:
    clock = VirtualClock(datetime(2026, 1, 1, tzinfo=UTC))
    for when in (datetime(2026, 1, 1), 1.7e9, "2026-01-02", None):
        with pytest.raises(ConfigurationError, match="when"):
            clock.advance_to(when)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="only moves forward"):
        clock.advance_to(datetime(2025, 1, 1, tzinfo=UTC))
    assert clock.advance_to(datetime(9999, 12, 31, tzinfo=UTC)).year == 9999


def test_advance_to_never_passes_the_year_9999() -> None:
    """advance_to(datetime.max) went past the bound advance() keeps, and advance(0) was then
    refused as 'from 0 to -1 s a step' (found by the review of issue 28)."""
    clock = VirtualClock(datetime(2026, 1, 1, tzinfo=UTC))
    with pytest.raises(ConfigurationError, match="never moves past 9999-12-31T23:59:59"):
        clock.advance_to(datetime.max.replace(tzinfo=UTC))
    assert clock.now() == datetime(2026, 1, 1, tzinfo=UTC)
    clock.advance_to(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC))
    assert clock.advance(0).year == 9999
