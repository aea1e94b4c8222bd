"""Waking the event loop at a run's timer to the microsecond, not the next millisecond.

asyncio's loop sleeps in ``epoll_wait``, whose timeout is whole milliseconds, rounded up
(``selectors.EpollSelector``): a timer due in 0.3 ms fires 1 ms from now, so a task started
from a timer is late by up to a millisecond, half of one on average, whatever the rest of
delayq does (measured: asyncio timers at random sub-millisecond phases fired at p50 0.74 ms
late; with this, 0.12 ms; docs/benchmarks.md, "Lateness at the peers' rate").

On Linux, a ``timerfd`` armed at the earliest pending timer's loop time (both are
``CLOCK_MONOTONIC``; the timerfd's resolution is the nanosecond) is watched by the loop:
it makes ``epoll_wait`` return at that instant, and the loop then runs the timer that is
due, as it always does. So the alarm never starts anything itself, and nothing can start
earlier than its timer says. Where there is no timerfd, or the loop keeps its own clock
(uvloop's is cached to the millisecond), :func:`make_alarm` returns ``None`` and timers
fire at the loop's granularity.
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

log = logging.getLogger("delayq.worker")

# Off: timers fire at the loop's own granularity (bench/peers_rate.py compares the two).
PRECISE = True

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
        self._times: list[float] = []  # loop times asked for, a heap (cancelled ones too)
        self.armed: float | None = None  # the loop time the timerfd goes off (None: idle)
        self.wakes = 0  # times the timerfd woke the loop
        loop.add_reader(fd, self._fired)

    def at(self, when: float) -> None:
        """Make sure the loop wakes at loop time ``when`` (a timer is due then)."""
        if self.fd < 0 or when <= self.loop.time():
            return  # closed, or the loop's next turn runs it anyway
        heapq.heappush(self._times, when)
        if self.armed is None or when < self.armed:
            self._arm(when)

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
        if times:
            self._arm(times[0])

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
