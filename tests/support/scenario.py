"""Running a fault scenario: worker processes to kill, a producer under load, and the wait
for the queue to settle before the checker reads the history (tests/support/checker.py)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from delayq import Queue
from delayq.errors import ConnectionFailed, DelayqError

from .checker import History, Run, check, now_ms, read_runs, write_report
from .helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.support.apps.scenario_app:worker"


class Workers:
    """N worker processes of the scenario app; each one's output goes to a file."""

    def __init__(self, directory: Path, env: dict[str, str], n: int) -> None:
        self.directory = directory
        self.env = {**os.environ, **env, "DQ_RUNLOG": str(directory), "PYTHONPATH": str(ROOT)}
        self.procs: list[subprocess.Popen[bytes]] = []
        self.outputs: list[Path] = []
        for i in range(n):
            self.procs.append(self._spawn(i))

    def _spawn(self, i: int) -> subprocess.Popen[bytes]:
        out = self.directory / f"worker-{i}-{len(self.outputs)}.out"
        self.outputs.append(out)
        with out.open("wb") as f:
            return subprocess.Popen(
                [sys.executable, "-m", "delayq", "worker", APP, "--log-level", "warning"],
                cwd=ROOT,
                env=self.env,
                stdout=f,
                stderr=subprocess.STDOUT,
            )

    def signal(self, i: int, sig: int) -> None:
        if self.procs[i].poll() is None:
            self.procs[i].send_signal(sig)

    def kill_and_restart(self, i: int) -> None:
        self.signal(i, signal.SIGKILL)
        self.procs[i].wait(10)
        self.procs[i] = self._spawn(i)

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in self.outputs if p.exists())

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.terminate()
        for p in self.procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


class Producer(threading.Thread):
    """Schedules ``job`` tasks at ``rate`` per second for ``seconds``, each with its own id,
    a delay and a work time drawn from the seeded generator; records every outcome."""

    def __init__(
        self,
        queue: Queue,
        history: History,
        rng: random.Random,
        *,
        rate: float,
        seconds: float,
        delay: tuple[float, float] = (0.1, 2.0),
        work_ms: tuple[int, int] = (1, 50),
        durable: bool = False,
        batch: int = 1,
    ) -> None:
        super().__init__(daemon=True)
        self.queue, self.history, self.rng = queue, history, rng
        self.rate, self.seconds, self.delay, self.work_ms = rate, seconds, delay, work_ms
        self.durable, self.batch = durable, batch
        self.sent = 0
        self.foreign_errors = 0  # errors that were not delayq's own: each one is a bug
        self.ack_ms: list[int] = []  # when each acknowledged call returned

    def run(self) -> None:
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < self.seconds:
            behind = int(elapsed * self.rate) - self.sent
            if behind <= 0:
                time.sleep(0.005)
                continue
            self._send(min(behind, self.batch))

    def _send(self, n: int) -> None:
        specs = []
        for _ in range(n):
            task_id = f"job:{self.sent}"
            self.sent += 1
            delay = self.rng.uniform(*self.delay)
            specs.append(
                {
                    "kind": "job",
                    "payload": self.rng.randint(*self.work_ms),
                    "delay": delay,
                    "task_id": task_id,
                }
            )
        due = {str(s["task_id"]): float(s["delay"]) for s in specs}
        self.history.unknown.update(due)  # until acknowledged
        before = now_ms()
        try:
            self.queue.schedule_many(specs, durable=self.durable)
        except Exception as e:  # DelayqError expected; anything else is recorded as a bug
            self.history.schedule_errors.append(f"{type(e).__name__}: {e}")
            self.foreign_errors += not isinstance(e, DelayqError)
            acked = e.scheduled if isinstance(e, ConnectionFailed) else []
        else:
            acked = list(due)
        for i in acked:
            # Due at least at send time + delay (the server's clock decides exactly).
            self.history.ack(i, before + int(due[i] * 1000))
        if acked:
            self.ack_ms.append(now_ms())


def in_flight(queue: Queue) -> int:
    """Tasks claimed and not finished: the ones a fault may make run twice."""
    return queue.stats().active


def settle(queue: Queue, history: History, timeout: float = 60) -> None:
    """Wait until nothing acknowledged is waiting or running."""

    def quiet() -> bool:
        s = queue.stats()
        return s.scheduled == 0 and s.active == 0

    wait_for(quiet, timeout=timeout, interval=0.2)


def dead_ids(queue: Queue) -> set[str]:
    return {t.id for t in queue.dead(0, 10_000)}


def verdict(
    history: History, runlog: Path, queue: Queue, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    runs: list[Run] = read_runs(runlog)
    report = check(history, runs, dead_ids(queue))
    report.update(extra or {})
    report["report"] = str(write_report(report))
    return report
