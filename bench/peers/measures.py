"""The measures, each run for one peer against fresh private servers, each bounded in time.

Every worker and producer runs in its own process (``worker_main.py``,
``producer_main.py``), registered with ``common`` so it is stopped by PID when the measure
ends, on Ctrl-C/SIGTERM and at exit. Handler starts come back through the worker's record
file (``<id> <due> <start>`` per line), read by this process as they arrive.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common import (
    ROOT,
    _live_procs,  # the PID bookkeeping shared with the delayq-only suite
    client,
    fresh_server,
    percentile,
    proc_cpu,
    server_cpu,
    stop_pid,
)
from idle import Monitor

PEERS_DIR = Path(__file__).resolve().parent
SETTLE = 2.0  # after a worker says it is up, before tasks are produced


@dataclass(frozen=True)
class Sizes:
    schedule_n: int = 20_000
    lateness_n: int = 2_000
    lateness_span: float = 10.0
    lateness_grace: float = 30.0  # a task not started this long after the last due is missing
    drain_n: int = 20_000
    drain_limit: float = 60.0  # seconds after the due instant
    idle_n: int = 10_000
    idle_window: float = 30.0
    idle_settle: tuple[float, float] = (5.0, 30.0)  # min, max wait for the worker to settle
    produce_limit: float = 120.0
    single_n: int = 5_000  # one call per task, each timed
    scale: tuple[int, ...] = (100_000, 1_000_000)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(
            schedule_n=2_000,
            lateness_n=500,
            lateness_span=5.0,
            lateness_grace=15.0,
            drain_n=2_000,
            drain_limit=20.0,
            idle_n=1_000,
            idle_window=5.0,
            idle_settle=(2.0, 10.0),
            produce_limit=30.0,
            single_n=500,
            scale=(10_000, 100_000),
        )


@dataclass
class Context:
    sizes: Sizes
    logdir: Path
    server: str = "valkey"  # common.server_binary's flavour: "valkey" or "redis"
    rates: dict[str, float] = field(default_factory=dict)  # schedule rate per peer

    def log(self, peer: str, measure: str) -> Path:
        return self.logdir / f"{self.server}-{peer}-{measure}.log"

    def lead(self, peer: str, n: int) -> float:
        """How far ahead to put the first due time so producing n tasks finishes first."""
        rate = self.rates.get(peer) or 1000.0
        return max(3.0, 3.0 + 2.0 * n / rate)


class MeasureError(RuntimeError):
    pass


def _tail(path: Path, lines: int = 6) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(line.strip() for line in text[-lines:] if line.strip())[-600:]


# -- processes --------------------------------------------------------------------------------


class PeerWorker:
    """One peer's worker (``worker_main.py``) in its own process; handler starts read back."""

    def __init__(self, peer: str, url: str, log: Path, max_seconds: float = 900) -> None:
        fd, self.out = tempfile.mkstemp(prefix=f"peers-{peer}-", suffix=".rec")
        os.close(fd)
        self.ready_path = self.out + ".ready"
        self.peer, self.url, self.log, self.max_seconds = peer, url, log, max_seconds
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts: list[tuple[str, float, float]] = []  # (id, due, start)
        self._pos = 0
        self._partial = b""

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = 60.0) -> PeerWorker:
        argv = [
            sys.executable,
            str(PEERS_DIR / "worker_main.py"),
            *("--peer", self.peer, "--url", self.url, "--out", self.out),
            *("--ready", self.ready_path, "--max-seconds", str(self.max_seconds)),
        ]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
            )
        _live_procs[self.proc.pid] = self.proc
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if os.path.exists(self.ready_path):
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        code = self.proc.poll()
        self.stop()
        why = f"exited {code}" if code is not None else f"not up within {timeout:g} s"
        raise MeasureError(f"{self.peer} worker {why}: {_tail(self.log)}")

    def read(self) -> int:
        """Take in the starts recorded since the last call; returns how many there are."""
        try:
            with open(self.out, "rb") as f:
                f.seek(self._pos)
                data = f.read()
        except OSError:
            return len(self.starts)
        self._pos += len(data)
        data = self._partial + data
        *lines, self._partial = data.split(b"\n")
        for line in lines:
            tid, due, start = line.split()
            self.starts.append((tid.decode(), float(due), float(start)))
        return len(self.starts)

    def wait_for(self, count: int, until: float, interval: float = 0.05) -> bool:
        """Wait until ``count`` starts are recorded or wall-clock ``until`` passes."""
        while time.time() < until:
            if self.read() >= count:
                return True
            if self.proc is not None and self.proc.poll() is not None:
                raise MeasureError(
                    f"{self.peer} worker died (exit {self.proc.returncode}): {_tail(self.log)}"
                )
            time.sleep(interval)
        return self.read() >= count

    def stop(self, timeout: float = 30.0) -> int | None:
        code = None
        if self.proc is not None:
            code = stop_pid(self.proc, timeout=timeout)
            if self.proc.stdin:
                with contextlib.suppress(OSError):
                    self.proc.stdin.close()
        self.read()
        for p in (self.out, self.ready_path):
            with contextlib.suppress(OSError):
                os.unlink(p)
        return code

    def __enter__(self) -> PeerWorker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def produce(
    ctx: Context,
    peer: str,
    url: str,
    n: int,
    *,
    due_base: float | None = None,
    delay_base: float | None = None,
    span: float = 0.0,
    loop: bool = False,
    single: bool = False,
    variant: str | None = None,
    max_seconds: float | None = None,
    measure: str = "produce",
) -> dict[str, Any]:
    """Run ``producer_main.py`` for ``peer`` (its own process); returns its JSON report."""
    limit = ctx.sizes.produce_limit if max_seconds is None else max_seconds
    fd, out = tempfile.mkstemp(prefix=f"peers-{peer}-", suffix=".json")
    os.close(fd)
    argv = [
        sys.executable,
        str(PEERS_DIR / "producer_main.py"),
        *("--peer", peer, "--url", url, "--n", str(n), "--span", str(span)),
        *("--max-seconds", str(limit), "--out", out),
    ]
    argv += ["--due-base", repr(due_base)] if due_base is not None else []
    argv += ["--delay-base", repr(delay_base)] if delay_base is not None else []
    argv += ["--loop"] if loop else []
    argv += ["--single"] if single else []
    argv += ["--variant", variant] if variant else []
    log = ctx.log(peer, measure)
    with open(log, "ab") as logf:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT, cwd=ROOT
        )
    _live_procs[proc.pid] = proc
    try:
        proc.wait(timeout=limit + 60)
    except subprocess.TimeoutExpired:
        pass
    finally:
        code = stop_pid(proc, timeout=5)
    try:
        if code != 0:
            raise MeasureError(f"{peer} producer exited {code}: {_tail(log)}")
        with open(out) as f:
            rep: dict[str, Any] = json.load(f)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(out)
    return rep


