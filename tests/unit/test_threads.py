"""The handler threads (worker/threads.py): what they count and when they deliver."""

from __future__ import annotations

import asyncio
import threading

from delayq.worker.threads import HandlerThreads


async def _until(check: object, timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, "not within the timeout"
        await asyncio.sleep(0.005)


async def test_busy_counts_the_handlers_still_running_while_others_deliver_results() -> None:
    """A result delivered must not reset the count: one handler still runs (the shutdown's
    "still running" warning, and the end of a run's overrun, read it)."""
    threads = HandlerThreads(2, asyncio.get_running_loop(), "test-threads")
    release = threading.Event()
    try:
        stuck = threads.submit(lambda _: release.wait(10), None).fut
        await _until(lambda: threads.busy == 1)
        assert await threads.submit(lambda x: x + 1, 1).fut == 2
        assert threads.busy == 1
        release.set()
        assert await stuck is True
        assert threads.busy == 0
    finally:
        release.set()
        threads.shutdown()
