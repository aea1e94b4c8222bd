"""Soak: a million tasks waiting while 5,000 a second fall due, for 10 minutes.

One private server (Valkey 8.1, AOF everysec as the embedded server runs it). First
1,000,000 tasks are scheduled 2-3 h ahead (``schedule_many``, 50,000 a call): they wait
for the whole run. Then 4 worker processes (async no-op handler, concurrency 64 each) and
one producer process start. The producer keeps tasks falling due at 5,000/s, evenly
spaced, for 10 minutes: every 0.1 s it schedules the next 0.1 s worth of tasks, due
``LEAD`` (3 s) later, so the schedule always holds the million plus ~15,000 about to fall
due. Each due task carries its sequence number; the handler appends ``time.time() -
task.due_at.timestamp()`` and that number to two arrays, written to files when the worker
stops, so every task can be checked to have run exactly once.

Every 10 s (5 s with ``--quick``), aligned to the start of the due window, the runner
samples ``INFO`` (used_memory, the server's CPU, the AOF), ``Queue.stats()`` (tasks done
from the ``succeeded`` counter, due and not yet claimed, claimed) and the CPU of every
process it started (``/proc/<pid>/stat``) and of the whole machine (``/proc/stat``).

Not run by a plain ``bench/run``: ``bench/run soak`` (10 min, about 11 in all), ``bench/run
soak --quick`` (100,000 waiting, 500/s for 60 s), and ``--soak-duration``,
``--soak-rate``, ``--soak-waiting``, ``--soak-workers`` to change a size.

Also run by itself as a child process: ``soak.py worker ...`` and ``soak.py producer ...``.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import json
import math
import os
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from common import (
    BENCH_DIR,
    Report,
    WorkerProcess,
    client,
    fresh_server,
    percentile,
    proc_cpu,
    short_version,
)

from delayq import Queue, Task, TaskSpec, Worker
from delayq.scripts import SCRIPTS

NAME = "soak"
TITLE = "Soak: 1,000,000 waiting, 5,000 tasks/s falling due for 10 min, 4 worker processes"

WAITING = 1_000_000  # tasks waiting 2-3 h ahead for the whole run (100,000 with --quick)
RATE = 5_000  # tasks falling due per second (500 with --quick)
DURATION = 600.0  # seconds of tasks falling due
QUICK_DURATION = 60.0
WORKERS = 4  # worker processes
CONCURRENCY = 64  # per worker
LEASE = 30.0
LEAD = 3.0  # the producer schedules each task this long before it falls due
TICK = 0.1  # ... a tick's worth of tasks at a time
PRELOAD_CHUNK = 50_000
WAITING_DELAY = 7200.0  # waiting tasks fall due 2 h to 3 h after the preload
SAMPLE = 10.0  # seconds between samples (5 with --quick)
QUICK_SAMPLE = 5.0
GRACE = 60.0  # after the window, wait at most this long for the last tasks to finish
KIND = "soak.due"
FILLER = "soak.waiting"
LIMIT_FRACTION = 0.99  # the throughput bar: at least this share of the offered rate

# Set by bench/run's --soak-* options; None keeps the size above (scaled by --quick).
OVERRIDES: dict[str, float | None] = {}


def configure(**sizes: float | None) -> None:
    """bench/run's ``--soak-duration/-rate/-waiting/-workers``."""
    OVERRIDES.update({k: v for k, v in sizes.items() if v is not None})


@dataclass
class Sizes:
    waiting: int
    rate: int
    duration: float
    workers: int
    sample: float

    @property
    def n(self) -> int:
        return round(self.rate * self.duration)

    @classmethod
    def for_run(cls, rep: Report) -> Sizes:
        o = OVERRIDES
        return cls(
            waiting=int(o.get("waiting") or rep.n(WAITING)),
            rate=int(o.get("rate") or rep.n(RATE)),
            duration=float(o.get("duration") or (QUICK_DURATION if rep.quick else DURATION)),
            workers=int(o.get("workers") or WORKERS),
            sample=QUICK_SAMPLE if rep.quick else SAMPLE,
        )


# -- the child processes ----------------------------------------------------------------------


