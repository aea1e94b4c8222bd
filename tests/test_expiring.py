"""Expiring keys with a guaranteed callback: timer, bell and scan, one run per expiry."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from delayq import Queue, Worker
from delayq.embedded import EmbeddedServer
from delayq.expiring.facade import Expired
from delayq.expiring.ops import encode_value, set_op
from delayq.runner import SyncRunner

from .support.helpers import wait_for


class Calls:
    """Thread-safe record of callback runs."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.items: list[tuple[Expired, float]] = []

    def __call__(self, expired: Expired) -> None:
        with self.lock:
            self.items.append((expired, time.time()))

    def keys(self) -> Counter[str]:
        with self.lock:
            return Counter(e.key for e, _ in self.items)

    def one(self, key: str) -> tuple[Expired, float]:
        (found,) = [(e, t) for e, t in self.items if e.key == key]
        return found


def watcher(queue: Queue, calls: Calls, pattern: str = "upload_session:*", **kw: Any) -> Worker:
    worker = Worker(queue, **kw)
    worker.on_expire(pattern)(calls)
    return worker


def test_callback_gets_the_value_at_the_deadline(queue: Queue, run_worker: Any) -> None:
    calls = Calls()
    with run_worker(watcher(queue, calls)):
        deadline = queue.expiring.set("upload_session:42", {"object_key": "tmp/abc"}, ttl=0.4)
        # An ordinary key: other code reads it and its TTL.
        assert queue.client.get("upload_session:42") == b'{"object_key":"tmp/abc"}'
        assert 0 < queue.client.pttl("upload_session:42") <= 400
        wait_for(lambda: calls.keys()["upload_session:42"] == 1)
        time.sleep(0.3)  # the bell that follows must not cause a second run
    expired, at = calls.one("upload_session:42")
    assert expired.value == {"object_key": "tmp/abc"}
    assert expired.via == "timer" and expired.guaranteed
    assert expired.deadline == deadline
    assert 0 <= at - deadline.timestamp() < 0.5  # sanity bound; bench/ measures precision
    assert queue.client.exists("upload_session:42") == 0
    assert calls.keys() == Counter({"upload_session:42": 1})


def test_touch_extends_and_delete_cancels(queue: Queue, run_worker: Any) -> None:
    calls = Calls()
    with run_worker(watcher(queue, calls)):
        queue.expiring.set("upload_session:t", 1, ttl=0.3)
        queue.expiring.set("upload_session:d", 2, ttl=0.3)
        t0 = time.time()
        assert queue.expiring.touch("upload_session:t", ttl=1.0)
        assert queue.expiring.delete("upload_session:d")
        assert queue.client.exists("upload_session:d") == 0
        wait_for(lambda: calls.keys()["upload_session:t"] == 1, timeout=5)
        time.sleep(0.3)
    assert calls.one("upload_session:t")[1] - t0 >= 0.95
    assert calls.keys()["upload_session:d"] == 0
    assert queue.expiring.touch("upload_session:never", ttl=1) is False


def test_ttl_extended_by_plain_pexpire_is_rearmed_not_fired(queue: Queue, run_worker: Any) -> None:
    calls = Calls()
    with run_worker(watcher(queue, calls)):
        deadline = queue.expiring.set("upload_session:x", "v", ttl=0.3)
        queue.client.pexpire("upload_session:x", 1200)  # other code extends it
        wait_for(lambda: calls.keys()["upload_session:x"] == 1, timeout=5)
    expired, at = calls.one("upload_session:x")
    assert at - deadline.timestamp() >= 0.85  # not at the recorded deadline
    assert expired.via == "timer" and expired.value == "v"
    assert expired.task.attempt == 1  # re-arming did not use up attempts


