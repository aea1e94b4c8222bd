"""Lateness at the peers' rate, and what makes it: one factor toggled at a time.

The peers' lateness measure (bench/peers): 2,000 tasks due evenly over 10 s, an ``async
def`` handler that appends one line to a file, one worker process with ``Worker``'s
defaults. Run on both servers (Valkey 8, Redis 7.0), and beside that baseline, on the same
server and interleaved round by round (the machine's noise hits every variant alike), the
same run with one thing changed:

- ``no-file``: the handler does not append (its own I/O);
- ``lookahead 0``: no tasks claimed ahead onto local timers (each starts after its claim);
- ``coarse timers``: no timerfd wake-ups (delayq/worker/alarm.py): run timers fire at the
  event loop's millisecond, as they did before it;
- ``no spin``: the timerfd goes off at a run's time, not ``alarm.SPIN_S`` ahead of it with
  the rest waited out on the CPU (the machine's wake-up latency is then in every start);
- ``uvloop``: the worker serves on uvloop's event loop (its clock is cached to the
  millisecond, so the alarm is off there).

The server-clock mapping is read off each run: how far the worker's lower bound of the
server's clock lies behind the true one (the same host's clock), which delays every timer
by as much.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import time
from typing import Any

from common import (
    Report,
    WorkerProcess,
    fresh_server,
    median,
    percentile,
    short_version,
    wait_until,
)

from delayq import Queue, TaskSpec

NAME = "peers_rate"
TITLE = "Lateness at the peers' rate (2,000 tasks over 10 s, handler appends a line)"

N = 2000
SPAN = 10.0
LEAD = 2.0
ROUNDS = 3  # (1 with --quick)
P99_BAR_MS = 0.5
VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "coarse timers": ["--coarse-timers"],
    "no spin": ["--no-spin"],
    "no-file": ["--no-append"],
    "lookahead 0": ["--lookahead", "0"],
    "uvloop": ["--uvloop"],
}


def run(rep: Report) -> None:
    n = rep.n(N)
    span = max(SPAN * rep.scale, 1.0)
    rounds = 1 if rep.quick else ROUNDS
    rep.line(
        f"{n:,} tasks due evenly over {span:g} s; one worker process, Worker defaults; async "
        f"handler appending one line to a file; {rounds} round(s), variants interleaved"
    )
    rep.line(f"load average at start: {_loadavg()}")
    for flavour in ("valkey", "redis"):
        results: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
        version = ""
        for _ in range(rounds):
            for variant, extra in VARIANTS.items():
                res = measure(flavour, n, span, extra)
                version = res["server"]
                results[variant].append(res)
        for variant, runs in results.items():
            _print(rep, version, variant, runs)
        base = results["baseline"]
        p99 = median([r["p99_ms"] for r in base])
        complete = all(r["complete"] for r in base)
        rep.bar(
            f"{version} p99 lateness (median of {rounds})",
            p99 if complete else float("nan"),
            "<=",
            P99_BAR_MS,
            "ms",
        )
    rep.line(f"load average at end: {_loadavg()}")


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _print(rep: Report, version: str, variant: str, runs: list[dict[str, Any]]) -> None:
    def med(key: str) -> float:
        return median([r[key] for r in runs])

    each = " / ".join(f"{r['p99_ms']:.2f}" for r in runs)
    rep.line(
        f"{version:12s} {variant:12s} p50 {med('p50_ms'):.2f}  p90 {med('p90_ms'):.2f}  "
        f"p99 {med('p99_ms'):.2f} ({each})  max {med('max_ms'):.2f} ms; clock bound "
        f"behind by {med('clock_error_ms'):.3f} ms; waited for a CPU {med('run_delay_ms'):.0f} ms; "
        f"spun {med('alarm_spun_ms'):.0f} ms; "
        f"early {sum(r['early'] for r in runs)}; "
        f"missing {sum(r['missing'] for r in runs)}, duplicated "
        f"{sum(r['duplicates'] for r in runs)}"
    )
    rep.figure(
        f"{version} {variant}",
        {
            k: med(k)
            for k in (
                "p50_ms",
                "p90_ms",
                "p99_ms",
                "max_ms",
                "clock_error_ms",
                "run_delay_ms",
                "alarm_spun_ms",
            )
        }
        | {"runs": runs},
    )


def measure(
    flavour: str, n: int, span: float, extra: list[str], *, lead: float = LEAD
) -> dict[str, Any]:
    """One run on a fresh server: ``n`` tasks due evenly over ``span`` s, ``lead`` s ahead."""
    name = f"pr-{secrets.token_hex(3)}"
    fd, path = tempfile.mkstemp(prefix="delayq-bench-lines-")
    os.close(fd)
    append = [] if "--no-append" in extra else ["--append-to", path]
    argv = [a for a in extra if a != "--no-append"] + append
    try:
        with fresh_server(flavour) as srv, Queue(name, url=srv.url) as queue:
            worker = WorkerProcess(srv.url, name, concurrency=0, extra=argv).start()
            try:
                t0 = time.time() + lead
                specs = [TaskSpec("bench.noop", {"i": i}, at=t0 + i * span / n) for i in range(n)]
                queue.schedule_many(specs)
                finished = wait_until(
                    lambda: queue.stats().done >= n, timeout=lead + span + 60, interval=0.25
                )
            finally:
                report = worker.stop()
            server = short_version(srv)
        with open(path) as f:
            lines = sum(1 for _ in f)
    finally:
        os.unlink(path)
    return summarize(report, n, finished) | {
        "server": server,
        "lines": lines,
        "clock_error_ms": report.get("offset_error_ms", float("nan")),
        "alarm_wakes": report.get("alarm_wakes", -1),
        "alarm_spins": report.get("alarm_spins", -1),
        "alarm_spun_ms": report.get("alarm_spun_ms", float("nan")),
        # How long the worker's loop was runnable but waited for a CPU (the machine's noise).
        "run_delay_ms": report.get("loop_run_delay_ms", float("nan")),
    }


def summarize(report: dict[str, Any], n: int, finished: bool) -> dict[str, Any]:
    """Percentiles (ms) of the worker's recorded lateness, and what is missing or doubled."""
    lat = sorted(x * 1000 for x in report.get("lateness") or [])
    return {
        "n": n,
        "started": report.get("started", 0),
        "missing": n - report.get("distinct", 0),
        "duplicates": report.get("duplicates", 0),
        "early": sum(1 for x in lat if x < 0),
        "p50_ms": percentile(lat, 50),
        "p90_ms": percentile(lat, 90),
        "p99_ms": percentile(lat, 99),
        "max_ms": lat[-1] if lat else float("nan"),
        "complete": finished and report.get("distinct", 0) == n,
    }
