"""Protocol v1's version in Redis: a queue is stamped by its first write, a queue of another
major is refused by producers and workers (both versions named, nothing written), and an
unstamped or same-major queue is used as is."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest
import redis

from delayq import AsyncQueue, ConfigurationError, ProtocolVersionError, Queue, Worker
from delayq.embedded import EmbeddedServer
from delayq.protocol.version import PROTOCOL_VERSION
from delayq.shards import Shards


def _keys(server: EmbeddedServer, qname: str) -> set[bytes]:
    r = redis.Redis.from_url(server.url)
    try:
        return set(r.scan_iter(match=f"dq:{{{qname}}}*")) | set(
            r.scan_iter(match=f"dq:{{{qname}#*}}*")
        )
    finally:
        r.close()


def _stamp(server: EmbeddedServer, qname: str, version: str, n: int | None = None) -> None:
    r = redis.Redis.from_url(server.url)
    key = Shards(qname, 1).root.keys.shards
    r.hset(key, "protocol", version)
    if n is not None:
        r.hset(key, "n", n)
    r.close()


def _refusal(err: BaseException, stored: str) -> None:
    assert isinstance(err, ProtocolVersionError) and isinstance(err, ConfigurationError)
    text = str(err)
    assert f"protocol {stored}" in text and f"this delayq speaks {PROTOCOL_VERSION}" in text
    assert "upgrade delayq" in text
    assert (err.stored, err.ours) == (stored, PROTOCOL_VERSION)
    again = pickle.loads(pickle.dumps(err))  # as ScriptError: it crosses processes
    assert (str(again), again.stored, again.ours) == (text, stored, PROTOCOL_VERSION)


def test_the_first_write_stamps_the_queue_and_a_read_does_not(
    server: EmbeddedServer, qname: str
) -> None:
    queue = Queue(qname, url=server.url)
    assert queue.get("nope") is None and queue.protocol_version() == ""  # reads stamp nothing
    assert _keys(server, qname) == set()
    queue.schedule("k", 1, task_id="a", delay=60)
    assert queue.protocol_version() == PROTOCOL_VERSION == "1.0"
    stored = queue.client.hgetall(queue.shards.root.keys.shards)
    assert stored == {b"n": b"1", b"protocol": b"1.0"}
    queue.close()


@pytest.mark.parametrize("shards", [1, 4])
def test_a_producer_refuses_a_queue_of_a_newer_major_and_writes_nothing(
    server: EmbeddedServer, qname: str, shards: int
) -> None:
    _stamp(server, qname, "2.0")
    before = _keys(server, qname)
    queue = Queue(qname, url=server.url, shards=shards)
    for call in (
        lambda: queue.schedule("k", 1, task_id="a"),
        lambda: queue.schedule_many([{"kind": "k", "task_id": "b"}]),
        lambda: queue.get("a"),
        lambda: queue.cancel("a"),
        lambda: queue.reschedule("a", delay=1),
        lambda: queue.expiring.set("sess", 1, 60),
        queue.stats,
        queue.protocol_version,
    ):
        with pytest.raises(ProtocolVersionError) as err:
            call()
        _refusal(err.value, "2.0")
    assert _keys(server, qname) == before  # nothing written, not even a shard count
    queue.close()


async def test_an_async_producer_refuses_a_newer_major(server: EmbeddedServer, qname: str) -> None:
    _stamp(server, qname, "3.1", n=1)
    queue = AsyncQueue(qname, url=server.url)
    with pytest.raises(ProtocolVersionError) as err:
        await queue.schedule("k", 1)
    _refusal(err.value, "3.1")
    with pytest.raises(ProtocolVersionError):
        await queue.protocol_version()
    await queue.close()


def test_a_worker_refuses_to_start_on_a_queue_of_a_newer_major(
    server: EmbeddedServer, qname: str
) -> None:
    _stamp(server, qname, "2.0", n=1)
    worker = Worker(Queue(qname, url=server.url))
    ran: list[Any] = []
    worker.handler("k")(ran.append)

    async def serve() -> None:
        await asyncio.wait_for(worker.serve(), 30)

    with pytest.raises(ProtocolVersionError) as err:
        asyncio.run(serve())
    _refusal(err.value, "2.0")
    assert ran == []


def test_an_older_major_or_a_stamp_that_is_no_version_is_refused(
    server: EmbeddedServer, qname: str
) -> None:
    _stamp(server, qname, "0.9", n=1)
    with Queue(qname, url=server.url) as queue, pytest.raises(ProtocolVersionError) as err:
        queue.schedule("k")
    assert "protocol 0.9, an older major than this delayq's 1.0" in str(err.value)
    _stamp(server, qname, "banana")
    with Queue(qname, url=server.url) as queue, pytest.raises(ProtocolVersionError) as err:
        queue.get("a")
    assert "'banana', which is not one (this delayq speaks 1.0)" in str(err.value)


def test_an_unstamped_queue_made_before_stamping_works_and_is_stamped_by_a_write(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    # What a delayq from before stamping left: a shard count, and tasks.
    with Queue(qname, url=server.url) as old:
        old.schedule("k", 1, task_id="a", delay=60)
        old.client.hdel(old.shards.root.keys.shards, "protocol")
    with Queue(qname, url=server.url) as queue:
        assert queue.protocol_version() == ""
        info = queue.get("a")
        assert info is not None and info.payload == 1
        assert queue.protocol_version() == ""  # a read leaves it so
        queue.schedule("k", 2, task_id="b")
        assert queue.protocol_version() == "1.0"
        ran: list[Any] = []
        worker = Worker(queue)
        worker.handler("k")(lambda task: ran.append(task.payload))
        with run_worker(worker):
            from .support.helpers import wait_for

            wait_for(lambda: ran == [2])


@pytest.mark.parametrize("stamp", ["1", "1.0", "1.7"])
def test_a_queue_of_the_same_major_is_used_as_is(
    server: EmbeddedServer, qname: str, stamp: str
) -> None:
    _stamp(server, qname, stamp, n=1)
    with Queue(qname, url=server.url) as queue:
        queue.schedule("k", 1, task_id="a", delay=60)
        assert queue.protocol_version() == stamp  # ("1" is 1.0: not raised)


def test_the_script_raises_the_minor_of_its_major_and_never_lowers_or_crosses_it(
    server: EmbeddedServer, qname: str
) -> None:
    queue = Queue(qname, url=server.url)
    root = queue.shards.root

    def store(protocol: str) -> tuple[int, str]:
        op = root.op("shards", {"want": 1, "store": "1", "protocol": protocol}, [], root_parse)
        return queue.runner.run(op)

    def root_parse(r: Any) -> tuple[int, str]:
        return int(r[0]), r[1].decode()

    assert store("1.2") == (1, "1.2")
    assert store("1.1") == (1, "1.2")  # never lowered
    assert store("1.10") == (1, "1.10")  # numbers, not text
    assert store("2.0") == (1, "1.10")  # another major writes nothing
    queue.client.delete(root.keys.shards)
    assert store("2.0") == (1, "2.0")
    queue.client.delete(root.keys.shards)
    queue.client.hset(root.keys.shards, "protocol", "3.0")
    assert store("2.0") == (0, "3.0")  # and stores no count either
    assert queue.client.hgetall(root.keys.shards) == {b"protocol": b"3.0"}
    queue.close()
