"""The expiry bell on a real Redis Cluster (three primaries, three replicas).

Keyspace notifications are node-local on a cluster: each primary publishes
``__keyevent@0__:expired`` to its own subscribers only. The worker subscribes on every
primary and follows failovers (delayq/worker/features/bells.py); these cases prove it on each
primary, for keys recorded through ``queue.expiring`` and for foreign keys, and after a
primary is killed and its replica promoted.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from redis.crc import key_slot

from delayq import Queue, Worker

from .support.helpers import wait_for
from .support.topology import FLAVOURS, Cluster, Node, cluster_nodes, key_for_slot
from .test_expiring import Calls, watcher

pytestmark = pytest.mark.slow

CHANNEL = "__keyevent@0__:expired"


@pytest.fixture(scope="module", params=FLAVOURS, ids=[f[0] for f in FLAVOURS])
def cluster3(request: pytest.FixtureRequest) -> Iterator[Cluster]:
    """Three primaries and three replicas, per server flavour (Valkey, and Redis if found)."""
    with Cluster(request.param[1]) as c:
        yield c


@pytest.fixture
def cqueue(cluster3: Cluster, qname: str) -> Iterator[Queue]:
    q = Queue(qname, url=cluster3.url)
    yield q
    q.close()


def first_slot(node: Node) -> int:
    return cluster_nodes(node)[node.node_id].slots[0][0]


def keys_on(node: Node, prefix: str, n: int) -> list[str]:
    """``n`` keys in slots ``node`` owns (distinct slots)."""
    lo = first_slot(node)
    return [key_for_slot(lo + i, prefix) for i in range(n)]


def bell_on(node: Node) -> str | None:
    """Why the worker's bell is not (yet) on ``node``, or None: subscribed, flags set."""
    with node.client() as r:
        subscribers = dict(r.pubsub_numsub(CHANNEL)).get(CHANNEL, 0)
        flags = str(next(iter(r.config_get("notify-keyspace-events").values())))
    if subscribers < 1:
        return f"{node}: no subscriber to {CHANNEL}"
    if "E" not in flags or not ("x" in flags or "A" in flags):
        return f"{node}: notify-keyspace-events is {flags!r}"
    return None


def wait_bells(cluster: Cluster, worker: Worker, timeout: float = 15.0) -> None:
    wait_for(lambda: worker.expiry.mode == "notifications", timeout=timeout)
    for p in cluster.primaries():
        wait_for(lambda p=p: bell_on(p) is None, timeout=timeout)


def owners(cluster: Cluster, keys: list[str]) -> set[int]:
    return {cluster.owner(int(key_slot(k.encode()))).port for k in keys}


