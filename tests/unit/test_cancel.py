"""cancel_and_wait: background loops stop even when a cancellation is swallowed on the way
(redis-py's connection set-up under Python 3.11 was seen to lose one, and the worker's
shutdown then waited for ever on its wake-up loop)."""

from __future__ import annotations

import asyncio

from delayq.cancel import cancel_and_wait


async def _swallows(times: int, seen: list[int]) -> None:
    """A loop whose first ``times`` cancellations are lost inside something it awaits."""
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            seen.append(1)
            if len(seen) > times:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]


async def test_a_loop_that_loses_a_cancellation_is_stopped() -> None:
    seen: list[int] = []
    task = asyncio.create_task(_swallows(2, seen))
    await asyncio.sleep(0)
    stopper = asyncio.create_task(cancel_and_wait([task], again_after=0.05))
    try:
        done, _ = await asyncio.wait([stopper], timeout=5)
        assert stopper in done, "cancel_and_wait did not stop a loop that lost a cancellation"
        assert task.cancelled() and len(seen) == 3
    finally:
        for _ in range(3):  # failed: stop the loop and the stopper so the test ends
            task.cancel()
            await asyncio.sleep(0)
        stopper.cancel()


async def test_a_single_cancel_is_not_enough_for_such_a_loop() -> None:
    """The old way (cancel once, gather) does not stop it: the case the helper exists for."""
    seen: list[int] = []
    task = asyncio.create_task(_swallows(1, seen))
    await asyncio.sleep(0)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=0.3)
    assert not done and seen == [1]
    await cancel_and_wait([task], again_after=0.05)
    assert task.cancelled()


async def test_finished_and_failed_tasks_are_waited_for_quietly() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    async def ends() -> None:
        return None

    tasks = [asyncio.create_task(fails()), asyncio.create_task(ends())]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks)  # errors are retrieved, not raised
    assert isinstance(tasks[0].exception(), ValueError) and tasks[1].result() is None
