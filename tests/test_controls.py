"""Admission controls end to end, with real workers: a queue-wide rate limit, pause and
resume (cron included), per-kind concurrency, and what bad input gets."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from datetime import datetime, timedelta
from typing import Any

import pytest
import redis

from delayq import AsyncQueue, Queue, Task, TaskSpec, Worker
from delayq.controls import RateLimit
from delayq.errors import ConfigurationError
from delayq.testing import VirtualClock, drain

from .support.helpers import wait_for

LOOKAHEAD = 0.02  # the worker's default


def evalsha_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


class Starts:
    """What the handlers started: when (monotonic), and how often each id."""

    def __init__(self, expect: int) -> None:
        self.times: list[float] = []
        self.ids: Counter[str] = Counter()
        self.expect = expect
        self.all = threading.Event()
        self.lock = threading.Lock()

    def add(self, task: Task) -> None:
        with self.lock:
            self.times.append(time.monotonic())
            self.ids[task.id] += 1
            if len(self.times) >= self.expect:
                self.all.set()

    def after(self, t: float) -> int:
        with self.lock:
            return sum(1 for s in self.times if s > t)


# -- rate limit -----------------------------------------------------------------------------


def test_a_rate_limit_spreads_a_burst_and_a_throttled_worker_stays_cheap(
    queue: Queue, run_worker: Any
) -> None:
    """1,000 tasks due at one instant, 100/s (burst 100): at least 9 s, each run once; while
    throttled the worker claims about every THROTTLE_STEP_S, not in a tight loop."""
    assert queue.set_rate_limit("100/s") == RateLimit("100/s", 100.0, 100)
    worker = Worker(queue, concurrency=32)
    starts = Starts(1000)

    @worker.handler("k")
    async def handle(task: Task) -> None:
        starts.add(task)

    meter = redis.Redis.from_url(queue.url)
    try:
        with run_worker(worker):
            time.sleep(0.3)  # serving, idle
            t0 = time.monotonic()
            ids = [str(s) for s in queue.schedule_many([TaskSpec("k", i) for i in range(1000)])]
            time.sleep(1.5)  # past the burst: throttled from here on
            calls0, m0 = evalsha_calls(meter), time.monotonic()
            assert starts.all.wait(30), f"only {len(starts.times)} ran"
            calls1, m1 = evalsha_calls(meter), time.monotonic()
    finally:
        meter.close()
    elapsed = max(starts.times) - t0
    assert elapsed >= 9.0, elapsed
    assert elapsed < 15.0, elapsed  # and not much slower than the limit
    assert sorted(starts.ids) == sorted(ids) and set(starts.ids.values()) == {1}
    # Every script call of the throttled period (claims, acks, the heartbeat): refills come
    # 100 a second, claims at most 1 / THROTTLE_STEP_S = 20 a second, each followed by an ack.
    per_s = (calls1 - calls0) / (m1 - m0)
    print(f"throttled worker: {per_s:.1f} script calls/s over {m1 - m0:.1f} s")
    assert per_s <= 2 * (20 + 20), per_s


def test_a_rate_limit_on_a_sharded_queue(server: Any, qname: str, run_worker: Any) -> None:
    """Each of 4 shards gets 25/s and a burst of 25: 400 tasks take at least 3 s."""
    queue = Queue(qname, url=server.url, shards=4)
    try:
        queue.set_rate_limit("100/s")
        worker = Worker(queue, concurrency=32)
        starts = Starts(400)
        worker.handler("k")(starts.add)
        with run_worker(worker):
            t0 = time.monotonic()
            ids = [str(s) for s in queue.schedule_many([TaskSpec("k", i) for i in range(400)])]
            assert starts.all.wait(30), f"only {len(starts.times)} ran"
        elapsed = max(starts.times) - t0
        assert 3.0 <= elapsed < 12.0, elapsed
        assert sorted(starts.ids) == sorted(ids) and set(starts.ids.values()) == {1}
    finally:
        queue.close()


# -- pause and resume -----------------------------------------------------------------------


def _pause_under_load(queue: Queue, run_worker: Any, n: int) -> None:
    worker = Worker(queue, concurrency=8)
    starts = Starts(n)

    @worker.handler("k")
    async def handle(task: Task) -> None:
        starts.add(task)
        await asyncio.sleep(0.01)

    with run_worker(worker):
        ids = [str(s) for s in queue.schedule_many([TaskSpec("k", i) for i in range(n)])]
        wait_for(lambda: len(starts.times) >= 50)
        queue.pause()
        paused_at = time.monotonic()
        assert queue.paused()
        time.sleep(1.5)
        # A claim answered before the pause may still start its tasks, within the lookahead
        # (and the time for its reply to reach a busy worker on a loaded machine): none after.
        late = starts.after(paused_at + LOOKAHEAD + 0.3)
        assert late == 0, f"{late} started while paused"
        ran = len(starts.times)
        assert ran < n and queue.stats().scheduled > 0
        queue.resume()
        assert starts.all.wait(30), f"only {len(starts.times)} of {n} ran"
    assert sorted(starts.ids) == sorted(ids) and set(starts.ids.values()) == {1}


def test_nothing_starts_while_paused_and_everything_runs_once_after(
    queue: Queue, run_worker: Any
) -> None:
    _pause_under_load(queue, run_worker, 1500)


def test_pause_on_a_sharded_queue(server: Any, qname: str, run_worker: Any) -> None:
    queue = Queue(qname, url=server.url, shards=4)
    try:
        _pause_under_load(queue, run_worker, 1500)
    finally:
        queue.close()


@pytest.mark.parametrize("shards", [1, 4])
def test_an_idle_worker_starts_within_a_second_of_resume(
    server: Any, qname: str, run_worker: Any, shards: int
) -> None:
    """A long max_wait: only resume's wake-up can make the worker look in time."""
    queue = Queue(qname, url=server.url, shards=shards)
    try:
        queue.pause()
        worker = Worker(queue, max_wait=30)
        starts = Starts(4)
        worker.handler("k")(starts.add)
        with run_worker(worker):
            queue.schedule_many([TaskSpec("k", i) for i in range(4)])
            time.sleep(1.0)
            assert starts.times == []
            queue.resume()
            resumed = time.monotonic()
            assert starts.all.wait(5)
            assert max(starts.times) - resumed < 1.0, max(starts.times) - resumed
    finally:
        queue.close()


