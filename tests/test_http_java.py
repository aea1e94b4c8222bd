"""``examples/java/CloseOrder.java``, the Java example of ``docs/http.md``, run as a Spring
shop would run it: ``java CloseOrder.java`` (the JDK's default ``HttpClient``, HTTP/2
preferred, so every request offers ``Upgrade: h2c``) against a real ``delayq api`` process,
with a real worker running the tasks it schedules."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from delayq import Queue, Worker
from delayq.embedded import EmbeddedServer

from .conftest import ROOT
from .test_http_protocol import TOKEN, api_process, server  # noqa: F401 (fixtures)

EXAMPLE = ROOT / "examples" / "java" / "CloseOrder.java"


@pytest.mark.skipif(
    shutil.which("java") is None, reason="no java on PATH (apt install openjdk-17-jdk-headless)"
)
def test_the_java_example_schedules_cancels_and_reschedules(
    api_process: Any,  # noqa: F811
    server: EmbeddedServer,  # noqa: F811
    qname: str,
    run_worker: Callable[[Worker], Any],
) -> None:
    api = api_process()
    ran: dict[str, tuple[float, float]] = {}  # id -> (when it ran, its due time), epoch s
    payloads: dict[str, Any] = {}  # id -> the payload its handler got
    lock = threading.Lock()
    with Queue(qname, url=server.url) as q:
        worker = Worker(q, concurrency=4)

        @worker.handler("order.close")
        def close(task: Any) -> None:
            with lock:
                ran[task.id] = (time.time(), task.due_at.timestamp())
                payloads[task.id] = task.payload

        with run_worker(worker):
            started = time.time()
            proc = subprocess.run(
                ["java", str(EXAMPLE), api.base, TOKEN, qname],
                capture_output=True,
                text=True,
                timeout=110,
            )
            patched = time.time()  # the PATCH was sent before this
            assert proc.returncode == 0, proc.stderr + proc.stdout
            lines = proc.stdout.splitlines()
            assert [line.split(" ", 3)[:3] for line in lines] == [
                ["placed", "1001:", "201"],
                ["placed", "1002:", "201"],
                ["placed", "1003:", "201"],
                ["paid", "1002:", "204"],
                ["extended", "1003:", "200"],
            ], proc.stdout
            deadline = time.monotonic() + 60
            while len(ran) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1)  # a cancelled task that ran anyway would show up meanwhile
        assert sorted(ran) == ["order-close:1001", "order-close:1003"], ran
        gone = q.get("order-close:1002")  # cancelled: never ran, remembered as cancelled
        assert gone is not None and gone.state == "cancelled"
        for when, due in ran.values():
            assert when >= due, "ran before its due time"
        when, due = ran["order-close:1003"]
        # at its new time (4 s after the PATCH), not the hour first asked for
        assert started + 4 <= due <= patched + 4 + 1 and when < due + 30, (started, due, when)
        info = q.get("order-close:1003")
        # (a done task keeps a tombstone, not its payload: issue 30)
        assert info is not None and info.state == "done"
        assert payloads["order-close:1003"] == {"order_id": 1003}