def test_ttl_shortened_by_plain_pexpire_fires_early_through_the_bell(
    queue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    with run_worker(watcher(queue, calls)) as worker:
        wait_for(lambda: worker.expiry.mode == "notifications")
        deadline = queue.expiring.set("upload_session:s", "v", ttl=30)
        queue.client.pexpire("upload_session:s", 100)
        # Redis deletes expired keys lazily or by sampling; nudge it as other traffic would.
        wait_for(lambda: queue.client.exists("upload_session:s") == 0, timeout=5)
        wait_for(lambda: calls.keys()["upload_session:s"] == 1, timeout=5)
    expired, at = calls.one("upload_session:s")
    assert expired.via == "notification" and expired.guaranteed
    assert at < deadline.timestamp() - 25
    assert queue.stats().expiry_mode == "notifications"


def test_foreign_keys_matching_a_pattern_are_delivered_once_across_workers(
    queue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    workers = [watcher(queue, calls) for _ in range(3)]
    threads = [run_worker(w) for w in workers]
    for t in threads:
        t.__enter__()
    try:
        for w in workers:
            wait_for(lambda w=w: w.expiry.mode == "notifications")
        for i in range(20):
            queue.client.set(f"upload_session:f{i}", "set by another program", px=100)
        queue.client.set("other:key", "no pattern matches", px=100)
        wait_for(lambda: len(calls.keys()) == 20, timeout=10)
        time.sleep(0.5)
    finally:
        for t in threads:
            t.stop()
    assert calls.keys() == Counter({f"upload_session:f{i}": 1 for i in range(20)})
    assert all(
        e.via == "notification" and not e.guaranteed and e.value is None for e, _ in calls.items
    )


def test_five_workers_run_each_watched_key_exactly_once(queue: Queue, run_worker: Any) -> None:
    calls = Calls()
    workers = [watcher(queue, calls) for _ in range(5)]
    threads = [run_worker(w) for w in workers]
    for t in threads:
        t.__enter__()
    try:
        keys = [f"upload_session:{i}" for i in range(300)]
        for i, k in enumerate(keys):
            queue.expiring.set(k, i, ttl=0.3 + i / 1000)
        wait_for(lambda: len(calls.keys()) == 300, timeout=20)
        time.sleep(0.5)
    finally:
        for t in threads:
            t.stop()
    assert calls.keys() == Counter({k: 1 for k in keys})


def test_keys_that_expire_while_every_worker_is_down_are_delivered_once_after(
    queue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    keys = [f"upload_session:down{i}" for i in range(1000)]
    for i, k in enumerate(keys):
        queue.expiring.set(k, {"n": i}, ttl=0.2)
    time.sleep(1.5)  # all expired, nobody listening, for longer than "on time"
    with run_worker(watcher(queue, calls, concurrency=64)):
        wait_for(lambda: len(calls.keys()) == 1000, timeout=30)
        time.sleep(0.3)
    assert calls.keys() == Counter({k: 1 for k in keys})
    assert {e.via for e, _ in calls.items} == {"scan"}
    assert all(
        e.value == {"n": int(e.key.removeprefix("upload_session:down"))} for e, _ in calls.items
    )


def test_writer_crash_between_the_two_writes_loses_no_expiry(queue: Queue, run_worker: Any) -> None:
    """expiring.set records first, then sets the key. Crash after the first write: the key
    never exists, and the callback still fires at the recorded deadline."""
    calls = Calls()
    runner = SyncRunner(queue.client)
    runner.run(set_op(queue.core, "upload_session:crash", encode_value(queue.core, 7), 0.2))
    # ... the writer dies here, before SET upload_session:crash ...
    with run_worker(watcher(queue, calls)):
        wait_for(lambda: calls.keys()["upload_session:crash"] == 1, timeout=5)
    assert calls.one("upload_session:crash")[0].value == 7


def test_config_refused_runs_on_timer_and_scan(make_server: Any, run_worker: Any) -> None:
    srv: EmbeddedServer = make_server(extra=["--rename-command", "CONFIG", ""])
    queue = Queue("norename", url=srv.url)
    calls = Calls()
    with run_worker(watcher(queue, calls)) as worker:
        wait_for(lambda: worker.expiry.mode == "timer+scan")
        queue.expiring.set("upload_session:c", "v", ttl=0.2)
        wait_for(lambda: calls.keys()["upload_session:c"] == 1, timeout=5)
    assert calls.one("upload_session:c")[0].via == "timer"
    assert queue.stats().expiry_mode == "timer+scan"
    queue.close()


def notify_flags(client: redis.Redis) -> str:
    value = next(iter(client.config_get("notify-keyspace-events").values()))
    return value.decode() if isinstance(value, bytes) else str(value)


def test_server_restart_reapplies_notifications_and_loses_nothing(
    make_server: Any, run_worker: Any
) -> None:
    srv: EmbeddedServer = make_server(extra=["--appendfsync", "always"])
    queue = Queue("restart", url=srv.url)
    calls = Calls()
    side = redis.Redis.from_url(srv.url)
    with run_worker(watcher(queue, calls)) as worker:
        wait_for(lambda: worker.expiry.mode == "notifications")
        for i in range(50):
            queue.expiring.set(f"upload_session:r{i}", i, ttl=1.0 + i / 100)
        srv.kill()
        srv.restart()  # CONFIG SET is not persisted: the flags are gone now
        wait_for(lambda: "x" in notify_flags(side), timeout=15)
        wait_for(lambda: len(calls.keys()) == 50, timeout=30)
        time.sleep(0.3)
    assert calls.keys() == Counter({f"upload_session:r{i}": 1 for i in range(50)})
    side.close()
    queue.close()


def test_bad_input_is_refused(queue: Queue) -> None:
    from delayq import InvalidTaskError

    with pytest.raises(InvalidTaskError, match="ttl"):
        queue.expiring.set("k", 1, ttl=0)
    with pytest.raises(InvalidTaskError, match="JSON"):
        queue.expiring.set("k", {1, 2}, ttl=5)
    with pytest.raises(InvalidTaskError, match="watched key"):
        queue.expiring.set("", 1, ttl=5)
    assert queue.client.exists("k") == 0


def test_bell_channel_refused_by_acl_falls_back_to_timer_and_scan(
    make_server: Any, run_worker: Any
) -> None:
    srv: EmbeddedServer = make_server()
    admin = redis.Redis.from_url(srv.url)
    # Every command and key, but only delayq's own channels: the keyevent channel is refused.
    admin.execute_command(
        "ACL", "SETUSER", "nobell", "on", ">pw", "~*", "resetchannels", "&dq:*", "+@all"
    )
    url = f"redis://nobell:pw@127.0.0.1:{srv.port}/0"
    queue = Queue("nobell", url=url)
    calls = Calls()
    with run_worker(watcher(queue, calls)) as worker:
        wait_for(lambda: worker.expiry.mode == "timer+scan", timeout=10)
        queue.expiring.set("upload_session:acl", "v", ttl=0.2)
        wait_for(lambda: calls.keys()["upload_session:acl"] == 1, timeout=5)
    assert calls.one("upload_session:acl")[0].via == "timer"
    queue.close()
    admin.close()