# -- numbers ----------------------------------------------------------------------------------


def lateness_stats(starts: list[tuple[str, float, float]], n: int) -> dict[str, Any]:
    """Handler start - due over all n tasks; a task never started counts as infinitely late."""
    first: dict[str, float] = {}
    runs: Counter[str] = Counter()
    for tid, due, start in starts:
        runs[tid] += 1
        late = start - due
        if tid not in first or late < first[tid]:
            first[tid] = late
    lat = sorted(x * 1000 for x in first.values())
    missing = max(0, n - len(first))
    full = lat + [math.inf] * missing
    return {
        "n": n,
        "started": len(first),
        "missing": missing,
        "duplicated": sum(1 for c in runs.values() if c > 1),
        "extra_runs": sum(c - 1 for c in runs.values() if c > 1),
        "p50_ms": percentile(full, 50),
        "p95_ms": percentile(full, 95),
        "p99_ms": percentile(full, 99),
        "max_ms": full[-1] if full else math.nan,
        "min_ms": lat[0] if lat else math.nan,
        "early": sum(1 for x in lat if x < -1.0),  # started more than 1 ms before due
    }


# -- the measures -------------------------------------------------------------------------------


def m_schedule(ctx: Context, peer: str) -> dict[str, Any]:
    """One producer schedules N tasks with delays spread over 5-15 s (no worker running)."""
    n = ctx.sizes.schedule_n
    with fresh_server(ctx.server) as srv:
        rep = produce(ctx, peer, srv.url, n, delay_base=5.0, span=10.0, measure="schedule")
    rate = rep["sent"] / rep["elapsed"]
    ctx.rates[peer] = rate
    out: dict[str, Any] = {
        "n": n,
        "sent": rep["sent"],
        "seconds": rep["elapsed"],
        "tasks_per_s": rate,
        "complete": rep["complete"],
    }
    if peer == "delayq":  # the per-call figure, for an honest comparison with one-call APIs
        with fresh_server(ctx.server) as srv:
            rep = produce(
                ctx, peer, srv.url, n, delay_base=5.0, span=10.0, loop=True, measure="schedule"
            )
        out["loop_tasks_per_s"] = rep["sent"] / rep["elapsed"]
    return out


