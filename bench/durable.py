"""What durable=True costs: schedule and schedule_many with and without waiting for the
server's AOF fsync (WAITAOF on the same connection), under appendfsync everysec and always.

No bar: issue figures are reported. With everysec the server fsyncs about once a second, so
a durable call waits for that fsync; with always every write is fsynced before the reply.
"""

from __future__ import annotations

import secrets
import time

from common import Report, fresh_server, short_version

from delayq import Queue, TaskSpec

NAME = "durable"
TITLE = "durable=True: the cost of waiting for the AOF fsync"

CALLS = 300  # sequential schedule() calls per case (30 with --quick)
BATCH = 20_000  # tasks per schedule_many call (2,000 with --quick)


def run(rep: Report) -> None:
    calls, batch = rep.n(CALLS), rep.n(BATCH)
    rep.line(f"{calls} sequential schedule() calls and one schedule_many of {batch:,}, each case")
    for fsync in ("everysec", "always"):
        with fresh_server() as srv:
            q = Queue(f"dur-{secrets.token_hex(3)}", url=srv.url)
            q.client.config_set("appendfsync", fsync)  # the server runs with AOF on
            for _ in range(50):  # warm up: scripts loaded, connections open
                q.schedule("k", 1, delay=600)
            figures = {}
            for durable in (False, True):
                t0 = time.perf_counter()
                for i in range(calls):
                    q.schedule("k", i, delay=600, durable=durable)
                per_call = (time.perf_counter() - t0) / calls * 1e6
                specs = [TaskSpec("k", i, delay=600) for i in range(batch)]
                t0 = time.perf_counter()
                q.schedule_many(specs, durable=durable)
                rate = batch / (time.perf_counter() - t0)
                figures[durable] = (per_call, rate)
            q.close()
            (plain_us, plain_rate), (dur_us, dur_rate) = figures[False], figures[True]
            rep.line(
                f"appendfsync {fsync:8s} ({short_version(srv)}): schedule {plain_us:,.0f} us "
                f"-> durable {dur_us:,.0f} us per call; schedule_many {plain_rate:,.0f} -> "
                f"durable {dur_rate:,.0f} tasks/s"
            )
            rep.figure(
                fsync,
                {
                    "schedule_us": plain_us,
                    "durable_schedule_us": dur_us,
                    "schedule_many_per_s": plain_rate,
                    "durable_schedule_many_per_s": dur_rate,
                },
            )