def test_cron_occurrences_missed_while_paused_follow_the_catch_up_policy(
    queue: Queue, run_worker: Any
) -> None:
    """A pause is an outage to a schedule: with catch_up="latest" the occurrences that fell
    due meanwhile run once, as the latest, at resume."""
    worker = Worker(queue, max_wait=30)
    runs: list[tuple[float, int]] = []  # (monotonic start, occurrence ms)

    @worker.every(seconds=1, name="tick", catch_up="latest")
    def tick(task: Task) -> None:
        runs.append((time.monotonic(), task.payload["at"]))

    with run_worker(worker):
        wait_for(lambda: len(runs) >= 1, timeout=5)
        queue.pause()
        paused_at = time.monotonic()
        time.sleep(3.5)
        assert [r for r in runs if r[0] > paused_at + LOOKAHEAD + 0.3] == []
        before = len(runs)
        queue.resume()
        resumed, resumed_ms = time.monotonic(), time.time() * 1000
        wait_for(lambda: len(runs) > before, timeout=2)
        time.sleep(0.5)
    missed = [r for r in runs[before:] if r[1] <= resumed_ms]
    # One run for the missed window, at once, covering the latest due occurrence; then the
    # schedule goes on.
    assert len(missed) == 1, runs
    assert missed[0][0] - resumed < 1.0
    assert resumed_ms - 1100 <= missed[0][1], (missed, resumed_ms)


# -- per-kind concurrency -------------------------------------------------------------------


class Gauge:
    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.ran = 0

    def __enter__(self) -> None:
        self.now += 1
        self.ran += 1
        self.most = max(self.most, self.now)

    def __exit__(self, *exc: object) -> None:
        self.now -= 1


def _capped_worker(queue: Queue, pdf: Gauge, mails: list[float], ids: Counter[str]) -> Worker:
    worker = Worker(queue, concurrency=8)

    @worker.handler("pdf.render", concurrency=2)
    async def render(task: Task) -> None:
        ids[task.id] += 1
        with pdf:
            await asyncio.sleep(0.5)

    @worker.handler("mail")
    async def mail(task: Task) -> None:
        ids[task.id] += 1
        mails.append(time.monotonic())

    return worker


