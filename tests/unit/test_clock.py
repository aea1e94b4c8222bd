"""The server-clock mapping never makes a task start early."""

from __future__ import annotations

import asyncio
import time

import pytest

from delayq.worker.clock import COARSE_TIMER_MARGIN_S, WINDOW_S, ServerClock, loop_clock


def test_offset_is_a_lower_bound_from_the_reply_time() -> None:
    c = ServerClock()
    # The server read 1000.000 s somewhere between loop times 10.0 and 10.004.
    c.observe(1_000_000, sent=10.0, received=10.004)
    # A task due at server 1000.010 starts at loop 10.014: never before the server's 1000.010.
    assert abs(c.to_loop(1_000_010, 0) - 10.014) < 1e-9


def test_a_faster_reply_tightens_the_bound_and_a_slow_one_does_not_loosen_it() -> None:
    c = ServerClock()
    c.observe(1_000_000, sent=10.0, received=10.004)  # bound 989.996
    c.observe(1_001_000, sent=11.0, received=11.001)  # bound 989.999: better
    c.observe(1_002_000, sent=12.0, received=12.050)  # slow reply: bound 989.950, ignored
    assert abs(c.offset - 989.999) < 1e-9  # type: ignore[operator]


def test_old_samples_are_forgotten_so_a_clock_step_is_followed() -> None:
    c = ServerClock()
    c.observe(1_000_000, sent=10.0, received=10.0)  # bound 990
    later = 10.0 + WINDOW_S + 1
    # The server's clock stepped back by 5 s; after the window only new samples count.
    c.observe(int((later + 985.0) * 1000), sent=later, received=later)
    assert abs(c.offset - 985.0) < 1e-6  # type: ignore[operator]


def test_no_sample_means_no_mapping() -> None:
    assert ServerClock().to_loop(123, default=7.0) == 7.0


def test_asyncio_loops_time_is_read_afresh_and_needs_no_timer_margin() -> None:
    loop = asyncio.new_event_loop()
    try:
        now, margin = loop_clock(loop)
        assert now == loop.time and margin == 0.0
    finally:
        loop.close()


def test_uvloops_cached_time_is_read_afresh_and_its_timers_get_a_margin() -> None:
    """uvloop's loop.time() is when its pass began (to the ms), and it rounds timer delays
    to whole ms: read alone, tasks started up to 0.6 ms before their due time."""
    uvloop = pytest.importorskip("uvloop")
    loop = uvloop.new_event_loop()
    try:
        now, margin = loop_clock(loop)
        assert now is time.monotonic and margin == COARSE_TIMER_MARGIN_S >= 0.001
    finally:
        loop.close()
