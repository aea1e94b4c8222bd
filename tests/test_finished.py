"""What a finished task keeps (issue 30 item 2) and what its handler returned (issue 33
section 2): tombstones, keep_finished="record", results, and queue.wait. Real servers, both
flavours."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from delayq import AsyncQueue, Fail, Queue, Task, TaskNotFound, Worker
from delayq.admin.inspect import finished
from delayq.codec import encode_record
from delayq.embedded import EmbeddedServer
from delayq.http import create_app
from delayq.runner import SyncRunner
from delayq.scripts import SCRIPTS
from delayq.testing import VirtualClock, drain
from delayq.waits import CALLS_AT_ONCE

from .conftest import WorkerThread
from .support.dashboard_helpers import TOKEN, DashboardThread

BEARER = {"Authorization": f"Bearer {TOKEN}"}


def returning(queue: Queue) -> Worker:
    """A worker whose handler returns what the payload says ("return"), or raises."""
    worker = Worker(queue, concurrency=8)

    @worker.handler("order.close")
    def close(task: Task) -> Any:
        if task.payload.get("fail"):
            raise Fail("card declined")
        if task.payload.get("sleep"):
            time.sleep(task.payload["sleep"])
        return task.payload.get("return")

    return worker


# -- tombstones ---------------------------------------------------------------------------


@pytest.mark.parametrize("keep", ["tombstone", "record"])
def test_a_done_task_keeps_a_tombstone_or_its_whole_record(
    server: EmbeddedServer, qname: str, keep: str
) -> None:
    clock = VirtualClock()
    queue = Queue(qname, url=server.url, clock=clock, keep_finished=keep)  # type: ignore[arg-type]
    worker = returning(queue)
    queue.schedule("order.close", {"order": 42}, task_id="o42", delay=5)
    drain(worker, until=timedelta(seconds=6))
    info = queue.get("o42")
    assert info is not None and info.state == "done" and info.finished_at is not None
    assert (info.kind, info.attempts, info.result) == ("order.close", 1, None)
    assert info.due_at is not None and info.due_at <= info.finished_at
    k = queue.core.keys
    raw = queue.client.hget(k.tasks, "o42")
    assert raw is not None
    if keep == "tombstone":
        assert info.payload is None and info.created_at is None
        assert raw[:1].isdigit() and len(raw) < 12  # "1 <ms> <code>": a few bytes
        assert queue.client.hget(k.attempts, "o42") is None
    else:
        assert info.payload == {"order": 42} and info.created_at is not None
        assert raw[:1] == b"{" and queue.client.hget(k.attempts, "o42") is not None
    # The dashboard's lateness chart reads the kind and the due time from it too.
    (recent,) = queue.runner.run(finished(queue.core))
    assert (recent.kind, recent.due_at, recent.finished_at) == (
        "order.close",
        info.due_at,
        info.finished_at,
    )
    # Within the dedupe window the id is still known: a duplicate is refused.
    assert queue.schedule("order.close", {"order": 43}, task_id="o42").status == "unchanged"
    queue.close()


def test_an_aborted_task_keeps_a_tombstone(queue: Queue) -> None:
    queue.schedule("order.close", {"order": 1}, task_id="a1", delay=600)
    assert queue.abort("a1")
    info = queue.get("a1")
    assert info is not None and info.state == "aborted" and info.finished_at is not None
    assert (info.kind, info.attempts, info.payload, info.due_at) == ("order.close", 0, None, None)
    assert queue.schedule("order.close", {}, task_id="a1").status == "unchanged"


def test_a_kind_of_any_length_costs_a_tombstone_the_same_bytes(
    server: EmbeddedServer, qname: str
) -> None:
    queue = Queue(qname, url=server.url, clock=VirtualClock())
    kind = "notifications." + "x" * 150
    worker = Worker(queue)
    worker.handler(kind)(lambda task: None)
    worker.handler("k")(lambda task: None)
    queue.schedule(kind, {}, task_id="long")
    queue.schedule("k", {}, task_id="short")
    drain(worker)
    k = queue.core.keys
    long, short = queue.client.hget(k.tasks, "long"), queue.client.hget(k.tasks, "short")
    assert long is not None and short is not None and abs(len(long) - len(short)) <= 1
    info = queue.get("long")
    assert info is not None and info.kind == kind
    queue.close()


def test_a_whole_done_record_written_before_still_reads(queue: Queue) -> None:
    """A done task as a 1.0 ack left it: its record, attempts entry and last error."""
    k, r = queue.core.keys, queue.client
    now = int(time.time() * 1000)
    record = encode_record(
        "old.kind", b'{"n":7}', max_attempts=3, created_ms=now - 9000, fmt="json"
    )
    r.hset(k.tasks, "old", record)
    r.hset(k.attempts, "old", f"12 2 {now - 5000}")
    r.hset(k.errors, "old", "flaky")
    r.zadd(k.done, {"old": now})
    info = queue.get("old")
    assert info is not None and info.state == "done"
    assert (info.kind, info.payload, info.attempts, info.max_attempts) == (
        "old.kind",
        {"n": 7},
        2,
        3,
    )
    assert info.last_error == "flaky" and info.result is None
    assert info.due_at is not None and abs(info.due_at.timestamp() * 1000 - (now - 5000)) < 1
    assert queue.schedule("old.kind", {}, task_id="old").status == "unchanged"
    page = queue.page("done")
    assert [t.id for t in page.tasks] == ["old"] and page.tasks[0].payload == {"n": 7}


def test_the_window_past_trims_the_tombstone_and_the_result(
    server: EmbeddedServer, qname: str
) -> None:
    clock = VirtualClock()
    queue = Queue(qname, url=server.url, clock=clock, dedupe_window=60)
    worker = returning(queue)
    queue.schedule("order.close", {"return": {"closed": True}}, task_id="first")
    drain(worker)
    k, r = queue.core.keys, queue.client
    assert r.hexists(k.tasks, "first") and r.hget(k.results, "first") == b'{"closed":true}'
    clock.advance(61)
    queue.schedule("order.close", {}, task_id="second")  # its ack trims the first
    drain(worker)
    assert not r.hexists(k.tasks, "first") and not r.hexists(k.results, "first")
    assert r.zscore(k.done, "first") is None and queue.get("first") is None
    assert queue.schedule("order.close", {}, task_id="first").status == "created"
    queue.close()


# -- results ----------------------------------------------------------------------------


def test_a_result_is_kept_and_shown_none_stores_nothing_and_too_big_is_dead(
    server: EmbeddedServer, qname: str
) -> None:
    queue = Queue(qname, url=server.url, max_result=100, clock=VirtualClock())
    worker = returning(queue)
    queue.schedule("order.close", {"return": {"closed": True, "n": [1, 2]}}, task_id="r1")
    queue.schedule("order.close", {"return": None}, task_id="r2")
    queue.schedule("order.close", {"return": "x" * 200}, task_id="big")
    queue.schedule("order.close", {"return": 0}, task_id="zero")
    drain(worker)
    k = queue.core.keys
    r1 = queue.get("r1")
    assert r1 is not None and r1.state == "done" and r1.result == {"closed": True, "n": [1, 2]}
    r2 = queue.get("r2")
    assert r2 is not None and r2.state == "done" and r2.result is None
    assert not queue.client.hexists(k.results, "r2")  # the tombstone alone
    zero = queue.get("zero")
    assert zero is not None and zero.result == 0
    big = queue.get("big")
    assert big is not None and big.state == "dead" and big.last_error is not None
    assert "202 bytes as JSON, over the queue's max_result of 100" in big.last_error

    cli = CliRunner(env={"DELAYQ_REDIS_URL": server.url, "DELAYQ_QUEUE": ""})
    from delayq.cli.main import main

    shown = cli.invoke(main, ["task", "show", "-q", qname, "r1"], catch_exceptions=False)
    assert shown.exit_code == 0 and "result" in shown.output and '"closed": true' in shown.output
    as_json = cli.invoke(main, ["task", "show", "-q", qname, "r1", "--json"])
    assert json.loads(as_json.stdout)["result"] == {"closed": True, "n": [1, 2]}

    async def http() -> None:
        app = create_app(server.url, token=TOKEN)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://a", headers=BEARER) as c:
            got = await c.get(f"/v1/queues/{qname}/tasks/r1")
            assert got.status_code == 200 and got.json()["result"] == {"closed": True, "n": [1, 2]}
            assert got.json()["payload"] is None
            none = await c.get(f"/v1/queues/{qname}/tasks/r2")
            assert none.json()["result"] is None
        await app.state.api.aclose()

    asyncio.run(http())
    with DashboardThread(server.url, [qname]) as base, httpx.Client(base_url=base) as web:
        page = web.get("/task", params={"id": "r1", "queue": qname}, headers=BEARER)
        assert page.status_code == 200 and "<h3>Result</h3>" in page.text
        assert "&#34;closed&#34;: true" in page.text or '"closed": true' in page.text
        other = web.get("/task", params={"id": "r2", "queue": qname}, headers=BEARER)
        assert other.status_code == 200 and "<h3>Result</h3>" not in other.text
    queue.close()


# -- wait ---------------------------------------------------------------------------------


def test_wait_returns_done_dead_and_aborted_and_raises_for_time_and_unknown_ids(
    queue: Queue, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    worker = returning(queue)
    queue.schedule("order.close", {"return": {"ok": 1}}, task_id="w-done", delay=0.5)
    queue.schedule("order.close", {"fail": True}, task_id="w-dead", delay=0.5)
    queue.schedule("order.close", {}, task_id="w-abort", delay=60)
    queue.schedule("order.close", {}, task_id="w-cancel", delay=60)
    queue.schedule("order.close", {}, task_id="w-late", delay=60)
    with pytest.raises(TaskNotFound, match="holds no task 'nope'"):
        queue.wait("nope", timeout=5)
    outcome: dict[str, Any] = {}

    def waiting(tid: str) -> None:
        try:
            outcome[tid] = queue.wait(tid, timeout=10)
        except Exception as e:
            outcome[tid] = e

    threads = [threading.Thread(target=waiting, args=(t,)) for t in ("w-abort", "w-cancel")]
    for t in threads:
        t.start()
    time.sleep(0.3)  # both waiting
    t0 = time.monotonic()
    assert queue.abort("w-abort") and queue.cancel("w-cancel")
    for t in threads:
        t.join(10)
    assert time.monotonic() - t0 < 1.0  # told, not found at the end of the timeout
    assert outcome["w-abort"].state == "aborted"
    assert isinstance(outcome["w-cancel"], TaskNotFound)
    with run_worker(worker):
        t0 = time.monotonic()
        done = queue.wait("w-done", timeout=10)
        assert done.state == "done" and done.result == {"ok": 1}
        dead = queue.wait("w-dead", timeout=10)
        assert dead.state == "dead" and "card declined" in (dead.last_error or "")
        assert time.monotonic() - t0 < 3
        again = queue.wait("w-done", timeout=0)  # finished already: at once
        assert again.state == "done"
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match=r"still scheduled after 0\.5 s"):
            queue.wait("w-late", timeout=0.5)
        assert 0.5 <= time.monotonic() - t0 < 2


async def test_await_wait_returns_done_and_raises_for_time_and_cancelled(
    server: EmbeddedServer, qname: str, run_worker: Callable[[Worker], WorkerThread]
) -> None:
    sync = Queue(qname, url=server.url)
    worker = returning(sync)
    aq = AsyncQueue(qname, url=server.url)
    try:
        await aq.schedule("order.close", {"return": [1, 2]}, task_id="a-done", delay=0.3)
        await aq.schedule("order.close", {}, task_id="a-late", delay=60)
        with pytest.raises(TaskNotFound):
            await aq.wait("nope", timeout=5)
        with run_worker(worker):
            t0 = time.monotonic()
            got = await asyncio.gather(aq.wait("a-done", timeout=10), aq.wait("a-done", timeout=10))
            assert [i.result for i in got] == [[1, 2], [1, 2]]
            assert time.monotonic() - t0 < 3  # both told by the one message
            with pytest.raises(TimeoutError):
                await aq.wait("a-late", timeout=0.3)
            waiter = asyncio.ensure_future(aq.wait("a-late", timeout=10))
            await asyncio.sleep(0.3)
            assert await aq.cancel("a-late")
            with pytest.raises(TaskNotFound):
                await asyncio.wait_for(waiter, 2)
    finally:
        await aq.close()
        sync.close()


# The commands delayq's scripts call: counted in INFO commandstats too, but run by the
# server inside a script call, not sent by a client.
IN_SCRIPTS = {
    name.lower()
    for script in SCRIPTS.values()
    for name in re.findall(r"redis\.call\('(\w+)'", script.source)
}


def kill_subscriber(r: Any) -> tuple[str, ...]:
    """The command that drops the one connection subscribed to a channel (by its id: a RESP3
    subscriber is not of CLIENT KILL's TYPE pubsub)."""
    (cid,) = [c["id"] for c in r.client_list() if int(c.get("sub", 0)) > 0]
    return ("CLIENT", "KILL", "ID", cid)


def test_a_wait_whose_subscription_was_lost_looks_again_at_once(
    make_server: Callable[..., EmbeddedServer],
) -> None:
    """The finish is announced while the waits' subscription is down (the server dropped
    it, then aborted the task, in one round trip): the wait subscribes again and looks,
    rather than hear nothing until its timeout's last look."""
    srv = make_server()
    queue = Queue("lost", url=srv.url)
    try:
        queue.schedule("t", {}, task_id="a", delay=60)
        outcome: dict[str, Any] = {}

        def waiting() -> None:
            outcome["a"] = queue.wait("a", timeout=20)

        thread = threading.Thread(target=waiting)
        thread.start()
        time.sleep(0.5)  # waiting, subscribed
        t0 = time.monotonic()
        kill = kill_subscriber(queue.client)
        _, aborted = SyncRunner(queue.client).run_after(kill, queue.core.abort("a"))
        assert aborted  # (CLIENT KILL ID replies 0 in a pipeline, but the connection goes)
        thread.join(20)
        assert outcome["a"].state == "aborted"
        assert time.monotonic() - t0 < 5, "heard only at the timeout's last look"
    finally:
        queue.close()


async def test_an_async_wait_whose_subscription_was_lost_looks_again_at_once(
    make_server: Callable[..., EmbeddedServer],
) -> None:
    srv = make_server()
    aq, sync = AsyncQueue("lost", url=srv.url), Queue("lost", url=srv.url)
    try:
        sync.schedule("t", {}, task_id="a", delay=60)
        waiting = asyncio.ensure_future(aq.wait("a", timeout=20))
        await asyncio.sleep(0.5)
        t0 = time.monotonic()
        kill = kill_subscriber(sync.client)
        _, aborted = SyncRunner(sync.client).run_after(kill, sync.core.abort("a"))
        assert aborted  # (CLIENT KILL ID replies 0 in a pipeline, but the connection goes)
        info = await asyncio.wait_for(waiting, 20)
        assert info.state == "aborted"
        assert time.monotonic() - t0 < 5, "heard only at the timeout's last look"
    finally:
        await aq.close()
        sync.close()


# What a new connection sends once (redis-py's handshake), and a subscription's start.
CONNECTING = {"hello", "client|setinfo", "script|load", "subscribe"}


def _commands(r: Any) -> tuple[int, int]:
    """(commands clients sent, commands scripts ran) so far, from INFO commandstats."""
    sent = inner = 0
    for command, calls in _calls(r).items():
        if command.split("|")[0] in IN_SCRIPTS:
            inner += calls
        else:
            sent += calls
    return sent, inner


def _calls(r: Any) -> Counter[str]:
    """Calls so far by command (subcommands apart: ``client|setinfo``), INFO commandstats."""
    out: Counter[str] = Counter()
    for name, stats in r.info("commandstats").items():
        command = name.removeprefix("cmdstat_")
        out[command] += int(stats["calls"])
    return out


def test_waiting_on_1000_tasks_costs_about_one_command_per_task(
    make_server: Callable[..., EmbeddedServer], run_worker: Callable[[Worker], WorkerThread]
) -> None:
    """wait on 1,000 tasks finishing over 10 s costs no more commands per second than an
    idle worker does, plus one per finished task (issue 33): measured as the commands a run
    with the waits takes beyond the same run without them."""
    srv = make_server()
    meter = Queue("meter", url=srv.url).client

    def run(name: str, waits: bool) -> tuple[float, int, int, Counter[str]]:
        queue = Queue(name, url=srv.url)
        worker = Worker(queue, concurrency=50)
        worker.handler("t")(lambda task: None)
        with run_worker(worker):
            time.sleep(1.5)  # started, idle
            idle0 = _commands(meter)[0]
            time.sleep(5)
            idle = (_commands(meter)[0] - idle0) / 5
            ids = [f"{name}-{i}" for i in range(1000)]
            for i, tid in enumerate(ids):
                queue.schedule("t", {}, task_id=tid, delay=0.5 + i / 100)

            async def measured() -> tuple[int, int, Counter[str]]:
                aq = AsyncQueue(name, url=srv.url)
                (sent0, inner0), t0 = _commands(meter), time.monotonic()
                calls0 = _calls(meter)
                if waits:
                    infos = await asyncio.gather(*(aq.wait(i, timeout=30) for i in ids))
                    assert all(i.state == "done" for i in infos)
                await asyncio.sleep(max(0.0, 11.5 - (time.monotonic() - t0)))  # the same span
                sent, inner = _commands(meter)
                calls = _calls(meter) - calls0
                await aq.close()
                return sent - sent0, inner - inner0, calls

            sent, inner, calls = asyncio.run(measured())
            assert queue.stats().done == 1000
        queue.close()
        return idle, sent, inner, calls

    idle, plain, plain_inner, plain_calls = run("plain", False)
    _, waited, waited_inner, waited_calls = run("waited", True)
    extra = waited - plain
    by_command = {
        c: waited_calls[c] - plain_calls[c]
        for c in sorted(waited_calls.keys() | plain_calls.keys())
        if c.split("|")[0] not in IN_SCRIPTS and waited_calls[c] != plain_calls[c]
    }
    print(
        f"idle worker {idle:.2f} commands/s; 1,000 tasks over 10 s, commands sent: {plain} "
        f"without waits, {waited} with (extra {extra}: {by_command}); run inside scripts: "
        f"{plain_inner} without, {waited_inner} with (extra {waited_inner - plain_inner})"
    )
    # Once per connection, not per second: the async queue's pool (at most CALLS_AT_ONCE
    # script calls at once) and its subscription, each saying HELLO and CLIENT SETINFO.
    setup = sum(n for c, n in by_command.items() if c in CONNECTING)
    assert by_command.get("hello", 0) <= CALLS_AT_ONCE + 2, by_command
    # The bar: the idle worker's commands per second over the 10 s, plus one per finished
    # task; the worker's own claims and acks differ a little between two runs (+50).
    assert extra - setup <= idle * 10 + 1000 + 50, by_command
    meter.close()
