"""A queue split over shards: routing by id, fair claiming, stats added up, and a changed
shard count refused before anything is stranded. On one server here; tests/test_cluster.py
runs the same on a real Redis Cluster."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest
import redis

from delayq import AsyncQueue, ConfigurationError, InvalidTaskError, Queue, Task, Worker
from delayq.embedded import EmbeddedServer
from delayq.keys import shard_of

from .support.helpers import wait_for


def test_tasks_spread_over_shards_and_each_id_goes_to_its_own(
    server: EmbeddedServer, qname: str
) -> None:
    queue = Queue(qname, url=server.url, shards=8)
    ids = queue.schedule_many([{"kind": "k", "payload": i, "delay": 60} for i in range(800)])
    per_shard = Counter(shard_of(i, 8) for i in ids)
    assert len(per_shard) == 8 and min(per_shard.values()) > 50  # spread, not piled up
    for core in queue.shards.cores:
        stored = {x.decode() for x in queue.client.zrange(core.keys.scheduled, 0, -1)}
        assert stored == {i for i in ids if shard_of(i, 8) == core.shard}
    assert queue.stats().scheduled == 800  # the shards added up
    info = queue.get(ids[5])
    assert info is not None and info.payload == 5 and info.state == "scheduled"
    assert queue.reschedule(ids[5], delay=120) and queue.cancel(ids[6])
    assert (gone := queue.get(ids[6])) is not None and gone.state == "cancelled"
    assert queue.stats().scheduled == 799
    assert queue.schedule("k", 1, task_id="fixed", delay=60) == "fixed"
    assert queue.client.zscore(queue.shards.of("fixed").keys.scheduled, "fixed") is not None
    queue.close()


def test_a_worker_drains_every_shard_and_none_starves(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    queue = Queue(qname, url=server.url, shards=4)
    worker = Worker(queue, concurrency=8)
    ran: list[str] = []
    lock = threading.Lock()

    @worker.handler("k")
    def k(task: Task) -> None:
        with lock:
            ran.append(task.id)

    # A backlog on every shard, due now: all shards are served in the first second, not
    # one shard after another.
    ids = queue.schedule_many([{"kind": "k", "payload": i} for i in range(2000)])
    with run_worker(worker):
        wait_for(lambda: len(ran) >= 200, timeout=20)
        first = Counter(shard_of(i, 4) for i in ran[:200])
        wait_for(lambda: queue.stats().done == 2000, timeout=60)
        # Idle, a task scheduled later on any shard is woken for and run promptly.
        late = [queue.schedule("k", i, delay=0.2) for i in range(8)]
        wait_for(lambda: set(late) <= set(ran), timeout=5)
    assert len(first) == 4 and min(first.values()) >= 20, first
    assert sorted(ran) == sorted(ids + late)  # each once
    stats = queue.stats()
    assert (stats.scheduled, stats.active, stats.done) == (0, 0, 2008)
    assert stats.counters["succeeded"] == 2008
    queue.close()


def test_dead_tasks_of_all_shards_are_listed_replayed_and_purged(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    queue = Queue(qname, url=server.url, shards=3)
    worker = Worker(queue)
    fixed = threading.Event()

    @worker.handler("k", max_attempts=1)
    def k(task: Task) -> None:
        if not fixed.is_set():
            raise RuntimeError("bug")

    ids = [queue.schedule("k", i, task_id=f"d{i}") for i in range(9)]
    with run_worker(worker):
        wait_for(lambda: queue.stats().dead == 9)
        assert {t.id for t in queue.dead()} == set(ids)
        assert len(queue.dead(0, 4)) == 4 and len(queue.dead(4, 100)) == 5
        fixed.set()
        assert queue.replay(["d0", "d1"]) == 2
        assert queue.purge_dead(["d2"]) == 1
        assert queue.replay() == 6
        wait_for(lambda: queue.stats().done == 8)
    assert queue.stats().dead == 0
    queue.close()


def test_a_different_shard_count_is_refused(server: EmbeddedServer, qname: str) -> None:
    split = Queue(qname, url=server.url, shards=4)
    split.schedule("k", 1, delay=60)
    for n in (1, 8):
        other = Queue(qname, url=server.url, shards=n)
        with pytest.raises(ConfigurationError, match="split into 4 shard"):
            other.schedule("k", 2, delay=60)
        other.close()
    assert split.stats().scheduled == 1
    split.close()


def test_an_unsplit_queue_with_waiting_tasks_is_not_split(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    plain = Queue(qname, url=server.url)
    plain.schedule("k", 1, delay=60)
    split = Queue(qname, url=server.url, shards=4)
    with pytest.raises(ConfigurationError, match="split into 1 shard"):
        split.schedule("k", 2, delay=60)
    worker = Worker(split)
    worker.handler("k")(lambda task: None)
    with pytest.raises(ConfigurationError, match="opened with shards=4"):
        worker.run()
    assert plain.stats().scheduled == 1  # still there, still served by unsplit workers
    plain.close()
    split.close()


def test_bad_shard_counts(server: EmbeddedServer) -> None:
    for bad in (0, -1, 1025, 2.5, True):
        with pytest.raises(ConfigurationError, match="shards must be a whole number from 1 to"):
            Queue("q", url=server.url, shards=bad)  # type: ignore[arg-type]


def test_shards_stored_refuses_a_stored_count_delayq_never_writes(
    server: EmbeddedServer, qname: str
) -> None:
    """Review of issue 31 (cosmetic): a stored count over max_shards was refused by
    shards="stored" as if the caller had passed it ("shards must be ..."); the message is
    now the Node client's: the queue stored it, and delayq did not write it."""
    r = redis.Redis(port=server.port)
    try:
        r.hset(f"dq:{{{qname}}}:shards", "n", "2000")
    finally:
        r.close()
    with pytest.raises(ConfigurationError) as e:
        Queue(qname, url=server.url, shards="stored")
    assert f"queue {qname!r} stored a shard count of 2000" in str(e.value)
    assert "not written by delayq" in str(e.value) and "1024" in str(e.value)


