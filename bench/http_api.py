"""The HTTP API (``delayq api``): requests/s of single schedules, tasks/s of batches.

One ``delayq api`` process (uvicorn, one worker) in front of a private server (AOF
everysec), loaded by ``wrk`` from its own process over keep-alive connections: single
``POST /v1/queues/{queue}/tasks`` requests, then ``POST .../tasks/batch`` requests of
1,000 tasks. Each run is short (the machine is shared); the API process's and wrk's CPU
are printed beside the rates, so it shows which side was the bottleneck.

wrk is Debian's (``apt-get install -y wrk``): a C load generator, so it is not the
bottleneck (its CPU is printed).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis
from common import (
    ROOT,
    Report,
    client,
    fresh_server,
    proc_cpu,
    server_cpu,
    short_version,
    stop_pid,
)

from delayq.embedded import free_port

NAME = "http"
TITLE = "the HTTP API: single schedule requests/s and batch tasks/s (wrk, keep-alive)"

DURATION = 5  # seconds per wrk run (--quick: 2)
CONNECTIONS = 32  # single requests: concurrent keep-alive connections
BATCH = 1000
BATCH_CONNECTIONS = 8
SINGLE_BAR = 3000.0
BATCH_BAR = 40_000.0
TOKEN = secrets.token_urlsafe(24)

_LUA = """wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {token}"
"""


def _script(path: Path, body: dict[str, object]) -> str:
    text = json.dumps(json.dumps(body, separators=(",", ":")))  # a Lua string literal
    path.write_text(_LUA.format(body=text, token=TOKEN))
    return str(path)


def _wrk(url: str, script: str, connections: int, seconds: int) -> tuple[float, int, int, float]:
    """(requests/s, requests, non-2xx responses, wrk's CPU seconds)."""
    cmd = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-s", script, url]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out, _ = proc.communicate(timeout=seconds + 30)
    finally:
        stop_pid(proc)
    children = os.times()
    text = out.decode(errors="replace")
    rate = re.search(r"Requests/sec:\s+([\d.]+)", text)
    total = re.search(r"(\d+) requests in", text)
    bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
    if rate is None or total is None:
        raise RuntimeError(f"cannot read wrk's output:\n{text}")
    return (
        float(rate.group(1)),
        int(total.group(1)),
        int(bad.group(1)) if bad else 0,
        children.children_user + children.children_system,
    )


def run(rep: Report) -> None:
    if shutil.which("wrk") is None:
        raise RuntimeError("wrk is not installed: apt-get install -y wrk (Debian)")
    seconds = 2 if rep.quick else DURATION
    with fresh_server() as srv, tempfile.TemporaryDirectory() as tmp:
        token_file = Path(tmp) / "token"
        token_file.write_text(TOKEN)
        port = free_port()
        api = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "delayq",
                "api",
                "--url",
                srv.url,
                "--port",
                str(port),
                "--token-file",
                str(token_file),
                "--log-level",
                "warning",
            ],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            base = f"http://127.0.0.1:{port}"
            _wait(base, api)
            rep.line(f"server {short_version(srv)} (AOF everysec); one delayq api process")
            meter = client(srv.url)
            try:
                single(rep, base, api, meter, Path(tmp), seconds)
                batch(rep, base, api, meter, Path(tmp), seconds)
            finally:
                meter.close()
        finally:
            stop_pid(api)


def _wait(base: str, api: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if api.poll() is not None:
            raise RuntimeError(f"delayq api exited with {api.returncode}")
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError("delayq api did not answer /healthz within 30 s")


def _measure(
    rep: Report,
    api: subprocess.Popen[bytes],
    meter: redis.Redis,
    url: str,
    script: str,
    conns: int,
    seconds: int,
) -> tuple[float, int]:
    _wrk(url, script, conns, 1)  # warm up: connections, the script loaded, the queue opened
    cpu0, wrk0, t0 = proc_cpu(api.pid), _children_cpu(), time.monotonic()
    srv0 = server_cpu(meter)
    rate, total, bad, _ = _wrk(url, script, conns, seconds)
    wall = time.monotonic() - t0
    api_cpu, wrk_cpu = proc_cpu(api.pid) - cpu0, _children_cpu() - wrk0
    srv_cpu = server_cpu(meter) - srv0
    rep.line(
        f"  {total:,} requests in {seconds} s over {conns} connections: {rate:,.0f}/s; "
        f"non-2xx {bad}"
    )
    rep.line(
        f"  CPU: delayq api {100 * api_cpu / wall:.0f}% ({1e6 * api_cpu / total:,.0f} us a "
        f"request), server {100 * srv_cpu / wall:.0f}% ({1e6 * srv_cpu / total:,.0f} us), wrk "
        f"{100 * wrk_cpu / wall:.0f}%; machine load {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )
    rep.figure(f"api_cpu_us_per_request_c{conns}", round(1e6 * api_cpu / total))
    if bad:
        raise RuntimeError(f"{bad} requests were refused")
    return rate, total


def _children_cpu() -> float:
    t = os.times()
    return t.children_user + t.children_system


def single(
    rep: Report,
    base: str,
    api: subprocess.Popen[bytes],
    meter: redis.Redis,
    tmp: Path,
    seconds: int,
) -> None:
    queue = f"http-{secrets.token_hex(3)}"
    body = {"kind": "order.close", "payload": {"order": 123456, "user": 42}, "delay": 3600}
    script = _script(tmp / "single.lua", body)
    rep.line(f"single POST /v1/queues/{queue}/tasks, body {json.dumps(body)}")
    url = f"{base}/v1/queues/{queue}/tasks"
    rate, _ = _measure(rep, api, meter, url, script, CONNECTIONS, seconds)
    rep.figure("single_requests_per_s", round(rate))
    rep.bar("single POST schedule", rate, ">=", SINGLE_BAR, "requests/s")


def batch(
    rep: Report,
    base: str,
    api: subprocess.Popen[bytes],
    meter: redis.Redis,
    tmp: Path,
    seconds: int,
) -> None:
    queue = f"http-batch-{secrets.token_hex(3)}"
    task = {"kind": "order.close", "payload": {"order": 123456, "user": 42}, "delay": 3600}
    script = _script(tmp / "batch.lua", {"tasks": [task] * BATCH})
    rep.line(f"batch POST /v1/queues/{queue}/tasks/batch, {BATCH} tasks a request")
    url = f"{base}/v1/queues/{queue}/tasks/batch"
    rate, _ = _measure(rep, api, meter, url, script, BATCH_CONNECTIONS, seconds)
    tasks = rate * BATCH
    rep.figure("batch_tasks_per_s", round(tasks))
    rep.bar("batch POST schedule", tasks, ">=", BATCH_BAR, "tasks/s")
