"""Task headers (issue 20, part A) and the producer hook, on real servers: headers reach the
handler on every attempt, survive retries, replays and reschedules, are shown by ``delayq
task show`` and the dashboard, and are refused at the edge, unwritten, when malformed."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from delayq import AsyncQueue, Fail, Queue, Task, TaskSpec, Worker, hooks
from delayq.codec import MAX_HEADERS, encode_record
from delayq.embedded import EmbeddedServer
from delayq.errors import ConfigurationError, InvalidTaskError

from .conftest import WorkerThread
from .support.dashboard_helpers import TOKEN, DashboardThread
from .support.helpers import wait_for

TRACE = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "a"}
RunWorker = Callable[[Worker], WorkerThread]


def state(queue: Queue, tid: str) -> str | None:
    info = queue.get(tid)
    return info.state if info else None


def raw_record(queue: Queue, tid: str) -> bytes:
    record = queue.client.hget(queue.core.keys.tasks, tid)
    assert isinstance(record, bytes)
    return record


# -- to the handler ------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["async", "sync"])
def test_headers_reach_the_handler_and_each_task_has_its_own_dict(
    queue: Queue, run_worker: RunWorker, flavour: str
) -> None:
    worker = Worker(queue, concurrency=4)
    seen: dict[str, dict[str, str]] = {}

    def record(task: Task) -> None:
        seen[task.id] = task.headers
        task.headers["touched"] = task.id  # a task's own dict: no other task sees this

    if flavour == "async":

        @worker.handler("k")
        async def handle_async(task: Task) -> None:
            record(task)
    else:

        @worker.handler("k")
        def handle_sync(task: Task) -> None:
            record(task)

    with run_worker(worker):
        queue.schedule("k", 1, task_id="with", headers=dict(TRACE))
        queue.schedule_many([TaskSpec("k", 2, task_id="none1"), {"kind": "k", "task_id": "none2"}])
        queue.schedule("k", 3, task_id="empty", headers={})
        wait_for(lambda: len(seen) == 4)
    assert seen["with"] == {**TRACE, "touched": "with"}
    assert seen["none1"] == {"touched": "none1"}
    assert seen["none2"] == {"touched": "none2"}
    assert seen["empty"] == {"touched": "empty"}
    assert len({id(h) for h in seen.values()}) == 4


def test_headers_are_the_same_on_every_attempt(queue: Queue, run_worker: RunWorker) -> None:
    worker = Worker(queue)
    attempts: list[tuple[int, dict[str, str]]] = []

    @worker.handler("flaky", backoff=[0.05])
    async def flaky(task: Task) -> None:
        attempts.append((task.attempt, dict(task.headers)))
        if task.attempt == 1:
            raise RuntimeError("first attempt fails")

    with run_worker(worker):
        queue.schedule("flaky", None, task_id="r", headers=TRACE)
        wait_for(lambda: state(queue, "r") == "done")
    assert attempts == [(1, TRACE), (2, TRACE)]


def test_headers_survive_a_replay_from_the_dead_set(queue: Queue, run_worker: RunWorker) -> None:
    worker = Worker(queue)
    runs: list[dict[str, str]] = []

    @worker.handler("once-bad")
    def once_bad(task: Task) -> None:
        runs.append(dict(task.headers))
        if len(runs) == 1:
            raise Fail("dies the first time")

    with run_worker(worker):
        queue.schedule("once-bad", None, task_id="d", headers=TRACE)
        wait_for(lambda: state(queue, "d") == "dead")
        (dead,) = queue.dead()
        assert dead.headers == TRACE
        assert queue.replay(["d"]) == 1
        wait_for(lambda: state(queue, "d") == "done")
    assert runs == [TRACE, TRACE]


def test_headers_survive_a_reschedule_and_replace_writes_the_new_calls(
    queue: Queue, run_worker: RunWorker
) -> None:
    queue.schedule("k", None, task_id="moved", delay=3600, headers=TRACE)
    assert queue.reschedule("moved", delay=0)
    queue.schedule("k", None, task_id="replaced", delay=3600, headers=TRACE)
    assert queue.schedule("k", None, task_id="replaced", headers={"v": "2"}, replace=True).replaced
    queue.schedule("k", None, task_id="cleared", delay=3600, headers=TRACE)
    assert queue.schedule("k", None, task_id="cleared", replace=True).replaced
    # Without replace, the first call's headers stay.
    queue.schedule("k", None, task_id="kept", delay=3600, headers=TRACE)
    assert queue.schedule("k", None, task_id="kept", headers={"v": "2"}).status == "unchanged"
    kept = queue.get("kept")
    assert kept is not None and kept.headers == TRACE

    worker = Worker(queue)
    seen: dict[str, dict[str, str]] = {}
    worker.handler("k")(lambda task: seen.__setitem__(task.id, task.headers))
    with run_worker(worker):
        wait_for(lambda: len(seen) == 3)
    assert seen == {"moved": TRACE, "replaced": {"v": "2"}, "cleared": {}}


# -- inspection ----------------------------------------------------------------------------


def test_get_dead_and_pages_show_headers(queue: Queue) -> None:
    queue.schedule("k", {"a": 1}, task_id="h", delay=60, headers=TRACE)
    queue.schedule("k", {"a": 2}, task_id="n", delay=61)
    info = queue.get("h")
    assert info is not None and info.headers == TRACE and info.payload == {"a": 1}
    none = queue.get("n")
    assert none is not None and none.headers == {}
    page = queue.page("scheduled")
    assert [(t.id, t.headers) for t in page.tasks] == [("h", TRACE), ("n", {})]


def test_a_record_without_headers_is_as_before_and_one_from_before_reads_empty(
    queue: Queue, run_worker: RunWorker
) -> None:
    queue.schedule("k", {"x": 1}, task_id="plain", delay=3600)
    record = raw_record(queue, "plain")
    head = json.loads(record.split(b"\n", 1)[0])
    assert record == encode_record(
        "k", b'{"x":1}', max_attempts=0, created_ms=head["c"], fmt="json"
    )
    assert set(head) == {"k", "c"}

    # Written by hand in the format older versions write (no "h"), as an old producer would.
    old = b'{"k":"k","m":3,"c":1700000000000}\n{"x":2}'
    queue.client.hset(queue.core.keys.tasks, "old", old)
    queue.client.zadd(queue.core.keys.scheduled, {"old": 0})
    info = queue.get("old")
    assert info is not None and info.headers == {} and info.max_attempts == 3
    worker = Worker(queue)
    seen: list[tuple[Any, dict[str, str]]] = []
    worker.handler("k")(lambda task: seen.append((task.payload, task.headers)))
    with run_worker(worker):
        wait_for(lambda: state(queue, "old") == "done")
    assert seen == [({"x": 2}, {})]


def test_headers_are_the_records_last_field_and_tricky_text_round_trips(
    queue: Queue, run_worker: RunWorker
) -> None:
    """The claim script finds the headers after "c" by pattern: values that look like the
    record's own syntax, braces, quotes, newlines and non-ASCII text come back exactly."""
    tricky = {
        "a": ',"c":1,"h":{"x":"y"}}',
        "c": "5",
        "h": "}\n{",
        "ünï": 'café ☕ \u2028 \\ "q"',
        "m": "",
    }
    queue.schedule("k", None, task_id="t", headers=tricky, max_attempts=2)
    head = raw_record(queue, "t").split(b"\n", 1)[0]
    assert head.startswith(b'{"k":"k","m":2,"c":') and head.endswith(b"}}")
    assert json.loads(head)["h"] == tricky
    worker = Worker(queue)
    seen: list[dict[str, str]] = []
    worker.handler("k")(lambda task: seen.append(task.headers))
    with run_worker(worker):
        wait_for(lambda: seen)
    assert seen == [tricky]


