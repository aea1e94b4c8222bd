"""The wake-up sleep: pokes are never lost, answered pokes do not spin."""

from __future__ import annotations

import asyncio

from delayq.worker.waker import Waker


async def test_poke_before_sleeping_returns_at_once() -> None:
    """A poke that lands while the claim loop is busy (say, mid-claim) must still wake it."""
    waker = Waker(client=None, channel="unused")
    waker.poke()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await waker.sleep_until(t0 + 5)
    assert loop.time() - t0 < 1


async def test_answered_poke_sleeps_until_the_deadline() -> None:
    waker = Waker(client=None, channel="unused")
    waker.poke()
    waker.reset()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await waker.sleep_until(t0 + 0.2)
    assert loop.time() - t0 >= 0.19


async def test_announced_due_time_shortens_the_sleep_and_a_later_one_does_not() -> None:
    waker = Waker(client=None, channel="unused")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    # Server time and loop time coincide here: due_to_loop is the identity (ms -> s).
    loop.call_later(0.05, waker._note, str(int((t0 + 0.1) * 1000)).encode())
    loop.call_later(0.06, waker._note, str(int((t0 + 9) * 1000)).encode())
    await waker.sleep_until(t0 + 5, lambda ms: ms / 1000, lookahead=0.0)
    assert 0.08 <= loop.time() - t0 < 1
