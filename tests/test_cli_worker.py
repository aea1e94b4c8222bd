"""``delayq worker --url --concurrency --lease`` as a user runs it: a real worker process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from delayq import Queue
from delayq.embedded import EmbeddedServer

from .conftest import ROOT
from .support.helpers import wait_for

APP = "tests.support.apps.cli_app:worker"
NOWHERE = "redis://127.0.0.1:1/0"  # nothing listens: a worker that used it would fail


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("DQ_FIXED_URL", "DQ_QUEUE")}
    return {**base, "DELAYQ_REDIS_URL": NOWHERE, "REDIS_URL": NOWHERE, **extra}


def delayq(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "delayq", *args],
        cwd=ROOT,
        env=env(**extra),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def worker_proc(server: EmbeddedServer, queue: Queue) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "delayq", "worker", APP, "--url", server.url),
            *("--concurrency", "3", "--lease", "7s", "--log-level", "warning"),
        ],
        cwd=ROOT,
        env=env(DQ_QUEUE=queue.name),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    if proc.stdout:
        proc.stdout.close()


def test_worker_flags_override_the_url_concurrency_and_lease_of_the_app(
    worker_proc: subprocess.Popen[str], queue: Queue
) -> None:
    # The environment names a dead URL: the worker serves this queue only through --url.
    wait_for(lambda: any(w.alive for w in queue.workers()), timeout=20)
    (info,) = queue.workers()
    assert info.concurrency == 3  # the app says 16
    tid = queue.schedule("hold", {"seconds": 4})
    wait_for(lambda: (t := queue.get(tid)) is not None and t.state == "active", timeout=10)
    task = queue.get(tid)
    assert task is not None and task.lease_deadline is not None
    left = (task.lease_deadline - queue.stats().now).total_seconds()
    assert 3 < left <= 7.5, left  # the app says 30 s
    worker_proc.send_signal(signal.SIGTERM)
    assert worker_proc.wait(30) == 0
    assert (t := queue.get(tid)) is not None and t.state == "done"


def test_worker_refuses_url_when_the_app_sets_its_own(server: EmbeddedServer) -> None:
    proc = delayq("worker", APP, "--url", server.url, DQ_FIXED_URL=NOWHERE)
    assert proc.returncode == 2, proc.stderr
    assert "url=" in proc.stderr and "127.0.0.1:1/0" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--lease", "0.5s"], "lease must be at least 1 second"),
        (["--lease", "soon"], "--lease"),
        (["--concurrency", "0"], "--concurrency"),
        (["--url", NOWHERE, "--embedded"], "not both"),
        (["--recycle-stuck", "0"], "--recycle-stuck"),
        (["--recycle-stuck", "later"], "--recycle-stuck"),
    ],
)
def test_worker_flags_refuse_bad_values(args: list[str], message: str) -> None:
    start = time.monotonic()
    proc = delayq("worker", APP, *args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert time.monotonic() - start < 30