def test_a_kind_with_a_concurrency_never_holds_more_and_others_flow(
    queue: Queue, run_worker: Any
) -> None:
    first, second = Gauge(), Gauge()
    mails: list[float] = []
    ids: Counter[str] = Counter()
    w1 = _capped_worker(queue, first, mails, ids)
    w2 = _capped_worker(queue, second, mails, ids)
    with run_worker(w1):
        t0 = time.monotonic()
        specs = [TaskSpec("pdf.render", i) for i in range(12)]
        specs += [TaskSpec("mail", i) for i in range(200)]
        scheduled = [str(s) for s in queue.schedule_many(specs)]
        # Alone, the first worker runs two pdfs at a time (12 take it 3 s), and every mail
        # meanwhile.
        wait_for(lambda: len(mails) == 200, timeout=5)
        assert max(mails) - t0 < 2.0
        with run_worker(w2):  # takes the pdfs the first could not start
            wait_for(lambda: first.ran + second.ran == 12, timeout=10)
            wait_for(lambda: queue.stats().active == 0, timeout=5)
    assert first.most == 2 and second.most == 2
    assert second.ran >= 2, (first.ran, second.ran)
    assert sorted(ids) == sorted(scheduled) and set(ids.values()) == {1}


# -- the async API and bad input --------------------------------------------------------------


async def test_the_async_queue_has_the_same_controls(aqueue: AsyncQueue) -> None:
    assert await aqueue.rate_limit() is None and not await aqueue.paused()
    assert await aqueue.set_rate_limit("30/m", 5) == RateLimit("30/m", 0.5, 5)
    assert await aqueue.rate_limit() == RateLimit("30/m", 0.5, 5)
    assert await aqueue.pause() and await aqueue.paused()
    assert await aqueue.resume() and not await aqueue.paused()
    await aqueue.clear_rate_limit()
    assert (await aqueue.controls()).limit is None


@pytest.mark.parametrize(
    "rate", ["100", "100/d", "abc", "-5/s", "0/s", "1e3/s", "", None, 100, "100 per s"]
)
def test_a_bad_rate_names_the_accepted_forms_and_writes_nothing(queue: Queue, rate: Any) -> None:
    with pytest.raises(ConfigurationError, match=r'"N/s", "N/m" or "N/h"|above 0'):
        queue.set_rate_limit(rate)
    assert queue.rate_limit() is None


@pytest.mark.parametrize("burst", [0, -1, 1.5, True, "10"])
def test_a_bad_burst_is_refused(queue: Queue, burst: Any) -> None:
    with pytest.raises(ConfigurationError, match="burst must be a whole number from 1"):
        queue.set_rate_limit("10/s", burst)
    assert queue.rate_limit() is None


def test_the_default_burst_is_a_second_of_tasks_and_at_least_one(queue: Queue) -> None:
    assert queue.set_rate_limit("2.5/s").burst == 3
    assert queue.set_rate_limit("10/h").burst == 1
    assert queue.rate_limit() == RateLimit("10/h", 10 / 3600, 1)


@pytest.mark.parametrize("concurrency", [0, -1, 2.5, True, 17])
def test_a_bad_kind_concurrency_is_refused(queue: Queue, concurrency: Any) -> None:
    worker = Worker(queue, concurrency=16)
    match = (
        r"concurrency must be a whole number from 1 to 16 \(the worker's concurrency\), for 'pdf'"
    )
    with pytest.raises(ConfigurationError, match=match):
        worker.handler("pdf", concurrency=concurrency)
    worker.handler("pdf", concurrency=16)(lambda task: None)
    with pytest.raises(ConfigurationError, match="worker's concurrency"):
        worker.configure(concurrency=8)  # below the kind's


def test_a_refused_configure_leaves_the_worker_as_it_was(queue: Queue) -> None:
    worker = Worker(queue, concurrency=16)
    worker.handler("pdf", concurrency=12)(lambda task: None)
    with pytest.raises(ConfigurationError, match="worker's concurrency"):
        worker.configure(concurrency=8, lease=60)
    assert worker.concurrency == 16  # nothing half-applied
    with pytest.raises(ConfigurationError, match="lease"):
        worker.configure(concurrency=12, lease=0.5)
    assert worker.concurrency == 16
    worker.configure(concurrency=12)
    assert worker.concurrency == 12


def test_drain_in_virtual_time_follows_the_rate_limit(server: Any, qname: str) -> None:
    """drain() moves the virtual clock to the next token, not a millisecond at a time."""
    clock = VirtualClock()
    with Queue(qname, url=server.url, clock=clock) as queue:
        queue.set_rate_limit("1/h")
        worker = Worker(queue)
        seen: list[datetime] = []
        worker.handler("k")(lambda task: seen.append(clock.now()))
        queue.schedule_many([TaskSpec("k", i) for i in range(3)])
        start = clock.now()
        assert len(drain(worker, until=start + timedelta(hours=2, minutes=1)).ran) == 3
        assert [round((t - start).total_seconds()) for t in seen] == [0, 3600, 7200]
        assert queue.pause() and drain(worker, until=start + timedelta(hours=9)).ran == []
