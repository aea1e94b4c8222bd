"""The supervisor of ``delayq worker APP --processes N``: N worker processes, kept running.

Each worker process is the same command with ``--processes 1`` (a subprocess, not a
``multiprocessing`` child): it imports the app itself, so nothing of the user's is pickled
or inherited half-initialised (event loops, connections, threads), and it is exactly the
worker a single process runs. The supervisor imports the app first, so an app that cannot be
imported fails here, once, before any child starts.

- A child that dies is restarted after a backoff: 1 s, doubling to 30 s, back to 1 s once a
  child has served for a minute. Why it died (exit code or signal) is logged.
- A child that exits before it reports ready (``child.py``) failed to start; three such
  exits in a row of one slot stop everything, and the supervisor exits non-zero: a broken
  deploy does not become a restart loop.
- A child that exits with ``RECYCLE_EXIT`` after it was ready recycled itself (a sync handler
  stuck past its timeout, ``--recycle-stuck``): another is started at once, no backoff.
- SIGTERM or SIGINT is forwarded to every child, which finishes its running tasks within the
  worker's grace and exits; the supervisor waits for them (the grace and a margin to write
  results), then exits 0. A second signal is forwarded again: children hand back at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from delayq.errors import ConfigurationError
from delayq.processes.child import READY_FD_ENV, RECYCLE_EXIT

log = logging.getLogger("delayq.processes")

FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 30.0
HEALTHY_S = 60.0  # a child that served this long resets its slot's backoff
START_FAILURES = 3  # exits before ready, in a row, of one slot: give up
# After the grace, how long children may take to write their results before SIGKILL.
EXIT_MARGIN_S = 15.0
TICK_S = 0.1
MAX_PROCESSES = 1024


def process_count(value: str | int) -> int:
    """``--processes``: a number from 1, or ``auto`` (the cores this process may run on)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except AttributeError:  # not on Linux
            return max(1, os.cpu_count() or 1)
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if not 1 <= n <= MAX_PROCESSES:
        raise ConfigurationError(
            f"--processes takes a number from 1 to {MAX_PROCESSES} or 'auto', got {value!r}"
        )
    return n


def exit_reason(returncode: int) -> str:
    """How a child ended, for the log: its exit code, or the signal that killed it."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


@dataclass
class Slot:
    """One of the N places a worker process runs in, and its restart state."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None  # read end of the child's ready pipe, until it reports
    started_at: float = 0.0
    ready_at: float | None = None
    backoff: float = FIRST_BACKOFF_S
    restart_at: float | None = None  # when to start it again (None: running or stopped)
    early_exits: int = 0  # exits before ready, in a row
    history: list[int] = field(default_factory=list)  # pids it ran


