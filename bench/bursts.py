"""Lateness under bursts: one worker process at 10,000 and then 20,000 tasks/s falling due.

100,000 tasks fall due evenly over 10 s, then 200,000 over the next 10 s (with --quick,
1 s each: 10,000 then 20,000). All are scheduled ahead (``schedule_many``, ``at=``), the
first falling due once that is done. One worker process with ``Worker``'s defaults and an
async no-op handler that records ``time.time() - task.due_at`` at its first line. Per
phase: lateness percentiles, how far behind the worker fell (the lateness of the last task
to start, and the worst), and what is missing or duplicated. Run on Valkey 8 and Redis 7.0.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

from common import Report, WorkerProcess, fresh_server, percentile, short_version, wait_until

from delayq import Queue, TaskSpec

NAME = "bursts"
TITLE = "Lateness under bursts (10,000/s for 10 s, then 20,000/s for 10 s)"

PHASES = ((10_000, 10.0), (20_000, 10.0))  # (tasks falling due per second, seconds)
BARS_MS = (2.0, 5.0)  # p99 lateness bar of each phase
CHUNK = 10_000  # tasks per schedule_many call
# Tasks/s the lead time assumes the producer reaches, at least: on a loaded 2-core machine
# 25,000 was too many (scheduling ran 0.6-1.2 s into the burst, competing with the worker).
SCHEDULE_RATE = 15_000.0


def run(rep: Report) -> None:
    phases = [(rate, span * rep.scale) for rate, span in PHASES]
    rep.line(
        "one worker process, Worker defaults, async no-op handler; "
        + ", then ".join(f"{round(r * s):,} tasks due over {s:g} s ({r:,}/s)" for r, s in phases)
    )
    for flavour in ("valkey", "redis"):
        rep.line(f"load average: {_loadavg()}")
        res = measure(flavour, phases)
        for k, ph in enumerate(res["phases"]):
            rep.line(
                f"{res['server']:12s} {ph['rate']:>6,}/s: p50 {ph['p50_ms']:.2f}  p90 "
                f"{ph['p90_ms']:.2f}  p99 {ph['p99_ms']:.2f}  p99.9 {ph['p999_ms']:.2f}  max "
                f"{ph['max_ms']:.2f} ms; last task {ph['last_ms']:.2f} ms late; missing "
                f"{ph['missing']:,}, duplicated {ph['duplicates']:,}, early {ph['early']}"
            )
            rep.figure(f"{res['server']} {ph['rate']}/s", ph)
            ok = res["complete"] and not res["missing"] and not ph["duplicates"]
            rep.bar(
                f"{res['server']} p99 lateness at {ph['rate']:,}/s",
                ph["p99_ms"] if ok else float("nan"),
                "<=",
                BARS_MS[k],
                "ms",
            )
        rep.line(
            f"  worker loop: {res['loop_cpu_ms'] / 1000:.1f} s of CPU, "
            f"{res['run_delay_ms'] / 1000:.1f} s runnable but waiting for a CPU (other load)"
        )
        if res["producer_overran_s"] > 0:
            rep.line(f"  (scheduling ended {res['producer_overran_s']:.2f} s after the first due)")


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def measure(
    flavour: str, phases: list[tuple[int, float]], lead: float = 2.0, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    """One run on a fresh server; ``phases``: (tasks/s, seconds) falling due back to back;
    ``extra``: bench/worker_proc.py options (``--coarse-timers``, say)."""
    dues: list[float] = []
    offset = 0.0
    for rate, span in phases:
        n = round(rate * span)
        dues += [offset + i / rate for i in range(n)]
        offset += span
    total = len(dues)
    name = f"burst-{secrets.token_hex(3)}"
    with fresh_server(flavour) as srv, Queue(name, url=srv.url) as queue:
        worker = WorkerProcess(srv.url, name, concurrency=0, extra=extra).start()
        try:
            t0 = time.time() + lead + total / SCHEDULE_RATE
            for a in range(0, total, CHUNK):
                queue.schedule_many(
                    [
                        TaskSpec("bench.noop", {"i": i}, at=t0 + dues[i])
                        for i in range(a, min(a + CHUNK, total))
                    ]
                )
            overran = time.time() - t0
            finished = wait_until(
                lambda: queue.stats().done >= total, timeout=t0 - time.time() + offset + 120
            )
        finally:
            report = worker.stop()
        server = short_version(srv)
    late, due = report.get("lateness") or [], report.get("due") or []
    out = []
    start = 0.0
    edge = 0.5 / max(rate for rate, _ in phases)  # due times are kept to the microsecond
    for rate, span in phases:
        lo, hi = t0 + start - edge, t0 + start + span - edge
        ms = [x * 1000 for x, d in zip(late, due, strict=True) if lo <= d < hi]
        last = ms[-1] if ms else float("nan")
        n = round(rate * span)
        ms.sort()
        out.append(
            {
                "rate": rate,
                "n": n,
                "started": len(ms),
                "missing": max(n - len(ms), 0),
                "p50_ms": percentile(ms, 50),
                "p90_ms": percentile(ms, 90),
                "p99_ms": percentile(ms, 99),
                "p999_ms": percentile(ms, 99.9),
                "max_ms": ms[-1] if ms else float("nan"),
                "last_ms": last,
                "early": sum(1 for x in ms if x < 0),
            }
        )
        start += span
    dup = report.get("duplicates", 0)
    for ph in out:  # duplicates are counted over the run; shown on each phase's line
        ph["duplicates"] = dup
    return {
        "missing": total - report.get("distinct", 0),
        "server": server,
        "phases": out,
        "complete": finished and report.get("distinct", 0) == total,
        "producer_overran_s": overran,
        "run_delay_ms": report.get("loop_run_delay_ms", float("nan")),
        "loop_cpu_ms": report.get("loop_cpu_ms", float("nan")),
    }