def test_stats_and_next_due_across_shards(server: EmbeddedServer, qname: str) -> None:
    queue = Queue(qname, url=server.url, shards=5)
    queue.schedule_many([{"kind": "k", "delay": 30 + i} for i in range(10)])
    stats = queue.stats()
    assert stats.scheduled == 10 and stats.due == 0
    assert stats.next_due_at is not None
    assert 25 < stats.next_due_at.timestamp() - time.time() < 32
    queue.close()


def test_the_first_process_fixes_the_shard_count_even_when_it_is_one(
    server: EmbeddedServer, qname: str
) -> None:
    """An unsplit producer that has nothing waiting right now still holds the queue: a
    process opening it split is refused, instead of both writing where the other does not
    look."""
    plain = Queue(qname, url=server.url)
    plain.cancel(plain.schedule("k", 1, delay=60))
    split = Queue(qname, url=server.url, shards=4)
    with pytest.raises(ConfigurationError, match="split into 1 shard"):
        split.schedule("k", 2, delay=60)
    plain.schedule("k", 3, delay=60, task_id="c")
    assert plain.get("c") is not None
    plain.close()
    split.close()


def test_a_busy_worker_keeps_beating_on_the_home_shard(
    server: EmbeddedServer, qname: str, run_worker: Any
) -> None:
    """Full, it claims nothing, and its one lease is on another shard: its heartbeat still
    carries its registration to shard 0, so it does not read as dead."""
    queue = Queue(qname, url=server.url, shards=2)
    worker = Worker(queue, concurrency=1, lease=1.5)
    release = threading.Event()
    worker.handler("k")(lambda task: release.wait(20))
    tid = next(f"t{i}" for i in range(100) if shard_of(f"t{i}", 2) == 1)
    with run_worker(worker):
        queue.schedule("k", None, task_id=tid)
        wait_for(lambda: queue.stats().active == 1)
        time.sleep(6)  # longer than the registration period (5 s) that claims would carry
        seen = queue.workers()[0]
        age = (queue.stats().now - seen.last_seen).total_seconds()
        release.set()
    assert age < 2, age
    assert seen.in_flight == 1
    queue.close()


