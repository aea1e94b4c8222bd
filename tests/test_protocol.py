"""Protocol v1's version in Redis: a queue is stamped by its first write, a queue of another
major is refused by producers and workers (both versions named, nothing written), and an
unstamped or same-major queue is used as is. Then what docs/protocol.md tells a producer
of the scripts' behaviour, checked with the exported scripts on a real server: the same id
twice in one call, the payload limit, get's score, when due_at is null, max_shards, a
cancelled id scheduled again."""

from __future__ import annotations

import asyncio
import json
import pickle
import time
from typing import Any

import pytest
import redis

from delayq import (
    AsyncQueue,
    ConfigurationError,
    Fail,
    InvalidTaskError,
    PayloadTooLarge,
    ProtocolVersionError,
    Queue,
    Task,
    Worker,
)
from delayq.embedded import EmbeddedServer
from delayq.keys import MAX_SHARDS, QueueKeys
from delayq.protocol.export import manifest
from delayq.protocol.version import PROTOCOL_VERSION
from delayq.scripts import SCRIPTS
from delayq.shards import Shards

from .support.helpers import wait_for


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
    assert queue.protocol_version() == PROTOCOL_VERSION == "1.1"
    stored = queue.client.hgetall(queue.shards.root.keys.shards)
    assert stored == {b"n": b"1", b"protocol": PROTOCOL_VERSION.encode()}
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
    assert f"protocol 0.9, an older major than this delayq's {PROTOCOL_VERSION}" in str(err.value)
    _stamp(server, qname, "banana")
    with Queue(qname, url=server.url) as queue, pytest.raises(ProtocolVersionError) as err:
        queue.get("a")
    assert f"'banana', which is not one (this delayq speaks {PROTOCOL_VERSION})" in str(err.value)


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
        assert queue.protocol_version() == PROTOCOL_VERSION
        ran: list[Any] = []
        worker = Worker(queue)
        worker.handler("k")(lambda task: ran.append(task.payload))
        with run_worker(worker):
            wait_for(lambda: ran == [2])


@pytest.mark.parametrize("stamp", ["1", "1.0", "1.7"])
def test_a_queue_of_the_same_major_is_used_as_is(
    server: EmbeddedServer, qname: str, stamp: str
) -> None:
    _stamp(server, qname, stamp, n=1)
    with Queue(qname, url=server.url) as queue:
        queue.schedule("k", 1, task_id="a", delay=60)
        # Used as is; a write raises an earlier minor to this delayq's ("1" is 1.0)
        assert queue.protocol_version() == ("1.7" if stamp == "1.7" else PROTOCOL_VERSION)


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


# -- What docs/protocol.md tells a producer, run as another language runs the scripts --------


def _run(r: redis.Redis, name: str, qname: str, args: dict[str, Any], rest: list[Any]) -> Any:
    """The exported script ``name`` (byte for byte what delayq loads) by EVALSHA, its KEYS
    and ARGV as the manifest orders them."""
    script = SCRIPTS[name]
    keys = QueueKeys(qname)
    argv = [args[a] for a in script.arg_names]
    sha = r.script_load(script.source)
    names = script.key_names
    return r.evalsha(sha, len(names), *(getattr(keys, k) for k in names), *argv, *rest)


def _schedule(r: redis.Redis, qname: str, tasks: list[tuple[str, str, str]], replace: bool) -> Any:
    """The statuses, read as a 1.0 caller reads them: the first entries of the reply."""
    return _schedule_reply(r, qname, tasks, replace)[: len(tasks)]


def _schedule_reply(
    r: redis.Redis, qname: str, tasks: list[tuple[str, str, str]], replace: bool
) -> Any:
    args = {
        "now": "",
        "dedupe_ms": 86400000,
        "replace": "1" if replace else "0",
        "channel": QueueKeys(qname).wake_channel,
        "durable": "0",
    }
    return _run(r, "schedule", qname, args, [x for task in tasks for x in task])


