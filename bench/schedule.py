"""Producing: ``schedule_many`` throughput, and the cost of one ``schedule`` call.

1. ``schedule_many`` of 100,000 tasks with a small payload (specs built beforehand), three
   times on fresh queues. The time is split into client-side encoding (the pure
   ``QueueCore.schedule`` builders alone, no I/O), redis-py packing the EVALSHA commands,
   the server's CPU (``INFO cpu`` user+sys delta) and the rest (socket, reply parsing,
   waiting), since the runner sends 8 script calls per round trip and waits for them.
2. 5,000 sequential ``Queue.schedule`` calls against 5,000 bare redis-py ``ZADD`` round
   trips on the same server, alternated three times; bar on the ratio of the means.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any

import redis
from common import Report, client, fmt_int, fresh_server, median, server_cpu, short_version

from delayq import Queue, TaskSpec
from delayq.queue import SCHEDULE_BATCH

NAME = "schedule"
TITLE = "schedule_many throughput and schedule() vs a bare ZADD"

COUNT = 100_000
SEQUENTIAL = 5_000
REPEATS = 3
PAYLOAD = {"order": 123456, "user": 42}
KIND = "order.close"
MANY_BAR = 80_000.0
RATIO_BAR = 2.0


def run(rep: Report) -> None:
    with fresh_server() as srv:
        rep.line(f"server {short_version(srv)} (AOF everysec, as EmbeddedServer runs it)")
        meter = client(srv.url)
        try:
            many(rep, srv.url, meter, rep.n(COUNT))
            sequential(rep, srv.url, meter, rep.n(SEQUENTIAL))
        finally:
            meter.close()


def _chunks(items: list[Any], size: int) -> list[list[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def many(rep: Report, url: str, meter: redis.Redis, n: int) -> None:
    rep.line(f"schedule_many: {n:,} tasks, payload {PAYLOAD} ({REPEATS} runs, fresh queue each)")
    rows = []
    for _ in range(REPEATS):
        with Queue(f"sm-{secrets.token_hex(3)}", url=url) as q:
            q.schedule(KIND, PAYLOAD, delay=3600)  # connect and load the script first
            specs = [TaskSpec(KIND, PAYLOAD, delay=3600) for _ in range(n)]

            t = time.perf_counter()
            ops = [q.core.schedule(c) for c in _chunks(specs, SCHEDULE_BATCH)]
            encode = time.perf_counter() - t

            conn = q.client.connection_pool.get_connection()
            try:
                t = time.perf_counter()
                for op in ops:
                    conn.pack_commands(
                        [("EVALSHA", op.script.sha, len(op.keys), *op.keys, *op.args)]
                    )
                pack = time.perf_counter() - t
            finally:
                q.client.connection_pool.release(conn)

            cpu0 = server_cpu(meter)
            t = time.perf_counter()
            ids = q.schedule_many(specs)
            total = time.perf_counter() - t
            scpu = server_cpu(meter) - cpu0
            assert len(ids) == n
        rows.append((n / total, total, encode, pack, scpu))
        rep.line(
            f"  run: {n / total:,.0f} tasks/s ({total:.3f} s): encode {encode:.3f} s, "
            f"pack {pack:.3f} s, server CPU {scpu:.3f} s, rest {total - encode - pack - scpu:.3f} s"
        )
    rate, total, encode, pack, scpu = sorted(rows)[len(rows) // 2]  # the median run
    rest = total - encode - pack - scpu
    rep.line(f"median run: {rate:,.0f} tasks/s; where its {total:.3f} s went:")
    for label, v in (
        ("client encoding (QueueCore.schedule builders, no I/O)", encode),
        ("redis-py packing the EVALSHA commands", pack),
        ("server CPU (INFO cpu used_cpu_user+sys delta)", scpu),
        ("rest: socket I/O, reply parsing, ids, waiting", rest),
    ):
        rep.line(f"  {label:56s} {v:7.3f} s {100 * v / total:5.1f}%  ({1e6 * v / n:.2f} us/task)")
    rep.figure(
        "schedule_many",
        {
            "n": n,
            "tasks_per_s": rate,
            "total_s": total,
            "encode_s": encode,
            "pack_s": pack,
            "server_cpu_s": scpu,
            "rest_s": rest,
            "runs_tasks_per_s": [r[0] for r in rows],
        },
    )
    rep.bar("schedule_many throughput (median of 3)", rate, ">=", MANY_BAR, "tasks/s")


def _timed(fn: Callable[[int], Any], n: int) -> float:
    t = time.perf_counter()
    for i in range(n):
        fn(i)
    return (time.perf_counter() - t) / n


def _cmdstat(meter: redis.Redis, name: str) -> tuple[int, int]:
    s = meter.info("commandstats").get(f"cmdstat_{name}", {})
    return int(s.get("calls", 0)), int(s.get("usec", 0))


def sequential(rep: Report, url: str, meter: redis.Redis, n: int) -> None:
    rep.line("")
    rep.line(
        f"sequential: {n:,} Queue.schedule calls vs {n:,} bare ZADD round trips "
        f"({REPEATS} alternating rounds)"
    )
    bare = client(url)
    zkey = f"bench:zadd:{secrets.token_hex(3)}"
    sched_us: list[float] = []
    zadd_us: list[float] = []
    srv_sched: list[float] = []
    srv_zadd: list[float] = []
    with Queue(f"seq-{secrets.token_hex(3)}", url=url) as q:

        def one_schedule(i: int) -> None:
            q.schedule(KIND, PAYLOAD, delay=3600)

        def one_zadd(i: int) -> None:
            bare.zadd(zkey, {f"m{i}:{secrets.token_hex(4)}": i})

        _timed(one_schedule, 200)  # warm up: connections, script cache
        _timed(one_zadd, 200)
        for _ in range(REPEATS):
            c0, u0 = _cmdstat(meter, "zadd")
            zadd_us.append(1e6 * _timed(one_zadd, n))
            c1, u1 = _cmdstat(meter, "zadd")
            srv_zadd.append((u1 - u0) / max(c1 - c0, 1))
            c0, u0 = _cmdstat(meter, "evalsha")
            sched_us.append(1e6 * _timed(one_schedule, n))
            c1, u1 = _cmdstat(meter, "evalsha")
            srv_sched.append((u1 - u0) / max(c1 - c0, 1))
        spec = TaskSpec(KIND, PAYLOAD, delay=3600)
        t = time.perf_counter()
        for _ in range(n):
            q.core.schedule([spec])
        build_us = 1e6 * (time.perf_counter() - t) / n
    bare.close()
    s, z = median(sched_us), median(zadd_us)
    ratio = s / z
    rep.line(
        f"  Queue.schedule: {s:6.1f} us/call (rounds: {', '.join(f'{x:.1f}' for x in sched_us)})"
    )
    rep.line(
        f"  bare ZADD:      {z:6.1f} us/call (rounds: {', '.join(f'{x:.1f}' for x in zadd_us)})"
    )
    rep.line(
        f"  inside schedule: client-side build {build_us:.1f} us (QueueCore.schedule alone), "
        f"server {median(srv_sched):.1f} us (EVALSHA usec_per_call) vs ZADD server "
        f"{median(srv_zadd):.1f} us"
    )
    rep.figure(
        "sequential",
        {
            "n": n,
            "schedule_us": s,
            "zadd_us": z,
            "ratio": ratio,
            "build_us": build_us,
            "server_schedule_us": median(srv_sched),
            "server_zadd_us": median(srv_zadd),
        },
    )
    rep.bar("schedule() / bare ZADD mean time per call", ratio, "<=", RATIO_BAR, "x")
    rep.line(f"  ({fmt_int(1e6 / s)} schedule calls/s sequentially)")
