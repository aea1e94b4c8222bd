"""A serving worker's health, for its ``/livez`` and ``/readyz`` (``--metrics-port``).

The probes are answered by another thread (the metrics server's), which cannot tell from
its own side whether the event loop turns: a thread stays up while the loop hangs (a
handler that blocks it, a deadlock). So the loop itself writes the answer: every
:data:`PULSE_S` the health loop (supervised, like the others) reads the worker's state and
leaves a :class:`Pulse` stamped with the time it ran. The thread judges only the stamp's
age: a pulse older than :data:`STALE_S` means the loop is stuck, and the worker is not
live, whatever the pulse said.

Live: the event loop turns, no supervised loop has failed for good or ended, and the claim
loop has passed within ``max_wait`` + :data:`STALE_S` (it passes at least every
``max_wait``, waiting or not). Ready: live, not stopping, the last claim (or heartbeat)
Redis answered, and a claim answered within ``max_wait`` + :data:`READY_SLACK_S`, or the
worker full (it does not look while it has no room).

Times are ``time.monotonic()``: on Linux one clock for every process of the machine, so a
``--processes`` supervisor can judge its children's pulses (``processes/health.py``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable
from typing import NamedTuple

PULSE_S = 1.0
# A pulse older than this: the event loop is stuck (not live).
STALE_S = 10.0
# How much later than max_wait a claim may be answered before the worker is not ready: a
# claim's round trip, a reconnection.
READY_SLACK_S = 5.0


class Pulse(NamedTuple):
    """What the event loop saw at ``beat`` (``time.monotonic()``): why the worker is not
    live, and why not ready ("" for each: it is)."""

    beat: float
    live: str
    ready: str


class Health:
    """The claim loop and the heartbeats report here; :meth:`run` turns that into pulses;
    :meth:`verdict` answers the probes from any thread."""

    def __init__(self, max_wait_s: float) -> None:
        self.max_wait_s = max_wait_s
        # Told of each pulse (a --processes child writes it for its supervisor).
        self.sink: Callable[[Pulse], None] | None = None
        self.reset()

    def reset(self) -> None:
        """As before serving began."""
        self.pulse: Pulse | None = None  # None: not serving
        self.passed_at: float | None = None  # the claim loop's last pass (None: not yet)
        self.looked_at = -math.inf  # the last claim Redis answered (or found the worker full)
        self.failure = ""  # the last claim's or heartbeat's error, until one is answered
        self.stopping = False

    # -- reported by the loops ---------------------------------------------------------

    def looked(self) -> None:
        """A claim was answered."""
        self.passed_at = self.looked_at = time.monotonic()
        self.failure = ""

    def full(self) -> None:
        """The claim loop passed without looking: no room."""
        self.passed_at = now = time.monotonic()
        if not self.failure:
            self.looked_at = now

    def failed(self, error: object) -> None:
        """A claim (or the check before serving, or a heartbeat) was not answered."""
        self.passed_at = time.monotonic() if self.passed_at is not None else None
        self.failure = str(error) or type(error).__name__

    def answered(self) -> None:
        """A heartbeat was answered."""
        self.failure = ""

    # -- the pulse ---------------------------------------------------------------------

    async def run(self, loops: Callable[[], Iterable[asyncio.Task[None]]]) -> None:
        """Leave a pulse every PULSE_S (a supervised loop); ``loops``: the supervised
        loops, none of which may have ended."""
        while True:
            self.beat(loops())
            await asyncio.sleep(PULSE_S)

    def beat(self, loops: Iterable[asyncio.Task[None]] = ()) -> Pulse:
        now = time.monotonic()
        live = self._live(now, loops)
        pulse = Pulse(now, live, live or self._ready(now))
        self.pulse = pulse
        if self.sink is not None:
            self.sink(pulse)
        return pulse

    def ended(self) -> None:
        """Serving is over: neither live nor ready."""
        self.pulse = None

    def _live(self, now: float, loops: Iterable[asyncio.Task[None]]) -> str:
        if self.stopping:  # the loops end on purpose; a stuck loop still shows (the pulse)
            return ""
        for task in loops:
            if task.done():
                return f"worker loop {task.get_name()!r} ended"
        if self.passed_at is not None and now - self.passed_at > self.max_wait_s + STALE_S:
            return f"the claim loop has not passed for {now - self.passed_at:.0f} s"
        return ""

    def _ready(self, now: float) -> str:
        if self.stopping:
            return "stopping"
        if self.failure:
            return f"Redis did not answer: {self.failure}"
        if self.looked_at == -math.inf:
            return "starting: no claim yet"
        age = now - self.looked_at
        if age > self.max_wait_s + READY_SLACK_S:
            return f"no claim answered for {age:.0f} s (max_wait {self.max_wait_s:g} s)"
        return ""

    def verdict(self) -> tuple[str, str]:
        """(why not live, why not ready), "" for each that is: the last pulse, unless it is
        older than STALE_S."""
        return judge(self.pulse, time.monotonic())


def judge(pulse: Pulse | None, now: float) -> tuple[str, str]:
    """(why not live, why not ready) of a worker whose last pulse is ``pulse``."""
    if pulse is None:
        return "not serving", "not serving"
    age = now - pulse.beat
    if age > STALE_S:
        stuck = f"the event loop has not turned for {age:.0f} s"
        return stuck, stuck
    return pulse.live, pulse.ready