def _single(ctx: Context, peer: str, variant: str | None = None) -> dict[str, Any]:
    n = ctx.sizes.single_n
    with fresh_server(ctx.server) as srv:
        rep = produce(
            ctx,
            peer,
            srv.url,
            n,
            delay_base=5.0,
            span=10.0,
            single=True,
            variant=variant,
            measure="single",
        )
        version = srv.version  # type: ignore[attr-defined]
    lat = sorted(1e6 * x for x in rep["latencies_s"])
    return {
        "server": version,
        "n": rep["n"],
        "sent": rep["sent"],
        "complete": rep["complete"],
        "tasks_per_s": rep["sent"] / rep["elapsed"] if rep["elapsed"] > 0 else math.nan,
        "p50_us": percentile(lat, 50),
        "p99_us": percentile(lat, 99),
        "mean_us": sum(lat) / len(lat) if lat else math.nan,
    }


def m_single(ctx: Context, peer: str) -> dict[str, Any]:
    """One producer, one call per task (delays 5-15 s, no worker), each call timed.

    delayq: ``Queue.schedule`` (sync), and ``await AsyncQueue.schedule`` under ``async``.
    """
    if peer == "delayq":
        out = _single(ctx, peer, "sync")
        out["async"] = _single(ctx, peer, "async")
        return out
    return _single(ctx, peer)


def m_lateness(ctx: Context, peer: str) -> dict[str, Any]:
    """N tasks due uniformly over S seconds, one worker process: handler start - due."""
    n, span = ctx.sizes.lateness_n, ctx.sizes.lateness_span
    with fresh_server(ctx.server) as srv:
        worker = PeerWorker(peer, srv.url, ctx.log(peer, "lateness")).start()
        try:
            time.sleep(SETTLE)
            lead = ctx.lead(peer, n)
            due_base = time.time() + lead
            rep = produce(ctx, peer, srv.url, n, due_base=due_base, span=span, measure="lateness")
            worker.wait_for(n, until=due_base + span + ctx.sizes.lateness_grace)
            time.sleep(0.5)  # a duplicate right behind the last start would still show
        finally:
            worker.stop()
    out = lateness_stats(worker.starts, n)
    out.update(lead_s=lead, produce_s=rep["elapsed"], producer_overran=rep["elapsed"] > lead)
    return out


