"""The worker's bookkeeping of the runs it holds (worker/runs.py)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from delayq import Queue, Task, Worker
from delayq.codec import Header
from delayq.errors import Defer
from delayq.leasing import Claimed
from delayq.worker.lane import Lane
from delayq.worker.lifecycle import DONE, ENDED, RUNNING
from delayq.worker.runs import MAX_AHEAD, MAX_QUEUED_S, PROBE_EVERY, Runs

from .support.helpers import wait_for


def claimed(tid: str, token: int) -> Claimed:
    return Claimed(tid, Header("k", 1, 0, token, 0, 0, "json"), b"null")


def lane_of(runs: Runs, executor: Any = None, finisher: Any = None) -> Lane:
    """A lane of a queue never connected to, with these stand-ins for its Executor and
    Finisher, added to ``runs``."""
    lane = Lane(Queue("q", url="redis://127.0.0.1:1/0"))  # builders only: never connects
    lane.executor, lane.finisher = executor, finisher
    runs.add_lane(lane)
    return lane


async def test_a_lost_lease_is_matched_by_token_not_by_task_id() -> None:
    """The heartbeat reports (id, token): a report about an older claim of a task must not
    stop the newer run of the same task."""
    freed: list[int] = []
    runs = Runs(lambda ms: 0.0, lambda: freed.append(1))
    lane = lane_of(runs)
    runs._launch = lambda run: None  # type: ignore[method-assign]  # no executor here
    runs.start(claimed("A", 2), lane)
    run = lane.by_id["A"]
    assert runs.busy == 1 and lane.leases == {"A": run.claimed}
    runs.leases_lost(lane, [("A", 1)])
    assert run.state == RUNNING and runs.busy == 1 and lane.leases == {"A": run.claimed}
    runs.leases_lost(lane, [("A", 2)])  # its handler had not begun: it ends at once
    assert run.state == DONE and runs.busy == 0 and lane.leases == {} and freed
    runs.leases_lost(lane, [("A", 2)])  # reported twice: the slot is freed once
    assert runs.busy == 0 and lane.by_id == {}


def test_deferring_tasks_never_overdraw_the_worker(queue: Queue, run_worker: Any) -> None:
    """Tasks handed back to run again soon (Defer, as a re-armed watched key is) are often
    claimed again before the hand-back is confirmed: the worker's slot count must hold."""
    worker = Worker(queue, concurrency=4)
    runs_seen: dict[str, int] = {}
    lowest: list[int] = [0]
    lock = threading.Lock()

    @worker.handler("k")
    async def k(task: Task) -> None:
        with lock:
            runs_seen[task.id] = runs_seen.get(task.id, 0) + 1
            lowest[0] = min(lowest[0], worker.engine.runs.busy)
        if runs_seen[task.id] <= 3:
            raise Defer(1)
        await asyncio.sleep(0)

    with run_worker(worker):
        for i in range(150):
            queue.schedule("k", i, task_id=f"d{i}")
        wait_for(lambda: queue.stats().done == 150, timeout=30)
        wait_for(lambda: worker.engine.runs.busy == 0, timeout=5)
    assert lowest[0] >= 0
    assert set(runs_seen.values()) == {4}  # three defers and one run each, no extra runs
    assert queue.stats().counters.get("leases_expired", 0) == 0


class Written:
    """A Finisher stand-in that only records the outcomes handed to it."""

    def __init__(self) -> None:
        self.outcomes: list[Any] = []

    def add(self, outcome: Any) -> None:
        self.outcomes.append(outcome)


def test_runs_are_claimed_ahead_only_for_handlers_that_finish_within_the_lookahead() -> None:
    runs = Runs(lambda ms: 0.0, lambda: None, concurrency=4, lookahead=0.02)
    assert runs.allowance() == 4  # no handler seen yet: the slots only
    runs.service_s = 0.010  # 4 slots, 10 ms each: 8 more start within 20 ms
    assert runs.allowance() == 4 + 8
    runs.service_s = 0.5
    assert runs.allowance() == 4
    runs.service_s = 1e-7
    assert runs.allowance() == 4 + MAX_AHEAD


