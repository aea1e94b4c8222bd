"""Two commits side by side: ``bench/ab.py REF_A REF_B [--rounds N] [--quick] NAME [NAME ...]``.

"Unchanged for plain tasks" is a claim about two versions of the code, so it is measured
with both in one run: each ref is checked out (``git worktree add --detach``) in a temporary
directory, and the named benchmarks (bench/run's names) run in rounds, A then B, then B
then A, so that the machine's drift falls on both alike. Each run is ``bench/run.py NAME
... --json`` in that ref's tree with ``PYTHONPATH`` set to it: the ref's own delayq and its
own benchmarks, in this venv. Prints, for every numeric figure both refs report, the
medians and the ratio B / A, and the bars each ref passed. The worktrees are removed at
the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def flat(doc: Any, prefix: str = "") -> dict[str, float]:
    """Every number in a figures document, by its path (``lateness/async/p99_ms``)."""
    out: dict[str, float] = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.update(flat(v, f"{prefix}/{k}" if prefix else str(k)))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.update(flat(v, f"{prefix}[{i}]"))
    elif isinstance(doc, int | float) and not isinstance(doc, bool):
        out[prefix] = float(doc)
    return out


def checkout(ref: str, into: Path) -> str:
    """The ref checked out in ``into``; returns its short commit."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-q", str(into), ref], check=True
    )
    return subprocess.run(
        ["git", "-C", str(into), "rev-parse", "--short", "HEAD"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def one_run(tree: Path, names: list[str], quick: bool, out: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, str(tree / "bench" / "run.py"), *names, "--json", str(out)]
    if quick:
        argv.append("--quick")
    subprocess.run(argv, cwd=tree, env=env, check=False, stdout=subprocess.DEVNULL)
    with open(out) as f:
        return json.load(f)  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/ab.py", description=__doc__.splitlines()[0])
    p.add_argument("ref_a")
    p.add_argument("ref_b")
    p.add_argument("names", nargs="+", metavar="NAME", help="bench/run's benchmark names")
    p.add_argument("--rounds", type=int, default=3, help="runs of each ref (default 3)")
    p.add_argument("--quick", action="store_true", help="bench/run's --quick: a smoke check")
    p.add_argument("--match", default="", help="only figures whose path holds this text")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="delayq-ab-") as tmp:
        trees = {"A": Path(tmp) / "a", "B": Path(tmp) / "b"}
        commits: dict[str, str] = {}
        runs: dict[str, list[dict[str, Any]]] = {"A": [], "B": []}
        try:
            for side, ref in (("A", args.ref_a), ("B", args.ref_b)):
                commits[side] = checkout(ref, trees[side])
            for r in range(args.rounds):
                order = ("A", "B") if r % 2 == 0 else ("B", "A")
                for side in order:
                    print(f"round {r + 1}/{args.rounds}: {side} ({commits[side]})", flush=True)
                    doc = one_run(trees[side], args.names, args.quick, Path(tmp) / "out.json")
                    runs[side].append(doc)
        finally:
            for tree in trees.values():
                subprocess.run(
                    ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)],
                    check=False,
                    capture_output=True,
                )
    report(args, commits, runs)
    return 0


def report(
    args: argparse.Namespace, commits: dict[str, str], runs: dict[str, list[dict[str, Any]]]
) -> None:
    figures = {side: [flat(d["figures"]) for d in docs] for side, docs in runs.items()}
    keys = sorted(set.intersection(*(set(f) for side in figures.values() for f in side)))
    print(
        f"\nA = {args.ref_a} ({commits['A']}), B = {args.ref_b} ({commits['B']}); "
        f"medians of {args.rounds} runs each, interleaved{' (--quick)' if args.quick else ''}"
    )
    print(f"{'figure':60s} {'A':>12s} {'B':>12s} {'B/A':>7s}")
    for k in keys:
        if args.match not in k:
            continue
        a = statistics.median(f[k] for f in figures["A"])
        b = statistics.median(f[k] for f in figures["B"])
        ratio = f"{b / a:7.3f}" if a else "      -"
        print(f"{k:60s} {a:12.4g} {b:12.4g} {ratio}")
    for side in ("A", "B"):
        bars = [b for d in runs[side] for b in d["bars"]]
        passed = sum(1 for b in bars if b["passed"])
        errors = [e for d in runs[side] for e in d["errors"].values()]
        print(f"{side}: {passed} of {len(bars)} bar readings passed; errors: {errors or 'none'}")


if __name__ == "__main__":
    sys.exit(main())
