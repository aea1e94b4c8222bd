"""Logs an operator can read (issue 32 item 5), from a real ``delayq worker``: a finished
task's line with its fields, tracebacks that start at the handler's frame (in the log and in
the stored ``last_error``), the shutdown's hand-back line with the ids, and the task's id,
kind and attempt on every line a handler logs (sync and async), as text and as JSON."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from delayq import Queue, Task, Worker
from delayq.embedded import EmbeddedServer
from delayq.logs import CURRENT, TaskFilter

from .conftest import ROOT
from .support.helpers import wait_for

APP = "tests.support.apps.logging_app:worker"
APP_FILE = str(ROOT / "tests" / "support" / "apps" / "logging_app.py")


def state(queue: Queue, tid: str) -> str | None:
    info = queue.get(tid)
    return info.state if info else None


def serve_and_stop(server: EmbeddedServer, queue: Queue, fmt: str) -> list[str]:
    """Run the app's worker at DEBUG: hello, hello.sync and charge each run once; then a
    slow task starts and SIGTERM stops the worker while it runs. Its stderr, by line."""
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "delayq", "worker", APP, "--url", server.url),
            *("--log-format", fmt, "--log-level", "debug"),
        ],
        cwd=ROOT,
        env={**os.environ, "DQ_QUEUE": queue.name, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: any(w.alive for w in queue.workers()), timeout=20)
        queue.schedule("hello", None, task_id="h1")
        queue.schedule("hello.sync", None, task_id="h2")
        queue.schedule("charge", None, task_id="c1")
        for tid in ("h1", "h2"):
            wait_for(lambda tid=tid: state(queue, tid) == "done", timeout=20)  # type: ignore[misc]
        wait_for(lambda: state(queue, "c1") == "dead", timeout=20)
        queue.schedule("slow", None, task_id="s1")
        queue.schedule("slow", None, task_id="s2")
        wait_for(lambda: state(queue, "s1") == state(queue, "s2") == "active", timeout=20)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    return out.splitlines()


def first_frame(traceback_text: str) -> str:
    """The file and function of a traceback's first frame."""
    m = re.search(r'Traceback \(most recent call last\):\n  File "([^"]+)", line \d+, in (\S+)',
                  traceback_text)  # fmt: skip
    assert m, traceback_text
    return f"{m[1]}:{m[2]}"


def test_json_lines_carry_the_finished_task_the_handlers_own_lines_and_the_hand_back(
    server: EmbeddedServer, queue: Queue
) -> None:
    lines = [json.loads(line) for line in serve_and_stop(server, queue, "json") if line.strip()]
    done = [d for d in lines if "succeeded in" in d["message"]]
    assert {d["task_id"] for d in done} == {"h1", "h2"}
    for d in done:
        assert d["level"] == "DEBUG" and d["logger"] == "delayq.worker"
        assert d["kind"] == {"h1": "hello", "h2": "hello.sync"}[d["task_id"]]
        assert d["attempt"] == 1 and d["queue"] == queue.name
        assert isinstance(d["duration"], float) and 0 <= d["duration"] < 5
        assert isinstance(d["lateness"], float) and -1 < d["lateness"] < 5
    # What the handlers logged on their own logger names their task.
    (mine_async,) = [d for d in lines if d["message"] == "async handler says hello"]
    (mine_sync,) = [d for d in lines if d["message"] == "sync handler says hello"]
    assert mine_async["logger"] == mine_sync["logger"] == "myapp"
    assert (mine_async["task_id"], mine_async["kind"], mine_async["attempt"]) == ("h1", "hello", 1)
    assert (mine_sync["task_id"], mine_sync["kind"], mine_sync["attempt"]) == (
        "h2",
        "hello.sync",
        1,
    )
    # A line outside any task carries none.
    assert not any("task_id" in d for d in lines if d["message"].startswith("signal received"))
    # The dead task's traceback starts at the handler's frame, not in the worker.
    (dead,) = [d for d in lines if d.get("task_id") == "c1" and d["level"] == "ERROR"]
    assert first_frame(dead["exception"]) == f"{APP_FILE}:charge_card"
    assert "delayq/worker" not in dead["exception"]
    # The shutdown says which running tasks it hands back.
    (back,) = [d for d in lines if "handing back" in d["message"]]
    assert back["level"] == "WARNING" and back["task_ids"] == ["s1", "s2"]
    assert "grace period of 0.5 s over: handing back 2 task(s) still running" in back["message"]
    assert back["message"].endswith(": s1, s2")


def test_text_lines_name_the_task_and_the_stored_error_starts_at_the_handler(
    server: EmbeddedServer, queue: Queue
) -> None:
    lines = serve_and_stop(server, queue, "text")
    text = "\n".join(lines)
    finished = (
        r"DEBUG delayq\.worker \[\d+\] \[hello h1 #1\] task h1 \(hello\) attempt 1 "
        r"succeeded in \d+\.\d{3} s, started -?\d+\.\d{3} s after its due time"
    )
    assert re.search(finished, text), text
    assert re.search(r"WARNING myapp \[\d+\] \[hello h1 #1\] async handler says hello", text), text
    assert re.search(r"WARNING myapp \[\d+\] \[hello\.sync h2 #1\] sync handler says hello", text)
    assert re.search(r"INFO delayq\.\w+ \[\d+\] signal received", text), text  # no task there
    assert re.search(r"handing back 2 task\(s\) still running, to run again: s1, s2", text), text
    # The stored last_error (what task show and the dashboard show) starts at the handler.
    info = queue.get("c1")
    assert info is not None and info.last_error is not None
    assert info.last_error.startswith("attempt 1 of 1 failed:\nTraceback"), info.last_error
    assert first_frame(info.last_error) == f"{APP_FILE}:charge_card"
    assert "delayq/worker" not in info.last_error
    assert info.last_error.rstrip().endswith("ConnectionError: card service down")


class Records(logging.Handler):
    """Records of any logger, from any thread, through a TaskFilter as a user would add it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.addFilter(TaskFilter())
        self.setFormatter(logging.Formatter("%(delayq_task_id)s|%(delayq_kind)s|"
                                            "%(delayq_attempt)s|%(message)s"))  # fmt: skip
        self.guard = threading.Lock()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with self.guard:
            self.lines.append(self.format(record))


@pytest.fixture
def records() -> Iterator[Records]:
    logger = logging.getLogger("myapp.inproc")
    handler, level = Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def test_the_task_filter_names_the_task_of_sync_async_and_retried_handlers(
    queue: Queue, run_worker: Any, records: Records
) -> None:
    mine = logging.getLogger("myapp.inproc")
    worker = Worker(queue)

    @worker.handler("a")
    async def a(task: Task) -> None:
        mine.info("in a")

    @worker.handler("s", backoff=[0.05], jitter=0)
    def s(task: Task) -> None:
        mine.info("in s")
        if task.attempt == 1:
            raise RuntimeError("again")

    with run_worker(worker):
        queue.schedule("a", None, task_id="x1")
        queue.schedule("s", None, task_id="x2")
        wait_for(lambda: state(queue, "x1") == state(queue, "x2") == "done")
    mine.info("outside")
    assert sorted(records.lines) == sorted(
        ["x1|a|1|in a", "x2|s|1|in s", "x2|s|2|in s", "|||outside"]
    )
    assert CURRENT.get() is None
