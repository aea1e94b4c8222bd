"""Aborting a task: queue.abort, ``delayq task abort``, and the worker stopping the attempt.

Real servers and real workers: an aborted running attempt is cancelled (async) or sees
``task.aborted`` (sync), is never retried, and the task shows as aborted; the worker hears
of it on the wake channel, or, when that message is lost, from its next heartbeat.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client import CollectorRegistry

from delayq import AsyncQueue, Fail, Queue, Task, TaskAborted, TaskEvent, Worker
from delayq.admin.metrics import WorkerMetrics
from delayq.embedded import EmbeddedServer
from delayq.worker.waker import Waker

from .conftest import WorkerThread
from .support.helpers import wait_for

LEASE = 3.0  # the heartbeat beats every lease/3 = 1 s
BACKOFF = [0.2]  # a retry would come this soon: the tests wait well beyond it


def state(queue: Queue, tid: str) -> str | None:
    info = queue.get(tid)
    return info.state if info else None


@pytest.fixture(params=[1, 4], ids=["one-shard", "shards=4"])
def squeue(request: pytest.FixtureRequest, server: EmbeddedServer, qname: str) -> Iterator[Queue]:
    """The queue, unsplit and split over four shards (abort goes to the task's shard)."""
    q = Queue(qname, url=server.url, dedupe_window=3600, shards=request.param)
    yield q
    q.close()


def recorder(worker: Worker) -> list[TaskEvent]:
    events: list[TaskEvent] = []
    worker.add_listener(events.append)
    return events


def test_aborting_a_running_async_handler_cancels_it_and_it_is_not_retried(
    squeue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    queue = squeue
    worker = Worker(queue, lease=LEASE)
    events = recorder(worker)
    started = threading.Event()
    cancelled = threading.Event()
    runs: list[int] = []

    @worker.handler("long", max_attempts=5, backoff=BACKOFF)
    async def long(task: Task) -> None:
        runs.append(task.attempt)
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            assert task.aborted
            cancelled.set()
            raise

    with run_worker(worker):
        queue.schedule("long", {"n": 1}, task_id="order:1")
        assert started.wait(10)
        t0 = time.monotonic()
        assert queue.abort("order:1") is True
        assert cancelled.wait(10)
        # The wake channel told the worker at once, not the heartbeat a second later.
        assert time.monotonic() - t0 < 0.9
        time.sleep(1.5)  # far beyond the retry backoff: nothing runs again
        assert runs == [1]
        assert queue.abort("order:1") is False  # aborted already
    info = queue.get("order:1")
    assert info is not None and info.state == "aborted" and info.finished_at is not None
    assert info.payload is None and info.attempts == 1 and info.kind  # its tombstone
    stats = queue.stats()
    assert (stats.active, stats.scheduled, stats.aborted) == (0, 0, 1)
    assert stats.counters.get("aborted") == 1
    assert "retried" not in stats.counters and "succeeded" not in stats.counters
    names = [e.event for e in events if e.task_id == "order:1"]
    assert names == ["started", "aborted"]  # not a failure, no lease_lost
    metrics = WorkerMetrics(CollectorRegistry())
    for event in events:
        metrics(event)
    labels = (queue.name, "long")
    assert metrics.aborted.labels(*labels)._value.get() == 1
    assert metrics.failed.labels(*labels)._value.get() == 0
    assert [t.id for t in queue.page("aborted").tasks] == ["order:1"]


@pytest.mark.parametrize("ending", ["returns", "raises"])
def test_aborting_a_running_sync_handler_sets_task_aborted_and_discards_its_result(
    squeue: Queue, run_worker: Callable[[Worker], WorkerThread], ending: str
) -> None:
    queue = squeue
    worker = Worker(queue, lease=LEASE)
    events = recorder(worker)
    started = threading.Event()
    seen: dict[str, Any] = {}
    runs: list[int] = []

    @worker.handler("sync", max_attempts=5, backoff=BACKOFF)
    def sync(task: Task) -> str:
        runs.append(task.attempt)
        seen["before"] = task.aborted
        task.raise_if_aborted()  # not aborted yet: nothing happens
        started.set()
        until = time.monotonic() + 20
        while not task.aborted and time.monotonic() < until:
            time.sleep(0.01)
        seen["aborted"] = task.aborted
        seen["lease_lost"] = task.lease_lost.is_set()
        try:
            task.raise_if_aborted()
        except TaskAborted as e:
            seen["raised"] = str(e)
            if ending == "raises":
                raise
        return "this result is discarded"

    with run_worker(worker):
        queue.schedule("sync", None, task_id="job:7")
        assert started.wait(10)
        assert queue.abort("job:7") is True
        wait_for(lambda: "raised" in seen, timeout=10)
        time.sleep(1.5)  # beyond the backoff and a heartbeat: no retry, no outcome written
        assert runs == [1]
    assert seen["before"] is False
    assert seen["aborted"] is True and seen["lease_lost"] is True
    assert seen["raised"] == "task job:7 was aborted"
    assert state(queue, "job:7") == "aborted"
    counters = queue.stats().counters
    assert counters.get("aborted") == 1
    assert not {"succeeded", "retried", "dead"} & counters.keys()
    assert [e.event for e in events if e.task_id == "job:7"] == ["started", "aborted"]


def test_a_lost_abort_message_still_stops_the_handler_at_the_next_heartbeat(
    squeue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    """The abort script runs but its message reaches no worker (published on a channel no
    one hears): the heartbeat's extend finds the lease gone to an abort, and the handler
    stops as aborted within about lease/3."""
    queue = squeue
    worker = Worker(queue, lease=LEASE)
    events = recorder(worker)
    started = threading.Event()
    stopped: dict[str, Any] = {}

    @worker.handler("long", max_attempts=5, backoff=BACKOFF)
    async def long(task: Task) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            stopped["at"] = time.monotonic()
            stopped["aborted"] = task.aborted
            raise

    with run_worker(worker):
        queue.schedule("long", None, task_id="quiet")
        assert started.wait(10)
        core = queue.shards.of("quiet")
        op = core.abort("quiet")
        args = ["nobody-listens" if a == core.keys.wake_channel else a for a in op.args]
        queue.client.script_load(op.script.source)
        t0 = time.monotonic()
        assert op.parse(queue.client.evalsha(op.script.sha, len(op.keys), *op.keys, *args))
        wait_for(lambda: "at" in stopped, timeout=10)
        took = stopped["at"] - t0
        assert 0.2 < took < LEASE / 3 + 1.5, took  # the heartbeat's beat, not the message
        time.sleep(1.0)
    assert stopped["aborted"] is True
    assert state(queue, "quiet") == "aborted"
    assert [e.event for e in events if e.task_id == "quiet"] == ["started", "aborted"]
    assert not {"retried", "succeeded"} & queue.stats().counters.keys()


def test_aborting_waiting_finished_dead_and_unknown_tasks(
    squeue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    queue = squeue
    worker = Worker(queue, lease=LEASE)
    ran: list[str] = []

    @worker.handler("work")
    def work(task: Task) -> None:
        ran.append(task.id)
        if task.payload == "die":
            raise Fail("no")

    queue.schedule("work", "ok", task_id="waiting", delay=0.5)
    assert queue.abort("waiting") is True  # waiting: it never runs, and shows as aborted
    assert state(queue, "waiting") == "aborted"
    queue.schedule("work", "ok", task_id="done")
    queue.schedule("work", "die", task_id="dead")
    with run_worker(worker):
        wait_for(lambda: state(queue, "done") == "done" and state(queue, "dead") == "dead")
        time.sleep(1.0)  # past the aborted task's due time
    assert sorted(ran) == ["dead", "done"]
    assert queue.abort("done") is False and state(queue, "done") == "done"
    assert queue.abort("dead") is False and state(queue, "dead") == "dead"
    assert queue.abort("waiting") is False
    assert queue.abort("never-seen") is False and queue.get("never-seen") is None
    # An aborted id is remembered for the dedupe window, as a finished one is: scheduling it
    # again changes nothing, unless replace=True re-creates it.
    assert queue.schedule("work", "ok", task_id="waiting").status == "unchanged"
    assert state(queue, "waiting") == "aborted"
    again = queue.schedule("work", "ok", task_id="waiting", replace=True)
    assert again.status == "replaced" and state(queue, "waiting") == "scheduled"
    stats = queue.stats()
    assert (stats.aborted, stats.scheduled, stats.counters.get("aborted")) == (0, 1, 1)


def test_an_aborted_record_is_forgotten_after_the_dedupe_window(squeue: Queue) -> None:
    queue = squeue
    core = queue.shards.of("old")
    queue.schedule("work", None, task_id="old", delay=60)
    assert queue.execute(core.abort("old", now_ms=1_000))  # aborted long ago
    assert state(queue, "old") == "aborted"
    queue.schedule("work", None, task_id="fresh", delay=60)
    assert queue.abort("fresh")  # the next abort on that shard trims the old one
    if queue.shards.of("fresh") is core:
        assert queue.get("old") is None
    assert state(queue, "fresh") == "aborted"
    # And once the window has passed, the id counts as new.
    assert queue.schedule("work", None, task_id="old", delay=60).status == "created"


def test_delayq_task_abort_on_the_command_line(
    queue: Queue, server: EmbeddedServer, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    from delayq.cli.main import main

    cli = CliRunner(env={"DELAYQ_REDIS_URL": server.url, "DELAYQ_QUEUE": ""})
    worker = Worker(queue, lease=LEASE)
    started = threading.Event()
    cancelled = threading.Event()

    @worker.handler("long", backoff=BACKOFF)
    async def long(task: Task) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with run_worker(worker):
        queue.schedule("long", None, task_id="-run")
        assert started.wait(10)
        result = cli.invoke(main, ["task", "abort", "-q", queue.name, "-run"])
        assert result.exit_code == 0, result.output
        assert "aborted" in result.output and "running handler is stopped" in result.output
        assert cancelled.wait(10)
    shown = cli.invoke(main, ["task", "show", "-q", queue.name, "-run"])
    assert shown.exit_code == 0 and "aborted" in shown.output
    again = cli.invoke(main, ["task", "abort", "-q", queue.name, "--json", "-run"])
    assert again.exit_code == 1
    assert json.loads(again.stdout) == {
        "id": "-run",
        "queue": queue.name,
        "ok": False,
        "message": "task '-run' is aborted: only a waiting or running task can be aborted",
    }
    missing = cli.invoke(main, ["task", "abort", "-q", queue.name, "nope"])
    assert missing.exit_code == 1 and "no task 'nope'" in missing.output
    info = cli.invoke(main, ["info", "-q", queue.name, "--json"])
    assert json.loads(info.stdout)[0]["aborted"] == 1
    wide = CliRunner(env={"DELAYQ_REDIS_URL": server.url, "DELAYQ_QUEUE": "", "COLUMNS": "200"})
    table = wide.invoke(main, ["info", "-q", queue.name]).output
    assert "aborted" in table


async def test_async_queue_abort(aqueue: AsyncQueue) -> None:
    await aqueue.schedule("work", None, task_id="a", delay=60)
    assert await aqueue.abort("a") is True
    assert await aqueue.abort("a") is False
    info = await aqueue.get("a")
    assert info is not None and info.state == "aborted"
    assert (await aqueue.stats()).aborted == 1


def test_a_waker_without_an_abort_callback_ignores_the_message() -> None:
    """An older worker's waker (no on_abort) reads no due time in an abort message, so the
    message cannot break it or shorten its sleep."""

    async def hear() -> tuple[int | None, bool, list[tuple[str, int]]]:
        waker = Waker(None, "dq:{q}:wake")
        waker._note(b"abort 12 some:id")
        old = (waker.hint_ms, waker.event.is_set())
        told: list[tuple[str, int]] = []
        waker.on_abort = lambda tid, token: told.append((tid, token))
        waker._note(b"abort 12 some:id with spaces")
        waker._note(b"abort x bad")  # malformed: ignored
        return old[0], old[1], told

    hint, woke, told = asyncio.run(hear())
    assert hint is None and woke is False
    assert told == [("some:id with spaces", 12)]


def test_the_abort_script_takes_the_lease_and_tells_the_worker(queue: Queue) -> None:
    """abort.lua on exact state: a running task leaves active for aborted, leaving a
    tombstone; its worker hears "abort <token> <id>"; its ack is refused and its
    extend reports it lost to an abort."""
    from delayq import leasing

    now = 1_700_000_000_000
    core, client, k = queue.core, queue.client, queue.core.keys
    queue.schedule("work", {"x": 1}, task_id="r", at=now / 1000 - 1)
    queue.schedule("work", None, task_id="w", at=now / 1000 + 60)
    run = queue.execute(leasing.claim(core, limit=1, lease_ms=30_000, now_ms=now))
    (claimed,) = run.tasks
    record = client.hget(k.tasks, "r")
    attempt = client.hget(k.attempts, "r")
    pubsub = client.pubsub()
    pubsub.subscribe(k.wake_channel)
    wait_for(lambda: pubsub.get_message(timeout=0.1) is not None)  # the subscription
    assert queue.execute(core.abort("r", now_ms=now + 5)) is True
    assert queue.execute(core.abort("w", now_ms=now + 6)) is True
    message = wait_for(lambda: pubsub.get_message(timeout=0.2))
    assert message["data"] == f"abort {claimed.token} r".encode()
    time.sleep(0.2)
    assert pubsub.get_message(timeout=0.2) is None  # nothing for the waiting one
    pubsub.close()
    assert client.zrange(k.active, 0, -1) == [] and client.zrange(k.scheduled, 0, -1) == []
    assert client.zrange(k.aborted, 0, -1, withscores=True) == [
        (b"r", now + 5),
        (b"w", now + 6),
    ]
    # A tombstone in place of its record: attempt 1, the ms from its due time to the abort,
    # and its kind's code; its attempts entry goes (keep_finished="record" keeps both).
    tomb = client.hget(k.tasks, "r")
    assert tomb is not None and tomb != record and client.hget(k.attempts, "r") is None
    assert tomb.split()[0] == b"1" and client.hget(k.kinds, b"c:" + tomb.split()[2]) == b"work"
    assert attempt is not None
    assert client.hget(k.stats, "aborted") == b"2"
    lease = [("r", claimed.token)]
    lost = queue.execute(leasing.extend(core, lease, lease_ms=30_000, now_ms=now + 10))
    assert lost == ["r"] and lost.aborted == {"r"}
    assert queue.execute(leasing.ack(core, lease, now_ms=now + 10)) == ["r"]
    assert queue.execute(leasing.retry(core, [("r", claimed.token, "+1", "e")])) == ["r"]
    assert state(queue, "r") == "aborted"


def test_the_dashboard_aborts_a_running_task_and_lists_it_as_aborted(
    queue: Queue, server: EmbeddedServer, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    import re

    import httpx

    from .support.dashboard_helpers import TOKEN, DashboardThread

    worker = Worker(queue, lease=LEASE)
    started = threading.Event()
    cancelled = threading.Event()

    @worker.handler("long")
    async def long(task: Task) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    bearer = {"Authorization": f"Bearer {TOKEN}"}
    with (
        run_worker(worker),
        DashboardThread(server.url, [queue.name]) as base,
        httpx.Client(base_url=base, timeout=10, headers=bearer) as http,
    ):
        queue.schedule("long", None, task_id="dash:1")
        assert started.wait(10)
        running = http.get(f"/queues/{queue.name}/active").text
        assert f"/queues/{queue.name}/task/abort" in running and "dash:1" in running
        csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', running)
        assert csrf is not None
        done = http.post(
            f"/queues/{queue.name}/task/abort", data={"id": "dash:1", "csrf": csrf.group(1)}
        )
        assert done.status_code == 303 and "aborted" in done.headers["location"]
        assert cancelled.wait(10)
        listed = http.get(f"/queues/{queue.name}/aborted")
        assert listed.status_code == 200 and "dash:1" in listed.text
        shown = http.get("/task", params={"id": "dash:1", "queue": queue.name}).text
        assert '<span class="state aborted">aborted</span>' in shown
        assert f"/queues/{queue.name}/task/abort" not in shown  # nothing left to abort
        overview = http.get(f"/queues/{queue.name}").text
        assert "aborted (remembered)" in overview
        metrics = http.get("/metrics").text
        assert f'delayq_queue_aborted{{queue="{queue.name}"}} 1.0' in metrics
