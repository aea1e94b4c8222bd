"""The producer API end to end, with the same cases for Queue and AsyncQueue."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from delayq import AsyncQueue, InvalidTaskError, Queue, Task, TaskSpec
from delayq.embedded import EmbeddedServer
from delayq.spec import CheckedSpec


class SyncView:
    """Runs an AsyncQueue's coroutines on a private loop so one test body serves both."""

    def __init__(self, aq: AsyncQueue) -> None:
        self._aq = aq
        self._loop = asyncio.new_event_loop()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._aq, name)
        if not callable(attr):
            return attr
        return lambda *a, **k: self._loop.run_until_complete(attr(*a, **k))

    def close_view(self) -> None:
        self._loop.run_until_complete(self._aq.close())
        self._loop.close()


@pytest.fixture(params=["sync", "async"])
def api(request: pytest.FixtureRequest, server: EmbeddedServer, qname: str) -> Iterator[Any]:
    if request.param == "sync":
        q = Queue(qname, url=server.url, dedupe_window=3600)
        yield q
        q.close()
    else:
        view = SyncView(AsyncQueue(qname, url=server.url, dedupe_window=3600))
        yield view
        view.close_view()


def test_schedule_returns_the_given_id_and_stores_the_task(api: Any) -> None:
    assert (
        api.schedule("order.close", {"order_id": 42}, delay=900, task_id="order:42") == "order:42"
    )
    info = api.get("order:42")
    assert info.state == "scheduled"
    assert info.kind == "order.close"
    assert info.payload == {"order_id": 42}
    assert info.attempts == 0
    remaining = (info.due_at - datetime.now(UTC)).total_seconds()
    assert 890 < remaining <= 900


def test_scheduled_carries_the_due_time_the_script_stored(api: Any) -> None:
    """Scheduled.due_at is the stored due time (the server's clock), exactly what get()
    reads, for every way one is scheduled; None when the call left the task as it was."""
    when = datetime(2030, 1, 2, 3, 4, 5, 250000, tzinfo=UTC)
    made = [
        api.schedule("k", delay=60),  # a new id: schedule_new.lua
        api.schedule("k", delay=60, task_id="mine"),  # schedule.lua, one task
        api.schedule("k", at=when, task_id="at"),
        api.schedule("k", delay=5, task_id="mine", replace=True),
        *api.schedule_many([TaskSpec("k", delay=d) for d in (0, 1.5, 3600)]),
    ]
    assert [s.status for s in made].count("created") == 6 and made[3].status == "replaced"
    assert made[1].due_at is not None and made[3].due_at is not None
    assert made[3].due_at < made[1].due_at  # (replaced: 5 s instead of 60)
    for s in {str(s): s for s in made}.values():  # the last answer for each id
        info = api.get(s)
        assert s.due_at is not None and s.due_at == info.due_at, s
    assert made[2].due_at == when
    assert api.schedule("k", delay=9, task_id="mine").due_at is None  # unchanged


def test_generated_ids_are_unique_and_short(api: Any) -> None:
    ids = {api.schedule("k", i, delay=60) for i in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 16 for i in ids)


def test_at_accepts_aware_datetime_and_timestamp(api: Any) -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    a = api.schedule("report.send", {"to": "ops"}, at=when)
    b = api.schedule("report.send", {"to": "ops"}, at=when.timestamp() + 1)
    assert api.get(a).due_at == when
    assert api.get(b).due_at == when + timedelta(seconds=1)


def test_at_keeps_microseconds(api: Any) -> None:
    """Workers time tasks to the microsecond: a due time rounded to the millisecond would
    start a task up to half a millisecond before the time asked for."""
    when = datetime(2030, 1, 2, 3, 4, 5, 123_456, tzinfo=UTC)
    tid = api.schedule("k", None, at=when)
    assert api.get(tid).due_at == when
    later = api.schedule("k", None, at=when.timestamp() + 0.0005)
    assert api.get(later).due_at == when + timedelta(microseconds=500)


def test_timedelta_delay(api: Any) -> None:
    tid = api.schedule("k", None, delay=timedelta(minutes=15))
    remaining = (api.get(tid).due_at - datetime.now(UTC)).total_seconds()
    assert 890 < remaining <= 900


def test_scheduling_a_waiting_id_again_changes_nothing(api: Any) -> None:
    api.schedule("k", {"v": 1}, delay=100, task_id="same")
    assert api.schedule("k", {"v": 2}, delay=5, task_id="same") == "same"
    info = api.get("same")
    assert info.payload == {"v": 1}
    assert (info.due_at - datetime.now(UTC)).total_seconds() > 90


def test_replace_moves_a_waiting_task(api: Any) -> None:
    api.schedule("k", {"v": 1}, delay=100, task_id="same")
    api.schedule("k", {"v": 2}, delay=5, task_id="same", replace=True)
    info = api.get("same")
    assert info.payload == {"v": 2}
    assert (info.due_at - datetime.now(UTC)).total_seconds() < 6
    assert api.stats().scheduled == 1


def test_cancel_only_a_waiting_task(api: Any) -> None:
    api.schedule("k", None, delay=60, task_id="c1")
    assert api.cancel("c1") is True
    info = api.get("c1")  # remembered for the dedupe window (issue 32 item 7)
    assert info is not None and info.state == "cancelled" and info.finished_at is not None
    assert api.cancel("c1") is False
    assert api.cancel("never-existed") is False