def test_a_shard_that_fails_does_not_hold_up_the_others(make_server: Any, run_worker: Any) -> None:
    """Claims on one shard are refused (here by an ACL that leaves its keys out, as an
    unreachable primary would fail them): the other shards' tasks still start on time."""
    srv = make_server(appendonly=False)
    admin = Queue("split", url=srv.url, shards=3)
    admin.schedule("k", None, delay=60, task_id="warm")  # stores the shard count
    allowed = " ".join(f"~dq:{{{t}}}:*" for t in ("split", "split#0", "split#1"))
    admin.client.execute_command(*f"ACL SETUSER part on >pw {allowed} &* +@all".split())
    part = Queue("split", url=f"redis://part:pw@127.0.0.1:{srv.port}/0", shards=3)
    worker = Worker(part, concurrency=4)
    started: dict[str, float] = {}
    worker.handler("k")(lambda task: started.setdefault(task.id, time.time()))
    ids = [f"t{i}" for i in range(60) if shard_of(f"t{i}", 3) != 2][:12]
    with run_worker(worker):
        time.sleep(1.5)  # the worker has met the refusals and backs off on shard 2
        due = time.time() + 0.5
        admin.schedule_many([{"kind": "k", "task_id": i, "delay": 0.5} for i in ids])
        wait_for(lambda: set(ids) <= set(started), timeout=10)
    late = max(started[i] - due for i in ids)
    assert late < 1.0, late  # not held back by shard 2's growing backoff (up to 5 s)
    admin.close()
    part.close()


def test_the_admin_side_finds_every_shard(server: EmbeddedServer, qname: str) -> None:
    """The CLI and dashboard open queues by name: they read the stored shard count."""
    from click.testing import CliRunner

    from delayq.admin.inspect import Admin
    from delayq.cli.main import main

    queue = Queue(qname, url=server.url, shards=3)
    ids = queue.schedule_many([{"kind": "k", "delay": 60} for _ in range(30)])
    admin = Admin(server.url)
    assert admin.queue(qname).stats().scheduled == 30
    assert qname in admin.discover()
    shown = CliRunner().invoke(main, ["task", "show", ids[7], "-q", qname, "--url", server.url])
    assert shown.exit_code == 0 and ids[7] in shown.output, shown.output
    admin.close()
    queue.close()


def test_dashboard_views_and_cli_actions_cover_every_shard(
    server: EmbeddedServer, qname: str
) -> None:
    from delayq.admin import operate
    from delayq.admin.inspect import Admin

    queue = Queue(qname, url=server.url, shards=3)
    queue.schedule_many([{"kind": "k", "delay": 30 + i} for i in range(12)])
    admin = Admin(server.url, queues=[qname])
    assert admin.overview(qname).stats.scheduled == 12
    waiting = admin.tasks(qname, "scheduled", 0, 5)
    assert len(waiting) == 5
    assert [t.due_at for t in waiting] == sorted(t.due_at for t in waiting)  # type: ignore[type-var]
    assert sum(admin.timeline(qname, 60, 5).counts) + admin.timeline(qname, 60, 5).later == 12
    # Dead tasks on several shards: replayed and purged by the CLI's operations.
    keys = [c.keys for c in queue.shards.cores]
    for i, k in enumerate(keys):
        queue.client.hset(k.tasks, f"d{i}", b'{"k":"k"}\n{}')
        queue.client.zadd(k.dead, {f"d{i}": 1})
    assert queue.stats().dead == 3
    assert operate.replay_dead(admin.queue(qname)) == 3
    assert queue.stats().dead == 0
    admin.close()
    queue.close()


def _wrong_shard_ids(n_stored: int, n_opened: int) -> list[str]:
    """Ids whose shard key differs between the two counts (so a read would look elsewhere)."""
    return [
        f"w{i}"
        for i in range(200)
        if n_opened == 1 or shard_of(f"w{i}", n_stored) != shard_of(f"w{i}", n_opened)
    ][:3]


def test_get_cancel_and_reschedule_on_a_queue_opened_with_the_wrong_shard_count_are_refused(
    server: EmbeddedServer, qname: str
) -> None:
    split = Queue(qname, url=server.url, shards=4)
    for n in (1, 8):
        ids = _wrong_shard_ids(4, n)
        split.schedule_many([{"kind": "k", "task_id": i, "delay": 60} for i in ids])
        other = Queue(qname, url=server.url, shards=n)
        with pytest.raises(ConfigurationError, match="split into 4 shard"):
            other.get(ids[0])
        with pytest.raises(ConfigurationError, match="split into 4 shard"):
            other.cancel(ids[1])
        with pytest.raises(ConfigurationError, match="split into 4 shard"):
            other.reschedule(ids[2], delay=5)
        other.close()
    assert split.stats().scheduled == len(set(_wrong_shard_ids(4, 1) + _wrong_shard_ids(4, 8)))
    assert split.get("w0") is not None and split.cancel("w0")  # the right count still reads
    split.close()


