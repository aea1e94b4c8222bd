"""Server CPU per task over its whole life: schedule, claim, ack, each phase alone.

Redis runs scripts on one thread, so the server time a task costs over its life sets the
ceiling of every primary. On a fresh server (AOF off) per flavour (the bundled Valkey 8.1
and Redis 7.0), N tasks go through each phase in turn, and each phase is measured alone from
the server's own accounting: ``INFO commandstats`` (the script's ``evalsha`` time, and each
command the script ran, which the server counts too) and the ``used_cpu_user + sys`` delta
(which also holds reading the calls and writing the replies). Phases: ``schedule_many``
(its own batching), ``schedule`` one call per task, claim in batches of 64 (a worker of
concurrency 64 under a backlog claims its free room) and ack in batches of 64. Per script,
a table of where its time goes: each inner command's calls and time per task, and the rest
(Lua itself: the interpreter, argument and reply conversion, string work) by difference.
"""

from __future__ import annotations

import time
from typing import Any

from common import Report, client, fresh_server, server_cpu, short_version
from costs import command_stats

from delayq import Queue, TaskSpec, leasing
from delayq.codec import tombstone_prefix
from delayq.runner import SyncRunner

NAME = "server_cost"
TITLE = "Server CPU per task over its life: schedule, claim, ack (Valkey 8, Redis 7.0)"
N = 100_000
BATCH = 64  # a worker of concurrency 64 under a backlog claims (and acks) about this many
PAYLOAD = {"order": 123456, "user": 42}
BAR_US = 4.0  # schedule_many + claim + ack, per task, on Valkey 8


class Phase:
    """Commandstats and CPU deltas around one phase: per-task figures by command."""

    def __init__(self, r: Any) -> None:
        self.r = r

    def __enter__(self) -> Phase:
        self.r.config_resetstat()
        self.cpu0 = server_cpu(self.r)
        return self

    def __exit__(self, *exc: object) -> None:
        self.cpu = server_cpu(self.r) - self.cpu0
        self.stats = command_stats(self.r)

    def per_task(self, n: int) -> dict[str, Any]:
        script = self.stats.pop("evalsha", {"calls": 0, "usec": 0})
        inner = {k: v for k, v in self.stats.items() if k not in ("info", "config|resetstat")}
        inner_us = sum(v["usec"] for v in inner.values())
        return {
            "script_us": script["usec"] / n,
            "script_calls": script["calls"],
            "cpu_us": self.cpu * 1e6 / n,
            "lua_us": (script["usec"] - inner_us) / n,
            "commands": {
                k: {"calls": v["calls"] / n, "us": v["usec"] / n}
                for k, v in sorted(inner.items(), key=lambda kv: -kv[1]["usec"])
            },
        }


def specs(n: int) -> list[TaskSpec]:
    return [TaskSpec("order.close", PAYLOAD, delay=0) for _ in range(n)]


def one(rep: Report, flavour: str, n: int) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    with fresh_server(flavour, appendonly=False) as srv, Queue("cost", url=srv.url) as q:
        r, run = client(srv.url), SyncRunner(q.client)
        q.schedule("warm", {}, delay=3600)  # every script loaded before measuring
        todo = specs(n)
        with Phase(r) as p:
            q.schedule_many(todo)
        out["schedule_many"] = p.per_task(n)
        with Phase(r) as p:
            held = _claim_all(run, q)
        out["claim"] = p.per_task(len(held))
        held_bytes = {  # what a claimed task adds: its attempts entry and its lease
            k: int(r.memory_usage(getattr(q.core.keys, k), samples=0) or 0) / len(held)
            for k in ("attempts", "active")
        }
        with Phase(r) as p:
            _ack_all(run, q, held)
        out["ack"] = p.per_task(len(held))
        singles = specs(n)
        with Phase(r) as p:
            for s in singles:
                q.schedule(s.kind, s.payload, delay=3600)
        out["schedule"] = p.per_task(n)
        r.close()
        version = short_version(srv)
    life = sum(out[k]["script_us"] for k in ("schedule_many", "claim", "ack"))
    life_cpu = sum(out[k]["cpu_us"] for k in ("schedule_many", "claim", "ack"))
    rep.line(
        f"{version}: schedule_many + claim + ack = {life:.2f} us/task in scripts "
        f"(commandstats), {life_cpu:.2f} us/task of server CPU (used_cpu_user+sys)"
    )
    rep.line(
        f"  {'phase':14s} {'script us':>9s} {'CPU us':>7s} {'Lua us':>7s} {'calls/task':>10s}"
        "   inner commands: calls/task x us/task"
    )
    for phase, f in out.items():
        inner = ", ".join(f"{k} {v['calls']:.3g}x {v['us']:.2f}" for k, v in f["commands"].items())
        rep.line(
            f"  {phase:14s} {f['script_us']:9.2f} {f['cpu_us']:7.2f} {f['lua_us']:7.2f} "
            f"{f['script_calls'] / n:10.4f}   {inner}"
        )
    rep.line(
        f"  a claimed task holds: attempts entry {held_bytes['attempts']:.0f} B, lease (active "
        f"zset entry) {held_bytes['active']:.0f} B (MEMORY USAGE per task)"
    )
    rep.figure(
        flavour,
        {"server": version, "n": n, "batch": BATCH, "phases": out, "claimed_bytes": held_bytes},
    )
    if flavour == "valkey":
        rep.bar(
            "Valkey 8: server us per task, schedule_many + claim + ack", life, "<=", BAR_US, "us"
        )
    return out


