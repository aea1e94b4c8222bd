"""Retrying a flaky HTTP call, with each kind of failure classified.

The task: delete an expired upload from an object-storage service over HTTP. What the
service answers decides what becomes of the task:

    answer                    means                       handler does         task becomes
    2xx                       deleted                     returns              done
    404                       already gone                returns              done
    timeout, network, 5xx     the service is struggling   lets an error out    retried, backoff
    429 or 503 + Retry-After  the service says when       raise Retry(after=)  retried then
    429 without Retry-After   slow down                   lets an error out    retried, backoff
    401/403                   we lack the permission      raise Fail(...)      dead now + alert
    409                       the upload is in use again  raise Discard(...)   done, not retried
    other 4xx                 our request is wrong        raise Fail(...)      dead now + alert

Retrying only helps where the service may recover; elsewhere it would repeat the failure
(or, for 409, do harm). Every attempt counts: after ``max_attempts`` failures
the task is dead with the last traceback, and the same alert fires. Fix the cause, then
``queue.replay([task_id])``.

Run it (an embedded server and a stand-in storage service, one task per row):

    python examples/flaky_http.py

In production, run the worker with

    STORAGE_URL=https://storage.internal delayq worker examples.flaky_http:make_worker

and wherever an upload should go later: ``queue.schedule(KIND, {"object": key}, delay=3600)``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote, unquote

import httpx

from delayq import Discard, Fail, Queue, Retry, Task, Worker
from delayq.embedded import EmbeddedServer
from delayq.timing import Clock

log = logging.getLogger("flaky_http")

KIND = "upload.delete"
MAX_RETRY_AFTER = 3600.0  # never trust a server's Retry-After beyond an hour


def make_worker(
    storage_url: str | None = None,
    *,
    queue: str = "uploads",
    redis_url: str | None = None,
    timeout: float = 5.0,
    backoff: Sequence[float] = (30, 120, 600),
    max_attempts: int = 5,
    alert: Callable[[str], None] | None = None,
    clock: Clock | None = None,
) -> Worker:
    """The worker that deletes expired uploads (``delayq worker`` calls it with no arguments).

    Args:
        storage_url: the storage service's base URL (default: ``STORAGE_URL``).
        timeout: seconds to wait for the service; a timeout is retried.
        backoff: seconds between attempts: after the 1st failure, the 2nd, then every later one.
        alert: called with one line for every task that goes dead (default: log an error).
        clock: for tests, a ``delayq.testing.VirtualClock`` (docs/testing.md).
    """
    base = (storage_url or os.environ["STORAGE_URL"]).rstrip("/")
    notify = alert or (lambda text: log.error("ALERT %s", text))
    worker = Worker(Queue(queue, url=redis_url, clock=clock), concurrency=16)

    @worker.handler(KIND, max_attempts=max_attempts, backoff=backoff)
    def delete_upload(task: Task) -> None:
        key = task.payload["object"]
        # A client per call keeps the example short; a long-lived one would pool connections.
        # httpx.TimeoutException and httpx.TransportError are not caught: any exception other
        # than Retry/Discard/Fail means "try again after the backoff".
        with httpx.Client(timeout=timeout) as http:
            response = http.delete(f"{base}/objects/{quote(key, safe='')}")
        classify(response, key)

    @worker.on_dead
    def alert_on_dead(task_id: str, reason: str, task: Task | None) -> None:
        # Fires for Fail, for attempts spent and for tasks no handler can run; once per death.
        # A spent task's reason is "attempt N of N failed:" and the traceback: show its end.
        lines = reason.strip().splitlines() or ["?"]
        summary = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
        notify(f"task {task_id} is dead: {summary}")

    return worker


class StorageUnavailable(Exception):
    """A 5xx answer: the handler lets it out, and the worker retries after the backoff."""


def classify(response: httpx.Response, key: str) -> None:
    """Turn the service's answer into the task's outcome (see the table at the top)."""
    status = response.status_code
    if response.is_success:
        return
    if status == 404:
        log.info("upload %s was already gone", key)
        return
    if status in (401, 403):
        raise Fail(f"permission denied ({status}) deleting {key}: check the service's credentials")
    if status == 409:
        raise Discard(f"upload {key} is in use again ({response.text.strip()}); keeping it")
    if status in (429, 503) and (after := retry_after(response)) is not None:
        raise Retry(after=after, reason=f"{status} from storage, Retry-After {after:g} s")
    if status == 429 or status >= 500:
        raise StorageUnavailable(f"{status} from storage: {response.text.strip()[:200]}")
    raise Fail(f"storage refused the request ({status}): {response.text.strip()[:200]}")


def retry_after(response: httpx.Response) -> float | None:
    """The Retry-After header in seconds, or None (missing, or the HTTP-date form: the
    backoff applies then)."""
    try:
        after = float(response.headers["retry-after"])
    except (KeyError, ValueError):
        return None
    return min(max(after, 0.0), MAX_RETRY_AFTER) if math.isfinite(after) else None


# -- running this file: a stand-in storage service and one task per row of the table ------------

Answer = tuple[int, dict[str, str], str] | str  # (status, headers, body), or "hang"

# Each object's scripted answers, one per request; the last one repeats. "hang" answers
# nothing until the client has timed out.
SCRIPT: dict[str, list[Answer]] = {
    "deleted.bin": [(204, {}, "")],
    "gone.bin": [(404, {}, "no such object")],
    "slow.bin": ["hang", "hang", (204, {}, "")],
    "busy.bin": [(503, {"Retry-After": "1"}, "busy"), (204, {}, "")],
    "private.bin": [(403, {}, "forbidden")],
    "attached.bin": [(409, {}, "attached to invoice 7")],
    "broken.bin": [(500, {}, "internal error")],
}
# What becomes of each with max_attempts=3: (state, attempts).
EXPECTED = {
    "deleted.bin": ("done", 1),
    "gone.bin": ("done", 1),
    "slow.bin": ("done", 3),
    "busy.bin": ("done", 2),
    "private.bin": ("dead", 1),
    "attached.bin": ("done", 1),
    "broken.bin": ("dead", 3),
}


class StandInStorage(ThreadingHTTPServer):
    """Answers ``DELETE /objects/<key>`` from a script, on a free loopback port. Not part of
    the pattern, just something to call. :meth:`close` also releases hanging requests."""

    daemon_threads = True
    # Every task calls at once: a backlog of socketserver's default 5 drops connections on a
    # busy machine, and the client's connect then times out.
    request_queue_size = 64

    def __init__(self, script: dict[str, list[Answer]]) -> None:
        super().__init__(("127.0.0.1", 0), _StandInHandler)
        self.script = {k: list(v) for k, v in script.items()}
        self.requests: list[str] = []  # keys, in the order they were asked for
        self.closing = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def next_answer(self, key: str) -> Answer:
        with self.lock:
            self.requests.append(key)
            answers = self.script.get(key) or [(404, {}, "no such object")]
            return answers.pop(0) if len(answers) > 1 else answers[0]

    def close(self) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()
        self.thread.join(5)


class _StandInHandler(BaseHTTPRequestHandler):
    server: StandInStorage

    def do_DELETE(self) -> None:
        answer = self.server.next_answer(unquote(self.path.rsplit("/", 1)[-1]))
        if isinstance(answer, str):  # "hang": the client gives up first; then just hang up
            self.server.closing.wait(10)
            self.close_connection = True
            return
        status, headers, body = answer
        data = body.encode()
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(data))}.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run one upload.delete task per kind of answer.")
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    args = parser.parse_args(argv)
    logging.getLogger("delayq").setLevel(logging.CRITICAL)  # the table below says it all

    with ExitStack() as stack:
        url = args.url or stack.enter_context(EmbeddedServer(appendonly=False)).url
        storage = StandInStorage(SCRIPT)
        stack.callback(storage.close)
        queue = stack.enter_context(Queue(f"flaky-http-{os.getpid()}", url=url))
        alerts: list[str] = []
        worker = make_worker(
            storage.url,
            queue=queue.name,
            redis_url=url,
            timeout=0.5,
            backoff=(0.2, 0.5),  # seconds here; minutes in real life
            max_attempts=3,
            alert=alerts.append,
        )
        for key in SCRIPT:
            queue.schedule(KIND, {"object": key}, task_id=key)
        runner = threading.Thread(target=lambda: asyncio.run(worker.serve()), daemon=True)
        runner.start()
        deadline = time.monotonic() + 30
        while True:
            infos = {key: queue.get(key) for key in SCRIPT}
            finished = all(i is not None and i.state in ("done", "dead") for i in infos.values())
            if finished or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        worker.stop()
        runner.join(30)

        ok = True
        print(f"{'object':<13} {'state':<5} {'attempts':>8}  last error")
        for key, info in infos.items():
            got = (info.state, info.attempts) if info else ("?", 0)
            ok = ok and got == EXPECTED[key]
            lines = (info.last_error or "").strip().splitlines() if info else []
            print(f"{key:<13} {got[0]:<5} {got[1]:>8}  {lines[-1] if lines else ''}")
        print(f"alerts ({len(alerts)}):")
        for line in alerts:
            print(f"  {line}")
        queue.purge_dead()
        print("every task ended as expected" if ok else "SOME TASKS DID NOT END AS EXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
