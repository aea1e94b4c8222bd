"""Runs started in shared tasks (worker/batches.py) behave as if each had a task of its own."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Callable, Coroutine
from typing import Any

from delayq.worker import batches as batches_module
from delayq.worker.batches import Batches

Job = Callable[[], Coroutine[Any, Any, None]]
VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def starter(abandoned: list[str] | None = None) -> Batches[tuple[str, Job]]:
    def begin(run: tuple[str, Job], task: asyncio.Task[None]) -> Any:
        return run[1]()

    def abandon(run: tuple[str, Job]) -> None:
        assert abandoned is not None
        abandoned.append(run[0])

    return Batches(begin, abandon)


async def settle(b: Batches[Any]) -> None:
    while b.tasks:
        await asyncio.gather(*b.tasks, return_exceptions=True)


async def test_runs_that_finish_at_once_share_a_task_and_one_that_waits_keeps_its_own() -> None:
    seen: dict[str, list[asyncio.Task[Any] | None]] = {}

    def job(name: str, wait: bool) -> Job:
        async def run() -> None:
            seen[name] = [asyncio.current_task()]
            if wait:
                await asyncio.sleep(0.01)
            seen[name].append(asyncio.current_task())

        return run

    b = starter()
    for i in range(5):
        b.start((f"quick{i}", job(f"quick{i}", False)))
    b.start(("waits", job("waits", True)))
    b.start(("after", job("after", False)))
    await settle(b)
    quick = {t for i in range(5) for t in seen[f"quick{i}"]}
    assert len(quick) == 1  # five runs, one task
    first, last = seen["waits"]
    assert first is last  # the task it waited in is the one it began in
    assert seen["after"][0] is not first  # the run after it went on in a new task


async def test_a_timeout_in_one_run_stops_that_run_only() -> None:
    done: list[str] = []

    def job(name: str, delay: float) -> Job:
        async def run() -> None:
            try:
                async with asyncio.timeout(0.05):
                    await asyncio.sleep(delay)
                done.append(name)
            except TimeoutError:
                done.append(f"{name} timed out")

        return run

    b = starter()
    b.start(("slow", job("slow", 1.0)))
    b.start(("fast", job("fast", 0.01)))
    await settle(b)
    assert sorted(done) == ["fast", "slow timed out"]


async def test_each_run_starts_in_a_fresh_context() -> None:
    seen: list[str] = []

    async def setter() -> None:
        seen.append(VAR.get())
        VAR.set("leaked")

    b = starter()
    for i in range(3):
        b.start((f"r{i}", setter))
    await settle(b)
    assert seen == ["unset", "unset", "unset"]


async def test_runs_not_started_when_their_task_is_cancelled_are_handed_back(
    monkeypatch: Any,
) -> None:
    """Shutdown cancels a shared task while it hands the loop over between runs: the runs it
    had not started go back to their owner, none is lost or started after the cancel."""
    monkeypatch.setattr(batches_module, "SLICE_S", -1.0)  # hand over after every run
    ran: list[str] = []
    abandoned: list[str] = []

    def job(name: str) -> Job:
        async def run() -> None:
            ran.append(name)

        return run

    b = starter(abandoned)
    for name in "abcd":
        b.start((name, job(name)))
    await asyncio.sleep(0)  # the shared task runs "a", then hands the loop over
    for t in list(b.tasks):
        t.cancel()
    await asyncio.gather(*b.tasks, return_exceptions=True)
    assert ran == ["a"]
    assert abandoned == ["b", "c", "d"]


async def test_runs_of_a_task_cancelled_before_it_began_are_handed_back() -> None:
    ran: list[str] = []
    abandoned: list[str] = []

    async def run() -> None:
        ran.append("x")

    b = starter(abandoned)
    b.start(("a", run))
    b.start(("b", run))
    for t in list(b.tasks):
        t.cancel()  # before its first step
    await asyncio.gather(*b.tasks, return_exceptions=True)
    await asyncio.sleep(0)  # the done callback
    assert ran == [] and abandoned == ["a", "b"]
    assert not b.tasks
    b.start(("c", run))  # a new batch opens
    await settle(b)
    assert ran == ["x"] and abandoned == ["a", "b"]
