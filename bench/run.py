"""Run delayq's benchmarks: ``bench/run [--quick] [--json PATH] [NAME ...]``.

With no NAME, every benchmark but the soak (10 minutes: ``bench/run soak`` runs it, and
``--soak-duration/-rate/-waiting/-workers`` change its sizes) and cluster (local Redis
Clusters, ~2 minutes: ``bench/run cluster``). Each benchmark starts its
own private servers (and worker processes) and stops them by PID when it ends. Prints each
figure, the bar it is measured against and PASS/FAIL, then a summary. Exits 0 when every
benchmark ran (whatever the bars say), 1 if one crashed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bursts
import cluster
import costs
import drain
import durable
import expiring
import history
import http_api
import idle
import lateness
import memory
import node_producer
import otel
import own_setup
import peers_rate
import processes
import scaling
import schedule
import server_cost
import soak
import ten_million
import testing_speed
from common import Report, cleanup_all

BENCHMARKS = {
    m.NAME: m
    for m in (
        lateness,
        peers_rate,
        bursts,
        drain,
        costs,
        history,
        server_cost,
        schedule,
        node_producer,
        idle,
        memory,
        expiring,
        durable,
        testing_speed,
        otel,
        own_setup,
        http_api,
        processes,
        soak,
        cluster,
        scaling,
        ten_million,
    )
}
ON_REQUEST = {
    soak.NAME,
    cluster.NAME,
    ten_million.NAME,
}  # too long to run by default: only when named


def _on_term(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwind, so every benchmark's finally stops what it started


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/run", description=__doc__.splitlines()[0])
    p.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"any of {', '.join(BENCHMARKS)} (default: all but {', '.join(ON_REQUEST)})",
    )
    p.add_argument("--quick", action="store_true", help="10x smaller counts: a smoke check")
    p.add_argument("--json", metavar="PATH", help="also write every figure and bar as JSON")
    g = p.add_argument_group(
        "soak sizes",
        "defaults 600 s, 5,000/s, 1,000,000 waiting, 4 workers; with --quick 60 s, 500/s, "
        "100,000 waiting",
    )
    g.add_argument("--soak-duration", type=float, metavar="S", help="seconds of tasks falling due")
    g.add_argument("--soak-rate", type=int, metavar="N", help="tasks falling due per second")
    g.add_argument("--soak-waiting", type=int, metavar="N", help="tasks waiting far ahead")
    g.add_argument("--soak-workers", type=int, metavar="N", help="worker processes")
    p.add_argument(
        "--waiting",
        type=int,
        metavar="N",
        help="ten_million: tasks waiting (default 10,000,000; 1,000,000 with --quick)",
    )
    args = p.parse_args(argv)
    unknown = [n for n in args.names if n not in BENCHMARKS]
    if unknown:
        p.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(BENCHMARKS)}")
    names = args.names or [n for n in BENCHMARKS if n not in ON_REQUEST]
    soak.configure(
        duration=args.soak_duration,
        rate=args.soak_rate,
        waiting=args.soak_waiting,
        workers=args.soak_workers,
    )
    ten_million.configure(waiting=args.waiting)
    signal.signal(signal.SIGTERM, _on_term)

    rep = Report(quick=args.quick)
    started = time.monotonic()
    try:
        for name in names:
            mod = BENCHMARKS[name]
            rep.current = name
            print(f"\n== {name}: {mod.TITLE}{'  [--quick]' if args.quick else ''}", flush=True)
            t0 = time.monotonic()
            try:
                mod.run(rep)
            except KeyboardInterrupt:
                raise
            except Exception as e:
                rep.errors[name] = f"{type(e).__name__}: {e}"
                print(f"  ERROR: {name} crashed:", flush=True)
                traceback.print_exc()
            finally:
                cleanup_all()
            print(f"  ({time.monotonic() - t0:.1f} s)", flush=True)
    except KeyboardInterrupt:
        print("\ninterrupted; stopping what was started", flush=True)
        cleanup_all()
        return 130

    print_summary(rep, time.monotonic() - started)
    if args.json:
        write_json(rep, args.json)
    return 1 if rep.errors else 0


def print_summary(rep: Report, elapsed: float) -> None:
    print(f"\n== summary ({elapsed:.0f} s{', --quick: indicative only' if rep.quick else ''})")
    for b in rep.bars:
        print(f"  {b.benchmark:9s} {b.line()}")
    for name, err in rep.errors.items():
        print(f"  {name:9s} [ERROR] {err}")
    passed = sum(b.passed for b in rep.bars)
    print(f"  {passed} of {len(rep.bars)} bars pass", flush=True)


def write_json(rep: Report, path: str) -> None:
    doc: dict[str, Any] = {
        "quick": rep.quick,
        "figures": rep.figures,
        "bars": [
            {
                "benchmark": b.benchmark,
                "what": b.what,
                "value": b.value,
                "op": b.op,
                "limit": b.limit,
                "unit": b.unit,
                "passed": b.passed,
            }
            for b in rep.bars
        ],
        "errors": rep.errors,
    }
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=str)


if __name__ == "__main__":
    sys.exit(main())
