"""Processes: how much a second worker process adds, with ``delayq worker --processes N``.

``delayq worker processes:make_worker --processes N --concurrency 64`` (a real supervisor
and N real worker processes) starts on a fresh server (AOF off); once every worker process
is serving, 100,000 CPU-light tasks (an async handler that does a little arithmetic) are
scheduled, all due at one instant just after the last is written. Throughput is counted
from the first ack seen to the last (``stats().done`` polled every 20 ms). N = 1 and 2,
then the ratio.

The bar (2 processes >= 1.5 x 1) needs a core for each worker process and one for the
server: on a 2-core machine the server's single thread, the two workers and this process
share two cores, and the figure says more about the machine than about delayq. The server's
CPU share is printed beside each run to show it.

This module is also the worker app the supervisor runs (``make_worker``; the queue in
``BENCH_QUEUE``).
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import BENCH_DIR, Report, client, fresh_server, server_cpu, short_version, stop_pid

from delayq import Queue, TaskSpec, Worker

NAME = "processes"
TITLE = "Processes: 100,000 CPU-light tasks drained by --processes 1 and --processes 2"

COUNT = 100_000
PROCESSES = (1, 2)
CONCURRENCY = 64
BAR_RATIO = 1.5
POLL = 0.02
QUEUE_ENV = "BENCH_QUEUE"


def make_worker() -> Worker:
    """The app: one async handler that does a little arithmetic (CPU-light, no I/O)."""
    worker = Worker(Queue(os.environ[QUEUE_ENV]), concurrency=CONCURRENCY)

    @worker.handler("bench.light")
    async def light(task: Any) -> None:
        n = task.payload["i"]
        sum(i * n for i in range(20))

    return worker


def run(rep: Report) -> None:
    n = rep.n(COUNT)
    rep.line(f"{n:,} CPU-light tasks due at one instant; tasks/s once every process serves")
    rates = {p: one(rep, p, n) for p in PROCESSES}
    ratio = rates[2] / rates[1] if rates[1] > 0 else float("nan")
    rep.line(f"--processes 2 / --processes 1: {ratio:.2f}x ({os.cpu_count()} cores here)")
    rep.figure("ratio", ratio)
    rep.bar("--processes 2 over --processes 1", ratio, ">=", BAR_RATIO, "x")


def one(rep: Report, processes: int, n: int) -> float:
    name = f"procs-{secrets.token_hex(3)}"
    with fresh_server(appendonly=False) as srv, Queue(name, url=srv.url) as queue:
        due = time.time()
        for i in range(0, n, 50_000):
            queue.schedule_many(
                TaskSpec("bench.light", {"i": j}, at=due) for j in range(i, min(i + 50_000, n))
            )
        meter = client(srv.url)
        log = tempfile.NamedTemporaryFile(prefix="delayq-bench-sup-", suffix=".log")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "delayq", "worker", "processes:make_worker",
                "--processes", str(processes), "--url", srv.url, "--log-level", "info",
            ],
            cwd=BENCH_DIR,
            env={**os.environ, QUEUE_ENV: name},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        first_at = finished_at = scpu = 0.0
        first_done = done = 0
        try:
            cpu0 = server_cpu(meter)
            deadline = time.monotonic() + max(120.0, n / 500)
            while time.monotonic() < deadline:
                if (
                    not first_at
                    and Path(log.name).read_text().count("worker on queue") >= processes
                ):
                    # Every worker process serves from here on.
                    first_at, cpu0, first_done = time.time(), server_cpu(meter), queue.stats().done
                done = queue.stats().done
                if done >= n:
                    break
                time.sleep(POLL)
            finished_at = time.time()
            scpu = server_cpu(meter) - cpu0
        finally:
            proc.send_signal(signal.SIGTERM)
            stop_pid(proc, timeout=60)
            meter.close()
            log.close()
        elapsed = max(finished_at - first_at, 1e-9)
        ok = done >= n and first_at > 0
        rate = (done - first_done) / elapsed if ok else float("nan")
        rep.line(
            f"--processes {processes} ({short_version(srv)}): {done:,} acked, "
            f"{done - first_done:,} of them in {elapsed:.2f} s once all served = "
            f"{rate:,.0f} tasks/s; server CPU {100 * scpu / elapsed:.0f}% of a core"
        )
        rep.figure(
            f"processes-{processes}",
            {"n": n, "done": done, "seconds": elapsed, "tasks_per_s": rate, "server_cpu_s": scpu},
        )
        return rate