def test_a_record_with_headers_that_are_not_strings_is_buried_with_a_reason(
    queue: Queue, run_worker: RunWorker
) -> None:
    """Written by another program: the worker refuses it rather than hand a handler junk."""
    queue.client.hset(queue.core.keys.tasks, "bad", b'{"k":"k","c":1,"h":{"n":1}}\nnull')
    queue.client.zadd(queue.core.keys.scheduled, {"bad": 0})
    worker = Worker(queue)
    worker.handler("k")(lambda task: None)
    with run_worker(worker):
        wait_for(lambda: state(queue, "bad") == "dead")
    dead = queue.dead()
    assert dead[0].id == "bad" and "headers" in (dead[0].last_error or "")


# -- validation ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"n": 1}, "must be strings: convert it with str()"),
        ({"n": None}, "must be strings"),
        ({1: "x"}, "header names must be non-empty strings"),
        ({"": "x"}, "header names must be non-empty strings"),
        ({"n": "\udcff"}, "is not valid Unicode text"),
        ({"\udcff": "x"}, "is not valid Unicode text"),
        ({"big": "x" * MAX_HEADERS}, f"over the limit of {MAX_HEADERS}"),
        ([("n", "v")], "headers must be a dict of str to str"),
        ("n=v", "headers must be a dict of str to str"),
    ],
)
def test_bad_headers_are_refused_and_nothing_is_written(
    queue: Queue, headers: Any, message: str
) -> None:
    with pytest.raises(InvalidTaskError, match=re.escape(message)):
        queue.schedule("k", None, task_id="one", headers=headers)
    with pytest.raises(InvalidTaskError, match=r"header"):
        queue.schedule_many(
            [
                TaskSpec("k", task_id="good", headers=TRACE),
                TaskSpec("k", task_id="bad", headers=headers),
            ]
        )
    assert queue.get("one") is None and queue.get("good") is None
    assert queue.stats().scheduled == 0


