"""Cancelled tasks are remembered (issue 32 item 7): a cancel leaves a tombstone in the
cancelled set (the id and the time, no record) for the dedupe window. get() answers
``cancelled`` with the time, the dashboard shows it, the id can be scheduled again at once
(the new schedule script drops the tombstone; a protocol 1.0 export's schedule leaves it,
and get() answers the live task), and later cancels forget tombstones past the window."""

from __future__ import annotations

import time
from typing import Any

import httpx
import redis

from delayq import Queue, Task, Worker
from delayq.embedded import EmbeddedServer

from .support.dashboard_helpers import TOKEN, DashboardThread
from .support.helpers import wait_for
from .test_protocol_exports import EXPORTS, OldProducer, record


def tombstones(queue: Queue) -> dict[str, int]:
    got = queue.client.zrange(queue.core.keys.cancelled, 0, -1, withscores=True)
    return {i.decode(): int(s) for i, s in got}


def test_a_cancelled_task_is_shown_cancelled_with_its_time_and_no_record(queue: Queue) -> None:
    queue.schedule("order.close", {"order_id": 42}, task_id="c1", delay=60)
    before = queue.stats().now
    assert queue.cancel("c1") is True
    after = queue.stats().now
    info = queue.get("c1")
    assert info is not None and info.state == "cancelled", info
    assert info.finished_at is not None and before <= info.finished_at <= after
    assert (info.kind, info.payload, info.attempts, info.due_at) == ("", None, 0, None)
    # The tombstone is the id and the time: no record, attempt state or error is kept.
    k = queue.core.keys
    assert tombstones(queue) == {"c1": round(info.finished_at.timestamp() * 1000)}
    assert not any(queue.client.hexists(h, "c1") for h in (k.tasks, k.attempts, k.errors))
    assert queue.cancel("c1") is False  # nothing waits: nothing changes
    assert tombstones(queue) == {"c1": round(info.finished_at.timestamp() * 1000)}
    assert queue.get("never") is None


def test_a_cancelled_id_is_scheduled_again_at_once_and_its_tombstone_goes(
    queue: Queue, run_worker: Any
) -> None:
    queue.schedule("k", {"n": 1}, task_id="a", delay=60)
    assert queue.cancel("a")
    again = queue.schedule("k", {"n": 2}, task_id="a", delay=0)
    assert again.status == "created"
    assert tombstones(queue) == {}
    info = queue.get("a")
    assert info is not None and info.state == "scheduled" and info.payload == {"n": 2}
    ran: list[Any] = []
    worker = Worker(queue)

    @worker.handler("k")
    def k(task: Task) -> None:
        ran.append(task.payload)

    with run_worker(worker):
        wait_for(lambda: (i := queue.get("a")) is not None and i.state == "done")
    assert ran == [{"n": 2}]


def test_an_old_export_schedules_a_cancelled_id_again_and_get_answers_the_live_task(
    server: EmbeddedServer, queue: Queue, run_worker: Any
) -> None:
    old = OldProducer(EXPORTS[0])  # protocol 1.0's scripts, as a producer ships them
    assert old.protocol == "1.0"
    queue.schedule("old.run", {"n": 0}, task_id="x", delay=60)
    assert queue.cancel("x")
    r = redis.Redis.from_url(server.url)
    try:
        assert old.schedule(r, queue.name, [("x", "+0", record("old.run", {"n": 1}))]) == [1]
        assert tombstones(queue).keys() == {"x"}  # the old script knows no tombstone
        info = queue.get("x")  # the live task, not the tombstone
        assert info is not None and info.state == "scheduled" and info.payload == {"n": 1}
        ran: list[Any] = []
        worker = Worker(queue)

        @worker.handler("old.run")
        def run(task: Task) -> None:
            ran.append(task.payload)

        with run_worker(worker):
            wait_for(lambda: (i := queue.get("x")) is not None and i.state == "done")
        assert ran == [{"n": 1}]
        assert old.get(r, queue.name, "x")[0] == b"done"
    finally:
        r.close()


def test_tombstones_past_the_dedupe_window_are_forgotten_by_later_cancels(
    server: EmbeddedServer, qname: str
) -> None:
    with Queue(qname, url=server.url, dedupe_window=0.5) as queue:
        for tid in ("a", "b"):
            queue.schedule("k", task_id=tid, delay=60)
        assert queue.cancel("a")
        assert tombstones(queue).keys() == {"a"}
        time.sleep(0.6)
        assert (i := queue.get("a")) is not None and i.state == "cancelled"  # not yet trimmed
        assert queue.cancel("b")
        assert tombstones(queue).keys() == {"b"}
        assert queue.get("a") is None
        assert (i := queue.get("b")) is not None and i.state == "cancelled"
        time.sleep(0.6)
        assert queue.cancel("gone") is False  # even a cancel that finds nothing trims
        assert tombstones(queue) == {}


def test_the_dashboard_shows_a_cancelled_task(server: EmbeddedServer, queue: Queue) -> None:
    queue.schedule("order.close", {"order_id": 42}, task_id="d1", delay=60)
    assert queue.cancel("d1")
    with DashboardThread(server.url, [queue.name]) as base, httpx.Client(base_url=base) as http:
        page = http.get("/task", params={"id": "d1"}, headers={"Authorization": f"Bearer {TOKEN}"})
    assert page.status_code == 200, page.text
    assert '<span class="state cancelled">cancelled</span>' in page.text
    assert "<dt>cancelled</dt>" in page.text and "no task with this id" not in page.text
