"""Scaling: a sharded queue drained on a local cluster of 3 primaries, measured per primary.

For each server (the bundled Valkey 8, then Redis 7.0 ``/usr/bin/redis-server`` when it is
installed): a fresh 3-primary cluster (:mod:`delayq.embedded.cluster`'s ``Cluster``, AOF
everysec, no replicas), a queue with ``shards=16``, 2 worker processes (``cluster.py
worker``: async no-op handler, concurrency 128 each) started idle. The runner schedules
100,000 tasks (payload ``{"order_id": 123456}``) with ``schedule_many``, all due at one
instant ~2 s after the last is stored, and the workers drain them. Each primary is read
three times (before scheduling, after it, after the drain): ``INFO commandstats`` (the
scripts' ``evalsha`` time and calls) and ``INFO cpu`` (``used_cpu_user + used_cpu_sys`` of
the main process); the ``succeeded`` counter of every shard, polled every 20 ms and summed
per primary, says how many tasks each primary ran and when its last one was acked.

Per primary: its shards and tasks (the split), its drain rate (its tasks from the first
handler start to its own last ack), and its cost per task of its own, scheduling and
draining (claim + ack), in script time and in process CPU; then what one primary would do
at that cost: 1 s of server CPU / µs per task over the task's life (schedule + claim + ack),
at 100% and at 50% of its core. ``docs/scaling.md`` uses these figures.

Not run by a plain ``bench/run``: ``bench/run scaling`` (about a minute),
``bench/run scaling --quick`` (10,000 tasks) is a smoke check.
"""

from __future__ import annotations

import os
import secrets
import time
from typing import Any

from cluster import Bench, Case, Child, bench_for, machine_cpu
from common import REDIS7, Report, proc_cpu, server_binary

from delayq import Queue, TaskSpec
from delayq.embedded import server_version
from delayq.keys import QueueKeys, shard_name

NAME = "scaling"
TITLE = "Scaling: drain and server cost per task per primary, 3 primaries, Valkey 8 and Redis 7.0"

COUNT = 100_000
PRIMARIES = 3
SHARDS = 16
WORKERS = 2
CONCURRENCY = 128
PAYLOAD = {"order_id": 123456}
KIND = "bench.noop"
CHUNK = 10_000  # tasks per schedule_many call
LEAD = 2.0  # the tasks fall due this long after the last is stored
POLL = 0.02
TIMEOUT = 180.0
HEADROOM = 0.5  # the share of a primary's core that steady load may take (docs/scaling.md)


def run(rep: Report) -> None:
    n = rep.n(COUNT)
    flavours = ["valkey"] + (["redis"] if os.access(REDIS7, os.X_OK) else [])
    rep.line(
        f"{PRIMARIES} primaries, no replicas, AOF everysec; shards={SHARDS}; {n:,} tasks "
        f"scheduled by the runner, then drained by {WORKERS} worker processes (concurrency "
        f"{CONCURRENCY}, async no-op); {os.cpu_count()} cores for everything"
    )
    if "redis" not in flavours:
        rep.line(f"({REDIS7} not installed: Valkey only)")
    for flavour in flavours:
        binary = server_binary(flavour)
        version = server_version(binary)
        label = ("Valkey " if "valkey" in version.lower() else "Redis ") + next(
            (p[2:] for p in version.split() if p.startswith("v=")), "?"
        )
        rep.line()
        rep.line(f"-- {label}")
        case = Case(f"{label}, {PRIMARIES} primaries", PRIMARIES, 0, SHARDS)
        with bench_for(rep, case, binary) as b:
            rep.figure(label, one(b, n))


def read(b: Bench) -> list[dict[str, float]]:
    """Per primary: the scripts' time (µs) and calls, and the main process's CPU (s)."""
    out = []
    for c in b.clients[: len(b.primaries)]:
        stats = c.info("commandstats")
        cpu = c.info("cpu")
        scripts = [stats.get(k, {}) for k in ("cmdstat_evalsha", "cmdstat_eval")]
        out.append(
            {
                "usec": float(sum(int(s.get("usec", 0)) for s in scripts)),
                "calls": float(sum(int(s.get("calls", 0)) for s in scripts)),
                "cpu": float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
            }
        )
    return out