def run(rep: Report) -> None:
    n = rep.n(N)
    rep.line(
        f"{n:,} tasks, payload {PAYLOAD}; claim and ack in batches of {BATCH}; AOF off; "
        "us per task from the server's own accounting"
    )
    t0 = time.monotonic()
    for flavour in ("valkey", "redis"):
        one(rep, flavour, n)
    rep.line(f"({time.monotonic() - t0:.0f} s)")


# -- instruction counts: ``python bench/server_cost.py callgrind [PHASE ...]`` ----------------
#
# Wall-clock figures on a shared 2-core machine move by 30% between identical runs; the
# server's instructions per task under callgrind do not. Each phase runs on its own server
# (Valkey 8 by default, ``--redis`` for Redis 7.0) started under valgrind with
# instrumentation off, switched on (callgrind_control -i) around that phase alone.

CG_N = 5_000


def _claim_all(run: SyncRunner, q: Queue) -> list[tuple[str, int, str, str]]:
    held: list[tuple[str, int, str, str]] = []
    while got := run.run(leasing.claim(q.core, limit=BATCH, lease_ms=600_000)).tasks:
        now = time.time() * 1000
        held += [
            (
                c.id,
                c.token,
                c.header.kind,
                tombstone_prefix(c.header.attempts, c.header.due_ms, now),
            )
            for c in got
        ]
    return held


def _ack_all(run: SyncRunner, q: Queue, held: list[tuple[str, int, str, str]]) -> None:
    """Acks in batches of BATCH, with each task's kind and tombstone prefix, as a worker
    sends them."""
    for i in range(0, len(held), BATCH):
        part = held[i : i + BATCH]
        leases = [(tid, token) for tid, token, _, _ in part]
        finished = [(pre, kind, "") for _, _, kind, pre in part]
        run.run(leasing.ack(q.core, leases, finished=finished))


def instructions(phase: str, flavour: str = "valkey", n: int = CG_N) -> float:
    """Server instructions per task of one phase (schedule_many, claim, ack, ack_trim: acks
    that also trim as many tasks past their dedupe window, as at steady state; or single:
    one schedule() call per task) under callgrind."""
    import os
    import socket
    import subprocess
    import tempfile

    from common import _live_procs, server_binary, stop_pid

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(prefix=f"callgrind-{phase}-", suffix=".out")
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
    argv += [f"--callgrind-out-file={out}", server_binary(flavour), "--port", str(port)]
    argv += ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _live_procs[proc.pid] = proc

    def instr(on: str) -> None:
        subprocess.run(["callgrind_control", "-i", on, str(proc.pid)], capture_output=True)

    try:
        url = f"redis://127.0.0.1:{port}/0"
        for _ in range(600):
            try:
                client(url).ping()
                break
            except Exception:
                time.sleep(0.1)
        window = 1 if phase == "ack_trim" else None
        with Queue("cg", url=url, dedupe_window=window) as q:
            run = SyncRunner(q.client)
            q.schedule("warm", {}, delay=3600)
            todo = specs(n)
            if phase == "schedule_many":
                instr("on")
            q.schedule_many(todo)
            instr("off")
            if phase == "claim":
                instr("on")
            held = _claim_all(run, q)
            instr("off")
            if phase == "ack":
                instr("on")
            _ack_all(run, q, held)
            instr("off")
            if phase == "ack_trim":  # n more acks, which trim the first n past their window
                time.sleep(1.2)
                q.schedule_many(specs(n))
                held = _claim_all(run, q)
                instr("on")
                _ack_all(run, q, held)
                instr("off")
            if phase == "single":  # n schedule() calls, one task each
                singles = specs(n)
                q.schedule("warm", {}, delay=3600)  # its script loaded before
                instr("on")
                for s in singles:
                    q.schedule(s.kind, s.payload, delay=s.delay)
                instr("off")
    finally:
        stop_pid(proc, timeout=120)  # callgrind writes its file as the server exits
    with open(out) as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
    os.unlink(out)
    return total / n


if __name__ == "__main__":
    import sys

    args = sys.argv[1:]
    if not args or args[0] != "callgrind":
        sys.exit(
            "usage: bench/server_cost.py callgrind [--redis] [PHASE ...] (bench/run runs the rest)"
        )
    fl = "redis" if "--redis" in args else "valkey"
    for ph in [a for a in args[1:] if not a.startswith("--")] or ["schedule_many", "claim", "ack"]:
        print(f"{fl} {ph}: {instructions(ph, fl):,.0f} instructions per task", flush=True)