def test_shortened_ttls_fire_through_the_bell_on_every_primary(
    cluster3: Cluster, cqueue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    primaries = cluster3.primaries()
    keys = [k for p in primaries for k in keys_on(p, "upload_session:short", 4)]
    assert len(owners(cluster3, keys)) == 3
    rc = cluster3.client()
    try:
        with run_worker(watcher(cqueue, calls)) as worker:
            wait_bells(cluster3, worker)
            deadlines = {k: cqueue.expiring.set(k, {"k": k}, ttl=30) for k in keys}
            for k in keys:
                assert rc.pexpire(k, 100)  # other code shortens the TTL
            # Redis deletes expired keys lazily or by sampling; nudge it as other traffic would.
            for k in keys:
                wait_for(lambda k=k: rc.exists(k) == 0, timeout=5)
            wait_for(lambda: len(calls.keys()) == len(keys), timeout=10)
            time.sleep(0.5)  # no second run (the timer at the old deadline is far off anyway)
            stats = cqueue.stats()
    finally:
        rc.close()
    assert calls.keys() == Counter({k: 1 for k in keys})
    for k in keys:
        expired, at = calls.one(k)
        assert expired.via == "notification" and expired.guaranteed, (k, expired.via)
        assert expired.value == {"k": k}
        assert at < deadlines[k].timestamp() - 25
    assert stats.expiry_mode == "notifications"


def test_foreign_keys_on_every_primary_are_delivered_once_across_workers(
    cluster3: Cluster, cqueue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    primaries = cluster3.primaries()
    keys = [k for p in primaries for k in keys_on(p, "upload_session:foreign", 5)]
    others = [k for p in primaries for k in keys_on(p, "other", 1)]
    assert len(owners(cluster3, keys)) == 3
    workers = [watcher(cqueue, calls) for _ in range(2)]
    threads = [run_worker(w) for w in workers]
    rc = cluster3.client()
    for t in threads:
        t.__enter__()
    try:
        for w in workers:
            wait_bells(cluster3, w)
        for p in primaries:  # one subscriber per worker on every primary
            with p.client() as r:
                assert dict(r.pubsub_numsub(CHANNEL))[CHANNEL] >= 2
        for k in keys + others:
            rc.set(k, "set by another program", px=300)
        wait_for(lambda: len(calls.keys()) == len(keys), timeout=10)
        time.sleep(0.5)
    finally:
        rc.close()
        for t in threads:
            t.stop()
    assert calls.keys() == Counter({k: 1 for k in keys})
    assert all(
        e.via == "notification" and not e.guaranteed and e.value is None for e, _ in calls.items
    )


def replicas_of(cluster: Cluster, node: Node) -> list[Node]:
    view = cluster_nodes(node)
    return [n for n in cluster.nodes if n.alive and view[n.node_id].master_id == node.node_id]


def replicated(cluster: Cluster, node: Node, keys: list[str]) -> str | None:
    for rep in replicas_of(cluster, node):
        with rep.client() as r:
            r.execute_command("READONLY")
            # One key a call: the keys are in different slots.
            if (n := sum(r.exists(k) for k in keys)) != len(keys):
                return f"{rep} has {n} of {len(keys)} keys"
    return None


def test_after_a_failover_the_bell_is_on_the_promoted_primary(
    cluster3: Cluster, cqueue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    primaries = cluster3.primaries()
    # Kill a primary that does not hold the queue's own keys: this case is about the bell.
    home = cluster3.owner(int(key_slot(cqueue.core.keys.scheduled.encode())))
    victim_i = next(i for i, p in enumerate(primaries) if p is not home)
    victim = primaries[victim_i]
    victim_slot = first_slot(victim)
    # Recorded before the failover, all primaries: shortened after it, so the bell fires them.
    early = [k for p in primaries for k in keys_on(p, "upload_session:pre", 3)]
    # Recorded before, due during or just after the failover, on the surviving primaries:
    # their timers fire them.
    timed = [k for p in primaries if p is not victim for k in keys_on(p, "upload_session:t", 3)]
    rc = cluster3.client()
    try:
        with run_worker(watcher(cqueue, calls)) as worker:
            wait_bells(cluster3, worker)
            for k in early:
                cqueue.expiring.set(k, "pre", ttl=120)
            for i, k in enumerate(timed):
                cqueue.expiring.set(k, "timed", ttl=1.0 + i / 4)
            # Async replication: let the victim's replica have its keys before the kill.
            on_victim = [k for k in early if cluster3.owner(int(key_slot(k.encode()))) is victim]
            wait_for(lambda: replicated(cluster3, victim, on_victim) is None, timeout=10)

            (heir,) = replicas_of(cluster3, victim)
            with heir.client() as r:  # a replica: nobody set its flags
                assert "x" not in r.config_get("notify-keyspace-events")["notify-keyspace-events"]

            cluster3.kill_primary(victim_i)
            promoted = cluster3.wait_failover()
            assert promoted is heir
            assert any(
                lo <= victim_slot <= hi
                for lo, hi in cluster_nodes(promoted)[promoted.node_id].slots
            )
            # CONFIG SET is not replicated: the worker subscribes on the promoted node and
            # sets its notify-keyspace-events itself.
            wait_for(lambda: bell_on(promoted) is None, timeout=20)
            wait_for(lambda: worker.expiry.mode == "notifications", timeout=20)
            bells = worker.expiry.bells
            assert bells is not None
            assert promoted.addr in bells.primaries and victim.addr not in bells.primaries

            foreign = key_for_slot(victim_slot + 7, "upload_session:after")
            rc.set(foreign, "set by another program", px=300)
            for k in early:
                assert rc.pexpire(k, 100)
            for k in [*early, foreign]:
                wait_for(lambda k=k: rc.exists(k) == 0, timeout=10)
            want = {*early, *timed, foreign}
            wait_for(lambda: set(calls.keys()) >= want, timeout=20)
            time.sleep(1.0)
    finally:
        rc.close()
        if not victim.alive:
            cluster3.restart(victim)  # it rejoins as a replica of the promoted node
    assert calls.keys() == Counter({k: 1 for k in want})
    assert calls.one(foreign)[0].via == "notification" and not calls.one(foreign)[0].guaranteed
    for k in early:
        expired = calls.one(k)[0]
        assert expired.via == "notification" and expired.guaranteed and expired.value == "pre"
    on_promoted = [k for k in early if cluster3.owner(int(key_slot(k.encode()))) is promoted]
    assert len(on_promoted) == 3
    assert all(calls.one(k)[0].value == "timed" for k in timed)


def subscribers(node: Node) -> int:
    with node.client() as r:
        return int(dict(r.pubsub_numsub(CHANNEL)).get(CHANNEL, 0))


def test_a_manual_failover_moves_the_bell_without_any_connection_breaking(
    cluster3: Cluster, cqueue: Queue, run_worker: Any
) -> None:
    """CLUSTER FAILOVER demotes a live primary: no subscription fails, so only the periodic
    look at the primaries notices. The bell moves to the new primary and leaves the old."""
    calls = Calls()
    old = cluster3.primaries()[-1]
    (replica,) = replicas_of(cluster3, old)[:1]
    rc = cluster3.client()
    try:
        with run_worker(watcher(cqueue, calls)) as worker:
            wait_bells(cluster3, worker)
            assert subscribers(old) == 1 and subscribers(replica) == 0
            with replica.client() as r:
                r.execute_command("CLUSTER", "FAILOVER")
            wait_for(lambda: replica in cluster3.primaries() and old not in cluster3.primaries())
            cluster3.wait_ready()
            wait_for(lambda: bell_on(replica) is None, timeout=15)
            wait_for(lambda: subscribers(old) == 0, timeout=15)
            wait_for(lambda: worker.expiry.mode == "notifications", timeout=15)
            key = keys_on(replica, "upload_session:manual", 1)[0]
            cqueue.expiring.set(key, "m", ttl=60)
            assert rc.pexpire(key, 100)
            wait_for(lambda: rc.exists(key) == 0, timeout=5)
            wait_for(lambda: calls.keys()[key] == 1, timeout=10)
    finally:
        rc.close()
    expired = calls.one(key)[0]
    assert expired.via == "notification" and expired.guaranteed and expired.value == "m"


def test_a_key_in_a_migrated_slot_rings_on_its_new_primary(
    cluster3: Cluster, cqueue: Queue, run_worker: Any
) -> None:
    calls = Calls()
    source, target = cluster3.primaries()[:2]
    slot = first_slot(source) + 100
    key = key_for_slot(slot, "upload_session:moved")
    rc = cluster3.client()
    try:
        with run_worker(watcher(cqueue, calls)) as worker:
            wait_bells(cluster3, worker)
            cqueue.expiring.set(key, "r", ttl=60)
            assert cluster3.migrate_slot(slot, target) >= 1  # MIGRATE keeps the TTL
            assert cluster3.owner(slot) is target
            assert rc.pexpire(key, 100)
            wait_for(lambda: rc.exists(key) == 0, timeout=5)
            wait_for(lambda: calls.keys()[key] == 1, timeout=10)
    finally:
        rc.close()
    expired = calls.one(key)[0]
    assert expired.via == "notification" and expired.guaranteed and expired.value == "r"


def test_a_cluster_worker_without_patterns_opens_no_bell(
    cluster3: Cluster, cqueue: Queue, run_worker: Any
) -> None:
    worker = Worker(cqueue)
    worker.handler("k")(lambda task: None)
    with run_worker(worker):
        time.sleep(0.5)
        assert worker.expiry.bells is None and worker.expiry.mode is None


def test_node_connections_log_in_as_the_cluster_client(
    cluster3: Cluster, qname: str, run_worker: Any
) -> None:
    """The per-primary subscriptions use the cluster client's user and password."""
    for n in cluster3.nodes:
        with n.client() as r:
            r.execute_command("ACL", "SETUSER", "belluser", "on", ">s3cret", "~*", "&*", "+@all")
    url = cluster3.url.replace("redis+cluster://", "redis+cluster://belluser:s3cret@")
    queue = Queue(qname, url=url)
    try:
        worker = watcher(queue, Calls())
        with run_worker(worker):
            wait_bells(cluster3, worker)
            for p in cluster3.primaries():
                with p.client() as r:
                    subscribers = [c for c in r.client_list() if int(c.get("sub", 0)) > 0]
                assert any(c.get("user") == "belluser" for c in subscribers), (p, subscribers)
    finally:
        queue.close()
        for n in cluster3.nodes:
            with n.client() as r:
                r.execute_command("ACL", "DELUSER", "belluser")


def test_bell_refused_by_acl_falls_back_to_timer_and_scan(
    cluster3: Cluster, qname: str, run_worker: Any
) -> None:
    """Every command and key, but only delayq's own channels: each primary refuses the
    expired-event channel, and watched keys still fire on the timer."""
    for n in cluster3.nodes:
        with n.client() as r:
            r.execute_command(
                "ACL", "SETUSER", "nobell", "on", ">pw", "~*", "resetchannels", "&dq:*", "+@all"
            )
    url = cluster3.url.replace("redis+cluster://", "redis+cluster://nobell:pw@")
    queue = Queue(qname, url=url)
    calls = Calls()
    try:
        worker = watcher(queue, calls)
        with run_worker(worker):
            wait_for(lambda: worker.expiry.mode == "timer+scan", timeout=10)
            bells = worker.expiry.bells
            assert bells is not None and len(bells.refused) == 3 and not bells.listeners
            key = keys_on(cluster3.primaries()[0], "upload_session:acl", 1)[0]
            queue.expiring.set(key, "v", ttl=0.2)
            wait_for(lambda: calls.keys()[key] == 1, timeout=5)
        assert calls.one(key)[0].via == "timer"
        assert queue.stats().expiry_mode == "timer+scan"
    finally:
        queue.close()
        for n in cluster3.nodes:
            with n.client() as r:
                r.execute_command("ACL", "DELUSER", "nobell")
