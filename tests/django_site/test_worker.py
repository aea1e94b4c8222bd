"""The worker the Django way: connections around each run (in the handler's own thread),
manage.py delayq_worker with --processes, and cron, every and on_expire declared in tasks.py."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import TypeVar

import pytest
import shop.tasks
from django.db import connection
from shop.models import Note

import delayq.contrib.django as dq
from delayq import Worker
from delayq.contrib.django.testing import VirtualTime
from delayq.keys import QueueKeys

SITE = Path(__file__).resolve().parent
T = TypeVar("T")


def wait_for(check: Callable[[], T], timeout: float = 20.0, what: str = "condition") -> T:
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not met within {timeout} s (last: {value!r})")
        time.sleep(0.05)
    return value


@pytest.fixture
def serving() -> Iterator[Callable[[Worker], None]]:
    """Serve workers in threads of this process; stopped at the end."""
    running: list[tuple[Worker, threading.Thread]] = []

    def serve(worker: Worker) -> None:
        thread = threading.Thread(target=lambda: asyncio.run(worker.serve()), daemon=True)
        thread.start()
        running.append((worker, thread))

    yield serve
    for worker, thread in running:
        worker.stop()
        thread.join(30)


@pytest.mark.django_db(transaction=True)
def test_each_run_closes_its_threads_connection_sync_and_async(
    serving: Callable[[Worker], None],
) -> None:
    """CONN_MAX_AGE is 0 here, as Django's default: a request's connection is closed when it
    ends, and so is a task's, in the thread that ran it."""
    serving(dq.make_worker(["default"], concurrency=2))
    queue = dq.queue()
    queue.schedule("note.add", {"text": "sync"})
    queue.schedule("note.async_add", {"text": "async"})
    wait_for(lambda: len([s for s in shop.tasks.seen if s[0].startswith("note.")]) == 2)
    wait_for(lambda: queue.stats().counters.get("succeeded") == 2, what="both acked")
    assert sorted(n.text for n in Note.objects.all()) == ["async", "sync"]
    conns = {kind: conn for kind, _, conn in shop.tasks.seen if kind.startswith("note.")}
    # The handler thread's connection, and sync_to_async's thread's: both closed.
    assert conns["note.add"] is not connection and conns["note.async_add"] is not connection
    assert conns["note.add"].connection is None
    assert conns["note.async_add"].connection is None


def backends(app_name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [app_name]
        )
        return int(cursor.fetchone()[0])


def command_env(delayq_url: str, app_name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        SITE_DATABASE=connection.settings_dict["NAME"],
        DELAYQ_REDIS_URL=delayq_url,
        PGAPPNAME=app_name,
        SHOP_QUERY_AT_IMPORT="1",  # shop/tasks.py reads the database when imported
    )
    return env


@pytest.mark.django_db(transaction=True)
def test_processes_starts_children_with_no_connection_of_the_supervisors(
    delayq_url: str, tmp_path: Path
) -> None:
    app_name = f"site-worker-{secrets.token_hex(4)}"
    log = tmp_path / "worker.log"
    command = ["manage.py", "delayq_worker", "--queue", "default", "--processes", "2"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, *command, "--lease", "2"],
            cwd=SITE,
            env=command_env(delayq_url, app_name),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        workers = QueueKeys("default").workers
        client = dq.queue().client
        wait_for(lambda: client.hlen(workers) == 2, what="two worker processes serving")
        for i in range(4):
            dq.queue().schedule("note.add", {"text": str(i)})
        wait_for(lambda: Note.objects.count() == 4, what="the notes added")
        # The supervisor read the database while importing tasks.py, and so did each
        # child: each closed that connection, and each task its own.
        wait_for(lambda: backends(app_name) == 0, timeout=5, what="no connection left")
        assert backends(app_name) == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert "worker process 1" in log.read_text()


def test_the_command_refuses_bad_options_in_one_line(delayq_url: str) -> None:
    env = command_env(delayq_url, "refused")
    env.pop("SHOP_QUERY_AT_IMPORT")
    for args, message in (
        (["--processes", "0"], "--processes takes a number from 1"),
        (["--queue", "nope"], "no queue 'nope' in settings.DELAYQ['QUEUES']"),
        (["--lease", "soon"], "soon"),
    ):
        out = subprocess.run(
            [sys.executable, "manage.py", "delayq_worker", *args],
            cwd=SITE,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 1 and message in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


@pytest.mark.django_db
def test_cron_every_and_on_expire_declared_in_tasks_py_run_in_virtual_time(
    delayq_virtual: VirtualTime,
) -> None:
    delayq_virtual.queue().expiring.set("cart:7", {"items": 2}, ttl=600)
    out = delayq_virtual.drain(until=timedelta(days=1), queue="default")
    assert len(out.by_kind("cron:hourly")) == 24
    assert len(out.by_kind("cron:nightly")) == 1
    assert [value for kind, value, _ in shop.tasks.seen if kind == "cart"] == [{"items": 2}]
    assert all(r.outcome == "done" for r in out.ran)


@pytest.mark.django_db
def test_a_handler_of_another_queue_runs_on_it(delayq_virtual: VirtualTime) -> None:
    dq.queue("emails").schedule("mail.send", {"to": "a@example.com"}, delay=60)
    out = delayq_virtual.drain(until=timedelta(minutes=1), queue="emails")
    assert [(r.kind, r.outcome) for r in out.ran] == [("mail.send", "done")]


@pytest.mark.django_db
def test_a_typed_handler_gets_its_dataclass_and_a_bad_payload_is_dead(
    delayq_virtual: VirtualTime,
) -> None:
    queue = dq.queue()
    queue.schedule(shop.tasks.add_note_typed, shop.tasks.AddNote("ab", times=2), delay=60)
    queue.schedule("note.typed", {"times": 2}, task_id="bad", delay=30)  # another producer's
    queue.schedule("note.typed", {"text": "c", "new": 1}, delay=90)  # a newer producer's
    out = delayq_virtual.drain(until=timedelta(minutes=2), queue="default")
    assert [r.outcome for r in out.by_kind(shop.tasks.add_note_typed)] == ["dead", "done", "done"]
    assert [s[1] for s in shop.tasks.seen] == [
        shop.tasks.AddNote("ab", times=2),
        shop.tasks.AddNote("c"),
    ]
    assert sorted(n.text for n in Note.objects.all()) == ["abab", "c"]
    info = queue.get("bad")
    assert info is not None and info.last_error == (
        "payload does not match AddNote (the type of 'note.typed'): text: required field missing"
    )
