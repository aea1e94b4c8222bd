"""Periodic schedules: occurrence times (DST included), catch-up, overlap, the start-up pass,
schedule removal, the CLI, and three worker processes firing each occurrence once, on time."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
import redis
from click.testing import CliRunner
from croniter import croniter

from delayq import ConfigurationError, Queue, Task, Worker, WorkerFailed
from delayq.cli.main import main
from delayq.cron import ops as cron_ops
from delayq.cron.schedules import (
    CronTiming,
    Decision,
    IntervalTiming,
    Schedule,
    cron_schedule,
    every_schedule,
    occurrence_of,
)
from delayq.runner import SyncRunner
from tests.conftest import WorkerThread
from tests.support.apps.cron_app import runs_key

from .support.helpers import wait_for

NY = ZoneInfo("America/New_York")
MIN = 60_000
HOUR = 60 * MIN


def ms(dt: datetime) -> int:
    return round(dt.timestamp() * 1000)


def local(t_ms: int, tz: ZoneInfo = NY) -> str:
    return datetime.fromtimestamp(t_ms / 1000, tz).isoformat()


def occurrences(timing: CronTiming | IntervalTiming, start: int, end: int) -> list[int]:
    out, t = [], start
    while (t := timing.next_after(t)) <= end:
        out.append(t)
    return out


def reference(expr: str, tz_name: str, start: int, end: int) -> list[int]:
    """The DST rules of delayq/cron.py, minute by minute in absolute time: a wall time fires
    on its first pass (both passes if the hour field is *); wall times skipped by a spring
    forward fire at the jump."""
    tz, every_hour = ZoneInfo(tz_name), croniter(expr).expanded[1] == ["*"]
    out, prev_off = [], None
    for m in range(start // MIN + 1, end // MIN + 1):
        d = datetime.fromtimestamp(m * MIN / 1000, tz)
        wall, off = d.replace(tzinfo=None), d.utcoffset()
        assert off is not None
        fires = croniter.match(expr, wall) and (
            d.fold == 0 or every_hour or not _repeated(wall, tz)
        )
        if prev_off is not None and off > prev_off:  # the clocks just jumped forward
            skipped = wall - (off - prev_off)
            while skipped < wall:
                fires = fires or croniter.match(expr, skipped)
                skipped += timedelta(minutes=1)
        prev_off = off
        if fires:
            out.append(m * MIN)
    return out


def _repeated(wall: datetime, tz: ZoneInfo) -> bool:
    return ms(wall.replace(tzinfo=tz, fold=0)) != ms(wall.replace(tzinfo=tz, fold=1))


# -- occurrence times: pure ---------------------------------------------------------------


def test_spring_forward_daily_time_in_the_gap_fires_once_at_the_jump() -> None:
    # New York, 2024-03-10: 02:00 EST becomes 03:00 EDT; 02:30 does not exist that day.
    t = CronTiming("30 2 * * *", "America/New_York")
    got = occurrences(t, ms(datetime(2024, 3, 9, tzinfo=NY)), ms(datetime(2024, 3, 12, tzinfo=NY)))
    assert [local(x) for x in got] == [
        "2024-03-09T02:30:00-05:00",
        "2024-03-10T03:00:00-04:00",
        "2024-03-11T02:30:00-04:00",
    ]


def test_spring_forward_hourly_stays_hourly_in_absolute_time() -> None:
    t = CronTiming("0 * * * *", "America/New_York")
    got = occurrences(
        t, ms(datetime(2024, 3, 10, 0, 30, tzinfo=NY)), ms(datetime(2024, 3, 10, 4, 30, tzinfo=NY))
    )
    assert [local(x) for x in got] == [
        "2024-03-10T01:00:00-05:00",
        "2024-03-10T03:00:00-04:00",
        "2024-03-10T04:00:00-04:00",
    ]
    assert {b - a for a, b in itertools.pairwise(got)} == {HOUR}


def test_fall_back_daily_time_in_the_repeated_hour_fires_once() -> None:
    # New York, 2024-11-03: 02:00 EDT becomes 01:00 EST; 01:30 happens twice that day.
    t = CronTiming("30 1 * * *", "America/New_York")
    got = occurrences(t, ms(datetime(2024, 11, 2, tzinfo=NY)), ms(datetime(2024, 11, 5, tzinfo=NY)))
    assert [local(x) for x in got] == [
        "2024-11-02T01:30:00-04:00",
        "2024-11-03T01:30:00-04:00",
        "2024-11-04T01:30:00-05:00",
    ]


def test_fall_back_hourly_fires_in_both_passes_of_the_repeated_hour() -> None:
    t = CronTiming("0 * * * *", "America/New_York")
    start = ms(datetime(2024, 11, 3, 0, 30, tzinfo=NY))
    got = occurrences(t, start, start + 4 * HOUR)
    assert [local(x) for x in got] == [
        "2024-11-03T01:00:00-04:00",
        "2024-11-03T01:00:00-05:00",
        "2024-11-03T02:00:00-05:00",
        "2024-11-03T03:00:00-05:00",
    ]
    assert {b - a for a, b in itertools.pairwise(got)} == {HOUR}


@pytest.mark.parametrize(
    ("tz", "day"),
    [
        ("America/New_York", datetime(2024, 3, 10)),
        ("America/New_York", datetime(2024, 11, 3)),
        ("Europe/Berlin", datetime(2024, 3, 31)),
        ("Europe/Berlin", datetime(2024, 10, 27)),
        ("Australia/Lord_Howe", datetime(2024, 4, 7)),  # a 30-minute shift
        ("Australia/Lord_Howe", datetime(2024, 10, 6)),
    ],
)
def test_occurrences_around_transitions_match_the_rules_minute_by_minute(
    tz: str, day: datetime
) -> None:
    start = ms(day.replace(tzinfo=UTC)) - 12 * HOUR
    end = start + 24 * HOUR
    for expr in (
        "*/15 * * * *",
        "30 2 * * *",
        "30 1 * * *",
        "0 * * * *",
        "*/7 1-3 * * *",
        "5 3 * * 0",
    ):
        timing = CronTiming(expr, tz)
        want = reference(expr, tz, start, end)
        assert occurrences(timing, start, end) == want, expr
        for t in range(start, end, 41 * MIN + 1234):
            before = [x for x in want if x <= t]
            if before:
                assert timing.latest_at_or_before(t) == before[-1], (expr, t)


def test_every_is_a_grid_from_the_epoch_so_it_never_drifts() -> None:
    sched = every_schedule("sweep", 5 * MIN)
    base = ms(datetime(2024, 6, 1, 12, 0, tzinfo=UTC))
    # However late an occurrence starts, the next one is on the grid.
    assert sched.next_after(base + 2_999) == base + 5 * MIN
    assert sched.decide(base, base + 40_000) == Decision(True, base + 5 * MIN)
    assert sched.occurrence_id(base) == f"cron:sweep:{base}"
    assert occurrence_of(sched.occurrence_id(base)) == base
    assert occurrence_of("not-cron") is None
    assert sched.payload(base) == {
        "schedule": "sweep",
        "at": base,
        "time": "2024-06-01T12:00:00+00:00",
    }


def test_catch_up_decisions() -> None:
    def sched(catch_up: Any, **kw: Any) -> Schedule:
        return every_schedule("s", 1000, catch_up=catch_up, **kw)

    occ, now = 10_000, 15_500  # four more occurrences came due while it waited
    assert sched("latest").decide(occ, 10_004) == Decision(True, 11_000)
    latest = sched("latest").decide(occ, now)
    assert (latest.run, latest.successor) == (False, 15_000)
    assert sched("all").decide(occ, now) == Decision(True, 11_000)
    skip = sched("skip").decide(occ, now)
    assert (skip.run, skip.successor) == (False, 16_000)
    # all, bounded: only the last `catch_up_limit` due occurrences run.
    bounded = sched("all", catch_up_limit=3).decide(occ, now)
    assert (bounded.run, bounded.successor) == (False, 13_000)
    assert sched("all", catch_up_limit=6).decide(occ, now) == Decision(True, 11_000)
    # skip also drops a lone occurrence later than misfire_grace (a daily job after an outage).
    daily = cron_schedule("d", "0 2 * * *", catch_up="skip", misfire_grace=60)
    two = ms(datetime(2024, 6, 1, 2, 0, tzinfo=UTC))
    assert daily.decide(two, two + 30 * MIN).run is False
    assert daily.decide(two, two + 30_000).run is True
    late_daily = cron_schedule("d", "0 2 * * *")
    assert late_daily.decide(two, two + 30 * MIN) == Decision(True, two + 24 * HOUR)


def test_sig_changes_with_the_times_not_with_the_options() -> None:
    a = cron_schedule("r", "0 2 * * *", tz="Asia/Shanghai")
    assert a.sig == cron_schedule("r", "0  2 * * *", tz="Asia/Shanghai", max_running=3).sig
    assert a.sig != cron_schedule("r", "0 3 * * *", tz="Asia/Shanghai").sig
    assert a.sig != cron_schedule("r", "0 2 * * *", tz="Europe/Berlin").sig


# -- bad input at decoration time -----------------------------------------------------------


@pytest.fixture
def offline_worker() -> Worker:
    # Never connects: decoration-time checks need no server.
    return Worker(Queue("decorate", url="redis://127.0.0.1:9"))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda w: w.cron("61 * * * *", name="x"), r"invalid cron expression '61 \* \* \* \*'"),
        (lambda w: w.cron("every day", name="x"), "invalid cron expression"),
        (lambda w: w.cron("0 2 * * * *", name="x"), "has 6 fields"),
        (lambda w: w.cron("0 0 30 2 *", name="x"), "never fires"),
        (lambda w: w.cron("H 2 * * *", name="x"), "hashed or random"),
        (
            lambda w: w.cron("0 2 * * *", tz="Mars/Olympus", name="x"),
            "unknown time zone 'Mars/Olympus'",
        ),
        (lambda w: w.cron("0 2 * * *", tz="", name="x"), "IANA zone name"),
        (lambda w: w.cron("0 2 * * *", name="has space"), "invalid schedule name"),
        (lambda w: w.cron("0 2 * * *", name="x", catch_up="some"), "catch_up must be one of"),
        (lambda w: w.cron("0 2 * * *", name="x", max_running=-1), "max_running"),
        (lambda w: w.cron("0 2 * * *", name="x", retries=3), "unknown schedule option"),
        (lambda w: w.every(name="x"), "every\\(\\) takes an interval"),
        (lambda w: w.every(seconds=0.5, name="x"), "between 1 second"),
        (lambda w: w.every(5, minutes=1, name="x"), "takes an interval"),
        (lambda w: w.every(minutes=-1, name="x"), "must be a number from 0 to ten years"),
        # NaN, infinity and huge numbers: a ConfigurationError, not Python's ValueError or
        # OverflowError from timedelta() and round().
        (lambda w: w.every(math.nan, name="x"), "between 1 second and ten years"),
        (lambda w: w.every(math.inf, name="x"), "between 1 second and ten years"),
        (lambda w: w.every(seconds=math.inf, name="x"), "from 0 to ten years"),
        (lambda w: w.every(seconds=math.nan, name="x"), "from 0 to ten years"),
        (lambda w: w.every(seconds=1e300, name="x"), "from 0 to ten years"),
        (lambda w: w.every(hours=1e5, name="x"), "between 1 second and ten years"),
    ],
)
def test_bad_schedules_fail_at_decoration_with_a_clear_message(
    offline_worker: Worker, call: Callable[[Worker], Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        call(offline_worker)


def nightly(task: Task) -> None: ...


def test_schedule_names_are_unique_per_worker_and_default_to_the_function(
    offline_worker: Worker,
) -> None:
    offline_worker.every(minutes=5)(nightly)
    assert "cron:tests.test_cron.nightly" in offline_worker.lanes[0].registry.kinds()

    def nested(task: Task) -> None: ...

    with pytest.raises(ConfigurationError, match="pass name="):
        offline_worker.every(minutes=5)(nested)
    offline_worker.every(timedelta(minutes=1), name="dup")(nightly)
    with pytest.raises(ConfigurationError, match="already declared"):
        offline_worker.cron("* * * * *", name="dup")(nightly)


# -- the start script: one chain ------------------------------------------------------------

NOW = 1_700_000_000_000


def _claimed(queue: Queue, sched: Schedule, at: int) -> int:
    """Put occurrence `at` in the active set as a claim would; returns its lease token."""
    r = SyncRunner(queue.client)
    r.run(queue.core.schedule([cron_ops_task(queue, sched, at)], now_ms=NOW))
    from delayq.leasing import claim

    result = r.run(claim(queue.core, limit=10, lease_ms=30_000, lookahead_ms=10**12, now_ms=NOW))
    (claimed,) = [c for c in result.tasks if c.id == sched.occurrence_id(at)]
    return claimed.token


def cron_ops_task(queue: Queue, sched: Schedule, at: int) -> Any:
    from delayq.spec import TaskSpec

    return TaskSpec(sched.kind, sched.payload(at), at=at / 1000, task_id=sched.occurrence_id(at))


def _meta(queue: Queue, name: str) -> dict[str, Any]:
    raw = queue.client.hget(queue.core.keys.cron, name)
    assert raw is not None
    data: dict[str, Any] = json.loads(raw)
    return data


def test_only_the_current_occurrence_creates_a_successor(queue: Queue) -> None:
    sched = every_schedule("s", 1000)
    r = SyncRunner(queue.client)
    token = _claimed(queue, sched, NOW)
    start = cron_ops.start(
        queue.core,
        sched,
        sched.occurrence_id(NOW),
        token,
        NOW,
        Decision(True, NOW + 1000),
        now_ms=NOW,
    )
    assert r.run(start) == "run"
    meta = _meta(queue, "s")
    assert (meta["next_id"], meta["last_id"], meta["last_status"]) == (
        sched.occurrence_id(NOW + 1000),
        sched.occurrence_id(NOW),
        "running",
    )
    assert queue.get(sched.occurrence_id(NOW + 1000)).state == "scheduled"  # type: ignore[union-attr]
    # The same occurrence starting again (a retry, or a re-run after a crash) is no longer
    # the current one: it runs, and creates nothing.
    again = cron_ops.start(
        queue.core,
        sched,
        sched.occurrence_id(NOW),
        token,
        NOW,
        Decision(True, NOW + 5000),
        now_ms=NOW + 1,
    )
    assert r.run(again) == "run"
    assert queue.get(sched.occurrence_id(NOW + 5000)) is None
    assert _meta(queue, "s")["next_id"] == sched.occurrence_id(NOW + 1000)
    # A stale token (the lease was taken over) is refused.
    stale = cron_ops.start(
        queue.core,
        sched,
        sched.occurrence_id(NOW),
        token + 99,
        NOW,
        Decision(True, NOW + 1000),
        now_ms=NOW,
    )
    assert r.run(stale) == "lost"


def test_max_running_makes_the_next_occurrence_wait_and_its_end_wakes_it(queue: Queue) -> None:
    sched = every_schedule("s", 1000, max_running=1)
    r = SyncRunner(queue.client)
    first, second = NOW, NOW + 1000
    t1 = _claimed(queue, sched, first)
    assert (
        r.run(
            cron_ops.start(
                queue.core,
                sched,
                sched.occurrence_id(first),
                t1,
                first,
                Decision(True, second),
                now_ms=NOW,
            )
        )
        == "run"
    )
    t2 = _claimed(queue, sched, second)
    busy = cron_ops.start(
        queue.core,
        sched,
        sched.occurrence_id(second),
        t2,
        second,
        Decision(True, NOW + 2000),
        now_ms=NOW + 10,
    )
    assert r.run(busy) == "busy"
    assert r.run(busy) == "waiting"  # it has waited before
    assert queue.get(sched.occurrence_id(NOW + 2000)) is None  # it has not started: no successor
    assert _meta(queue, "s")["waiting"] == sched.occurrence_id(second)
    # It is handed back for later; the first one's outcome moves it to now.
    from delayq.leasing import release

    r.run(
        release(queue.core, [(sched.occurrence_id(second), t2)], dues=["+60000"], now_ms=NOW + 10)
    )
    r.run(
        cron_ops.outcomes(
            queue.core, [("s", sched.occurrence_id(first), "succeeded", "")], now_ms=NOW + 20
        )
    )
    assert queue.client.zscore(queue.core.keys.scheduled, sched.occurrence_id(second)) == NOW + 20
    meta = _meta(queue, "s")
    assert meta["last_status"] == "succeeded" and meta["running"] == {}


# -- workers ---------------------------------------------------------------------------------


def _until_half_second() -> None:
    """Start steps at x.5 s, half-way between every-second occurrences."""
    time.sleep((1.5 - time.time() % 1) % 1)


def test_catch_up_policies_after_all_workers_were_down_for_5_s(
    queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    policies = ("latest", "all", "skip")
    runs: dict[str, list[int]] = {p: [] for p in policies}
    lock = threading.Lock()

    def make_worker() -> Worker:
        w = Worker(queue, concurrency=8, lease=5)
        for p in policies:

            def record(task: Task, p: str = p) -> None:
                with lock:
                    runs[p].append(task.payload["at"])

            w.every(seconds=1, name=f"c-{p}", catch_up=p)(record)
        return w

    _until_half_second()
    with run_worker(make_worker()):
        wait_for(lambda: all(len(runs[p]) >= 2 for p in policies), timeout=5)
        _until_half_second()
    stopped = time.time()
    time.sleep(5 - (time.time() - stopped))  # all workers down for 5 s
    restarted = time.time()
    missed = list(range(math.ceil(stopped) * 1000, math.floor(restarted) * 1000 + 1, 1000))
    assert len(missed) == 5
    with run_worker(make_worker()):
        wait_for(lambda: all(max(runs[p]) > restarted * 1000 for p in policies), timeout=10)
        wait_for(lambda: set(missed) <= set(runs["all"]), timeout=10)
    for p in policies:
        assert len(runs[p]) == len(set(runs[p])), f"{p}: an occurrence ran twice"
    ran = {p: [a for a in runs[p] if missed[0] <= a <= missed[-1]] for p in policies}
    assert ran["all"] == missed  # every missed occurrence, once, in order
    assert ran["latest"] == [missed[-1]]  # once for the missed window: the latest
    assert ran["skip"] == []  # none


def test_max_running_1_delays_the_next_occurrence_until_the_previous_ends(
    queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    spans: list[tuple[int, float, float]] = []
    overlapping: list[float] = []
    worker = Worker(queue, concurrency=8, lease=5)

    @worker.every(seconds=1, name="slow", catch_up="all")
    async def slow(task: Task) -> None:
        import asyncio

        started = time.time()
        await asyncio.sleep(1.2)
        spans.append((task.payload["at"], started, time.time()))

    @worker.every(seconds=1, name="free", max_running=0)
    async def free(task: Task) -> None:
        import asyncio

        overlapping.append(time.time())
        await asyncio.sleep(1.4)

    with run_worker(worker):
        wait_for(lambda: len(spans) >= 3, timeout=15)
    ats = [a for a, _, _ in spans]
    assert ats == list(range(ats[0], ats[0] + 1000 * len(ats), 1000)), "delayed, none skipped"
    for (_, _, end), (_, start, _) in itertools.pairwise(spans):
        assert start >= end - 0.005, "never two at once"
        assert start - end < 0.3, "the next one starts as soon as the previous ends"
    # max_running=0: no limit, so runs of 1.2 s every second overlap.
    assert len(overlapping) >= 3
    assert all(b - a < 1.1 for a, b in itertools.pairwise(overlapping))


def test_start_up_creates_replaces_and_repairs_the_pending_occurrence(
    queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    def worker_with(minutes: int) -> Worker:
        w = Worker(queue, lease=5)
        w.every(minutes=minutes, name="report")(lambda t: None)
        w.schedules.tick_s = 0.2
        return w

    with run_worker(worker_with(60)):
        wait_for(lambda: _has(queue, "report"))
    pending = _meta(queue, "report")["next_id"]
    assert queue.get(pending).state == "scheduled"  # type: ignore[union-attr]
    with run_worker(worker_with(30)):  # the interval changed: replaced at start-up
        wait_for(lambda: _meta(queue, "report")["spec"] == "every 30m")
        replaced = _meta(queue, "report")["next_id"]
        assert replaced != pending or (occurrence_of(pending) or 0) % (30 * MIN) == 0
        if replaced != pending:
            # Checked now: once the chain below moves on, the new grid may create the same
            # id again (an hourly time is also a half-hourly one).
            assert queue.get(pending) is None
        # Cancel the pending occurrence: the periodic check continues the chain.
        assert queue.cancel(replaced)
        wait_for(lambda: _meta(queue, "report")["next_id"] != replaced, timeout=5)
        repaired = _meta(queue, "report")["next_id"]
        assert queue.get(repaired).state == "scheduled"  # type: ignore[union-attr]


# The injected fault raises after the wait's coroutine is made: it is never awaited.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_periodic_check_that_keeps_crashing_stops_the_worker(queue: Queue) -> None:
    """The periodic check runs under the worker's supervision like its other loops: one that
    keeps crashing (outside the check's own error handling) stops the worker with
    WorkerFailed, instead of dying silently while the worker serves on."""
    w = Worker(queue, lease=5)
    w.every(hours=1, name="report")(lambda t: None)
    w.supervisor.max_failures = 2
    w.supervisor.first_delay = 0.01
    w.schedules.tick_s = "not seconds"  # type: ignore[assignment]  # TypeError in its wait
    with pytest.raises(WorkerFailed, match="'cron' failed 2 times in a row"):
        await asyncio.wait_for(w.serve(), 20)
    assert _has(queue, "report")  # the start-up pass ran before the check's first wait


def test_a_schedule_no_live_worker_declares_is_parked_and_comes_back(
    queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    def worker_with(*names: str, grace: float = 120) -> Worker:
        w = Worker(queue, lease=5)
        for n in names:
            w.every(hours=1, name=n)(lambda t: None)
        w.schedules.tick_s = 0.2
        w.schedules.orphan_grace_s = grace
        return w

    old = run_worker(worker_with("keep", "gone"))
    old.__enter__()
    wait_for(lambda: _has(queue, "gone"))
    gone = _meta(queue, "gone")["next_id"]
    with run_worker(worker_with("keep", grace=0)):
        # "gone" is still declared by a live worker (another deployment, or the old version
        # in a rolling deploy): left alone.
        time.sleep(0.8)
        assert "parked" not in _meta(queue, "gone")
        assert queue.get(gone).state == "scheduled"  # type: ignore[union-attr]
        old.stop()  # its last declaring worker stops: parked at the next check
        wait_for(lambda: "parked" in _meta(queue, "gone"), timeout=5)
        assert queue.get(gone) is None
        assert "parked" not in _meta(queue, "keep")
        result = CliRunner().invoke(main, ["cron", "list", "-q", queue.name, "--url", queue.url])
        assert "parked: no live worker declares it" in result.output
    with run_worker(worker_with("keep", "gone")):  # declared again: its occurrence is back
        wait_for(lambda: "parked" not in _meta(queue, "gone"))
        assert _meta(queue, "gone")["next_id"] == gone
        assert queue.get(gone).state == "scheduled"  # type: ignore[union-attr]


def _has(queue: Queue, name: str) -> bool:
    return bool(queue.client.hexists(queue.core.keys.cron, name))


def test_cron_list_shows_next_last_and_outcome_and_remove_forgets(
    queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    worker = Worker(queue, lease=5)

    @worker.cron("* * * * *", tz="Asia/Shanghai", name="minutely")
    def minutely(task: Task) -> None: ...

    @worker.every(seconds=1, name="broken", max_attempts=1)
    def broken(task: Task) -> None:
        raise ValueError("boom")

    with run_worker(worker):
        wait_for(
            lambda: _has(queue, "broken") and _meta(queue, "broken").get("last_status") == "dead"
        )
    cli = CliRunner()
    out = cli.invoke(main, ["cron", "list", "--queue", queue.name, "--url", queue.url])
    assert out.exit_code == 0, out.output
    lines = out.output.splitlines()
    assert lines[0].split() == ["NAME", "SCHEDULE", "NEXT", "RUN", "LAST", "RUN", "OUTCOME", "NOTE"]
    assert any(ln.startswith("broken") and "dead: ValueError: boom" in ln for ln in lines)
    assert any(
        ln.startswith("minutely") and "* * * * * (Asia/Shanghai)" in ln and "+0800" in ln
        for ln in lines
    )
    data = json.loads(
        cli.invoke(main, ["cron", "list", "-q", queue.name, "--url", queue.url, "--json"]).output
    )
    by_name = {d["name"]: d for d in data}
    assert by_name["broken"]["last_status"] == "dead" and by_name["broken"]["next_at"]
    assert (
        by_name["minutely"]["spec"] == "* * * * *" and by_name["minutely"]["tz"] == "Asia/Shanghai"
    )
    pending = _meta(queue, "minutely")["next_id"]
    out = cli.invoke(main, ["cron", "remove", "minutely", "-q", queue.name, "--url", queue.url])
    assert out.exit_code == 0, out.output
    assert not _has(queue, "minutely") and queue.get(pending) is None
    out = cli.invoke(main, ["cron", "list", "--url", queue.url])
    assert out.exit_code != 0 and "--queue" in out.output


@pytest.mark.slow
def test_three_processes_fire_every_occurrence_once_and_on_time(
    queue: Queue, server: Any, spawn_worker: Callable[..., Any]
) -> None:
    env = {"DQ_QUEUE": queue.name, "DELAYQ_REDIS_URL": server.url}
    procs = [spawn_worker("tests.support.apps.cron_app:worker", env) for _ in range(3)]
    side = redis.Redis.from_url(server.url)
    wait_for(lambda: sum(w.alive for w in queue.workers()) == 3, timeout=20)
    window_start = (int(time.time()) + 1) * 1000
    window_end = window_start + 10_000
    time.sleep((window_end - time.time() * 1000) / 1000 + 0.3)
    for p in procs:
        p.kill(15)
    for p in procs:
        assert p.wait(20) == 0, p.output()
    runs = [json.loads(r) for r in side.lrange(runs_key(queue.name), 0, -1)]
    side.close()
    ids = [r["id"] for r in runs]
    assert len(ids) == len(set(ids)), "an occurrence ran twice"
    window = sorted(
        (r for r in runs if window_start <= r["at"] < window_end), key=lambda r: r["at"]
    )
    assert [r["at"] for r in window] == list(range(window_start, window_end, 1000))
    late_ms = sorted((r["start"] * 1000 - r["at"]) for r in window)
    p95 = late_ms[math.ceil(0.95 * len(late_ms)) - 1]
    per_process = sorted(Counter(r["pid"] for r in window).values())
    print(
        f"\nlateness ms over {len(late_ms)} runs: min {late_ms[0]:.2f} p95 {p95:.2f} "
        f"max {late_ms[-1]:.2f}; runs per process {per_process}"
    )
    assert late_ms[0] >= -1, "started before its time"
    # Typically 1.5-4 ms (the start script's round trip included). Only a sanity bound here:
    # the suite runs on two processes of a small shared machine (a median of 13 ms was seen
    # under load); how late is measured by bench/run lateness, not asserted by a test.
    assert late_ms[len(late_ms) // 2] < 100 and late_ms[-1] < 1000, late_ms


def test_an_aborted_occurrence_is_shown_as_aborted_and_the_chain_goes_on(
    queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    def worker() -> Worker:
        w = Worker(queue, lease=5)
        w.every(hours=1, name="hourly")(lambda t: None)
        w.schedules.tick_s = 0.2
        return w

    with run_worker(worker()):
        wait_for(lambda: _has(queue, "hourly"))
    first = _meta(queue, "hourly")
    assert queue.abort(first["next_id"]) is True  # waiting: aborted, so never run
    result = CliRunner().invoke(main, ["cron", "list", "-q", queue.name, "--url", queue.url])
    assert "next occurrence aborted" in result.output, result.output
    assert "missing" not in result.output
    with run_worker(worker()):  # its next check schedules the occurrence after it
        wait_for(lambda: _meta(queue, "hourly")["next_id"] != first["next_id"], timeout=5)
    nxt = _meta(queue, "hourly")
    assert nxt["next"] > first["next"]
    assert queue.get(nxt["next_id"]).state == "scheduled"  # type: ignore[union-attr]
    assert queue.get(first["next_id"]).state == "aborted"  # type: ignore[union-attr]
