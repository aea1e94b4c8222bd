"""Scripts exported by an earlier delayq still work against a queue this delayq serves.

Each folder ``tests/support/protocol_export_<version>/`` holds a producer export exactly as
``delayq protocol export`` wrote it then (the scripts and ``manifest.json``; ``1_0`` is that
of commit cab574e, protocol 1.0, before the Lua library was split into includes). A
producer in another language ships such a copy and keeps running it after the workers are
upgraded, so the tests run those files as it would (EVALSHA of the manifest's SHA-1, SCRIPT
LOAD of the file on NOSCRIPT, KEYS and ARGV as the manifest names them), and check that
this delayq's worker runs what they scheduled exactly once, and that this delayq's
``Queue`` and the old ``get`` read what the other wrote.

To keep a later 1.x change honest (new record fields, settings, priorities), add nothing
here: the old folders must keep passing. A new minor's export may be added as a folder of
its own, and every test runs on each folder."""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq import Queue, Task, Worker
from delayq.embedded import EmbeddedServer
from delayq.expiring.facade import Expired
from delayq.protocol.export import key_suffixes
from delayq.protocol.version import PROTOCOL_VERSION

from .support.helpers import wait_for

EXPORTS = sorted((Path(__file__).parent / "support").glob("protocol_export_*"))


