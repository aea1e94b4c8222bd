"""bench/peers_rate.py and bench/bursts.py with tiny counts: real servers and a worker
process each, as ``bench/run peers_rate bursts`` runs them."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
REDIS7 = "/usr/bin/redis-server"


@pytest.fixture(scope="module")
def bench() -> Iterator[dict[str, ModuleType]]:
    added = str(ROOT / "bench")
    sys.path.insert(0, added)
    try:
        import bursts
        import peers_rate

        yield {"bursts": bursts, "peers_rate": peers_rate}
    finally:
        sys.path.remove(added)
        from common import cleanup_all

        cleanup_all()


def _servers() -> list[str]:
    return ["valkey", "redis"] if os.access(REDIS7, os.X_OK) else ["valkey"]


@pytest.mark.parametrize("variant", ["baseline", "coarse timers", "no-file", "no spin"])
def test_peers_rate_measures_every_task_with_the_handler_writing_its_line(
    bench: dict[str, ModuleType], variant: str
) -> None:
    pr = bench["peers_rate"]
    res = pr.measure("valkey", 40, 1.0, pr.VARIANTS[variant], lead=1.0)
    assert res["complete"] and res["started"] == 40
    assert res["missing"] == 0 and res["duplicates"] == 0 and res["early"] == 0
    assert res["lines"] == (0 if variant == "no-file" else 40)
    assert 0 <= res["p50_ms"] <= res["p99_ms"] <= res["max_ms"] < 1000
    assert 0 <= res["clock_error_ms"] < 1000  # the bound is behind the true clock, never ahead
    if sys.platform.startswith("linux"):
        assert (res["alarm_wakes"] > 0) == (variant != "coarse timers")
        # The alarm waits out the last SPIN_S of a run's timer on the CPU (each woken within
        # it: a loaded machine may wake none so soon), unless told not to.
        if variant == "no spin":
            assert res["alarm_spins"] == 0
        elif variant != "coarse timers":
            assert res["alarm_spins"] >= 0


@pytest.mark.parametrize("server", _servers())
def test_bursts_splits_the_run_into_its_phases_and_finds_nothing_missing(
    bench: dict[str, ModuleType], server: str
) -> None:
    res = bench["bursts"].measure(server, [(200, 0.5), (400, 0.5)], lead=1.0)
    assert res["complete"] and res["missing"] == 0
    assert [(p["rate"], p["n"], p["started"]) for p in res["phases"]] == [
        (200, 100, 100),
        (400, 200, 200),
    ]
    for p in res["phases"]:
        assert p["duplicates"] == 0 and p["early"] == 0
        assert 0 <= p["p50_ms"] <= p["p99_ms"] <= p["max_ms"] < 5000
