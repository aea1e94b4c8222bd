"""What durable=True costs: schedule and schedule_many with and without waiting for the
server's AOF fsync (WAITAOF on the same connection), under appendfsync everysec and always,
and with ``durable_replicas=1`` on a primary with one replica (both everysec).

No bar: issue figures are reported. With everysec the server fsyncs about once a second, so
a durable call waits for that fsync; with always every write is fsynced before the reply.
"""

from __future__ import annotations

import secrets
import time

import redis
from common import Report, fresh_server, short_version

from delayq import Queue, TaskSpec
from delayq.embedded import EmbeddedServer

NAME = "durable"
TITLE = "durable=True: the cost of waiting for the AOF fsync"

CALLS = 300  # sequential schedule() calls per case (30 with --quick)
REPLICA_CALLS = 20  # with a replica each durable call waits ~1 s: fewer (2 with --quick)
BATCH = 20_000  # tasks per schedule_many call (2,000 with --quick)


def wait_in_sync(replica: EmbeddedServer, timeout: float = 30.0) -> None:
    """Until the replica's link is up and the AOF it starts after the first sync is written
    (until then it confirms no fsync)."""
    side = redis.Redis.from_url(replica.url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            repl, persistence = side.info("replication"), side.info("persistence")
            if (
                repl.get("master_link_status") == "up"
                and not int(persistence.get("aof_rewrite_in_progress", 0))
                and not int(persistence.get("aof_rewrite_scheduled", 0))
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("the replica did not sync within 30 s")
    finally:
        side.close()


def measure(q: Queue, calls: int, batch: int) -> dict[bool, tuple[float, float]]:
    """(microseconds per schedule call, schedule_many tasks/s), plain and durable."""
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
    return figures


def report(rep: Report, case: str, label: str, figures: dict[bool, tuple[float, float]]) -> None:
    (plain_us, plain_rate), (dur_us, dur_rate) = figures[False], figures[True]
    rep.line(
        f"{label}: schedule {plain_us:,.0f} us -> durable {dur_us:,.0f} us per call; "
        f"schedule_many {plain_rate:,.0f} -> durable {dur_rate:,.0f} tasks/s"
    )
    rep.figure(
        case,
        {
            "schedule_us": plain_us,
            "durable_schedule_us": dur_us,
            "schedule_many_per_s": plain_rate,
            "durable_schedule_many_per_s": dur_rate,
        },
    )


def run(rep: Report) -> None:
    calls, batch = rep.n(CALLS), rep.n(BATCH)
    rep.line(f"{calls} sequential schedule() calls and one schedule_many of {batch:,}, each case")
    for fsync in ("everysec", "always"):
        with fresh_server() as srv:
            q = Queue(f"dur-{secrets.token_hex(3)}", url=srv.url)
            q.client.config_set("appendfsync", fsync)  # the server runs with AOF on
            figures = measure(q, calls, batch)
            q.close()
            report(rep, fsync, f"appendfsync {fsync:8s} ({short_version(srv)})", figures)
    with fresh_server() as primary:
        replica = EmbeddedServer(
            primary.binary,
            appendonly=True,
            extra=["--replicaof", "127.0.0.1", str(primary.port)],
        ).start()
        try:
            q = Queue(f"dur-{secrets.token_hex(3)}", url=primary.url, durable_replicas=1)
            wait_in_sync(replica)
            n = rep.n(REPLICA_CALLS)
            figures = measure(q, n, batch)
            q.close()
        finally:
            replica.stop()
        rep.line(f"({n} calls in the replica case: each durable one waits for the replica)")
        report(rep, "replica", f"1 replica, everysec ({short_version(primary)})", figures)
