"""The worker end to end: outcomes, dead set, lease loss, shutdown and wake-ups."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from delayq import Discard, Fail, Queue, Retry, Task, TaskSpec, Worker, leasing
from delayq.codec import encode_record
from delayq.runner import SyncRunner
from delayq.worker.claimer import CLAIM_STEP_S
from delayq.worker.outcome import WRITE_EVERY_S

from .support.helpers import wait_for


def state(queue: Queue, tid: str) -> str | None:
    info = queue.get(tid)
    return info.state if info else None


@pytest.mark.parametrize("flavour", ["async", "sync"])
def test_task_runs_once_on_time(queue: Queue, run_worker: Any, flavour: str) -> None:
    worker = Worker(queue, concurrency=4)
    seen: list[tuple[str, int, float]] = []

    def record(task: Task) -> None:
        seen.append((task.id, task.attempt, time.time() - task.due_at.timestamp()))

    if flavour == "async":

        @worker.handler("order.close")
        async def close_async(task: Task) -> None:
            record(task)
    else:

        @worker.handler("order.close")
        def close_sync(task: Task) -> None:
            record(task)

    with run_worker(worker):
        queue.schedule("order.close", {"order_id": 42}, delay=0.3, task_id="order:42")
        wait_for(lambda: state(queue, "order:42") == "done")
    assert [(s[0], s[1]) for s in seen] == [("order:42", 1)]
    assert 0 <= seen[0][2] < 0.5  # started after its due time, not early
    info = queue.get("order:42")
    assert info is not None and info.attempts == 1 and info.finished_at is not None


def test_done_id_is_not_run_again_within_dedupe_window(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue)
    runs: list[str] = []
    worker.handler("k")(lambda task: runs.append(task.id))
    with run_worker(worker):
        queue.schedule("k", None, task_id="once")
        wait_for(lambda: state(queue, "once") == "done")
        assert queue.schedule("k", None, task_id="once") == "once"
        time.sleep(0.3)
    assert runs == ["once"]
    assert state(queue, "once") == "done"


def test_retry_runs_again_and_counts_the_attempt(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue)
    attempts: list[int] = []

    @worker.handler("flaky")
    async def flaky(task: Task) -> None:
        attempts.append(task.attempt)
        if task.attempt < 3:
            raise Retry(after=0.05)

    with run_worker(worker):
        queue.schedule("flaky", None, task_id="r1")
        wait_for(lambda: state(queue, "r1") == "done")
    assert attempts == [1, 2, 3]
    assert queue.stats().counters["retried"] == 2


def test_discard_finishes_without_retry(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue)
    calls: list[int] = []

    @worker.handler("order.close")
    def close(task: Task) -> None:
        calls.append(task.attempt)
        raise Discard("already paid")

    with run_worker(worker):
        queue.schedule("order.close", None, task_id="paid")
        wait_for(lambda: state(queue, "paid") == "done")
    assert calls == [1]
    assert queue.stats().counters["discarded"] == 1


def test_fail_goes_dead_at_once_and_fires_on_dead(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue)
    alerts: list[tuple[str, str]] = []

    @worker.handler("cleanup")
    def cleanup(task: Task) -> None:
        raise Fail("permission denied")

    @worker.on_dead
    def alert(task_id: str, reason: str, task: Task | None) -> None:
        alerts.append((task_id, reason))

    with run_worker(worker):
        queue.schedule("cleanup", None, task_id="f1")
        wait_for(lambda: state(queue, "f1") == "dead")
    info = queue.get("f1")
    assert info is not None and info.attempts == 1
    assert info.last_error == "Fail: permission denied"
    assert alerts == [("f1", "Fail: permission denied")]


def test_exception_retries_with_backoff_then_dies_with_traceback(
    queue: Queue, run_worker: Any
) -> None:
    worker = Worker(queue)
    times: list[float] = []

    @worker.handler("boom", max_attempts=3, backoff=[0.2, 0.4], jitter=0)
    def boom(task: Task) -> None:
        times.append(time.monotonic())
        raise ValueError(f"broken on attempt {task.attempt}")

    with run_worker(worker):
        queue.schedule("boom", None, task_id="b1")
        wait_for(lambda: state(queue, "b1") == "dead")
    assert len(times) == 3
    assert times[1] - times[0] >= 0.19 and times[2] - times[1] >= 0.39
    info = queue.get("b1")
    assert info is not None and info.attempts == 3
    assert "Traceback" in (info.last_error or "")
    assert "ValueError: broken on attempt 3" in (info.last_error or "")


def test_max_attempts_given_at_schedule_time_wins(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue)

    @worker.handler("boom", max_attempts=10, backoff=[0.01])
    def boom(task: Task) -> None:
        raise RuntimeError("no")

    with run_worker(worker):
        queue.schedule("boom", None, task_id="b2", max_attempts=2)
        wait_for(lambda: state(queue, "b2") == "dead")
    info = queue.get("b2")
    assert info is not None and info.attempts == 2


def test_unknown_kind_and_undecodable_records_go_dead_and_worker_keeps_running(
    queue: Queue, run_worker: Any
) -> None:
    # unknown_kind_grace=0: a kind with no handler is buried at its first claim, as before
    # the grace (tests/test_unknown_kinds.py has the hand-backs).
    worker = Worker(queue, unknown_kind_grace=0)
    ran: list[str] = []
    worker.handler("good")(lambda task: ran.append(task.id))
    keys = queue.core.keys
    # A record whose header is garbage, and one whose payload is not JSON.
    queue.client.hset(keys.tasks, "corrupt", b"not a header")
    queue.client.zadd(keys.scheduled, {"corrupt": 0})
    bad_payload = encode_record("good", b"{not json", max_attempts=0, created_ms=0, fmt="json")
    queue.client.hset(keys.tasks, "badjson", bad_payload)
    queue.client.zadd(keys.scheduled, {"badjson": 0})
    queue.schedule("nobody.handles.this", {"x": 1}, task_id="orphan")
    queue.schedule("good", None, task_id="fine", delay=0.2)
    with run_worker(worker):
        wait_for(lambda: state(queue, "fine") == "done")
        wait_for(lambda: queue.stats().dead == 3)
    reasons = {t.id: t.last_error or "" for t in queue.dead()}
    assert "cannot be decoded" in reasons["corrupt"]
    assert "cannot be decoded as json" in reasons["badjson"]
    assert "no handler for kind 'nobody.handles.this'" in reasons["orphan"]
    assert ran == ["fine"]
    # Nothing lost: the dead tasks keep their records and can be replayed.
    orphan = queue.get("orphan")
    assert orphan is not None and orphan.payload == {"x": 1}


def test_dead_tasks_can_be_replayed_and_purged(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue)
    fixed = threading.Event()

    @worker.handler("k", max_attempts=1)
    def k(task: Task) -> None:
        if not fixed.is_set():
            raise RuntimeError("bug")

    with run_worker(worker):
        for i in range(3):
            queue.schedule("k", i, task_id=f"d{i}")
        wait_for(lambda: queue.stats().dead == 3)
        fixed.set()
        assert queue.replay(["d0"]) == 1
        wait_for(lambda: state(queue, "d0") == "done")
        assert queue.purge_dead(["d1"]) == 1
        assert queue.get("d1") is None
        assert queue.replay() == 1
        wait_for(lambda: state(queue, "d2") == "done")
    assert queue.stats().dead == 0


def test_async_handler_timeout_counts_as_failure(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue)

    @worker.handler("slow", timeout=0.1, max_attempts=1)
    async def slow(task: Task) -> None:
        await asyncio.sleep(5)

    with run_worker(worker):
        queue.schedule("slow", None, task_id="s1")
        wait_for(lambda: state(queue, "s1") == "dead")
    info = queue.get("s1")
    assert info is not None and "TimeoutError" in (info.last_error or "")


def test_lost_lease_cancels_async_handler_and_its_ack_is_refused(
    queue: Queue, run_worker: Any
) -> None:
    """Another claimer takes the task over after its lease expired: the first handler is
    cancelled when the heartbeat finds out, and the first worker never acks it."""
    worker = Worker(queue, lease=1)
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

    runner = SyncRunner(queue.client)
    with run_worker(worker):
        queue.schedule("long", None, task_id="L")
        assert started.wait(10)
        # The lease runs out (a stalled worker) and a rival claims it, in one transaction so
        # the worker's own claim loop cannot reap it in between.
        rival = take_over(queue, "L")
        assert [t.id for t in rival.tasks] == ["L"]
        assert cancelled.wait(10)
        time.sleep(0.3)
    info = queue.get("L")
    assert info is not None and info.state == "active" and info.attempts == 2
    # The rival, holding the current token, finishes it.
    assert runner.run(leasing.ack(queue.core, [("L", rival.tasks[0].token)])) == []
    assert state(queue, "L") == "done"


def take_over(queue: Queue, task_id: str) -> leasing.ClaimResult:
    """Expire ``task_id``'s lease and claim it as a rival would, atomically."""
    op = leasing.claim(queue.core, limit=1, lease_ms=60_000)
    queue.client.script_load(op.script.source)
    pipe = queue.client.pipeline(transaction=True)
    pipe.zadd(queue.core.keys.active, {task_id: 0})
    pipe.evalsha(op.script.sha, len(op.keys), *op.keys, *op.args)
    return op.parse(pipe.execute()[1])