def m_drain(ctx: Context, peer: str) -> dict[str, Any]:
    """N no-op tasks due at one instant while one worker process runs: tasks/s."""
    n = ctx.sizes.drain_n
    with fresh_server(ctx.server) as srv:
        meter = client(srv.url)
        worker = PeerWorker(peer, srv.url, ctx.log(peer, "drain")).start()
        try:
            time.sleep(SETTLE)
            lead = ctx.lead(peer, n)
            due = time.time() + lead
            rep = produce(ctx, peer, srv.url, n, due_base=due, measure="drain")
            time.sleep(max(0.0, due - time.time() - 0.5))
            cpu0, wcpu0, calls0 = server_cpu(meter), proc_cpu(worker.pid), _calls(meter)
            done = worker.wait_for(n, until=due + ctx.sizes.drain_limit, interval=0.02)
            time.sleep(0.2)  # the last acks
            scpu = server_cpu(meter) - cpu0
            wcpu = proc_cpu(worker.pid) - wcpu0
            calls = _calls(meter) - calls0 - 2  # less our two INFO calls in between
        finally:
            worker.stop()
            meter.close()
    firsts: dict[str, float] = {}
    for tid, _, start in worker.starts:
        firsts.setdefault(tid, start)
    times = sorted(firsts.values())
    count = len(times)
    span = times[-1] - times[0] if count > 1 else math.nan
    stats = lateness_stats(worker.starts, n)
    return {
        "n": n,
        "started": count,
        "complete": done and count >= n,
        "seconds": span,
        "tasks_per_s": count / span if count > 1 and span > 0 else math.nan,
        "first_start_after_due_s": times[0] - due if times else math.nan,
        "last_start_after_due_s": times[-1] - due if times else math.nan,
        "duplicated": stats["duplicated"],
        "server_cpu_s": scpu,
        "worker_cpu_s": wcpu,  # the worker process alone (RQ's forked work horses not included)
        "server_commands_per_task": calls / max(count, 1),
        "lead_s": lead,
        "produce_s": rep["elapsed"],
        "producer_overran": rep["elapsed"] > lead,
    }


def _calls(r: Any) -> int:
    """Commands the server has executed (INFO commandstats: inside scripts too)."""
    return sum(int(v["calls"]) for v in r.info("commandstats").values())


def _used(r: Any) -> int:
    return int(r.info("memory")["used_memory"])


def _settle_memory(r: Any, lo: float, hi: float) -> float:
    """Wait at least ``lo`` s, then until used_memory holds within 0.5% for 1 s (<= ``hi``)."""
    t0 = time.monotonic()
    time.sleep(lo)
    prev = _used(r)
    while time.monotonic() - t0 < hi:
        time.sleep(1.0)
        cur = _used(r)
        if abs(cur - prev) <= 0.005 * max(prev, 1):
            break
        prev = cur
    return time.monotonic() - t0


def m_idle(ctx: Context, peer: str) -> dict[str, Any]:
    """One idle worker with N tasks due in an hour: commands/s it costs, and bytes per task.

    AOF off (no AOF buffers in used_memory). The memory baseline is taken with the worker
    connected; the producer's process has exited before the second reading. Commands are
    counted two ways over the window: sent by clients (MONITOR; commands run inside a
    script are marked and left out) and executed (INFO commandstats deltas, which include
    commands run inside scripts), both without this process's own.
    """
    n, window = ctx.sizes.idle_n, ctx.sizes.idle_window
    with fresh_server(ctx.server, appendonly=False) as srv:
        meter = client(srv.url)
        own = meter.client_info()["addr"]
        own = own.decode() if isinstance(own, bytes) else str(own)
        worker = PeerWorker(peer, srv.url, ctx.log(peer, "idle")).start()
        mon: Monitor | None = None
        try:
            time.sleep(SETTLE)
            base = _used(meter)
            rep = produce(ctx, peer, srv.url, n, delay_base=3600.0, span=60.0, measure="idle")
            settled = _settle_memory(meter, *ctx.sizes.idle_settle)
            used = _used(meter)
            keys = int(meter.dbsize())
            mon = Monitor(srv.host, srv.port)
            mon.start()
            time.sleep(0.5)
            cpu0 = server_cpu(meter)
            before = meter.info("commandstats")
            w0 = time.time()
            time.sleep(window)
            w1 = time.time()
            after = meter.info("commandstats")
            scpu = server_cpu(meter) - cpu0
        finally:
            worker.stop()
            if mon is not None:
                mon.stop()
            meter.close()
    worker.read()
    assert mon is not None
    sent = [(t, c) for t, a, c in mon.seen if a not in ("lua", own) and w0 <= t <= w1]
    inner = sum(1 for t, a, _ in mon.seen if a == "lua" and w0 <= t <= w1)
    b = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in before.items()}
    a = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in after.items()}
    delta = {k: a[k] - b.get(k, 0) for k in a if a[k] - b.get(k, 0)}
    # Ours between the two commandstats replies: the first one (a reply counts the calls
    # before it, not itself).
    delta["info"] = delta.get("info", 0) - 1
    delta = {k: v for k, v in delta.items() if v}
    length = w1 - w0
    return {
        "n": n,
        "window_s": length,
        "sent_per_s": len(sent) / length,
        "executed_per_s": sum(delta.values()) / length,
        "inside_scripts_per_s": inner / length,
        "server_cpu_ms_per_s": 1000 * scpu / length,  # MONITOR's own feed included
        "sent_by_command": dict(Counter(c for _, c in sent).most_common(8)),
        "commandstats_delta": delta,
        "bytes_per_task": (used - base) / n,
        "used_memory_delta": used - base,
        "keys": keys,
        "settle_s": settled,
        "produce_s": rep["elapsed"],
        "started_while_idle": len(worker.starts),
    }


