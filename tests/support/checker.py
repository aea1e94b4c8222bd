"""A queue checker in the style of Jepsen's: from what producers were told and what handlers
did, count lost, unexpected and duplicated runs, and lateness.

A history holds every acknowledged schedule (id and due time), the schedules whose outcome
is unknown (the call raised: written or not), cancellations, and each fault with the number
of tasks in flight when it struck. Handlers append one line per start and per finish to a
run log (one file per process, ``O_APPEND``, so a SIGKILL loses no line already written).

    lost        acknowledged, not cancelled, not dead, never finished
    unexpected  run, but never scheduled (neither acknowledged nor unknown)
    duplicated  finished more than once (one count per extra finish)
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPORT_DIR_ENV = "DELAYQ_RELIABILITY_DIR"


def report_dir() -> Path:
    return Path(os.environ.get(REPORT_DIR_ENV) or Path(__file__).parents[2] / "build/reliability")


def now_ms() -> int:
    return int(time.time() * 1000)


class RunLog:
    """Append-only run records written by handlers: ``S|F <id> <attempt> <ms> <pid>``."""

    def __init__(self, directory: str | Path) -> None:
        self.path = Path(directory) / f"runs-{os.getpid()}.log"
        self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def start(self, task_id: str, attempt: int) -> None:
        os.write(self.fd, f"S {task_id} {attempt} {now_ms()} {os.getpid()}\n".encode())

    def finish(self, task_id: str, attempt: int) -> None:
        os.write(self.fd, f"F {task_id} {attempt} {now_ms()} {os.getpid()}\n".encode())


@dataclass
class Run:
    event: str  # "S" started, "F" finished
    id: str
    attempt: int
    at_ms: int
    pid: int


def read_runs(directory: str | Path) -> list[Run]:
    runs = []
    for path in sorted(Path(directory).glob("runs-*.log")):
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 5:  # a line cut by a kill mid-write has fewer fields
                runs.append(Run(parts[0], parts[1], int(parts[2]), int(parts[3]), int(parts[4])))
    return runs


@dataclass
class Fault:
    at_ms: int
    kind: str
    in_flight: int  # tasks that may run again because of this fault
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class History:
    scenario: str
    seed: int
    acked: dict[str, int] = field(default_factory=dict)  # id -> due (ms)
    unknown: set[str] = field(default_factory=set)  # the schedule call raised
    cancelled: set[str] = field(default_factory=set)
    faults: list[Fault] = field(default_factory=list)
    schedule_errors: list[str] = field(default_factory=list)

    def ack(self, task_id: str, due_ms: int) -> None:
        self.acked[task_id] = due_ms
        self.unknown.discard(task_id)

    def fault(self, kind: str, in_flight: int, **detail: Any) -> None:
        self.faults.append(Fault(now_ms(), kind, in_flight, detail))


def _pct(values: list[int], q: float) -> int | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def check(history: History, runs: list[Run], dead: set[str] | None = None) -> dict[str, Any]:
    """The verdict as a JSON-ready dict; ``ok`` is the bar: no loss, nothing unexpected,
    duplicates within the tasks in flight at the faults."""
    dead = dead or set()
    finished = Counter(r.id for r in runs if r.event == "F")
    first_start: dict[str, int] = {}
    for r in runs:
        if r.event == "S" and (r.id not in first_start or r.at_ms < first_start[r.id]):
            first_start[r.id] = r.at_ms
    expected = set(history.acked) - history.cancelled - dead
    lost = sorted(expected - set(finished))
    known = set(history.acked) | history.unknown
    unexpected = sorted({r.id for r in runs} - known)
    duplicated = sum(n - 1 for n in finished.values() if n > 1)
    allowed = sum(f.in_flight for f in history.faults)
    lateness = [first_start[i] - due for i, due in history.acked.items() if i in first_start]
    return {
        "scenario": history.scenario,
        "seed": history.seed,
        "acknowledged": len(history.acked),
        "unknown_outcome": len(history.unknown),
        "unknown_ran": len(history.unknown & set(finished)),
        "cancelled": len(history.cancelled),
        "dead": len(dead & set(history.acked)),
        "finished": len(finished),
        "lost": len(lost),
        "lost_ids": lost[:20],
        "unexpected": len(unexpected),
        "unexpected_ids": unexpected[:20],
        "duplicated": duplicated,
        "duplicated_ids": sorted(i for i, n in finished.items() if n > 1)[:20],
        "in_flight_at_faults": allowed,
        "faults": [asdict(f) for f in history.faults],
        "schedule_errors": history.schedule_errors[:5],
        "lateness_ms": {
            "p50": _pct(lateness, 0.50),
            "p95": _pct(lateness, 0.95),
            "p99": _pct(lateness, 0.99),
            "max": max(lateness) if lateness else None,
        },
        "ok": not lost and not unexpected and duplicated <= allowed,
    }


def write_report(report: dict[str, Any], name: str | None = None) -> Path:
    """Write ``<report dir>/<scenario>.json`` and return its path."""
    directory = report_dir()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name or report['scenario']}.json"
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return path
