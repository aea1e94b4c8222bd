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


class _FakePubSub:
    """A subscription whose get_message hands out the queued messages, then waits."""

    def __init__(self, client: _FakeClient) -> None:
        self.client = client
        self.closed = False
        self.messages: list[dict[str, object]] = []  # what this connection has received

    async def subscribe(self, *channels: str) -> None:
        self.client.subscribed += 1

    async def get_message(self, ignore_subscribe_messages: bool, timeout: float) -> object:
        if not self.messages:
            await asyncio.sleep(0.01)
        # (a message that arrived while it waited is returned by this call)
        return self.messages.pop(0) if self.messages else None

    async def aclose(self) -> None:
        self.closed = True


class _FakeClient:
    def __init__(self) -> None:
        self.subscribed = 0
        self.pubsubs: list[_FakePubSub] = []

    def pubsub(self) -> _FakePubSub:
        p = _FakePubSub(self)
        self.pubsubs.append(p)
        return p


async def test_a_message_heard_as_the_subscription_is_renewed_is_not_dropped() -> None:
    """Waker.renew closes the subscription at its next get_message: a message that call
    returned (an abort, an expiry bell) was received and must still be acted on, not
    dropped with the connection (an abort would then wait for the heartbeat)."""
    client = _FakeClient()
    waker = Waker(client=client, channel="wake")
    aborted: list[tuple[str, int]] = []
    waker.on_abort = lambda tid, lease: aborted.append((tid, lease))
    runner = asyncio.create_task(waker.run())
    try:
        for _ in range(100):
            if client.subscribed:
                break
            await asyncio.sleep(0.01)
        waker.renew()
        # Heard on the current connection, returned by the get_message under way.
        client.pubsubs[-1].messages.append(
            {"type": "message", "channel": b"wake", "data": b"abort 7 t1"}
        )
        for _ in range(100):
            if client.subscribed >= 2:
                break
            await asyncio.sleep(0.01)
        assert client.subscribed >= 2  # renewed
        assert aborted == [("t1", 7)]
        assert all(p.closed for p in client.pubsubs[:-1])  # no connection left open
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
