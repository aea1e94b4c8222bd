"""The dashboard's history (delayq/history.py, lua/lib/history.lua) on a real server: what a
worker's outcomes write into the current minute, summed over shards, and the window's bound
(old minutes trimmed, the key expiring)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from delayq import Fail, Queue, Retry, TaskSpec, Worker, leasing
from delayq.admin import Admin
from delayq.embedded import EmbeddedServer
from delayq.history import SPAN_MS, bucket, history_of, span_of, upper_edge
from delayq.runner import SyncRunner

from .conftest import WorkerThread
from .support.helpers import wait_for

MINUTE = 60_000
T0 = 29_000_000 * MINUTE  # a minute boundary (ms), in 2025


@pytest.mark.parametrize("shards", [1, 3])
def test_a_worker_s_outcomes_are_counted_in_the_minute_they_are_written(
    server: EmbeddedServer,
    qname: str,
    shards: int,
    run_worker: Callable[[Worker], WorkerThread],
) -> None:
    """10 tasks succeed, 3 fail once and then succeed, 2 fail for good: the history of the
    minutes the test ran in says 13 done, 3 retried, 2 dead, 18 starts, whatever the shard
    each task landed on."""
    with Queue(qname, url=server.url, shards=shards) as queue:
        failed: set[str] = set()
        worker = Worker(queue, concurrency=8, lease=10)

        @worker.handler("ok")
        def ok(task: Any) -> None:
            return None

        @worker.handler("flaky")
        def flaky(task: Any) -> None:
            if task.id not in failed:
                failed.add(task.id)
                raise Retry(after=0.05)

        @worker.handler("bad")
        def bad(task: Any) -> None:
            raise Fail("card declined")

        start = time.time() // 60
        queue.schedule_many(
            [TaskSpec("ok", {"i": i}) for i in range(10)]
            + [TaskSpec("flaky", {"i": i}) for i in range(3)]
            + [TaskSpec("bad", {"i": i}) for i in range(2)]
        )
        with run_worker(worker):
            wait_for(lambda: (s := queue.stats()).done == 13 and s.dead == 2)
            wait_for(lambda: queue.stats().active == 0)
        end = time.time() // 60
        with Admin(server.url, queues=[qname]) as admin:
            history = admin.history(qname)
    assert history.now_ms // MINUTE == end
    assert history.minutes and all(start <= m.minute <= end for m in history.minutes)
    total = history.bars(1, int(end - start) + 1)
    got = [(m.succeeded, m.retried, m.dead, m.started) for m in total]
    assert (sum(g[0] for g in got), sum(g[1] for g in got), sum(g[2] for g in got)) == (13, 3, 2)
    assert sum(g[3] for g in got) == 18  # each attempt's start lateness, retries too
    now = history.get(int(end))
    assert now.done + now.retried + now.dead > 0 or end > start
    for m in history.minutes:
        p50, p99 = m.percentile(50), m.percentile(99)
        assert p50 is not None and p99 is not None and 0 < p50 <= p99 < 60


def _claim_all(run: SyncRunner, queue: Queue, now: int) -> list[tuple[str, int]]:
    got = run.run(leasing.claim(queue.core, limit=100, lease_ms=7_200_000, now_ms=now)).tasks
    return [(c.id, c.token) for c in got]


def test_outcomes_land_in_their_minute_with_their_lateness(
    server: EmbeddedServer, qname: str
) -> None:
    """The scripts alone, as of given times: ack, retry and bury each count in the minute of
    their ``now``, in the hash of its ten minutes, a refused lease counts nothing, and the batch's
    lateness is added to the minute's histogram."""
    with Queue(qname, url=server.url) as queue:
        run = SyncRunner(queue.client)
        queue.schedule_many([TaskSpec("k", {"i": i}, at=T0 / 1000 - 60) for i in range(6)])
        held = _claim_all(run, queue, T0)
        assert len(held) == 6
        now = T0 + 1500
        run.run(leasing.ack(queue.core, held[:2], lateness=[0.0003, 0.002], now_ms=now))
        run.run(leasing.ack(queue.core, held[:1], lateness=[0.0003], now_ms=now))  # refused
        run.run(leasing.ack(queue.core, held[2:3], discarded=True, now_ms=now))
        retry = [(held[3][0], held[3][1], "+1000", "boom")]
        run.run(leasing.retry(queue.core, retry, lateness=[0.5], now_ms=now))
        bury = [(i, t, "dead") for i, t in held[4:]]
        run.run(leasing.bury(queue.core, bury, lateness=[0.5, -1.0], now_ms=now + MINUTE))
        first = T0 // MINUTE
        span = span_of(T0)
        assert span == first  # (T0 begins ten minutes)
        key = queue.core.keys.history(span)
        assert key == f"dq:{{{qname}}}:history:{span}"
        fast, ms, slow = bucket(0.0003), bucket(0.002), bucket(0.5)
        assert queue.client.hgetall(key) == {
            f"{first}:{f}".encode(): str(n).encode()
            for f, n in [("s", 2), (fast, 1), (ms, 1), ("d", 1), ("r", 1), (slow, 1)]
        } | {f"{first + 1}:x".encode(): b"2", f"{first + 1}:{slow}".encode(): b"1"}
        # Kept to the end of its ten minutes, then the window (24 h by default); set again
        # by the bury, the first dead of its minute.
        expected = T0 + SPAN_MS - (now + MINUTE) + 24 * 3_600_000
        assert expected - 5000 < queue.client.pttl(key) <= expected
        h = history_of(now, [queue.client.hgetall(key)])
        m = h.get(first)
        assert (m.done, m.succeeded, m.discarded, m.retried, m.dead) == (3, 2, 1, 1, 0)
        # 3 starts: 0.3 ms, 2 ms, 0.5 s; each percentile is its bucket's upper bound.
        assert m.started == 3
        assert upper_edge(fast) == pytest.approx(0.0004)
        assert upper_edge(ms) == pytest.approx(0.0032)
        assert upper_edge(slow) == pytest.approx(0.8192)
        assert m.percentile(33) == upper_edge(fast)
        assert m.percentile(50) == upper_edge(ms)
        assert m.percentile(99) == upper_edge(slow)
        assert h.get(first + 1).dead == 2 and h.get(first + 1).started == 1


