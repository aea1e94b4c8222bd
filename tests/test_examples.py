"""The examples under examples/, run against real servers with a real Worker."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from delayq import AsyncQueue, Queue
from delayq.embedded import EmbeddedServer
from examples.fastapi_orders.app import create_app
from examples.fastapi_orders.settings import Settings, close_task_id
from examples.fastapi_orders.store import Store
from examples.fastapi_orders.worker import make_worker
from examples.flaky_http import KIND, StandInStorage
from examples.flaky_http import make_worker as make_http_worker

from .helpers import wait_for

ROOT = Path(__file__).resolve().parent.parent

# -- examples/fastapi_orders -------------------------------------------------------------------


@pytest.fixture
def settings(server: EmbeddedServer, qname: str, tmp_path: Path) -> Settings:
    return Settings(
        redis_url=server.url, database=str(tmp_path / "orders.db"), queue=qname, close_after=0.5
    )


@pytest.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The ASGI app with its lifespan running (it opens and closes the app's AsyncQueue)."""
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://orders.test") as client,
    ):
        yield client


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Await ``check()`` until it is true (the app runs on this loop: no blocking waits)."""
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(0.02)


async def stock(api: httpx.AsyncClient, product_id: int = 1) -> int:
    r = await api.get(f"/products/{product_id}")
    assert r.status_code == 200, r.text
    return int(r.json()["stock"])


async def order_status(api: httpx.AsyncClient, order_id: str) -> str:
    r = await api.get(f"/orders/{order_id}")
    assert r.status_code == 200, r.text
    return str(r.json()["status"])


async def task_state(queue: AsyncQueue, task_id: str) -> str | None:
    info = await queue.get(task_id)
    return info.state if info else None


async def place(api: httpx.AsyncClient, product_id: int, qty: int) -> dict[str, Any]:
    r = await api.post("/orders", json={"product_id": product_id, "qty": qty})
    assert r.status_code == 201, r.text
    order: dict[str, Any] = r.json()
    assert order["status"] == "pending"
    return order


async def test_unpaid_order_is_closed_on_time_with_stock_back(
    api: httpx.AsyncClient, aqueue: AsyncQueue, settings: Settings, run_worker: Any
) -> None:
    start = await stock(api)
    order = await place(api, 1, 3)
    assert await stock(api) == start - 3
    close_id = close_task_id(order["id"])
    task = await aqueue.get(close_id)
    assert task is not None and task.state == "scheduled" and task.kind == "order.close"

    with run_worker(make_worker(settings)):
        await until(lambda: _is(task_state(aqueue, close_id), "done"))
    closed = (await api.get(f"/orders/{order['id']}")).json()
    assert closed["status"] == "closed"
    # Never early. The task is due on the Redis server's clock (this machine's, in whole ms),
    # counted from a moment just after the API computed close_at.
    assert closed["closed_at"] >= order["close_at"] - 0.002
    assert await stock(api) == start  # the reserved stock is back, once
    assert (await aqueue.stats()).counters.get("succeeded") == 1


async def test_paying_cancels_the_close(
    api: httpx.AsyncClient, aqueue: AsyncQueue, settings: Settings, run_worker: Any
) -> None:
    start = await stock(api)
    order = await place(api, 1, 2)
    r = await api.post(f"/orders/{order['id']}/pay")
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "paid" and r.json()["close_task_cancelled"] is True
    assert await aqueue.get(close_task_id(order["id"])) is None  # the close task is gone

    with run_worker(make_worker(settings)):
        await asyncio.sleep(settings.close_after + 0.5)  # well past the deadline
    assert await order_status(api, order["id"]) == "paid"
    assert await stock(api) == start - 2  # sold, not given back
    # Paying again is harmless: the order stays paid, and there is nothing left to cancel.
    again = (await api.post(f"/orders/{order['id']}/pay")).json()
    assert again["status"] == "paid" and again["close_task_cancelled"] is False


async def test_close_that_races_a_payment_is_discarded(
    api: httpx.AsyncClient, aqueue: AsyncQueue, settings: Settings, run_worker: Any
) -> None:
    """The payment lands but its cancel does not (the close was already running, or the API
    died in between): the close runs anyway, finds the order paid, and changes nothing."""
    start = await stock(api)
    order = await place(api, 1, 4)
    assert Store(settings.database).pay(order["id"]) == "paid"  # the close task still waits
    late = await place(api, 1, 1)  # never paid in time

    with run_worker(make_worker(settings)):
        await until(lambda: _is(task_state(aqueue, close_task_id(order["id"])), "done"))
        await until(lambda: _is(order_status(api, late["id"]), "closed"))
    assert await order_status(api, order["id"]) == "paid"
    counters = (await aqueue.stats()).counters
    assert counters.get("discarded") == 1 and counters.get("succeeded") == 1
    # A payment after the close lost the race: the API says so, and the stock stays back.
    r = await api.post(f"/orders/{late['id']}/pay")
    assert r.status_code == 409, r.text
    assert await order_status(api, late["id"]) == "closed"
    assert await stock(api) == start - 4


async def test_a_refused_order_leaves_no_close_task(
    api: httpx.AsyncClient, aqueue: AsyncQueue
) -> None:
    r = await api.post("/orders", json={"product_id": 2, "qty": 6})  # product 2 has 5
    assert r.status_code == 409, r.text
    stats = await aqueue.stats()
    assert stats.scheduled == 0 and stats.counters.get("cancelled") == 1
    assert (await api.post("/orders", json={"product_id": 1, "qty": 0})).status_code == 422
    assert (await api.get("/orders/nope")).status_code == 404
    assert (await api.post("/orders/nope/pay")).status_code == 404


async def _is(value: Awaitable[object], expected: object) -> bool:
    return await value == expected


# -- examples/flaky_http.py -------------------------------------------------------------------

# What the stand-in storage service answers for each object, request by request (the last
# answer repeats), and what should become of its task with max_attempts=3.
SCRIPT: dict[str, list[Any]] = {
    "ok": [(204, {}, "")],
    "gone": [(404, {}, "no such object")],
    "slow": ["hang", "hang", (204, {}, "")],
    "busy": [(503, {"Retry-After": "0"}, "busy"), (204, {}, "")],
    "throttled": [(429, {}, "slow down"), (200, {}, "deleted")],
    "private": [(403, {}, "forbidden")],
    "attached": [(409, {}, "attached to invoice 7")],
    "malformed": [(400, {}, "bad object name")],
    "broken": [(500, {}, "internal error")],
}
EXPECTED = {  # state, attempts, requests seen, start of the last error
    "ok": ("done", 1, 1, None),
    "gone": ("done", 1, 1, None),
    "slow": ("done", 3, 3, "Traceback"),  # two timeouts, retried after the backoff
    "busy": ("done", 2, 2, "Retry: 503 from storage, Retry-After 0 s"),
    "throttled": ("done", 2, 2, "Traceback"),
    "private": ("dead", 1, 1, "Fail: permission denied (403)"),
    "attached": ("done", 1, 1, None),
    "malformed": ("dead", 1, 1, "Fail: storage refused the request (400)"),
    "broken": ("dead", 3, 3, "attempt 3 of 3 failed"),
}


@pytest.fixture
def storage() -> Iterator[StandInStorage]:
    """A scripted HTTP server on a free 127.0.0.1 port, in a thread."""
    srv = StandInStorage(SCRIPT)
    yield srv
    srv.close()


def test_flaky_http_outcomes_follow_the_classification(
    server: EmbeddedServer, qname: str, storage: StandInStorage, run_worker: Any
) -> None:
    alerts: list[str] = []
    worker = make_http_worker(
        storage.url,
        queue=qname,
        redis_url=server.url,
        timeout=0.3,
        backoff=(0.05, 0.1),
        max_attempts=3,
        alert=alerts.append,
    )
    with Queue(qname, url=server.url) as queue, run_worker(worker):
        for key in SCRIPT:
            queue.schedule(KIND, {"object": key}, task_id=key)

        def finished() -> bool:
            infos = [queue.get(key) for key in SCRIPT]
            return all(i is not None and i.state in ("done", "dead") for i in infos)

        wait_for(finished, timeout=20)
        infos = {key: queue.get(key) for key in SCRIPT}
        counters = queue.stats().counters
    requests = Counter(storage.requests)
    for key, (state, attempts, seen, error) in EXPECTED.items():
        info = infos[key]
        assert info is not None
        assert (info.state, info.attempts, requests[key]) == (state, attempts, seen), key
        if error is None:
            assert info.last_error is None, key
        else:
            assert (info.last_error or "").startswith(error), (key, info.last_error)
    assert "httpx.ReadTimeout" in (infos["slow"].last_error or "")  # type: ignore[union-attr]
    assert "StorageUnavailable: 429" in (infos["throttled"].last_error or "")  # type: ignore[union-attr]
    assert counters["discarded"] == 1 and counters["dead"] == 3
    # One alert per dead task, naming it and why.
    assert sorted(a.split(" ")[1] for a in alerts) == ["broken", "malformed", "private"]
    assert any("StorageUnavailable: 500 from storage" in a for a in alerts)


def test_flaky_http_example_runs(server: EmbeddedServer) -> None:
    """``python examples/flaky_http.py`` as a user runs it (on the fixture's server)."""
    out = subprocess.run(
        [sys.executable, "examples/flaky_http.py", "--url", server.url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "every task ended as expected" in out.stdout
