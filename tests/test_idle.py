"""An idle worker: what it costs the server, how soon it starts a new task, and how late a
lost wake-up can make one (docs/operations.md, the worker's ``max_wait``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from delayq import Queue, Task, Worker
from delayq.codec import encode_record
from delayq.embedded import EmbeddedServer

from .support.helpers import wait_for
from .support.topology import FLAVOURS

# The bar of issue 22: commands executed (those inside scripts counted) per idle worker.
BAR_EXECUTED_PER_S = 0.5


def _executed(client: redis.Redis) -> int:
    """Commands the server has executed, scripts' inner commands included, less INFO (ours)."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def _registered(queue: Queue, worker: Worker) -> bool:
    return queue.client.zscore(queue.core.keys.workers_seen, worker.id) is not None


@pytest.mark.slow
@pytest.mark.parametrize("binary", [b for _, b in FLAVOURS], ids=[n for n, _ in FLAVOURS])
def test_an_idle_worker_executes_at_most_half_a_command_a_second(
    make_server: Any, run_worker: Any, binary: str
) -> None:
    """A worker with the defaults on an empty queue, on a server of its own, watched over a
    window that starts just after its first look: INFO commandstats counts every command it
    executed. It still looks (the bound on a lost wake-up), and costs ≤ 0.5 a second (seen
    failing at 1.0/s with the 5 s max_wait of before)."""
    srv: EmbeddedServer = make_server(binary, appendonly=False)
    queue = Queue("idle", url=srv.url)
    worker = Worker(queue)
    window = 20.0
    try:
        with run_worker(worker):
            wait_for(lambda: _registered(queue, worker))  # its first look is done
            time.sleep(1.0)
            evals = int(queue.client.info("commandstats")["cmdstat_evalsha"]["calls"])
            before, t0 = _executed(queue.client), time.monotonic()
            time.sleep(window)
            after, t1 = _executed(queue.client), time.monotonic()
            looks = int(queue.client.info("commandstats")["cmdstat_evalsha"]["calls"]) - evals
    finally:
        queue.close()
    rate = (after - before) / (t1 - t0)
    assert looks >= 1, "the idle worker never looked at the queue"
    assert rate <= BAR_EXECUTED_PER_S, f"{after - before} commands in {t1 - t0:.1f} s"


def test_a_task_scheduled_for_now_starts_promptly_on_an_idle_worker(
    queue: Queue, run_worker: Any
) -> None:
    """With the defaults the next look is 15 s away: only the wake-up can start these."""
    worker = Worker(queue)
    late: list[float] = []
    ran = threading.Event()

    @worker.handler("k")
    async def k(task: Task) -> None:
        late.append(time.time() - task.due_at.timestamp())
        ran.set()

    with run_worker(worker):
        wait_for(lambda: _registered(queue, worker))
        for i in range(5):
            time.sleep(0.3)  # idle again, sleeping towards its next look
            ran.clear()
            queue.schedule("k", None, task_id=f"now{i}")
            assert ran.wait(5)
    assert len(late) == 5
    assert max(late) < 0.5, late  # a few ms in practice; generous for a loaded machine


@pytest.mark.parametrize("max_wait", [1.0, 2.0])
def test_a_lost_wake_up_delays_a_task_by_at_most_max_wait(
    queue: Queue, run_worker: Any, max_wait: float
) -> None:
    """A task written without its wake-up (as if the message were lost while the link stayed
    up) runs at the idle worker's next look: within max_wait of being written."""
    worker = Worker(queue, max_wait=max_wait)
    ran_at: list[float] = []
    ran = threading.Event()

    @worker.handler("k")
    async def k(task: Task) -> None:
        ran_at.append(time.monotonic())
        ran.set()

    with run_worker(worker):
        wait_for(lambda: _registered(queue, worker))
        time.sleep(0.2)
        k_ = queue.core.keys
        record = encode_record("k", b"null", max_attempts=0, created_ms=1, fmt="json")
        queue.client.hset(k_.tasks, "unannounced", record)
        written = time.monotonic()
        queue.client.zadd(k_.scheduled, {"unannounced": 0})  # due since 1970: due now
        assert ran.wait(max_wait + 5)
    assert ran_at[0] - written <= max_wait + 0.5, ran_at[0] - written


