"""Priorities (docs/priorities.md): within a queue, ``schedule(..., priority=N)`` orders the
tasks that are due, highest first, never claiming one before its due time, and keeps the
level across reschedules, replaces, retries and reaped leases; across queues,
``Worker(weights=)`` shares the claims in proportion without starving a queue, and
``Worker(strict=True)`` drains the first queue's due tasks first."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from delayq import ConfigurationError, InvalidTaskError, Queue, Task, TaskSpec, Worker
from delayq.embedded import EmbeddedServer
from delayq.leasing import claim, retry
from delayq.runner import SyncRunner

from .support.helpers import wait_for
from .test_protocol_exports import EXPORTS, OldProducer

NOW = 1_800_000_000_000  # ms: claims run as of this time; every task below is due by then
LEASE = 30_000


def _claim(queue: Queue, now: int = NOW, limit: int = 100, lookahead: int = 0) -> list[str]:
    op = claim(queue.core, limit=limit, lease_ms=LEASE, lookahead_ms=lookahead, now_ms=now)
    return [c.id for c in SyncRunner(queue.client).run(op).tasks]


def _at(ms: int) -> float:
    return ms / 1000


def test_due_tasks_are_claimed_highest_priority_first_then_by_due_time(queue: Queue) -> None:
    # Due in the order given: p0 a, p5 b, p9 c, p0 d, p5 e, p9 f, no priority g.
    for i, (tid, p) in enumerate(
        [("a", 0), ("b", 5), ("c", 9), ("d", 0), ("e", 5), ("f", 9), ("g", None)]
    ):
        queue.schedule("k", i, task_id=tid, at=_at(NOW - 100 + i), priority=p)
    assert [queue.get(t).priority for t in "abcdefg"] == [0, 5, 9, 0, 5, 9, 0]  # type: ignore[union-attr]
    # A page at a time: each claim takes the highest levels first, each in due order.
    assert _claim(queue, limit=3) == ["c", "f", "b"]
    assert _claim(queue, limit=3) == ["e", "a", "d"]
    assert _claim(queue, limit=3) == ["g"]
    # The index holds no claimed task, and the marker stays while prioritised tasks run.
    assert queue.client.zcard(queue.core.keys.prio) == 0


def test_no_priority_makes_a_task_start_before_its_due_time(queue: Queue) -> None:
    queue.schedule("k", 1, task_id="later-p9", at=_at(NOW + 1000), priority=9)
    queue.schedule("k", 2, task_id="now-p1", at=_at(NOW - 5), priority=1)
    queue.schedule("k", 3, task_id="now-plain", at=_at(NOW - 10))
    assert _claim(queue) == ["now-p1", "now-plain"]  # p9 is not due: left waiting
    assert _claim(queue, NOW + 999) == []
    assert _claim(queue, NOW + 990, lookahead=9) == []  # nor within a lookahead short of it
    assert _claim(queue, NOW + 990, lookahead=10) == ["later-p9"]


def test_reschedule_and_replace_keep_the_priority_unless_given(queue: Queue) -> None:
    queue.schedule("k", 1, task_id="p7", at=_at(NOW + 60_000), priority=7)
    queue.schedule("k", 2, task_id="plain", at=_at(NOW - 50))
    # Moved earlier: due, and still claimed ahead of the plain task due before it.
    assert queue.reschedule("p7", at=_at(NOW - 10)) is True
    assert queue.get("p7").priority == 7  # type: ignore[union-attr]
    assert _claim(queue, limit=1) == ["p7"]
    assert _claim(queue) == ["plain"]

    queue.schedule("k", 3, task_id="r", at=_at(NOW + 60_000), priority=6)
    queue.schedule("k", 4, task_id="plain2", at=_at(NOW - 50))
    # Replaced without a priority: keeps 6, with its new payload and due time.
    assert queue.schedule("k", 5, task_id="r", at=_at(NOW - 10), replace=True).replaced
    info = queue.get("r")
    assert info is not None and info.priority == 6 and info.payload == 5
    assert _claim(queue, limit=1) == ["r"]
    assert _claim(queue) == ["plain2"]

    # Replaced with priority=0: none any more; with another: that one.
    queue.schedule("k", 6, task_id="s", at=_at(NOW - 10), priority=8)
    queue.schedule("k", 7, task_id="plain3", at=_at(NOW - 50))
    assert queue.schedule("k", 8, task_id="s", at=_at(NOW - 10), replace=True, priority=0)
    assert queue.get("s").priority == 0  # type: ignore[union-attr]
    assert _claim(queue) == ["plain3", "s"]
    queue.schedule("k", 9, task_id="u", at=_at(NOW - 10))
    queue.schedule("k", 10, task_id="plain4", at=_at(NOW - 50))
    assert queue.schedule("k", 11, task_id="u", at=_at(NOW - 10), replace=True, priority=3)
    assert queue.get("u").priority == 3  # type: ignore[union-attr]
    assert _claim(queue) == ["u", "plain4"]


def test_retries_and_reaped_leases_keep_the_priority(queue: Queue) -> None:
    queue.schedule("k", 1, task_id="hi", at=_at(NOW - 1), priority=4)
    queue.schedule("k", 2, task_id="lo", at=_at(NOW - 2))
    op = claim(queue.core, limit=1, lease_ms=1000, now_ms=NOW)
    (got,) = SyncRunner(queue.client).run(op).tasks
    assert got.id == "hi"
    # Its lease runs out: reaped back, due at once, and claimed before "lo" again.
    assert _claim(queue, NOW + 2000, limit=1) == ["hi"]
    # Retried, due before "lo" is: claimed ahead of it once due, not before.
    token = int(queue.client.hget(queue.core.keys.attempts, "hi").split()[0])  # type: ignore[union-attr]
    SyncRunner(queue.client).run(
        retry(queue.core, [("hi", token, "+100", "boom")], now_ms=NOW + 2000)
    )
    assert _claim(queue, NOW + 2050, limit=1) == ["lo"]
    queue.schedule("k", 3, task_id="lo2", at=_at(NOW - 3))
    assert _claim(queue, NOW + 2100, limit=1) == ["hi"]


def test_a_cancelled_prioritised_task_leaves_nothing_behind(queue: Queue) -> None:
    queue.schedule("k", 1, task_id="c", at=_at(NOW - 1), priority=9)
    assert queue.cancel("c")
    queue.schedule("k", 2, task_id="c", at=_at(NOW - 1))  # the id again, with none
    queue.schedule("k", 3, task_id="first", at=_at(NOW - 5))
    assert _claim(queue) == ["first", "c"]
    assert queue.client.hget(queue.core.keys.control, "prio") is None  # nothing can come back


def test_what_a_priority_may_be(queue: Queue) -> None:
    for bad in (-1, 10, 1.5, True, "9"):
        with pytest.raises(InvalidTaskError, match="priority"):
            queue.schedule("k", 1, priority=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidTaskError, match="priority"):
            queue.schedule_many([TaskSpec("k", 1, priority=bad)])  # type: ignore[arg-type]
    ids = queue.schedule_many(
        [TaskSpec("k", 1, priority=2), {"kind": "k", "payload": 2, "priority": 9}]
    )
    assert [queue.get(t).priority for t in ids] == [2, 9]  # type: ignore[union-attr]


def test_the_bar_20000_due_tasks_in_3_levels_start_highest_first(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    """20,000 tasks due at once in three levels: no task starts while a task of a higher
    level is due and unclaimed. All are due before the worker starts, so a task starting
    after one of a lower level was unclaimed when that one was claimed: the start order
    must not go up once. Claims are recorded too: each batch in its order."""
    queue = Queue(qname, url=server.url)
    levels = (0, 4, 9)
    per = 20_000 // len(levels) + 1
    specs = [
        TaskSpec("job", p, task_id=f"{p}-{i}", at=time.time() - 5, priority=p or None)
        for i in range(per)
        for p in levels
    ][:20_000]
    queue.schedule_many(specs)
    worker = Worker(queue, concurrency=64)
    started: list[int] = []

    @worker.handler("job")
    async def job(task: Task) -> None:
        started.append(task.payload)

    with run_worker(worker):
        wait_for(lambda: len(started) == 20_000, timeout=120)
    ups = [
        (i, started[i], started[i + 1])
        for i in range(len(started) - 1)
        if started[i + 1] > started[i]
    ]
    assert ups == [], f"{len(ups)} starts after a lower level's, first {ups[:5]}"
    assert [started.count(p) for p in levels] == [
        sum(1 for s in specs if s.payload == p) for p in levels
    ]
    queue.close()


def _two(server: EmbeddedServer, qname: str) -> tuple[Queue, Queue]:
    return Queue(f"{qname}-a", url=server.url), Queue(f"{qname}-b", url=server.url)


def _backlog(queue: Queue, n: int) -> None:
    for i in range(0, n, 1000):
        queue.schedule_many([{"kind": "job", "payload": j} for j in range(i, min(n, i + 1000))])


def _serve(worker: Worker, run_worker: Any, until: Any, started: list[str]) -> None:
    @worker.handler("job")
    async def job(task: Task) -> None:
        started.append(task.queue)
        await asyncio.sleep(0.002)

    with run_worker(worker):
        wait_for(until, timeout=120)


def test_weights_share_the_claims_in_proportion(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    a, b = _two(server, qname)
    _backlog(a, 3000)
    _backlog(b, 3000)
    started: list[str] = []
    worker = Worker([a, b], concurrency=8, weights={a: 3, b.name: 1})
    _serve(worker, run_worker, lambda: len(started) >= 2000, started)
    first = started[:2000]  # both queues still had tasks due all along
    ratio = first.count(a.name) / max(first.count(b.name), 1)
    assert 2.0 <= ratio <= 4.5, (ratio, first.count(a.name), first.count(b.name))
    a.close()
    b.close()


def test_a_light_queue_is_not_starved(server: EmbeddedServer, qname: str, run_worker: Any) -> None:
    a, b = _two(server, qname)
    _backlog(a, 4000)
    _backlog(b, 100)
    started: list[str] = []
    worker = Worker([a, b], concurrency=8, weights={a: 100, b: 1})
    _serve(worker, run_worker, lambda: len(started) >= 2000, started)
    first = started[:2000]
    light = first.count(b.name)
    # About 1 in 101 of the claims while both have tasks due: some, and few.
    assert 5 <= light <= 60, light
    a.close()
    b.close()


def test_strict_order_runs_the_first_queues_due_tasks_first(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    a, b = _two(server, qname)
    _backlog(b, 500)  # b's due first: order, not age, decides
    time.sleep(0.01)
    _backlog(a, 500)
    started: list[str] = []
    worker = Worker([a, b], concurrency=8, strict=True)
    _serve(worker, run_worker, lambda: len(started) >= 1000, started)
    assert started[:500] == [a.name] * 500, started.index(b.name)
    assert started[500:] == [b.name] * 500
    a.close()
    b.close()


def test_what_weights_and_strict_refuse(server: EmbeddedServer, qname: str) -> None:
    a, b = _two(server, qname)
    other = Queue(f"{qname}-other", url=server.url)
    cases: list[tuple[dict[str, Any], str]] = [
        ({"weights": {other: 2}}, "not one of this worker's queues"),
        ({"weights": {"nope": 2}}, "'nope'"),
        ({"weights": {a: 0}}, r"weights\['" + a.name),
        ({"weights": {a: -1}}, "weights"),
        ({"weights": {a: 1.5}}, "weights"),
        ({"weights": {a: True}}, "weights"),
        ({"weights": {a: 2, a.name: 3}}, "twice"),
        ({"weights": {3: 2}}, "weights has the key 3"),
        ({"weights": [a]}, "weights must be a dict"),
        ({"strict": "yes"}, "strict"),
    ]
    for kwargs, match in cases:
        with pytest.raises(ConfigurationError, match=match):
            Worker([a, b], **kwargs)
    for q in (a, b, other):
        q.close()


@pytest.mark.parametrize("export", EXPORTS, ids=[p.name for p in EXPORTS])
def test_a_1_0_reschedule_and_cancel_leave_entries_claim_repairs(queue: Queue, export: Any) -> None:
    """An older producer's scripts know no index: its reschedule leaves a prioritised
    task's entry at the old due time and its cancel leaves it behind. A claim that meets
    such an entry repairs it from the scheduled set: never early, nothing cancelled runs."""
    old, r = OldProducer(export), queue.client
    queue.schedule("k", 1, task_id="a", at=_at(NOW - 10), priority=9)
    queue.schedule("k", 2, task_id="b", at=_at(NOW - 10), priority=9)
    queue.schedule("k", 3, task_id="c", at=_at(NOW - 20))
    assert int(old.reschedule(r, queue.name, "a", str(NOW + 60_000))) == 1
    assert int(old.cancel(r, queue.name, "b")) == 1
    assert _claim(queue) == ["c"]  # a is not due; b is gone
    keys = queue.core.keys
    assert r.zrange(keys.prio, 0, -1, withscores=True) == [(b"a", 1e13 + NOW + 60_000)]
    assert _claim(queue, NOW + 60_000, limit=1) == ["a"]  # (c is reaped back too: after a)
    assert r.zcard(keys.prio) == 0


async def test_async_queue_schedules_with_a_priority(queue: Queue, aqueue: Any) -> None:
    await aqueue.schedule("k", 1, task_id="hi", at=_at(NOW - 1), priority=8)
    await aqueue.schedule_many([TaskSpec("k", 2, task_id="lo", at=_at(NOW - 9))])
    info = await aqueue.get("hi")
    assert info is not None and info.priority == 8
    assert _claim(queue) == ["hi", "lo"]


def test_a_split_queue_orders_each_shards_tasks_by_priority(
    server: EmbeddedServer, qname: str
) -> None:
    queue = Queue(qname, url=server.url, shards=2)
    for i in range(20):  # odd ids prioritised, due after the even ones beside them
        p = 9 if i % 2 else None
        queue.schedule("k", i, task_id=f"t{i}", at=_at(NOW - 100 + i), priority=p)
    assert queue.get("t1").priority == 9 and queue.get("t2").priority == 0  # type: ignore[union-attr]
    seen: list[str] = []
    for core in queue.shards.cores:
        op = claim(core, limit=100, lease_ms=LEASE, now_ms=NOW)
        ids = [c.id for c in SyncRunner(queue.client).run(op).tasks]
        order = [int(t[1:]) for t in ids]
        prioritised = [n for n in order if n % 2]
        assert order == prioritised + [n for n in order if not n % 2], order
        assert prioritised == sorted(prioritised) and order[len(prioritised) :] == sorted(
            order[len(prioritised) :]
        )
        seen += ids
    assert sorted(seen) == sorted(f"t{i}" for i in range(20))
    queue.close()