def test_worker_that_reclaims_its_own_stalled_task_runs_it_again_and_stops_the_old_run(
    queue: Queue, run_worker: Any
) -> None:
    """The lease of a run expires while this worker stalls; its own next claim takes the
    task back. The old run is told its lease is lost; only the new run's result counts."""
    worker = Worker(queue, lease=30)
    attempts: list[int] = []
    old_cancelled = threading.Event()

    @worker.handler("long")
    async def long(task: Task) -> None:
        attempts.append(task.attempt)
        if task.attempt == 1:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                old_cancelled.set()
                raise

    with run_worker(worker):
        queue.schedule("long", None, task_id="S")
        wait_for(lambda: attempts == [1])
        queue.client.zadd(queue.core.keys.active, {"S": 0})  # expired; the worker reaps it
        assert old_cancelled.wait(10)
        wait_for(lambda: state(queue, "S") == "done")
    assert attempts == [1, 2]
    info = queue.get("S")
    assert info is not None and info.attempts == 2
    assert queue.stats().counters["leases_expired"] == 1


def test_graceful_shutdown_hands_back_unfinished_tasks(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue, grace=0.3)
    started = threading.Event()

    @worker.handler("long")
    def long(task: Task) -> None:
        started.set()
        time.sleep(2)

    @worker.handler("quick")
    async def quick(task: Task) -> None:
        await asyncio.sleep(0.05)

    wt = run_worker(worker)
    with wt:
        queue.schedule("long", None, task_id="long1")
        queue.schedule("quick", None, task_id="q1")
        assert started.wait(10)
        wait_for(lambda: state(queue, "q1") == "done")
        t0 = time.monotonic()
        wt.stop()
        assert time.monotonic() - t0 < 2  # did not wait for the 2 s handler
    info = queue.get("long1")
    assert info is not None and info.state == "scheduled"
    assert info.attempts == 0  # handed back: the interrupted attempt does not count
    assert queue.stats().counters["released"] == 1