def test_schedule_and_reschedule_reply_the_now_that_gives_each_stored_due_time(
    server: EmbeddedServer, qname: str
) -> None:
    """Protocol 1.1: schedule's reply is the statuses, where a 1.0 caller reads them, then
    the now (ms) the call ran at: a task created or replaced with "+ms" is stored due at
    now + ms, one with an absolute due at that number. reschedule says the same with its
    reply argument "now"; without it, its reply is 1.0's bare 0 or 1."""
    keys = QueueKeys(qname)
    r = redis.Redis.from_url(server.url)
    try:
        tasks = [
            ("rel", "+60000", _record("k", "1")),
            ("abs", "1732900000000.25", _record("k", "1")),
            ("rel", "+5", _record("k", "2")),  # the same id again: unchanged, not written
        ]
        before = r.time()
        reply = _schedule_reply(r, qname, tasks, False)
        assert reply[:3] == [1, 1, 0] and len(reply) == 4
        now = reply[3]
        assert isinstance(now, int) and now >= before[0] * 1000 + before[1] // 1000
        assert r.zscore(keys.scheduled, "rel") == now + 60000
        assert r.zscore(keys.scheduled, "abs") == 1732900000000.25
        args = {"now": "", "channel": keys.wake_channel, "id": "rel", "due": "+7000"}
        moved, now = _run(r, "reschedule", qname, {**args, "reply": "now"}, [])
        assert moved == 1 and r.zscore(keys.scheduled, "rel") == now + 7000
        assert _run(r, "reschedule", qname, {**args, "reply": ""}, []) == 1
        assert _run(r, "reschedule", qname, {**args, "id": "no", "reply": ""}, []) == 0
        moved, now = _run(r, "reschedule", qname, {**args, "id": "no", "reply": "now"}, [])
        assert moved == 0 and isinstance(now, int)
    finally:
        r.close()


def _record(kind: str, payload: str) -> str:
    return json.dumps({"k": kind, "c": 1732900000000}, separators=(",", ":")) + "\n" + payload


@pytest.mark.parametrize("replace", [False, True])
@pytest.mark.parametrize("between", [0, 999])  # the second in the same batch, or the next
def test_the_same_id_twice_in_one_schedule_call_keeps_the_first_or_with_replace_the_last(
    server: EmbeddedServer, qname: str, replace: bool, between: int
) -> None:
    first = ("a", "1732900000000", _record("k", "1"))
    last = ("a", "1732900005000", _record("k", "2"))
    others = [(f"o{i}", "1732900000000", _record("k", "0")) for i in range(between)]
    r = redis.Redis.from_url(server.url)
    try:
        statuses = _schedule(r, qname, [first, *others, last], replace)
        assert statuses == [1, *[1] * between, 2 if replace else 0]
        keys = QueueKeys(qname)
        kept = last if replace else first
        assert r.hget(keys.tasks, "a") == kept[2].encode()
        assert r.zscore(keys.scheduled, "a") == float(kept[1])
        assert r.zcard(keys.scheduled) == 1 + between  # one task
    finally:
        r.close()
    twice = [{"kind": "k", "task_id": "b"}, {"kind": "k", "task_id": "b"}]
    with Queue(qname, url=server.url) as queue, pytest.raises(InvalidTaskError, match="twice"):
        queue.schedule_many(twice)  # delayq's producer refuses it


