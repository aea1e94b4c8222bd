"""The examples under examples/, in virtual time: their real delays (15 minutes, 30 s / 2 min
backoff, 02:00 every night, a 30-minute TTL) on a real server, in milliseconds of wall time.

tests/test_examples.py runs the same examples in real time with their delays shortened.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import AsyncIterator, Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest
import pytest_asyncio

from delayq import Queue, Task
from delayq.testing import VirtualClock, adrain, drain
from delayq.testing.plugin import (  # noqa: F401
    delayq_clock,
    delayq_queue,
    delayq_url,
    delete_queue,
)
from examples.fastapi_orders.app import create_app
from examples.fastapi_orders.settings import Settings, close_task_id
from examples.fastapi_orders.store import Store
from examples.fastapi_orders.worker import make_worker
from examples.flaky_http import KIND, Answer, StandInStorage
from examples.flaky_http import make_worker as make_http_worker
from examples.nightly_report import REPORT, SWEEP, TZ, create_orders
from examples.nightly_report import make_worker as make_report_worker
from examples.upload_cleanup import UploadSessions, session_key, temp_key
from examples.upload_cleanup import make_worker as make_upload_worker

MS = timedelta(milliseconds=1)

# -- examples/fastapi_orders: the real 15 minutes, through the API -------------------------------


@pytest.fixture
def settings(delayq_url: str, delayq_clock: VirtualClock, tmp_path: Path) -> Iterator[Settings]:
    """The example's settings, its default close_after (15 minutes), on a virtual clock."""
    name = f"orders-{secrets.token_hex(4)}"
    yield Settings(
        redis_url=delayq_url, database=str(tmp_path / "orders.db"), queue=name, clock=delayq_clock
    )
    delete_queue(delayq_url, name)


