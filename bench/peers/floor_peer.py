"""The floor: a bare redis-py loop claiming due members of one sorted set with one script.

No payload record, lease, retry or ack: ZADD to schedule, and one Lua call that pops up to
100 due members (or returns the next due time, so the loop sleeps until then, at most
100 ms). The fastest any Python client can drain a sorted set; it loses a claimed task
if the process dies, which is what everything above it pays to avoid.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable

from harness import Item, record

NAME = "floor"
DISTS = ("redis",)
MODULES = ("redis",)
PRODUCE = "ZADD of 1,000 members per call (member = id|due)"
SETTINGS = "one script call pops up to 100 due members; sleeps until the next due time, <= 100 ms"
POLL = "sleeps until the head of the set is due (read from the last claim reply), at most 100 ms"
KEY = "floor:due"
BATCH = 100
MAX_SLEEP = 0.1
CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then
  redis.call('ZREM', KEYS[1], unpack(due))
  return due
end
local head = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {'', head[2] or ''}
"""


class Producer:
    def __init__(self, url: str) -> None:
        import redis

        self.r = redis.Redis.from_url(url)

    def send(self, items: list[Item]) -> None:
        members = {}
        for it in items:
            due, _ = it.timing()
            members[f"{it.id}|{due!r}"] = due
        self.r.zadd(KEY, members)

    def close(self) -> None:
        self.r.close()


def serve(url: str, ready: Callable[[], None]) -> None:
    import redis

    r = redis.Redis.from_url(url)
    claim = r.register_script(CLAIM)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda s, f: stop.set())
    ready()
    while not stop.is_set():
        got = claim(keys=[KEY], args=[repr(time.time()), BATCH])
        if got[0]:
            for m in got:
                task_id, due = m.split(b"|")
                record(task_id.decode(), float(due))
            continue
        wait = MAX_SLEEP
        if got[1]:
            wait = min(MAX_SLEEP, max(0.0, float(got[1]) - time.time()))
        stop.wait(wait)
    r.close()
