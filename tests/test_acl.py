"""The least-privilege ACL user of docs/operations.md: enough for all of delayq, and no more.

The rule is read from the document itself, so the docs cannot drift from what is proven.
Each test runs on a private server of each flavour (Valkey 8 and Redis 7).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.exceptions import NoPermissionError

from delayq import AsyncQueue, Fail, Queue, Retry, ScriptError, Task, Worker
from delayq.admin import operate
from delayq.admin.inspect import Admin
from delayq.embedded import EmbeddedServer
from delayq.runner import SyncRunner
from delayq.scripts import NAMES, SCRIPTS

from .support.helpers import wait_for

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
PASSWORD_PLACEHOLDER = ">CHANGE-ME"

# Every script behind the Queue/AsyncQueue/Worker API (the admin, cron and expiring-key
# scripts are covered by their own features' ACL lines); the test runs each one as the user.
ENGINE_SCRIPTS = NAMES[: NAMES.index("workers") + 1]


# Refusals that cost nothing (docs/operations.md says why): redis-py's CLIENT SETINFO on
# connect (Valkey and Redis 7.2+ log it; Redis 7.0 has no such command), and the worker's
# start-up check of maxmemory-policy (CONFIG GET), which it skips when refused.
IGNORED_DENIALS = {"client|setinfo", "config|get"}


def documented_rule(feature: str = "base") -> list[str]:
    """A rule line of docs/operations.md: the base rule (it starts with ``reset``), or the
    additions for ``expiring`` keys (``+pttl``) or ``durable`` schedules (``+waitaof``)."""
    lines: list[str] = re.findall(r"^ACL SETUSER delayq (.+)$", DOC.read_text(), re.M)
    marker = {"base": "reset", "expiring": "+pttl", "durable": "+waitaof"}[feature]
    found = [line.split() for line in lines if marker in line.split()]
    assert len(found) == 1, f"docs/operations.md should hold one {feature} 'ACL SETUSER' line"
    return found[0]


class AclServer:
    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        self.admin = redis.Redis(host=server.host, port=server.port)
        password = secrets.token_hex(16)
        rule = [f">{password}" if w == PASSWORD_PLACEHOLDER else w for w in documented_rule()]
        assert f">{password}" in rule
        self.admin.execute_command("ACL", "SETUSER", "delayq", *rule)
        self.admin.acl_log_reset()
        self.url = f"redis://delayq:{password}@{server.host}:{server.port}/0"

    def grant(self, feature: str) -> None:
        self.admin.execute_command("ACL", "SETUSER", "delayq", *documented_rule(feature))

    def denials(self) -> set[str]:
        """What the server refused the user since the start, by command or key."""
        return {str(e["object"]) for e in self.admin.acl_log(count=1000)}


@pytest.fixture
def acl(server: EmbeddedServer, make_server: Any) -> Iterator[AclServer]:
    """A private server of the ``server`` fixture's flavour, with the documented user."""
    srv = AclServer(make_server(server.binary, appendonly=False))
    yield srv
    srv.admin.close()


def _state(queue: Queue, tid: str) -> str | None:
    info = queue.get(tid)
    return info.state if info else None


def _last_error(queue: Queue, tid: str) -> str | None:
    info = queue.get(tid)
    return info.last_error if info is not None else None


