"""Worker middleware: around every handler invocation (tasks, cron occurrences, expiring
keys' callbacks), in registration order inside the process-wide ``delayq.hooks.middleware``,
and an exception from a middleware classified as the handler's would be."""

from __future__ import annotations

import asyncio
import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from delayq import ConfigurationError, Discard, Fail, Queue, Retry, Task, Worker, hooks
from delayq.expiring.facade import Expired
from delayq.expiring.ops import EXPIRE_KIND
from delayq.worker.engine import HANDLER_THREAD_PREFIX

from .support.helpers import wait_for

CallNext = Callable[[Task], Any]


def state(queue: Queue, tid: str) -> str | None:
    info = queue.get(tid)
    return info.state if info else None


def recorder(log: list[str], name: str) -> Any:
    async def mw(task: Task, call_next: CallNext) -> Any:
        log.append(f"{name}>")
        try:
            return await call_next(task)
        finally:
            log.append(f"<{name}")

    return mw


@pytest.fixture
def global_middleware() -> Iterator[list[Any]]:
    """delayq.hooks.middleware, restored afterwards."""
    saved = list(hooks.middleware)
    yield hooks.middleware
    hooks.middleware[:] = saved


def test_middlewares_run_in_registration_order_around_the_handler(
    queue: Queue, run_worker: Any
) -> None:
    worker = Worker(queue)
    log: list[str] = []
    seen: list[Any] = []
    worker.middleware(recorder(log, "a"))
    worker.middleware(recorder(log, "b"))

    @worker.middleware
    async def result(task: Task, call_next: CallNext) -> Any:
        value = await call_next(task)
        seen.append(value)
        return value

    @worker.handler("work")
    async def work(task: Task) -> str:
        log.append(f"handler {task.payload}")
        return "result"

    with run_worker(worker):
        queue.schedule("work", 7, task_id="w1")
        wait_for(lambda: state(queue, "w1") == "done")
    assert log == ["a>", "b>", "handler 7", "<b", "<a"]
    assert seen == ["result"]


def test_process_wide_middleware_runs_outside_the_workers_own(
    queue: Queue, run_worker: Any, global_middleware: list[Any]
) -> None:
    log: list[str] = []
    worker = Worker(queue)
    worker.middleware(recorder(log, "own"))
    global_middleware.append(recorder(log, "global"))

    @worker.handler("work")
    async def work(task: Task) -> None:
        log.append("handler")

    with run_worker(worker):
        queue.schedule("work", None, task_id="g1")
        wait_for(lambda: state(queue, "g1") == "done")
    assert log == ["global>", "own>", "handler", "<own", "<global"]


def test_a_sync_handlers_middleware_runs_on_the_loop_around_the_thread_call(
    queue: Queue, run_worker: Any
) -> None:
    worker = Worker(queue)
    where: dict[str, Any] = {}

    @worker.middleware
    async def timing(task: Task, call_next: CallNext) -> Any:
        where["middleware"] = threading.current_thread().name
        where["loop"] = asyncio.get_running_loop() is not None
        t = time.perf_counter()
        try:
            return await call_next(task)
        finally:
            where["took"] = time.perf_counter() - t

    @worker.handler("blocking")
    def blocking(task: Task) -> None:
        where["handler"] = threading.current_thread().name
        time.sleep(0.2)

    with run_worker(worker):
        queue.schedule("blocking", None, task_id="s1")
        wait_for(lambda: state(queue, "s1") == "done")
    assert where["handler"].startswith(HANDLER_THREAD_PREFIX)
    assert not where["middleware"].startswith(HANDLER_THREAD_PREFIX)
    assert where["middleware"] != where["handler"] and where["loop"]
    assert where["took"] >= 0.2  # it waited for the thread call


REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")


def test_a_sync_handler_sees_the_context_its_middleware_set(queue: Queue, run_worker: Any) -> None:
    """Found by review: the handler thread ran in an empty context, so a sync handler saw
    neither a middleware's context variables nor (with OpenTelemetry) its attempt's span."""
    worker = Worker(queue)
    seen: dict[str, str] = {}

    @worker.middleware
    async def tag(task: Task, call_next: CallNext) -> Any:
        token = REQUEST_ID.set(f"req-{task.id}")
        try:
            return await call_next(task)
        finally:
            REQUEST_ID.reset(token)

    @worker.handler("blocking")
    def blocking(task: Task) -> None:
        seen[task.id] = REQUEST_ID.get()

    with run_worker(worker):
        queue.schedule("blocking", None, task_id="c1")
        wait_for(lambda: state(queue, "c1") == "done")
    assert seen == {"c1": "req-c1"}