def test_the_server_takes_a_payload_of_any_size_the_python_producer_checks_max_payload(
    server: EmbeddedServer, qname: str
) -> None:
    r = redis.Redis.from_url(server.url)
    try:  # the schedule script has no limit to check: 1 MiB is written whole
        big = _record("k", '"' + "x" * (1 << 20) + '"')
        assert _schedule(r, qname, [("big", "+60000", big)], False) == [1]
        assert r.hget(QueueKeys(qname).tasks, "big") == big.encode()
    finally:
        r.close()
    # The producer: the payload's encoded bytes, at most max_payload (inclusive); the kind,
    # the headers and the rest of the record do not count.
    with Queue(f"{qname}-p", url=server.url, max_payload=100) as queue:
        assert len(json.dumps("x" * 98)) == 100
        queue.schedule("k", "x" * 98, delay=60)  # exactly 100 bytes: accepted
        queue.schedule("k" * 200, "x" * 98, delay=60, headers={"h": "v" * 3000})
        queue.schedule("k", "é" * 49, delay=60)  # 49 * 2 bytes of UTF-8, and the quotes
        for payload in ("x" * 99, "é" * 50):
            with pytest.raises(PayloadTooLarge, match="over the queue's limit of 100"):
                queue.schedule("k", payload, delay=60)
            with pytest.raises(PayloadTooLarge, match="over the queue's limit of 100"):
                queue.schedule_many([{"kind": "k", "payload": payload}])
        assert queue.stats().scheduled == 3
    with Queue(f"{qname}-m", url=server.url, max_payload=4, codec="msgpack") as queue:
        queue.schedule("k", "abc", delay=60)  # msgpack: 0xa3 and three bytes
        with pytest.raises(PayloadTooLarge, match="5 bytes encoded"):
            queue.schedule("k", "abcd", delay=60)


@pytest.mark.parametrize("resp", [2, 3])
def test_gets_score_is_a_bulk_string_of_ms_that_may_carry_a_fraction(
    server: EmbeddedServer, qname: str, resp: int
) -> None:
    r = redis.Redis.from_url(server.url, protocol=resp)
    try:
        tasks = [
            ("whole", "1732900000000", _record("k", "1")),
            ("quarter", "1732900000000.250", _record("k", "1")),
            ("micro", "1732900000000.001", _record("k", "1")),
        ]
        assert _schedule(r, qname, tasks, False) == [1, 1, 1]
        scores = {}
        for task_id, _, record in tasks:
            state, score, rec, error, attempt, result = _run(r, "get", qname, {"id": task_id}, [])
            assert (state, rec, error, attempt) == (b"scheduled", record.encode(), None, None)
            assert result is None  # (protocol 1.1: a done task's result)
            scores[task_id] = score
    finally:
        r.close()
    # Bulk strings in RESP3 too (not doubles): the shortest decimal of the stored double.
    assert scores == {
        "whole": b"1732900000000",
        "quarter": b"1732900000000.25",
        "micro": b"1732900000000.001",
    }
    with Queue(qname, url=server.url) as queue:
        info = queue.get("quarter")
        assert info is not None and info.due_at is not None
        assert info.due_at.timestamp() * 1000 == 1732900000000.25


