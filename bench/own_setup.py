"""The lateness a user's own setup gets: ``delayq worker app:worker`` with its defaults.

An outside harness measured delayq the way its peers' users run them, not the way
bench/peers runs it: the CLI worker (``delayq worker app:worker``, every default), an
``async def`` handler that appends one line to a file, ``at=`` epoch floats, one
``schedule()`` call per task, 2,000 tasks due over 10 s. This runs that setup on a fresh
server of each flavour, and beside it the same with one difference at a time, so that
what moves the figure shows:

- ``cli``: the setup above;
- ``cli, schedule_many``: the tasks written by one ``schedule_many`` (bench/peers' way);
- ``worker_proc``: bench/worker_proc.py's in-process ``Worker(queue)`` with a handler that
  only records (bench/peers' and bench/lateness's way), tasks by ``schedule()``.

A handler's lateness is ``time.time()`` at its first line less its ``at=``; the line written
holds both. All tasks are scheduled ahead (the first due 2 s after the producer starts).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from common import Report, WorkerProcess, fresh_server, percentile, short_version, wait_until

from delayq import Queue, TaskSpec
from delayq.embedded import EmbeddedServer

NAME = "own_setup"
TITLE = "Lateness of the CLI worker with its defaults, a file-appending handler, schedule()"
N = 2_000
SPAN = 10.0
LEAD = 2.0
KIND = "line"
P99_BAR_MS = 0.5  # issue 30 item 6

APP = textwrap.dedent(
    """
    import os
    import time

    from delayq import Queue, Worker

    queue = Queue(os.environ["OWN_QUEUE"])
    worker = Worker(queue)
    PATH = os.environ["OWN_OUT"]


    @worker.handler("line")
    async def line(task):
        now = time.time()
        with open(PATH, "a") as f:
            f.write(f"{task.payload['at']!r} {now!r}\\n")
    """
)


def run(rep: Report) -> None:
    n = rep.n(N)
    span = SPAN * rep.scale
    rep.line(f"{n:,} tasks due over {span:g} s, the first {LEAD:g} s after the producer starts")
    for flavour in ("redis", "valkey"):
        for setup in ("cli", "cli, schedule_many", "worker_proc"):
            with fresh_server(flavour, appendonly=True) as srv:
                one(rep, srv, setup, n, span)


def one(rep: Report, srv: EmbeddedServer, setup: str, n: int, span: float) -> None:
    name = f"own-{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="delayq-own-") as tmp:
        out = Path(tmp) / "lines.txt"
        out.touch()
        proc: subprocess.Popen[bytes] | None = None
        worker: WorkerProcess | None = None
        with Queue(name, url=srv.url) as queue:
            try:
                if setup.startswith("cli"):
                    (Path(tmp) / "app.py").write_text(APP)
                    env = {
                        **os.environ,
                        "PYTHONPATH": os.pathsep.join([tmp, os.environ.get("PYTHONPATH", "")]),
                        "DELAYQ_REDIS_URL": srv.url,
                        "OWN_QUEUE": name,
                        "OWN_OUT": str(out),
                    }
                    argv = [sys.executable, "-m", "delayq", "worker", "app:worker"]
                    proc = subprocess.Popen(
                        argv, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                    )
                    queue.schedule(KIND, {"at": time.time()})  # ready once this one ran
                    if not wait_until(lambda: out.stat().st_size > 0, timeout=30):
                        raise RuntimeError("the CLI worker did not start within 30 s")
                    out.write_text("")
                else:
                    worker = WorkerProcess(srv.url, name, mode="async", concurrency=16).start()
                done0 = queue.stats().done
                t0 = time.time() + LEAD
                ats = [t0 + i * span / n for i in range(n)]
                if setup == "cli, schedule_many":
                    queue.schedule_many([TaskSpec(KIND, {"at": at}, at=at) for at in ats])
                else:
                    kind = KIND if worker is None else "bench.noop"
                    for at in ats:
                        queue.schedule(kind, {"at": at}, at=at)
                finished = wait_until(
                    lambda: queue.stats().done - done0 >= n, timeout=LEAD + span + 60
                )
            finally:
                report = worker.stop() if worker is not None else {}
                if proc is not None:
                    proc.terminate()
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        proc.kill()
                        proc.wait()
        if worker is not None:
            lat = [x * 1000 for x in report.get("lateness") or []]
        else:
            rows = [line.split() for line in out.read_text().splitlines() if line.strip()]
            lat = [(float(now) - float(at)) * 1000 for at, now in rows]
    lat.sort()
    p50, p99 = percentile(lat, 50), percentile(lat, 99)
    mx = lat[-1] if lat else float("nan")
    label = f"{short_version(srv)}, {setup}"
    rep.line(
        f"{label:32s} started {len(lat):,} of {n:,}{'' if finished else ' -- TIMED OUT'}: "
        f"lateness ms p50 {p50:.2f}  p99 {p99:.2f}  max {mx:.2f}"
    )
    rep.figure(label, {"n": n, "started": len(lat), "p50_ms": p50, "p99_ms": p99, "max_ms": mx})
    if setup == "cli":
        complete = finished and len(lat) == n
        rep.bar(
            f"{short_version(srv)} CLI worker p99 lateness",
            p99 if complete else float("nan"),
            "<=",
            P99_BAR_MS,
            "ms",
        )
