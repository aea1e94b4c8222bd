"""A task of a kind no worker handles is handed back, not buried at once (issue 32, item 4):
real workers on a real server."""

from __future__ import annotations

import logging
import time
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from delayq import Queue, Task, Worker
from delayq.admin.metrics import WorkerMetrics
from delayq.codec import Header
from delayq.leasing import Claimed
from delayq.worker.unknown import UnknownKinds

from .support.dashboard_helpers import TOKEN, DashboardThread
from .support.helpers import wait_for


def claims(queue: Queue) -> int:
    """Tasks claimed from the queue so far, by any worker (the claim's token sequence)."""
    return int(queue.client.hget(queue.core.keys.stats, "claim_seq") or 0)


def handed_back(queue: Queue) -> int:
    return queue.stats().counters.get("unknown_kind", 0)


def known(queue: Queue, **options: Any) -> Worker:
    """A worker of ``queue`` with a handler for "known" only."""
    worker = Worker(queue, **options)
    worker.handler("known")(lambda task: None)
    return worker


def test_a_task_of_an_unknown_kind_is_handed_back_with_a_backoff_its_attempts_unchanged(
    queue: Queue, run_worker: Any
) -> None:
    worker = known(queue, unknown_kind_grace=60, max_wait=0.2)
    registry = CollectorRegistry()
    worker.add_listener(WorkerMetrics(registry))
    queue.schedule("new.kind", {"n": 1}, task_id="t1")
    with run_worker(worker):
        wait_for(lambda: handed_back(queue) == 1)
        time.sleep(3)  # a worker that looks every 0.2 s: a tight loop would claim 15 times
        info = queue.get("t1")
        assert info is not None and info.state == "scheduled"  # not dead
        assert handed_back(queue) == 1
        assert claims(queue) == 1
    assert info.attempts == 0  # no attempt counted
    assert info.last_error is not None and "no handler for kind 'new.kind'" in info.last_error
    # The first wait is min(10 s, grace / 8): 7.5 s from the hand-back.
    assert info.due_at is not None and info.due_at.timestamp() > time.time() + 3
    labels = {"queue": queue.name, "kind": "new.kind"}
    assert registry.get_sample_value("delayq_tasks_unknown_kind_total", labels) == 1.0
    assert queue.stats().dead == 0


def test_a_worker_deployed_later_with_the_handler_runs_it(queue: Queue, run_worker: Any) -> None:
    queue.schedule("new.kind", {"n": 1}, task_id="t1")
    with run_worker(known(queue, unknown_kind_grace=8, max_wait=0.2)):  # first wait: 1 s
        wait_for(lambda: handed_back(queue) == 1)
    ran: list[tuple[str, int]] = []
    later = known(queue, max_wait=0.2)

    @later.handler("new.kind")
    def run(task: Task) -> None:
        ran.append((task.id, task.attempt))

    with run_worker(later):
        wait_for(lambda: ran, timeout=10)
        wait_for(lambda: (info := queue.get("t1")) is not None and info.state == "done")
    assert ran == [("t1", 1)]  # its first attempt: the hand-back counted none
    assert queue.stats().dead == 0


def test_after_the_grace_it_is_dead_with_the_reason(queue: Queue, run_worker: Any) -> None:
    worker = known(queue, unknown_kind_grace=2, max_wait=0.1)
    dead: list[tuple[str, str]] = []
    worker.on_dead(lambda tid, reason, task: dead.append((tid, reason)))
    due = time.time()  # (taken before: the server's due time is no earlier)
    queue.schedule("new.kind", {"n": 1}, task_id="t1")
    with run_worker(worker):
        wait_for(lambda: queue.stats().dead == 1, timeout=10)
        buried_after = time.time() - due
        wait_for(lambda: dead)
    assert buried_after >= 2.0  # not within the grace
    (info,) = queue.dead()
    assert info.id == "t1" and info.attempts == 0
    assert info.last_error is not None
    assert info.last_error.startswith(
        "no handler for kind 'new.kind' on this worker (registered: known); handed back for 2 s "
        "since it fell due, and unknown_kind_grace is 2 s"
    ), info.last_error
    assert dead == [("t1", info.last_error)]  # the on_dead hook got the same reason
    # Waits of 0.25 s doubling to 0.5 s: a handful of hand-backs in 2 s, not one a look.
    assert 3 <= handed_back(queue) <= 8, handed_back(queue)
    assert claims(queue) == handed_back(queue) + 1


def test_the_grace_counts_from_when_the_task_fell_due_not_from_a_workers_start(
    queue: Queue, run_worker: Any
) -> None:
    due = time.time()  # (taken before: the server's due time is no earlier)
    queue.schedule("new.kind", {"n": 1}, task_id="t1")
    with run_worker(known(queue, unknown_kind_grace=3, max_wait=0.1)):
        wait_for(lambda: handed_back(queue) >= 2, timeout=10)
    time.sleep(max(0.0, due + 1.5 - time.time()))
    # Another worker, with no memory of the first: it buries at due + 3 s, not start + 3 s.
    restarted = time.time()
    with run_worker(known(queue, unknown_kind_grace=3, max_wait=0.1)):
        wait_for(lambda: queue.stats().dead == 1, timeout=10)
        buried = time.time()
    assert 3.0 <= buried - due < restarted - due + 3.0 - 0.5, (buried - due, restarted - due)


def test_the_warning_is_logged_once_per_kind_per_minute(
    queue: Queue, run_worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    worker = known(queue, unknown_kind_grace=4, max_wait=0.1)
    for i in range(3):
        queue.schedule("kind.a", {"n": i})
        queue.schedule("kind.b", {"n": i})
    with caplog.at_level(logging.WARNING, logger="delayq.worker"), run_worker(worker):
        wait_for(lambda: handed_back(queue) >= 12, timeout=10)  # each task twice at least
    lines = [r.getMessage() for r in caplog.records if "have no handler" in r.getMessage()]
    assert len([m for m in lines if "'kind.a'" in m]) == 1, lines
    assert len([m for m in lines if "'kind.b'" in m]) == 1, lines
    assert "unknown_kind_grace (4 s)" in lines[0]


def test_the_warning_comes_again_after_a_minute(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    from delayq.leasing import Claimed

    now = [1000.0]
    unknown = UnknownKinds(clock=lambda: now[0])

    def claimed(kind: str) -> Claimed:
        return Claimed("id", Header(kind, 1, 0, 1, 0, 0, "json", b""), b"{}")

    with caplog.at_level(logging.WARNING, logger="delayq.worker"):
        for t, kind in [(0, "a"), (30, "a"), (30, "b"), (59.9, "a"), (60, "a"), (100, "b")]:
            now[0] = 1000.0 + t
            unknown.met(claimed(kind), "q", ["known"])
    said = [r.getMessage().split("'")[1] for r in caplog.records]
    assert said == ["a", "b", "a", "b"]  # a at 0 and 60, b at 30 and 100


def test_the_dashboard_shows_kinds_no_live_worker_handles(queue: Queue, run_worker: Any) -> None:
    queue.schedule("new.kind", {"n": 1}, task_id="t1")
    with run_worker(known(queue, unknown_kind_grace=60, max_wait=0.2)):
        wait_for(lambda: handed_back(queue) == 1)
        with DashboardThread(queue.url, [queue.name]) as base:
            page = httpx.get(f"{base}/queues/{queue.name}?token={TOKEN}", follow_redirects=True)
    assert page.status_code == 200
    html = page.text
    assert 'id="unknown-kinds"' in html and "handed back: no handler for the kind" in html
    assert 'id="unhandled"' in html and "<code>new.kind</code>" in html