def test_graceful_shutdown_lets_short_handlers_finish(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue, grace=5)
    started = threading.Event()

    @worker.handler("k")
    async def k(task: Task) -> None:
        started.set()
        await asyncio.sleep(0.3)

    wt = run_worker(worker)
    with wt:
        queue.schedule("k", None, task_id="k1")
        assert started.wait(10)
        wt.stop()
    assert state(queue, "k1") == "done"


def test_idle_worker_wakes_for_an_earlier_task_without_polling(
    queue: Queue, run_worker: Any
) -> None:
    """With the idle cap at 30 s, only the wake-up message can start this task promptly."""
    worker = Worker(queue, max_wait=30)
    ran = threading.Event()
    worker.handler("k")(lambda task: ran.set())
    with run_worker(worker):
        queue.schedule("k", None, delay=3600, task_id="far")
        time.sleep(0.3)  # the worker now sleeps towards the far task
        queue.schedule("k", None, delay=0.1, task_id="near")
        assert ran.wait(5)
    assert state(queue, "near") == "done"
    assert state(queue, "far") == "scheduled"


def test_a_task_due_between_milliseconds_never_starts_before_its_time(
    queue: Queue, run_worker: Any
) -> None:
    """The worker maps the server's clock to the microsecond and due times keep theirs, so a
    timer started for a task set at=t fires at t or after, never up to a millisecond before."""
    worker = Worker(queue)
    starts: dict[str, tuple[float, float]] = {}
    seen_due: dict[str, float] = {}
    done = threading.Event()

    @worker.handler("k")
    def k(task: Task) -> None:
        starts[task.id] = (time.time(), task.payload)
        seen_due[task.id] = task.due_at.timestamp() - task.payload
        if len(starts) == 40:
            done.set()

    with run_worker(worker):
        time.sleep(0.3)
        base = time.time() + 0.5
        queue.schedule_many(
            [
                TaskSpec("k", base + i * 0.0131, at=base + i * 0.0131, task_id=f"t{i}")
                for i in range(40)
            ]
        )
        assert done.wait(10)
    early = {tid: due - start for tid, (start, due) in starts.items() if start < due}
    assert not early, f"started before their due time (s): {early}"
    assert max(abs(d) for d in seen_due.values()) < 2e-6  # task.due_at to the microsecond