async def test_async_get_cancel_and_reschedule_with_the_wrong_shard_count_are_refused(
    server: EmbeddedServer, qname: str
) -> None:
    split = AsyncQueue(qname, url=server.url, shards=4)
    ids = _wrong_shard_ids(4, 8)
    await split.schedule_many([{"kind": "k", "task_id": i, "delay": 60} for i in ids])
    for n in (1, 8):
        other = AsyncQueue(qname, url=server.url, shards=n)
        with pytest.raises(ConfigurationError, match="split into 4 shard"):
            await other.get(ids[0])
        with pytest.raises(ConfigurationError, match="split into 4 shard"):
            await other.cancel(ids[1])
        with pytest.raises(ConfigurationError, match="split into 4 shard"):
            await other.reschedule(ids[2], delay=5)
        await other.close()
    assert (await split.stats()).scheduled == 3
    await split.close()


def test_reads_before_any_write_do_not_fix_the_shard_count(
    server: EmbeddedServer, qname: str
) -> None:
    """A get, cancel or reschedule stores nothing: the first write still decides."""
    reader = Queue(qname, url=server.url, shards=4)
    assert reader.get("nope") is None and not reader.cancel("nope")
    plain = Queue(qname, url=server.url)
    plain.schedule("k", 1, task_id="a", delay=60)  # not refused: the reads stored nothing
    with pytest.raises(ConfigurationError, match="split into 1 shard"):
        reader.get("a")
    plain.close()
    reader.close()


def _seed_dead(queue: Queue, count: int) -> list[tuple[float, str]]:
    """``count`` dead tasks written straight into their shards, many dying in the same ms
    (as a batch does); returns (time of death, id) of each."""
    pipe = queue.client.pipeline(transaction=False)
    seeded = []
    for i in range(count):
        tid, died = f"dead-{i:05d}", 1_700_000_000_000 + i // 7  # runs of 7 share a time
        keys = queue.shards.of(tid).keys
        pipe.hset(keys.tasks, tid, b'{"k":"k"}\n1')
        pipe.zadd(keys.dead, {tid: died})
        seeded.append((float(died), tid))
    pipe.execute()
    return seeded


def _hget_calls(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))


def test_a_deep_page_of_a_sharded_queue_reads_one_page_from_each_shard(make_server: Any) -> None:
    """Keyset paging: each shard returns at most ``limit`` tasks after the cursor, so page
    31 costs what page 1 does (counted in HGETs: three per task a shard returns), and the
    pages, walked to the end, hold every task once in the sets' order."""
    srv = make_server(appendonly=False)
    queue = Queue("deep", url=srv.url, shards=4)
    seeded = _seed_dead(queue, 3200)
    queue.schedule_many(
        [{"kind": "k", "task_id": f"w{i}", "delay": 60 + i % 50} for i in range(1500)]
    )
    # The dead set, most recent first, ties by id backwards; every page full until the last.
    walked: list[str] = []
    after, costs = None, []
    while True:
        before = _hget_calls(queue.client)
        page = queue.page("dead", limit=100, after=after)
        costs.append(_hget_calls(queue.client) - before)
        walked += [t.id for t in page.tasks]
        assert all(t.state == "dead" and t.payload == 1 for t in page.tasks)
        if page.next is None:
            break
        after = page.next
    assert walked == [tid for _, tid in sorted(seeded, reverse=True)]
    assert len(costs) >= 32 and max(costs) <= 4 * 100 * 3, costs  # not offset + limit per shard
    # Waiting tasks, by due time: the same walk.
    waiting: list[str] = []
    after = None
    while True:
        before = _hget_calls(queue.client)
        page = queue.page("scheduled", limit=200, after=after)
        assert _hget_calls(queue.client) - before <= 4 * 200 * 3
        waiting += [t.id for t in page.tasks]
        if page.next is None:
            break
        after = page.next
    assert len(waiting) == len(set(waiting)) == 1500
    dues = [queue.get(i).due_at for i in waiting[::97]]  # type: ignore[union-attr]
    assert dues == sorted(dues)  # type: ignore[type-var]
    queue.close()