def test_middleware_wraps_each_cron_occurrence_once(queue: Queue, run_worker: Any) -> None:
    worker = Worker(queue)
    log: list[str] = []
    kinds: list[str] = []

    @worker.middleware
    async def mw(task: Task, call_next: CallNext) -> Any:
        kinds.append(task.kind)
        log.append("mw>")
        try:
            return await call_next(task)
        finally:
            log.append("<mw")

    @worker.every(seconds=1, name="tick")
    async def tick(task: Task) -> None:
        log.append("tick")

    with run_worker(worker):
        wait_for(lambda: log.count("<mw") >= 1, timeout=15)
    n = log.count("tick")
    assert n >= 1
    # Once per occurrence: the occurrence's internal runner is not wrapped as well.
    assert log[:3] == ["mw>", "tick", "<mw"] and log.count("mw>") == n
    assert kinds and all(k == "cron:tick" for k in kinds)


def test_middleware_wraps_an_expiring_keys_callback_and_sees_the_task(
    queue: Queue, run_worker: Any
) -> None:
    worker = Worker(queue)
    log: list[str] = []
    tasks: list[Task] = []
    got: list[Expired] = []

    @worker.middleware
    async def mw(task: Task, call_next: CallNext) -> Any:
        tasks.append(task)
        log.append("mw>")
        try:
            return await call_next(task)
        finally:
            log.append("<mw")

    @worker.on_expire("session:*")
    def expired(e: Expired) -> None:
        log.append("callback")
        got.append(e)

    with run_worker(worker):
        queue.expiring.set("session:1", {"user": 1}, ttl=0.3)
        wait_for(lambda: "<mw" in log)
        time.sleep(0.3)  # nothing more runs
    assert log == ["mw>", "callback", "<mw"]
    assert isinstance(got[0], Expired) and got[0].key == "session:1"
    assert got[0].value == {"user": 1}
    (task,) = tasks
    assert isinstance(task, Task) and task.kind == EXPIRE_KIND and got[0].task is task


def test_an_exception_from_a_middleware_is_classified_like_the_handlers(
    queue: Queue, run_worker: Any
) -> None:
    worker = Worker(queue)
    ran: list[tuple[str, int]] = []

    @worker.middleware
    async def policy(task: Task, call_next: CallNext) -> Any:
        action = task.payload
        if task.attempt == 1:
            if action == "retry":
                raise Retry("not yet", after=0.05)
            if action == "discard":
                raise Discard("not wanted")
            if action == "fail":
                raise Fail("forbidden")
            if action == "error":
                raise ValueError("middleware broke")
        return await call_next(task)

    @worker.handler("work", max_attempts=2, backoff=[0.05], jitter=0)
    async def work(task: Task) -> None:
        ran.append((task.payload, task.attempt))

    with run_worker(worker):
        for action in ("retry", "discard", "fail", "error"):
            queue.schedule("work", action, task_id=action)
        wait_for(lambda: state(queue, "retry") == "done" and state(queue, "error") == "done")
        wait_for(lambda: state(queue, "discard") == "done" and state(queue, "fail") == "dead")
    assert sorted(ran) == [("error", 2), ("retry", 2)]  # neither discarded nor failed ran
    assert queue.stats().counters["discarded"] == 1
    info = queue.get("fail")
    assert info is not None and info.attempts == 1 and info.last_error == "Fail: forbidden"
    info = queue.get("error")
    assert info is not None and info.attempts == 2


def test_a_middleware_must_be_an_async_function(queue: Queue) -> None:
    worker = Worker(queue)

    def sync_mw(task: Task, call_next: CallNext) -> Any:
        return call_next(task)

    with pytest.raises(ConfigurationError, match="async function"):
        worker.middleware(sync_mw)


def test_an_object_whose_call_is_sync_is_refused_when_registered(queue: Queue) -> None:
    """Found by review: a callable object passed the check (only plain functions were
    inspected), and then failed every task it wrapped."""
    worker = Worker(queue)

    class SyncCall:
        def __call__(self, task: Task, call_next: CallNext) -> Any:
            return call_next(task)

    with pytest.raises(ConfigurationError, match="async def"):
        worker.middleware(SyncCall())  # type: ignore[arg-type]


def test_an_object_whose_call_is_async_is_a_middleware(queue: Queue, run_worker: Any) -> None:
    seen: list[str] = []

    class Tag:
        async def __call__(self, task: Task, call_next: CallNext) -> Any:
            seen.append(task.id)
            return await call_next(task)

    worker = Worker(queue)
    worker.middleware(Tag())
    done = threading.Event()

    @worker.handler("work")
    async def work(task: Task) -> None:
        done.set()

    queue.schedule("work", {}, task_id="obj-mw")
    with run_worker(worker):
        assert done.wait(10)
    assert seen == ["obj-mw"]


def test_a_sync_function_in_the_process_wide_list_is_refused_at_start(queue: Queue) -> None:
    def sync_mw(task: Task, call_next: CallNext) -> Any:
        return call_next(task)

    worker = Worker(queue)
    hooks.middleware.append(sync_mw)  # type: ignore[arg-type]
    try:
        with pytest.raises(ConfigurationError, match="async def"):
            asyncio.run(asyncio.wait_for(worker.serve(), 20))  # not refused: TimeoutError
    finally:
        hooks.middleware.remove(sync_mw)  # type: ignore[arg-type]
