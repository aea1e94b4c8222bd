"""Prometheus metrics scraped over HTTP and parsed with prometheus_client's parser: the
worker's exporter (in process and as ``delayq worker --metrics-port``) and the dashboard's."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable

import httpx
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from delayq import Queue, Task, Worker
from delayq.admin.inspect import Admin
from delayq.admin.metrics import QueueCollector, serve_worker_metrics
from delayq.embedded import EmbeddedServer, free_port

from .conftest import ROOT, WorkerThread
from .support.dashboard_helpers import TOKEN, DashboardThread
from .support.helpers import wait_for

Samples = list[tuple[str, dict[str, str], float]]


def parse(text: str) -> Samples:
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def scrape(url: str, headers: dict[str, str] | None = None) -> Samples:
    response = httpx.get(url, headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def value(samples: Samples, name: str, default: float | None = None, **labels: str) -> float:
    found = [v for n, lab, v in samples if n == name and labels.items() <= lab.items()]
    if not found and default is not None:
        return default
    assert len(found) == 1, (name, labels, found)
    return found[0]


def delayq_label_names(samples: Samples) -> set[str]:
    return {k for n, lab, _ in samples if n.startswith("delayq_") for k in lab}


def test_worker_exporter_counts_outcomes_and_reads_the_queue_when_scraped(
    queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    queue.schedule_many([{"kind": "ok", "payload": i} for i in range(3)])
    queue.schedule("boom")
    queue.schedule_many([{"kind": "ok", "delay": 3600} for _ in range(2)])
    worker = Worker(queue, concurrency=2, lease=5)
    worker.handler("ok")(lambda task: None)

    @worker.handler("boom", max_attempts=1)
    def boom(task: Task) -> None:
        raise RuntimeError("boom")

    exporter = serve_worker_metrics(worker, 0)
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    try:
        with run_worker(worker):
            wait_for(lambda: (s := queue.stats()).dead == 1 and s.done == 3)
            m = scrape(url)
    finally:
        exporter.stop()
    ok, bad = {"queue": queue.name, "kind": "ok"}, {"queue": queue.name, "kind": "boom"}
    assert value(m, "delayq_tasks_started_total", **ok) == 3
    assert value(m, "delayq_tasks_succeeded_total", **ok) == 3
    assert value(m, "delayq_tasks_started_total", **bad) == 1
    assert value(m, "delayq_tasks_failed_total", **bad) == 1
    assert value(m, "delayq_tasks_dead_total", **bad) == 1
    assert value(m, "delayq_consecutive_failures", **bad) == 1
    assert value(m, "delayq_consecutive_failures", **ok) == 0
    assert value(m, "delayq_task_lateness_seconds_count", **ok) == 3
    assert value(m, "delayq_task_duration_seconds_count", **ok) == 3
    assert value(m, "delayq_task_duration_seconds_count", **bad) == 1  # one attempt, once
    assert value(m, "delayq_task_lateness_seconds_bucket", le="0.001", **ok) <= 3
    q = {"queue": queue.name}
    assert value(m, "delayq_redis_up") == 1
    assert value(m, "delayq_queue_scheduled", **q) == 2
    assert value(m, "delayq_queue_due", **q) == 0
    assert value(m, "delayq_queue_active", **q) == 0
    assert value(m, "delayq_queue_dead", **q) == 1
    assert value(m, "delayq_queue_done", **q) == 3
    assert value(m, "delayq_oldest_due_age_seconds", **q) == 0
    assert value(m, "delayq_workers_alive", **q) == 1
    assert value(m, "delayq_tasks_scheduled_total", **q) == 6
    assert value(m, "delayq_leases_expired_total", **q) == 0
    assert value(m, "delayq_queue_events_total", event="succeeded", **q) == 3
    assert value(m, "delayq_queue_events_total", event="dead", **q) == 1
    assert delayq_label_names(m) <= {"queue", "kind", "event", "le"}  # never a task id


def test_consecutive_failures_grow_per_kind_and_reset_on_success(
    queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    worker = Worker(queue, concurrency=1, lease=5)

    @worker.handler("flaky", max_attempts=1)
    def flaky(task: Task) -> None:
        if task.payload["fail"]:
            raise ValueError("down")

    exporter = serve_worker_metrics(worker, 0)
    url = f"http://127.0.0.1:{exporter.port}/metrics"
    labels = {"queue": queue.name, "kind": "flaky"}
    try:
        with run_worker(worker):
            for n in (1, 2):
                queue.schedule("flaky", {"fail": True})
                wait_for(lambda n=n: queue.stats().dead == n)
            assert value(scrape(url), "delayq_consecutive_failures", **labels) == 2
            queue.schedule("flaky", {"fail": False})
            wait_for(lambda: queue.stats().done == 1)
            m = scrape(url)
    finally:
        exporter.stop()
    assert value(m, "delayq_consecutive_failures", **labels) == 0
    assert value(m, "delayq_tasks_failed_total", **labels) == 2


def test_queue_gauges_follow_the_queue_between_scrapes(queue: Queue) -> None:
    registry = CollectorRegistry()
    admin = Admin(queue.url, queues=[queue.name])
    registry.register(QueueCollector(admin, lambda: [queue.name]))
    try:
        before = parse(generate_latest(registry).decode())
        queue.schedule_many([{"kind": "x", "at": 1} for _ in range(4)])  # long overdue
        after = parse(generate_latest(registry).decode())
    finally:
        admin.close()
    q = {"queue": queue.name}
    assert value(before, "delayq_queue_due", **q) == 0
    assert value(after, "delayq_queue_due", **q) == 4
    assert value(after, "delayq_oldest_due_age_seconds", **q) > 1e9  # due in 1970


def test_an_unreachable_redis_is_a_gauge_not_a_failed_scrape() -> None:
    registry = CollectorRegistry()
    admin = Admin(f"redis://127.0.0.1:{free_port()}/0", queues=["q"])
    registry.register(QueueCollector(admin, lambda: ["q"]))
    try:
        samples = parse(generate_latest(registry).decode())
    finally:
        admin.close()
    assert value(samples, "delayq_redis_up") == 0
    assert not [n for n, _, _ in samples if n.startswith("delayq_queue_")]


def test_delayq_worker_metrics_port_as_a_real_process(server: EmbeddedServer, queue: Queue) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "delayq", "worker", "tests.support.apps.metrics_app:worker",
         "--log-level", "error", "--metrics-port", str(port)],
        cwd=ROOT,
        env={**os.environ, "DELAYQ_REDIS_URL": server.url, "DQ_QUEUE": queue.name,
             "PYTHONPATH": str(ROOT)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}/metrics"

    def scraped() -> Samples | None:
        try:
            return scrape(url)
        except httpx.TransportError:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            return None

    try:
        wait_for(scraped, timeout=30)
        queue.schedule_many([{"kind": "ok"}, {"kind": "ok"}, {"kind": "boom"}])
        wait_for(lambda: (s := queue.stats()).done == 2 and s.dead == 1)
        m = wait_for(
            lambda: (s := scraped()) and value(s, "delayq_tasks_dead_total", 0, kind="boom") and s
        )
        assert value(m, "delayq_tasks_succeeded_total", kind="ok", queue=queue.name) == 2
        assert value(m, "delayq_queue_dead", queue=queue.name) == 1
        assert value(m, "process_resident_memory_bytes") > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        if proc.stderr:
            proc.stderr.close()


def test_dashboard_serves_the_queue_metrics_behind_its_token(
    server: EmbeddedServer, queue: Queue
) -> None:
    queue.schedule_many([{"kind": "x", "delay": 60} for _ in range(3)])
    with DashboardThread(server.url, [queue.name]) as base:
        refused = httpx.get(f"{base}/metrics", timeout=10)
        m = scrape(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert refused.status_code == 401
    assert value(m, "delayq_queue_scheduled", queue=queue.name) == 3
    assert value(m, "delayq_tasks_scheduled_total", queue=queue.name) == 3
    assert not [n for n, _, _ in m if n.startswith("delayq_tasks_started")]  # worker-only