async def test_async_pages_walk_a_sharded_dead_set_by_cursor(make_server: Any) -> None:
    srv = make_server(appendonly=False)
    sync = Queue("deep", url=srv.url, shards=3)
    seeded = _seed_dead(sync, 250)
    sync.close()
    queue = AsyncQueue("deep", url=srv.url, shards=3)
    walked, after = [], None
    while True:
        page = await queue.page("dead", limit=40, after=after)
        walked += [t.id for t in page.tasks]
        if page.next is None:
            break
        after = page.next
    assert walked == [tid for _, tid in sorted(seeded, reverse=True)]
    await queue.close()


def test_the_dashboard_pages_past_a_thousand_waiting_tasks_of_a_sharded_queue(
    make_server: Any,
) -> None:
    """Its "more" links carry a cursor: every waiting task is reached, once, in due order
    (an offset past 1,000 was refused before)."""
    import re

    import httpx

    from .support.dashboard_helpers import TOKEN, DashboardThread

    srv = make_server(appendonly=False)
    queue = Queue("deep", url=srv.url, shards=4)
    queue.schedule_many(
        [{"kind": "k", "task_id": f"w{i:04d}", "delay": 60 + i} for i in range(1100)]
    )
    shown: list[str] = []
    with (
        DashboardThread(srv.url, ["deep"]) as base,
        httpx.Client(
            base_url=base, timeout=30, headers={"Authorization": f"Bearer {TOKEN}"}
        ) as http,
    ):
        path: str | None = "/queues/deep/scheduled"
        for _ in range(40):
            if path is None:
                break
            r = http.get(path)
            assert r.status_code == 200, (path, re.findall(r"page needs[^<]*", r.text))
            shown += re.findall(r"id=(w\d{4})\"", r.text)
            more = re.search(r'<a href="(\?[^"]+)">more', r.text)
            path = "/queues/deep/scheduled" + more.group(1).replace("&amp;", "&") if more else None
    assert shown == [f"w{i:04d}" for i in range(1100)]
    queue.close()


def _reshard(url: str, name: str, shards: int) -> Any:
    from click.testing import CliRunner

    from delayq.cli.main import main

    args = ["reshard", "-q", name, "--shards", str(shards), "--url", url, "--json"]
    return CliRunner().invoke(main, args)


def test_resharding_keeps_finished_ids_cron_schedules_and_watched_keys(
    make_server: Any, run_worker: Any
) -> None:
    """`delayq reshard` from 1 to 4 shards, then 4 to 2 and back to 1: an id finished within
    the dedupe window is still not run again, and the cron schedule, the watched key and
    their waiting tasks are on the home shard of each count, served by its workers."""
    import json

    srv = make_server(appendonly=False)
    ran: list[str] = []
    lock = threading.Lock()

    def serve(queue: Queue) -> Worker:
        worker = Worker(queue, concurrency=8)

        @worker.handler("k")
        def k(task: Task) -> None:
            with lock:
                ran.append(task.id)

        worker.every(3600, name="hourly")(lambda task: None)
        worker.on_expire("sess:*")(lambda expired: ran.append(f"expired:{expired.key}"))
        return worker

    plain = Queue("rs", url=srv.url, dedupe_window=3600)
    finished = [f"f{i}" for i in range(60)]
    plain.schedule_many([{"kind": "k", "task_id": i} for i in finished])
    with run_worker(serve(plain)):
        wait_for(lambda: plain.stats().done == 60)
    plain.expiring.set("sess:1", {"user": 7}, 3600)
    before = plain.stats()
    assert before.scheduled == 2  # the next hourly occurrence and the watched key's task
    home_keys = plain.core.keys
    for round_, n in enumerate((4, 2, 1)):
        result = _reshard(srv.url, "rs", n)
        assert result.exit_code == 0, result.output
        report = json.loads(result.output)
        assert report["ok"] and report["done"] > 0, report
        queue = Queue("rs", url=srv.url, shards=n, dedupe_window=3600)
        stats = queue.stats()
        assert (stats.scheduled, stats.done, stats.dead) == (2, 60 + round_, 0), (n, stats)
        queue.schedule_many([{"kind": "k", "task_id": i} for i in finished])  # all remembered
        assert queue.stats().scheduled == 2
        assert all(queue.get(i).state == "done" for i in finished)  # type: ignore[union-attr]
        keys = queue.core.keys
        assert queue.client.hget(keys.cron, "hourly") is not None
        assert queue.client.hget(keys.xkeys, "sess:1") is not None
        if n > 1:  # the unsplit queue keeps the shard count and its counters, nothing else
            left = set(queue.client.scan_iter(match=home_keys.base + ":*"))
            # (and the dashboard's history its workers wrote, which expires on its own)
            history = home_keys.history(0).removesuffix("0").encode()
            assert {k for k in left if k.startswith(history)}, left  # (the worker acked)
            left = {k for k in left if not k.startswith(history)}
            assert left == {home_keys.shards.encode(), home_keys.stats.encode()}, left
        with run_worker(serve(queue)):
            queue.schedule("k", task_id=f"new{n}")
            wait_for(lambda n=n: f"new{n}" in ran)  # type: ignore[misc]
            if n == 1:  # the watched key, moved there and back, still fires
                assert queue.expiring.touch("sess:1", 0.3)
                wait_for(lambda: "expired:sess:1" in ran)
        queue.close()
    assert sorted(i for i in ran if i.startswith("f")) == sorted(finished)  # each ran once
    plain.close()


