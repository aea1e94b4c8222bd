"""Waking the event loop at a run's timer to the microsecond, not the next millisecond.

asyncio's loop sleeps in ``epoll_wait``, whose timeout is whole milliseconds, rounded up
(``selectors.EpollSelector``): a timer due in 0.3 ms fires 1 ms from now, so a task started
from a timer is late by up to a millisecond, half of one on average, whatever the rest of
delayq does (docs/benchmarks.md, "Lateness at the peers' rate", has the figures with and
without this).

On Linux, a ``timerfd`` armed at the earliest pending timer's loop time (both are
``CLOCK_MONOTONIC``; the timerfd's resolution is the nanosecond) is watched by the loop:
it makes ``epoll_wait`` return at that instant, and the loop then runs the timer that is
due, as it always does. So the alarm never starts anything itself, and nothing can start
earlier than its timer says. Where there is no timerfd, or the loop keeps its own clock
(uvloop's is cached to the millisecond), :func:`make_alarm` returns ``None`` and timers
fire at the loop's granularity.

Waking is not instant either: from the timerfd going off to the loop running takes the
kernel, and on a virtual machine whose idle CPU has halted, the host, tens to hundreds of
microseconds. So for a run's timer (``at(when, spin=True)``) the alarm goes off ``SPIN_S``
early, and the loop waits out the rest on the CPU: the timer then runs within microseconds
of its time (docs/benchmarks.md, "Figures behind the worker's constants"). A run's timer
that is due and has not run yet (a busy loop) is never held up by such a wait, and the
waiting is capped at ``SPIN_SHARE`` of the loop's time, so a worker at high rates does not
spend its core waiting. Runs report each such timer when it has run or is cancelled
(:meth:`ran`).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import heapq
import logging
import os
import sys
import time
from collections import Counter

log = logging.getLogger("delayq.worker")

# Off: timers fire at the loop's own granularity (bench/peers_rate.py compares the two).
PRECISE = True
# A run's timer: the alarm goes off this long before it and the loop waits the rest out on
# the CPU, at most SPIN_SHARE of each second (see the module docstring).
SPIN_S = 0.00025
SPIN_SHARE = 0.05
# A run's timer neither run nor cancelled this long after its time is forgotten.
STALE_S = 1.0

_CLOCK_MONOTONIC = 1
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes, create.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settime.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(_Itimerspec),
        ctypes.c_void_p,
    ]
    settime.restype = ctypes.c_int
    return libc


class Alarm:
    """A timerfd the loop watches, armed at the earliest loop time asked for (:meth:`at`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, libc: ctypes.CDLL, fd: int) -> None:
        self.loop = loop
        self._libc = libc
        self.fd = fd
        self._times: list[float] = []  # loop times to go off at, a heap (cancelled ones too)
        # Runs' timers (at(..., spin=True)) not yet reported run or cancelled: a heap, how
        # many of each time it holds, and how many of those are reported (removed from the
        # heap when they reach its top). A report of a time the heap no longer holds (one
        # dropped as stale, after a loop that stalled) is not kept: so both counters have
        # no more entries than the heap, which holds only the last STALE_S's and later.
        self._unrun: list[float] = []
        self._held: Counter[float] = Counter()
        self._ran: Counter[float] = Counter()
        self.armed: float | None = None  # the loop time the timerfd goes off (None: idle)
        self.wakes = 0  # times the timerfd woke the loop
        self.spins = 0  # waits on the CPU for a run's timer
        self.spun = 0.0  # seconds spent so
        self._window = 0.0  # the second the spin budget is counted in (its start)
        self._window_spun = 0.0
        loop.add_reader(fd, self._fired)

    def at(self, when: float, *, spin: bool = False) -> None:
        """Make sure the loop runs at loop time ``when`` (a timer is due then). ``spin``: a
        run's timer, which the alarm goes off ahead of and waits out on the CPU; its owner
        reports it with :meth:`ran` once it has run or is cancelled."""
        if self.fd < 0:
            return  # closed
        if spin:
            heapq.heappush(self._unrun, when)
            self._held[when] += 1
            when -= SPIN_S
        if when <= self.loop.time():
            if not spin:
                return  # the loop's next turn runs it anyway
            when = self.loop.time()  # within SPIN_S: go off at once, and wait the rest
        heapq.heappush(self._times, when)
        if self.armed is None or when < self.armed:
            self._arm(when)

    def ran(self, when: float) -> None:
        """A run's timer at loop time ``when`` (given to :meth:`at` with ``spin``) has run or
        is cancelled: the next one may now be waited for."""
        if self.fd < 0:
            return
        if self._ran[when] < self._held[when]:
            self._ran[when] += 1
        nxt = self._next_unrun(self.loop.time())
        if nxt is not None and nxt - SPIN_S < (self.armed if self.armed is not None else nxt):
            self._arm(max(nxt - SPIN_S, self.loop.time()))

    def _next_unrun(self, now: float) -> float | None:
        """The earliest run's timer not reported run (dropping those reported, and those
        left unreported past STALE_S)."""
        unrun, ran = self._unrun, self._ran
        while unrun:
            top = unrun[0]
            if ran.get(top):
                _take(ran, top)
            elif top >= now - STALE_S:
                return top
            heapq.heappop(unrun)
            _take(self._held, top)
        return None

    def _arm(self, when: float) -> None:
        sec = int(when)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, int((when - sec) * 1e9)))
        if self._libc.timerfd_settime(self.fd, _TFD_TIMER_ABSTIME, ctypes.byref(spec), None):
            err = ctypes.get_errno()
            log.warning("timerfd_settime failed (%s); timers fire to the millisecond", err)
            self.close()
            return
        self.armed = when

    def _fired(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            os.read(self.fd, 8)
        self.wakes += 1
        self.armed = None
        now = self.loop.time()
        times = self._times
        while times and times[0] <= now:
            heapq.heappop(times)
        target = self._next_unrun(now)
        # Wait on the CPU for a run's timer just ahead, unless one already due has not run
        # (it may be queued behind this callback in the loop's current turn).
        if target is not None and now < target <= now + SPIN_S and self._may_spin(now):
            clock = time.monotonic
            while clock() < target:
                pass
            spent = clock() - now
            self.spins += 1
            self.spun += spent
            self._window_spun += spent
        if times:
            self._arm(times[0])

    def _may_spin(self, now: float) -> bool:
        if now - self._window >= 1.0:
            self._window, self._window_spun = now, 0.0
        return self._window_spun < SPIN_SHARE

    @property
    def unreported(self) -> int:
        """Runs' timers given to :meth:`at` with ``spin`` not yet reported by :meth:`ran`."""
        return len(self._unrun) - sum(self._ran.values())

    @property
    def pending(self) -> int:
        """Loop times asked for that have not come yet."""
        return len(self._times)

    def close(self) -> None:
        if self.fd < 0:
            return
        with contextlib.suppress(Exception):
            self.loop.remove_reader(self.fd)
        os.close(self.fd)
        self.fd = -1
        self._times.clear()
        self._unrun.clear()
        self._held.clear()
        self._ran.clear()


def _take(counts: Counter[float], key: float) -> None:
    """One fewer of ``key`` (its entry gone at none)."""
    if counts[key] == 1:
        del counts[key]
    else:
        counts[key] -= 1


def make_alarm(loop: asyncio.AbstractEventLoop) -> Alarm | None:
    """An :class:`Alarm` for ``loop``, or ``None`` where it cannot help: not Linux, or a
    loop whose clock is not ``time.monotonic`` (the timerfd's)."""
    if not PRECISE or not isinstance(loop, asyncio.SelectorEventLoop):
        return None
    if type(loop).time is not asyncio.BaseEventLoop.time:
        return None  # a loop with a clock of its own
    if abs(loop.time() - time.monotonic()) > 0.001:
        return None
    libc = _libc()
    if libc is None:
        return None
    fd = libc.timerfd_create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
    if fd < 0:
        return None
    return Alarm(loop, libc, fd)
