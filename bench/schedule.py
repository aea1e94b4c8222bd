"""Producing: ``schedule_many`` throughput, and the cost of one ``schedule`` call.

1. ``schedule_many`` of 100,000 tasks with a small payload (specs built beforehand), three
   times on fresh queues. The time is split into client-side encoding (the pure
   ``QueueCore.schedule`` builders alone, no I/O), redis-py packing the EVALSHA commands,
   the server's CPU (``INFO cpu`` user+sys delta) and the rest (socket, reply parsing,
   waiting), since the runner sends 8 script calls per round trip and waits for them.
2. 5,000 sequential ``Queue.schedule`` calls against 5,000 bare redis-py ``ZADD`` round
   trips on the same server, alternated three times; bar on the ratio of the means.
3. One ``schedule()`` per task, the way a web handler calls it, on Valkey 8 and Redis 7.0:
   sync ``Queue.schedule`` and ``await AsyncQueue.schedule`` (p50/p99 per call, calls/s),
   (the rows of each flavour measured call by call in turn), and where a call's
   Python-side microseconds go, each step timed alone: validation
   (``TaskSpec``), the id, encoding (``QueueCore.encode_tasks``), the plan (the script
   call, ``QueueCore.schedule_new`` less encoding), packing the EVALSHA (hiredis); against
   a bare redis-py ``PING``, ``ZADD`` and the same ``EVALSHA`` sent directly (its args
   built beforehand), through redis-py's ``execute_command`` and on a held connection
   (``send_packed_command`` and ``read_response``, as the queue sends it), so what is left
   is the runner's own overhead.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from common import (
    Report,
    client,
    fmt_int,
    fresh_server,
    median,
    percentile,
    server_cpu,
    short_version,
)

from delayq import AsyncQueue, Queue, TaskSpec
from delayq.base import SCHEDULE_BATCH
from delayq.connection import pack_command
from delayq.core import Op
from delayq.spec import ScheduleOptions, new_task_id

NAME = "schedule"
TITLE = "schedule_many throughput and schedule() vs a bare ZADD"

COUNT = 100_000
SEQUENTIAL = 5_000
REPEATS = 3
PAYLOAD = {"order": 123456, "user": 42}
KIND = "order.close"
MANY_BAR = 80_000.0
RATIO_BAR = 2.0


SERVERS = ("valkey", "redis")  # single(): one schedule() per task on each


def run(rep: Report) -> None:
    with fresh_server() as srv:
        rep.line(f"server {short_version(srv)} (AOF everysec, as EmbeddedServer runs it)")
        meter = client(srv.url)
        try:
            many(rep, srv.url, meter, rep.n(COUNT))
            sequential(rep, srv.url, meter, rep.n(SEQUENTIAL))
        finally:
            meter.close()
    for flavour in SERVERS:
        with fresh_server(flavour) as srv:
            single(rep, flavour, srv.url, short_version(srv), rep.n(SEQUENTIAL))


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
            q.core.schedule_new(spec, new_task_id())
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
        f"  inside schedule: client-side build {build_us:.1f} us (QueueCore.schedule_new alone), "
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


# -- one schedule() per task, and where its time goes ------------------------------------


def _per_call(fn: Callable[[int], Any], n: int) -> list[float]:
    """Microseconds of each of n calls."""
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(1e6 * (time.perf_counter() - t))
    return out


def _interleaved(fns: dict[str, Callable[[int], Any]], n: int) -> dict[str, list[float]]:
    """Microseconds of each of n calls of each function, one call of each in turn: on a
    machine whose round trips change speed from one second to the next (a 2-core VM puts
    the server on the client's core or the other one), every row sees the same mix."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(n):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn(i)
            out[name].append(1e6 * (time.perf_counter() - t))
    return out


async def _ainterleaved(
    fns: dict[str, Callable[[int], Awaitable[Any]]], n: int
) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {name: [] for name in fns}
    for i in range(n):
        for name, fn in fns.items():
            t = time.perf_counter()
            await fn(i)
            out[name].append(1e6 * (time.perf_counter() - t))
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def _dist(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    return {
        "mean_us": _mean(s),
        "p50_us": percentile(s, 50),
        "p99_us": percentile(s, 99),
        "calls_per_s": 1e6 * len(s) / sum(s),
    }


def single(rep: Report, flavour: str, url: str, version: str, n: int) -> None:
    """One schedule() per task on one server: latency, rate, and the Python-side steps."""
    rep.line("")
    rep.line(f"one schedule() per task on {version}: {n:,} calls each, after 200 warm-up calls")
    bare = client(url)
    zkey = f"bench:zadd:{secrets.token_hex(3)}"
    rows: dict[str, dict[str, float]] = {}
    with Queue(f"one-{secrets.token_hex(3)}", url=url) as q:
        for _ in range(200):
            q.schedule(KIND, PAYLOAD, delay=3600)
        # The same script call (schedule_new.lua: a task given no id) sent directly, its
        # keys and args built beforehand: through redis-py's execute_command, and as the
        # queue sends it, packed by hiredis on a connection kept out of the pool.
        spec = TaskSpec(KIND, PAYLOAD, delay=3600)
        ops = [q.core.schedule_new(spec, new_task_id()) for _ in range(2 * n)]
        sha = ops[0].script.sha
        conn = bare.connection_pool.get_connection()

        def held(i: int) -> None:
            conn.send_packed_command(pack_command(_evalsha(ops[n + i])))
            conn.read_response()

        try:
            calls = _interleaved(
                {
                    "Queue.schedule (sync)": lambda i: q.schedule(KIND, PAYLOAD, delay=3600),
                    "bare EVALSHA, same script and args": lambda i: bare.evalsha(
                        sha, len(ops[i].keys), *ops[i].keys, *ops[i].args
                    ),
                    "the same on a held connection": held,
                    "bare ZADD": lambda i: bare.zadd(zkey, {f"m{i}": i}),
                    "bare PING": lambda i: bare.ping(),
                },
                n,
            )
        finally:
            bare.connection_pool.release(conn)
        rows = {name: _dist(us) for name, us in calls.items()}
        steps = _steps(q, bare, n)
    rows.update(asyncio.run(_async_rows(url, n)))
    bare.close()
    rep.line(f"  {'':40s} {'mean':>7s} {'p50':>7s} {'p99':>7s} us  {'calls/s':>8s}")
    for name, d in rows.items():
        rep.line(
            f"  {name:40s} {d['mean_us']:7.1f} {d['p50_us']:7.1f} {d['p99_us']:7.1f}     "
            f"{d['calls_per_s']:8,.0f}"
        )
    # Medians: a mean of calls on this machine is moved by a few stalls of a millisecond.
    sync = rows["Queue.schedule (sync)"]["p50_us"]
    direct = rows["the same on a held connection"]["p50_us"]
    python_side = sum(steps[k] for k in ("validate_us", "id_us", "encode_us", "plan_us", "pack_us"))
    rep.line("  Python-side steps of one sync call, each timed alone (mean us):")
    for label, key in (
        ("validation: TaskSpec(kind, payload, delay=...) and the options", "validate_us"),
        ("id: new_task_id()", "id_us"),
        ("encoding: QueueCore.encode_tasks (checks, header, payload)", "encode_us"),
        ("plan: the script call (QueueCore.schedule_new less encoding)", "plan_us"),
        ("client packing: hiredis, the EVALSHA as the held connection sends it", "pack_us"),
    ):
        rep.line(f"    {label:76s} {steps[key]:6.2f}")
    label = "all of the above"
    rep.line(f"    {label:76s} {python_side:6.2f}")
    rest = sync - python_side - direct
    label = "rest: runner, reply parsing (sync p50 - steps - held connection's p50)"
    rep.line(f"    {label:76s} {rest:6.2f}")
    over = rows["bare EVALSHA, same script and args"]["p50_us"] - direct
    label = "redis-py's execute_command over a held connection (the two p50s)"
    rep.line(f"    {label:76s} {over:6.2f}")
    server = steps["server_us"]
    label = "server time per schedule_new.lua call (INFO commandstats; in bare EVALSHA)"
    rep.line(f"    {label:76s} {server:6.2f}  (ZADD: {steps['server_zadd_us']:.2f})")
    rep.figure(
        f"single_{flavour}",
        {"server": version, "n": n, "rows": rows, "steps": steps, "rest_us": rest},
    )


def _evalsha(op: Op[Any]) -> tuple[Any, ...]:
    return ("EVALSHA", op.script.sha, len(op.keys), *op.keys, *op.args)


def _steps(q: Queue, bare: redis.Redis, n: int) -> dict[str, float]:
    spec = TaskSpec(KIND, PAYLOAD, delay=3600)
    options: ScheduleOptions = {"delay": 3600}

    def validate(i: int) -> None:
        TaskSpec(KIND, PAYLOAD, options.get("delay"), options.get("at"), options.get("task_id"))

    validate_us = _mean(_per_call(validate, n))
    id_us = _mean(_per_call(lambda i: new_task_id(), n))
    tid = new_task_id()
    encode_us = _mean(_per_call(lambda i: q.core.encode_tasks((spec,), (tid,)), n))
    build_us = _mean(_per_call(lambda i: q.core.schedule_new(spec, tid), n))
    op = q.core.schedule_new(spec, tid)
    pack_us = _mean(_per_call(lambda i: pack_command(_evalsha(op)), n))
    c0, u0 = _cmdstat(bare, "evalsha")
    z0, zu0 = _cmdstat(bare, "zadd")
    for _ in range(n):
        q.schedule(KIND, PAYLOAD, delay=3600)
    for i in range(n):
        bare.zadd("bench:zadd:steps", {f"m{i}": i})
    c1, u1 = _cmdstat(bare, "evalsha")
    z1, zu1 = _cmdstat(bare, "zadd")
    return {
        "validate_us": validate_us,
        "id_us": id_us,
        "encode_us": encode_us,
        "plan_us": max(0.0, build_us - encode_us),
        "pack_us": pack_us,
        "server_us": (u1 - u0) / max(c1 - c0, 1),
        "server_zadd_us": (zu1 - zu0) / max(z1 - z0, 1),
    }


async def _async_rows(url: str, n: int) -> dict[str, dict[str, float]]:
    import redis.asyncio as aredis

    rows: dict[str, dict[str, float]] = {}
    bare = aredis.Redis.from_url(url)
    q = AsyncQueue(f"aone-{secrets.token_hex(3)}", url=url)
    try:
        for _ in range(200):
            await q.schedule(KIND, PAYLOAD, delay=3600)
        calls = await _ainterleaved(
            {
                "await AsyncQueue.schedule": lambda i: q.schedule(KIND, PAYLOAD, delay=3600),
                "await bare ZADD (redis.asyncio)": lambda i: bare.zadd("bench:azadd", {f"m{i}": i}),
                "await bare PING (redis.asyncio)": lambda i: bare.ping(),
            },
            n,
        )
        rows = {name: _dist(us) for name, us in calls.items()}
    finally:
        await q.close()
        await bare.aclose()
    return rows