def test_resharding_is_refused_while_tasks_wait_run_or_are_dead(
    server: EmbeddedServer, qname: str
) -> None:
    from delayq.admin import operate
    from delayq.admin.inspect import Admin

    queue = Queue(qname, url=server.url, shards=2)
    queue.schedule("k", 1, delay=60, task_id="waiting")
    keys = queue.shards.of("gone").keys
    queue.client.hset(keys.tasks, "gone", b'{"k":"k"}\n1')
    queue.client.zadd(keys.dead, {"gone": 1})
    admin = Admin(server.url)
    result = operate.reshard(admin, qname, 4)
    assert not result.ok
    assert "1 waiting task(s)" in result.message and "1 dead task(s)" in result.message
    cli = _reshard(server.url, qname, 4)
    assert cli.exit_code == 1 and "1 dead task(s)" in cli.output
    assert admin.shard_count(qname) == 2  # unchanged, and not marked as moving
    queue.schedule("k", 2, delay=60)
    assert queue.get("waiting") is not None
    admin.close()
    queue.close()


def test_a_queue_being_resharded_is_refused_until_the_move_is_finished(
    server: EmbeddedServer, qname: str
) -> None:
    """A move cut short leaves its marker: every process that checks the count is refused,
    a move to another count too, and running the same move again finishes it."""
    from delayq.admin import operate
    from delayq.admin.inspect import Admin
    from delayq.admin.reshard import mark_op
    from delayq.runner import SyncRunner

    plain = Queue(qname, url=server.url, dedupe_window=3600)
    plain.schedule("k", 1, delay=60, task_id="w")
    plain.cancel("w")  # the count (1) is stored
    now = int(time.time() * 1000)
    for i in range(30):
        plain.client.hset(plain.core.keys.tasks, f"d{i}", b'{"k":"k"}\n1')
        plain.client.zadd(plain.core.keys.done, {f"d{i}": now})
    assert SyncRunner(plain.client).run(mark_op(plain.shards.root, "begin", "1>3", 1)) == 1
    for n in (1, 3):
        fresh = Queue(qname, url=server.url, shards=n)
        with pytest.raises(ConfigurationError, match="being resharded"):
            fresh.get("d1")
        with pytest.raises(ConfigurationError, match="being resharded"):
            fresh.schedule("k", 2)
        fresh.close()
    admin = Admin(server.url)
    other = operate.reshard(admin, qname, 2)
    assert not other.ok and "being moved from 1 to 3" in other.message
    assert admin.queue(qname).shards.n == 1  # cached by the inspector ...
    finished = operate.reshard(admin, qname, 3)
    assert finished.ok and finished.done == 30, finished
    assert admin.queue(qname).shards.n == 3  # ... and read again after the move
    split = Queue(qname, url=server.url, shards=3, dedupe_window=3600)
    split.schedule_many([{"kind": "k", "task_id": f"d{i}"} for i in range(30)])
    assert split.stats().scheduled == 0 and split.stats().done == 30
    admin.close()
    split.close()
    plain.close()


