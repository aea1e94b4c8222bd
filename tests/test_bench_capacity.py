"""The capacity benchmarks run end to end at a tiny size: ``bench/run scaling`` (a sharded queue
on local 3-primary clusters, measured per primary) and ``bench/run ten_million --waiting N``
(the lateness and drain measures on top of N waiting tasks, a restart on the AOF).

Each is ``bench/run.py`` in its own interpreter, as a user runs it, on its own private servers;
the figures are read back from its ``--json`` file.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
REDIS7 = "/usr/bin/redis-server"

# Benchmarks (about 100 s of busy servers and workers): left out of the suite, run with
# `pytest -m bench tests/test_bench_capacity.py`.
pytestmark = [pytest.mark.bench, pytest.mark.timeout(420)]


def bench(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "run.py"), *args, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(out.read_text())
    assert not doc["errors"], doc["errors"]
    return doc


def test_scaling_reports_each_primary_of_a_3_primary_cluster(tmp_path: Path) -> None:
    doc = bench(tmp_path, "scaling", "--quick")
    figures = doc["figures"]["scaling"]
    servers = ["Valkey"] + (["Redis 7.0"] if os.access(REDIS7, os.X_OK) else [])
    assert len(figures) == len(servers)
    for server in servers:
        (run,) = (v for k, v in figures.items() if k.startswith(server))
        assert run["done"] == run["tasks"] == run["started"] == 10_000
        rows = run["primaries"]
        assert len(rows) == 3
        assert sum(r["tasks"] for r in rows) == 10_000
        assert sum(r["shards"] for r in rows) == 16
        assert math.isclose(sum(r["share"] for r in rows), 1.0)
        for r in rows:
            if r["tasks"]:
                # The server's own accounting saw each primary's work, in scripts and in CPU.
                assert r["schedule_script_us"] > 0 and r["drain_script_us"] > 0
                assert r["life_cpu_us"] > 0 and r["drain_tasks_per_s"] > 0
                assert r["projected_per_s_full_core"] == pytest.approx(1e6 / r["life_cpu_us"])
    assert all(b["passed"] for b in doc["bars"] if "ran once" in b["what"])


def test_ten_million_fills_measures_and_restarts_at_a_small_size(tmp_path: Path) -> None:
    doc = bench(tmp_path, "ten_million", "--quick", "--waiting", "5000")
    figures = doc["figures"]["ten_million"]
    fill, restart = figures["summary"]["fill"], figures["summary"]["restart"]
    assert fill["tasks"] == fill["waiting"] == 5000
    assert fill["used_memory"] > fill["used_memory_empty"]
    assert restart["loading"] == 0 and restart["waiting_after"] == 5000
    assert restart["aof_bytes"] > 0
    for tag in ("empty", "full", "empty after"):
        lat, drained = figures[tag]["lateness"], figures[tag]["drain"]
        assert lat["distinct"] == lat["n"] == 1000 and lat["duplicates"] == 0
        assert drained["done"] == drained["n"] == 10_000 and drained["duplicates"] == 0
        assert set(figures[tag]["pages"]) >= {"/", "/api/queues"}
        assert figures[tag]["info"]["command"]["median_ms"] > 0
    assert figures["ratios"]["drain tasks/s"]["full"] == figures["full"]["drain"]["tasks_per_s"]
    names = {b["what"] for b in doc["bars"]}
    assert {"fill rate (schedule_many)", "drain rate at size / empty"} <= names
