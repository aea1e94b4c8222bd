"""The peers harness (bench/peers): both servers, a skipped peer, one call per task timed.

Real servers and processes: ``m_single`` starts a fresh private Valkey 8 and Redis 7.0
(loopback, free port) and a producer process per run, as ``bench/peers/run`` does.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
REDIS7 = "/usr/bin/redis-server"


@pytest.fixture(scope="module")
def peers() -> Iterator[dict[str, ModuleType]]:
    added = [str(ROOT / "bench" / "peers"), str(ROOT / "bench")]
    sys.path[:0] = added
    try:
        import measures
        import report
        import run

        yield {"measures": measures, "report": report, "run": run}
    finally:
        for p in added:
            sys.path.remove(p)
        from common import cleanup_all

        cleanup_all()


def _single(peers: dict[str, ModuleType], server: str, tmp_path: Path) -> dict[str, Any]:
    m = peers["measures"]
    ctx = m.Context(sizes=m.Sizes(single_n=60), logdir=tmp_path, server=server)
    out: dict[str, Any] = m.m_single(ctx, "delayq")
    return out


@pytest.mark.parametrize("server", ["valkey", "redis"])
def test_single_times_each_schedule_call_on_each_server(
    peers: dict[str, ModuleType], server: str, tmp_path: Path
) -> None:
    if server == "redis" and not os.access(REDIS7, os.X_OK):
        pytest.skip(f"{REDIS7} not installed")
    out = _single(peers, server, tmp_path)
    assert out["server"].startswith({"valkey": "Valkey", "redis": "Redis server v=7.0"}[server])
    for row in (out, out["async"]):
        assert row["complete"] and row["sent"] == 40  # 60 less the 20 untimed warm-up calls
        assert 0 < row["p50_us"] <= row["p99_us"] < 1e6
        assert row["tasks_per_s"] > 0
    logs = sorted(p.name for p in tmp_path.iterdir())
    assert logs and all(name.startswith(f"{server}-delayq-single") for name in logs), logs


def test_a_missing_peer_is_skipped_with_a_clear_line(peers: dict[str, ModuleType]) -> None:
    run, report = peers["run"], peers["report"]
    info = dict(run.describe("delayq"), missing=["bullmq"])
    res = run.run_peer(None, "bullmq", ["schedule", "single", "idle", "scale"], info)
    assert set(res) == {"schedule", "single", "idle"}
    results = {
        "delayq": {"schedule": {"tasks_per_s": 1000.0}, "single": _row(500.0)},
        "arq": {"schedule": {"tasks_per_s": 100.0}, "single": _row(250.0)},
        "bullmq": res,
    }
    assert report.errors_text(results) == []  # not an error: the run still exits 0
    (line,) = report.skipped_text(results)
    assert line.startswith("bullmq: not installed or does not import (no module bullmq)")
    row = next(r for r in report.table_rows(results, {}) if r[0] == "bullmq")
    assert set(row[2:]) == {"skipped"}
    bars = report.bars(results)
    assert {b.peer for b in bars} == {"arq"}  # no bar against a peer that did not run
    single = {b.peer: b.ratio for b in bars if b.what == "one call per task"}
    assert single == {"arq": 2.0}
    rows = {r[0]: r for r in report.single_rows(results)}
    assert rows["arq"][-1] == "2.00x" and rows["bullmq"][1] == "skipped"


def test_a_peer_that_fails_to_import_is_skipped(
    peers: dict[str, ModuleType], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by find_spec but broken (a dependency of its own missing): skipped, not run."""
    (tmp_path / "brokenpeer").mkdir()
    (tmp_path / "brokenpeer" / "__init__.py").write_text("import no_such_dependency_here\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.syspath_prepend(str(tmp_path))
    why = peers["run"].import_error("brokenpeer")
    assert "No module named 'no_such_dependency_here'" in why
    assert peers["run"].import_error("json") == ""


def test_server_flag_defaults_to_both(peers: dict[str, ModuleType]) -> None:
    run = peers["run"]
    with pytest.raises(SystemExit):
        run.main(["--server", "mysql"])
    assert set(run.SERVERS) == {"valkey", "redis"}


def test_a_ratio_of_zero_prints(peers: dict[str, ModuleType]) -> None:
    report = peers["report"]
    results = {
        "delayq": {"idle": {"sent_per_s": 0.2, "executed_per_s": 1.0, "bytes_per_task": 200}},
        "bullmq": {"idle": {"sent_per_s": 0.0, "executed_per_s": 0.0, "bytes_per_task": 600}},
    }
    lines = [b.line() for b in report.bars(results)]
    assert any("bullmq inf better" in ln for ln in lines), lines
    assert not math.isnan(report.fig(results, "bullmq", "idle", "sent_per_s"))


def _row(rate: float) -> dict[str, Any]:
    return {"tasks_per_s": rate, "p50_us": 1e6 / rate, "p99_us": 2e6 / rate, "complete": True}
