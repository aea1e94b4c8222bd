"""The dashboard's history (delayq/history.py): what it costs the server, in memory and time.

Memory: a day of one shard, written by the real ack script as of one minute after another
(100 tasks acked a minute, their lateness over 7 buckets: 8 fields a minute, in hashes of
ten minutes), measured with ``MEMORY USAGE`` of the hashes and with ``used_memory`` freed by
deleting them; and a day of a quiet queue (1 task a minute, 2 fields). Time: server
microseconds of the ack script per call (``INFO commandstats``), with the history and
without (``history_window=0``) on the same server, in alternating rounds, at batches of 16
and 500. Valkey 8.1 (bundled)
and Redis 7.0 (/usr/bin). No bar: the figures are quoted in docs/architecture.md.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from common import Report, client, fresh_server, short_version

import delayq
from delayq import Queue, TaskSpec, leasing
from delayq.history import SPAN_MS, span_of
from delayq.runner import SyncRunner

NAME = "history"
TITLE = "The dashboard's history: memory per minute and server time per ack call"

MINUTE = 60_000
T0 = 29_000_000 * MINUTE  # a minute boundary (ms)
PER_MINUTE = 100  # = len(LATENESS)
# Lateness (s) of a minute's 100 starts: 7 buckets from 0.2 ms to 51 ms, most below 1 ms.
LATENESS = [0.00015] * 30 + [0.0003] * 30 + [0.0005] * 20 + [0.0008] * 10 + [0.002] * 6
LATENESS += [0.004] * 2 + [0.008, 0.05]


def _used(r: Any) -> int:
    return int(r.info("memory")["used_memory"])


def _fill(srv: Any, name: str, per_minute: int, minutes: int) -> tuple[int, int, str, int, int]:
    """Write ``minutes`` minutes of history with the ack script, a minute apart; (MEMORY
    USAGE of the hashes, used_memory freed by deleting them, one hash's encoding, fields)."""
    meter = client(srv.url)
    with Queue(name, url=srv.url) as q:
        run = SyncRunner(q.client)
        q.schedule_many(TaskSpec("k", None, at=T0 / 1000 - 60) for _ in range(minutes * per_minute))
        held: list[tuple[str, int]] = []
        while got := run.run(
            leasing.claim(q.core, limit=1000, lease_ms=10 * 86_400_000, now_ms=T0)
        ).tasks:
            held += [(c.id, c.token) for c in got]
        late = LATENESS if per_minute == len(LATENESS) else [0.0003] * per_minute
        for m in range(minutes):
            part = held[m * per_minute : (m + 1) * per_minute]
            run.run(leasing.ack(q.core, part, lateness=late, now_ms=T0 + m * MINUTE + 5))
        spans = {span_of(t) for t in range(T0, T0 + minutes * MINUTE + SPAN_MS, SPAN_MS)}
        keys = [k for s in sorted(spans) if meter.exists(k := q.core.keys.history(s))]
        usage = sum(int(meter.memory_usage(k, samples=0) or 0) for k in keys)
        encoding = meter.object("encoding", keys[len(keys) // 2])
        fields = sum(int(meter.hlen(k)) for k in keys)
        time.sleep(0.2)
        before = _used(meter)
        meter.delete(*keys)
        time.sleep(0.2)
        used = before - _used(meter)
    meter.close()
    enc = encoding.decode() if isinstance(encoding, bytes) else str(encoding)
    return usage, used, enc, fields, len(keys)


def _ack_us(srv: Any, batch: int, rounds: int) -> tuple[float, float]:
    """Server µs per ack call, (with the history, without), alternating per round."""
    r = client(srv.url)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(rounds):
        for on in (True, False) if i % 2 == 0 else (False, True):
            with Queue(f"ack-{i}-{on}", url=srv.url, history_window=86400 if on else 0) as q:
                run = SyncRunner(q.client)
                n = batch * max(1, 2000 // batch)
                q.schedule_many(TaskSpec("k", None, delay=0) for _ in range(n))
                held: list[tuple[str, int]] = []
                while got := run.run(leasing.claim(q.core, limit=1000, lease_ms=600_000)).tasks:
                    held += [(c.id, c.token) for c in got]
                r.config_resetstat()
                calls = 0
                for j in range(0, len(held), batch):
                    part = held[j : j + batch]
                    late = [0.0002 + (k % 7) * 0.0001 for k in range(len(part))]
                    run.run(leasing.ack(q.core, part, lateness=late))
                    calls += 1
                us = int(r.info("commandstats")["cmdstat_evalsha"]["usec"])
                times[on].append(us / calls)
    r.close()
    return statistics.median(times[True]), statistics.median(times[False])


def _lua_us(srv: Any, late: str, calls: int = 20_000) -> float:
    """Server µs of one dq_history call (lua/lib/history.lua as shipped), called ``calls``
    times inside one script, so that no round trip or scheduling noise is in it."""
    lib = (Path(delayq.__file__).parent / "lua" / "lib" / "history.lua").read_text()
    body = lib + (
        "local K = {history = KEYS[1]}\n"
        "for i = 1, tonumber(ARGV[1]) do\n"
        "  dq_history(K, 1740000000005 + i * 3, '86400000', 's', 16, ARGV[2])\n"
        "end\n"
        "return 1\n"
    )
    r = client(srv.url)
    sha = r.script_load(body)
    r.config_resetstat()
    r.evalsha(sha, 1, "bench:history", calls, late)
    us = int(r.info("commandstats")["cmdstat_evalsha"]["usec"])
    r.delete("bench:history")
    r.close()
    return us / calls


def run(rep: Report) -> None:
    rounds = 3 if rep.quick else 9
    for flavour in ("valkey", "redis"):
        with fresh_server(flavour, appendonly=False) as srv:
            version = short_version(srv)
            for per_minute in (PER_MINUTE, 1):
                usage, used, enc, fields, n = _fill(srv, f"h{per_minute}", per_minute, 1440)
                rep.line(
                    f"{version}: a day at {per_minute} task(s)/minute: {fields:,} fields in "
                    f"{n} hashes ({enc}): MEMORY USAGE {usage:,} B ({usage / 1440:.0f} "
                    f"B/minute), used_memory -{used:,} B ({used / 1440:.0f} B/minute) when deleted"
                )
                rep.figure(
                    f"{flavour}-{per_minute}",
                    {"memory_usage": usage, "used_memory": used, "per_minute": used / 1440},
                )
            for late in ("3:16", "2:3 3:5 4:6 5:2", "2:30 4:30 5:20 6:10 9:6 11:2 13:1 18:1"):
                us = statistics.median(_lua_us(srv, late) for _ in range(3))
                buckets = late.count(":")
                rep.line(
                    f"{version}: the history's part of one call, {buckets} lateness bucket(s): "
                    f"{us:.2f} us (median of 3 x 20,000 calls inside one script)"
                )
                rep.figure(f"{flavour}-lua-{buckets}", {"us": us})
            for batch in (16, 500):
                on, off = _ack_us(srv, batch, rounds)
                rep.line(
                    f"{version}: ack of {batch}: {on:.1f} us/call with the history, {off:.1f} "
                    f"without: +{on - off:.1f} us/call, +{(on - off) / batch:.3f} us/task "
                    f"(median of {rounds} alternating rounds)"
                )
                rep.figure(f"{flavour}-ack-{batch}", {"on_us": on, "off_us": off})


# -- instruction counts: ``python bench/history.py callgrind [--redis]`` ---------------------
#
# The times above move with the machine's load; the server's instructions do not. As
# bench/server_cost.py's callgrind: a server under valgrind, instrumentation switched on
# around the acks alone, with the history and without (history_window=0), at 16 and 500.


def ack_instructions(flavour: str, batch: int, history: bool, n: int = 5_000) -> float:
    """Server instructions per task of acking ``n`` tasks in batches of ``batch``."""
    import os
    import socket
    import subprocess
    import tempfile

    from common import _live_procs, server_binary, stop_pid

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tempfile.mktemp(prefix="callgrind-history-", suffix=".out")
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
        with Queue("cg", url=url, history_window=86_400 if history else 0) as q:
            run = SyncRunner(q.client)
            q.schedule_many(TaskSpec("noop", {"i": i}, delay=0) for i in range(n + 1))
            held: list[tuple[str, int]] = []
            while got := run.run(leasing.claim(q.core, limit=1000, lease_ms=600_000)).tasks:
                held += [(c.id, c.token) for c in got]
            run.run(leasing.ack(q.core, held[:1], lateness=[0.0003]))  # scripts loaded
            instr("on")
            for i in range(1, len(held), batch):
                part = held[i : i + batch]
                late = [0.0002 + (k % 7) * 0.0001 for k in range(len(part))]
                run.run(leasing.ack(q.core, part, lateness=late))
            instr("off")
    finally:
        stop_pid(proc, timeout=120)  # callgrind writes its file as the server exits
    with open(out) as f:
        total = next(int(line.split()[1]) for line in f if line.startswith("totals:"))
    os.unlink(out)
    return total / n


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["callgrind"]:
        sys.exit("usage: bench/history.py callgrind [--redis] (bench/run history runs the rest)")
    fl = "redis" if "--redis" in sys.argv else "valkey"
    for size in (16, 500):
        on, off = (ack_instructions(fl, size, h) for h in (True, False))
        print(
            f"{fl} ack, batches of {size}: {on:,.0f} instructions per task with the history, "
            f"{off:,.0f} without: +{on - off:,.0f} ({(on / off - 1) * 100:+.1f}%)",
            flush=True,
        )
