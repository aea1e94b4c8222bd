"""A worker's ``/livez`` and ``/readyz`` on its ``--metrics-port``: real ``delayq worker``
processes on a private server, probed over HTTP."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from delayq import Queue
from delayq.embedded import free_port
from delayq.worker.health import STALE_S

from .support.helpers import wait_for
from .test_processes import Supervised

APP = "tests.support.apps.health_app:worker"


@pytest.fixture
def start() -> Iterator[Any]:
    started: list[Supervised] = []

    def run(env: dict[str, str], *args: str) -> Supervised:
        s = Supervised(APP, env, *args)
        started.append(s)
        return s

    yield run
    for s in started:
        s.close()


@pytest.fixture
def server(make_server: Any) -> Any:
    return make_server(appendonly=False)


@pytest.fixture
def setup(server: Any, qname: str, tmp_path: Path) -> Iterator[tuple[Queue, dict[str, str]]]:
    queue = Queue(qname, url=server.url)
    queue.schedule("ok", {})  # (the queue exists)
    yield queue, {"DQ_QUEUE": qname, "DELAYQ_REDIS_URL": server.url}
    queue.close()


def probe(port: int, path: str, method: str = "GET") -> httpx.Response | None:
    try:
        return httpx.request(method, f"http://127.0.0.1:{port}{path}", timeout=5)
    except httpx.HTTPError:
        return None  # not listening yet


def answers(port: int, path: str, code: int) -> httpx.Response | None:
    r = probe(port, path)
    return r if r is not None and r.status_code == code else None


def test_a_worker_answers_livez_and_readyz(setup: tuple[Queue, dict[str, str]], start: Any) -> None:
    _, env = setup
    port = free_port()
    w = start(env, "--metrics-port", str(port))
    ready = wait_for(lambda: answers(port, "/readyz", 200), timeout=30, interval=0.2)
    assert ready.text == "ok\n", w.output()
    live = probe(port, "/livez")
    assert live is not None and (live.status_code, live.text) == (200, "ok\n")
    assert live.headers["content-type"].startswith("text/plain")
    head = probe(port, "/livez", "HEAD")
    assert head is not None and (head.status_code, head.content) == (200, b"")
    post = probe(port, "/readyz", "POST")
    assert post is not None and post.status_code == 405
    metrics = probe(port, "/metrics")
    assert metrics is not None and "delayq_queue_events_total" in metrics.text  # still there


def test_a_worker_whose_event_loop_is_blocked_is_not_live(
    setup: tuple[Queue, dict[str, str]], start: Any
) -> None:
    queue, env = setup
    port = free_port()
    w = start(env, "--metrics-port", str(port))
    wait_for(lambda: answers(port, "/livez", 200), timeout=30, interval=0.2)
    queue.schedule("block", {"s": 60})
    began = time.monotonic()
    # The metrics thread still answers, from the loop's last pulse: stale after STALE_S.
    dead = wait_for(lambda: answers(port, "/livez", 503), timeout=STALE_S + 20, interval=0.2)
    waited = time.monotonic() - began
    assert "the event loop has not turned" in dead.text, w.output()
    assert waited >= STALE_S - 1  # not before the bound
    ready = probe(port, "/readyz")
    assert ready is not None and ready.status_code == 503
    head = probe(port, "/livez", "HEAD")
    assert head is not None and (head.status_code, head.content) == (503, b"")


def test_a_worker_whose_redis_is_gone_is_live_but_not_ready(
    setup: tuple[Queue, dict[str, str]], start: Any, server: Any
) -> None:
    queue, env = setup
    port = free_port()
    w = start(env, "--metrics-port", str(port))
    wait_for(lambda: answers(port, "/readyz", 200), timeout=30, interval=0.2)
    queue.close()
    server.stop()
    unready = wait_for(lambda: answers(port, "/readyz", 503), timeout=20, interval=0.2)
    assert unready.text.startswith("Redis did not answer"), unready.text
    live = probe(port, "/livez")
    assert live is not None and live.status_code == 200, w.output()  # no restart for that


def test_a_worker_finishing_its_tasks_on_sigterm_is_live_but_not_ready(
    setup: tuple[Queue, dict[str, str]], start: Any
) -> None:
    queue, env = setup
    port = free_port()
    w = start({**env, "DQ_GRACE": "20"}, "--metrics-port", str(port))
    wait_for(lambda: answers(port, "/readyz", 200), timeout=30, interval=0.2)
    queue.schedule("slow", {"s": 4})
    wait_for(lambda: queue.stats().active == 1, timeout=10)
    w.proc.send_signal(signal.SIGTERM)
    # Its claim loop has ended on purpose: a liveness probe must not kill it in its grace.
    wait_for(lambda: answers(port, "/readyz", 503), timeout=10, interval=0.1)
    ready, live = probe(port, "/readyz"), probe(port, "/livez")
    assert ready is not None and ready.text == "stopping\n"
    assert live is not None and (live.status_code, live.text) == (200, "ok\n"), w.output()
    assert w.proc.wait(30) == 0
    assert queue.stats().counters.get("succeeded") == 2  # ok, and slow finished in its grace


def test_a_supervisor_is_not_live_when_one_worker_process_hangs(
    setup: tuple[Queue, dict[str, str]], start: Any
) -> None:
    queue, env = setup
    port = free_port()
    sup = start(env, "--processes", "2", "--metrics-port", str(port))
    wait_for(lambda: sup.serving(2), timeout=60)
    wait_for(lambda: answers(port, "/readyz", 200), timeout=30, interval=0.2)
    assert answers(port, "/livez", 200) is not None
    queue.schedule("block", {"s": 60})
    dead = wait_for(lambda: answers(port, "/livez", 503), timeout=STALE_S + 20, interval=0.2)
    assert dead.text.startswith("worker process "), dead.text
    assert "the event loop has not turned" in dead.text
    assert dead.text.count("worker process ") == 1  # the other one is fine
    ready = probe(port, "/readyz")
    assert ready is not None and ready.status_code == 503, sup.output()
