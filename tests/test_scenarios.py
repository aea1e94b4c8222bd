"""Fault scenarios judged by the checker (tests/support/checker.py): each runs real worker processes
under load, injects its fault on a seeded schedule, lets the queue settle, and writes a JSON
report to build/reliability/ (or $DELAYQ_RELIABILITY_DIR). A scenario fails when an
acknowledged task was lost, a task ran that was never scheduled, or more tasks ran twice
than were in flight at the faults.

``pytest tests/test_scenarios.py`` runs them at CI size; ``DELAYQ_SCENARIO_SCALE=10 pytest -m
soak tests/test_scenarios.py`` (see docs/reliability.md) runs them ten times longer.
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq import Queue
from delayq.embedded import EmbeddedServer, free_port
from delayq.errors import ConnectionFailed

from .support.checker import History
from .support.helpers import wait_for
from .support.proxy import FaultProxy
from .support.scenario import Producer, Workers, in_flight, settle, verdict

SCALE = float(os.environ.get("DELAYQ_SCENARIO_SCALE", "1"))
pytestmark = [pytest.mark.slow, pytest.mark.timeout(int(240 * SCALE))]
if SCALE > 1:
    pytestmark.append(pytest.mark.soak)


def _env(name: str, url: str, lease: float = 2) -> dict[str, str]:
    return {"DQ_QUEUE": name, "DELAYQ_REDIS_URL": url, "DQ_LEASE": str(lease)}


def _sleep_until(t0: float, at: float) -> None:
    time.sleep(max(0.0, t0 + at - time.monotonic()))


def _assert_bar(report: dict[str, Any]) -> None:
    assert report["lost"] == 0, report
    assert report["unexpected"] == 0, report
    assert report["duplicated"] <= report["in_flight_at_faults"], report
    assert report["finished"] >= report["acknowledged"] - report["dead"], report
    assert report["ok"], report


def test_sigkill_a_random_worker_every_few_seconds(make_server: Any, tmp_path: Path) -> None:
    seed, seconds = 1, 12 * SCALE
    rng = random.Random(seed)
    srv: EmbeddedServer = make_server()
    queue = Queue("sc-kill", url=srv.url)
    history = History("worker_sigkill", seed)
    workers = Workers(tmp_path, _env(queue.name, srv.url), 3)
    producer = Producer(queue, history, rng, rate=150, seconds=seconds, work_ms=(5, 80))
    try:
        t0 = time.monotonic()
        producer.start()
        at = 2.0
        while at < seconds:
            _sleep_until(t0, at)
            victim = rng.randrange(3)
            history.fault("sigkill_worker", in_flight(queue), worker=victim)
            workers.kill_and_restart(victim)
            at += rng.uniform(1.5, 3.0)
        producer.join()
        settle(queue, history)
        time.sleep(0.5)
    finally:
        workers.stop()
    report = verdict(history, tmp_path, queue)
    _assert_bar(report)
    assert len(history.faults) >= 3 and report["acknowledged"] >= 1000 * SCALE
    assert any(f.in_flight for f in history.faults)  # the kills hit running work
    queue.close()


def test_sigstop_a_worker_past_its_lease(make_server: Any, tmp_path: Path) -> None:
    """Frozen for twice its lease, the worker's tasks are taken over; resumed, its late
    results are refused (or its handlers stopped first) and each task counted once."""
    seed = 2
    rng = random.Random(seed)
    srv: EmbeddedServer = make_server()
    queue = Queue("sc-stop", url=srv.url)
    history = History("worker_sigstop", seed)
    workers = Workers(tmp_path, _env(queue.name, srv.url, lease=1), 2)
    producer = Producer(queue, history, rng, rate=40, seconds=8 * SCALE, work_ms=(100, 300))
    try:
        t0 = time.monotonic()
        producer.start()
        _sleep_until(t0, 3)
        history.fault("sigstop_worker", in_flight(queue), worker=0, seconds=2.5)
        workers.signal(0, signal.SIGSTOP)
        time.sleep(2.5)
        workers.signal(0, signal.SIGCONT)
        producer.join()
        settle(queue, history)
        time.sleep(1.0)  # let the resumed worker try its late acks
    finally:
        workers.stop()
    out = workers.output()
    # Resumed, the worker meets its lost leases one of two ways, whichever runs first on its
    # loop: a handler finishes and its result is refused by the server (the fencing token),
    # or the heartbeat finds the lease gone and stops the handler before it writes.
    refused = out.count("was refused: the lease was lost")
    stopped = out.count("lost; stopping its handler")
    report = verdict(
        history,
        tmp_path,
        queue,
        {"late_results_refused": refused, "lost_leases_stopped": stopped},
    )
    _assert_bar(report)
    assert history.faults[0].in_flight > 0
    assert refused + stopped > 0, out[-3000:]
    queue.close()


@pytest.mark.parametrize(
    "mode",
    ["aof-always", "aof-everysec-durable", "aof-everysec", "rdb-only"],
)
def test_sigkill_the_server_under_load(make_server: Any, tmp_path: Path, mode: str) -> None:
    """With AOF (always, or everysec with durable=True) nothing acknowledged is lost. Plain
    everysec loses nothing on a process kill (the write reached the OS before the reply).
    RDB-only is the negative control: the checker must see the loss."""
    seed = 3
    rng = random.Random(seed)
    if mode == "rdb-only":
        srv: EmbeddedServer = make_server(appendonly=False)
    elif mode == "aof-always":
        srv = make_server(extra=["--appendfsync", "always"])
    else:
        srv = make_server()  # appendfsync everysec
    queue = Queue("sc-server", url=srv.url)
    history = History(f"server_sigkill_{mode}", seed)
    workers = Workers(tmp_path, _env(queue.name, srv.url), 2)
    producer = Producer(
        queue,
        history,
        rng,
        rate=200,
        seconds=8 * SCALE,
        delay=(0.5, 4.0),
        durable=mode.endswith("durable"),
        batch=10,
    )
    try:
        t0 = time.monotonic()
        producer.start()
        _sleep_until(t0, 3)
        history.fault("sigkill_server", in_flight(queue), mode=mode)
        srv.kill()
        time.sleep(0.3)
        srv.restart()
        producer.join()
        if mode != "rdb-only":
            settle(queue, history)
        else:
            time.sleep(5)
        time.sleep(0.5)
    finally:
        workers.stop()
    report = verdict(history, tmp_path, queue, {"mode": mode})
    if mode == "rdb-only":
        assert report["lost"] > 0 and not report["ok"], report  # the checker sees the loss
    else:
        _assert_bar(report)
    queue.close()


def test_network_faults_through_a_proxy(make_server: Any, tmp_path: Path) -> None:
    """Workers and producer reach the server only through the fault proxy: added latency,
    every connection reset twice, then a black hole longer than the lease."""
    seed = 4
    rng = random.Random(seed)
    srv: EmbeddedServer = make_server()
    with FaultProxy(srv.port) as proxy:
        # The producer's socket timeout is short so a black-holed call fails and is retried.
        client = redis.Redis.from_url(proxy.url, socket_timeout=1.5, socket_connect_timeout=1.5)
        producer_q = Queue("sc-net", client=client)
        observer = Queue("sc-net", url=srv.url)  # stats straight from the server
        history = History("network_faults", seed)
        workers = Workers(tmp_path, _env("sc-net", proxy.url), 3)
        producer = Producer(producer_q, history, rng, rate=120, seconds=14 * SCALE)
        try:
            t0 = time.monotonic()
            producer.start()
            _sleep_until(t0, 2)
            history.fault("latency_50ms", 0, seconds=2)
            proxy.latency = 0.05
            time.sleep(2)
            proxy.latency = 0.0
            for at in (5, 7):
                _sleep_until(t0, at)
                history.fault("reset_all", in_flight(observer), connections=proxy.reset_all())
            _sleep_until(t0, 9)
            history.fault("blackhole_3s", in_flight(observer), seconds=3)
            proxy.blackhole = True
            time.sleep(3)
            proxy.blackhole = False
            proxy.reset_all()  # the stalled links are dropped, as a real timeout would
            producer.join()
            settle(observer, history, timeout=90)
            time.sleep(0.5)
        finally:
            workers.stop()
        report = verdict(history, tmp_path, observer)
        _assert_bar(report)
        producer_q.close()
        client.close()
        observer.close()


def test_expiry_subscriber_killed_while_keys_expire(make_server: Any, tmp_path: Path) -> None:
    """The keyspace bell is cut (CLIENT KILL TYPE pubsub) every 0.7 s while 300 watched keys
    expire: every expiry is still delivered, once."""
    seed = 5
    rng = random.Random(seed)
    srv: EmbeddedServer = make_server()
    queue = Queue("sc-exp", url=srv.url)
    side = redis.Redis.from_url(srv.url)
    history = History("expiry_subscriber_killed", seed)
    workers = Workers(tmp_path, {**_env(queue.name, srv.url), "DQ_EXPIRE": "1"}, 2)
    stop = threading.Event()
    kills: list[int] = []

    def cut_the_bell() -> None:
        while not stop.wait(0.7):
            kills.append(int(side.execute_command("CLIENT", "KILL", "TYPE", "pubsub")))

    try:
        wait_for(lambda: side.pubsub_numpat() + len(side.pubsub_channels()) > 0, timeout=20)
        cutter = threading.Thread(target=cut_the_bell, daemon=True)
        cutter.start()
        for n in range(int(300 * SCALE)):
            key = f"sc:{n}"
            deadline = queue.expiring.set(key, n, ttl=rng.uniform(0.5, 6.0 * SCALE))
            history.ack(key, int(deadline.timestamp() * 1000))
            time.sleep(0.005)
        time.sleep(6.5 * SCALE)
        stop.set()
        cutter.join()
        history.fault("pubsub_killed", 0, times=len(kills), connections=sum(kills))
        settle(queue, history)
        time.sleep(0.5)
    finally:
        stop.set()
        workers.stop()
    report = verdict(history, tmp_path, queue, {"subscriber_kills": sum(kills)})
    _assert_bar(report)
    assert sum(kills) >= 5  # the bell really was cut, again and again
    side.close()
    queue.close()


def test_unreachable_at_schedule_time_fails_clearly_and_half_writes_nothing(
    make_server: Any,
) -> None:
    """A server that goes away during a large schedule_many: bounded retries, then a clear
    error saying which tasks were written; each task is whole or absent; scheduling again
    with the same ids completes the set without doubles."""
    srv: EmbeddedServer = make_server()
    direct = Queue("sc-unreach", url=srv.url)
    with FaultProxy(srv.port) as proxy:
        queue = Queue("sc-unreach", url=proxy.url)
        specs = [
            {"kind": "job", "payload": i, "delay": 600, "task_id": f"u:{i}"} for i in range(60_000)
        ]
        errors: list[ConnectionFailed] = []

        def produce() -> None:
            try:
                queue.schedule_many(specs)
            except ConnectionFailed as e:
                errors.append(e)

        thread = threading.Thread(target=produce)
        thread.start()
        # Cut the link once two round trips (8,000 tasks each) are written, mid-call.
        wait_for(lambda: direct.stats().scheduled > 16_000, timeout=20, interval=0.001)
        proxy.refuse = True
        proxy.reset_all()
        t0 = time.monotonic()
        thread.join(30)
        assert time.monotonic() - t0 < 10  # bounded: three retries, not a hang
        assert errors, "schedule_many went through a dead link without an error"
        err = errors[0]
        assert f"127.0.0.1:{proxy.port}" in str(err) and "scheduled before it" in str(err)
        assert err.scheduled and err.unconfirmed

        stored = direct.client.zrange(direct.core.keys.scheduled, 0, -1)
        present = {x.decode() for x in stored}
        records = direct.client.hlen(direct.core.keys.tasks)
        assert records == len(present)  # no record without its schedule entry, or back
        assert set(err.scheduled) <= present
        assert present <= set(err.scheduled) | set(err.unconfirmed)

        proxy.refuse = False
        queue.schedule_many(specs)  # again, the same ids: the rest is added, nothing doubled
        assert direct.stats().scheduled == len(specs)
        assert direct.client.hlen(direct.core.keys.tasks) == len(specs)
        queue.close()

    closed = Queue("sc-unreach", url=f"redis://127.0.0.1:{free_port()}/0")
    t0 = time.monotonic()
    with pytest.raises(ConnectionFailed, match=r"cannot reach Redis at 127\.0\.0\.1"):
        closed.schedule("job", 1, delay=1)
    assert 0.1 < time.monotonic() - t0 < 10  # it retried, briefly
    direct.close()
