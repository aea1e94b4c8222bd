"""Several queues in one worker: handlers per queue and for all, fair claims between a busy
queue and a quiet one, outcomes and leases written on the queue each task came from, a
sharded queue beside an unsharded one, and what is refused."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest

from delayq import ConfigurationError, Queue, Retry, Task, Worker
from delayq.embedded import EmbeddedServer
from delayq.testing import VirtualClock, drain

from .support.helpers import wait_for


def _queues(server: EmbeddedServer, qname: str, **sharding: int) -> tuple[Queue, Queue]:
    orders = Queue(f"{qname}-orders", url=server.url, shards=sharding.get("orders", 1))
    emails = Queue(f"{qname}-emails", url=server.url, shards=sharding.get("emails", 1))
    return orders, emails


def test_handlers_per_queue_and_for_all(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    orders, emails = _queues(server, qname)
    worker = Worker([orders, emails], concurrency=8)
    ran: list[tuple[str, str, str]] = []

    @worker.handler("close", queue=orders)
    async def close_order(task: Task) -> None:
        ran.append(("order", task.queue, task.id))

    @worker.handler("close", queue=emails.name)  # by name works too
    async def close_email(task: Task) -> None:
        ran.append(("email", task.queue, task.id))

    @worker.handler("ping")  # no queue=: every queue's
    def ping(task: Task) -> None:
        ran.append(("ping", task.queue, task.id))

    assert worker.lanes[0].registry.kinds() == ["close", "ping"]
    assert worker.lanes[1].registry.kinds() == ["close", "ping"]
    orders.schedule("close", 1, task_id="same")
    emails.schedule("close", 2, task_id="same")  # the same id in both: two tasks
    orders.schedule("ping", 3, task_id="p1")
    emails.schedule("ping", 4, task_id="p2")
    with run_worker(worker):
        wait_for(lambda: orders.stats().done == 2 and emails.stats().done == 2, timeout=20)
        # Registered on each queue, with the kinds it runs there.
        for q in (orders, emails):
            (w,) = q.workers()
            assert w.id == worker.id and sorted(w.kinds) == ["close", "ping"]
    assert orders.workers() == [] and emails.workers() == []  # unregistered from both
    assert sorted(ran) == sorted(
        [
            ("order", orders.name, "same"),
            ("email", emails.name, "same"),
            ("ping", orders.name, "p1"),
            ("ping", emails.name, "p2"),
        ]
    )
    orders.close()
    emails.close()


def test_a_busy_queue_does_not_starve_a_quiet_one(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    busy, quiet = _queues(server, qname)
    worker = Worker([busy, quiet], concurrency=8)
    started: dict[str, float] = {}

    @worker.handler("slow", queue=busy)
    async def slow(task: Task) -> None:
        await asyncio.sleep(0.005)  # 8 slots: ~1,600 a second at best

    @worker.handler("urgent", queue=quiet)
    async def urgent(task: Task) -> None:
        started[task.id] = time.time()

    backlog = 8000
    for i in range(0, backlog, 2000):
        busy.schedule_many([{"kind": "slow", "payload": n} for n in range(i, i + 2000)])
    with run_worker(worker):
        wait_for(lambda: busy.stats().done >= 500, timeout=30)  # the busy one is being worked
        sent: dict[str, float] = {}
        for n in range(5):
            tid = quiet.schedule("urgent", n)
            sent[tid] = time.time()
            time.sleep(0.1)
        wait_for(lambda: len(started) == 5, timeout=30)
        still_due = busy.stats().scheduled
    waits = [started[t] - sent[t] for t in sent]
    # Started within a bound while thousands of the busy queue's tasks were still due.
    assert still_due > 1000, still_due
    assert max(waits) < 1.0, waits
    busy.close()
    quiet.close()


def test_outcomes_retries_and_leases_land_on_the_right_queue(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    orders, emails = _queues(server, qname)
    worker = Worker([orders, emails], concurrency=8, lease=1)
    runs: Counter[tuple[str, str]] = Counter()

    @worker.handler("job", queue=orders, backoff=[3600])
    async def fails(task: Task) -> None:
        runs[(task.queue, task.id)] += 1
        raise Retry("later")

    @worker.handler("job", queue=emails)
    async def slow(task: Task) -> None:
        runs[(task.queue, task.id)] += 1
        await asyncio.sleep(3.0)  # three leases long: the heartbeat must extend it on emails

    orders.schedule("job", 1, task_id="x")
    emails.schedule("job", 2, task_id="x")
    with run_worker(worker):
        wait_for(lambda: emails.stats().done == 1, timeout=30)
        wait_for(lambda: (i := orders.get("x")) is not None and i.last_error, timeout=10)
    o, e = orders.get("x"), emails.get("x")
    assert o is not None and o.state == "scheduled" and o.attempts == 1
    assert o.last_error is not None and "later" in o.last_error
    assert e is not None and e.state == "done" and e.last_error is None
    assert runs == {(orders.name, "x"): 1, (emails.name, "x"): 1}
    assert emails.stats().counters.get("leases_expired", 0) == 0
    assert orders.stats().counters.get("retried", 0) == 1
    assert emails.stats().counters.get("retried", 0) == 0
    orders.close()
    emails.close()


def test_a_sharded_queue_beside_an_unsharded_one(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    orders, emails = _queues(server, qname, orders=4)
    worker = Worker([orders, emails], concurrency=16)
    ran: Counter[tuple[str, str]] = Counter()
    lock = threading.Lock()

    @worker.handler("k")
    def k(task: Task) -> None:
        with lock:
            ran[(task.queue, task.id)] += 1

    o_ids = orders.schedule_many([{"kind": "k", "payload": i} for i in range(400)])
    e_ids = emails.schedule_many([{"kind": "k", "payload": i} for i in range(400)])
    with run_worker(worker):
        wait_for(lambda: orders.stats().done == 400 and emails.stats().done == 400, timeout=60)
    assert set(ran) == {(orders.name, i) for i in o_ids} | {(emails.name, i) for i in e_ids}
    assert set(ran.values()) == {1}
    orders.close()
    emails.close()


def test_cron_and_expiry_name_their_queue(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    orders, emails = _queues(server, qname)
    worker = Worker([orders, emails], concurrency=4)
    with pytest.raises(ConfigurationError, match="pass queue= to cron"):
        worker.cron("* * * * *")
    with pytest.raises(ConfigurationError, match="pass queue= to every"):
        worker.every(seconds=1)
    with pytest.raises(ConfigurationError, match="pass queue= to on_expire"):
        worker.on_expire("k:*")
    ticks: list[str] = []

    @worker.every(seconds=1, queue=emails, name="tick")
    async def tick(task: Task) -> None:
        ticks.append(task.queue)

    @worker.on_expire("k:*", queue=orders)
    async def gone(expired: Any) -> None:
        pass

    with pytest.raises(ConfigurationError, match="already watch queue"):
        worker.on_expire("other:*", queue=emails)
    with run_worker(worker):
        wait_for(lambda: len(ticks) >= 1, timeout=20)
    assert set(ticks) == {emails.name}
    assert [s.name for s in emails.schedules()] == ["tick"]
    assert orders.schedules() == []
    orders.close()
    emails.close()


def test_what_is_refused(server: EmbeddedServer, make_server: Any, qname: str) -> None:
    orders, emails = _queues(server, qname)
    worker = Worker([orders, emails])
    with pytest.raises(ConfigurationError, match="not one of this worker's queues"):
        worker.handler("k", queue="nope")
    other = Queue("elsewhere", url=make_server().url)
    with pytest.raises(ConfigurationError, match="share a server"):
        Worker([orders, other])
    with pytest.raises(ConfigurationError, match="given twice"):
        Worker([orders, Queue(orders.name, url=server.url)])
    with pytest.raises(ConfigurationError, match="a list of them"):
        Worker([])

    @worker.handler("k")
    def k(task: Task) -> None:
        pass

    with pytest.raises(ConfigurationError, match="already registered on queue"):
        worker.handler("k", queue=emails)(k)
    clock = VirtualClock()
    a = Queue(f"{qname}-a", url=server.url, clock=clock)
    b = Queue(f"{qname}-b", url=server.url, clock=clock)
    with pytest.raises(ConfigurationError, match="one clock"):
        Worker([a, Queue(f"{qname}-c", url=server.url, clock=VirtualClock())])
    with pytest.raises(ConfigurationError, match="drain\\(\\) runs a worker of one queue"):
        drain(Worker([a, b]))
    for q in (orders, emails, other, a, b):
        q.close()


def test_a_full_worker_stays_registered_on_its_idle_queue(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    busy, idle = _queues(server, qname)
    worker = Worker([busy, idle], concurrency=1, lease=1)

    @worker.handler("hold", queue=busy)
    async def hold(task: Task) -> None:
        await asyncio.sleep(5)

    busy.schedule("hold", None)
    with run_worker(worker):
        wait_for(lambda: busy.stats().active == 1, timeout=20)
        time.sleep(0.5)
        (first,) = idle.workers()
        # Its only slot is taken, so it sends no claim to register with; the heartbeat
        # (every lease/3) registers it on the idle queue too.
        time.sleep(2)
        (later,) = idle.workers()
        assert later.last_seen > first.last_seen
    busy.close()
    idle.close()


def test_controls_act_on_their_own_queue(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    capped, free, paused = (
        Queue(f"{qname}-{n}", url=server.url) for n in ("capped", "free", "paused")
    )
    worker = Worker([capped, free, paused], concurrency=8)
    running: Counter[str] = Counter()
    most: Counter[str] = Counter()

    async def body(task: Task) -> None:
        running[task.queue] += 1
        most[task.queue] = max(most[task.queue], running[task.queue])
        await asyncio.sleep(0.3)
        running[task.queue] -= 1

    worker.handler("k", queue=capped, concurrency=1)(body)  # a cap on this queue's "k" only
    worker.handler("k", queue=free)(body)
    worker.handler("k", queue=paused)(body)
    paused.pause()
    for q in (capped, free, paused):
        q.schedule_many([{"kind": "k", "payload": i} for i in range(4)])
    with run_worker(worker):
        wait_for(lambda: capped.stats().done == 4 and free.stats().done == 4, timeout=30)
        assert paused.stats().done == 0  # paused: nothing claimed there
    assert most[capped.name] == 1
    assert most[free.name] == 4
    for q in (capped, free, paused):
        q.close()


def test_an_abort_stops_the_run_of_its_own_queue(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    orders, emails = _queues(server, qname)
    worker = Worker([orders, emails], concurrency=4)
    started: list[str] = []
    finished: list[str] = []

    @worker.handler("long")
    async def long(task: Task) -> None:
        started.append(task.queue)
        await asyncio.sleep(2.0)
        finished.append(task.queue)

    orders.schedule("long", None, task_id="same")
    emails.schedule("long", None, task_id="same")
    with run_worker(worker):
        wait_for(lambda: len(started) == 2, timeout=20)
        assert emails.abort("same")  # the same id runs on orders too: that run goes on
        wait_for(lambda: orders.stats().done == 1, timeout=20)
    assert finished == [orders.name]
    e = emails.get("same")
    assert e is not None and e.state == "aborted"
    orders.close()
    emails.close()
