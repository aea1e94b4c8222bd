"""Ten million waiting: the lateness and drain measures on top of a queue that holds 10^7 tasks.

One fresh server (the bundled Valkey 8, AOF everysec) and one queue. First, with the queue
empty: the time of ``delayq info`` (the command, and ``Admin.overviews()`` in this process)
and of the dashboard's main pages, then :mod:`lateness`'s and :mod:`drain`'s measures (async
handler, one worker process; their code, run on this server and queue). Then the queue is
filled by ``schedule_many`` with ``--waiting`` tasks (payload ``{"order": 123456, "user":
42}``, due 7 days ahead and 1 ms apart; specs built a chunk at a time, only the calls timed),
and the same measures run again on top of them. Last, the server is killed (SIGKILL) and
started again on its data directory: the time until it answers ``PING`` (it answers
``-LOADING`` until the AOF is read) and says ``loading:0``.

Reports the fill rate, ``used_memory`` (and per waiting task), every figure empty and at
size side by side, and the AOF's size and load time. Bars: fill ≥ 80,000 tasks/s;
lateness p99 and drain rate at size within 10% of the empty queue's.

Not run by a plain ``bench/run`` (10,000,000 tasks: ~2.5 GB and several minutes):
``bench/run ten_million [--waiting N]``; ``--quick`` makes the default 1,000,000 and the
lateness and drain runs 10x smaller.
"""

from __future__ import annotations

import secrets
import statistics
import subprocess
import sys
import time
import urllib.request
from typing import Any

import drain
import lateness
from common import Report, fresh_server, server_cpu, short_version, spawn, stop_pid

from delayq import Queue, TaskSpec
from delayq.admin.inspect import Admin
from delayq.embedded import EmbeddedServer, free_port

NAME = "ten_million"
TITLE = "Ten million waiting: fill, memory, lateness and drain on top, info, dashboard, restart"

WAITING = 10_000_000
PAYLOAD = {"order": 123456, "user": 42}
CHUNK = 50_000  # specs built, then scheduled, a chunk at a time (10^7 specs at once: ~5 GB)
AHEAD = 7 * 86_400.0  # the waiting tasks fall due a week ahead, 1 ms apart
FILL_BAR = 80_000.0
WITHIN = 0.10  # lateness p99 and drain rate at size: within 10% of the empty queue's
DRAIN_CONCURRENCY = 64
REPEAT = 5  # timings of info and of each page: median and max of this many
TOKEN = "bench-" + secrets.token_hex(8)
RESTART_TIMEOUT = 900.0

_waiting: int | None = None


def configure(*, waiting: int | None) -> None:
    """``bench/run --waiting N``: how many tasks wait (default 10^7, 10^6 with --quick)."""
    global _waiting
    _waiting = waiting


def run(rep: Report) -> None:
    n = _waiting if _waiting is not None else rep.n(WAITING)
    queue = f"tm-{secrets.token_hex(3)}"
    lat_duration = lateness.DURATION * rep.scale
    lat_n = round(lateness.RATE * lat_duration)
    drain_n = rep.n(drain.COUNT)
    with fresh_server() as srv:
        rep.line(
            f"{short_version(srv)}, AOF everysec; queue {queue}; {n:,} waiting; lateness "
            f"{lat_n:,} tasks at {lateness.RATE:,}/s, drain {drain_n:,} tasks (async handler, "
            f"one worker process)"
        )
        rep.line("-- empty queue")
        empty = measures(rep, srv, queue, "empty", lat_n, lat_duration, drain_n)
        rep.line(f"-- filling {n:,} tasks")
        fill = fill_queue(rep, srv, queue, n)
        rep.line(f"-- {n:,} waiting")
        full = measures(rep, srv, queue, "full", lat_n, lat_duration, drain_n)
        rep.line("-- restart (SIGKILL, then start on the same data directory)")
        restart = restart_time(rep, srv, queue, n)
    compare(rep, empty, full, fill, n)
    rep.figure("summary", {"waiting": n, "fill": fill, "restart": restart})


# -- the measures, empty and at size ----------------------------------------------------------


def measures(
    rep: Report, srv: EmbeddedServer, queue: str, tag: str, lat_n: int, dur: float, drain_n: int
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "info": info_times(rep, srv, queue),
        "pages": page_times(rep, srv, queue),
    }
    out["lateness"] = lateness.measure(
        rep, srv, queue, "async", lat_n, dur, key=f"{tag} lateness", bars=False
    )
    out["drain"] = drain.measure(
        rep, srv, queue, "async", DRAIN_CONCURRENCY, drain_n, key=f"{tag} drain", bar=False
    )
    rep.figure(tag, out)
    return out


