"""Faults for real: SIGKILL and SIGSTOP worker processes, SIGKILL the server and restart it
from its append-only file. Each test fails if the reliability claim it names is false."""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest
import redis

from delayq import Queue, Task, Worker
from delayq.embedded import EmbeddedServer

from .support.apps.fault_app import finished_key, started_key
from .support.helpers import wait_for

pytestmark = pytest.mark.slow


def _env(queue: Queue, **extra: str) -> dict[str, str]:
    return {"DQ_QUEUE": queue.name, "DELAYQ_REDIS_URL": queue.url, **extra}


def _list(queue: Queue, key: str) -> list[str]:
    return [x.decode() for x in queue.client.lrange(key, 0, -1)]


def test_sigkilled_worker_task_runs_again_after_lease_and_is_done_once(
    queue: Queue, spawn_worker: Any
) -> None:
    env = _env(queue, DQ_LEASE="2", DQ_SLEEP="60")
    first = spawn_worker("tests.support.apps.fault_app:worker", env)
    queue.schedule("slow", {"order_id": 1}, task_id="order:1")
    wait_for(lambda: _list(queue, started_key(queue.name)), timeout=20)
    first.kill(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL
    killed_at = time.monotonic()
    info = queue.get("order:1")
    assert info is not None and info.state == "active"  # nothing was deleted on the way in

    spawn_worker("tests.support.apps.fault_app:worker", env)
    wait_for(lambda: queue.get("order:1").state == "done", timeout=30)  # type: ignore[union-attr]
    assert time.monotonic() - killed_at >= 1.0  # not before the 2 s lease ran out (minus slack)
    started = _list(queue, started_key(queue.name))
    finished = _list(queue, finished_key(queue.name))
    assert [s.split(":")[2] for s in started] == ["1", "2"]  # attempts 1 (killed) and 2
    assert len(finished) == 1 and finished[0].split(":")[2] == "2"
    info = queue.get("order:1")
    assert info is not None and info.attempts == 2
    assert "lease expired during attempt 1" in (info.last_error or "")
    stats = queue.stats()
    assert (stats.done, stats.active, stats.scheduled, stats.dead) == (1, 0, 0, 0)
    assert stats.counters["leases_expired"] == 1


def test_stalled_worker_loses_its_lease_and_its_late_ack_is_refused(
    queue: Queue, spawn_worker: Any
) -> None:
    """SIGSTOP freezes a worker mid-task past its lease; a second worker takes the task over
    and finishes it. Resumed, the first finishes too, but its result is refused."""
    env = _env(queue, DQ_LEASE="1", DQ_SLEEP="2")
    stalled = spawn_worker("tests.support.apps.fault_app:worker", env)
    queue.schedule("slow", None, task_id="t1")
    wait_for(lambda: _list(queue, started_key(queue.name)), timeout=20)
    stalled.kill(signal.SIGSTOP)
    try:
        rival = spawn_worker("tests.support.apps.fault_app:worker", env)
        wait_for(lambda: len(_list(queue, finished_key(queue.name))) == 1, timeout=30)
        wait_for(lambda: queue.get("t1").state == "done", timeout=10)  # type: ignore[union-attr]
    finally:
        stalled.kill(signal.SIGCONT)
    # The stalled handler wakes up, finishes its sleep and tries to write its result.
    wait_for(lambda: len(_list(queue, finished_key(queue.name))) == 2, timeout=30)
    time.sleep(0.5)
    stalled.kill(signal.SIGTERM)
    rival.kill(signal.SIGTERM)
    assert stalled.wait() == 0 and rival.wait() == 0
    out = stalled.output()
    assert "was refused: the lease was lost" in out or "lease of task t1 lost" in out, out
    info = queue.get("t1")
    assert info is not None and info.state == "done" and info.attempts == 2
    assert queue.stats().counters["succeeded"] == 1  # recorded as done once


def test_sigterm_hands_back_running_task_for_another_worker(
    queue: Queue, spawn_worker: Any
) -> None:
    env = _env(queue, DQ_LEASE="30", DQ_GRACE="0.5", DQ_SLEEP="60")
    first = spawn_worker("tests.support.apps.fault_app:worker", env)
    queue.schedule("slow", None, task_id="h1")
    wait_for(lambda: _list(queue, started_key(queue.name)), timeout=20)
    t0 = time.monotonic()
    first.kill(signal.SIGTERM)
    assert first.wait(20) == 0
    assert time.monotonic() - t0 < 15
    info = queue.get("h1")
    assert info is not None and info.state == "scheduled" and info.attempts == 0
    # A new worker runs it at once: no waiting for a 30 s lease to expire.
    spawn_worker("tests.support.apps.fault_app:worker", {**env, "DQ_SLEEP": "0"})
    wait_for(lambda: queue.get("h1").state == "done", timeout=15)  # type: ignore[union-attr]


@pytest.mark.parametrize("binary", ["valkey", "redis"])
def test_server_killed_and_restarted_from_aof_loses_no_acknowledged_task(
    make_server: Any, run_worker: Any, binary: str
) -> None:
    from .conftest import FLAVOURS

    found = dict(FLAVOURS)
    if binary not in found:
        pytest.skip(f"no {binary} server binary on this machine")
    srv: EmbeddedServer = make_server(found[binary], extra=["--appendfsync", "always"])
    queue = Queue("aof", url=srv.url)
    ids = queue.schedule_many(
        [{"kind": "k", "payload": i, "delay": 1 + i / 100} for i in range(300)]
    )
    srv.kill()  # SIGKILL: no shutdown save
    srv.restart()
    assert queue.stats().scheduled == 300  # every acknowledged schedule survived

    worker = Worker(queue, concurrency=32)
    ran: list[str] = []
    worker.handler("k")(lambda task: ran.append(task.id))
    with run_worker(worker):
        wait_for(lambda: queue.stats().done == 300, timeout=30)
    assert sorted(ran) == sorted(ids)
    queue.close()


def test_worker_survives_server_restart_and_finishes_the_work(
    make_server: Any, run_worker: Any
) -> None:
    srv: EmbeddedServer = make_server(extra=["--appendfsync", "always"])
    queue = Queue("restart", url=srv.url)
    worker = Worker(queue, concurrency=8, lease=3)
    runs: dict[str, int] = {}

    @worker.handler("k")
    def k(task: Task) -> None:
        runs[task.id] = runs.get(task.id, 0) + 1

    with run_worker(worker):
        ids = queue.schedule_many(
            [{"kind": "k", "payload": i, "delay": 0.5 + i / 50} for i in range(100)]
        )
        time.sleep(1)
        srv.kill()
        time.sleep(0.5)
        srv.restart()
        wait_for(lambda: queue.stats().done == 100, timeout=40)
    # Every task ran; one whose result was in flight at the crash may have run twice
    # (at-least-once), but none was lost.
    assert set(runs) == set(ids)
    stats = queue.stats()
    assert (stats.scheduled, stats.active, stats.dead) == (0, 0, 0)
    queue.close()
    side = redis.Redis.from_url(srv.url)
    assert side.ping()
    side.close()


def test_durable_schedule_waits_for_the_aof_and_survives_a_kill(make_server: Any) -> None:
    """durable=True returns after WAITAOF confirmed the fsync: even with appendfsync
    everysec, a SIGKILL right after it returns loses nothing."""
    srv: EmbeddedServer = make_server()  # appendonly yes, appendfsync everysec
    queue = Queue("durable", url=srv.url)
    ids = [queue.schedule("k", i, delay=60, durable=True) for i in range(20)]
    ids += queue.schedule_many(
        [{"kind": "k", "payload": i, "delay": 60} for i in range(500)], durable=True
    )
    srv.kill()
    srv.restart()
    assert queue.stats().scheduled == 520
    assert all(queue.get(i) is not None for i in ids[:20])
    queue.close()


def test_durable_schedule_refuses_clearly_without_aof(make_server: Any) -> None:
    from delayq.errors import DurabilityError

    srv: EmbeddedServer = make_server(appendonly=False)
    queue = Queue("noaof", url=srv.url)
    with pytest.raises(DurabilityError, match="append-only file"):
        queue.schedule("k", 1, durable=True)
    queue.close()


def test_durable_schedule_needs_waitaof(make_server: Any) -> None:
    """Redis 7.0 has no WAITAOF: the error says so instead of pretending."""
    from delayq.embedded import server_version
    from delayq.errors import DurabilityError

    from .conftest import FLAVOURS

    binary = dict(FLAVOURS).get("redis")
    if binary is None or " v=7.0" not in server_version(binary):
        pytest.skip("needs a Redis 7.0 server binary")
    srv: EmbeddedServer = make_server(binary)
    queue = Queue("old", url=srv.url)
    with pytest.raises(DurabilityError, match="WAITAOF"):
        queue.schedule("k", 1, durable=True)
    queue.close()


def test_a_resent_durable_schedule_still_waits_for_a_write(make_server: Any) -> None:
    """A durable call sent again after a dropped connection finds its tasks already written
    and changes nothing; it must still write, or the WAITAOF after it would confirm at once,
    on a connection that wrote nothing, a write whose fsync nobody saw."""
    srv: EmbeddedServer = make_server()  # AOF on
    queue = Queue("resend", url=srv.url)
    queue.schedule("k", 1, delay=60, task_id="t")  # the first send, its reply lost
    before = int(queue.client.info("persistence")["aof_current_size"])
    assert queue.schedule("k", 1, delay=60, task_id="t", durable=True) == "t"
    after = int(queue.client.info("persistence")["aof_current_size"])
    assert after > before  # the resend wrote (a no-op increment), so WAITAOF covered it
    assert queue.stats().counters["scheduled"] == 1  # and nothing was scheduled twice
    queue.close()
