"""The examples under examples/, run against real servers with a real Worker."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import pytest

from delayq import AsyncQueue, ConfigurationError, Queue, Worker
from delayq.embedded import EmbeddedServer
from delayq.expiring.facade import Expired
from examples.fastapi_orders.app import create_app
from examples.fastapi_orders.settings import Settings, close_task_id
from examples.fastapi_orders.store import Store
from examples.fastapi_orders.worker import make_worker
from examples.flaky_http import KIND, StandInStorage
from examples.flaky_http import make_worker as make_http_worker
from examples.nightly_report import REPORT, TZ, create_orders
from examples.nightly_report import make_worker as make_report_worker
from examples.upload_cleanup import SessionExpired, UploadSessions, session_key, temp_key
from examples.upload_cleanup import make_worker as make_upload_worker

from .support.helpers import wait_for

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
    gone = await aqueue.get(close_task_id(order["id"]))  # the close task is gone: cancelled
    assert gone is not None and gone.state == "cancelled"

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
        timeout=1.0,  # generous for a loaded machine; the "hang" answers outlast it
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


def run_example(script: str, server: EmbeddedServer, *args: str) -> str:
    """``python examples/<script>`` as a user runs it (on the fixture's server)."""
    out = subprocess.run(
        [sys.executable, f"examples/{script}", "--url", server.url, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


# -- examples/upload_cleanup.py ---------------------------------------------------------------

Cleaned = list[tuple[Expired, int | None, datetime]]  # each callback run, and when it ran


@pytest.fixture
def uploads(queue: Queue, tmp_path: Path) -> UploadSessions:
    return UploadSessions(queue, tmp_path / "storage", ttl=0.6)


def upload_worker(queue: Queue, uploads: UploadSessions, cleaned: Cleaned) -> Worker:
    return make_upload_worker(
        uploads.storage,
        queue=queue.name,
        redis_url=queue.url,
        on_cleanup=lambda e, removed: cleaned.append((e, removed, datetime.now(UTC))),
    )


def test_abandoned_upload_is_deleted_after_its_ttl_with_the_value(
    queue: Queue, uploads: UploadSessions, run_worker: Any
) -> None:
    cleaned: Cleaned = []
    with run_worker(upload_worker(queue, uploads, cleaned)):
        upload_id = uploads.start(10)
        assert uploads.receive(upload_id, b"abcd") == 4
        temp = uploads.storage / temp_key(upload_id)
        # A session whose file is already gone (an earlier run of the callback deleted it,
        # then the worker died before recording the task as done): that is done too.
        vanished = uploads.start(5)
        (uploads.storage / temp_key(vanished)).unlink()
        assert temp.exists() and cleaned == []
        wait_for(lambda: len(cleaned) == 2, timeout=10)
    assert not temp.exists()
    runs = {e.key: (e, removed, ran_at) for e, removed, ran_at in cleaned}
    expired, removed, ran_at = runs[session_key(upload_id)]
    assert expired.value == {"object_key": temp_key(upload_id), "bytes": 10}
    assert removed == 4 and expired.guaranteed
    assert ran_at >= expired.deadline - timedelta(milliseconds=2)  # never early
    assert runs[session_key(vanished)][0].value["bytes"] == 5
    assert runs[session_key(vanished)][1] is None
    assert queue.client.exists(session_key(upload_id), session_key(vanished)) == 0
    counters = queue.stats().counters
    assert counters.get("succeeded") == 2 and not counters.get("dead")
    # The client comes back too late: the session is gone, and so is the chance to finish it.
    with pytest.raises(SessionExpired):
        uploads.receive(upload_id, b"efgh")
    with pytest.raises(SessionExpired):
        uploads.finish(upload_id)


def test_a_touched_upload_session_outlives_its_ttl(
    queue: Queue, uploads: UploadSessions, run_worker: Any
) -> None:
    cleaned: Cleaned = []
    with run_worker(upload_worker(queue, uploads, cleaned)):
        upload_id = uploads.start(8)
        temp = uploads.storage / temp_key(upload_id)
        started = time.monotonic()
        for chunk in (b"ab", b"cd", b"ef", b"gh"):  # a chunk every 0.25 s: 1 s, TTL 0.6 s
            time.sleep(0.25)
            uploads.receive(upload_id, chunk)
        assert time.monotonic() - started > 1.5 * uploads.ttl
        assert cleaned == [] and temp.read_bytes() == b"abcdefgh"
        # Then the client goes away: the session ends one TTL after the last chunk.
        wait_for(lambda: cleaned, timeout=10)
    [(expired, removed, _)] = cleaned
    assert expired.key == session_key(upload_id) and removed == 8 and not temp.exists()


def test_a_finished_upload_session_never_calls_back(
    queue: Queue, uploads: UploadSessions, run_worker: Any
) -> None:
    cleaned: Cleaned = []
    with run_worker(upload_worker(queue, uploads, cleaned)):
        upload_id = uploads.start(3)
        uploads.receive(upload_id, b"xyz")
        final = uploads.finish(upload_id)
        time.sleep(uploads.ttl + 0.6)  # well past the session's deadline
        with pytest.raises(SessionExpired):  # finished: no more chunks
            uploads.receive(upload_id, b"more")
    assert cleaned == []
    assert final.read_bytes() == b"xyz" and not (uploads.storage / temp_key(upload_id)).exists()
    assert queue.client.exists(session_key(upload_id)) == 0
    counters = queue.stats().counters
    assert counters.get("cancelled") == 1 and not counters.get("succeeded")


def test_upload_cleanup_example_runs(server: EmbeddedServer) -> None:
    assert "every session ended as expected" in run_example("upload_cleanup.py", server)


# -- examples/nightly_report.py ---------------------------------------------------------------


def noon(day: date, zone: ZoneInfo) -> float:
    return datetime.combine(day, datetime.min.time().replace(hour=12), zone).timestamp()


def test_nightly_report_is_written_once_per_occurrence_across_two_workers(
    server: EmbeddedServer, qname: str, tmp_path: Path, run_worker: Any
) -> None:
    zone = ZoneInfo(TZ)
    today = datetime.now(zone).date()
    yesterday, before = today - timedelta(days=1), today - timedelta(days=2)
    database, reports = tmp_path / "orders.db", tmp_path / "reports"
    orders = [("a", "paid", 2, yesterday), ("b", "paid", 3, yesterday)]
    orders += [("c", "closed", 1, yesterday), ("d", "pending", 4, today), ("e", "paid", 7, before)]
    create_orders(database, [(i, s, q, noon(d, zone)) for i, s, q, d in orders])
    # What each report says depends on its day (an occurrence after midnight reports today).
    expected = {
        yesterday: {"paid": {"orders": 2, "units": 5}, "closed": {"orders": 1, "units": 1}},
        today: {"pending": {"orders": 1, "units": 4}},
    }
    reports.mkdir()
    old = reports / f"{REPORT}-2020-01-01T020000+0800.json"  # for the sweep
    old.write_text("{}")
    forty_days_ago = time.time() - 40 * 86400
    os.utime(old, (forty_days_ago, forty_days_ago))

    runs: list[tuple[str, int, int, Path]] = []  # id, occurrence (ms), attempt, file

    def report_worker() -> Worker:
        return make_report_worker(
            database,
            reports,
            queue=qname,
            redis_url=server.url,
            every=1,  # instead of "0 2 * * *": a report every second
            sweep_every=1,
            on_report=lambda t, path: runs.append((t.id, t.payload["at"], t.attempt, path)),
        )

    with run_worker(report_worker()), run_worker(report_worker()):
        wait_for(lambda: len(runs) >= 2 and not old.exists(), timeout=10)
    ids = [task_id for task_id, *_ in runs]
    assert len(ids) == len(set(ids)), f"an occurrence ran twice: {ids}"
    ats = sorted(at for _, at, _, _ in runs)
    assert all(b > a and (b - a) % 1000 == 0 for a, b in pairwise(ats))
    # One file per occurrence; the 40-day-old report swept, no temporary file left.
    assert sorted(reports.iterdir()) == sorted(path for *_, path in runs)
    with Queue(qname, url=server.url) as queue:
        for task_id, at, attempt, path in runs:
            assert task_id == f"cron:{REPORT}:{at}" and attempt == 1
            info = queue.get(task_id)
            assert info is not None and (info.state, info.attempts) == ("done", 1)
            occurrence = datetime.fromtimestamp(at / 1000, zone)
            day = occurrence.date() - timedelta(days=1)
            report = json.loads(path.read_text())
            assert report["occurrence"] == occurrence.isoformat() and report["tz"] == TZ
            assert report["day"] == day.isoformat()
            assert report["by_status"] == expected.get(day, {}), report
            assert report["total"]["orders"] == sum(
                c["orders"] for c in expected.get(day, {}).values()
            )


@pytest.mark.parametrize(
    ("cron", "tz", "message"),
    [
        ("0 25 * * *", TZ, r"'daily-report': invalid cron expression '0 25 \* \* \*'"),
        ("0 2 * *", TZ, "invalid cron expression .*use five fields"),
        ("0 0 2 * * *", TZ, "has 6 fields.*every\\(seconds=...\\)"),
        ("0 0 31 2 *", TZ, "never fires"),
        ("0 2 * * *", "Asia/Shangai", "unknown time zone 'Asia/Shangai': use an IANA name"),
    ],
)
def test_nightly_report_bad_schedule_fails_at_decoration(
    tmp_path: Path, cron: str, tz: str, message: str
) -> None:
    """make_worker declares the schedule, so a bad one stops the worker from being built,
    with what to write instead. Nothing connects (port 9) and nothing is created."""
    reports = tmp_path / "reports"
    with pytest.raises(ConfigurationError, match=message):
        make_report_worker(
            tmp_path / "orders.db", reports, redis_url="redis://127.0.0.1:9", cron=cron, tz=tz
        )
    assert not reports.exists()


def test_nightly_report_example_runs(server: EmbeddedServer) -> None:
    out = run_example("nightly_report.py", server, "--reports", "2")
    assert "each occurrence reported once" in out