def timed(fn: Any) -> list[float]:
    """``fn()`` REPEAT times; the wall time of each, in ms."""
    times = []
    for _ in range(REPEAT):
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    return times


def spread(times: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(times), "max_ms": max(times)}


def info_times(rep: Report, srv: EmbeddedServer, queue: str) -> dict[str, Any]:
    """``delayq info -q QUEUE`` as a command (interpreter start included; a bare ``delayq
    --help`` beside it shows how much of it that is), and ``Admin.overviews()`` in process."""
    base = [sys.executable, "-m", "delayq"]

    def command(*args: str) -> None:
        subprocess.run([*base, *args], check=True, capture_output=True, timeout=120)

    cmd = timed(lambda: command("info", "-q", queue, "--url", srv.url))
    bare = timed(lambda: command("--help"))
    with Admin(srv.url, queues=[queue]) as admin:
        admin.overviews()  # connected, scripts loaded
        call = timed(admin.overviews)
    out = {"command": spread(cmd), "help": spread(bare), "overviews": spread(call)}
    rep.line(
        f"delayq info: {out['command']['median_ms']:.0f} ms (median of {REPEAT}; max "
        f"{out['command']['max_ms']:.0f}); delayq --help {out['help']['median_ms']:.0f} ms; "
        f"Admin.overviews() in process {out['overviews']['median_ms']:.2f} ms (max "
        f"{out['overviews']['max_ms']:.2f})"
    )
    return out