def _subscribes(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_subscribe", {}).get("calls", 0))


def _write_unannounced(queue: Queue, task_id: str) -> None:
    """A task due now, written without the producer's wake-up: a lost message, to a worker."""
    k_ = queue.core.keys
    record = encode_record("k", b"null", max_attempts=0, created_ms=1, fmt="json")
    queue.client.hset(k_.tasks, task_id, record)
    queue.client.zadd(k_.scheduled, {task_id: 0})


def _recording_worker(
    srv: EmbeddedServer, name: str, max_wait: float
) -> tuple[Queue, Worker, list[str]]:
    """A queue on ``srv`` and a worker whose handler of kind "k" records the ids it runs."""
    queue = Queue(name, url=srv.url)
    worker = Worker(queue, max_wait=max_wait)
    ran: list[str] = []

    @worker.handler("k")
    async def k(task: Task) -> None:
        ran.append(task.id)

    return queue, worker, ran


@pytest.mark.parametrize("binary", [b for _, b in FLAVOURS], ids=[n for n, _ in FLAVOURS])
def test_a_look_that_finds_an_unannounced_task_renews_the_subscription(
    make_server: Any, run_worker: Any, binary: str
) -> None:
    """A dead subscription whose connection does not know it would lose every wake-up: the
    look that finds a task nobody announced subscribes again (one SUBSCRIBE), so it costs
    that one task's delay. The renewed subscription hears the next task at once."""
    queue, worker, ran = _recording_worker(make_server(binary, appendonly=False), "renew", 1)
    try:
        with run_worker(worker):
            wait_for(lambda: _registered(queue, worker))
            subscribed = _subscribes(queue.client)
            _write_unannounced(queue, "lost")
            wait_for(lambda: ran == ["lost"], timeout=5)
            wait_for(lambda: _subscribes(queue.client) == subscribed + 1, timeout=10)
            time.sleep(0.3)
            t0 = time.monotonic()
            queue.schedule("k", None, task_id="heard")
            wait_for(lambda: "heard" in ran, timeout=5, interval=0.005)
            assert time.monotonic() - t0 < 0.5  # heard, not found at the next 1 s look
            time.sleep(1.5)
        assert _subscribes(queue.client) == subscribed + 1  # once, not at every look
    finally:
        queue.close()


@pytest.mark.parametrize("binary", [b for _, b in FLAVOURS], ids=[n for n, _ in FLAVOURS])
def test_announced_tasks_never_renew_the_subscription(
    make_server: Any, run_worker: Any, binary: str
) -> None:
    """Tasks announced, or due after a head the worker knows of (not announced, but told by
    the claim's reply), across many 0.5 s looks: never a second SUBSCRIBE."""
    queue, worker, ran = _recording_worker(make_server(binary, appendonly=False), "quiet", 0.5)
    try:
        with run_worker(worker):
            wait_for(lambda: _registered(queue, worker))
            subscribed = _subscribes(queue.client)
            queue.schedule("k", None, delay=1.2, task_id="head")  # announced
            queue.schedule("k", None, delay=1.7, task_id="after")  # later: not announced
            queue.schedule("k", None, task_id="now")  # announced
            time.sleep(0.7)
            queue.schedule("k", None, delay=0.2, task_id="soon")  # announced
            wait_for(lambda: len(ran) == 4, timeout=10)
            time.sleep(1.2)
        assert sorted(ran) == ["after", "head", "now", "soon"]
        assert _subscribes(queue.client) == subscribed
    finally:
        queue.close()