def test_on_uvloop_a_task_never_starts_before_its_time(queue: Queue) -> None:
    """uvloop's loop.time() is the time its pass began, to the millisecond, and it rounds
    timer delays to whole milliseconds: the server-clock mapping and the timers must not
    trust either, or async handlers start up to half a millisecond before their due time."""
    uvloop = pytest.importorskip("uvloop")
    worker = Worker(queue)
    starts: dict[str, tuple[float, float]] = {}
    done = threading.Event()

    @worker.handler("k")
    async def k(task: Task) -> None:
        starts[task.id] = (time.time(), task.due_at.timestamp())
        if len(starts) == 60:
            done.set()

    loop = uvloop.new_event_loop()
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            loop.run_until_complete(worker.serve())
        except BaseException as e:  # surfaced below
            errors.append(e)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        time.sleep(0.3)
        base = time.time() + 0.5
        queue.schedule_many(
            [TaskSpec("k", i, at=base + i * 0.0073, task_id=f"u{i}") for i in range(60)]
        )
        assert done.wait(10)
    finally:
        worker.stop()
        thread.join(30)
        loop.close()
    assert not thread.is_alive() and not errors
    early = {tid: due - start for tid, (start, due) in starts.items() if start < due}
    assert not early, f"started before their due time (s): {early}"


def test_idle_worker_reaps_a_lease_that_ends_before_its_next_look(
    queue: Queue, run_worker: Any
) -> None:
    """With the idle cap at 30 s, only the claim's announcement of its (short) lease can get
    a crashed worker's task handed back and run again promptly."""
    worker = Worker(queue, max_wait=30)
    attempts: list[int] = []
    ran = threading.Event()

    @worker.handler("k")
    def k(task: Task) -> None:
        attempts.append(task.attempt)
        ran.set()

    with run_worker(worker):
        time.sleep(0.3)  # the worker has looked once and now sleeps towards its 30 s look
        # Placed without a producer's wake-up, then claimed by a worker that dies at once.
        k_ = queue.core.keys
        record = encode_record("k", b"null", max_attempts=0, created_ms=1, fmt="json")
        queue.client.hset(k_.tasks, "lost", record)
        queue.client.zadd(k_.scheduled, {"lost": 0})
        crashed = SyncRunner(queue.client).run(leasing.claim(queue.core, limit=1, lease_ms=1000))
        assert [t.id for t in crashed.tasks] == ["lost"]
        assert ran.wait(8), "the expired lease waited for the idle worker's periodic look"
    assert attempts == [2]


def test_worker_resubscribes_after_its_connection_is_killed(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue, max_wait=30)
    ran = threading.Event()
    worker.handler("k")(lambda task: ran.set())
    with run_worker(worker):
        time.sleep(0.3)
        assert queue.client.client_kill_filter(_type="pubsub") >= 1
        time.sleep(0.5)  # the waker reconnects (and re-checks the queue)
        queue.schedule("k", None, delay=0.1, task_id="after-kill")
        assert ran.wait(5)


def test_sync_handlers_run_in_threads_concurrently(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue, concurrency=8)
    barrier = threading.Barrier(8, timeout=10)

    @worker.handler("k")
    def k(task: Task) -> None:
        barrier.wait()  # only passes if 8 handlers run at the same time

    with run_worker(worker):
        for i in range(8):
            queue.schedule("k", None, task_id=f"c{i}")
        wait_for(lambda: queue.stats().done == 8)


def test_handler_registration_errors() -> None:
    from delayq import ConfigurationError

    q = Queue("reg", url="redis://127.0.0.1:1/0")
    w = Worker(q)
    w.handler("k")(lambda t: None)
    with pytest.raises(ConfigurationError, match="already registered"):
        w.handler("k")(lambda t: None)
    with pytest.raises(ConfigurationError, match="max_attempts"):
        w.handler("m", max_attempts=0)(lambda t: None)
    with pytest.raises(ConfigurationError, match="backoff"):
        w.handler("b", backoff=[])(lambda t: None)
    with pytest.raises(ConfigurationError, match="concurrency"):
        Worker(q, concurrency=0)
    with pytest.raises(ConfigurationError, match="from 1 to 10,000"):
        Worker(q, concurrency=10**9)  # would start a billion threads
    with pytest.raises(ConfigurationError, match="lease"):
        Worker(q, lease=0.1)


