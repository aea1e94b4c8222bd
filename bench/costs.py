"""Where a drained task's time goes: server time of claim and ack, worker time of its parts.

The drain's ceiling is whichever side runs out first, the server (one core) or the worker
(one event loop): so this splits both. Server: ``INFO commandstats`` time of the claim and
ack scripts per task, in batches of 16 (a worker's slots) and 500 (claimed ahead), on a
fresh server holding 20,000 due tasks, next to the floor's claim script (bench/peers) on
the same server. Worker: CPU per task of the per-task path without Redis (``Runs`` and
``Executor`` running an async no-op handler, also with one no-op middleware around it), of
parsing a claim reply and of packing an ack call; the floor's own per-task Python is a split
and a line written. No bar: the figures explain the drain bar (docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from common import Report, client, fresh_server

from delayq import Queue, TaskSpec, Worker, leasing
from delayq.codec import Header, tombstone_prefix
from delayq.connection import async_client
from delayq.leasing import Claimed
from delayq.runner import AsyncRunner, SyncRunner
from delayq.worker.execute import Executor
from delayq.worker.outcome import Outcome, outcome_op
from delayq.worker.runs import Runs
from delayq.worker.threads import HandlerThreads

NAME = "costs"
TITLE = "Per-task costs of a drain: server scripts and worker Python, each alone"
N = 20_000
FLOOR_CLAIM = """
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
if #due > 0 then redis.call('ZREM', KEYS[1], unpack(due)) end
return due
"""


def command_stats(r: Any) -> dict[str, dict[str, int]]:
    """``INFO commandstats`` as {command: {"calls", "usec"}}; commands run inside scripts
    are counted under their own names too (and within ``evalsha``'s time)."""
    return {
        k.removeprefix("cmdstat_"): {"calls": int(v["calls"]), "usec": int(v["usec"])}
        for k, v in r.info("commandstats").items()
    }


def _script_us(r: Any) -> float:
    return float(command_stats(r).get("evalsha", {}).get("usec", 0))


def server_side(rep: Report, n: int) -> None:
    for batch in (16, 500):
        with fresh_server(appendonly=False) as srv, Queue("costs", url=srv.url) as q:
            q.schedule_many(TaskSpec("noop", {"i": i}, delay=0) for i in range(n))
            r, run = client(srv.url), SyncRunner(q.client)
            r.config_resetstat()
            held: list[tuple[str, int]] = []
            kinds: list[tuple[str, str, str]] = []  # per task, as a worker acks
            while got := run.run(leasing.claim(q.core, limit=batch, lease_ms=60_000)).tasks:
                held += [(c.id, c.token) for c in got]
                now = time.time() * 1000
                kinds += [
                    (tombstone_prefix(c.header.attempts, c.header.due_ms, now), c.header.kind, "")
                    for c in got
                ]
            claim_us = _script_us(r) / len(held)
            r.config_resetstat()
            for i in range(0, len(held), batch):
                # With lateness as a worker sends it, over a few of the history's buckets.
                part = held[i : i + batch]
                late = [0.0002 + (j % 7) * 0.0001 for j in range(len(part))]
                fin = kinds[i : i + batch]
                run.run(leasing.ack(q.core, part, lateness=late, finished=fin))
            ack_us = _script_us(r) / len(held)
            r.zadd("floor:due", {f"t{i}": 0 for i in range(n)})
            sha = r.script_load(FLOOR_CLAIM)
            r.config_resetstat()
            while r.evalsha(sha, 1, "floor:due", 1, 100):
                pass
            floor_us = _script_us(r) / n
            r.close()
        rep.line(
            f"server, batches of {batch:3d}: claim {claim_us:.2f} + ack {ack_us:.2f} = "
            f"{claim_us + ack_us:.2f} us/task in scripts (floor's pop of 100: {floor_us:.2f})"
        )
        rep.figure(
            f"server-{batch}", {"claim_us": claim_us, "ack_us": ack_us, "floor_us": floor_us}
        )


async def _runs_path(n: int, middleware: bool = False, sync: bool = False) -> float:
    async def noop(task: Any) -> None:
        return None

    def sync_noop(task: Any) -> None:
        return None

    async def passthrough(task: Any, call_next: Any) -> Any:
        return await call_next(task)

    worker = Worker(Queue("q", url="redis://127.0.0.1:1/0"))  # builders only: never connects
    worker.handler("noop")(sync_noop if sync else noop)
    if middleware:
        worker.middleware(passthrough)
    loop = asyncio.get_running_loop()
    runner = AsyncRunner(async_client(worker.queue.url))
    threads = HandlerThreads(16 if sync else 0, loop, "bench")
    ctx = worker.context(runner, threads, asyncio.Event())
    executor = Executor(ctx)
    written: list[Outcome] = []

    class Sink:  # the Finisher's place: outcomes are only collected
        def add(self, o: Outcome) -> None:
            written.append(o)

    runs = Runs(lambda ms: 0.0, lambda: None, concurrency=16, lookahead=0.02)
    lane = worker.lanes[0]
    lane.executor, lane.finisher = executor, Sink()  # type: ignore[assignment]
    runs.add_lane(lane)
    batch = [
        Claimed(f"t{i}", Header("noop", 1, 0, i, 0, 1000, "json"), b'{"i":%d}' % i)
        for i in range(n)
    ]
    t0 = time.process_time()
    for i in range(0, n, 1000):
        runs.start_many(lane, batch[i : i + 1000], 2000)
        while runs.held:
            await asyncio.sleep(0)
        runs.written(lane, written, set())
        written.clear()
    took = (time.process_time() - t0) / n * 1e6
    threads.shutdown()
    return took


def worker_side(rep: Report, n: int) -> None:
    runs_us = asyncio.run(_runs_path(n))
    mw_us = asyncio.run(_runs_path(n, middleware=True))
    sync_us = asyncio.run(_runs_path(n, sync=True))
    core = Queue("costs", url="redis://127.0.0.1:1/0").core  # builders only: never connects
    op = leasing.claim(core, limit=1000, lease_ms=30_000)
    reply: list[object] = [1] + [-1] * (leasing.SCRIPTS["claim"].reply.head - 1)  # the head
    for i in range(1000):
        reply += [b"t%d" % i, b"noop", 1, 0, i, 1000, 0, b"", b"", b'{"i":1}']
    # From a collected heap: otherwise whether a full collection falls within these 20
    # parses depends on what was allocated before (a change elsewhere moved it from 0.4 to
    # 1.7 us/task with the parse unchanged; 300 parses gave the same 0.75 either way).
    gc.collect()
    t0 = time.process_time()
    for _ in range(20):
        op.parse(reply)
    parse_us = (time.process_time() - t0) / 20_000 * 1e6
    from redis.asyncio.connection import Connection

    from delayq.connection import hiredis_packing

    acks = [
        Outcome("ack", f"t{i}", i, late=0.0002 + (i % 7) * 0.0001, kind="noop", tomb="1 3 ")
        for i in range(1000)
    ]
    ack = outcome_op(core, "ack", acks)
    conn = hiredis_packing(Connection)()  # as the worker's clients pack (connection.py)
    gc.collect()
    t0 = time.process_time()
    for _ in range(20):
        conn.pack_command("EVALSHA", ack.script.sha, len(ack.keys), *ack.keys, *ack.args)
    pack_us = (time.process_time() - t0) / 20_000 * 1e6
    rep.line(
        f"worker: runs + executor + no-op handler {runs_us:.2f}, claim reply parse "
        f"{parse_us:.2f}, ack packing {pack_us:.2f} us/task (CPU, no Redis)"
    )
    rep.line(f"worker: the same with one no-op middleware {mw_us:.2f} us/task (CPU, no Redis)")
    rep.line(f"worker: the same with a sync no-op handler (16 threads) {sync_us:.2f} us/task")
    rep.figure(
        "worker",
        {
            "runs_us": runs_us,
            "middleware_us": mw_us,
            "sync_us": sync_us,
            "parse_us": parse_us,
            "pack_us": pack_us,
        },
    )


def run(rep: Report) -> None:
    n = rep.n(N)
    rep.line(f"{n:,} tasks due now; per-task costs of a drain, each side alone")
    server_side(rep, n)
    worker_side(rep, n * 5)