def delta(a: list[dict[str, float]], b: list[dict[str, float]]) -> list[dict[str, float]]:
    return [{k: y[k] - x[k] for k in x} for x, y in zip(a, b, strict=True)]


def per_primary_done(b: Bench, queue: str, owners: list[int]) -> list[int]:
    """The ``succeeded`` counters of each primary's shards, added up per primary."""
    done = []
    for i, c in enumerate(b.clients[: len(b.primaries)]):
        keys = [
            QueueKeys(shard_name(queue, s, SHARDS)).stats for s, o in enumerate(owners) if o == i
        ]
        pipe = c.pipeline(transaction=False)
        for k in keys:
            pipe.hget(k, "succeeded")
        done.append(sum(int(v or 0) for v in pipe.execute()))
    return done


def one(b: Bench, n: int) -> dict[str, Any]:
    rep = b.rep
    b.load_scripts()
    queue = f"sc-{secrets.token_hex(3)}"
    with Queue(queue, url=b.cluster.url, shards=SHARDS) as q:
        q.stats()  # the shard count stored before the baseline
        owners = b.owners(queue)
        workers = [
            Child("worker", b.cluster.url, queue, SHARDS, "--concurrency", str(CONCURRENCY))
            for _ in range(WORKERS)
        ]
        try:
            for w in workers:
                w.start()
            time.sleep(1.0)  # the workers' start-up commands out of the baseline
            r0 = read(b)
            due = time.time() + LEAD + n / 20_000
            for lo in range(0, n, CHUNK):
                q.schedule_many(
                    TaskSpec(KIND, PAYLOAD, at=due) for _ in range(lo, min(n, lo + CHUNK))
                )
            r1 = read(b)
            time.sleep(max(0.0, due - time.time() - 0.1))
            m1, ours1 = machine_cpu(), [proc_cpu(w.pid) for w in workers] + [proc_cpu(os.getpid())]
            prim = len(b.primaries)
            # A primary's last ack: when its count last grew (its share is known only at
            # the end, so each primary's time is that of its count's last change).
            finished: list[float | None] = [None] * prim
            done = [0] * prim
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline:
                now_done = per_primary_done(b, queue, owners)
                now = time.time()
                for i in range(prim):
                    if now_done[i] != done[i]:
                        finished[i] = now
                done = now_done
                if sum(done) >= n:
                    break
                time.sleep(POLL)
            r2 = read(b)
            m2, ours2 = machine_cpu(), [proc_cpu(w.pid) for w in workers] + [proc_cpu(os.getpid())]
        finally:
            reports = [w.stop() for w in workers]
    firsts = [r["first_start"] for r in reports if r.get("first_start")]
    first = min(firsts) if firsts else time.time()
    started = sum(r.get("started", 0) for r in reports)
    total_done = sum(done)
    ok = total_done >= n and started == n
    sched, drained = delta(r0, r1), delta(r1, r2)
    shards_of = [owners.count(i) for i in range(prim)]
    rows = []
    for i, p in enumerate(b.primaries):
        tasks = max(done[i], 1)
        secs = max((finished[i] or first) - first, 1e-9)
        life_usec = (sched[i]["usec"] + drained[i]["usec"]) / tasks
        life_cpu = 1e6 * (sched[i]["cpu"] + drained[i]["cpu"]) / tasks
        rows.append(
            {
                "port": p.port,
                "shards": shards_of[i],
                "tasks": done[i],
                "share": done[i] / max(total_done, 1),
                "drain_seconds": secs,
                "drain_tasks_per_s": done[i] / secs,
                "drain_cpu_busy": drained[i]["cpu"] / secs,
                "schedule_script_us": sched[i]["usec"] / tasks,
                "schedule_cpu_us": 1e6 * sched[i]["cpu"] / tasks,
                "drain_script_us": drained[i]["usec"] / tasks,
                "drain_cpu_us": 1e6 * drained[i]["cpu"] / tasks,
                "drain_tasks_per_call": done[i] / max(drained[i]["calls"], 1),
                "life_script_us": life_usec,
                "life_cpu_us": life_cpu,
                "projected_per_s_full_core": 1e6 / life_cpu if life_cpu else float("nan"),
                "projected_per_s_headroom": HEADROOM * 1e6 / life_cpu if life_cpu else float("nan"),
            }
        )
    elapsed = max(max((f or first) for f in finished) - first, 1e-9)
    window = m2[1] - m1[1]  # CPU seconds of all cores over the drain
    busy = (m2[0] - m1[0]) / max(window, 1e-9)
    ours = sum(d["cpu"] for d in drained) + sum(y - x for x, y in zip(ours1, ours2, strict=True))
    others = max(0.0, (m2[0] - m1[0]) - ours) / max(window, 1e-9)
    rep.line(
        f"drain: {total_done:,} of {n:,} acked in {elapsed:.2f} s = {total_done / elapsed:,.0f} "
        f"tasks/s over {prim} primaries; handler starts {started:,} (per worker "
        f"{' + '.join(format(r.get('started', 0), ',') for r in reports)})"
        + ("" if total_done >= n else " -- TIMED OUT")
    )
    cores = os.cpu_count() or 1
    rep.line(
        f"machine during the drain: {100 * cores * busy:.0f}% busy of {100 * cores}%, of which "
        f"processes this run did not start {100 * cores * others:.0f}%"
    )
    rep.line(
        f"{'primary':>8s} {'shards':>6s} {'tasks':>7s} {'share':>6s} {'drain/s':>8s} "
        f"{'busy':>5s} {'sched µs':>17s} {'drain µs':>17s} {'life µs':>17s} {'tasks/s at':>18s}"
    )
    rep.line(
        f"{'':>8s} {'':>6s} {'':>7s} {'':>6s} {'':>8s} {'':>5s} {'script / cpu':>17s} "
        f"{'script / cpu':>17s} {'script / cpu':>17s} {'100% / 50% core':>18s}"
    )
    for r in rows:
        rep.line(
            f"{r['port']:>8d} {r['shards']:>6d} {r['tasks']:>7,d} {100 * r['share']:>5.1f}% "
            f"{r['drain_tasks_per_s']:>8,.0f} {100 * r['drain_cpu_busy']:>4.0f}% "
            f"{r['schedule_script_us']:>8.2f} / {r['schedule_cpu_us']:>6.2f} "
            f"{r['drain_script_us']:>8.2f} / {r['drain_cpu_us']:>6.2f} "
            f"{r['life_script_us']:>8.2f} / {r['life_cpu_us']:>6.2f} "
            f"{r['projected_per_s_full_core']:>8,.0f} / {r['projected_per_s_headroom']:>7,.0f}"
        )
    all_tasks = max(total_done, 1)
    life_cpu_all = 1e6 * sum(s["cpu"] + d["cpu"] for s, d in zip(sched, drained, strict=True))
    life_script_all = sum(s["usec"] + d["usec"] for s, d in zip(sched, drained, strict=True))
    summary = {
        "tasks": n,
        "done": total_done,
        "started": started,
        "seconds": elapsed,
        "tasks_per_s": total_done / elapsed,
        "life_script_us": life_script_all / all_tasks,
        "life_cpu_us": life_cpu_all / all_tasks,
        "busiest_share": max(r["share"] for r in rows),
        "machine_busy_pct": 100 * (os.cpu_count() or 1) * busy,
        "others_pct": 100 * (os.cpu_count() or 1) * others,
        "primaries": rows,
    }
    rep.line(
        f"all primaries: {summary['life_script_us']:.2f} µs of scripts and "
        f"{summary['life_cpu_us']:.2f} µs of server CPU per task over its life (schedule + "
        f"claim + ack); busiest primary {100 * summary['busiest_share']:.0f}% of the tasks "
        f"with {max(shards_of)} of {SHARDS} shards"
    )
    rep.line(
        "(drain/s: the primary's tasks from the first handler start to its last ack; busy: its "
        "CPU over that time, of one core; µs per task of its own tasks, script = INFO "
        "commandstats evalsha usec, cpu = used_cpu_user+sys; tasks/s at: 1 s / life cpu µs)"
    )
    rep.bar(
        f"{b.case.label}: every task ran once (missing + extra runs)",
        float(abs(n - started)) if ok or total_done >= n else float("nan"),
        "<=",
        0,
        "tasks",
    )
    return summary