def test_documented_user_runs_every_operation(acl: AclServer, run_worker: Any) -> None:
    queue = Queue("orders", url=acl.url)
    worker = Worker(queue, concurrency=4, lease=1, grace=0.2)
    stuck = threading.Event()

    @worker.handler("ok")
    def ok(task: Task) -> None:
        pass

    @worker.handler("flaky")
    async def flaky(task: Task) -> None:
        if task.attempt == 1:
            raise Retry(after=0.05)

    @worker.handler("fatal")
    async def fatal(task: Task) -> None:
        raise Fail("permission denied upstream")

    @worker.handler("slow")
    async def slow(task: Task) -> None:
        await asyncio.sleep(0.8)  # past lease/3: the heartbeat extends the lease

    @worker.handler("stuck")
    async def stuck_handler(task: Task) -> None:
        stuck.set()
        await asyncio.sleep(30)  # still running at shutdown: handed back

    wt = run_worker(worker)
    with wt:
        queue.schedule("ok", {"order_id": 1}, delay=0.1, task_id="ok")
        queue.schedule("flaky", None, task_id="flaky")
        queue.schedule("fatal", None, task_id="fatal")
        queue.schedule("slow", None, task_id="slow")
        # Priorities: the prio index and the control hash's marker, retried and rescheduled.
        queue.schedule("flaky", None, task_id="flaky-p", priority=5)
        queue.schedule("ok", None, delay=3600, task_id="later-p", priority=7)
        assert queue.reschedule("later-p", delay=0.05)
        queue.schedule("ok", None, delay=3600, task_id="later")
        assert queue.reschedule("later", delay=0.05)
        queue.schedule("ok", None, delay=3600, task_id="never")
        assert queue.cancel("never")
        queue.schedule("ok", None, delay=3600, task_id="stopped")
        assert queue.abort("stopped")

        fresh = queue.schedule("ok", {"order_id": 2})  # a new id: schedule_new.lua
        # A kind no worker handles: handed back (handback.lua), its attempt not counted.
        queue.schedule("nobody", None, task_id="unknown")

        async def from_asyncio() -> tuple[str, str]:
            async with AsyncQueue("orders", url=acl.url) as aq:
                return await aq.schedule("ok", None, task_id="async"), await aq.schedule("ok")

        named, afresh = asyncio.run(from_asyncio())
        assert named == "async"
        done = ("ok", "flaky", "slow", "later", "async", fresh, afresh, "flaky-p", "later-p")
        wait_for(lambda: [_state(queue, tid) for tid in done] == ["done"] * len(done))
        wait_for(lambda: _state(queue, "fatal") == "dead")
        # queue.wait (wait.lua, the finished channel): one told, one finished already.
        queue.schedule("ok", None, delay=0.2, task_id="waited")
        assert queue.wait("waited", timeout=10).state == "done"
        assert queue.wait("ok", timeout=1).state == "done"
        wait_for(lambda: "unknown kind" in (_last_error(queue, "unknown") or ""))
        assert _state(queue, "unknown") == "scheduled" and queue.cancel("unknown")
        assert [w.alive for w in queue.workers()] == [True]
        assert [t.id for t in queue.dead()] == ["fatal"]
        assert [t.id for t in queue.page("dead").tasks] == ["fatal"]
        assert queue.replay(["fatal"]) == 1
        wait_for(lambda: _state(queue, "fatal") == "dead")
        assert queue.purge_dead() == 1
        queue.schedule("stuck", None, task_id="stuck")
        assert stuck.wait(10)
        wt.stop()
    assert _state(queue, "stuck") == "scheduled"  # released at shutdown
    assert queue.workers() == []  # unregistered
    assert SyncRunner(queue.client).run(queue.core.reap()) == 0
    stats = queue.stats()
    assert stats.counters["succeeded"] == 10 and stats.counters["released"] == 1
    assert queue.cancel("stuck")
    with Admin(acl.url) as admin:  # resharding runs as the user too
        moved = operate.reshard(admin, "orders", 2)
    assert moved.ok and moved.done == 11, moved  # 10 done, 1 aborted
    queue.close()

    # Every script ran as the user (each was loaded on first use) ...
    shas = [SCRIPTS[name].sha for name in ENGINE_SCRIPTS]
    assert acl.admin.script_exists(*shas) == [True] * len(shas)
    # ... and nothing delayq needs was refused: only what it tries and does without.
    assert acl.denials() <= IGNORED_DENIALS


