"""The cluster and sentinel fixtures do what tests/support/topology.py says: real failovers, a real
reshard under a reading client, and redis-py's cluster and sentinel clients following them."""

from __future__ import annotations

import threading

import pytest
import redis
from redis.sentinel import Sentinel

from .support.topology import (
    FLAVOURS,
    SLOTS,
    Cluster,
    SentinelSetup,
    cluster,  # noqa: F401
    cluster_nodes,
    key_for_slot,
    sentinel_setup,  # noqa: F401
)

pytestmark = pytest.mark.slow


def _master(sentinel: Sentinel) -> tuple[str, int]:
    host, port = sentinel.discover_master("mymaster")  # type: ignore[no-untyped-call]
    return str(host), int(port)


def _first_slot(c: Cluster, i: int) -> int:
    node = c.primaries()[i]
    return cluster_nodes(node)[node.node_id].slots[0][0]


def test_cluster_serves_keys_in_every_primarys_slots(cluster: Cluster) -> None:  # noqa: F811
    primaries, replicas = cluster.primaries(), cluster.replicas()
    assert len(primaries) == 3 and len(replicas) == 3
    assert cluster.url == "redis+cluster://" + ",".join(
        f"127.0.0.1:{n.port}" for n in cluster.nodes
    )
    view = cluster_nodes(primaries[0])
    assert sum(hi - lo + 1 for e in view.values() for lo, hi in e.slots) == SLOTS
    # Each replica follows a different primary.
    assert {view[r.node_id].master_id for r in replicas} == {p.node_id for p in primaries}

    with cluster.client() as rc:
        for i, p in enumerate(primaries):
            key = key_for_slot(_first_slot(cluster, i), "serve")
            rc.set(key, f"v{i}")
            assert rc.get(key) == f"v{i}"
            with p.client() as direct:  # the key really lives on that primary
                assert direct.get(key) == f"v{i}"


def test_sigkilled_primary_fails_over_and_keeps_replicated_writes(
    cluster: Cluster,  # noqa: F811
) -> None:
    victim = cluster.primaries()[0]
    key = key_for_slot(_first_slot(cluster, 0), "failover")
    with victim.client() as direct:
        direct.set(key, "before")
        assert direct.wait(1, 2000) == 1  # on the replica before the crash
    with cluster.client() as rc:  # created before the crash: must follow the new topology
        assert rc.get(key) == "before"
        killed = cluster.kill_primary(0)
        assert killed is victim and not victim.alive
        try:
            successor = cluster.wait_failover(timeout=30)
            assert successor is not victim and successor.alive
            assert cluster.owner(_first_slot(cluster, 0)) is successor
            assert rc.get(key) == "before"
            rc.set(key, "after")
        finally:
            cluster.restart(victim)
    # The old primary is back, as a replica of its successor, with the newer value.
    assert victim in cluster.replicas()
    assert cluster_nodes(victim)[victim.node_id].master_id == successor.node_id
    with victim.client() as r:
        r.execute_command("READONLY")
        assert r.get(key) == "after"


def test_migrate_slot_while_a_client_reads(cluster: Cluster) -> None:  # noqa: F811
    slot = _first_slot(cluster, 0) + 1000
    src, dst = cluster.owner(slot), cluster.primaries()[1]
    keys = [f"{key_for_slot(slot, 'reshard')}:{i}" for i in range(300)]
    with cluster.client() as rc:
        for k in keys:
            rc.set(k, k)

    stop = threading.Event()
    reads, problems = [0], []

    def reader(rc: redis.RedisCluster) -> None:
        try:
            while not stop.is_set():
                for k in keys[::7]:
                    if (v := rc.get(k)) != k:
                        problems.append(f"{k} read {v!r}")
                    reads[0] += 1
        except Exception as e:  # surfaced by the assertion below
            problems.append(repr(e))

    with cluster.client() as rc:
        thread = threading.Thread(target=reader, args=(rc,))
        thread.start()
        try:
            moved = cluster.migrate_slot(slot, dst, batch=20, pause=0.05)
        finally:
            stop.set()
            thread.join(30)
        assert moved == len(keys)
        assert not problems, problems[:5]
        assert reads[0] > 100
        assert cluster.owner(slot) is dst
        assert all(rc.get(k) == k for k in keys)
    with src.client() as s, dst.client() as d:
        assert s.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert d.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == len(keys)
    cluster.migrate_slot(slot, src)  # leave the shared cluster as it was
    assert cluster.owner(slot) is src


@pytest.mark.parametrize("flavour", FLAVOURS, ids=[f[0] for f in FLAVOURS])
def test_one_primary_cluster(flavour: tuple[str, str]) -> None:
    with Cluster(flavour[1], primaries=1, replicas=0) as c:
        (only,) = c.primaries()
        assert c.replicas() == []
        assert cluster_nodes(only)[only.node_id].slots == [(0, SLOTS - 1)]
        with c.client() as rc:
            rc.set("one", "1")
            assert rc.get("one") == "1"
    assert not only.alive


def test_sentinel_failover_then_master_for_writes(
    sentinel_setup: SentinelSetup,  # noqa: F811
) -> None:
    s = sentinel_setup
    ports = ",".join(f"127.0.0.1:{sn.port}" for sn in s.sentinels)
    assert s.url == f"redis+sentinel://{ports}/mymaster/0"
    old = s.primary
    sentinel = s.sentinel()
    master = sentinel.master_for(  # type: ignore[no-untyped-call]
        "mymaster", socket_timeout=2, decode_responses=True
    )
    try:
        assert _master(sentinel) == (old.host, old.port)
        master.set("before", "1")
        assert master.wait(1, 2000) == 1
        s.kill_primary()
        try:
            new = s.wait_failover(timeout=30)
            assert new is not old
            assert _master(sentinel) == (new.host, new.port)
            # The client made before the failover writes to the new primary.
            master.set("after", "2")
            assert master.get("before") == "1"
            with redis.Redis(new.host, new.port, decode_responses=True) as r:
                assert r.get("after") == "2"
        finally:
            s.restart(old)
        assert s.replica is old
        with redis.Redis(old.host, old.port, decode_responses=True) as r:
            assert r.execute_command("ROLE")[0] == "slave"
    finally:
        master.close()
        sentinel.close()