class Child(WorkerProcess):
    """``soak.py <role> ...`` in its own interpreter, started and stopped by PID like a
    benchmark worker (it prints ``ready``, stops on SIGTERM or stdin EOF, writes JSON)."""

    def __init__(self, role: str, url: str, queue: str, *args: str, max_seconds: float) -> None:
        super().__init__(url, queue)
        self.argv = [
            self.argv[0],
            str(BENCH_DIR / "soak.py"),
            role,
            "--url",
            url,
            "--queue",
            queue,
            "--out",
            self.out_path,
            "--max-seconds",
            str(max_seconds),
            *args,
        ]


def child_main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="soak.py")
    p.add_argument("role", choices=("worker", "producer"))
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--max-seconds", type=float, required=True)
    p.add_argument("--concurrency", type=int, default=CONCURRENCY)
    p.add_argument("--lease", type=float, default=LEASE)
    p.add_argument("--t0", type=float, help="producer: when the first task falls due")
    p.add_argument("--rate", type=int)
    p.add_argument("--n", type=int)
    args = p.parse_args(argv)
    if args.role == "worker":
        worker_main(args)
    else:
        producer_main(args)


def worker_main(args: argparse.Namespace) -> None:
    import asyncio

    from lifeline import stop_worker_when_orphaned
    from worker_proc import serve

    queue = Queue(args.queue, url=args.url)
    worker = Worker(queue, concurrency=args.concurrency, lease=args.lease)
    lateness = array.array("d")  # seconds, one per start
    seqs = array.array("q")  # the task's sequence number, one per start
    now = time.time

    @worker.handler(KIND)
    async def due(task: Task) -> None:
        lateness.append(now() - task.due_at.timestamp())
        seqs.append(task.payload)

    stop_worker_when_orphaned(worker, args.max_seconds)
    asyncio.run(serve(worker))
    queue.close()
    with open(args.out + ".lat", "wb") as f:
        lateness.tofile(f)
    with open(args.out + ".seq", "wb") as f:
        seqs.tofile(f)
    with open(args.out, "w") as f:
        json.dump({"started": len(seqs)}, f)


def producer_main(args: argparse.Namespace) -> None:
    """Every TICK, the tasks falling due in one TICK, LEAD seconds later (payload: seq)."""
    from lifeline import stop_when_orphaned

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop_when_orphaned(stop.set, args.max_seconds)
    t0, rate, n = args.t0, args.rate, args.n
    per_tick = max(1, round(rate * TICK))
    slack: list[float] = []  # first due time of a batch - when the batch was stored
    took: list[float] = []
    sent = 0
    with Queue(args.queue, url=args.url) as queue:
        queue.stats()  # connected, scripts loaded
        print("ready", flush=True)
        while sent < n and not stop.is_set():
            first_due = t0 + sent / rate
            stop.wait(max(0.0, first_due - LEAD - time.time()))
            if stop.is_set():
                break
            batch = range(sent, min(n, sent + per_tick))
            t = time.time()
            queue.schedule_many(TaskSpec(KIND, i, at=t0 + i / rate) for i in batch)
            done = time.time()
            took.append(done - t)
            slack.append(first_due - done)
            sent = batch.stop
        stop.wait()  # stay until stopped, so the runner can read this process's CPU
    with open(args.out, "w") as f:
        json.dump(
            {
                "sent": sent,
                "batches": len(took),
                "batch_ms_p50": 1000 * percentile(sorted(took), 50),
                "batch_ms_max": 1000 * max(took, default=math.nan),
                "slack_ms_min": 1000 * min(slack, default=math.nan),
                "late_batches": sum(1 for s in slack if s < 0),
            },
            f,
        )