def page_times(rep: Report, srv: EmbeddedServer, queue: str) -> dict[str, Any]:
    """The dashboard (``delayq dashboard``, its own process) serving its main pages: each
    page fetched once to warm it, then REPEAT times, timed from request to last byte."""
    port = free_port()
    proc = spawn(
        [
            *(sys.executable, "-m", "delayq", "dashboard", "--url", srv.url, "-q", queue),
            *("--port", str(port), "--token", TOKEN),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    pages = ["/", f"/queues/{queue}", f"/queues/{queue}/scheduled", "/api/queues", "/metrics"]
    out: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get(base + "/api/queues")
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("the dashboard did not start") from None
                time.sleep(0.1)
        for page in pages:
            get(base + page)
            out[page] = spread(timed(lambda page=page: get(base + page)))  # type: ignore[misc]
    finally:
        stop_pid(proc)
    rep.line(
        "dashboard pages, ms (median / max of "
        f"{REPEAT}): "
        + "; ".join(f"{p} {v['median_ms']:.1f} / {v['max_ms']:.1f}" for p, v in out.items())
    )
    return out


def get(url: str) -> bytes:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        body: bytes = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}")
        return body


# -- fill, memory, restart --------------------------------------------------------------------


def memory(r: Any) -> int:
    return int(r.info("memory")["used_memory"])


def settle(r: Any, timeout: float = 600.0) -> None:
    """Until no AOF rewrite runs (its buffers gone), then 1.1 s (everysec flushed)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and int(r.info("persistence")["aof_rewrite_in_progress"]):
        time.sleep(0.2)
    time.sleep(1.1)


def fill_queue(rep: Report, srv: EmbeddedServer, queue: str, n: int) -> dict[str, Any]:
    with Queue(queue, url=srv.url) as q:
        r = q.client
        settle(r)
        mem0 = memory(r)
        cpu0, rewrites0 = server_cpu(r), int(r.info("persistence")["aof_rewrites"])
        base = time.time() + AHEAD
        spent = mine = 0.0
        wall0 = time.perf_counter()
        for lo in range(0, n, CHUNK):
            specs = [
                TaskSpec("bench.waiting", PAYLOAD, at=base + i / 1000)
                for i in range(lo, min(n, lo + CHUNK))
            ]
            t0, c0 = time.perf_counter(), time.process_time()
            q.schedule_many(specs)
            spent += time.perf_counter() - t0
            mine += time.process_time() - c0
        wall = time.perf_counter() - wall0
        cpu = server_cpu(r) - cpu0
        rewrites = int(r.info("persistence")["aof_rewrites"]) - rewrites0
        settle(r)
        mem1 = memory(r)
        waiting = q.stats().scheduled
    rate = n / max(spent, 1e-9)
    per_task = (mem1 - mem0) / max(n, 1)
    rep.line(
        f"fill: {n:,} tasks by schedule_many ({CHUNK:,} a call) in {spent:.1f} s of calls = "
        f"{rate:,.0f} tasks/s ({wall:.1f} s with building the specs); {waiting:,} waiting"
    )
    rep.line(
        f"      CPU per task: this process in schedule_many {1e6 * mine / max(n, 1):.1f} µs, the "
        f"server {1e6 * cpu / max(n, 1):.1f} µs (INFO cpu, main thread; {rewrites} AOF "
        "rewrite(s) meanwhile, their children not counted)"
    )
    rep.line(
        f"used_memory {mem0 / 2**20:,.1f} MiB empty -> {mem1 / 2**20:,.1f} MiB "
        f"({mem1 / 2**30:.2f} GiB): {per_task:.0f} B per waiting task"
    )
    return {
        "tasks": n,
        "seconds": spent,
        "wall_seconds": wall,
        "producer_cpu_us": 1e6 * mine / max(n, 1),
        "server_cpu_us": 1e6 * cpu / max(n, 1),
        "aof_rewrites": rewrites,
        "tasks_per_s": rate,
        "waiting": waiting,
        "used_memory_empty": mem0,
        "used_memory": mem1,
        "bytes_per_task": per_task,
    }


def restart_time(rep: Report, srv: EmbeddedServer, queue: str, n: int) -> dict[str, Any]:
    with Queue(queue, url=srv.url) as q:
        r = q.client
        settle(r)
        pers = r.info("persistence")
        aof_dir = srv.data_dir / "appendonlydir"
        files = {p.name: p.stat().st_size for p in aof_dir.iterdir()} if aof_dir.is_dir() else {}
    srv.kill()
    t0 = time.perf_counter()
    srv.restart(timeout=RESTART_TIMEOUT)  # returns at the first +PONG: loading is over
    pong = time.perf_counter() - t0
    with Queue(queue, url=srv.url) as q:
        r = q.client
        loading = int(r.info("persistence")["loading"])
        ready = time.perf_counter() - t0
        waiting = q.stats().scheduled
    total = sum(files.values())
    parts = ", ".join(f"{k} {v / 2**20:,.0f} MiB" for k, v in sorted(files.items()))
    rep.line(
        f"AOF {total / 2**20:,.0f} MiB ({parts}; "
        f"{pers.get('aof_rewrites', 0)} rewrite(s) so far): PING answered {pong:.2f} s after the "
        f"restart, loading:{loading} at {ready:.2f} s; {waiting:,} waiting after it"
    )
    return {
        "aof_bytes": total,
        "aof_files": files,
        "pong_seconds": pong,
        "loaded_seconds": ready,
        "loading": loading,
        "waiting_after": waiting,
    }


# -- the comparison ----------------------------------------------------------------------------


def compare(
    rep: Report, empty: dict[str, Any], full: dict[str, Any], fill: dict[str, Any], n: int
) -> None:
    rep.line()
    rep.line(f"{'':34s} {'empty':>10s} {f'{n:,} waiting':>18s} {'ratio':>6s}")
    rows = [
        ("lateness p50 ms", empty["lateness"]["p50_ms"], full["lateness"]["p50_ms"]),
        ("lateness p99 ms", empty["lateness"]["p99_ms"], full["lateness"]["p99_ms"]),
        ("lateness max ms", empty["lateness"]["max_ms"], full["lateness"]["max_ms"]),
        ("drain tasks/s", empty["drain"]["tasks_per_s"], full["drain"]["tasks_per_s"]),
        (
            "delayq info ms (command)",
            empty["info"]["command"]["median_ms"],
            full["info"]["command"]["median_ms"],
        ),
        (
            "Admin.overviews() ms",
            empty["info"]["overviews"]["median_ms"],
            full["info"]["overviews"]["median_ms"],
        ),
    ]
    rows += [
        (f"page {p} ms", empty["pages"][p]["median_ms"], full["pages"][p]["median_ms"])
        for p in empty["pages"]
    ]
    for label, a, b in rows:
        rep.line(f"{label:34s} {a:>10,.2f} {b:>18,.2f} {b / a if a else float('nan'):>6.2f}")
    complete = all(
        x["lateness"]["distinct"] == x["lateness"]["n"] and x["drain"]["done"] >= x["drain"]["n"]
        for x in (empty, full)
    )
    nan = float("nan")
    rep.bar("fill rate (schedule_many)", fill["tasks_per_s"], ">=", FILL_BAR, "tasks/s")
    rep.bar(
        "lateness p99 at size / empty",
        full["lateness"]["p99_ms"] / empty["lateness"]["p99_ms"] if complete else nan,
        "<=",
        1 + WITHIN,
        "x",
    )
    rep.bar(
        "drain rate at size / empty",
        full["drain"]["tasks_per_s"] / empty["drain"]["tasks_per_s"] if complete else nan,
        ">=",
        1 - WITHIN,
        "x",
    )
    rep.figure("ratios", {label: (b / a if a else None) for label, a, b in rows})