def test_due_at_is_null_only_for_a_task_that_is_not_waiting_and_never_ran(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    queue = Queue(qname, url=server.url)
    worker = Worker(queue)
    worker.handler("ok")(lambda task: None)

    @worker.handler("fails")
    def fails(task: Task) -> None:
        raise Fail("no")

    @worker.handler("slow")
    async def slow(task: Task) -> None:
        await asyncio.sleep(60)

    at = time.time() + 0.3
    queue.schedule("ok", task_id="done", at=at)
    queue.schedule("fails", task_id="dead", at=at)
    queue.schedule("slow", task_id="stopped", at=at)
    queue.schedule("ok", task_id="waiting", delay=60)
    queue.schedule("ok", task_id="aborted", delay=60)
    assert queue.abort("aborted")
    r = redis.Redis.from_url(server.url)  # a record no delayq wrote, buried by the claim
    _schedule(r, qname, [("corrupt", "+0", "not a header\nnull")], False)
    r.close()
    with run_worker(worker):
        wait_for(lambda: queue.stats().done == 1 and queue.stats().dead == 2)
        running = wait_for(lambda: (t := queue.get("stopped")) and t.state == "active" and t)
        assert running.due_at is not None
        assert running.due_at.timestamp() == pytest.approx(at, abs=0.001)
        assert queue.abort("stopped")  # aborted while it runs
    names = ("done", "dead", "stopped", "waiting", "aborted", "corrupt")
    infos = {i: queue.get(i) for i in names}
    states = {i: (t.state, t.attempts) for i, t in infos.items() if t is not None}
    assert states == {
        "done": ("done", 1),
        "dead": ("dead", 1),
        "stopped": ("aborted", 1),
        "waiting": ("scheduled", 0),
        "aborted": ("aborted", 0),
        "corrupt": ("dead", 0),
    }
    due = {i: t.due_at.timestamp() if t and t.due_at else None for i, t in infos.items()}
    # Its due time while it waits; once it ran, the due time of its last run; never ran: None.
    # (A tombstone keeps its last run's due time as the ms from it to the finish: the
    # worker's reckoning of the server's clock for a done task, to a few ms.)
    for i in ("dead", "stopped"):
        assert due[i] == pytest.approx(at, abs=0.001)
    assert due["done"] == pytest.approx(at, abs=0.02)
    assert due["waiting"] is not None and due["waiting"] > time.time() + 50
    assert due["aborted"] is None and due["corrupt"] is None
    queue.close()


def test_max_shards_bounds_the_shard_count_which_the_script_itself_does_not_check(
    server: EmbeddedServer, qname: str
) -> None:
    assert manifest()["max_shards"] == MAX_SHARDS == 1024
    with pytest.raises(ConfigurationError, match="from 1 to 1,024"):
        Queue(qname, url=server.url, shards=1025)
    with Queue(qname, url=server.url, shards=1024) as queue:  # the largest
        ids = queue.schedule_many([{"kind": "k", "delay": 60} for _ in range(50)])
        assert queue.stats().scheduled == 50 and all(queue.get(i) is not None for i in ids)
    other = f"{qname}-big"
    r = redis.Redis.from_url(server.url)
    try:  # the shards script stores whatever count it is sent
        args = {"want": "2000", "store": "1", "protocol": PROTOCOL_VERSION}
        reply = _run(r, "shards", other, args, [])
        assert reply == [2000, PROTOCOL_VERSION.encode(), b"", b"", b""]
    finally:
        r.close()
    stored = r"stored a shard count of 2000, not one from 1 to the protocol's max_shards \(1024\)"
    with pytest.raises(ConfigurationError, match=stored):  # no delayq opens it
        Queue(other, url=server.url, shards="stored")  # (it reads the count as it opens)


def test_a_cancelled_id_can_be_scheduled_again_at_once(server: EmbeddedServer, qname: str) -> None:
    r = redis.Redis.from_url(server.url)
    try:
        assert _schedule(r, qname, [("a", "+60000", _record("k", "1"))], False) == [1]
        first = float(r.zscore(QueueKeys(qname).scheduled, "a") or 0)
        args = {"id": "a", "now": "", "dedupe_ms": 60_000, "trim_limit": 100}
        args["finished"] = QueueKeys(qname).finished_channel
        assert _run(r, "cancel", qname, args, []) == 1
        # Forgotten, record and all; a tombstone says when it was cancelled (protocol 1.1).
        state, at, record, error, attempt, result = _run(r, "get", qname, {"id": "a"}, [])
        assert (state, record, error, attempt, result) == (b"cancelled", b"", None, None, None)
        assert float(at) >= first - 60_000
        assert not r.hexists(QueueKeys(qname).tasks, "a")
        assert _schedule(r, qname, [("a", "+120000", _record("k", "2"))], False) == [1]
        assert r.zscore(QueueKeys(qname).cancelled, "a") is None  # the tombstone goes
        state, score, record, _, _, _ = _run(r, "get", qname, {"id": "a"}, [])
        assert (state, record) == (b"scheduled", _record("k", "2").encode())
        assert float(score) >= first + 59000  # the new call's due time
    finally:
        r.close()
    with Queue(qname, url=server.url) as queue:
        assert queue.cancel("a")
        again = queue.schedule("k", 3, task_id="a", delay=60)
        assert again.status == "created"
        info = queue.get("a")
        assert info is not None and info.payload == 3