def test_the_window_bounds_the_history(server: EmbeddedServer, qname: str) -> None:
    """history_window=1 s, written 0.6 s before its ten minutes end: its hash is kept 1.6 s,
    then gone; a write in the next ten minutes goes to their hash; history_window=0 writes
    nothing."""
    with Queue(qname, url=server.url, history_window=1) as queue:
        run = SyncRunner(queue.client)
        queue.schedule_many([TaskSpec("k", {"i": i}, at=T0 / 1000 - 60) for i in range(2)])
        held = _claim_all(run, queue, T0)
        end = T0 + SPAN_MS
        run.run(leasing.ack(queue.core, held[:1], lateness=[0.001], now_ms=end - 600))
        run.run(leasing.ack(queue.core, held[1:], lateness=[0.001], now_ms=end + 10))
        old, new = (queue.core.keys.history(span_of(t)) for t in (T0, end))
        assert 1000 < queue.client.pttl(old) <= 1600
        assert 600_000 < queue.client.pttl(new) <= 600_990
        wait_for(lambda: not queue.client.exists(old), timeout=5)
        assert queue.client.hget(new, f"{end // MINUTE}:s") == b"1"
    with Queue(qname + "-none", url=server.url, history_window=0) as queue:
        run = SyncRunner(queue.client)
        queue.schedule("k", {}, at=T0 / 1000 - 60)
        run.run(leasing.ack(queue.core, _claim_all(run, queue, T0), lateness=[0.1], now_ms=T0))
        assert queue.stats().done == 1
        assert not queue.client.exists(queue.core.keys.history(span_of(T0)))


def test_a_history_window_over_a_week_is_refused(server: EmbeddedServer, qname: str) -> None:
    from delayq.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="history_window is at most 7 days"):
        Queue(qname, url=server.url, history_window=8 * 86400)
