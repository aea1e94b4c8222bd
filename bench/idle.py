"""Idle cost: the commands one idle worker process sends to Redis on an empty queue.

A MONITOR connection (a raw socket, so it adds nothing to the count) sees every command a
client sends, and marks the ones run inside a Lua script ``[0 lua]``; those are not sent
by the worker and are not counted (the executed rate, which counts them, is shown too). On
Valkey 8 (bundled) and on Redis 7.0 (/usr/bin/redis-server), each fresh. The worker is
started, given 2 s to settle (its start-up commands are reported apart), then watched for
30 s. Cross-checks: ``INFO commandstats``
per-command deltas and the ``total_commands_processed`` delta, less this benchmark's own
INFO calls (that total also counts commands run inside scripts).
"""

from __future__ import annotations

import re
import secrets
import socket
import threading
import time
from collections import Counter

from common import Report, WorkerProcess, client, fresh_server, short_version

from delayq.embedded import EmbeddedServer

NAME = "idle"
TITLE = "Idle worker: commands sent per second on an empty queue"

WINDOW = 30.0
SETTLE = 2.0
BAR_PER_S = 1.0
# Issue 22's bar: commands executed per idle worker, those inside scripts counted.
BAR_EXECUTED_PER_S = 0.5

_LINE = re.compile(rb'^\+(\d+\.\d+) \[\d+ ([^\]]+)\] "([^"]*)"')


class Monitor(threading.Thread):
    """Collects (server time, client address, command) for every command the server runs."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(daemon=True)
        self.sock = socket.create_connection((host, port), timeout=5)
        self.sock.sendall(b"MONITOR\r\n")
        self.buf = b""
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(4096)
        first, _, self.buf = self.buf.partition(b"\r\n")
        if first != b"+OK":
            raise RuntimeError(f"MONITOR refused: {first!r}")
        self.sock.settimeout(0.2)
        self.seen: list[tuple[float, str, str]] = []
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            try:
                data = self.sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if not data:
                return
            self.buf += data
            *lines, self.buf = self.buf.split(b"\r\n")
            for line in lines:
                m = _LINE.match(line)
                if m:
                    self.seen.append((float(m[1]), m[2].decode(), m[3].decode().lower()))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self.sock.close()


def _top_level(stats: dict[str, dict[str, int]]) -> dict[str, int]:
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


SERVERS = ("valkey", "redis")  # Valkey 8 (bundled) and Redis 7.0 (/usr/bin/redis-server)


def run(rep: Report) -> None:
    for flavour in SERVERS:
        one(rep, flavour)


def one(rep: Report, flavour: str) -> None:
    window = WINDOW * rep.scale
    name = f"idle-{secrets.token_hex(3)}"
    with fresh_server(flavour) as srv:
        meter = client(srv.url)
        own_addr = meter.client_info()["addr"]
        own_addr = own_addr.decode() if isinstance(own_addr, bytes) else str(own_addr)
        mon = Monitor(srv.host, srv.port)
        mon.start()
        worker = WorkerProcess(srv.url, name, mode="async", concurrency=16)
        try:
            worker.start()
            time.sleep(SETTLE)
            # Each INFO reply counts the commands before it, not itself.
            before = meter.info("commandstats")
            total0 = int(meter.info("stats")["total_commands_processed"])
            w0 = time.time()
            time.sleep(window)
            w1 = time.time()
            total1 = int(meter.info("stats")["total_commands_processed"])
            after = meter.info("commandstats")
        finally:
            report = worker.stop()
            mon.stop()
        report_idle(
            rep, srv, mon, own_addr, (w0, w1), (before, after), total1 - total0, report, flavour
        )
        meter.close()


def report_idle(
    rep: Report,
    srv: EmbeddedServer,
    mon: Monitor,
    own_addr: str,
    window: tuple[float, float],
    stats: tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]],
    total_delta: int,
    worker_report: dict[str, object],
    flavour: str = "valkey",
) -> None:
    w0, w1 = window
    length = w1 - w0
    sent = [(t, a, c) for t, a, c in mon.seen if a != "lua" and a != own_addr]
    startup = Counter(c for t, _, c in sent if t < w0)
    inside = [(t, c) for t, _, c in sent if w0 <= t <= w1]
    by_cmd = Counter(c for _, c in inside)
    lua_inside = sum(1 for t, a, _ in mon.seen if a == "lua" and w0 <= t <= w1)
    rate = len(inside) / length
    times = [t for t, _ in inside]
    interval = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")

    b, a = (_top_level(s) for s in stats)
    delta = {k: a.get(k, 0) - b.get(k, 0) for k in a}
    # Between the two commandstats replies we sent three INFOs (the first commandstats and
    # both INFO stats); between the two INFO stats replies, one (the first INFO stats).
    delta["info"] = delta.get("info", 0) - 3
    delta = {k: v for k, v in delta.items() if v}
    total_less_ours = total_delta - 1

    rep.line(
        f"{short_version(srv)}: one idle worker (async, concurrency 16), empty queue, "
        f"watched {length:.1f} s after a {SETTLE:g} s settle"
    )
    rep.line(f"start-up commands (before the window): {dict(startup)}")
    rep.line(
        f"commands sent in the window: {len(inside)} = {rate:.3f}/s "
        f"(mean interval {interval:.3f} s); by command: {dict(by_cmd)}"
    )
    rep.line(
        f"cross-checks: INFO commandstats delta less our INFO: {delta}; "
        f"total_commands_processed delta less ours: {total_less_ours} "
        f"(includes {lua_inside} commands run inside scripts, which MONITOR saw)"
    )
    rep.line(f"commands executed, those inside scripts included: {total_less_ours / length:.3f}/s")
    rep.figure(
        "idle" if flavour == "valkey" else f"idle_{flavour}",
        {
            "window_s": length,
            "commands": len(inside),
            "per_s": rate,
            "mean_interval_s": interval,
            "by_command": dict(by_cmd),
            "startup": dict(startup),
            "lua_inner": lua_inside,
            "commandstats_delta": delta,
            "total_commands_processed_delta": total_less_ours,
            "executed_per_s": total_less_ours / length,
            "server": short_version(srv),
            "worker_started_tasks": worker_report.get("started"),
        },
    )
    rep.bar(f"idle worker commands per second ({flavour})", rate, "<=", BAR_PER_S, "cmd/s")
    rep.bar(
        f"idle worker commands executed per second ({flavour})",
        total_less_ours / length,
        "<=",
        BAR_EXECUTED_PER_S,
        "cmd/s",
    )