def test_delayq_dead_ls_walks_a_sharded_dead_set_by_cursor(
    server: EmbeddedServer, qname: str
) -> None:
    import json

    from click.testing import CliRunner

    from delayq.cli.main import main

    queue = Queue(qname, url=server.url, shards=3)
    queue.schedule("k", task_id="warm", delay=60)  # stores the count
    seeded = _seed_dead(queue, 45)
    walked: list[str] = []
    after: list[str] = []
    for _ in range(10):
        args = ["dead", "ls", "-q", qname, "--limit", "20", "--json", "--url", server.url]
        out = json.loads(CliRunner().invoke(main, [*args, *after]).output)
        walked += [t["id"] for t in out["tasks"]]
        if out["next"] is None:
            break
        after = ["--after", out["next"]]
    assert walked == [tid for _, tid in sorted(seeded, reverse=True)]
    text = CliRunner().invoke(main, ["dead", "ls", "-q", qname, "--url", server.url])
    assert "more with --after" in text.output
    bad = CliRunner().invoke(main, ["dead", "ls", "-q", qname, "--after", "x", "--url", server.url])
    assert bad.exit_code == 2 and "not a page cursor" in bad.output
    queue.close()


@pytest.mark.parametrize("shards", [1, 3])
def test_a_page_cursor_still_leads_on_when_its_task_is_gone(
    server: EmbeddedServer, qname: str, shards: int
) -> None:
    """The cursor is a place in the order, not a task: the task it was taken from may be
    replayed or purged meanwhile (here in the middle of a run of equal death times)."""
    queue = Queue(qname, url=server.url, shards=shards)
    seeded = [tid for _, tid in sorted(_seed_dead(queue, 40), reverse=True)]
    first = queue.page("dead", limit=10)
    assert [t.id for t in first.tasks] == seeded[:10] and first.next is not None
    assert first.next.endswith(":" + seeded[9])
    assert queue.purge_dead([seeded[9], seeded[10]]) == 2
    rest: list[str] = []
    page = queue.page("dead", limit=10, after=first.next)
    while True:
        rest += [t.id for t in page.tasks]
        if page.next is None:
            break
        page = queue.page("dead", limit=10, after=page.next)
    assert rest == seeded[11:]
    with pytest.raises(InvalidTaskError, match="not a page cursor"):
        queue.page("dead", after="garbage")
    with pytest.raises(InvalidTaskError, match="shows one of"):
        queue.page("waiting")
    queue.close()


@pytest.mark.parametrize("flavour", ["sync", "async"])
async def test_every_call_on_a_queue_opened_with_the_wrong_shard_count_is_refused(
    server: EmbeddedServer, qname: str, flavour: str
) -> None:
    """Not only get/cancel/reschedule: watched keys, the dead set, replay, purge, stats and
    workers read or write the home shard or a task's shard, which differ by the count."""
    split = Queue(qname, url=server.url, shards=4)
    split.schedule("k", None, task_id="w0", delay=60)
    if flavour == "sync":
        other: Any = Queue(qname, url=server.url)
    else:
        other = AsyncQueue(qname, url=server.url)

    async def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = fn(*args, **kwargs)
        return await result if flavour == "async" else result

    calls = [
        (other.expiring.set, ("up:1", "v", 60), {}),
        (other.expiring.touch, ("up:1", 60), {}),
        (other.expiring.delete, ("up:1",), {}),
        (other.dead, (), {}),
        (other.replay, (["w0"],), {}),
        (other.replay, (), {}),
        (other.purge_dead, (["w0"],), {}),
        (other.purge_dead, (), {}),
        (other.stats, (), {}),
        (other.workers, (), {}),
    ]
    for fn, args, kwargs in calls:
        with pytest.raises(ConfigurationError, match="split into 4 shard"):
            await call(fn, *args, **kwargs)
    assert split.client.exists("up:1") == 0  # nothing was written
    assert split.client.exists(Queue(qname, url=server.url).core.keys.xkeys) == 0
    await call(other.close)
    split.close()
