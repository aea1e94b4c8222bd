"""Write docs/figures.json, the headline figures the README and docs quote, from the JSON of a
full ``bench/peers/run``: ``python bench/headline.py [bench/results/peers-latest.json]``.

Only a full run qualifies (not ``--quick``, every measure, delayq without errors). The date
is the run's start, in UTC; the commit is the one the run recorded (``bench/peers/run``
writes it), or ``--commit`` for a JSON from before it did. Then update the pages that quote
a figure: ``pytest tests/unit/test_figures.py`` names each one that no longer matches.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "figures.json"
COMMAND = "bench/peers/run --chart-copy docs/benchmarks-peers.png"

# name -> (measure, key in the run's JSON, unit, decimals as docs/benchmarks.md shows it, what)
HEADLINE: dict[str, tuple[str, str, str, int, str]] = {
    "schedule_tasks_per_s": (
        "schedule",
        "tasks_per_s",
        "tasks/s",
        0,
        "schedule_many throughput: 20,000 tasks, one producer process, no worker running",
    ),
    "schedule_loop_tasks_per_s": (
        "schedule",
        "loop_tasks_per_s",
        "tasks/s",
        0,
        "one Queue.schedule() call per task, the same 20,000 tasks",
    ),
    "lateness_p50_ms": (
        "lateness",
        "p50_ms",
        "ms",
        1,
        "handler start minus due time, p50: 2,000 tasks falling due evenly over 10 s",
    ),
    "lateness_p99_ms": ("lateness", "p99_ms", "ms", 1, "the same, p99"),
    "lateness_max_ms": ("lateness", "max_ms", "ms", 1, "the same, max"),
    "drain_tasks_per_s": (
        "drain",
        "tasks_per_s",
        "tasks/s",
        0,
        "drain: 20,000 no-op tasks due at one instant, first handler start to last",
    ),
    "idle_sent_per_s": (
        "idle",
        "sent_per_s",
        "commands/s",
        1,
        "an idle worker with 10,000 tasks due in an hour: commands sent to the server",
    ),
    "idle_executed_per_s": (
        "idle",
        "executed_per_s",
        "commands/s",
        1,
        "the same: commands executed, those inside scripts included",
    ),
    "memory_bytes_per_task": (
        "idle",
        "bytes_per_task",
        "B per waiting task",
        0,
        "used_memory per waiting task, worker running, AOF off",
    ),
}


def headline(run: dict[str, Any], commit: str | None = None) -> dict[str, Any]:
    """The figures file for one peers run's JSON; ValueError when the run does not qualify."""
    if run.get("quick"):
        raise ValueError("a --quick run: only a full run writes the headline figures")
    commit = commit or run.get("commit")
    if not commit:
        raise ValueError("the run recorded no commit: pass --commit")
    delayq = run.get("results", {}).get("delayq")
    if not isinstance(delayq, dict):
        raise ValueError("the run has no delayq results")
    started = datetime.strptime(run["started"], "%Y-%m-%d %H:%M:%S %z").astimezone(UTC)
    date = started.strftime("%Y-%m-%d %H:%M UTC")
    figures = {}
    for name, (measure, key, unit, decimals, what) in HEADLINE.items():
        m = delayq.get(measure)
        if not isinstance(m, dict) or "error" in m:
            raise ValueError(f"delayq's {measure} measure failed or is missing: {m}")
        if m.get("complete") is False:
            raise ValueError(f"delayq's {measure} measure did not complete")
        value = m.get(key)
        if not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"delayq's {measure}.{key} is {value!r}")
        rounded = round(float(value), decimals)
        figures[name] = {
            "value": int(rounded) if decimals == 0 else rounded,
            "unit": unit,
            "what": what,
            "command": COMMAND,
            "date": date,
            "commit": commit,
        }
    return {
        "about": (
            "Headline figures: README.md and docs/*.md quote these and no others "
            "(tests/unit/test_figures.py). Written by bench/headline.py from the last full "
            "bench/peers/run; that run's whole results are in docs/benchmarks.md."
        ),
        "run": {
            "command": COMMAND,
            "date": date,
            "commit": commit,
            "minutes": round(run["seconds"] / 60, 1) if "seconds" in run else None,
            "machine": run.get("machine", {}).get("cpu"),
            "page": "docs/benchmarks.md",
        },
        "figures": figures,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/headline.py", description=__doc__.splitlines()[0])
    p.add_argument("run", nargs="?", default=str(ROOT / "bench/results/peers-latest.json"))
    p.add_argument("--commit", help="the commit the run measured, if its JSON has none")
    p.add_argument("--out", default=str(OUT), help="default docs/figures.json")
    args = p.parse_args(argv)
    with open(args.run) as f:
        run = json.load(f)
    try:
        doc = headline(run, args.commit)
    except ValueError as e:
        print(f"bench/headline.py: {args.run}: {e}", file=sys.stderr)
        return 1
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=2, ensure_ascii=False)
        f.write("\n")
    for name, fig in doc["figures"].items():
        print(f"{name:28s} {fig['value']:>10,} {fig['unit']}")
    print(f"wrote {args.out} ({doc['run']['date']}, commit {doc['run']['commit']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
