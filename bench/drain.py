"""Drain: how fast one worker process empties a backlog.

100,000 no-op tasks all due at the same instant are scheduled first; then one worker
process starts. Throughput is tasks / (time of the last ack - time the first handler
started): the last ack is when ``stats().done`` reaches the count (polled every 20 ms).
Concurrency 64 and 256, async and sync handlers; each run on a fresh server.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from common import (
    Report,
    WorkerProcess,
    client,
    fresh_server,
    proc_cpu,
    script_calls,
    server_cpu,
    short_version,
)

from delayq import Queue, TaskSpec
from delayq.embedded import EmbeddedServer

NAME = "drain"
TITLE = "Drain: 100,000 tasks due at once, one worker process"

COUNT = 100_000
CONCURRENCIES = (64, 256)
BAR_PER_S = 20_000.0
POLL = 0.02


def run(rep: Report) -> None:
    n = rep.n(COUNT)
    rep.line(f"{n:,} no-op tasks due at one instant; throughput from first start to last ack")
    for mode in ("async", "sync"):
        for conc in CONCURRENCIES:
            one(rep, mode, conc, n)


def one(rep: Report, mode: str, conc: int, n: int) -> None:
    with fresh_server() as srv:
        measure(rep, srv, f"drain-{secrets.token_hex(3)}", mode, conc, n)


def measure(
    rep: Report,
    srv: EmbeddedServer,
    name: str,
    mode: str,
    conc: int,
    n: int,
    *,
    key: str | None = None,
    bar: bool = True,
) -> dict[str, Any]:
    """``n`` tasks due now on queue ``name`` of a running server, then one worker process
    drains them; the queue may hold other tasks (not yet due: only these ``n`` are counted).
    Prints the figures, records them under ``key`` (default: ``{mode}-{conc}``) and returns
    them; with ``bar`` also judges the rate against this benchmark's bar."""
    with Queue(name, url=srv.url) as queue:
        done0 = queue.stats().done
        due = time.time()
        queue.schedule_many(TaskSpec("bench.noop", {"i": i}, at=due) for i in range(n))
        meter = client(srv.url)
        cpu0, calls0 = server_cpu(meter), script_calls(meter)
        worker = WorkerProcess(srv.url, name, mode=mode, concurrency=conc, record="count")
        timeout = max(60.0, n / 1000)  # slower than 1,000/s is a failure anyway
        done = polls = 0
        try:
            worker.start()
            wcpu0 = proc_cpu(worker.pid)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                done = queue.stats().done - done0
                polls += 1
                if done >= n:
                    break
                time.sleep(POLL)
            finished_at = time.time()
            wcpu = proc_cpu(worker.pid) - wcpu0
        finally:
            report = worker.stop()
        scpu = server_cpu(meter) - cpu0
        calls = script_calls(meter) - calls0 - polls  # the worker's calls: less our stats()
        meter.close()
        first = report.get("first_start") or finished_at
        elapsed = max(finished_at - first, 1e-9)
        rate = done / elapsed
        ok = done >= n
        rep.line(
            f"{mode:5s} concurrency {conc:3d} ({short_version(srv)}): {done:,} acked in "
            f"{elapsed:.2f} s = {rate:,.0f} tasks/s{'' if ok else ' -- TIMED OUT'}; "
            f"duplicates {report.get('duplicates', 0)}"
        )
        rep.line(
            f"      CPU: worker {wcpu:.2f} s ({100 * wcpu / elapsed:.0f}% of a core), "
            f"server {scpu:.2f} s ({100 * scpu / elapsed:.0f}%); "
            f"~{calls:,} script calls by the worker ({n / max(calls, 1):.0f} tasks/call)"
        )
        figures = {
            "n": n,
            "done": done,
            "seconds": elapsed,
            "tasks_per_s": rate,
            "worker_cpu_s": wcpu,
            "server_cpu_s": scpu,
            "script_calls": calls,
            "duplicates": report.get("duplicates", 0),
        }
        rep.figure(key or f"{mode}-{conc}", figures)
        if not bar:
            return figures
        rep.bar(
            f"{mode} concurrency {conc} drain rate",
            rate if ok else float("nan"),
            ">=",
            BAR_PER_S,
            "tasks/s",
        )
        return figures
