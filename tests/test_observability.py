"""Logs a person can use: each failed attempt one WARNING record, the attempt that leaves a
task dead one ERROR record, both with the traceback (``exc_info``) and the task's fields;
``delayq worker --log-format json``; and Sentry's logging integration seeing the stack."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

from delayq import Queue, Task, Worker
from delayq.embedded import EmbeddedServer
from delayq.logs import JsonFormatter

from .conftest import ROOT
from .support.helpers import wait_for

APP = "tests.support.apps.failing_app:worker"


class Records(logging.Handler):
    """The records of one logger, from any thread."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.guard = threading.Lock()
        self.items: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        with self.guard:
            self.items.append(record)

    def about(self, task_id: str) -> list[logging.LogRecord]:
        with self.guard:
            return [r for r in self.items if getattr(r, "task_id", None) == task_id]


@pytest.fixture
def worker_records() -> Iterator[Records]:
    logger = logging.getLogger("delayq.worker")
    records, level = Records(), logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    yield records
    logger.removeHandler(records)
    logger.setLevel(level)


def state(queue: Queue, tid: str) -> str | None:
    info = queue.get(tid)
    return info.state if info else None


def failing_worker(queue: Queue, max_attempts: int) -> Worker:
    worker = Worker(queue)

    @worker.handler("charge", max_attempts=max_attempts, backoff=[0.05], jitter=0)
    def charge_card(task: Task) -> None:
        raise ConnectionError(f"card service down (attempt {task.attempt})")

    return worker


def test_a_retried_attempt_warns_and_the_dying_one_errs_each_with_its_traceback(
    queue: Queue, run_worker: Any, worker_records: Records
) -> None:
    with run_worker(failing_worker(queue, max_attempts=2)):
        queue.schedule("charge", None, task_id="c1")
        wait_for(lambda: state(queue, "c1") == "dead")
        wait_for(lambda: any(r.levelno == logging.ERROR for r in worker_records.about("c1")))
    records = worker_records.about("c1")
    assert [(r.levelname, r.attempt) for r in records] == [  # type: ignore[attr-defined]
        ("WARNING", 1),
        ("ERROR", 2),
    ]
    for r in records:
        assert (r.task_id, r.kind, r.queue) == ("c1", "charge", queue.name)  # type: ignore[attr-defined]
        assert r.exc_info is not None and isinstance(r.exc_info[1], ConnectionError)
        text = "".join(traceback.format_exception(*r.exc_info))
        assert "in charge_card" in text and "card service down" in text
    warning, error = records
    assert "attempt 1 of 2 failed, will retry: ConnectionError" in warning.getMessage()
    assert "is dead: attempt 2 of 2 failed: ConnectionError" in error.getMessage()
    assert "Traceback" not in error.getMessage()  # the stack is in exc_info, not the message


def test_json_formatter_writes_the_fields_and_the_exception() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = logging.getLogger("x").makeRecord(
            "x", logging.ERROR, __file__, 1, "task %s failed", ("t1",), sys.exc_info(),
            extra={"task_id": "t1", "kind": "k", "attempt": 3, "queue": "q"},
        )  # fmt: skip
    line = JsonFormatter().format(record)
    assert "\n" not in line
    data = json.loads(line)
    assert data["level"] == "ERROR" and data["logger"] == "x"
    assert data["message"] == "task t1 failed" and data["time"].endswith("+00:00")
    assert (data["task_id"], data["kind"], data["attempt"], data["queue"]) == ("t1", "k", 3, "q")
    assert data["exception"].startswith("Traceback") and "ValueError: boom" in data["exception"]


def test_json_formatter_keeps_one_valid_line_whatever_the_extras() -> None:
    """Found by review: NaN gave invalid JSON, a dict with tuple keys lost the record, and an
    extra named like a field replaced it."""
    record = logging.getLogger("x").makeRecord(
        "x", logging.INFO, __file__, 1, "m", (), None,
        extra={"lateness": float("nan"), "counts": {("a", 1): 2}, "level": "custom"},
    )  # fmt: skip
    line = JsonFormatter().format(record)
    data = json.loads(line)  # strict: no NaN token
    assert "\n" not in line and data["level"] == "INFO" and data["message"] == "m"
    assert data["lateness"] == "nan" and data["counts"] == "{('a', 1): 2}"


def test_worker_log_format_json_prints_one_object_per_line(
    server: EmbeddedServer, queue: Queue
) -> None:
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "delayq", "worker", APP, "--url", server.url),
            *("--log-format", "json", "--log-level", "info", "--metrics-port", "0"),
        ],
        cwd=ROOT,
        env={**os.environ, "DQ_QUEUE": queue.name, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_for(lambda: any(w.alive for w in queue.workers()), timeout=20)
        queue.schedule("charge", None, task_id="j1")
        wait_for(lambda: state(queue, "j1") == "dead", timeout=20)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]  # each parses
    assert lines and all({"time", "level", "logger", "message"} <= set(d) for d in lines)
    # found by review: the metrics line was plain text in the JSON stream
    assert any(d["message"].startswith("metrics on http://127.0.0.1:") for d in lines)
    about = [d for d in lines if d.get("task_id") == "j1"]
    assert [(d["level"], d["attempt"]) for d in about] == [("WARNING", 1), ("ERROR", 2)]
    for d in about:
        assert d["kind"] == "charge" and d["queue"] == queue.name
        assert "in charge_card" in d["exception"] and "card service down" in d["exception"]


def test_sentry_logging_integration_captures_the_handlers_error_with_its_stack(
    queue: Queue, run_worker: Any
) -> None:
    sentry_sdk = pytest.importorskip("sentry_sdk")
    from sentry_sdk.integrations.logging import LoggingIntegration
    from sentry_sdk.transport import Transport

    envelopes: list[Any] = []

    class Collect(Transport):
        def capture_envelope(self, envelope: Any) -> None:
            envelopes.append(envelope)

    sentry_sdk.init(
        dsn="http://public@127.0.0.1:1/1",
        transport=Collect,
        default_integrations=False,
        auto_enabling_integrations=False,
        integrations=[LoggingIntegration(level=None, event_level=logging.WARNING)],
    )
    try:
        with run_worker(failing_worker(queue, max_attempts=1)):
            queue.schedule("charge", None, task_id="s1")
            wait_for(lambda: state(queue, "s1") == "dead")
            wait_for(lambda: envelopes)
        sentry_sdk.flush()
    finally:
        sentry_sdk.get_client().close()
        sentry_sdk.get_global_scope().set_client(None)
    events = [item.payload.json for env in envelopes for item in env.items if item.type == "event"]
    (event,) = [e for e in events if e.get("extra", {}).get("task_id") == "s1"]
    assert event["level"] == "error" and event["logger"] == "delayq.worker"
    (exc,) = event["exception"]["values"]
    assert exc["type"] == "ConnectionError" and "card service down" in exc["value"]
    frames = [f["function"] for f in exc["stacktrace"]["frames"]]
    assert frames[-1] == "charge_card", frames
    assert event["extra"]["kind"] == "charge" and event["extra"]["queue"] == queue.name
    assert not sentry_sdk.get_client().is_active()  # later tests see no Sentry