def test_documented_user_cannot_reach_outside_dq(acl: AclServer) -> None:
    user = redis.Redis.from_url(acl.url)
    with pytest.raises(NoPermissionError):
        user.set("session:1", "x")  # a command delayq does not need
    with pytest.raises(NoPermissionError):
        user.zadd("orders", {"1": 1})  # a command it needs, on a key outside dq:*
    with pytest.raises(NoPermissionError):
        user.get("dq:{orders}:stats")  # a key inside dq:*, but a command it does not need
    with pytest.raises(NoPermissionError):
        user.publish("orders", "1")  # a channel outside dq:*
    with pytest.raises(NoPermissionError):
        user.execute_command("SUBSCRIBE", "__keyevent@0__:expired")
    with pytest.raises(NoPermissionError):
        user.execute_command("EVAL", "return 1", 0)
    with pytest.raises(NoPermissionError):
        user.flushall()
    with pytest.raises(NoPermissionError):
        user.config_get("maxmemory-policy")
    user.close()

    # delayq's own scripts are held to the same keys: a queue under another prefix is refused.
    with Queue("orders", url=acl.url, prefix="app") as other, pytest.raises(ScriptError) as err:
        other.schedule("ok", None)
    assert "perm" in str(err.value).lower()
    assert acl.admin.dbsize() == 0  # nothing was written anywhere
    # The server's ACL LOG names what it refused: the command, or the key or channel.
    assert acl.denials() - IGNORED_DENIALS == {
        "set",
        "orders",  # the key of the ZADD, and the channel of the PUBLISH
        "get",
        "__keyevent@0__:expired",
        "eval",
        "flushall",
        "app:{orders}:shards",  # the first key the first script (the shard check) touched
    }


def test_documented_additions_for_expiring_keys(acl: AclServer, run_worker: Any) -> None:
    acl.admin.config_set("notify-keyspace-events", "Ex")  # in redis.conf, in real life
    acl.grant("expiring")
    queue = Queue("uploads", url=acl.url)
    worker = Worker(queue)
    fired: list[tuple[str, Any, bool]] = []

    @worker.on_expire("upload_session:*")
    def cleanup(expired: Any) -> None:
        fired.append((expired.key, expired.value, expired.guaranteed))

    with run_worker(worker):
        queue.expiring.set("upload_session:1", {"object": "tmp/1"}, ttl=0.2)
        queue.expiring.set("upload_session:2", {"object": "tmp/2"}, ttl=60)
        assert queue.expiring.touch("upload_session:2", ttl=0.3)
        queue.expiring.set("upload_session:3", {"object": "tmp/3"}, ttl=60)
        assert queue.expiring.delete("upload_session:3")
        acl.admin.set("upload_session:4", "set by another program", px=200)  # the bell's path
        wait_for(lambda: len(fired) == 3)
    assert sorted(fired, key=str) == [
        ("upload_session:1", {"object": "tmp/1"}, True),
        ("upload_session:2", {"object": "tmp/2"}, True),
        ("upload_session:4", None, False),
    ]
    queue.close()
    # The worker may not read notify-keyspace-events (CONFIG is not granted): it says so in a
    # warning and reports "timer+scan", but the bell rings all the same.
    assert acl.denials() <= IGNORED_DENIALS

    user = redis.Redis.from_url(acl.url)
    with pytest.raises(NoPermissionError):
        user.set("session:1", "x")  # SET is granted now, but only on the watched pattern
    with pytest.raises(NoPermissionError):
        user.config_set("notify-keyspace-events", "")
    user.close()


def test_documented_addition_for_durable_schedules(
    server: EmbeddedServer, make_server: Any
) -> None:
    if "v=7.0" in server.version:  # type: ignore[attr-defined]
        pytest.skip("WAITAOF needs Redis or Valkey 7.2 or later")
    acl = AclServer(make_server(server.binary, appendonly=True))
    acl.grant("durable")
    with Queue("orders", url=acl.url) as queue:
        assert queue.schedule("k", None, delay=60, task_id="d", durable=True) == "d"
    assert acl.denials() <= IGNORED_DENIALS
    acl.admin.close()
