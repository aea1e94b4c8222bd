"""The checker must see what it is there to see: a checker that cannot fail proves nothing."""

from __future__ import annotations

from pathlib import Path

from ..support.checker import History, RunLog, check, read_runs


def _history() -> History:
    h = History("synthetic", 0)
    for i in range(4):
        h.ack(f"t{i}", 1000 + i)
    return h


def test_a_clean_history_passes_and_measures_lateness(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    for i in range(4):
        log.start(f"t{i}", 1)
        log.finish(f"t{i}", 1)
    report = check(_history(), read_runs(tmp_path))
    assert report["ok"] and report["finished"] == 4
    assert report["lateness_ms"]["max"] is not None and report["lateness_ms"]["max"] > 0


def test_lost_unexpected_and_duplicated_are_each_caught(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    for tid in ("t0", "t1", "t1", "t2", "stranger"):  # t3 never ran, t1 twice
        log.start(tid, 1)
        log.finish(tid, 1)
    h = _history()
    report = check(h, read_runs(tmp_path))
    assert (report["lost"], report["unexpected"], report["duplicated"]) == (1, 1, 1)
    assert report["lost_ids"] == ["t3"] and report["unexpected_ids"] == ["stranger"]
    assert not report["ok"]


def test_duplicates_are_allowed_only_up_to_the_tasks_in_flight(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    for tid in ("t0", "t0", "t1", "t1", "t2", "t3"):
        log.start(tid, 1)
        log.finish(tid, 1)
    h = _history()
    h.fault("kill", in_flight=1)
    assert not check(h, read_runs(tmp_path))["ok"]  # two duplicates, one in flight
    h.fault("kill", in_flight=1)
    assert check(h, read_runs(tmp_path))["ok"]


def test_cancelled_dead_and_unknown_outcomes(tmp_path: Path) -> None:
    log = RunLog(tmp_path)
    for tid in ("t0", "maybe"):
        log.start(tid, 1)
        log.finish(tid, 1)
    (tmp_path / "runs-cut.log").write_text("S t9 1 5")  # a line cut short by a kill
    h = _history()
    h.cancelled.add("t1")
    h.unknown.add("maybe")  # the schedule call raised; it ran anyway: not unexpected
    report = check(h, read_runs(tmp_path), dead={"t2", "t3"})
    assert report["ok"] and report["lost"] == 0 and report["unknown_ran"] == 1
