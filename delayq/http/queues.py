"""The API's queues: one :class:`~delayq.queue.AsyncQueue` per name, opened with the shard
count the queue stored, on one shared connection pool, and cached."""

from __future__ import annotations

from collections import OrderedDict

import redis.asyncio as aredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from delayq.keys import DEFAULT_PREFIX, validate_queue_name
from delayq.queue import AsyncQueue
from delayq.runner import translate
from delayq.shards import stored_count

MAX_CACHED = 1024  # queue names remembered (least recently used forgotten first)


class Queues:
    """Opens and caches the queues a request names.

    ``allowed``: the only queue names served (None: any); another is a 404.
    """

    def __init__(
        self,
        client: aredis.Redis,
        *,
        prefix: str = DEFAULT_PREFIX,
        allowed: frozenset[str] | None = None,
    ) -> None:
        self.client = client
        self.prefix = prefix
        self.allowed = allowed
        self._open: OrderedDict[str, AsyncQueue] = OrderedDict()

    def valid(self, name: str) -> bool:
        """A name this API serves (the Python API's rule, and the allowed list)."""
        if self.allowed is not None:
            return name in self.allowed
        try:
            validate_queue_name(name)
        except ValueError:
            return False
        return True

    async def get(self, name: str) -> AsyncQueue:
        """The queue ``name``, as ``Queue(name, shards="stored")`` opens it: with the shard
        count its first user stored (1 if none), read once per name."""
        q = self._open.get(name)
        if q is not None:
            self._open.move_to_end(name)
            return q
        q = AsyncQueue(name, client=self.client, prefix=self.prefix)
        n = (await q.runner.run(stored_count(q.shards.root))).n
        if n != 1:
            q = AsyncQueue(name, client=self.client, prefix=self.prefix, shards=n)
        self._open[name] = q
        if len(self._open) > MAX_CACHED:
            self._open.popitem(last=False)
        return q

    def forget(self, name: str) -> None:
        """Read the queue's shard count again on its next use (it was resharded)."""
        self._open.pop(name, None)

    async def ping(self) -> None:
        """Raise ConnectionFailed when Redis does not answer."""
        try:
            await self.client.ping()
        except (RedisConnectionError, RedisTimeoutError) as e:
            raise translate(e, self.client) from None


async def protocol_version(queue: AsyncQueue) -> str:
    """The queue's protocol version, for /readyz: ``AsyncQueue.protocol_version()``, read on
    every call (``""`` when the queue has none stored yet: it speaks protocol 1). A queue of
    another protocol major raises ProtocolVersionError (a 503: not ready)."""
    return await queue.protocol_version()