# -- sampling -----------------------------------------------------------------------------------


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of every core together, from /proc/stat."""
    with open("/proc/stat") as f:
        vals = [int(x) for x in f.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    total = sum(vals[:8])
    return float(total - idle), float(total)


@dataclass
class Sample:
    t: float  # seconds since the first task fell due
    used_memory: int
    rss: int
    server_cpu: float  # seconds, main process (all its threads)
    server_children_cpu: float  # AOF rewrite children
    aof_size: int
    aof_rewrites: int
    succeeded: int
    due: int
    active: int
    scheduled: int
    dead: int
    workers_cpu: list[float]
    producer_cpu: float
    runner_cpu: float
    machine: tuple[float, float]


@dataclass
class Soak:
    rep: Report
    sizes: Sizes
    url: str
    queue: Queue
    meter: Any
    t0: float = 0.0
    workers: list[Child] = field(default_factory=list)
    producer: Child | None = None
    samples: list[Sample] = field(default_factory=list)
    succeeded0: int = 0

    def sample(self) -> Sample:
        info = self.meter.info()
        st = self.queue.stats()
        return Sample(
            t=time.time() - self.t0,
            used_memory=int(info["used_memory"]),
            rss=int(info["used_memory_rss"]),
            server_cpu=float(info["used_cpu_user"]) + float(info["used_cpu_sys"]),
            server_children_cpu=float(info["used_cpu_user_children"])
            + float(info["used_cpu_sys_children"]),
            aof_size=int(info.get("aof_current_size", 0)),
            aof_rewrites=int(info.get("aof_rewrites", 0)),
            succeeded=st.counters.get("succeeded", 0) - self.succeeded0,
            due=st.due,
            active=st.active,
            scheduled=st.scheduled,
            dead=st.dead,
            workers_cpu=[proc_cpu(w.pid) for w in self.workers],
            producer_cpu=proc_cpu(self.producer.pid if self.producer else None),
            runner_cpu=proc_cpu(os.getpid()),
            machine=machine_cpu(),
        )

    def print_sample(self, s: Sample) -> None:
        prev = self.samples[-2] if len(self.samples) > 1 else None
        cols = ["", "", "", "", ""]
        if prev is not None:
            c = cpu_shares(prev, s)
            rate = (s.succeeded - prev.succeeded) / c["seconds"]
            cols = [f"{rate:,.0f}"] + [
                f"{c[k]:.0f}" for k in ("server_pct", "workers_total_pct", "others_pct")
            ]
            cols.append(f"{c['machine_busy_pct']:.0f}")
        self.rep.line(
            f"{s.t:7.0f} {cols[0]:>8s} {s.succeeded:>10,} {s.due:>7,} {s.active:>7,} "
            f"{s.scheduled:>10,} {s.used_memory / 2**20:9.1f} {cols[1]:>5s} {cols[2]:>5s} "
            f"{cols[3]:>5s} {cols[4]:>5s}"
        )

    def watch(self, until: float, stop_when: int | None = None) -> None:
        """Sample every sizes.sample seconds (aligned to t0) until ``until`` (epoch s), or
        earlier once ``stop_when`` tasks have succeeded."""
        step = self.sizes.sample
        if stop_when is not None and self.samples and self.samples[-1].succeeded >= stop_when:
            return
        while True:
            k = math.floor((time.time() - self.t0) / step) + 1
            at = min(self.t0 + k * step, until)
            time.sleep(max(0.0, at - time.time()))
            self.samples.append(self.sample())
            self.print_sample(self.samples[-1])
            if at >= until:
                return
            if stop_when is not None and self.samples[-1].succeeded >= stop_when:
                return


# -- the run --------------------------------------------------------------------------------------


def run(rep: Report) -> None:
    sz = Sizes.for_run(rep)
    rep.line(
        f"{sz.waiting:,} tasks waiting (due 2-3 h later); {sz.rate:,} tasks/s falling due "
        f"for {sz.duration:g} s ({sz.n:,} tasks), each scheduled {LEAD:g} s ahead by a "
        f"producer process; {sz.workers} worker processes, async no-op handler, concurrency "
        f"{CONCURRENCY}, lease {LEASE:g} s"
    )
    rep.line(
        f"this machine has {os.cpu_count()} cores for the server, {sz.workers} workers, the "
        "producer and this runner: the processes compete for CPU"
    )
    name = f"soak-{secrets.token_hex(3)}"
    with fresh_server() as srv, Queue(name, url=srv.url) as queue:
        meter = client(srv.url)
        rep.line(f"server: {short_version(srv)}, AOF everysec, pid {srv.pid}")
        soak = Soak(rep, sz, srv.url, queue, meter)
        try:
            mem = preload(soak)
            results = drive(soak)
            final = meter.info()
        finally:
            meter.close()
        report(soak, mem, results, final)


def used(meter: Any) -> int:
    return int(meter.info("memory")["used_memory"])


def preload(soak: Soak) -> dict[str, float]:
    sz, queue, meter = soak.sizes, soak.queue, soak.meter
    queue.stats()
    meter.script_load(SCRIPTS["schedule"].source)  # scripts are in the baseline
    time.sleep(1.2)  # the AOF buffer flushed (everysec)
    base = used(meter)
    t = time.perf_counter()
    for start in range(0, sz.waiting, PRELOAD_CHUNK):
        stop = min(sz.waiting, start + PRELOAD_CHUNK)
        queue.schedule_many(
            TaskSpec(FILLER, i, delay=WAITING_DELAY + 3600 * i / sz.waiting)
            for i in range(start, stop)
        )
    took = time.perf_counter() - t
    time.sleep(1.2)
    after = used(meter)
    per = (after - base) / max(sz.waiting, 1)
    soak.rep.line(
        f"preload: {sz.waiting:,} waiting tasks in {took:.1f} s ({sz.waiting / took:,.0f}/s); "
        f"used_memory {base / 2**20:.1f} -> {after / 2**20:.1f} MiB = {per:.0f} bytes per "
        "waiting task"
    )
    return {"base": base, "after_preload": after, "per_waiting": per, "preload_s": took}


def drive(soak: Soak) -> dict[str, Any]:
    """Start the workers and the producer, sample through the window, stop them all."""
    sz, rep = soak.sizes, soak.rep
    limit = sz.duration + LEAD + GRACE + 300  # the children stop by themselves after this
    worker_reports: list[dict[str, Any]] = []
    producer_report: dict[str, Any] = {}
    try:
        for _ in range(sz.workers):
            w = Child("worker", soak.url, soak.queue.name, max_seconds=limit)
            soak.workers.append(w)
            w.start()
        soak.succeeded0 = soak.queue.stats().counters.get("succeeded", 0)
        soak.t0 = math.ceil(time.time() + LEAD + 2.0)
        soak.producer = Child(
            "producer",
            soak.url,
            soak.queue.name,
            *("--t0", repr(soak.t0), "--rate", str(sz.rate), "--n", str(sz.n)),
            max_seconds=limit,
        )
        soak.producer.start()
        rep.line(
            f"workers {[w.pid for w in soak.workers]}, producer {soak.producer.pid}; "
            f"the first task falls due at t=0 ({soak.t0 - time.time():.1f} s from now)"
        )
        rep.line(
            f"{'t':>7s} {'done/s':>8s} {'done':>10s} {'due':>7s} {'active':>7s} "
            f"{'scheduled':>10s} {'used MiB':>9s} {'srv%':>5s} {'wrk%':>5s} {'oth%':>5s} "
            f"{'mach%':>5s}"
        )
        rep.line(
            "(t: s since the first task fell due; CPU in % of one core: srv the server, wrk "
            "the workers, oth processes this run did not start; mach% of all cores)"
        )
        soak.watch(soak.t0)
        soak.watch(soak.t0 + sz.duration)
        end_window = len(soak.samples) - 1
        soak.watch(soak.t0 + sz.duration + GRACE, stop_when=sz.n)
    finally:
        if soak.producer is not None:
            producer_report = soak.producer.stop()
        out_paths = [w.out_path for w in soak.workers]
        for w in soak.workers:
            worker_reports.append(w.stop())
    starts = read_starts(out_paths)
    return {
        "end_window": end_window,
        "workers": worker_reports,
        "producer": producer_report,
        **starts,
    }


def read_starts(out_paths: list[str]) -> dict[str, Any]:
    lat = array.array("d")
    seqs = array.array("q")
    per_worker: list[int] = []
    for path in out_paths:
        before = len(seqs)
        for suffix, arr in ((".lat", lat), (".seq", seqs)):
            with contextlib.suppress(OSError), open(path + suffix, "rb") as f:
                arr.frombytes(f.read())
            with contextlib.suppress(OSError):
                os.unlink(path + suffix)
        per_worker.append(len(seqs) - before)
    return {"lat": lat, "seqs": seqs, "per_worker": per_worker}


# -- the report -----------------------------------------------------------------------------------


def lat_stats(values: list[float]) -> dict[str, float]:
    s = sorted(values)
    return {
        "n": len(s),
        "p50_ms": 1000 * percentile(s, 50),
        "p95_ms": 1000 * percentile(s, 95),
        "p99_ms": 1000 * percentile(s, 99),
        "p999_ms": 1000 * percentile(s, 99.9),
        "max_ms": 1000 * s[-1] if s else math.nan,
        "min_ms": 1000 * s[0] if s else math.nan,
    }


def lat_line(label: str, st: dict[str, float]) -> str:
    return (
        f"{label:>14s} {st['n']:>9,} {st['p50_ms']:8.2f} {st['p95_ms']:8.2f} "
        f"{st['p99_ms']:8.2f} {st['p999_ms']:8.2f} {st['max_ms']:9.2f}"
    )


def exactly_once(seqs: array.array[int], n: int) -> dict[str, int]:
    counts = bytearray(n)
    outside = 0
    for s in seqs:
        if 0 <= s < n:
            if counts[s] < 255:
                counts[s] += 1
        else:
            outside += 1
    zero, one = counts.count(0), counts.count(1)
    return {
        "expected": n,
        "starts": len(seqs),
        "ran_once": one,
        "missing": zero,
        "duplicated": n - zero - one,
        "extra_runs": len(seqs) - outside - (n - zero),  # starts beyond the first of each
        "unknown": outside,
    }


def report(soak: Soak, mem: dict[str, float], res: dict[str, Any], final: dict[str, Any]) -> None:
    rep, sz = soak.rep, soak.sizes
    lat: array.array[float] = res["lat"]
    seqs: array.array[int] = res["seqs"]
    rep.line()
    once = exactly_once(seqs, sz.n)
    rep.line(
        f"due tasks: {once['expected']:,} expected, {once['starts']:,} handler starts "
        f"(per worker {', '.join(f'{c:,}' for c in res['per_worker'])}); ran once "
        f"{once['ran_once']:,}, missing {once['missing']:,}, run more than once "
        f"{once['duplicated']:,} ({once['extra_runs']:,} extra runs), unknown "
        f"{once['unknown']:,}"
    )
    last = soak.samples[-1] if soak.samples else None
    if last is not None:
        rep.line(f"dead tasks: {last.dead:,}; succeeded counter: {last.succeeded:,}")
    prod = res["producer"]
    rep.line(
        f"producer: {prod.get('sent', 0):,} scheduled in {prod.get('batches', 0):,} batches; "
        f"batch p50 {prod.get('batch_ms_p50', math.nan):.1f} ms, max "
        f"{prod.get('batch_ms_max', math.nan):.1f} ms; least slack before the batch's first "
        f"due time {prod.get('slack_ms_min', math.nan):.0f} ms; batches stored after their "
        f"first task was due: {prod.get('late_batches', 'n/a')}"
    )
    overall, buckets = lateness(rep, sz, lat, seqs)
    worst = worst_spans(rep, soak, lat, seqs)
    thr = throughput(rep, soak, res["end_window"])
    memory = memory_figures(rep, soak, mem, final)
    cpu = cpu_figures(rep, soak, res["end_window"])
    rep.figure(
        "config",
        {
            "waiting": sz.waiting,
            "rate": sz.rate,
            "duration_s": sz.duration,
            "workers": sz.workers,
            "concurrency": CONCURRENCY,
            "lead_s": LEAD,
            "cores": os.cpu_count(),
        },
    )
    rep.figure("exactly_once", once)
    rep.figure("producer", prod)
    rep.figure("lateness", overall)
    rep.figure("lateness_by_bucket", buckets)
    rep.figure("worst_spans", worst)
    rep.figure("throughput", thr)
    rep.figure("memory", memory)
    rep.figure("cpu", cpu)
    rep.figure("samples", [s.__dict__ for s in soak.samples])
    rep.bar(
        "due tasks not run exactly once (missing + duplicated)",
        once["missing"] + once["duplicated"],
        "<=",
        0,
        "tasks",
    )
    rep.bar(
        "throughput over the due window",
        thr["window_per_s"],
        ">=",
        LIMIT_FRACTION * sz.rate,
        "tasks/s",
    )


def lateness(
    rep: Report, sz: Sizes, lat: array.array[float], seqs: array.array[int]
) -> tuple[dict[str, float], list[dict[str, float]]]:
    """Overall and per bucket (a minute; 10 s for runs under 5 minutes) of due time."""
    bucket_s = 60.0 if sz.duration >= 300 else 10.0
    per_bucket = max(1, round(sz.rate * bucket_s))
    nb = max(1, math.ceil(sz.n / per_bucket))
    groups: list[list[float]] = [[] for _ in range(nb)]
    for late, s in zip(lat, seqs, strict=True):
        groups[min(nb - 1, max(0, s // per_bucket))].append(late)
    overall = lat_stats(list(lat))
    early = sum(1 for x in lat if x < 0)
    rep.line()
    rep.line(
        f"lateness (handler start - due time), ms; buckets of {bucket_s:g} s by due time; "
        f"{early:,} started before due (min {overall['min_ms']:.2f} ms)"
    )
    rep.line(
        f"{'due at (s)':>14s} {'tasks':>9s} {'p50':>8s} {'p95':>8s} {'p99':>8s} "
        f"{'p99.9':>8s} {'max':>9s}"
    )
    buckets = []
    for i, g in enumerate(groups):
        st = lat_stats(g)
        st["from_s"] = i * bucket_s
        buckets.append(st)
        rep.line(lat_line(f"{i * bucket_s:g}-{(i + 1) * bucket_s:g}", st))
    rep.line(lat_line("all", overall))
    overall["early"] = early
    return overall, buckets


def worst_spans(
    rep: Report, soak: Soak, lat: array.array[float], seqs: array.array[int], top: int = 3
) -> list[dict[str, float]]:
    """The sample intervals (by due time) with the highest p99, beside the CPU then."""
    sz, s = soak.sizes, soak.samples
    per = max(1, round(sz.rate * sz.sample))
    spans = max(1, math.ceil(sz.n / per))
    groups: list[list[float]] = [[] for _ in range(spans)]
    for late, q in zip(lat, seqs, strict=True):
        groups[min(spans - 1, max(0, q // per))].append(late)
    start = next((i for i, x in enumerate(s) if x.t >= -0.5), 0)
    rows = []
    for k, g in enumerate(groups):
        if not g or start + k + 1 >= len(s):
            continue
        c = cpu_shares(s[start + k], s[start + k + 1])
        row = {"from_s": k * sz.sample, **lat_stats(g)}
        row.update({k2: c[k2] for k2 in ("server_pct", "workers_total_pct", "others_pct")})
        rows.append(row)
    rows.sort(key=lambda r: -r["p99_ms"])
    for r in rows[:top]:
        rep.line(
            f"worst {sz.sample:g} s of due time: {r['from_s']:g}-{r['from_s'] + sz.sample:g} s, "
            f"p99 {r['p99_ms']:.0f} ms, max {r['max_ms']:.0f} ms; CPU then: server "
            f"{r['server_pct']:.0f}%, workers {r['workers_total_pct']:.0f}%, other processes "
            f"{r['others_pct']:.0f}%"
        )
    return rows[:top]


def throughput(rep: Report, soak: Soak, end_window: int) -> dict[str, float]:
    sz, s = soak.sizes, soak.samples
    start = next((i for i, x in enumerate(s) if x.t >= -0.5), 0)
    rates = [
        (s[i].succeeded - s[i - 1].succeeded) / max(s[i].t - s[i - 1].t, 1e-9)
        for i in range(start + 1, end_window + 1)
    ]
    window = (s[end_window].succeeded - s[start].succeeded) / max(
        s[end_window].t - s[start].t, 1e-9
    )
    done_after = next((x.t - sz.duration for x in s if x.succeeded >= sz.n), math.nan)
    rep.line()
    rep.line(
        f"throughput over the window: {window:,.0f} tasks/s (offered {sz.rate:,}/s); per "
        f"{sz.sample:g} s sample min {min(rates, default=math.nan):,.0f}, max "
        f"{max(rates, default=math.nan):,.0f}; all {sz.n:,} done "
        + (
            f"by {done_after:.0f} s after the last fell due (sampled)"
            if not math.isnan(done_after)
            else "-- NOT within the grace period"
        )
    )
    backlog = [x.due for x in s[start : end_window + 1]]
    rep.line(
        f"due and not yet claimed at a sample: max {max(backlog, default=0):,}, mean "
        f"{sum(backlog) / max(len(backlog), 1):,.1f}"
    )
    return {
        "window_per_s": window,
        "sample_min_per_s": min(rates, default=math.nan),
        "sample_max_per_s": max(rates, default=math.nan),
        "all_done_after_window_s": done_after,
        "max_due_backlog": max(backlog, default=0),
    }


def memory_figures(
    rep: Report, soak: Soak, mem: dict[str, float], final: dict[str, Any]
) -> dict[str, float]:
    s = soak.samples
    before, after = mem["after_preload"], int(final["used_memory"])
    peak = max([x.used_memory for x in s] + [int(final.get("used_memory_peak", 0))])
    done = s[-1].succeeded if s else 0
    growth = (after - before) / max(done, 1)
    rep.line()
    rep.line(
        f"used_memory: empty {mem['base'] / 2**20:.1f} MiB; with {soak.sizes.waiting:,} "
        f"waiting {before / 2**20:.1f} MiB ({mem['per_waiting']:.0f} bytes per waiting task); "
        f"at the end {after / 2**20:.1f} MiB; peak {peak / 2**20:.1f} MiB; rss at the end "
        f"{int(final['used_memory_rss']) / 2**20:.1f} MiB"
    )
    rep.line(
        f"growth during the run {(after - before) / 2**20:.1f} MiB = {growth:.0f} bytes per "
        f"finished task (finished records are kept for the 24 h dedupe window by default)"
    )
    rep.line(
        f"AOF: {int(final.get('aof_current_size', 0)) / 2**20:.0f} MiB at the end, "
        f"{int(final.get('aof_rewrites', 0))} rewrites"
    )
    return {
        "base_bytes": mem["base"],
        "after_preload_bytes": before,
        "bytes_per_waiting_task": mem["per_waiting"],
        "end_bytes": after,
        "peak_bytes": peak,
        "end_rss_bytes": int(final["used_memory_rss"]),
        "growth_bytes_per_finished_task": growth,
        "preload_s": mem["preload_s"],
        "aof_bytes": int(final.get("aof_current_size", 0)),
        "aof_rewrites": int(final.get("aof_rewrites", 0)),
    }


def cpu_shares(a: Sample, b: Sample) -> dict[str, Any]:
    """CPU % (of one core) of each process between two samples; the machine's % of all."""
    dt = max(b.t - a.t, 1e-9)

    def pct(x: float) -> float:
        return 100 * x / dt

    workers = [pct(y - x) for x, y in zip(a.workers_cpu, b.workers_cpu, strict=True)]
    out: dict[str, Any] = {
        "server_pct": pct(b.server_cpu - a.server_cpu),
        "server_children_pct": pct(b.server_children_cpu - a.server_children_cpu),
        "workers_pct": workers,
        "workers_total_pct": sum(workers),
        "producer_pct": pct(b.producer_cpu - a.producer_cpu),
        "runner_pct": pct(b.runner_cpu - a.runner_cpu),
        "machine_busy_pct": 100
        * (b.machine[0] - a.machine[0])
        / max(b.machine[1] - a.machine[1], 1),
        "seconds": dt,
    }
    ours = sum(
        out[k]
        for k in (
            "server_pct",
            "server_children_pct",
            "workers_total_pct",
            "producer_pct",
            "runner_pct",
        )
        if not math.isnan(out[k])
    )
    out["others_pct"] = max(0.0, (os.cpu_count() or 1) * out["machine_busy_pct"] - ours)
    return out


def cpu_figures(rep: Report, soak: Soak, end_window: int) -> dict[str, Any]:
    s = soak.samples
    start = next((i for i, x in enumerate(s) if x.t >= -0.5), 0)
    out = cpu_shares(s[start], s[end_window])
    workers = out["workers_pct"]
    cores = os.cpu_count() or 1
    rep.line()
    rep.line(
        f"CPU over the window (% of one core): server {out['server_pct']:.0f}% (+ "
        f"{out['server_children_pct']:.0f}% AOF rewrite children), workers "
        f"{' + '.join(f'{w:.0f}' for w in workers)} = {out['workers_total_pct']:.0f}%, "
        f"producer {out['producer_pct']:.0f}%, this runner {out['runner_pct']:.0f}%; whole "
        f"machine {out['machine_busy_pct']:.0f}% busy of {cores} cores (processes this run did "
        f"not start: ~{out['others_pct']:.0f}% of a core)"
    )
    return out


if __name__ == "__main__":
    child_main(sys.argv[1:])
