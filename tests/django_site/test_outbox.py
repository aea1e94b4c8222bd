"""The outbox: a task written in its transaction, sent at the commit or by the worker's
relay, scheduled once by its id; nothing lost when the process dies after the commit."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from django.db import connection, transaction
from shop.models import Note
from test_worker import wait_for

import delayq.contrib.django as dq
from delayq import ConfigurationError
from delayq.contrib.django import outbox
from delayq.contrib.django.models import OutboxTask
from delayq.contrib.django.outbox import relay

SITE = Path(__file__).resolve().parent
pytestmark = pytest.mark.django_db(transaction=True, databases=["default", "other"])


def test_the_task_is_a_row_until_the_commit_then_in_redis() -> None:
    queue = dq.queue()
    with transaction.atomic():
        task_id = dq.schedule_on_commit(None, "note.add", {"text": "o"}, delay=60, outbox=True)
        row = OutboxTask.objects.get()
        assert (row.task_id, row.kind, row.payload) == (task_id, "note.add", {"text": "o"})
        assert queue.get(task_id) is None
    info = queue.get(task_id)
    assert info is not None and info.state == "scheduled"
    assert not OutboxTask.objects.exists()  # sent: its row deleted
    with transaction.atomic():
        dq.schedule_on_commit(None, "note.add", None, task_id="rb", outbox=True)
        transaction.set_rollback(True)
    assert queue.get("rb") is None and not OutboxTask.objects.exists()


def test_a_redis_down_at_the_commit_leaves_the_row_for_the_relay(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    up = settings.DELAYQ
    settings.DELAYQ = {**up, "URL": "redis://127.0.0.1:9/0"}  # nothing listens
    caplog.set_level(logging.WARNING)
    with transaction.atomic():
        Note.objects.create(text="committed")
        called_at = datetime.now(UTC)
        task_id = dq.schedule_on_commit(None, "note.add", {"text": "r"}, delay=60, outbox=True)
    assert f"task {task_id} (note.add) was not scheduled at the commit" in caplog.text
    assert OutboxTask.objects.filter(pk=task_id).exists()  # kept: nothing lost
    settings.DELAYQ = up
    assert relay(min_age=10) == 0  # too young: its commit's callback may still send it
    assert relay(min_age=0) == 1 and not OutboxTask.objects.exists()
    info = dq.queue().get(task_id)
    assert info is not None and info.state == "scheduled"
    # Its due time was fixed at the call: 60 s from then, not from the relay.
    assert -0.01 <= (info.due_at - called_at).total_seconds() - 60 < 0.5


def test_a_row_relayed_twice_is_scheduled_once() -> None:
    dq.queue().schedule("note.add", {"text": "first"}, task_id="twice")
    OutboxTask.objects.create(task_id="twice", queue="default", kind="note.add", payload={})
    OutboxTask.objects.create(task_id="gone", queue="old", kind="note.add", payload={})
    assert relay(min_age=0) == 1
    info = dq.queue().get("twice")
    assert info is not None and info.payload == {"text": "first"}  # unchanged
    assert list(OutboxTask.objects.values_list("pk", flat=True)) == ["gone"]  # not configured


def test_a_row_written_in_another_database_is_relayed_from_there(settings: Any) -> None:
    up = settings.DELAYQ
    settings.DELAYQ = {**up, "URL": "redis://127.0.0.1:9/0"}  # the commit's send fails
    with transaction.atomic(using="other"):
        dq.schedule_on_commit(
            None, "note.add", {"text": "o"}, task_id="in-other", outbox=True, using="other"
        )
    settings.DELAYQ = up
    assert OutboxTask.objects.using("other").filter(pk="in-other").exists()
    assert relay(min_age=0) == 1  # the worker's relay: every database's outbox
    assert outbox.databases() == ["default", "other"]  # each has the table
    info = dq.queue().get("in-other")
    assert info is not None and info.payload == {"text": "o"}
    assert not OutboxTask.objects.using("other").exists()


def test_the_same_task_id_again_keeps_the_first_row_as_schedule_keeps_the_first_task(
    settings: Any,
) -> None:
    with transaction.atomic():
        Note.objects.create(text="kept")
        dq.schedule_on_commit(None, "note.add", {"text": "first"}, task_id="dup", outbox=True)
        dq.schedule_on_commit(None, "note.add", {"text": "second"}, task_id="dup", outbox=True)
        assert OutboxTask.objects.get().payload == {"text": "first"}
    assert Note.objects.count() == 1  # the transaction was not aborted
    info = dq.queue().get("dup")
    assert info is not None and info.payload == {"text": "first"}
    assert not OutboxTask.objects.exists()
    # A row still waiting for the relay (Redis down at its commit) is kept too.
    up = settings.DELAYQ
    settings.DELAYQ = {**up, "URL": "redis://127.0.0.1:9/0"}
    with transaction.atomic():
        dq.schedule_on_commit(None, "note.add", {"text": "a"}, task_id="waits", outbox=True)
    settings.DELAYQ = up
    with transaction.atomic():
        Note.objects.create(text="also kept")
        dq.schedule_on_commit(None, "note.add", {"text": "b"}, task_id="waits", outbox=True)
    assert Note.objects.count() == 2
    info = dq.queue().get("waits")
    assert info is not None and info.payload == {"text": "a"}
    assert relay(min_age=0) == 0 and not OutboxTask.objects.exists()


# With USE_TZ = False (site_settings_notz), on SQLite and PostgreSQL: a delay, the relay,
# and the due time.
NAIVE = """
import time
from datetime import UTC, datetime
from django.db import transaction
import delayq.contrib.django as dq
from delayq.contrib.django.models import OutboxTask
from delayq.contrib.django.outbox import relay
before = time.time()
with transaction.atomic():
    sent = dq.schedule_on_commit(None, "note.add", {"text": "n"}, delay=60, outbox=True)