async def test_worker_on_an_async_queue(aqueue: Any) -> None:
    """The asyncio flavour end to end: AsyncQueue produces, a Worker built on it serves on
    the same event loop."""
    worker = Worker(aqueue)
    done = asyncio.Event()

    @worker.handler("k")
    async def k(task: Task) -> None:
        if task.attempt == 1:
            raise Retry(after=0.05)
        done.set()

    serving = asyncio.create_task(worker.serve())
    await aqueue.schedule("k", {"a": 1}, delay=0.1, task_id="a1")
    await asyncio.wait_for(done.wait(), 10)
    for _ in range(100):
        info = await aqueue.get("a1")
        if info.state == "done":
            break
        await asyncio.sleep(0.02)
    worker.stop()
    await asyncio.wait_for(serving, 10)
    assert info.state == "done" and info.attempts == 2


def test_scripts_are_reloaded_after_script_flush(queue: Queue, run_worker: Any) -> None:
    """A failover or restart empties the script cache: calls load the script again (NOSCRIPT)."""
    queue.schedule("k", None, delay=60, task_id="before")
    queue.client.script_flush()
    assert queue.reschedule("before", delay=0.1)
    worker = Worker(queue)
    worker.handler("k")(lambda task: None)
    with run_worker(worker):
        wait_for(lambda: state(queue, "before") == "done")
        queue.client.script_flush()
        queue.schedule_many([{"kind": "k", "task_id": f"m{i}"} for i in range(3)])
        wait_for(lambda: queue.stats().done == 4)


def test_listeners_see_start_and_outcome_of_every_attempt(queue: Queue, run_worker: Any) -> None:
    from delayq.worker.events import TaskEvent

    worker = Worker(queue)
    seen: list[TaskEvent] = []
    worker.add_listener(seen.append)

    @worker.handler("k", max_attempts=2, backoff=[0.05])
    def k(task: Task) -> None:
        if task.payload == "fail":
            raise ValueError("nope")
        if task.payload == "discard":
            raise Discard("moved on")

    with run_worker(worker):
        queue.schedule("k", "ok", task_id="ok")
        queue.schedule("k", "fail", task_id="bad")
        queue.schedule("k", "discard", task_id="dis")
        wait_for(lambda: queue.stats().done == 2 and queue.stats().dead == 1)
    by = {(e.task_id, e.attempt, e.event) for e in seen}
    assert {("ok", 1, "started"), ("ok", 1, "succeeded"), ("dis", 1, "discarded")} <= by
    assert {
        ("bad", 1, "failed"),
        ("bad", 1, "retried"),
        ("bad", 2, "failed"),
        ("bad", 2, "dead"),
    } <= by
    started = [e for e in seen if e.event == "started"]
    assert all(e.lateness is not None and e.lateness >= 0 for e in started)
    assert all(e.duration is not None for e in seen if e.event != "started")
    assert all(e.queue == queue.name and e.kind == "k" for e in seen)


def test_workers_register_and_unregister(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue, concurrency=3)
    worker.handler("k")(lambda task: None)
    with run_worker(worker):
        wait_for(lambda: queue.workers())
        (info,) = queue.workers()
        assert info.id == worker.id and info.alive
        assert info.concurrency == 3 and info.kinds == ["k"] and info.pid > 0
    assert queue.workers() == []  # a clean stop removes the registration


def test_a_worker_that_stops_beating_shows_as_dead(queue: Queue) -> None:
    from delayq import leasing
    from delayq.runner import SyncRunner

    runner = SyncRunner(queue.client)
    info = '{"host":"h","pid":1,"concurrency":1,"in_flight":0,"kinds":[],"beat":1}'
    runner.run(leasing.claim(queue.core, limit=0, lease_ms=1000, worker="w1", worker_info=info))
    assert [w.alive for w in queue.workers()] == [True]
    now = int(time.time() * 1000)
    assert [w.alive for w in runner.run(queue.core.workers(now_ms=now + 5000))] == [False]


def test_startup_hooks_run_before_the_first_claim(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue)
    ran: list[str] = []
    worker.handler("k")(lambda task: ran.append(task.id))

    @worker.on_startup
    async def seed(w: Worker) -> None:
        await w.runner.run(w.core.schedule([TaskSpec("k", task_id="seeded")]))

    with run_worker(worker):
        wait_for(lambda: ran == ["seeded"])


