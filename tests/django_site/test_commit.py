"""schedule_on_commit: on commit only, the id made up front, using= and robust=, a Redis that
fails after the commit, the eager mode, and tests' captured callbacks."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import shop.tasks
from django.db import transaction
from django.test import TestCase
from shop.models import Note

import delayq.contrib.django as dq
from delayq import ConfigurationError, ConnectionFailed, InvalidTaskError, PayloadTooLarge, Queue
from delayq.contrib.django.testing import DelayqTestMixin, VirtualTime

Capture = Callable[..., Any]


@pytest.mark.django_db(transaction=True)
def test_nothing_is_scheduled_before_the_commit_nor_after_a_rollback() -> None:
    queue = dq.queue()
    with transaction.atomic():
        task_id = dq.schedule_on_commit("default", "note.add", {"text": "a"}, delay=60)
        assert isinstance(task_id, str) and len(task_id) == 16  # made now, for the row
        assert queue.get(task_id) is None  # not yet
    info = queue.get(task_id)
    assert info is not None and (info.state, info.kind, info.payload) == (
        "scheduled",
        "note.add",
        {"text": "a"},
    )
    with transaction.atomic():
        gone = dq.schedule_on_commit(queue, "note.add", {"text": "b"}, task_id="note:b")
        assert gone == "note:b"
        transaction.set_rollback(True)
    assert queue.get("note:b") is None and queue.stats().scheduled == 1
    # A savepoint rolled back drops its own callbacks, not the outer transaction's.
    with transaction.atomic():
        kept = dq.schedule_on_commit(None, "note.add", {"text": "c"})
        try:
            with transaction.atomic():
                dq.schedule_on_commit(None, "note.add", {"text": "d"}, task_id="note:d")
                raise RuntimeError
        except RuntimeError:
            pass
    assert queue.get(kept) is not None and queue.get("note:d") is None


@pytest.mark.django_db(transaction=True, databases=["default", "other"])
def test_using_names_the_database_whose_commit_decides() -> None:
    queue = dq.queue()
    with transaction.atomic(using="other"):
        task_id = dq.schedule_on_commit(None, "note.add", {"text": "x"}, using="other")
        with transaction.atomic():  # default's own commit does not send it
            pass
        assert queue.get(task_id) is None
    assert queue.get(task_id) is not None
    with transaction.atomic(using="other"):
        dq.schedule_on_commit(None, "note.add", None, using="other", task_id="rolled")
        transaction.set_rollback(True, using="other")
    assert queue.get("rolled") is None


@pytest.mark.django_db(transaction=True)
def test_a_task_that_could_never_be_scheduled_fails_the_call_inside_the_transaction() -> None:
    for bad, error in (
        ({"kind": "note.add", "payload": {"x": object()}}, InvalidTaskError),
        ({"kind": "note.add", "payload": "x" * 2_000_000}, PayloadTooLarge),
        ({"kind": "", "payload": None}, InvalidTaskError),
        ({"kind": "note.add", "payload": None, "task_id": "x" * 1000}, InvalidTaskError),
        ({"kind": "note.add", "payload": None, "delay": -1}, InvalidTaskError),
        ({"kind": "note.add", "payload": None, "replace": "no"}, InvalidTaskError),
        ({"kind": "note.add", "payload": None, "durable": "no"}, InvalidTaskError),
        ({"kind": "note.add", "payload": None, "robust": "no"}, ConfigurationError),
        ({"kind": "note.add", "payload": None, "outbox": "no"}, ConfigurationError),
    ):
        with pytest.raises(error), transaction.atomic():
            Note.objects.create(text="kept?")
            dq.schedule_on_commit(None, **bad)
    assert Note.objects.count() == 0 and dq.queue().stats().scheduled == 0
    with pytest.raises(Exception, match="unknown option"):
        dq.schedule_on_commit(None, "note.add", None, dealy=5)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("outbox", [False, True])
@pytest.mark.parametrize("empty", ["", 0, False])
def test_an_empty_task_id_is_refused_as_queue_schedule_refuses_it(empty: Any, outbox: bool) -> None:
    with pytest.raises(InvalidTaskError, match=r"task_id must be a non-empty string"):
        dq.queue().schedule("note.add", None, task_id=empty)
    with (
        pytest.raises(InvalidTaskError, match=r"task_id must be a non-empty string"),
        transaction.atomic(),
    ):
        dq.schedule_on_commit(None, "note.add", None, task_id=empty, outbox=outbox)
    assert dq.queue().stats().scheduled == 0


@pytest.mark.django_db(transaction=True)
def test_the_payload_is_scheduled_as_it_was_at_the_call() -> None:
    payload: dict[str, Any] = {"text": "before"}
    with transaction.atomic():
        task_id = dq.schedule_on_commit(None, "note.add", payload)
        payload["text"] = "after"
    info = dq.queue().get(task_id)
    assert info is not None and info.payload == {"text": "before"}


@pytest.mark.django_db(transaction=True)
def test_redis_failing_after_the_commit_keeps_the_row_and_says_which_task_was_lost(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = Queue("down", url="redis://127.0.0.1:9/0")  # nothing listens
    caplog.set_level(logging.ERROR)
    with pytest.raises(ConnectionFailed), transaction.atomic():
        Note.objects.create(text="raised")
        lost = dq.schedule_on_commit(down, "note.add", None)
    assert Note.objects.filter(text="raised").exists()  # committed all the same
    assert f"task {lost} (note.add) on queue 'down' was not scheduled after the commit" in (
        caplog.text
    )
    caplog.clear()
    with transaction.atomic():  # robust: logged, and the commit's other callbacks run
        Note.objects.create(text="robust")
        lost = dq.schedule_on_commit(down, "note.add", None, robust=True)
        after = dq.schedule_on_commit(None, "note.add", {"text": "next"})
    assert Note.objects.filter(text="robust").exists() and f"task {lost}" in caplog.text
    assert dq.queue().get(after) is not None
    down.close()


@pytest.mark.django_db
def test_captured_callbacks_schedule_when_executed(
    django_capture_on_commit_callbacks: Capture, delayq_virtual: VirtualTime
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        task_id = dq.schedule_on_commit(None, "note.add", {"text": "t"}, delay=900)
    assert len(callbacks) == 1 and delayq_virtual.queue().get(task_id) is None
    with django_capture_on_commit_callbacks(execute=True):
        task_id = dq.schedule_on_commit(None, "note.add", {"text": "t"}, delay=900)
    assert delayq_virtual.drain(until=timedelta(seconds=899)).by_kind("note.add") == []
    out = delayq_virtual.drain(until=timedelta(seconds=1), queue="default")
    assert [(r.task_id, r.outcome) for r in out.by_kind("note.add")] == [(task_id, "done")]
    assert Note.objects.get().text == "t"  # on the test's connection, in its transaction


@pytest.mark.django_db(transaction=True)
def test_eager_mode_runs_the_handler_at_the_commit_whatever_the_delay(settings: Any) -> None:
    settings.DELAYQ = {**settings.DELAYQ, "EAGER": True}
    with transaction.atomic():
        dq.schedule_on_commit(None, "note.add", {"text": "now"}, delay=900)
        assert Note.objects.count() == 0
    assert Note.objects.get().text == "now"
    with transaction.atomic():
        dq.schedule_on_commit(None, "note.add", {"text": "never"})
        transaction.set_rollback(True)
    dq.schedule_on_commit(None, "note.skip", None)  # Discard: nothing raised
    dq.schedule_on_commit(None, "note.async_add", {"text": "async"})
    assert sorted(n.text for n in Note.objects.all()) == ["async", "now"]
    assert dq.queue().stats().scheduled == 0  # nothing went to Redis
    with pytest.raises(Exception, match=r"no @delayq.contrib.django.handler\('nope'\)"):
        dq.schedule_on_commit(None, "nope", None)


class MixinTests(DelayqTestMixin, TestCase):
    """The TestCase form: self.delayq, a VirtualTime per test."""

    databases = {"default"}

    def test_drains_what_the_test_committed(self) -> None:
        with self.captureOnCommitCallbacks(execute=True):
            dq.schedule_on_commit(None, "note.add", {"text": "m"}, delay=3600)
        assert self.delayq.drain(until=timedelta(minutes=59)).by_kind("note.add") == []
        out = self.delayq.drain(until=timedelta(hours=1))
        assert [r.outcome for r in out.by_kind("note.add")] == ["done"]
        assert Note.objects.get().text == "m"
        assert [s[:2] for s in shop.tasks.seen if s[0] == "note.add"] == [
            ("note.add", {"text": "m"})
        ]


@pytest.mark.django_db
def test_a_setting_changed_mid_test_gives_the_drain_a_new_worker(
    settings: Any, delayq_virtual: VirtualTime
) -> None:
    before = delayq_virtual.worker("default")
    assert delayq_virtual.worker("default") is before
    settings.DELAYQ = {**settings.DELAYQ, "WORKER": {"concurrency": 3}}
    after = delayq_virtual.worker("default")
    assert after is not before and after.concurrency == 3
    delayq_virtual.queue().schedule("note.add", {"text": "new"})
    assert [r.outcome for r in delayq_virtual.drain().by_kind("note.add")] == ["done"]


@pytest.mark.django_db(transaction=True)
def test_a_typed_task_on_commit_is_written_as_json_and_run_eagerly_as_its_type(
    settings: Any,
) -> None:
    typed, value = shop.tasks.add_note_typed, shop.tasks.AddNote("t")
    with transaction.atomic():
        tid = dq.schedule_on_commit(None, typed, value, delay=60)
    info = dq.queue().get(tid)
    assert info is not None and (info.kind, info.payload) == (
        "note.typed",
        {"text": "t", "times": 1},
    )
    with pytest.raises(InvalidTaskError, match=r"'note.typed' \(AddNote\)"):
        dq.schedule_on_commit(None, typed, {"text": "t"})  # type: ignore[misc]
    settings.DELAYQ = {**settings.DELAYQ, "EAGER": True}
    with transaction.atomic():
        dq.schedule_on_commit(None, typed, shop.tasks.AddNote("e", times=3), delay=900)
    assert shop.tasks.seen[-1][1] == shop.tasks.AddNote("e", times=3)
    assert Note.objects.get().text == "eee"
