"""Lateness: how long after its due time a task's handler starts.

One worker process (its own interpreter, so the producer and the worker do not share a
GIL). Tasks fall due at 1,000 per second for 10 s, evenly spaced, starting about 2 s after
they are scheduled (all ahead of time, by ``schedule_many`` with ``at=``). A no-op
handler records ``time.time() - task.due_at.timestamp()`` at its first line. Run once with
an async handler and once with a sync one (which runs in the worker's thread pool).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from common import Report, WorkerProcess, fresh_server, percentile, short_version, wait_until

from delayq import Queue, TaskSpec
from delayq.embedded import EmbeddedServer

NAME = "lateness"
TITLE = "Lateness (handler start - due time), 1,000 tasks/s falling due"

RATE = 1000  # tasks falling due per second
DURATION = 10.0  # seconds of tasks falling due (1 s with --quick)
LEAD = 2.0  # the first task falls due this long after scheduling starts
CONCURRENCY = 64
P99_BAR_MS = 5.0
MAX_BAR_MS = 50.0


def run(rep: Report) -> None:
    duration = DURATION * rep.scale
    n = round(RATE * duration)
    rep.line(
        f"{n:,} tasks due at {RATE:,}/s for {duration:g} s, first due {LEAD:g} s after "
        f"scheduling; one worker process, concurrency {CONCURRENCY}, no-op handler"
    )
    for mode in ("async", "sync"):
        one(rep, mode, n, duration)


def one(rep: Report, mode: str, n: int, duration: float) -> None:
    with fresh_server() as srv:
        measure(rep, srv, f"lat-{secrets.token_hex(3)}", mode, n, duration)


def measure(
    rep: Report,
    srv: EmbeddedServer,
    name: str,
    mode: str,
    n: int,
    duration: float,
    *,
    key: str | None = None,
    bars: bool = True,
) -> dict[str, Any]:
    """``n`` tasks due at ``RATE``/s on queue ``name`` of a running server, run by one worker
    process; the queue may hold other tasks (only these ``n`` are waited for). Prints the
    figures, records them under ``key`` (default: ``mode``) and returns them; with ``bars``
    also judges them against this benchmark's bars."""
    with Queue(name, url=srv.url) as queue:
        done0 = queue.stats().done
        worker = WorkerProcess(srv.url, name, mode=mode, concurrency=CONCURRENCY).start()
        try:
            t0 = time.time() + LEAD
            specs = [TaskSpec("bench.noop", {"i": i}, at=t0 + i / RATE) for i in range(n)]
            queue.schedule_many(specs)
            finished = wait_until(
                lambda: queue.stats().done - done0 >= n,
                timeout=LEAD + duration + 60,
                interval=0.25,
            )
        finally:
            report = worker.stop()
        lat = sorted(x * 1000 for x in report.get("lateness") or [])
        order = report.get("lateness") or []
        worst_at = (max(range(len(order)), key=order.__getitem__) / RATE) if order else 0.0
        p50, p90, p99, p999 = (percentile(lat, p) for p in (50, 90, 99, 99.9))
        mx = lat[-1] if lat else float("nan")
        mn = lat[0] if lat else float("nan")
        early = sum(1 for x in lat if x < 0)
        rep.line(
            f"{mode:5s} handler ({short_version(srv)}): started {report.get('started', 0):,} of "
            f"{n:,} (distinct {report.get('distinct', 0):,}, duplicates "
            f"{report.get('duplicates', 0)}){'' if finished else ' -- TIMED OUT'}"
        )
        rep.line(
            f"      lateness ms: p50 {p50:.2f}  p90 {p90:.2f}  p99 {p99:.2f}  p99.9 {p999:.2f}"
            f"  max {mx:.2f} (at ~{worst_at:.2f} s into the run)  min {mn:.2f}"
        )
        rep.line(f"      started before their due time: {early:,} ({100 * early / max(n, 1):.1f}%)")
        figures = {
            "n": n,
            "started": report.get("started"),
            "p50_ms": p50,
            "p90_ms": p90,
            "p99_ms": p99,
            "p999_ms": p999,
            "max_ms": mx,
            "min_ms": mn,
            "distinct": report.get("distinct", 0),
            "duplicates": report.get("duplicates"),
            "early": early,
            "finished": finished,
        }
        rep.figure(key or mode, figures)
        if not bars:
            return figures
        complete = finished and report.get("distinct", 0) == n
        rep.bar(f"{mode} p99 lateness", p99 if complete else float("nan"), "<=", P99_BAR_MS, "ms")
        rep.bar(f"{mode} max lateness", mx if complete else float("nan"), "<=", MAX_BAR_MS, "ms")
        return figures
