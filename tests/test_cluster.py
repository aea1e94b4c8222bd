"""delayq on a real local Redis Cluster (3 primaries, 3 replicas; tests/support/topology.py).

The producer contract (tests/test_api.py), the worker's core cases (tests/test_worker.py) and
the sharded-queue cases (tests/test_shards.py) run again here, unchanged, with ``server``
pointing at the cluster; the cases below are the cluster's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from delayq import AsyncQueue, Queue, Task, Worker
from delayq.errors import DurabilityError
from delayq.keys import shard_of

from . import test_api, test_shards, test_worker
from .support.helpers import wait_for
from .support.topology import Cluster

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster3() -> Iterator[Cluster]:
    with Cluster() as c:
        yield c


class ClusterServer:
    """What the shared tests need of ``server``: a URL (and a flavour name)."""

    flavour = "cluster"

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.url = cluster.url


@pytest.fixture(scope="module")
def server(cluster3: Cluster) -> ClusterServer:
    return ClusterServer(cluster3)


@pytest.fixture
def flavour() -> str:
    return "cluster"


# The shared contract, collected again in this module so it uses the cluster ``server``.
api = test_api.api
CONTRACT = [n for n in dir(test_api) if n.startswith("test_")]
WORKER_CASES = (
    "test_task_runs_once_on_time",
    "test_done_id_is_not_run_again_within_dedupe_window",
    "test_retry_runs_again_and_counts_the_attempt",
    "test_fail_goes_dead_at_once_and_fires_on_dead",
    "test_unknown_kind_and_undecodable_records_go_dead_and_worker_keeps_running",
    "test_dead_tasks_can_be_replayed_and_purged",
    "test_graceful_shutdown_hands_back_unfinished_tasks",
    "test_idle_worker_wakes_for_an_earlier_task_without_polling",
    "test_worker_on_an_async_queue",
    "test_workers_register_and_unregister",
    "test_scripts_are_reloaded_after_script_flush",
)
SHARD_CASES = (
    "test_tasks_spread_over_shards_and_each_id_goes_to_its_own",
    "test_a_worker_drains_every_shard_and_none_starves",
    "test_dead_tasks_of_all_shards_are_listed_replayed_and_purged",
    "test_a_different_shard_count_is_refused",
    "test_an_unsplit_queue_with_waiting_tasks_is_not_split",
    "test_get_cancel_and_reschedule_on_a_queue_opened_with_the_wrong_shard_count_are_refused",
    "test_async_get_cancel_and_reschedule_with_the_wrong_shard_count_are_refused",
    "test_resharding_is_refused_while_tasks_wait_run_or_are_dead",
    "test_a_queue_being_resharded_is_refused_until_the_move_is_finished",
)
for _name in CONTRACT:
    globals()[_name] = getattr(test_api, _name)
for _name in WORKER_CASES:
    globals()[_name] = getattr(test_worker, _name)
for _name in SHARD_CASES:
    globals()[_name] = getattr(test_shards, _name)


def test_a_sharded_queue_spreads_over_every_primary(cluster3: Cluster, qname: str) -> None:
    queue = Queue(qname, url=cluster3.url, shards=16)
    queue.schedule_many([{"kind": "k", "payload": i, "delay": 60} for i in range(1600)])
    holders: Counter[int] = Counter()
    for node in cluster3.primaries():
        client = node.client()
        for core in queue.shards.cores:
            if client.execute_command("CLUSTER", "COUNTKEYSINSLOT", _slot(core.keys.scheduled)):
                holders[node.port] += 1
        client.close()
    assert len(holders) == 3 and sum(holders.values()) == 16, holders
    assert queue.stats().scheduled == 1600
    queue.close()


def _slot(key: str) -> int:
    return int(key_slot(key.encode()))


def test_durable_waits_for_a_replica(cluster3: Cluster, qname: str) -> None:
    queue = Queue(qname, url=cluster3.url, shards=4, durable_replicas=1)
    ids = queue.schedule_many(
        [{"kind": "k", "payload": i, "delay": 60} for i in range(400)], durable=True
    )
    one = queue.schedule("k", 1, delay=60, durable=True)
    assert queue.stats().scheduled == 401 and queue.get(one) is not None
    # Every write is on a replica already: read each shard's schedule from the replicas.
    on_replicas = 0
    for node in cluster3.replicas():
        client = node.client()
        client.execute_command("READONLY")
        for core in queue.shards.cores:
            with contextlib.suppress(redis.ResponseError):  # MOVED: not a replica of it
                on_replicas += int(client.zcard(core.keys.scheduled))
        client.close()
    assert on_replicas == 401, on_replicas
    too_many = Queue(qname, url=cluster3.url, shards=4, durable_replicas=3, durable_timeout=0.2)
    with pytest.raises(DurabilityError, match="of 3 replica"):
        too_many.schedule("k", 2, delay=60, durable=True)
    too_many.close()
    queue.close()
    assert len(ids) == 400


async def test_the_async_queue_and_worker_on_the_cluster(cluster3: Cluster, qname: str) -> None:
    queue = AsyncQueue(qname, url=cluster3.url, shards=8, durable_replicas=1)
    worker = Worker(queue, concurrency=8)
    ran: list[str] = []
    worker.handler("k")(lambda task: ran.append(task.id))
    serving = asyncio.create_task(worker.serve())
    ids = await queue.schedule_many(
        [{"kind": "k", "payload": i, "delay": 0.2} for i in range(300)], durable=True
    )
    for _ in range(300):
        if len(ran) >= 300:
            break
        await asyncio.sleep(0.05)
    worker.stop()
    await serving
    assert sorted(ran) == sorted(ids)
    assert {shard_of(i, 8) for i in ran} == set(range(8))
    await queue.close()


def test_a_worker_per_process_thread_pair_shares_the_shards(
    cluster3: Cluster, qname: str, run_worker: Any
) -> None:
    queue = Queue(qname, url=cluster3.url, shards=6)
    ran: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(task: Task) -> None:
        with lock:
            ran[task.id] += 1

    workers = [Worker(queue, concurrency=4) for _ in range(2)]
    for w in workers:
        w.handler("k")(handler)
    with run_worker(workers[0]), run_worker(workers[1]):
        ids = queue.schedule_many([{"kind": "k", "payload": i} for i in range(600)])
        wait_for(lambda: queue.stats().done == 600, timeout=30)
    assert set(ran) == set(ids) and max(ran.values()) == 1
    queue.close()


def test_pages_of_a_sharded_queue_walk_every_primary_by_cursor(
    cluster3: Cluster, qname: str
) -> None:
    queue = Queue(qname, url=cluster3.url, shards=8)
    ids = queue.schedule_many([{"kind": "k", "delay": 60 + i % 7} for i in range(300)])
    walked, after = [], None
    while True:
        page = queue.page("scheduled", limit=40, after=after)
        walked += [t.id for t in page.tasks]
        if page.next is None:
            break
        after = page.next
    assert sorted(walked) == sorted(ids) and len(walked) == 300
    queue.close()