def m_scale(ctx: Context) -> dict[str, Any]:
    """delayq alone with M tasks already waiting (due in 2 h): lateness and claim rate."""
    from delayq import Queue, TaskSpec

    out: dict[str, Any] = {}
    for m in ctx.sizes.scale:
        row: dict[str, Any] = {"waiting": m}
        with fresh_server(ctx.server) as srv:
            meter = client(srv.url)
            with Queue("bench", url=srv.url) as q:
                t = time.perf_counter()
                chunk = 50_000
                for start in range(0, m, chunk):
                    q.schedule_many(
                        TaskSpec("bench.filler", {"i": i}, delay=7200 + i / m * 3600)
                        for i in range(start, min(m, start + chunk))
                    )
                row["fill_s"] = time.perf_counter() - t
                row["fill_tasks_per_s"] = m / row["fill_s"]
            row["used_memory_mib"] = _used(meter) / 2**20
            worker = PeerWorker("delayq", srv.url, ctx.log("delayq", f"scale-{m}")).start()
            try:
                time.sleep(SETTLE)
                n, span = ctx.sizes.lateness_n, ctx.sizes.lateness_span
                lead = ctx.lead("delayq", n)
                due_base = time.time() + lead
                produce(ctx, "delayq", srv.url, n, due_base=due_base, span=span, measure="scale")
                worker.wait_for(n, until=due_base + span + ctx.sizes.lateness_grace)
                time.sleep(0.5)
                worker.read()
                row["lateness"] = lateness_stats(worker.starts, n)
                worker.starts.clear()

                d = ctx.sizes.drain_n
                lead = ctx.lead("delayq", d)
                due = time.time() + lead
                produce(ctx, "delayq", srv.url, d, due_base=due, measure="scale")
                time.sleep(max(0.0, due - time.time() - 0.5))
                s0 = meter.info("commandstats").get("cmdstat_evalsha", {})
                done = worker.wait_for(d, until=due + ctx.sizes.drain_limit, interval=0.02)
                s1 = meter.info("commandstats").get("cmdstat_evalsha", {})
            finally:
                worker.stop()
            meter.close()
        times = sorted(s for _, _, s in worker.starts)
        span_s = times[-1] - times[0] if len(times) > 1 else math.nan
        calls = int(s1.get("calls", 0)) - int(s0.get("calls", 0))
        usec = int(s1.get("usec", 0)) - int(s0.get("usec", 0))
        row["drain"] = {
            "n": d,
            "started": len(times),
            "complete": done,
            "tasks_per_s": len(times) / span_s if span_s and span_s > 0 else math.nan,
            "script_calls": calls,
            "usec_per_script_call": usec / calls if calls else math.nan,
        }
        out[str(m)] = row
    return out


MEASURES = {
    "schedule": m_schedule,
    "single": m_single,
    "lateness": m_lateness,
    "drain": m_drain,
    "idle": m_idle,  # also memory: bytes per waiting task
}
