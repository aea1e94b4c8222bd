"""Network faults between the worker and Redis, through an in-test TCP proxy: connections
reset mid-run and a black-holed link. Nothing acknowledged is lost; the worker recovers by
itself."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from delayq import Queue, Task, Worker

from .support.helpers import wait_for
from .support.proxy import FaultProxy

pytestmark = pytest.mark.slow


def test_connection_resets_during_claims_and_acks_lose_nothing(
    queue: Queue, server: Any, run_worker: Any
) -> None:
    runs: Counter[str] = Counter()
    lock = threading.Lock()
    with FaultProxy(server.port) as proxy:
        worker = Worker(Queue(queue.name, url=proxy.url), concurrency=8, lease=2)

        @worker.handler("k")
        def k(task: Task) -> None:
            with lock:
                runs[task.id] += 1
            time.sleep(0.005)

        ids = queue.schedule_many(
            [{"kind": "k", "payload": i, "delay": 0.2 + i / 200} for i in range(400)]
        )
        with run_worker(worker):
            for _ in range(6):  # resets spread over the ~2 s the tasks fall due in
                time.sleep(0.3)
                proxy.reset_all()
            wait_for(lambda: queue.stats().done == 400, timeout=60)
    assert set(runs) == set(ids)  # every task ran
    stats = queue.stats()
    assert (stats.scheduled, stats.active, stats.dead) == (0, 0, 0)
    # At-least-once: a task may run again only if its result was cut off in flight.
    assert sum(runs.values()) - len(ids) <= 6 * 8


def test_a_black_holed_link_costs_a_lease_then_the_work_completes(
    queue: Queue, server: Any, run_worker: Any
) -> None:
    """The worker's link goes silent (no reset, no reply): a direct worker keeps running;
    tasks the silent worker held run again after their lease; nothing is lost."""
    done = threading.Event()
    with FaultProxy(server.port) as proxy:
        silent = Worker(Queue(queue.name, url=proxy.url), concurrency=4, lease=1)

        @silent.handler("k")
        def k_silent(task: Task) -> None:
            time.sleep(0.2)

        healthy = Worker(queue, concurrency=4, lease=1)

        @healthy.handler("k")
        def k_healthy(task: Task) -> None:
            done.set()

        with run_worker(silent):
            queue.schedule_many([{"kind": "k", "payload": i} for i in range(20)])
            time.sleep(0.1)  # the silent worker claims some
            proxy.blackhole = True
            with run_worker(healthy):
                wait_for(lambda: queue.stats().done == 20, timeout=30)
            proxy.blackhole = False
    stats = queue.stats()
    assert (stats.scheduled, stats.active, stats.dead) == (0, 0, 0)