def test_headers_just_under_the_limit_are_taken(queue: Queue) -> None:
    fits = {"big": "x" * (MAX_HEADERS - len('{"big":""}'))}
    queue.schedule("k", None, task_id="fits", headers=fits)
    info = queue.get("fits")
    assert info is not None and info.headers == fits
    with pytest.raises(InvalidTaskError, match="over the limit"):
        queue.schedule("k", None, task_id="over", headers={"big": fits["big"] + "x"})


# -- the producer hook -----------------------------------------------------------------------


def test_before_schedule_adds_headers_the_handler_sees_after_the_global_hooks(
    server: EmbeddedServer,
    qname: str,
    run_worker: RunWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    order: list[str] = []

    def global_hook(spec: TaskSpec) -> None:
        order.append(f"global {spec.task_id}")
        assert spec.headers is not None
        spec.headers["traceparent"] = "from-global"

    def queue_hook(spec: TaskSpec) -> TaskSpec | None:
        order.append(f"queue {spec.task_id}")
        assert spec.headers is not None and spec.headers["traceparent"] == "from-global"
        if spec.task_id == "new-spec":
            return dataclasses.replace(spec, payload="changed", headers={"only": "this"})
        spec.headers["tenant"] = "b"  # overrides the caller's
        return None

    monkeypatch.setattr(hooks, "before_schedule", [global_hook])
    mine = {"tenant": "a", "user": "u"}
    with Queue(qname, url=server.url, before_schedule=[queue_hook]) as queue:
        queue.schedule("k", "p", task_id="one", headers=mine)
        queue.schedule_many(
            [TaskSpec("k", "p", task_id="two"), {"kind": "k", "task_id": "new-spec"}]
        )
        assert mine == {"tenant": "a", "user": "u"}, "the caller's dict is not changed"
        assert order == [
            "global one",
            "queue one",
            "global two",
            "queue two",
            "global new-spec",
            "queue new-spec",
        ]
        worker = Worker(queue)
        seen: dict[str, tuple[Any, dict[str, str]]] = {}
        worker.handler("k")(lambda task: seen.__setitem__(task.id, (task.payload, task.headers)))
        with run_worker(worker):
            wait_for(lambda: len(seen) == 3)
    assert seen == {
        "one": ("p", {"tenant": "b", "user": "u", "traceparent": "from-global"}),
        "two": ("p", {"traceparent": "from-global", "tenant": "b"}),
        "new-spec": ("changed", {"only": "this"}),
    }


def test_a_hook_sees_ids_unassigned_and_its_errors_refuse_the_call(
    server: EmbeddedServer, qname: str
) -> None:
    def bad_value(spec: TaskSpec) -> None:
        assert spec.headers is not None
        spec.headers["n"] = 1  # type: ignore[assignment]

    with Queue(qname, url=server.url, before_schedule=[bad_value]) as queue:
        with pytest.raises(InvalidTaskError, match="must be strings"):
            queue.schedule("k", None)
        assert queue.stats().scheduled == 0
    with Queue(qname, url=server.url, before_schedule=[lambda spec: "junk"]) as queue:
        with pytest.raises(ConfigurationError, match="return a TaskSpec"):
            queue.schedule("k", None)
        assert queue.stats().scheduled == 0
    with pytest.raises(ConfigurationError, match="before_schedule takes functions"):
        Queue(qname, url=server.url, before_schedule=["not callable"])  # type: ignore[list-item]


async def test_async_queue_headers_and_hook(server: EmbeddedServer, qname: str) -> None:
    def hook(spec: TaskSpec) -> None:
        assert spec.headers is not None
        spec.headers["hooked"] = "yes"

    async with AsyncQueue(qname, url=server.url, before_schedule=[hook]) as aq:
        await aq.schedule("k", None, task_id="a", delay=60, headers={"tenant": "a"})
        await aq.schedule_many([TaskSpec("k", task_id="b", delay=60, headers={"x": "y"})])
        a, b = await aq.get("a"), await aq.get("b")
        assert a is not None and a.headers == {"tenant": "a", "hooked": "yes"}
        assert b is not None and b.headers == {"x": "y", "hooked": "yes"}
        with pytest.raises(InvalidTaskError, match="must be strings"):
            await aq.schedule("k", None, task_id="c", headers={"n": 2})  # type: ignore[dict-item]
        assert await aq.get("c") is None


# -- shown to people -------------------------------------------------------------------------


def test_task_show_prints_the_headers(server: EmbeddedServer, queue: Queue) -> None:
    from delayq.cli.main import main

    runner = CliRunner(env={"DELAYQ_REDIS_URL": server.url, "DELAYQ_QUEUE": ""})
    queue.schedule("k", None, task_id="shown", delay=60, headers={"tenant": "a", "x": "1\n2"})
    result = runner.invoke(main, ["task", "show", "shown", "-q", queue.name])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    i = next(i for i, line in enumerate(lines) if line.strip().startswith("headers"))
    assert lines[i].split() == ["headers", "tenant:", "a"]
    assert lines[i + 1].split() == ["x:", "1\\n2"]  # one line each
    shown = runner.invoke(main, ["task", "show", "shown", "-q", queue.name, "--json"])
    assert json.loads(shown.stdout)["headers"] == {"tenant": "a", "x": "1\n2"}
    plain = runner.invoke(
        main, ["schedule", "-q", queue.name, "k", "--delay", "1m", "--id", "p", "--header", "a=b=c"]
    )
    assert plain.exit_code == 0, plain.output
    info = queue.get("p")
    assert info is not None and info.headers == {"a": "b=c"}
    no = runner.invoke(main, ["task", "show", "p", "-q", queue.name])
    assert "headers" in no.output
    queue.schedule("k", None, task_id="bare", delay=60)
    bare = runner.invoke(main, ["task", "show", "bare", "-q", queue.name])
    assert bare.exit_code == 0 and "headers" not in bare.output
    bad = runner.invoke(main, ["schedule", "-q", queue.name, "k", "--header", "novalue"])
    assert bad.exit_code != 0 and "NAME=VALUE" in bad.output


def test_the_dashboards_task_page_shows_headers_as_text(
    server: EmbeddedServer, queue: Queue
) -> None:
    queue.schedule("k", None, task_id="dash", delay=60, headers={"x-evil": "<b>bold</b>"})
    with (
        DashboardThread(server.url, [queue.name]) as base,
        httpx.Client(base_url=base, timeout=10) as http,
    ):
        page = http.get("/task?id=dash", headers={"Authorization": f"Bearer {TOKEN}"})
    assert page.status_code == 200
    assert "<h3>Headers</h3>" in page.text
    assert "<dt>x-evil</dt><dd>&lt;b&gt;bold&lt;/b&gt;</dd>" in page.text
    assert "<b>bold</b>" not in page.text


def test_headers_a_later_hook_adds_to_a_checked_spec_an_earlier_one_returned_are_written(
    server: EmbeddedServer, qname: str
) -> None:
    """A before_schedule hook may return a CheckedSpec (anything that checks tasks may make
    one); the next hook adds its headers in place, as hooks do. A CheckedSpec's record is
    written from the headers it encoded when it was made, so the later header was dropped
    silently."""
    from delayq import CheckedSpec

    def checking(spec: TaskSpec) -> TaskSpec:
        return CheckedSpec(**vars(spec))  # TaskSpec keeps exactly its fields in __dict__

    def tracing(spec: TaskSpec) -> None:
        assert spec.headers is not None
        spec.headers["trace"] = "t-1"

    with Queue(qname, url=server.url, before_schedule=[checking, tracing]) as queue:
        queue.schedule("k", None, delay=60, task_id="h1", headers={"tenant": "a"})
        info = queue.get("h1")
        assert info is not None
        assert info.headers == {"tenant": "a", "trace": "t-1"}