@pytest_asyncio.fixture
async def api(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The ASGI app with its lifespan running: its AsyncQueue reads the virtual clock."""
    app = create_app(settings)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://orders.test") as client,
    ):
        yield client


async def place(api: httpx.AsyncClient, qty: int) -> str:
    r = await api.post("/orders", json={"product_id": 1, "qty": qty})
    assert r.status_code == 201, r.text
    order_id: str = r.json()["id"]
    return order_id


async def status_and_stock(api: httpx.AsyncClient, order_id: str) -> tuple[str, int]:
    order = (await api.get(f"/orders/{order_id}")).json()
    product = (await api.get("/products/1")).json()
    return order["status"], product["stock"]


@pytest.mark.asyncio
async def test_unpaid_order_closes_15_virtual_minutes_after_the_request(
    api: httpx.AsyncClient, settings: Settings, delayq_clock: VirtualClock
) -> None:
    assert settings.close_after == 15 * 60
    worker = make_worker(settings)  # the worker's own Queue, on the same clock
    start_stock = (await api.get("/products/1")).json()["stock"]
    placed_at = delayq_clock.now()
    order_id = await place(api, 3)

    early = await adrain(worker, until=timedelta(minutes=15) - MS)
    assert early.ran == []
    assert await status_and_stock(api, order_id) == ("pending", start_stock - 3)

    out = await adrain(worker, until=MS)
    assert [(r.task_id, r.outcome) for r in out.ran] == [(close_task_id(order_id), "done")]
    assert await status_and_stock(api, order_id) == ("closed", start_stock)
    assert delayq_clock.now() - placed_at == timedelta(minutes=15)
    # A payment after the close lost the race: 409, and the stock stays back.
    assert (await api.post(f"/orders/{order_id}/pay")).status_code == 409


@pytest.mark.asyncio
async def test_order_paid_at_minute_14_is_never_closed(
    api: httpx.AsyncClient, settings: Settings
) -> None:
    worker = make_worker(settings)
    start_stock = (await api.get("/products/1")).json()["stock"]
    order_id = await place(api, 2)

    assert (await adrain(worker, until=timedelta(minutes=14))).ran == []
    r = await api.post(f"/orders/{order_id}/pay")
    assert r.status_code == 200 and r.json()["close_task_cancelled"] is True

    assert (await adrain(worker, until=timedelta(hours=1))).ran == []  # nothing left to run
    assert await status_and_stock(api, order_id) == ("paid", start_stock - 2)


async def test_close_racing_a_payment_is_discarded_by_its_gate(
    api: httpx.AsyncClient, settings: Settings
) -> None:
    """The payment lands in the database but its cancel does not: at minute 15 the close runs,
    finds the order paid and changes nothing."""
    worker = make_worker(settings)
    order_id = await place(api, 4)
    await adrain(worker, until=timedelta(minutes=10))
    assert Store(settings.database).pay(order_id) == "paid"
    out = await adrain(worker, until=timedelta(minutes=10))
    assert [(r.task_id, r.outcome) for r in out.ran] == [(close_task_id(order_id), "discarded")]
    assert (await status_and_stock(api, order_id))[0] == "paid"


# -- examples/flaky_http.py: its backoff (30 s, 2 min, 10 min) in virtual time ---------------------


class TimedStorage(StandInStorage):
    """The stand-in storage service, recording the virtual time of each request."""

    def __init__(self, script: dict[str, list[Answer]], clock: VirtualClock) -> None:
        super().__init__(script)
        self.clock = clock
        self.times: dict[str, list[datetime]] = {}

    def next_answer(self, key: str) -> Answer:
        self.times.setdefault(key, []).append(self.clock.now())
        return super().next_answer(key)


SCRIPT: dict[str, list[Answer]] = {
    "broken": [(500, {}, "internal error")],  # every attempt fails: dead after the 5th
    "throttled": [(429, {}, "slow down"), (429, {}, "slow down"), (204, {}, "")],
    "busy": [(503, {"Retry-After": "90"}, "busy"), (204, {}, "")],
    "private": [(403, {}, "forbidden")],
}


@pytest.fixture
def storage(delayq_clock: VirtualClock) -> Iterator[TimedStorage]:
    srv = TimedStorage(SCRIPT, delayq_clock)
    yield srv
    srv.close()


def test_flaky_http_retries_after_its_real_backoff(
    delayq_queue: Queue, delayq_clock: VirtualClock, storage: TimedStorage
) -> None:
    alerts: list[str] = []
    worker = make_http_worker(  # the example's defaults: 5 attempts, 30 s / 2 min / 10 min
        storage.url,
        queue=delayq_queue.name,
        redis_url=delayq_queue.url,
        alert=alerts.append,
        clock=delayq_clock,
    )
    start = delayq_clock.now()
    for key in SCRIPT:
        delayq_queue.schedule(KIND, {"object": key}, task_id=key)

    out = drain(worker, until=timedelta(hours=1))

    def gaps(key: str) -> list[float]:
        times = [start, *storage.times[key]]
        return [(b - a).total_seconds() for a, b in pairwise(times)][1:]

    # Each retry after its step of the backoff, jittered by at most 10%: never before.
    for key, steps in {"broken": [30, 120, 600, 600], "throttled": [30, 120]}.items():
        got = gaps(key)
        assert len(got) == len(steps), (key, got)
        assert all(0.9 * s <= g <= 1.1 * s for g, s in zip(got, steps, strict=True)), (key, got)
    assert gaps("busy") == [90.0]  # Retry-After: exactly then
    assert gaps("private") == []  # 403: dead at once, no retry
    assert {i.id for i in out.done} == {"throttled", "busy"}
    assert [i.id for i in out.dead] == ["private", "broken"]
    assert [r.attempt for r in out.by_kind(KIND) if r.task_id == "broken"] == [1, 2, 3, 4, 5]
    assert sorted(a.split(" ")[1] for a in alerts) == ["broken", "private"]


# -- examples/nightly_report.py: 02:00 Shanghai time, once a virtual day --------------------------


def test_nightly_report_runs_once_a_virtual_day_at_2am_shanghai(
    delayq_url: str, tmp_path: Path
) -> None:
    zone = ZoneInfo(TZ)
    clock = VirtualClock(datetime(2026, 3, 1, 12, 0, tzinfo=zone))  # noon, 1 March
    name = f"reports-{secrets.token_hex(4)}"
    database, reports = tmp_path / "orders.db", tmp_path / "reports"
    orders = [("a", "paid", 2, 1), ("b", "closed", 1, 1), ("c", "paid", 5, 2)]  # (.., day)
    create_orders(
        database,
        [(i, s, q, datetime(2026, 3, d, 9, 0, tzinfo=zone).timestamp()) for i, s, q, d in orders],
    )
    runs: list[tuple[datetime, datetime, Path]] = []  # (now, occurrence, file)

    def on_report(task: Task, path: Path) -> None:
        runs.append((clock.now(), datetime.fromtimestamp(task.payload["at"] / 1000, zone), path))

    worker = make_report_worker(
        database, reports, queue=name, redis_url=delayq_url, on_report=on_report, clock=clock
    )
    try:
        out = drain(worker, until=timedelta(days=3))
    finally:
        delete_queue(delayq_url, name)

    occurrences = [datetime(2026, 3, d, 2, 0, tzinfo=zone) for d in (2, 3, 4)]
    assert [when for _, when, _ in runs] == occurrences
    assert all(now == when for now, when, _ in runs)  # on time, never before
    assert [r.outcome for r in out.by_kind(f"cron:{REPORT}")] == ["done"] * 3
    assert len(out.by_kind(f"cron:{SWEEP}")) == 72  # and the hourly sweep, 24 times a day
    totals = [json.loads(path.read_text())["total"] for *_, path in runs]
    assert totals == [
        {"orders": 2, "units": 3},
        {"orders": 1, "units": 5},
        {"orders": 0, "units": 0},
    ]


# -- examples/upload_cleanup.py: the session's 30-minute TTL ------------------------------------


def test_abandoned_upload_is_cleaned_up_30_virtual_minutes_after_its_last_chunk(
    delayq_queue: Queue, delayq_clock: VirtualClock, tmp_path: Path
) -> None:
    uploads = UploadSessions(delayq_queue, tmp_path / "storage")  # the example's TTL: 30 min
    cleaned: list[tuple[Any, int | None, datetime]] = []
    worker = make_upload_worker(
        uploads.storage,
        queue=delayq_queue.name,
        redis_url=delayq_queue.url,
        on_cleanup=lambda e, removed: cleaned.append((e, removed, delayq_clock.now())),
        clock=delayq_clock,
    )
    abandoned = uploads.start(10)
    finished = uploads.start(3)
    drain(worker, until=timedelta(minutes=20))
    assert uploads.receive(abandoned, b"abcd") == 4  # minute 20: the TTL starts again
    uploads.receive(finished, b"xyz")
    uploads.finish(finished)
    last_chunk = delayq_clock.now()

    drain(worker, until=last_chunk + timedelta(minutes=30))  # the deadline itself: not yet
    assert cleaned == []
    assert (uploads.storage / temp_key(abandoned)).exists()

    drain(worker, until=timedelta(days=1))
    [(expired, removed, ran_at)] = cleaned  # the finished one never calls back
    assert expired.key == session_key(abandoned) and removed == 4
    assert expired.value == {"object_key": temp_key(abandoned), "bytes": 10}
    assert ran_at == last_chunk + timedelta(minutes=30) + MS  # just after, as Redis counts
    assert not (uploads.storage / temp_key(abandoned)).exists()
    assert (uploads.storage / "objects" / finished).read_bytes() == b"xyz"
