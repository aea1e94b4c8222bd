"""The connection a queue keeps for its single calls (delayq/held.py), sync and asyncio: each
way it can fail to answer ends in the client's own path, with the same result, and the
held connection serves the next call again.

Real servers: a flushed script cache, connections killed between calls, a reply lost in
flight (through the in-test proxy), a server that stops answering (CLIENT PAUSE) for a
queue with a short socket timeout, threads and tasks sharing a queue, a forked child, a
sharded queue, a client passed in."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from delayq import AsyncQueue, Queue
from delayq.embedded import EmbeddedServer
from delayq.errors import ConnectionFailed
from delayq.held import MISSED, AsyncHeldConnection
from delayq.keys import shard_of

from .support.proxy import FaultProxy


@pytest.fixture
def admin(server: EmbeddedServer) -> Iterator[redis.Redis]:
    r = redis.Redis(host=server.host, port=server.port)
    yield r
    r.close()


def _ids(admin: redis.Redis, queue: Queue | AsyncQueue) -> set[str]:
    return {i.decode() for i in admin.zrange(queue.core.keys.scheduled, 0, -1)}


def test_single_calls_take_one_held_connection_and_no_other(
    queue: Queue, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = queue.schedule("k", 0)  # connects, checks the shard count, loads the scripts
    assert queue.get(first) is not None and not queue.cancel("none")
    pool = queue.client.connection_pool
    taken: list[object] = []
    give = pool.get_connection
    monkeypatch.setattr(pool, "get_connection", lambda *a, **kw: taken.append(1) or give(*a, **kw))
    ids = [queue.schedule("k", i) for i in range(20)]
    assert queue.get(ids[0]) is not None and queue.cancel(ids[1])
    assert taken == []  # every call went on the held connection, none through the pool
    held = queue.runner.held
    assert held is not None and held.conn in pool._in_use_connections
    assert [s.status for s in ids] == ["created"] * 20
    assert _ids(admin, queue) == {first, *ids} - {ids[1]}


def test_a_flushed_script_cache_is_reloaded_and_the_call_made(
    queue: Queue, admin: redis.Redis
) -> None:
    first = queue.schedule("k", 1)
    admin.script_flush()
    second = queue.schedule("k", 2)  # NOSCRIPT on the held connection: loaded and sent again
    assert [first.status, second.status] == ["created", "created"]
    assert queue.get(second) is not None  # (the get script was flushed too)
    assert _ids(admin, queue) == {first, second}
    held = queue.runner.held
    assert held is not None and held.conn is not None and held.conn.is_connected


def test_a_connection_killed_between_calls_is_replaced(queue: Queue, admin: redis.Redis) -> None:
    first = queue.schedule("k", 1)
    killed = admin.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 1
    second = queue.schedule("k", 2)  # the held connection fails; the client's path succeeds
    third = queue.schedule("k", 3)  # and the held one, reconnected, serves again
    assert [s.status for s in (first, second, third)] == ["created"] * 3
    assert _ids(admin, queue) == {first, second, third}
    held = queue.runner.held
    assert held is not None and held.conn is not None and held.conn.is_connected


def test_a_reply_lost_in_flight_is_resent_and_reported_unchanged(
    server: EmbeddedServer, admin: redis.Redis, qname: str
) -> None:
    """The call ran but its reply never came (the link reset): the client's path sends it
    again; the id was made by the client, so the task is written once, and the resend is
    reported as what it is: unchanged."""
    with FaultProxy(server.port) as proxy, Queue(qname, url=proxy.url) as queue:
        queue.schedule("k", 0)
        proxy.latency = 0.2  # each way: the request reaches the server after 0.2 s
        result: list[object] = []
        call = threading.Thread(target=lambda: result.append(queue.schedule("k", "lost")))
        call.start()
        time.sleep(0.3)  # the script has run; its reply waits in the proxy
        proxy.latency = 0.0
        assert proxy.reset_all() >= 1
        call.join(10)
        assert not call.is_alive()
        (tid,) = result
        assert tid.status == "unchanged"  # type: ignore[attr-defined]
        assert queue.get(str(tid)) is not None
        stats = queue.stats()
        assert stats.scheduled == 2 and stats.counters["scheduled"] == 2


def test_threads_share_a_queue(queue: Queue, admin: redis.Redis) -> None:
    """A thread that finds the held connection busy takes the client's pool."""
    made: list[str] = []
    lock = threading.Lock()

    def produce() -> None:
        for i in range(100):
            tid = queue.schedule("k", i)
            with lock:
                made.append(tid)

    threads = [threading.Thread(target=produce) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(set(made)) == 600
    assert _ids(admin, queue) == set(made)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_does_not_use_its_parents_connection(
    queue: Queue, admin: redis.Redis
) -> None:
    parent = queue.schedule("k", "before")
    held = queue.runner.held
    assert held is not None
    theirs = held.conn
    pid = os.fork()
    if pid == 0:  # the child: its own connection, the parent's left alone
        code = 1
        try:
            code = 0 if queue.schedule("k", "child").status == "created" else 2
            code = code or (3 if held.conn is theirs else 0)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    after = queue.schedule("k", "after")  # the parent's connection still in step
    assert queue.get(after) is not None and queue.get(parent) is not None
    assert len(_ids(admin, queue)) == 3


def test_a_sharded_queue_schedules_each_new_id_on_its_shard(
    server: EmbeddedServer, admin: redis.Redis, qname: str
) -> None:
    with Queue(qname, url=server.url, shards=4) as queue:
        ids = [queue.schedule("k", i) for i in range(40)]
        for core in queue.shards.cores:
            stored = {i.decode() for i in admin.zrange(core.keys.scheduled, 0, -1)}
            assert stored == {i for i in ids if shard_of(i, 4) == core.shard}
        assert len({shard_of(i, 4) for i in ids}) == 4
        assert all(queue.get(i) is not None for i in ids)
        assert queue.stats().scheduled == 40


def test_a_client_passed_in_is_not_held(server: EmbeddedServer, qname: str) -> None:
    client = redis.Redis(host=server.host, port=server.port)
    with Queue(qname, client=client) as queue:
        assert queue.schedule("k", 1).status == "created"
        assert queue.runner.held is None
    assert client.ping()  # the queue leaves the client open
    client.close()


def test_close_disconnects_the_held_connection(server: EmbeddedServer, qname: str) -> None:
    queue = Queue(qname, url=server.url)
    queue.schedule("k", 1)
    conn = queue.runner.held.conn  # type: ignore[union-attr]
    queue.close()
    assert not conn.is_connected


# -- asyncio -----------------------------------------------------------------------------------


async def test_async_single_calls_take_one_held_connection(
    aqueue: AsyncQueue, admin: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = await aqueue.schedule("k", 0)
    assert await aqueue.get(first) is not None and not await aqueue.cancel("none")
    pool = aqueue.client.connection_pool
    taken: list[object] = []
    give = pool.get_connection

    async def counted(*args: object, **kwargs: object) -> object:
        taken.append(1)
        return await give(*args, **kwargs)

    monkeypatch.setattr(pool, "get_connection", counted)
    ids = [await aqueue.schedule("k", i) for i in range(20)]
    assert await aqueue.get(ids[0]) is not None and await aqueue.cancel(ids[1])
    assert taken == []
    held = aqueue.runner.held
    assert held is not None and held.conn in pool._in_use_connections
    assert _ids(admin, aqueue) == {first, *ids} - {ids[1]}


async def test_async_flushed_scripts_and_killed_connections(
    aqueue: AsyncQueue, admin: redis.Redis
) -> None:
    first = await aqueue.schedule("k", 1)
    admin.script_flush()
    second = await aqueue.schedule("k", 2)
    assert admin.client_kill_filter(_type="normal", skipme=True) >= 1
    third = await aqueue.schedule("k", 3)
    fourth = await aqueue.schedule("k", 4)
    assert [s.status for s in (first, second, third, fourth)] == ["created"] * 4
    assert _ids(admin, aqueue) == {first, second, third, fourth}
    held = aqueue.runner.held
    assert held is not None and held.conn is not None and held.conn.is_connected


async def test_async_tasks_share_a_queue(aqueue: AsyncQueue, admin: redis.Redis) -> None:
    """Tasks that find the held connection busy take the client's pool."""
    ids = await asyncio.gather(*(aqueue.schedule("k", i) for i in range(80)))
    assert len(set(ids)) == 80 and _ids(admin, aqueue) == set(ids)


async def test_async_a_server_that_stops_answering_times_the_call_out_and_the_task_goes_on(
    server: EmbeddedServer, admin: redis.Redis, qname: str
) -> None:
    """The held connection has no timeout of its own while held; the queue's watch ends a
    call that outlives the client's socket_timeout (here 0.2 s) and the client's path takes
    over. The task that awaited it is not left cancelled."""
    async with AsyncQueue(qname, url=f"{server.url}?socket_timeout=0.2") as queue:
        await queue.schedule("k", 0)
        held = queue.runner.held
        assert isinstance(held, AsyncHeldConnection)
        op = queue._schedule_op("k", "paused", {})
        admin.client_pause(1000)  # ms: every client's commands wait
        t0 = time.monotonic()
        assert await held.call(op) is MISSED  # the watch ended it: the caller retries
        waited = time.monotonic() - t0
        assert 0.15 < waited < 0.9, waited  # between 1 and 1.25 timeouts, loosely
        assert not held.conn.is_connected  # dropped: its reply would come later
        task = asyncio.current_task()
        assert task is not None and task.cancelling() == 0  # not left cancelled
        await asyncio.sleep(0.01)
        admin.client_unpause()
        again = await queue.schedule("k", "after")  # reconnected
        assert again.status == "created"
        assert held.conn.is_connected


async def test_async_a_cancelled_call_leaves_the_connection_usable(
    aqueue: AsyncQueue, admin: redis.Redis
) -> None:
    await aqueue.schedule("k", 0)
    admin.client_pause(300)
    call = asyncio.ensure_future(aqueue.schedule("k", "cancelled"))
    await asyncio.sleep(0.05)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    admin.client_unpause()
    after = await aqueue.schedule("k", "after")
    assert after.status == "created" and await aqueue.get(after) is not None


def _pings(admin: redis.Redis) -> int:
    return int(admin.info("commandstats").get("cmdstat_ping", {}).get("calls", 0))


def test_a_health_check_interval_is_kept_on_the_held_connection(
    server: EmbeddedServer, admin: redis.Redis, qname: str
) -> None:
    """redis-py PINGs a connection idle longer than health_check_interval before using it;
    the held connection does too, and skips the check when no interval is set."""
    with Queue(qname, url=f"{server.url}?health_check_interval=1") as queue:
        queue.schedule("k", 0)
        before = _pings(admin)
        time.sleep(1.2)
        assert queue.schedule("k", 1).status == "created"
        assert _pings(admin) == before + 1


async def test_async_a_health_check_interval_is_kept_on_the_held_connection(
    server: EmbeddedServer, admin: redis.Redis, qname: str
) -> None:
    async with AsyncQueue(qname, url=f"{server.url}?health_check_interval=1") as queue:
        await queue.schedule("k", 0)
        before = _pings(admin)
        await asyncio.sleep(1.2)
        assert (await queue.schedule("k", 1)).status == "created"
        assert _pings(admin) == before + 1


# -- small pools: the held connection is lent back ---------------------------------------------


def _every_kind_of_call(queue: Queue, admin: redis.Redis) -> None:
    a = queue.schedule("k", 1)  # the first: the shard count check, then the call
    b = queue.schedule("k", 2, task_id="b", replace=True)  # a schedule_many of one (a plan)
    many = queue.schedule_many([{"kind": "k", "payload": i} for i in range(5)])  # pipeline
    assert queue.stats().scheduled == 7  # a pipeline
    assert queue.get(a) is not None and queue.get(b) is not None
    admin.script_flush()
    c = queue.schedule("k", 3)  # NOSCRIPT on the held connection: loaded on the client's path
    assert queue.cancel(c) and not queue.cancel(c)
    admin.script_flush()
    assert queue.stats().scheduled == 7  # NOSCRIPT in a pipeline: loaded, sent again
    assert queue.expiring.set("ttl-key", "v", 60)  # a plan with a plain command
    assert queue.client.ping()  # the caller's own command on the queue's client
    assert queue.schedule("k", 4).status == "created"
    assert _ids(admin, queue) >= {a, b, *many}


@pytest.mark.parametrize("size", [1, 2])
def test_a_pool_of_one_or_two_connections_serves_every_call(
    server: EmbeddedServer, admin: redis.Redis, qname: str, size: int
) -> None:
    """Seen failing before the lending: with max_connections=1 the first schedule's NOSCRIPT
    met "Too many connections" (and "check the server is running")."""
    with Queue(qname, url=f"{server.url}?max_connections={size}", dedupe_window=3600) as q:
        _every_kind_of_call(q, admin)
        pool = q.client.connection_pool
        assert len(pool._in_use_connections) + len(pool._available_connections) <= size


@pytest.mark.parametrize("size", [1, 2])
async def test_async_a_pool_of_one_or_two_connections_serves_every_call(
    server: EmbeddedServer, admin: redis.Redis, qname: str, size: int
) -> None:
    url = f"{server.url}?max_connections={size}"
    async with AsyncQueue(qname, url=url, dedupe_window=3600) as q:
        a = await q.schedule("k", 1)
        b = await q.schedule("k", 2, task_id="b", replace=True)
        many = await q.schedule_many([{"kind": "k", "payload": i} for i in range(5)])
        assert (await q.stats()).scheduled == 7
        assert await q.get(a) is not None and await q.get(b) is not None
        admin.script_flush()
        c = await q.schedule("k", 3)
        assert await q.cancel(c) and not await q.cancel(c)
        admin.script_flush()
        assert (await q.stats()).scheduled == 7
        assert await q.expiring.set("ttl-key", "v", 60)
        assert await q.client.ping()
        assert (await q.schedule("k", 4)).status == "created"
        assert _ids(admin, q) >= {a, b, *many}
        # (the asyncio pool counts its connections as it lends them)
        assert len(q.client.connection_pool._in_use_connections) <= size


def test_threads_share_a_queue_with_a_small_pool(
    server: EmbeddedServer, admin: redis.Redis, qname: str
) -> None:
    """As many threads as the pool has connections, each making single calls and
    pipelines: every call is served (seen failing before: "Too many connections" whenever
    all three were in pipelines while the held connection sat idle)."""
    errors: list[BaseException] = []
    made: list[str] = []
    lock = threading.Lock()
    with Queue(qname, url=f"{server.url}?max_connections=3", dedupe_window=3600) as q:

        def produce() -> None:
            try:
                for i in range(60):
                    tid = q.schedule("k", i)
                    (other,) = q.schedule_many([{"kind": "k", "payload": i}])
                    assert q.stats().scheduled >= 1 and q.get(tid) is not None
                    with lock:
                        made.extend((tid, other))
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=produce) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert errors == []
        assert len(set(made)) == 360 and _ids(admin, q) == set(made)


async def test_async_tasks_share_a_queue_with_a_small_pool(
    server: EmbeddedServer, admin: redis.Redis, qname: str
) -> None:
    """As many tasks as the pool has connections, each making single calls and pipelines."""
    async with AsyncQueue(qname, url=f"{server.url}?max_connections=3", dedupe_window=3600) as q:

        async def produce() -> list[str]:
            made = []
            for i in range(60):
                tid = await q.schedule("k", i)
                (other,) = await q.schedule_many([{"kind": "k", "payload": i}])
                assert (await q.stats()).scheduled >= 1 and await q.get(tid) is not None
                made += [tid, other]
            return made

        made = [i for part in await asyncio.gather(*(produce() for _ in range(3))) for i in part]
        assert len(set(made)) == 360 and _ids(admin, q) == set(made)


def test_a_pool_the_callers_own_calls_exhaust_says_so(server: EmbeddedServer, qname: str) -> None:
    """When every connection is really in use (here: taken by the caller's own code), the
    error names the pool's limit, not the server (seen failing before: "check the server is
    running")."""
    with Queue(qname, url=f"{server.url}?max_connections=1") as q:
        q.schedule("k", 0)
        pool = q.client.connection_pool
        theirs = pool.get_connection()  # the held connection is lent back to this
        try:
            for call in (lambda: q.schedule("k", 1), q.stats):
                with pytest.raises(ConnectionFailed) as err:
                    call()
                text = str(err.value)
                assert "max_connections=1" in text and "in use by this process" in text
                assert "check the server is running" not in text
        finally:
            pool.release(theirs)
        assert q.schedule("k", 2).status == "created"  # served again once it is back


async def test_async_a_pool_the_callers_own_calls_exhaust_says_so(
    server: EmbeddedServer, qname: str
) -> None:
    async with AsyncQueue(qname, url=f"{server.url}?max_connections=1") as q:
        await q.schedule("k", 0)
        pool = q.client.connection_pool
        theirs = await pool.get_connection()
        try:
            with pytest.raises(ConnectionFailed, match=r"max_connections=1\)") as err:
                await q.stats()
            assert "check the server is running" not in str(err.value)
        finally:
            await pool.release(theirs)
        assert (await q.schedule("k", 2)).status == "created"


def test_a_worker_on_a_pool_of_one_is_refused_naming_the_cause(
    server: EmbeddedServer, qname: str
) -> None:
    """Found by the review of issue 28: a Worker whose queue's URL says ?max_connections=1
    ran nothing, for ever, its claims failing with "in use by this process's other calls":
    its wake-up subscription held the pool's only connection. It is refused at start, naming
    the cause; a pool of two serves."""
    from delayq import ConfigurationError, Worker

    with Queue(qname, url=f"{server.url}?max_connections=1") as q:
        worker = Worker(q)
        worker.handler("k")(lambda task: None)
        with pytest.raises(ConfigurationError, match=r"at least 2 connections.*max_connections=1"):
            asyncio.run(asyncio.wait_for(worker.serve(), 10))
    with Queue(qname, url=f"{server.url}?max_connections=2") as q:
        q.schedule("k", {}, task_id="two")
        worker = Worker(q)
        ran: list[str] = []

        def handle(task: object) -> None:
            ran.append("two")
            worker.stop()

        worker.handler("k")(handle)
        asyncio.run(asyncio.wait_for(worker.serve(), 20))
        assert ran == ["two"]
