"""Print the scenario reports (build/reliability/*.json) as the Markdown table of
docs/reliability.md: ``python -m tests.support.reliability_table [DIR]``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .checker import report_dir

COLUMNS = (
    "scenario",
    "seed",
    "acknowledged",
    "finished",
    "lost",
    "unexpected",
    "duplicated",
    "in_flight_at_faults",
    "p50",
    "p99",
    "max",
    "ok",
)


def rows(directory: Path) -> list[list[str]]:
    out = []
    for path in sorted(directory.glob("*.json")):
        r = json.loads(path.read_text())
        late = r["lateness_ms"]
        values = {**r, "p50": late["p50"], "p99": late["p99"], "max": late["max"]}
        out.append([str(values[c]) for c in COLUMNS])
    return out


def main(argv: list[str]) -> int:
    directory = Path(argv[0]) if argv else report_dir()
    table = rows(directory)
    if not table:
        print(f"no reports in {directory}: run pytest tests/test_scenarios.py first")
        return 1
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))
    for row in table:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