async def test_runs_claimed_ahead_wait_for_a_slot_and_are_handed_back_unrun() -> None:
    """Claimed ahead, a run waits for a slot; at shutdown, or once it has waited too long
    for handlers that turned slow, it is handed back (release), never run late or lost."""
    written = Written()
    runs = Runs(lambda ms: 0.0, lambda: None, concurrency=1)
    lane = lane_of(runs, finisher=written)
    runs._launch = lambda run: None  # type: ignore[method-assign]  # no executor here
    for i, tid in enumerate("ABC"):
        runs.start(claimed(tid, i + 1), lane)
    assert (runs.busy, [r.claimed.id for r in runs.queued]) == (1, ["B", "C"])
    first = lane.by_id["A"]
    runs.queued[0].queued_at -= MAX_QUEUED_S + 1  # B waited too long
    runs._move(first, ENDED)  # A's handler finished: B is handed back, C takes the slot
    assert [(o.action, o.id) for o in written.outcomes] == [("release", "B")]
    assert runs.busy == 1 and not runs.queued and lane.by_id["C"].state == RUNNING
    runs.start(claimed("D", 9), lane)
    runs.release_unstarted()  # shutdown: D never started
    assert [(o.action, o.id) for o in written.outcomes] == [("release", "B"), ("release", "D")]


async def test_a_run_waiting_for_a_slot_is_handed_back_though_none_frees() -> None:
    """The handlers hang: no slot ever frees, and one timer hands back every run that waited
    its allowance (a sixth of the lease, here), whose lease was not extended meanwhile.
    Nothing more is claimed ahead then: the mean handler time says the slots turn over
    at least that slowly."""
    written = Written()
    runs = Runs(lambda ms: 0.0, lambda: None, concurrency=1, lookahead=0.02, lease_s=1.2)
    runs.service_s = 0.0001  # handlers seen fast: claims ahead
    lane = lane_of(runs, finisher=written)
    runs._launch = lambda run: None  # type: ignore[method-assign]  # no executor here
    runs.start_many(lane, [claimed(tid, i + 1) for i, tid in enumerate("ABC")])
    assert [r.claimed.id for r in runs.queued] == ["B", "C"]
    assert list(lane.leases) == ["A"]  # B's and C's are not extended while they wait
    assert runs.room() > 0 and runs.held == 3
    await asyncio.sleep(0.2 + 0.1)
    assert sorted((o.action, o.id) for o in written.outcomes) == [
        ("release", "B"),
        ("release", "C"),
    ]
    assert runs.busy == 1 and runs.held == 1 and not lane.leases.keys() - {"A"}
    assert runs.allowance() == 1 and runs.room() == 0


@pytest.mark.parametrize("concurrency", [1, 50])
async def test_a_worker_whose_handlers_hang_claims_nothing_back_after_a_hand_back(
    concurrency: int,
) -> None:
    """Every slot hangs and the runs claimed ahead are handed back: the worker then holds
    its slots and no more, however many it has, until it sees a handler finish (with 50
    slots and the default lookahead, a mean time of the allowance still left room for one,
    and the worker claimed back, about once a second, the task it had just handed back)."""
    written = Written()
    runs = Runs(lambda ms: 0.0, lambda: None, concurrency=concurrency, lookahead=0.02, lease_s=1.2)
    runs.service_s = 0.0001  # handlers seen fast: claims ahead
    lane = lane_of(runs, finisher=written)
    runs._launch = lambda run: None  # type: ignore[method-assign]  # no executor here
    runs.start_many(lane, [claimed(f"t{i}", i + 1) for i in range(concurrency + 3)])
    assert runs.busy == concurrency and len(runs.queued) == 3
    await asyncio.sleep(0.2 + 0.1)  # the allowance, a sixth of the lease, passes
    assert sorted(o.id for o in written.outcomes if o.action == "release") == [
        f"t{i}" for i in range(concurrency, concurrency + 3)
    ]
    assert runs.allowance() == concurrency and runs.room() == 0


def test_slow_handlers_get_no_tasks_claimed_ahead_from_other_workers(
    queue: Queue, run_worker: Any
) -> None:
    """Two workers, handlers of 0.2 s: the one that started first and has seen its handlers'
    time must not hold a backlog that the other could be running."""
    ran: dict[str, list[str]] = {"a": [], "b": []}
    lock = threading.Lock()

    def make(name: str) -> Worker:
        worker = Worker(queue, concurrency=2)

        @worker.handler("k")
        def k(task: Task) -> None:
            time.sleep(0.2)
            with lock:
                ran[name].append(task.id)

        return worker

    with run_worker(make("a")):
        queue.schedule_many([{"kind": "k", "task_id": f"w{i}"} for i in range(2)])
        wait_for(lambda: len(ran["a"]) == 2)  # a has seen how long its handlers take
        queue.schedule_many([{"kind": "k", "task_id": f"t{i}"} for i in range(12)])
        time.sleep(0.1)  # a has claimed what it will hold
        with run_worker(make("b")):
            wait_for(lambda: len(ran["a"]) + len(ran["b"]) == 14, timeout=20)
    assert len(ran["b"]) >= 4, ran