def test_reschedule_a_waiting_task(api: Any) -> None:
    api.schedule("order.close", None, delay=900, task_id="order:7")
    assert api.reschedule("order:7", delay=60) is True
    remaining = (api.get("order:7").due_at - datetime.now(UTC)).total_seconds()
    assert 50 < remaining <= 60
    assert api.reschedule("unknown", delay=60) is False


def test_get_unknown_is_none(api: Any) -> None:
    assert api.get("nope") is None


def test_stats_counts_and_head(api: Any) -> None:
    api.schedule("k", None, delay=0, task_id="due-now")
    api.schedule("k", None, delay=300, task_id="later")
    s = api.stats()
    assert (s.scheduled, s.due, s.active, s.dead, s.done) == (2, 1, 0, 0, 0)
    assert s.oldest_due_age >= 0
    assert s.next_due_at is not None and s.next_due_at <= datetime.now(UTC)
    assert s.counters["scheduled"] == 2


def test_schedule_many_in_batches(api: Any) -> None:
    specs = [TaskSpec("bulk", {"n": i}, delay=60 + i) for i in range(2500)]
    specs.append({"kind": "bulk", "payload": "dict form", "delay": 5, "task_id": "d1"})
    ids = api.schedule_many(specs)
    assert len(ids) == 2501 and ids[-1] == "d1"
    assert api.stats().scheduled == 2501
    assert api.get(ids[1234]).payload == {"n": 1234}


def test_schedule_many_refuses_everything_when_one_task_is_bad(api: Any) -> None:
    specs = [TaskSpec("bulk", i, delay=1) for i in range(10)] + [TaskSpec("bulk", {1, 2})]
    with pytest.raises(InvalidTaskError, match="JSON"):
        api.schedule_many(specs)
    assert api.stats().scheduled == 0


def test_schedule_many_refuses_duplicate_ids(api: Any) -> None:
    with pytest.raises(InvalidTaskError, match="twice"):
        api.schedule_many([TaskSpec("k", task_id="a"), TaskSpec("k", task_id="a")])
    assert api.stats().scheduled == 0


def test_checked_specs_schedule_as_task_specs(api: Any) -> None:
    ids = api.schedule_many(
        [
            CheckedSpec("k", {"n": 1}, delay=60, task_id="c1", max_attempts=2),
            CheckedSpec("k", [2], headers={"t": "x"}),
            TaskSpec("k", 3, delay=5),
        ]
    )
    assert ids[0] == "c1" and all(s.created for s in ids)
    one, two, three = (api.get(i) for i in ids)
    assert (one.payload, one.max_attempts, one.state) == ({"n": 1}, 2, "scheduled")
    assert (two.payload, two.headers, three.payload) == ([2], {"t": "x"}, 3)
    with pytest.raises(InvalidTaskError, match="twice"):
        api.schedule_many([CheckedSpec("k", task_id="d"), TaskSpec("k", task_id="d")])
    with pytest.raises(InvalidTaskError, match="JSON"):  # its payload is checked by encoding
        api.schedule_many([CheckedSpec("k", {1, 2})])
    assert api.stats().scheduled == 3


def test_a_checked_spec_writes_the_headers_it_was_given(api: Any) -> None:
    """It encodes its headers when it is made: a later change to the caller's dict is not
    written, and its own headers say what is."""
    headers = {"t": "x"}
    spec = CheckedSpec("k", None, headers=headers)
    headers["late"] = "y"
    (one,) = api.schedule_many([spec])
    assert api.get(one).headers == spec.headers == {"t": "x"}
    (two,) = api.schedule_many(CheckedSpec.many([("k", None, None, None, None, 0, headers)]))
    headers["later"] = "z"
    assert api.get(two).headers == {"t": "x", "late": "y"}


def test_a_hook_sees_a_checked_spec_as_a_task_spec_and_its_result_is_checked(
    server: EmbeddedServer, qname: str
) -> None:
    def bad_id(spec: TaskSpec) -> TaskSpec:
        assert type(spec) is TaskSpec
        return dataclasses.replace(spec, task_id="bad\nid")

    with Queue(qname, url=server.url, before_schedule=[bad_id]) as q:
        with pytest.raises(InvalidTaskError, match="control characters"):
            q.schedule_many([CheckedSpec("k", task_id="fine")])
        assert q.stats().scheduled == 0


def test_payload_round_trips_exactly(api: Any) -> None:
    payload = {
        "big": 2**62 + 1,
        "pi": 3.141592653589793,
        "text": "订单 ✓",
        "none": None,
        "list": [1, "2", [3.5]],
        "nested": {"a": {"b": True}},
    }
    tid = api.schedule("k", payload, delay=60)
    assert api.get(tid).payload == payload


def test_a_workers_task_reads_like_one_built_by_hand() -> None:
    """Workers make ``due_at`` on first read (Task.claimed): it must not show."""
    due = datetime(2026, 12, 1, 9, 30, 0, 123456, tzinfo=UTC)
    lazy = Task.claimed("t1", "k", {"a": 1}, 2, 5, due.timestamp() * 1000, "q", 7)
    built = Task("t1", "k", {"a": 1}, 2, 5, due, "q", 7)
    assert lazy.due_at == due
    assert lazy == built and repr(lazy) == repr(built)
    assert "token" not in repr(lazy)  # a lease token is not for logs
    assert lazy != Task.claimed("t1", "k", {"a": 1}, 2, 5, due.timestamp() * 1000, "q", 8)
    match lazy:
        case Task("t1", "k", {"a": 1}, 2, 5, when):
            assert when == due
        case _:
            pytest.fail("a Task matches by position as the dataclass it was did")
    later = due + timedelta(seconds=1)
    lazy.due_at = later
    assert lazy.due_at == later
