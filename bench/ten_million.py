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
Then, as a control for the machine's load drifting over the minutes of the fill, the same
measures run on a fresh empty server.

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
from common import Report, client, fresh_server, server_cpu, short_version, spawn, stop_pid

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
    with fresh_server() as control:
        # The machine's load drifts over the minutes of a fill: the same measures on a fresh
        # empty server now show how much of a difference is the size and how much the drift.
        rep.line("-- control: an empty queue on a fresh server, after the run")
        after = measures(rep, control, queue, "empty after", lat_n, lat_duration, drain_n)
    compare(rep, empty, full, after, fill, n)
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
        usec0 = server_usec(admin.client)
        call = timed(admin.overviews)
        call_server_ms = (server_usec(admin.client) - usec0) / REPEAT / 1000
    out = {"command": spread(cmd), "help": spread(bare), "overviews": spread(call)}
    out["overviews"]["server_ms"] = call_server_ms
    rep.line(
        f"delayq info: {out['command']['median_ms']:.0f} ms (median of {REPEAT}; max "
        f"{out['command']['max_ms']:.0f}); delayq --help {out['help']['median_ms']:.0f} ms; "
        f"Admin.overviews() in process {out['overviews']['median_ms']:.2f} ms (max "
        f"{out['overviews']['max_ms']:.2f}; the server's script time {call_server_ms:.2f} ms)"
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
        meter = client(srv.url)
        for page in pages:
            get(base + page)
            usec0 = server_usec(meter)
            out[page] = spread(timed(lambda page=page: get(base + page)))  # type: ignore[misc]
            out[page]["server_ms"] = (server_usec(meter) - usec0) / REPEAT / 1000
        meter.close()
    finally:
        stop_pid(proc)
    rep.line(
        f"dashboard pages, ms (median / max of {REPEAT}; in brackets the server's script time "
        "per request): "
        + "; ".join(
            f"{p} {v['median_ms']:.1f} / {v['max_ms']:.1f} ({v['server_ms']:.2f})"
            for p, v in out.items()
        )
    )
    return out


def server_usec(r: Any) -> int:
    """Microseconds the server has spent running scripts (``INFO commandstats``: EVALSHA and
    EVAL, their inner commands included), which is how every delayq read is made."""
    stats = r.info("commandstats")
    return sum(int(stats.get(k, {}).get("usec", 0)) for k in ("cmdstat_evalsha", "cmdstat_eval"))


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


def figures_of(x: dict[str, Any]) -> list[tuple[str, float]]:
    """The figures compared, by label, of one set of measures."""
    d = x["drain"]
    rows = [
        ("lateness p50 ms", x["lateness"]["p50_ms"]),
        ("lateness p99 ms", x["lateness"]["p99_ms"]),
        ("lateness max ms", x["lateness"]["max_ms"]),
        ("drain tasks/s", d["tasks_per_s"]),
        ("drain: server CPU µs per task", 1e6 * d["server_cpu_s"] / max(d["done"], 1)),
        ("drain: worker CPU µs per task", 1e6 * d["worker_cpu_s"] / max(d["done"], 1)),
        ("delayq info ms (command)", x["info"]["command"]["median_ms"]),
        ("Admin.overviews() ms", x["info"]["overviews"]["median_ms"]),
    ]
    rows += [(f"page {p} ms", v["median_ms"]) for p, v in x["pages"].items()]
    return rows


def compare(
    rep: Report,
    empty: dict[str, Any],
    full: dict[str, Any],
    after: dict[str, Any],
    fill: dict[str, Any],
    n: int,
) -> None:
    rep.line()
    rep.line(
        f"{'':34s} {'empty':>10s} {f'{n:,} waiting':>18s} {'empty after':>12s} "
        f"{'size/empty':>10s} {'size/after':>10s}"
    )
    ratios = {}
    for (label, a), (_, b), (_, c) in zip(
        figures_of(empty), figures_of(full), figures_of(after), strict=True
    ):
        r1, r2 = (b / a if a else float("nan")), (b / c if c else float("nan"))
        ratios[label] = {"empty": a, "full": b, "after": c, "full/empty": r1, "full/after": r2}
        rep.line(f"{label:34s} {a:>10,.2f} {b:>18,.2f} {c:>12,.2f} {r1:>10.2f} {r2:>10.2f}")
    rep.line(
        "(empty after: the same measures on a fresh server once the run is over, a control "
        "for the machine's load drifting; the bars compare with the empty queue before)"
    )
    rep.figure("ratios", ratios)
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