class ProcessSupervisor:
    """Runs ``command`` in ``n`` child processes until a signal (:meth:`run`).

    Args:
        command: the worker process's argv (``python -m delayq worker APP --processes 1``).
        n: how many to keep running.
        grace_s: the worker's grace: how long children may finish their tasks on shutdown.
        env: extra environment for the children (the metrics directory).
        on_exit: called with each child's pid when it has exited (metrics mark it dead).
    """

    def __init__(
        self,
        command: Sequence[str],
        n: int,
        *,
        grace_s: float,
        env: dict[str, str] | None = None,
        on_exit: Callable[[int], None] = lambda pid: None,
    ) -> None:
        self.command = list(command)
        self.slots = [Slot(i) for i in range(n)]
        self.grace_s = grace_s
        self.env = {**os.environ, **(env or {})}
        self.on_exit = on_exit
        self.signals = 0  # signals received
        self.forwarded = 0  # signals forwarded to the children
        self.last_signal = signal.SIGTERM
        self.failed: str | None = None  # why the supervisor gave up
        self.stop_deadline: float | None = None

    # -- the children ---------------------------------------------------------------------

    def _start(self, slot: Slot) -> None:
        read_fd, write_fd = os.pipe()
        try:
            slot.proc = subprocess.Popen(
                self.command,
                env={**self.env, READY_FD_ENV: str(write_fd)},
                pass_fds=(write_fd,),
                stdin=subprocess.DEVNULL,
                # Its own session: a terminal's Ctrl-C reaches the supervisor only, which
                # forwards it once (a child that got it twice would skip its grace).
                start_new_session=True,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        slot.ready_fd = read_fd
        slot.started_at = time.monotonic()
        slot.ready_at = None
        slot.restart_at = None
        slot.history.append(slot.proc.pid)
        log.info("worker process %d started (pid %d)", slot.index, slot.proc.pid)

    def _close_ready(self, slot: Slot) -> None:
        if slot.ready_fd is not None:
            os.close(slot.ready_fd)
            slot.ready_fd = None

    def _read_ready(self, slot: Slot) -> None:
        if slot.ready_fd is None:
            return
        try:
            data = os.read(slot.ready_fd, 1)
        except BlockingIOError:
            return
        if data:
            slot.ready_at = time.monotonic()
            slot.early_exits = 0
            log.info("worker process %d (pid %d) is serving", slot.index, self._pid(slot))
        self._close_ready(slot)  # the byte, or EOF: the child exited or closed it

    @staticmethod
    def _pid(slot: Slot) -> int:
        return slot.proc.pid if slot.proc is not None else 0

    def _reap(self, slot: Slot) -> None:
        """Act on the exit of the slot's child, if it exited."""
        proc = slot.proc
        if proc is None or proc.poll() is None:
            return
        self._read_ready(slot)  # a byte written just before exiting still counts
        self._close_ready(slot)
        slot.proc = None
        self.on_exit(proc.pid)
        why = exit_reason(proc.returncode)
        if self.signals or self.failed:  # stopping: it was told to
            log.info("worker process %d (pid %d) %s", slot.index, proc.pid, why)
            return
        now = time.monotonic()
        if slot.ready_at is not None and proc.returncode == RECYCLE_EXIT:
            log.warning(
                "worker process %d (pid %d) recycled itself (a sync handler stuck past its "
                "timeout); starting a new one",
                slot.index,
                proc.pid,
            )
            slot.restart_at = now
            return
        if slot.ready_at is None:
            slot.early_exits += 1
            log.error(
                "worker process %d (pid %d) %s before it was ready (%d time(s) in a row)",
                slot.index,
                proc.pid,
                why,
                slot.early_exits,
            )
            if slot.early_exits >= START_FAILURES:
                self.failed = (
                    f"worker processes keep failing at start ({slot.early_exits} times in a "
                    f"row, the last {why}): see the errors above"
                )
                return
        else:
            if now - slot.ready_at >= HEALTHY_S:
                slot.backoff = FIRST_BACKOFF_S
            log.warning(
                "worker process %d (pid %d) %s; restarting it in %.0f s",
                slot.index,
                proc.pid,
                why,
                slot.backoff,
            )
        slot.restart_at = now + slot.backoff
        slot.backoff = min(slot.backoff * 2, MAX_BACKOFF_S)

    def children(self) -> list[tuple[int, int | None]]:
        """(index, pid of its child or None) of every slot (the health probes read it from
        another thread: a list made anew, of plain values)."""
        return [(s.index, s.proc.pid if s.proc is not None else None) for s in self.slots]

    @property
    def stopping(self) -> bool:
        return bool(self.signals or self.failed)

    def _alive(self) -> list[Slot]:
        return [s for s in self.slots if s.proc is not None]

    def _send(self, sig: int) -> None:
        for slot in self._alive():
            assert slot.proc is not None
            with contextlib.suppress(ProcessLookupError):
                slot.proc.send_signal(sig)

    # -- the loop -------------------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self.signals += 1
        self.last_signal = signal.Signals(signum)

    def run(self) -> int:
        """Start the children and keep them running until a signal; returns the exit code:
        0 after a shutdown, 1 when the children kept failing at start."""
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            for slot in self.slots:
                self._start(slot)
            while True:
                self._tick()
                if (self.signals or self.failed) and not self._alive():
                    break
                self._wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._kill_all()
        if self.failed:
            log.error("%s", self.failed)
            return 1
        log.info("all worker processes stopped")
        return 0

    def _tick(self) -> None:
        for slot in self.slots:
            self._read_ready(slot)
            self._reap(slot)
        now = time.monotonic()
        if self.failed and self.stop_deadline is None:
            log.error("stopping the other worker processes")
            self._stop(signal.SIGTERM)
        while self.forwarded < self.signals:
            self.forwarded += 1
            if self.forwarded == 1:
                log.info(
                    "%s received: worker processes finish their running tasks (grace %.0f s)",
                    self.last_signal.name,
                    self.grace_s,
                )
            else:
                log.warning("second signal: worker processes hand back their tasks now")
            self._stop(self.last_signal)
        if self.stop_deadline is not None and now > self.stop_deadline and self._alive():
            log.error(
                "worker processes %s still running %.0f s after the grace: killing them",
                ", ".join(str(self._pid(s)) for s in self._alive()),
                EXIT_MARGIN_S,
            )
            self._send(signal.SIGKILL)
            self.stop_deadline = now + EXIT_MARGIN_S
        if self.signals or self.failed:
            return
        for slot in self.slots:
            if slot.proc is None and slot.restart_at is not None and now >= slot.restart_at:
                self._start(slot)

    def _stop(self, sig: int) -> None:
        for slot in self.slots:
            slot.restart_at = None
        if self.stop_deadline is None:
            self.stop_deadline = time.monotonic() + self.grace_s + EXIT_MARGIN_S
        self._send(sig)

    def _wait(self) -> None:
        """Sleep a tick, or until a child reports ready (signals interrupt it too)."""
        fds = [s.ready_fd for s in self.slots if s.ready_fd is not None]
        with contextlib.suppress(InterruptedError):
            if fds:
                select.select(fds, [], [], TICK_S)
            else:
                time.sleep(TICK_S)

    def _kill_all(self) -> None:
        """Whatever still runs when the supervisor leaves (an error of its own): killed."""
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    slot.proc.wait(10)
            if slot.proc is not None:
                self.on_exit(slot.proc.pid)
            self._close_ready(slot)