info = dq.queue().get(sent)
assert info is not None and 59.9 < info.due_at.timestamp() - before < 61, info
OutboxTask.objects.create(task_id="left", queue="default", kind="note.add", due_at=None)
with transaction.atomic():  # Redis down at the commit: the row waits, due in 60 s
    OutboxTask.objects.create(
        task_id="later", queue="default", kind="note.add",
        due_at=datetime.fromtimestamp(before + 60, UTC).replace(tzinfo=None),  # naive UTC
    )
time.sleep(0.1)
assert relay(min_age=0) == 2, "relay"
later = dq.queue().get("later")
assert later is not None and 59.9 < later.due_at.timestamp() - before < 61, later
"""


@pytest.mark.parametrize("db", ["sqlite", "postgresql"])
def test_the_outbox_works_with_use_tz_false(delayq_url: str, tmp_path: Path, db: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(DJANGO_SETTINGS_MODULE="site_settings_notz", DELAYQ_REDIS_URL=delayq_url)
    steps = [["shell", "-c", NAIVE]]
    if db == "sqlite":
        env["SITE_SQLITE"] = str(tmp_path / "notz.sqlite3")
        steps.insert(0, ["migrate", "-v", "0"])
    else:  # this test's database, migrated
        env["SITE_DATABASE"] = connection.settings_dict["NAME"]
    for args in steps:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=SITE,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert dq.queue().get("left") is not None and dq.queue().get("later") is not None


def test_the_outbox_must_be_switched_on(settings: Any) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "OUTBOX": False}
    with pytest.raises(ConfigurationError, match=r"needs settings.DELAYQ\['OUTBOX'\] = True"):
        dq.schedule_on_commit(None, "note.add", None, outbox=True)
    settings.DELAYQ = {**settings.DELAYQ, "OUTBOX": True}
    with pytest.raises(ConfigurationError, match="not replace"):
        dq.schedule_on_commit(None, "note.add", None, outbox=True, replace=True)


# A request's process killed right after its commit, before the callbacks that follow it:
# the first callback of the commit is a SIGKILL of the process itself.
DIES_AFTER_COMMIT = """
import os, signal
from django.db import transaction
import delayq.contrib.django as dq
from shop.models import Note
with transaction.atomic():
    Note.objects.create(text="order")
    transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
    dq.schedule_on_commit(None, "note.add", {"text": "its task"}, task_id="t", outbox=OUTBOX)
"""


@pytest.mark.parametrize("outbox", [False, True], ids=["on commit", "outbox"])
def test_a_process_killed_between_the_commit_and_the_schedule(
    delayq_url: str, tmp_path: Path, outbox: bool
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(SITE_DATABASE=connection.settings_dict["NAME"], DELAYQ_REDIS_URL=delayq_url)
    code = DIES_AFTER_COMMIT.replace("OUTBOX", str(outbox))
    died = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code], cwd=SITE, env=env, timeout=60
    )
    assert died.returncode == -9
    assert Note.objects.get().text == "order"  # committed
    assert dq.queue().get("t") is None  # and its task never sent
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [sys.executable, "manage.py", "delayq_worker", "--queue", "default"],
            cwd=SITE,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        if outbox:  # the worker relays the row, and the task runs
            wait_for(lambda: Note.objects.filter(text="its task").exists(), what="the task ran")
            assert not OutboxTask.objects.exists()
            assert "outbox: relayed 1 task(s)" in log.read_text()
        else:  # lost: nothing knows of it
            time.sleep(3 + 1)  # past the relay's age and period, had there been a row
            assert dq.queue().get("t") is None and Note.objects.count() == 1
    finally:
        worker.terminate()
        worker.wait(30)
