"""``delayq demo`` end to end: the orders scenario, with a worker SIGKILLed halfway."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow

SHORT = ["--duration", "4", "--rate", "25", "--close-after", "1", "--workers", "2"]


def run_demo(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", "demo", *SHORT, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "120"},  # no REDIS_URL: the embedded server
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