def test_worker_warns_when_the_server_may_evict_tasks(
    make_server: Any, run_worker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    srv = make_server(extra=["--maxmemory-policy", "allkeys-lru"])
    q = Queue("evict", url=srv.url)
    worker = Worker(q)
    with caplog.at_level("WARNING", logger="delayq.worker"), run_worker(worker):
        wait_for(lambda: q.workers())
    assert worker.engine is not None and worker.engine.eviction_policy == "allkeys-lru"
    assert any("maxmemory-policy is 'allkeys-lru'" in r.getMessage() for r in caplog.records)
    q.close()


async def test_a_serve_cancelled_during_start_up_closes_its_timerfd(aqueue: Any) -> None:
    """serve() makes its alarm (a timerfd the loop watches) before the start-up hooks run: a
    serve() cancelled while a hook awaits (or failing there) must still close it, and stop
    the loop watching it, or each such start leaks a file descriptor and a reader."""
    worker = Worker(aqueue)
    worker.handler("k")(lambda task: None)
    entered = asyncio.Event()

    @worker.on_startup
    async def hang(w: Worker) -> None:
        entered.set()
        await asyncio.Event().wait()

    serving = asyncio.create_task(worker.serve())
    await asyncio.wait_for(entered.wait(), 10)
    assert worker.engine is not None
    alarm = worker.engine.runs.alarm
    serving.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(serving, 30)
    if alarm is not None:  # (None where there is no timerfd)
        assert alarm.fd == -1, "the timerfd was left open"
    assert all(t.done() for t in worker.engine.loops)


_FREEZE_SCRIPT = """
import asyncio, gc, sys
from delayq import Queue, Worker

queue = Queue("gcfreeze", url=sys.argv[1])
worker = Worker(queue, freeze_gc=sys.argv[2] == "1")
before = gc.get_freeze_count()

async def main():
    serving = asyncio.create_task(worker.serve())
    await asyncio.sleep(0.5)
    print(before, gc.get_freeze_count())
    worker.stop()
    await serving

asyncio.run(main())
queue.close()
"""


@pytest.mark.parametrize("freeze", [True, False])
def test_a_serving_worker_freezes_what_start_up_left_for_the_garbage_collector(
    server: Any, freeze: bool
) -> None:
    """A full collection walks every object the process holds and holds the loop meanwhile
    (13 ms in bench/worker_proc.py): serve() moves what start-up left into the collector's
    permanent generation, unless told not to."""
    out = subprocess.run(
        [sys.executable, "-c", _FREEZE_SCRIPT, server.url, "1" if freeze else "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    before, after = int(out[0]), int(out[1])
    assert before == 0
    assert (after > 1000) if freeze else (after == 0), out


def test_a_steady_stream_is_claimed_in_steps_and_its_results_written_in_batches(
    queue: Queue, run_worker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """2,000 tasks falling due 0.5 ms apart: the worker claims them at most one claim per
    CLAIM_STEP_S and writes their results at most one write per WRITE_EVERY_S, instead of a
    claim and a write per round trip as handlers finish (about one per task here). Every
    task still runs once, and none before its due time."""
    calls = {"claim": 0, "ack": 0}

    def counting(name: str) -> Any:
        real = getattr(leasing, name)

        def counted(*args: Any, **kw: Any) -> Any:
            calls[name] += 1
            return real(*args, **kw)

        return counted

    for name in calls:
        monkeypatch.setattr(leasing, name, counting(name))
    worker = Worker(queue)
    early: list[str] = []
    ran: list[str] = []

    @worker.handler("k")
    async def k(task: Task) -> None:
        if time.time() < task.due_at.timestamp():
            early.append(task.id)
        ran.append(task.id)

    n, span = 2000, 1.0
    with run_worker(worker):
        t0 = time.time() + 0.5
        queue.schedule_many(
            [TaskSpec("k", None, task_id=f"s{i}", at=t0 + i * span / n) for i in range(n)]
        )
        wait_for(lambda: queue.stats().done == n, timeout=30)
        took = time.time() - t0
    assert sorted(ran) == sorted(f"s{i}" for i in range(n)) and not early
    # Without the claim step 3,500-3,900 claims; without the write interval 1,700-1,900
    # writes. (Some slack: the looks before the stream, claims cut short by the room.)
    assert calls["claim"] <= 1.2 * took / CLAIM_STEP_S + 20, calls
    assert calls["ack"] <= 1.2 * took / WRITE_EVERY_S + 20, calls
