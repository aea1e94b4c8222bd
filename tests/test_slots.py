"""A run's slot, its place in its kind's count, its lease and its abort, on a real server, as
a user meets them (issue 28: findings 1, 4 and 5, and outcomes routed to the shard a task
came from). The table behind them is tested row by row in tests/unit/test_run_states.py."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextlib import ExitStack
from typing import Any

import pytest
import redis
from prometheus_client import CollectorRegistry

from delayq import Queue, Task, TaskSpec, Worker
from delayq.admin.metrics import WorkerMetrics
from delayq.codec import encode_record
from delayq.keys import shard_of

from .support.helpers import wait_for


class Most:
    """How many handlers of a kind run at once, now and at most (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.ran: list[tuple[str, int]] = []  # (task id, attempt) of each run begun

    def begin(self, task: Task) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.ran.append((task.id, task.attempt))

    def end(self) -> None:
        with self.lock:
            self.now -= 1


# -- finding 1: tasks claimed ahead while the handlers hang ---------------------------------


def test_tasks_claimed_ahead_go_to_an_idle_worker_while_this_ones_handlers_hang(
    queue: Queue, run_worker: Any
) -> None:
    """A worker whose handlers turned slow after it claimed ahead hands what it claimed back
    within about a second, though no slot ever frees: another worker runs it."""
    hang = threading.Event()
    ran_by: dict[str, str] = {}

    def worker(name: str, concurrency: int) -> Worker:
        w = Worker(queue, concurrency=concurrency)

        @w.handler("quick")
        async def quick(task: Task) -> None:
            ran_by[task.id] = name

        @w.handler("hang")
        def hang_(task: Task) -> None:
            hang.wait(60)

        return w

    a, b = worker("a", 2), worker("b", 4)
    with ExitStack() as stack:
        stack.enter_context(run_worker(a))
        stack.callback(hang.set)  # (before a stops: its grace would wait for the hangs)
        # Quick handlers seen: a claims ahead (Runs.allowance).
        queue.schedule_many(TaskSpec("quick", i) for i in range(200))
        wait_for(lambda: len(ran_by) == 200, timeout=10)
        assert a.engine is not None and a.engine.runs.allowance() > 100
        ran_by.clear()
        hangs = queue.schedule_many(TaskSpec("hang", i, delay=0.3) for i in range(2))
        quick = queue.schedule_many(TaskSpec("quick", i, delay=0.305) for i in range(100))
        wait_for(lambda: queue.stats().active == 102, timeout=5)  # all held by a
        started = time.monotonic()
        stack.enter_context(run_worker(b))
        wait_for(lambda: len(ran_by) == 100, timeout=10)
        took = time.monotonic() - started
        assert set(ran_by.values()) == {"b"} and set(ran_by) == set(quick)
        assert took < 5, took
        assert [queue.get(h).state for h in hangs] == ["active", "active"]
        hang.set()
        wait_for(lambda: queue.stats().done == 302, timeout=10)
    assert queue.stats().counters.get("released", 0) >= 1


# -- finding 4: a kind's cap while sync handlers run on -------------------------------------


def test_a_kinds_cap_holds_while_sync_handlers_run_past_their_timeout(
    queue: Queue, run_worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """``concurrency=1`` for a kind whose first attempts run on past their timeout: the retry
    is written at the timeout, but the slot and the kind's place stay taken until the thread
    returns, so no two of its handlers ever run at once. A metric and a log line show it."""
    most = Most()
    registry = CollectorRegistry()
    worker = Worker(queue, concurrency=4)
    worker.add_listener(WorkerMetrics(registry))

    @worker.handler("slow", concurrency=1, timeout=0.2, backoff=[0.05], max_attempts=5)
    def slow(task: Task) -> None:
        most.begin(task)
        try:
            if task.attempt == 1:
                time.sleep(1.0)  # past its timeout, not cooperative
        finally:
            most.end()

    def overrunning() -> float:
        value = registry.get_sample_value(
            "delayq_sync_handlers_overrunning", {"queue": queue.name, "kind": "slow"}
        )
        return value or 0.0

    caplog.set_level(logging.INFO, "delayq.worker")
    with run_worker(worker):
        ids = queue.schedule_many(TaskSpec("slow", i) for i in range(3))
        wait_for(lambda: overrunning() == 1, timeout=5)
        assert most.now == 1
        wait_for(lambda: queue.stats().done == 3, timeout=20)
    assert most.most == 1, most.ran
    assert sorted(most.ran) == sorted((i, a) for i in ids for a in (1, 2))
    assert overrunning() == 0
    assert "runs on past its timeout of 0.2 s" in caplog.text
    assert "returned" in caplog.text


def test_a_kinds_cap_holds_while_a_sync_handler_whose_lease_was_lost_runs_on(
    queue: Queue, run_worker: Any
) -> None:
    """The lease of a running sync handler is lost (here it is expired by hand, as a stalled
    worker's would be): the run stops, but its thread runs on, and until it returns the
    kind's one place is not given to the next task, nor to the task run again."""
    most = Most()
    worker = Worker(queue, concurrency=4, lease=1)

    @worker.handler("slow", concurrency=1)
    def slow(task: Task) -> None:
        most.begin(task)
        try:
            if task.attempt == 1:
                time.sleep(1.5)
        finally:
            most.end()

    r = redis.Redis.from_url(queue.url)
    with run_worker(worker):
        first = queue.schedule("slow", 0)
        wait_for(lambda: most.now == 1, timeout=5)
        queue.schedule("slow", 1)
        r.zadd(queue.core.keys.active, {first: 1})  # its lease ended long ago
        wait_for(lambda: queue.stats().done == 2, timeout=20)
    r.close()
    assert most.most == 1, most.ran
    assert (first, 2) in most.ran  # it ran again once its lease was lost


def test_a_kinds_cap_holds_while_an_aborted_sync_handler_runs_on(
    queue: Queue, run_worker: Any
) -> None:
    most = Most()
    worker = Worker(queue, concurrency=4)

    @worker.handler("slow", concurrency=1)
    def slow(task: Task) -> None:
        most.begin(task)
        try:
            if task.payload == 0:
                time.sleep(1.0)  # ignores task.aborted
        finally:
            most.end()

    with run_worker(worker):
        first = queue.schedule("slow", 0)
        wait_for(lambda: most.now == 1, timeout=5)
        queue.schedule("slow", 1)
        assert queue.abort(first)
        wait_for(lambda: queue.stats().done == 1, timeout=10)
    assert most.most == 1, most.ran
    assert queue.get(first).state == "aborted"


# -- finding 5: an abort heard before its claim becomes a run -------------------------------


def test_an_abort_heard_before_the_claim_reply_is_processed_stops_the_task(
    queue: Queue, run_worker: Any
) -> None:
    """The abort's message arrives while the claim that took the task is still on its way
    to Runs: the handler never starts."""
    ran: list[str] = []
    heard: list[str] = []
    worker = Worker(queue)

    @worker.handler("k")
    async def k(task: Task) -> None:
        ran.append(task.id)

    async def hold_the_claim(w: Worker) -> None:
        # The claim's tasks reach Runs only once the abort of one of them has been heard.
        engine = w.engine
        assert engine is not None
        runs, waker = engine.runs, engine.waker
        start_many, on_abort = runs.start_many, waker.on_abort
        assert on_abort is not None

        def abort_heard(task_id: str, token: int) -> None:
            heard.append(task_id)
            on_abort(task_id, token)

        async def later(args: tuple[Any, ...]) -> None:
            if not args[1]:
                start_many(*args)
                return
            victim = args[1][0].id
            assert await asyncio.to_thread(queue.abort, victim)
            for _ in range(500):
                if victim in heard:
                    break
                await asyncio.sleep(0.01)
            start_many(*args)

        def held(*args: Any) -> None:
            asyncio.get_running_loop().create_task(later(args))

        runs.start_many = held  # type: ignore[method-assign]
        waker.on_abort = abort_heard

    worker.on_startup(hold_the_claim)
    with run_worker(worker):
        victim = queue.schedule("k", 1)
        wait_for(lambda: heard == [victim], timeout=10)
        time.sleep(0.3)
    assert ran == []
    assert queue.get(victim).state == "aborted"


# -- found since: outcomes and leases go to the shard the task came from ----------------


def test_a_record_written_on_a_shard_its_id_does_not_hash_to_runs_once(
    server: Any, qname: str, run_worker: Any
) -> None:
    """Another program writes a valid record onto shard 1 of a 2-shard queue, under an id
    that hashes to shard 0. The worker claims it from shard 1; its heartbeat and its ack go
    there too, so it runs once and is done, instead of losing its lease every beat."""
    queue = Queue(qname, url=server.url, shards=2, dedupe_window=3600)
    queue.stats()  # stores the shard count
    tid = next(f"stray-{i}" for i in range(100) if shard_of(f"stray-{i}", 2) == 0)
    keys = queue.shards.cores[1].keys
    r = redis.Redis.from_url(server.url)
    now_ms = int(r.time()[0]) * 1000
    r.hset(keys.tasks, tid, encode_record("k", b"1", max_attempts=5, created_ms=now_ms, fmt="json"))
    r.zadd(keys.scheduled, {tid: now_ms})
    runs: list[int] = []
    worker = Worker(queue, lease=1)

    @worker.handler("k")
    async def k(task: Task) -> None:
        runs.append(task.attempt)
        await asyncio.sleep(1.5)  # past the lease: the heartbeat must extend it

    try:
        with run_worker(worker):
            wait_for(lambda: r.zscore(keys.done, tid) is not None, timeout=10)
            time.sleep(1.5)
        assert runs == [1]
        assert r.zscore(keys.active, tid) is None
    finally:
        r.close()
        queue.close()