async def test_runs_whose_handler_waits_start_together_not_one_per_loop_pass() -> None:
    """A run that waits keeps its shared task and the rest need a new one, a loop pass
    later: once a kind's handler has been seen to wait, its runs start in tasks of their own,
    all in the same pass."""
    from delayq.connection import async_client
    from delayq.runner import AsyncRunner
    from delayq.worker.execute import Executor
    from delayq.worker.threads import HandlerThreads

    release = asyncio.Event()

    async def waits(task: Task) -> None:
        if not release.is_set():
            await release.wait()

    worker = Worker(Queue("q", url="redis://127.0.0.1:1/0"))  # builders only: never connects
    worker.handler("k")(waits)
    runner = AsyncRunner(async_client(worker.queue.url))
    threads = HandlerThreads(0, asyncio.get_running_loop(), "test")
    ctx = worker.context(runner, threads, asyncio.Event())
    executor = Executor(ctx)
    runs = Runs(lambda ms: 0.0, lambda: None, concurrency=100)
    lane = lane_of(runs, executor, Written())
    runs.start_many(lane, [claimed("first", 1)], 10**15)
    for _ in range(3):
        await asyncio.sleep(0)
    assert runs.started == 1  # it waited: the kind is known to wait now
    runs.start_many(lane, [claimed(f"t{i}", i + 2) for i in range(20)], 10**15)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert runs.started == 21
    release.set()
    while runs.running:
        await asyncio.sleep(0)
    # It stopped waiting: a probe every PROBE_EVERY runs notices, and shared tasks are back.
    for i in range(PROBE_EVERY + 2):
        runs.start_many(lane, [claimed(f"u{i}", 100 + i)], 10**15)
        while runs.running:
            await asyncio.sleep(0)
    assert runs._alone == {}


def test_a_run_due_a_fraction_of_a_millisecond_ahead_waits_for_its_timer() -> None:
    """A task due 0.1 ms from now starts on a timer at its time, not at once: starting it
    early by less than a millisecond would still be before its due time."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        runs = Runs(lambda ms: due_at, lambda: None)
        lane = lane_of(runs)
        due_at = loop.time() + 0.0001
        c = Claimed("A", Header("k", 1, 0, 7, 0, 1, "json"), b"null")
        runs.start_many(lane, [c], server_now_ms=0)
        run = lane.by_id["A"]
        assert run.at == due_at and not runs.running  # it waits for its time

    asyncio.run(main())


async def test_runs_due_together_share_one_timer_and_none_starts_before_its_time() -> None:
    """Runs waiting for their due time share one loop timer: when it goes off it starts
    every run whose time has come, so ten runs due at one instant set one timer, not ten.
    None starts before its own time, whichever timer starts it, and a run whose lease is
    lost while it waits never starts."""
    from delayq.connection import async_client
    from delayq.runner import AsyncRunner
    from delayq.worker.execute import Executor
    from delayq.worker.threads import HandlerThreads

    loop = asyncio.get_running_loop()
    started: dict[str, float] = {}

    async def k(task: Task) -> None:
        started[task.id] = loop.time()

    worker = Worker(Queue("q", url="redis://127.0.0.1:1/0"))  # builders only: never connects
    worker.handler("k")(k)
    runner = AsyncRunner(async_client(worker.queue.url))
    ctx = worker.context(runner, HandlerThreads(0, loop, "test"), asyncio.Event())
    timers: list[float] = []
    real_call_at = loop.call_at

    def call_at(when: float, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        timers.append(when)
        return real_call_at(when, *args, **kwargs)

    base = loop.time() + 0.02
    # due_ms is read as loop milliseconds here: ten tasks due together, then three apart
    dues = {**{f"t{i}": base for i in range(10)}, "a": base + 0.001, "b": base + 0.002}
    dues["lost"] = base + 0.0015
    runs = Runs(lambda ms: ms / 1000, lambda: None)
    lane = lane_of(runs, Executor(ctx), Written())
    batch = [
        Claimed(tid, Header("k", 1, 0, n + 1, 0, due * 1000, "json"), b"null")
        for n, (tid, due) in enumerate(dues.items())
    ]
    loop.call_at = call_at  # type: ignore[method-assign]
    try:
        runs.start_many(lane, batch, server_now_ms=0)
    finally:
        loop.call_at = real_call_at  # type: ignore[method-assign]
    assert timers == [base * 1000 / 1000] and not runs.running  # one timer, the earliest
    runs.leases_lost(lane, [("lost", lane.by_id["lost"].claimed.token)])
    deadline = loop.time() + 5
    while len(started) < 12 and loop.time() < deadline:
        await asyncio.sleep(0.001)
    await asyncio.sleep(0.01)
    assert sorted(started) == sorted(set(dues) - {"lost"})
    assert all(started[tid] >= dues[tid] for tid in started), "a run started early"