class OldProducer:
    """A producer of another language, with the scripts of one export."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.manifest = json.loads((directory / "manifest.json").read_text(encoding="utf-8"))
        self.scripts = {s["name"]: s for s in self.manifest["scripts"]}
        self.bodies = {n: (directory / s["file"]).read_bytes() for n, s in self.scripts.items()}

    def key(self, tag: str, name: str) -> str:
        """``<prefix>:{<tag>}:<suffix>``, as the manifest spells the layout."""
        assert self.manifest["key_format"] == "<prefix>:{<tag>}:<suffix>"
        return f"{self.manifest['default_prefix']}:{{{tag}}}:{self.manifest['keys'][name]}"

    def call(self, r: redis.Redis, name: str, tag: str, args: dict[str, Any], *rest: Any) -> Any:
        """The script ``name`` on the tag ``tag`` (the queue's name: one shard), by EVALSHA;
        on NOSCRIPT, SCRIPT LOAD of the file and EVALSHA again."""
        entry = self.scripts[name]
        assert set(args) == set(entry["argv"]), (name, entry["argv"])
        assert not rest or entry["variadic"], name
        keys = [self.key(tag, k) for k in entry["keys"]]
        argv = [args[a] for a in entry["argv"]]
        try:
            return r.evalsha(entry["sha1"], len(keys), *keys, *argv, *rest)
        except redis.exceptions.NoScriptError:
            assert r.script_load(self.bodies[name]) == entry["sha1"]
            return r.evalsha(entry["sha1"], len(keys), *keys, *argv, *rest)

    # The operations, as docs/protocol.md describes them to a producer.

    def open(self, r: redis.Redis, qname: str, store: bool) -> Any:
        args = {"want": "1", "store": "1" if store else "0", "protocol": self.protocol}
        return self.call(r, "shards", qname, args)

    @property
    def protocol(self) -> str:
        return str(self.manifest["protocol"])

    def schedule(
        self, r: redis.Redis, qname: str, tasks: list[tuple[str, str, str]], replace: bool = False
    ) -> Any:
        args = {
            "now": "",
            "dedupe_ms": "86400000",
            "replace": "1" if replace else "0",
            "channel": self.key(qname, "wake_channel"),
            "durable": "0",
        }
        return self.call(r, "schedule", qname, args, *(x for task in tasks for x in task))

    def reschedule(self, r: redis.Redis, qname: str, task_id: str, due: str) -> Any:
        args = {"now": "", "channel": self.key(qname, "wake_channel"), "id": task_id, "due": due}
        return self.call(r, "reschedule", qname, args)

    def cancel(self, r: redis.Redis, qname: str, task_id: str) -> Any:
        return self.call(r, "cancel", qname, {"id": task_id})

    def get(self, r: redis.Redis, qname: str, task_id: str) -> Any:
        return self.call(r, "get", qname, {"id": task_id})

    def expire_set(self, r: redis.Redis, qname: str, key: str, value: Any, ttl_ms: int) -> int:
        created = int(time.time() * 1000)
        header = json.dumps({"k": "delayq.expire", "c": created}, separators=(",", ":"))
        args = {
            "now": "",
            "channel": self.key(qname, "wake_channel"),
            "key": key,
            "id": f"x:{secrets.token_urlsafe(12).replace('-', '_')}:{key}",  # a new one per set
            "ttl_ms": str(ttl_ms),
            "header": header + "\n",
            "value": json.dumps(value),
        }
        deadline = self.call(r, "expire_set", qname, args)
        r.set(key, json.dumps(value), pxat=deadline)
        return int(deadline)

    def expire_touch(self, r: redis.Redis, qname: str, key: str, ttl_ms: int) -> bool:
        args = {"now": "", "channel": self.key(qname, "wake_channel"), "key": key}
        deadline = self.call(r, "expire_touch", qname, {**args, "ttl_ms": str(ttl_ms)})
        return deadline != -1 and bool(r.pexpireat(key, deadline))

    def expire_delete(self, r: redis.Redis, qname: str, key: str) -> bool:
        cancelled = self.call(r, "expire_delete", qname, {"now": "", "key": key})
        r.delete(key)
        return bool(cancelled)


def record(kind: str, payload: Any, headers: dict[str, str] | None = None) -> str:
    header: dict[str, Any] = {"k": kind, "c": int(time.time() * 1000)}
    if headers:
        header["h"] = headers
    return json.dumps(header, separators=(",", ":")) + "\n" + json.dumps(payload)


@pytest.fixture(params=EXPORTS, ids=[p.name for p in EXPORTS])
def old(request: pytest.FixtureRequest) -> OldProducer:
    return OldProducer(request.param)


def test_there_is_an_export_to_test() -> None:
    assert [p.name for p in EXPORTS][:1] == ["protocol_export_1_0"]


def test_the_export_is_as_written_and_its_keys_are_this_delayqs(
    old: OldProducer, server: EmbeddedServer
) -> None:
    files = sorted(p.name for p in old.directory.iterdir())
    assert files == sorted(["manifest.json", *(s["file"] for s in old.scripts.values())])
    assert old.protocol.split(".")[0] == "1"
    r = redis.Redis.from_url(server.url)
    try:
        for name, entry in old.scripts.items():  # the files as exported, byte for byte
            assert hashlib.sha1(old.bodies[name]).hexdigest() == entry["sha1"]
            assert r.script_load(old.bodies[name]) == entry["sha1"]
    finally:
        r.close()
    suffixes = key_suffixes() | {"wake_channel": "wake"}
    assert {k: suffixes[k] for k in old.manifest["keys"]} == old.manifest["keys"]


def test_what_old_scripts_schedule_a_current_worker_runs_once_and_current_reads_read(
    old: OldProducer, server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    r = redis.Redis.from_url(server.url)
    try:
        assert old.open(r, qname, store=True) == [1, old.protocol.encode()]
        one = record("old.run", {"n": 1}, {"tenant": "acme"})
        assert old.schedule(r, qname, [("one", "+0", one)]) == [1]
        many = [(f"m{i}", f"+{10 * i}", record("old.run", {"n": 10 + i})) for i in range(5)]
        far = [(i, "+3600000", record("old.run", {"n": i})) for i in ("moved", "cancelled")]
        assert old.schedule(r, qname, many + far) == [1] * 7
        assert old.schedule(r, qname, [("one", "+0", record("old.run", "again"))]) == [0]
        assert old.cancel(r, qname, "cancelled") == 1
        assert old.reschedule(r, qname, "moved", "+0") == 1
        state, _, rec, error, attempt = old.get(r, qname, "one")
        assert (state, rec, error, attempt) == (b"scheduled", one.encode(), None, None)
        assert old.get(r, qname, "cancelled") is None
    finally:
        r.close()

    queue = Queue(qname, url=server.url)
    info = queue.get("one")  # what the old scripts wrote, as this delayq reads it
    assert info is not None and info.state == "scheduled"
    assert (info.kind, info.payload, info.headers) == ("old.run", {"n": 1}, {"tenant": "acme"})
    assert queue.get("cancelled") is None
    assert queue.protocol_version() == old.protocol

    ran: list[tuple[str, Any, dict[str, str]]] = []
    worker = Worker(queue)

    @worker.handler("old.run")
    def run(task: Task) -> None:
        ran.append((task.id, task.payload, dict(task.headers)))

    expected = {"one", "moved", *(f"m{i}" for i in range(5))}
    with run_worker(worker):
        wait_for(lambda: queue.stats().done == len(expected))
        time.sleep(0.3)  # time for a second run, if there were one
    assert sorted(i for i, _, _ in ran) == sorted(expected)  # each exactly once
    assert ("one", {"n": 1}, {"tenant": "acme"}) in ran
    assert queue.stats().done == len(expected) and queue.stats().dead == 0

    r = redis.Redis.from_url(server.url)
    try:
        # A done task is a tombstone now: the old get reads its state and the tombstone,
        # "<attempts> <ms from due to finish> <kind's code>", its attempts entry gone; and
        # the old schedule still refuses its id within the dedupe window.
        state, _, tomb, _, attempt = old.get(r, qname, "m3")
        assert (state, attempt) == (b"done", None)
        assert tomb.split()[0] == b"1" and tomb[:1].isdigit()  # its first run
        again = [(i, "+0", record("old.run", "again")) for i in ("one", "m3")]
        assert old.schedule(r, qname, again) == [0, 0]
        # and the old get reads what this delayq writes
        queue.schedule("new.kind", {"x": [1, 2]}, task_id="new", delay=60, headers={"h": "v"})
        state, score, rec, _, _ = old.get(r, qname, "new")
        assert state == b"scheduled" and float(score) > time.time() * 1000 + 50_000
        head, payload = rec.decode().split("\n", 1)
        assert json.loads(head)["k"] == "new.kind" and json.loads(head)["h"] == {"h": "v"}
        assert json.loads(payload) == {"x": [1, 2]}
        # this delayq's writes raised the queue's minor; the old producer uses it as is
        assert old.open(r, qname, store=False) == [1, PROTOCOL_VERSION.encode()]
    finally:
        r.close()
    assert (info := queue.get("one")) is not None and info.state == "done"
    queue.close()


def test_what_old_scripts_set_to_expire_a_current_worker_delivers_once(
    old: OldProducer, server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    r = redis.Redis.from_url(server.url)
    try:
        assert old.open(r, qname, store=True) == [1, old.protocol.encode()]
        deadline = old.expire_set(r, qname, "sess:fires", {"v": 1}, 60_000)
        assert deadline > time.time() * 1000 + 50_000
        assert old.expire_touch(r, qname, "sess:fires", 300)  # sooner: it fires in 0.3 s
        old.expire_set(r, qname, "sess:deleted", {"v": 2}, 400)
        assert old.expire_delete(r, qname, "sess:deleted")
        assert not old.expire_touch(r, qname, "sess:unknown", 1000)
    finally:
        r.close()

    queue = Queue(qname, url=server.url)
    fired: list[tuple[str, Any, bool]] = []
    worker = Worker(queue)

    @worker.on_expire("sess:*")
    def expired(e: Expired) -> None:
        fired.append((e.key, e.value, e.guaranteed))

    with run_worker(worker):
        wait_for(lambda: fired, timeout=10)
        time.sleep(0.6)  # past the deleted key's old deadline, and time for a second call
    assert fired == [("sess:fires", {"v": 1}, True)]
    assert queue.client.exists("sess:fires", "sess:deleted") == 0
    queue.close()
