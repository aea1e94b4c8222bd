"""Cluster: a sharded queue on a local Redis Cluster of 1 and of 3 primaries.

Each case starts a fresh cluster (``delayq.embedded.cluster``'s ``Cluster``: Valkey 8.1 nodes on
loopback, AOF everysec, stopped by PID): 1 primary, 3 primaries, 3 primaries again with
``shards=1`` (one hash tag does not spread), and 3 primaries + 3 replicas. The queue has
``shards=16`` unless said otherwise. In each case:

1. schedule: ``schedule_many`` of 100,000 tasks (payload ``{"order_id": 123456}``, due in
   an hour, specs built beforehand, 10,000 per call) from one producer process, then
   100,000 more from each of 2 producer processes started together. Tasks/s from the first
   producer's start to the last one's end.
2. memory: the ``used_memory`` delta summed over the primaries (and over the replicas,
   where there are some) across the one-producer run, per waiting task, less the change in
   buffers (replication backlog and replica output, client buffers, AOF buffer). Every
   script is loaded on every primary before the baseline; readings wait for any AOF
   rewrite to end and then 1.1 s (the AOF buffer flushed, the producer's connection gone).
3. drain: 2 worker processes (async no-op handler, concurrency 128 each) start idle; then
   100,000 tasks all due at one instant ~2 s later are scheduled on a second queue of the
   same shard count. Tasks/s from the first handler start to the ``succeeded`` counters of
   every shard adding up to 100,000 (HGETs every 20 ms). Every task must run exactly once
   (the bar). Then ``used_memory`` per finished task (its record stays for the dedupe
   window).

Over each run: CPU seconds of every node (``INFO cpu``, user+sys of the main process; AOF
rewrite children apart), of every process this benchmark started (``/proc``) and of the
whole machine (``/proc/stat``), hence of the processes it did not start; script calls
(``INFO commandstats``), client traffic (``total_net_input/output_bytes``) and AOF growth
at the primaries. The figures that project to other machines are per task: the primaries'
CPU seconds per 1,000 tasks scheduled and per 1,000 drained (claim + ack), the workers'
and producers' own CPU per 1,000 tasks, bytes of memory, traffic and AOF. On a 2-core
machine the throughput of 3 primaries is bound by the cores (3 servers, 2 producers or 2
workers and this runner share them), not by the servers: the drain prints the machine's
ceiling, cores / CPU per task of everything this run started.

Last, a fresh 3-primary cluster is filled with 1,000,000 waiting tasks by one producer
(memory per waiting task at a larger size).

Not run by a plain ``bench/run`` (about 2 minutes): ``bench/run cluster`` runs it,
``bench/run cluster --quick`` (10,000 tasks a run, 100,000 at the end) is a smoke check.
Also run by itself as a child process: ``cluster.py producer ...``, ``cluster.py worker``.

The clusters are :mod:`delayq.embedded.cluster`'s ``Cluster``, as in the test suite.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import select
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import redis
from common import (
    BENCH_DIR,
    Report,
    WorkerProcess,
    _live_servers,
    fmt_int,
    proc_cpu,
    server_binary,
)
from redis.crc import key_slot

from delayq import Queue, Task, TaskSpec, Worker
from delayq.core import QueueCore
from delayq.embedded import server_version
from delayq.embedded.cluster import Cluster, Node, cluster_nodes
from delayq.keys import QueueKeys, shard_name
from delayq.scripts import SCRIPTS

NAME = "cluster"
TITLE = "Cluster: a sharded queue on 1 and 3 primaries (schedule, drain, CPU and memory per task)"

COUNT = 100_000  # tasks per producer per schedule run, and tasks drained
BIG = 1_000_000  # waiting tasks for the memory figure at scale (3 primaries)
PAYLOAD = {"order_id": 123456}
KIND = "bench.noop"
PRODUCERS = (1, 2)
WORKERS = 2
CONCURRENCY = 128
CHUNK = 10_000  # tasks per schedule_many call in a producer
SHARDS = 16
DRAIN_LEAD = 2.0  # the drained tasks fall due this long after the last is scheduled
POLL = 0.02
BUFFER_FIELDS = (
    "mem_replication_backlog",
    "mem_clients_slaves",
    "mem_clients_normal",
    "mem_aof_buffer",
)
PROC_TIMEOUT = 120.0  # a producer or a drain slower than this has failed anyway


@dataclass(frozen=True)
class Case:
    label: str
    primaries: int
    replicas: int
    shards: int


CASES = (
    Case("1 primary", 1, 0, SHARDS),
    Case("3 primaries", 3, 0, SHARDS),
    Case("3 primaries, shards=1", 3, 0, 1),
    Case("3 primaries + 3 replicas", 3, 3, SHARDS),
)


# -- the child processes ----------------------------------------------------------------------


class Child(WorkerProcess):
    """``cluster.py <role> ...`` in its own interpreter, started and stopped by PID like a
    benchmark worker (prints ``ready``, stops on SIGTERM or stdin EOF, writes JSON)."""

    def __init__(self, role: str, url: str, queue: str, shards: int, *args: str) -> None:
        super().__init__(url, queue)
        self.argv = [
            self.argv[0],
            str(BENCH_DIR / "cluster.py"),
            role,
            *("--url", url, "--queue", queue, "--shards", str(shards)),
            *("--out", self.out_path, "--max-seconds", "600"),
            *args,
        ]

    def go(self) -> None:
        """Tell a ready producer to start (one line on its stdin)."""
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def wait_done(self, timeout: float) -> bool:
        """Until the producer says ``done`` (False: it did not within ``timeout``)."""
        assert self.proc is not None and self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.proc.poll() is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.05)
            if ready:
                line = self.proc.stdout.readline()
                if line.strip() == b"done":
                    return True
                if not line:
                    return False
        return False


def child_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="cluster.py")
    p.add_argument("role", choices=("producer", "worker"))
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--shards", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-seconds", type=float, required=True)
    p.add_argument("--n", type=int, default=COUNT)
    p.add_argument("--concurrency", type=int, default=CONCURRENCY)
    args = p.parse_args(argv)
    if args.role == "producer":
        producer_main(args)
    else:
        worker_main(args)


def producer_main(args: argparse.Namespace) -> None:
    """Build the specs, say ``ready``, wait for ``go`` on stdin, schedule them, write the
    report and say ``done``; then stay (so the runner can read this process's CPU) until
    stdin closes or SIGTERM."""
    with Queue(args.queue, url=args.url, shards=args.shards) as queue:
        queue.stats()  # connected, the shard count checked
        specs = [TaskSpec(KIND, PAYLOAD, delay=3600) for _ in range(args.n)]
        print("ready", flush=True)
        line = b""
        while not line.endswith(b"\n"):
            got = os.read(0, 16)  # the runner's "go"; EOF: the runner went away
            if not got:
                return
            line += got
        cpu0, t0 = time.process_time(), time.time()
        for i in range(0, len(specs), CHUNK):
            queue.schedule_many(specs[i : i + CHUNK])
        t1, cpu1 = time.time(), time.process_time()
    with open(args.out, "w") as f:
        json.dump({"n": args.n, "start": t0, "end": t1, "cpu": cpu1 - cpu0}, f)
    print("done", flush=True)
    deadline = time.monotonic() + args.max_seconds
    while time.monotonic() < deadline and os.read(0, 16):
        pass


def worker_main(args: argparse.Namespace) -> None:
    import asyncio

    from lifeline import stop_worker_when_orphaned
    from worker_proc import serve

    queue = Queue(args.queue, url=args.url, shards=args.shards)
    worker = Worker(queue, concurrency=args.concurrency, lease=30)
    runs: Counter[str] = Counter()
    first: list[float] = []
    now = time.time

    @worker.handler(KIND)
    async def noop(task: Task) -> None:
        if not first:
            first.append(now())
        runs[task.id] += 1

    stop_worker_when_orphaned(worker, args.max_seconds)
    asyncio.run(serve(worker))
    queue.close()
    with open(args.out, "w") as f:
        json.dump(
            {
                "started": sum(runs.values()),
                "distinct": len(runs),
                "duplicates": sum(1 for n in runs.values() if n > 1),
                "first_start": first[0] if first else None,
            },
            f,
        )


# -- measuring ----------------------------------------------------------------------------------


def machine_cpu() -> tuple[float, float]:
    """(busy, total) seconds of all cores together since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    hz = os.sysconf("SC_CLK_TCK")
    return (sum(vals[:8]) - idle) / hz, sum(vals[:8]) / hz


@dataclass
class Snap:
    """CPU of every node, process and the machine at one moment."""

    wall: float
    nodes: list[float]  # CPU s per node (primaries first), main process
    children: list[float]  # CPU s of each node's AOF rewrite children
    procs: list[float]  # CPU s of each child process being watched
    runner: float
    machine: tuple[float, float]
    calls: list[int]  # EVALSHA + EVAL calls per node
    net: list[tuple[int, int]]  # (bytes in, bytes out) per node, replication not counted
    aof: list[tuple[int, int]]  # (aof_current_size, aof_rewrites) per node


@dataclass
class Usage:
    """What happened between two snapshots."""

    seconds: float
    nodes: list[float]
    children: list[float]
    procs: list[float]
    runner: float
    machine_busy: float  # CPU s of all cores
    prim: int  # nodes[:prim] are the primaries
    calls: int  # script calls on the primaries
    net_in: int  # bytes the primaries received from clients
    net_out: int  # bytes the primaries sent to clients
    aof_bytes: int  # growth of the primaries' AOFs
    aof_rewrites: int  # AOF rewrites finished meanwhile (then aof_bytes means little)

    @property
    def primaries_total(self) -> float:
        return sum(self.nodes[: self.prim])

    @property
    def others(self) -> float:
        """CPU s of processes this run did not start (the machine less all of ours)."""
        ours = sum(self.nodes) + sum(self.children) + sum(self.procs) + self.runner
        return max(0.0, self.machine_busy - ours)


@dataclass
class Bench:
    rep: Report
    case: Case
    cluster: Cluster
    primaries: list[Node]
    replicas: list[Node]
    clients: list[redis.Redis] = field(default_factory=list)  # one per node, same order

    @property
    def nodes(self) -> list[Node]:
        return [*self.primaries, *self.replicas]

    def info(self, section: str) -> list[dict[str, Any]]:
        return [c.info(section) for c in self.clients]

    def snap(self, procs: list[Child]) -> Snap:
        cpu = self.info("cpu")
        cmds = self.info("commandstats")
        stats = self.info("stats")
        pers = self.info("persistence")
        return Snap(
            aof=[(int(x.get("aof_current_size", 0)), int(x.get("aof_rewrites", 0))) for x in pers],
            calls=[
                sum(int(c.get(k, {}).get("calls", 0)) for k in ("cmdstat_evalsha", "cmdstat_eval"))
                for c in cmds
            ],
            net=[
                (int(x["total_net_input_bytes"]), int(x["total_net_output_bytes"])) for x in stats
            ],
            wall=time.time(),
            nodes=[float(i["used_cpu_user"]) + float(i["used_cpu_sys"]) for i in cpu],
            children=[
                float(i["used_cpu_user_children"]) + float(i["used_cpu_sys_children"]) for i in cpu
            ],
            procs=[proc_cpu(p.pid) for p in procs],
            runner=proc_cpu(os.getpid()),
            machine=machine_cpu(),
        )

    def usage(self, a: Snap, b: Snap) -> Usage:
        p = len(self.primaries)
        return Usage(
            prim=p,
            calls=sum(b.calls[:p]) - sum(a.calls[:p]),
            net_in=sum(x[0] for x in b.net[:p]) - sum(x[0] for x in a.net[:p]),
            net_out=sum(x[1] for x in b.net[:p]) - sum(x[1] for x in a.net[:p]),
            aof_bytes=sum(x[0] for x in b.aof[:p]) - sum(x[0] for x in a.aof[:p]),
            aof_rewrites=sum(x[1] for x in b.aof[:p]) - sum(x[1] for x in a.aof[:p]),
            seconds=b.wall - a.wall,
            nodes=[y - x for x, y in zip(a.nodes, b.nodes, strict=True)],
            children=[y - x for x, y in zip(a.children, b.children, strict=True)],
            procs=[y - x for x, y in zip(a.procs, b.procs, strict=True)],
            runner=b.runner - a.runner,
            machine_busy=b.machine[0] - a.machine[0],
        )

    def used_memory(self) -> tuple[list[int], list[int]]:
        """Per node: used_memory, and the part of it that is buffers (replication backlog
        and replica output, client buffers, AOF buffer) rather than data."""
        infos = self.info("memory")
        buffers = [sum(int(i.get(k, 0)) for k in BUFFER_FIELDS) for i in infos]
        return [int(i["used_memory"]) for i in infos], buffers

    def settle(self, timeout: float = 60.0) -> None:
        """Until no node rewrites its AOF, then 1.1 s more: the AOF buffer flushed (everysec)
        and closed connections freed, so used_memory is the data's."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(
            int(i.get("aof_rewrite_in_progress", 0)) for i in self.info("persistence")
        ):
            time.sleep(0.1)
        time.sleep(1.1)

    def load_scripts(self) -> None:
        for c in self.clients[: len(self.primaries)]:
            for s in SCRIPTS.values():
                c.script_load(s.source)

    def owners(self, queue: str) -> list[int]:
        """For each shard of ``queue``, the index (in self.primaries) of its primary."""
        slots = {}
        for i, p in enumerate(self.primaries):
            for lo, hi in cluster_nodes(p)[p.node_id].slots:
                for s in range(lo, hi + 1):
                    slots[s] = i
        return [
            slots[key_slot(QueueKeys(shard_name(queue, i, self.case.shards)).stats.encode())]
            for i in range(self.case.shards)
        ]

    def succeeded(self, queue: str, owners: list[int]) -> int:
        """The ``succeeded`` counters of every shard, added up (HGETs, pipelined per node)."""
        by: dict[int, list[str]] = {}
        for i, o in enumerate(owners):
            by.setdefault(o, []).append(QueueKeys(shard_name(queue, i, self.case.shards)).stats)
        total = 0
        for o, keys in by.items():
            pipe = self.clients[o].pipeline(transaction=False)
            for k in keys:
                pipe.hget(k, "succeeded")
            total += sum(int(v or 0) for v in pipe.execute())
        return total


@contextlib.contextmanager
def cluster_for(case: Case, binary: str) -> Iterator[Cluster]:
    """A fresh cluster whose nodes the run's cleanup also knows (stopped by PID)."""
    c = Cluster(binary, primaries=case.primaries, replicas=case.replicas)
    try:
        c.start()
        for n in c.nodes:
            assert n.pid is not None and n.port != 6379
            _live_servers[n.pid] = n
        yield c
    finally:
        pids = [n.pid for n in c.nodes]
        c.stop()
        for pid in pids:
            _live_servers.pop(pid or -1, None)


# -- the run --------------------------------------------------------------------------------------


def run(rep: Report) -> None:
    n = rep.n(COUNT)
    big = rep.n(BIG)
    binary = server_binary("valkey")
    version = next((p[2:] for p in server_version(binary).split() if p.startswith("v=")), "?")
    cores = os.cpu_count() or 1
    rep.line(
        f"Valkey {version} nodes on loopback, AOF everysec; payload {PAYLOAD}; {n:,} tasks per "
        f"producer and per drain; {WORKERS} worker processes, concurrency {CONCURRENCY}, "
        "async no-op handler"
    )
    rep.line(
        f"this machine has {cores} cores for every node, producer, worker and this runner: "
        "the 3-primary figures are bound by those cores, not by the servers"
    )
    m0 = machine_cpu()
    time.sleep(1.0)
    m1 = machine_cpu()
    rep.line(
        f"before starting, the machine was {100 * (m1[0] - m0[0]) / (m1[1] - m0[1]) * cores:.0f}"
        f"% busy of {100 * cores}% (other processes: they compete with every figure below)"
    )
    rep.figure("machine", {"cores": cores, "server": f"Valkey {version}"})
    rows = []
    for case in CASES:
        rep.line()
        rep.line(f"-- {case.label} (shards={case.shards})")
        with bench_for(rep, case, binary) as b:
            rows.append(one_case(b, n))
    table(rep, rows, n)
    rep.line()
    case = Case(f"3 primaries, {big:,} waiting", 3, 0, SHARDS)
    rep.line(f"-- {case.label} (shards={case.shards}): memory and schedule rate at scale")
    with bench_for(rep, case, binary) as b:
        b.load_scripts()
        q = f"cb-{secrets.token_hex(3)}"
        with Queue(q, url=b.cluster.url, shards=case.shards) as queue:
            queue.stats()
        b.settle()
        mem0 = b.used_memory()
        res = schedule_run(b, q, 1, big)
        b.settle()
        mem = memory_figures(b, mem0, b.used_memory(), big)
        rep.figure(case.label, {"schedule_1": res, "memory": mem})


@contextlib.contextmanager
def bench_for(rep: Report, case: Case, binary: str) -> Iterator[Bench]:
    with cluster_for(case, binary) as c:
        b = Bench(rep, case, c, c.primaries(), c.replicas())
        b.clients = [redis.Redis(x.host, x.port, socket_timeout=30) for x in b.nodes]
        try:
            yield b
        finally:
            for cl in b.clients:
                cl.close()


def one_case(b: Bench, n: int) -> dict[str, Any]:
    rep, case = b.rep, b.case
    b.load_scripts()
    sched_q = f"cb-{secrets.token_hex(3)}"
    with Queue(sched_q, url=b.cluster.url, shards=case.shards) as q:
        q.stats()  # stores the shard count (and loads the stats script) before the baseline
    owners = b.owners(sched_q)
    per_primary = Counter(owners)
    rep.line(
        "shards per primary: "
        + ", ".join(
            f"{b.primaries[i].port}: {per_primary.get(i, 0)}" for i in range(len(b.primaries))
        )
    )
    row: dict[str, Any] = {"case": case.label, "shards": case.shards, "primaries": case.primaries}
    b.settle()
    mem0 = b.used_memory()
    for producers in PRODUCERS:
        res = schedule_run(b, sched_q, producers, n)
        row[f"schedule_{producers}"] = res
        if producers == 1:
            b.settle()
            mem1 = b.used_memory()
            row["memory"] = memory_figures(b, mem0, mem1, n)
    row["drain"] = drain_run(b, n)
    rep.figure(case.label, row)
    return row


def cpu_line(b: Bench, u: Usage, tasks: int, procs_label: str) -> str:
    k = tasks / 1000
    prim = len(b.primaries)
    nodes = " + ".join(f"{x:.2f}" for x in u.nodes[:prim])
    reps = sum(u.nodes[prim:])
    extra = f"; replicas {reps:.2f} s" if b.replicas else ""
    kids = sum(u.children)
    extra += f"; AOF rewrite children {kids:.2f} s" if kids > 0.005 else ""
    cores = os.cpu_count() or 1
    return (
        f"CPU s: primaries {nodes} = {u.primaries_total:.2f} "
        f"({u.primaries_total / k:.3f} s per 1,000 tasks){extra}; {procs_label} "
        f"{' + '.join(f'{x:.2f}' for x in u.procs)} ({sum(u.procs) / k:.3f} s per 1,000); "
        f"runner {u.runner:.2f}; machine {100 * u.machine_busy / u.seconds:.0f}% busy of "
        f"{100 * cores}% (processes this run did not start: {100 * u.others / u.seconds:.0f}%)"
        f"\n      {u.calls:,} script calls ({tasks / max(u.calls, 1):,.0f} tasks per call); "
        f"client traffic at the primaries {u.net_in / tasks:.0f} B in + "
        f"{u.net_out / tasks:.0f} B out per task; AOF "
        + (
            f"+{u.aof_bytes / tasks:.0f} B per task"
            if not u.aof_rewrites
            else f"rewritten {u.aof_rewrites}x meanwhile"
        )
    )


def usage_dict(b: Bench, u: Usage, tasks: int) -> dict[str, Any]:
    k = tasks / 1000
    prim = len(b.primaries)
    return {
        "seconds": u.seconds,
        "primary_cpu_s": u.nodes[:prim],
        "replica_cpu_s": u.nodes[prim:],
        "aof_children_cpu_s": sum(u.children),
        "primaries_cpu_s_per_1000": u.primaries_total / k,
        "procs_cpu_s": u.procs,
        "procs_cpu_s_per_1000": sum(u.procs) / k,
        "runner_cpu_s": u.runner,
        "machine_busy_pct": 100 * u.machine_busy / u.seconds,
        "others_pct": 100 * u.others / u.seconds,
        "busiest_primary_share": max(u.nodes[:prim]) / max(u.primaries_total, 1e-9),
        "script_calls": u.calls,
        "net_in_bytes_per_task": u.net_in / tasks,
        "net_out_bytes_per_task": u.net_out / tasks,
        "aof_bytes_per_task": None if u.aof_rewrites else u.aof_bytes / tasks,
        "aof_rewrites": u.aof_rewrites,
    }


def schedule_run(b: Bench, queue: str, producers: int, n: int) -> dict[str, Any]:
    rep = b.rep
    kids = [
        Child("producer", b.cluster.url, queue, b.case.shards, "--n", str(n))
        for _ in range(producers)
    ]
    reports: list[dict[str, Any]] = []
    try:
        for k in kids:
            k.start()
        s0 = b.snap(kids)
        for k in kids:
            k.go()
        for k in kids:
            if not k.wait_done(max(PROC_TIMEOUT, n / 5000)):
                raise RuntimeError("a producer did not finish in time")
        s1 = b.snap(kids)
    finally:
        reports = [k.stop() for k in kids]
    if any("start" not in r for r in reports):
        raise RuntimeError(f"a producer failed: {reports}")
    start = min(r["start"] for r in reports)
    end = max(r["end"] for r in reports)
    total = sum(r["n"] for r in reports)
    rate = total / max(end - start, 1e-9)
    u = b.usage(s0, s1)
    rep.line(
        f"schedule, {producers} producer process{'es' if producers > 1 else ''}: {total:,} tasks "
        f"in {end - start:.2f} s = {rate:,.0f} tasks/s"
    )
    rep.line("    " + cpu_line(b, u, total, "producers" if producers > 1 else "producer"))
    return {"tasks": total, "seconds": end - start, "tasks_per_s": rate, **usage_dict(b, u, total)}


def memory_figures(
    b: Bench, mem0: tuple[list[int], list[int]], mem1: tuple[list[int], list[int]], n: int
) -> dict[str, Any]:
    prim = len(b.primaries)
    deltas = [y - x for x, y in zip(mem0[0], mem1[0], strict=True)]
    buffers = [y - x for x, y in zip(mem0[1], mem1[1], strict=True)]
    data = [d - f for d, f in zip(deltas, buffers, strict=True)]
    on_primaries, buf_primaries = sum(deltas[:prim]), sum(buffers[:prim])
    per_task = on_primaries / n
    per_task_data = sum(data[:prim]) / n
    on_replicas = sum(data[prim:])
    payload_bytes = len(QueueCore("m").codec.encode(PAYLOAD))
    buf = (
        f", of which buffers {buf_primaries / 2**20:+.1f} MiB" if abs(buf_primaries) > 2**16 else ""
    )
    b.rep.line(
        f"memory: used_memory +{on_primaries / 2**20:.1f} MiB over the primaries "
        f"({', '.join(f'{d / 2**20:.1f}' for d in deltas[:prim])}){buf}: {per_task_data:.0f} B "
        f"per waiting task beyond buffers (payload {payload_bytes} B)"
        + (
            f"; replicas +{on_replicas / 2**20:.1f} MiB beyond buffers "
            f"({on_replicas / n:.0f} B per task)"
            if b.replicas
            else ""
        )
    )
    return {
        "used_memory_delta_per_primary": deltas[:prim],
        "buffers_delta_per_primary": buffers[:prim],
        "used_memory_per_waiting_task": per_task,
        "bytes_per_waiting_task": per_task_data,
        "replica_bytes_per_task": on_replicas / n if b.replicas else None,
        "payload_bytes": payload_bytes,
    }


def drain_run(b: Bench, n: int) -> dict[str, Any]:
    rep, case = b.rep, b.case
    queue = f"cd-{secrets.token_hex(3)}"
    owners = b.owners(queue)
    workers = [
        Child("worker", b.cluster.url, queue, case.shards, "--concurrency", str(CONCURRENCY))
        for _ in range(WORKERS)
    ]
    reports: list[dict[str, Any]] = []
    done = 0
    try:
        for w in workers:
            w.start()
        b.settle()
        mem0 = b.used_memory()
        with Queue(queue, url=b.cluster.url, shards=case.shards) as q:
            due = time.time() + DRAIN_LEAD + n / 20_000  # after they are all stored
            specs = [TaskSpec(KIND, PAYLOAD, at=due) for _ in range(n)]
            q.schedule_many(specs)
        slack = due - time.time()
        time.sleep(max(0.0, slack - 0.025))  # the workers claim 20 ms ahead (lookahead)
        s0 = b.snap(workers)
        deadline = time.monotonic() + PROC_TIMEOUT
        while time.monotonic() < deadline:
            done = b.succeeded(queue, owners)
            if done >= n:
                break
            time.sleep(POLL)
        finished = time.time()
        s1 = b.snap(workers)
    finally:
        reports = [w.stop() for w in workers]
    b.settle()
    mem1 = b.used_memory()
    firsts = [r["first_start"] for r in reports if r.get("first_start")]
    first = min(firsts) if firsts else finished
    elapsed = max(finished - first, 1e-9)
    rate = done / elapsed
    # Started more than once, or never: a count off n either way (ids per worker are
    # distinct unless that worker ran one twice; across workers, ``started`` shows it).
    started = sum(r.get("started", 0) for r in reports)
    ok = done >= n
    u = b.usage(s0, s1)
    if slack < 0.025:
        rep.line(f"    (storing the drained tasks ended {-slack:.2f} s after their due time)")
    rep.line(
        f"drain, {WORKERS} worker processes: {done:,} acked in {elapsed:.2f} s = {rate:,.0f} "
        f"tasks/s{'' if ok else ' -- TIMED OUT'}; per worker "
        f"{' + '.join(fmt_int(r.get('started', 0)) for r in reports)}"
    )
    rep.line("    " + cpu_line(b, u, max(done, 1), "workers"))
    per_worker = [x / (elapsed) for x in u.procs]
    worker_rate = done / max(sum(u.procs), 1e-9)
    rep.line(
        f"    workers busy {' + '.join(f'{100 * x:.0f}%' for x in per_worker)} of a core; "
        f"{worker_rate:,.0f} tasks per worker CPU second"
    )
    cores = os.cpu_count() or 1
    ours = u.primaries_total + sum(u.nodes[len(b.primaries) :]) + sum(u.procs) + u.runner
    ceiling = cores * done / max(ours, 1e-9)
    rep.line(
        f"    this machine's ceiling: {cores} cores / ({1e6 * ours / max(done, 1):.0f} us of CPU "
        f"per task, servers + workers + runner) = {ceiling:,.0f} tasks/s, were nothing else "
        "running"
    )
    prim = len(b.primaries)
    kept = sum(
        (y - by) - (x - bx)
        for x, y, bx, by in zip(
            mem0[0][:prim], mem1[0][:prim], mem0[1][:prim], mem1[1][:prim], strict=True
        )
    )
    rep.line(
        f"    finished records kept for the dedupe window: used_memory +{kept / 2**20:.1f} MiB "
        f"over the primaries = {kept / n:.0f} B per finished task (buffers left out)"
    )
    rep.bar(
        f"{case.label}: every drained task ran once (missing + extra runs)",
        float(abs(n - started)) if ok else math.nan,
        "<=",
        0,
        "tasks",
    )
    return {
        "tasks": n,
        "done": done,
        "seconds": elapsed,
        "tasks_per_s": rate,
        "started": started,
        "tasks_per_worker_cpu_s": worker_rate,
        "machine_ceiling_tasks_per_s": ceiling,
        "bytes_per_finished_task": kept / n,
        **usage_dict(b, u, max(done, 1)),
    }


def table(rep: Report, rows: list[dict[str, Any]], n: int) -> None:
    rep.line()
    rep.line(f"summary ({n:,} tasks a run; CPU s per 1,000 tasks summed over the primaries):")
    head = (
        f"{'case':26s} {'shards':>6s} {'sched 1p/s':>10s} {'sched 2p/s':>10s} "
        f"{'drain/s':>8s} {'ceiling':>8s} {'srv sched':>9s} {'srv drain':>9s} {'busiest':>7s} "
        f"{'wrk/1k':>6s} {'B/task':>6s} {'mach%':>5s} {'oth%':>4s}"
    )
    rep.line(head)
    for r in rows:
        s1, s2, d = r["schedule_1"], r["schedule_2"], r["drain"]
        rep.line(
            f"{r['case']:26s} {r['shards']:>6d} {s1['tasks_per_s']:>10,.0f} "
            f"{s2['tasks_per_s']:>10,.0f} {d['tasks_per_s']:>8,.0f} "
            f"{d['machine_ceiling_tasks_per_s']:>8,.0f} "
            f"{s1['primaries_cpu_s_per_1000']:>9.3f} {d['primaries_cpu_s_per_1000']:>9.3f} "
            f"{100 * d['busiest_primary_share']:>6.0f}% {d['procs_cpu_s_per_1000']:>6.3f} "
            f"{r['memory']['bytes_per_waiting_task']:>6.0f} {d['machine_busy_pct']:>5.0f} "
            f"{d['others_pct']:>4.0f}"
        )
    rep.line(
        "(ceiling: this machine's cores / the CPU per drained task of the servers, workers and "
        "runner; srv sched / srv drain: primaries' CPU s per 1,000 tasks scheduled (1 producer) / "
        "drained (claim + ack); busiest: the busiest primary's share of that drain CPU; "
        "wrk/1k: worker processes' CPU s per 1,000 drained; B/task: used_memory per waiting "
        "task over the primaries, buffers left out; mach%: the whole machine during the drain, "
        f"of {100 * (os.cpu_count() or 1)}%; oth%: processes this run did not start)"
    )


if __name__ == "__main__":
    child_main(sys.argv[1:])
