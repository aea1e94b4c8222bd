"""The HTTP API (delayq.http) against real servers, through httpx's ASGI transport, and
``delayq api`` as a real process. Every refusal is problem+json whose detail names the fix."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from delayq import Queue, Worker
from delayq.embedded import EmbeddedServer, free_port
from delayq.errors import ConfigurationError
from delayq.http import create_app
from delayq.timing import ms_to_datetime

from .conftest import ROOT

TOKEN = "s3cret-token-for-tests"
AUTH = {"authorization": f"Bearer {TOKEN}"}
PROBLEM = "application/problem+json"


@pytest.fixture
async def client(server: EmbeddedServer) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(server.url, token=TOKEN)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=AUTH) as c:
        yield c
    await app.state.api.aclose()


@pytest.fixture
def sq(server: EmbeddedServer, qname: str) -> Iterator[Queue]:
    """The same queue through the Python API, to check what the HTTP API wrote."""
    q = Queue(qname, url=server.url)
    yield q
    q.close()


def problem(r: httpx.Response, status: int, name: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    doc = r.json()
    assert doc["type"] == f"urn:delayq:problem:{name}"
    assert doc["status"] == status and doc["title"] and doc["detail"]
    return dict(doc)


def pointers(doc: dict[str, Any]) -> list[str]:
    return [e["pointer"] for e in doc["errors"]]


# -- POST /v1/queues/{queue}/tasks -------------------------------------------------------------


async def test_schedule_creates_then_dedupes_by_id(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    body = {"kind": "order.close", "payload": {"order": 42}, "delay": 900, "id": "order:42"}
    before = datetime.now(UTC)
    r = await client.post(f"/v1/queues/{qname}/tasks", json=body)
    assert r.status_code == 201, r.text
    out = r.json()
    assert out["id"] == "order:42" and out["created"] is True and out["status"] == "created"
    due = datetime.fromisoformat(out["due_at"])
    assert before + timedelta(seconds=899) < due < datetime.now(UTC) + timedelta(seconds=901)
    info = sq.get("order:42")
    assert info is not None and info.state == "scheduled" and info.payload == {"order": 42}
    assert info.kind == "order.close"

    again = await client.post(f"/v1/queues/{qname}/tasks", json={**body, "delay": 5})
    assert again.status_code == 200, again.text
    assert again.json()["created"] is False and again.json()["status"] == "unchanged"
    assert again.json()["due_at"] == info.due_at.isoformat()  # the task's own, not 5 s
    assert sq.stats().scheduled == 1


async def test_schedule_at_an_rfc3339_time_with_headers_and_attempts(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    body = {
        "kind": "remind",
        "at": "2031-05-06T09:10:11.250+02:00",
        "headers": {"tenant": "a"},
        "max_attempts": 3,
    }
    r = await client.post(f"/v1/queues/{qname}/tasks", json=body)
    assert r.status_code == 201, r.text
    out = r.json()
    want = datetime(2031, 5, 6, 7, 10, 11, 250000, tzinfo=UTC)
    assert datetime.fromisoformat(out["due_at"]) == want
    info = sq.get(out["id"])
    assert info is not None and info.due_at == want
    assert info.headers == {"tenant": "a"} and info.max_attempts == 3 and info.payload is None


async def test_schedule_with_a_priority_single_and_batch_and_task_shows_it(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    url = f"/v1/queues/{qname}/tasks"
    r = await client.post(url, json={"kind": "k", "id": "one", "priority": 7})
    assert r.status_code == 201, r.text
    r = await client.post(
        f"/v1/queues/{qname}/tasks/batch",
        json={"tasks": [{"kind": "k", "id": "two", "priority": 3}, {"kind": "k", "id": "three"}]},
    )
    assert r.status_code in (200, 201), r.text
    assert [sq.get(t).priority for t in ("one", "two", "three")] == [7, 3, 0]  # type: ignore[union-attr]
    shown = (await client.get(f"{url}/one")).json()
    assert shown["priority"] == 7
    bad = problem(await client.post(url, json={"kind": "k", "priority": 10}), 422, "invalid")
    assert pointers(bad) == ["/priority"], bad


async def test_schedule_without_delay_or_at_is_due_now_with_a_new_id(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    r = await client.post(f"/v1/queues/{qname}/tasks", json={"kind": "k"})
    assert r.status_code == 201
    assert sq.stats().due == 1 and sq.get(r.json()["id"]) is not None


async def test_schedule_replace_moves_a_waiting_task(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    url = f"/v1/queues/{qname}/tasks"
    await client.post(url, json={"kind": "k", "id": "x", "delay": 3600})
    r = await client.post(url, json={"kind": "k", "id": "x", "delay": 60, "replace": True})
    assert r.status_code == 200 and r.json()["status"] == "replaced"
    info = sq.get("x")
    assert info is not None and info.due_at is not None
    assert info.due_at < datetime.now(UTC) + timedelta(seconds=120)


async def test_durable_schedule_waits_for_the_fsync(
    make_server: Callable[..., EmbeddedServer], qname: str
) -> None:
    srv = make_server(appendonly=True)
    app = create_app(srv.url, token=TOKEN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api", headers=AUTH
    ) as c:
        r = await c.post(f"/v1/queues/{qname}/tasks", json={"kind": "k", "durable": True})
        assert r.status_code == 201, r.text
    await app.state.api.aclose()


def _script_calls(server: EmbeddedServer) -> int:
    import redis

    r = redis.Redis.from_url(server.url)
    try:
        return int(r.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    finally:
        r.close()


async def test_concurrent_schedules_each_get_their_own_answer(
    client: httpx.AsyncClient, qname: str, sq: Queue, server: EmbeddedServer
) -> None:
    # Sent together, they go to Redis together; one bad payload and one id sent twice
    # still get answers of their own, and the others are written.
    import asyncio

    url = f"/v1/queues/{qname}/tasks"
    assert (await client.post(url, json={"kind": "k", "id": "first"})).status_code == 201
    calls = _script_calls(server)
    good = [{"kind": "k", "id": f"g{i}", "payload": i} for i in range(20)]
    replies = await asyncio.gather(*(client.post(url, json=b) for b in good))
    assert [r.status_code for r in replies] == [201] * 20
    assert _script_calls(server) - calls < 10  # not one call each

    bodies: list[dict[str, Any]] = [{"kind": "k", "id": f"c{i}", "payload": i} for i in range(20)]
    bodies[5]["payload"] = "x" * 70_000
    bodies[9]["id"] = "c8"
    replies = await asyncio.gather(*(client.post(url, json=b) for b in bodies))
    codes = [r.status_code for r in replies]
    assert codes[5] == 413 and sorted((codes[8], codes[9])) == [200, 201]
    assert all(c == 201 for i, c in enumerate(codes) if i not in (5, 8, 9))
    assert sq.stats().scheduled == 1 + 20 + 18 and sq.get("c5") is None
    for i in (0, 19):
        info = sq.get(f"c{i}")
        assert info is not None and info.payload == i


# -- POST /v1/queues/{queue}/tasks/batch -------------------------------------------------------


async def test_batch_schedules_every_task_in_order(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    tasks = [{"kind": "k", "payload": i, "delay": 60} for i in range(5)]
    tasks[2]["id"] = "third"
    r = await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": tasks})
    assert r.status_code == 200, r.text
    results = r.json()["tasks"]
    assert len(results) == 5 and results[2]["id"] == "third"
    assert all(x["created"] for x in results)
    for i, x in enumerate(results):
        info = sq.get(x["id"])
        assert info is not None and info.payload == i
    again = await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": [tasks[2]]})
    assert again.json()["tasks"][0]["status"] == "unchanged"


async def test_batch_with_one_bad_task_lists_it_by_index_and_writes_nothing(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    tasks: list[dict[str, Any]] = [{"kind": "k", "id": f"good-{i}"} for i in range(4)]
    tasks[1] = {"kind": "k", "delay": "soon"}
    tasks[3] = {"kind": "k", "at": "tomorrow", "colour": "red"}
    r = await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": tasks})
    doc = problem(r, 422, "invalid")
    assert sorted(pointers(doc)) == ["/tasks/1/delay", "/tasks/3/at", "/tasks/3/colour"]
    assert {e["index"] for e in doc["errors"]} == {1, 3}
    assert "RFC 3339" in next(e["detail"] for e in doc["errors"] if e["pointer"] == "/tasks/3/at")
    assert sq.stats().scheduled == 0 and sq.get("good-0") is None and sq.get("good-2") is None


async def test_batch_with_a_payload_too_large_writes_nothing(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    """413 too-large, as for a single task (issue 31 item 3: it was a 422), naming the
    task's index; a batch whose other payload errors are not about size stays a 422."""
    tasks = [{"kind": "k"}, {"kind": "k", "payload": "x" * 70_000}, {"kind": "k"}]
    r = await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": tasks})
    doc = problem(r, 413, "too-large")
    assert doc["errors"][0]["index"] == 1 and doc["errors"][0]["pointer"] == "/tasks/1/payload"
    assert doc["detail"].startswith("task 1's payload is") and "max_payload" in doc["detail"]
    tasks.append({"kind": "k", "payload": "y" * 70_000})
    doc = problem(
        await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": tasks}),
        413,
        "too-large",
    )
    assert [e["index"] for e in doc["errors"]] == [1, 3] and "(and 1 more" in doc["detail"]
    body = '{"tasks": [{"kind": "k"}, {"kind": "k", "payload": "\\ud800"}]}'
    r = await client.post(
        f"/v1/queues/{qname}/tasks/batch",
        content=body,
        headers={"content-type": "application/json"},
    )
    assert pointers(problem(r, 422, "invalid")) == ["/tasks/1/payload"]
    assert sq.stats().scheduled == 0


async def test_a_batch_s_422_lists_its_too_large_payloads_too(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    """Review of issue 31, item 4: "a 422 listing every error with the task's index" listed
    only the fields' errors of a batch that also had payloads over max_payload."""
    tasks: list[dict[str, Any]] = [
        {"kind": "k", "delay": "nope"},
        {"kind": "k", "colour": 1},
        {"kind": "k", "payload": "x" * 70_000},
        {"kind": "k", "payload": "y" * 70_000},
        {"kind": "k", "payload": "small"},
    ]
    r = await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": tasks})
    doc = problem(r, 422, "invalid")
    assert [(e["index"], e["pointer"]) for e in doc["errors"]] == [
        (0, "/tasks/0/delay"),
        (1, "/tasks/1/colour"),
        (2, "/tasks/2/payload"),
        (3, "/tasks/3/payload"),
    ]
    assert "max_payload" in doc["errors"][2]["detail"] and "(and 3 more" in doc["detail"]
    assert sq.stats().scheduled == 0


async def test_batch_over_1000_tasks_is_refused_unwritten(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    r = await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": [{"kind": "k"}] * 1001})
    doc = problem(r, 422, "invalid")
    assert pointers(doc) == ["/tasks"]
    assert "1001 tasks" in doc["detail"] and "batches of at most 1000" in doc["detail"]
    assert sq.stats().scheduled == 0


async def test_batch_errors_of_its_own_shape(client: httpx.AsyncClient, qname: str) -> None:
    url = f"/v1/queues/{qname}/tasks/batch"
    doc = problem(await client.post(url, json={"tasks": []}), 422, "invalid")
    assert pointers(doc) == ["/tasks"]
    doc = problem(await client.post(url, json={}), 422, "invalid")
    assert "tasks is required" in doc["detail"]
    doc = problem(
        await client.post(
            url, json={"tasks": [{"kind": "k", "id": "a"}, {"kind": "k", "id": "a"}]}
        ),
        422,
        "invalid",
    )
    assert pointers(doc) == ["/tasks/1/id"] and "task 0's" in doc["detail"]
    doc = problem(
        await client.post(url, json={"tasks": [{"kind": "k", "replace": True}]}), 422, "invalid"
    )
    assert "put it beside tasks" in doc["detail"]
    doc = problem(await client.post(url, json={"tasks": ["k"]}), 422, "invalid")
    assert pointers(doc) == ["/tasks/0"] and "got a string" in doc["detail"]


@pytest.mark.parametrize(
    ("body", "pointer"),
    [
        ({"tasks": [{"kind": "k"}], "replace": None}, "/replace"),
        ({"tasks": [{"kind": "k"}], "durable": "yes"}, "/durable"),
        ({"tasks": [{"kind": "k"}], "colour": 1}, "/colour"),
        ({"tasks": [{"kind": "k"}, {"kind": ""}]}, "/tasks/1/kind"),
        ({"tasks": [{"kind": "k"}, {"kind": "a\nb"}]}, "/tasks/1/kind"),
        ({"tasks": [{"kind": "k"}, {"kind": "k", "id": "a\u0000b"}]}, "/tasks/1/id"),
        ('{"tasks": [{"kind": "k"}, {"kind": "k", "id": "\\udcff"}]}', "/tasks/1/id"),
        ({"tasks": [{"kind": "k"}, {"kind": "k", "delay": -1}]}, "/tasks/1/delay"),
        ({"tasks": [{"kind": "k"}, {"kind": "k", "delay": None}]}, "/tasks/1/delay"),
        (
            {"tasks": [{"kind": "k"}, {"kind": "k", "delay": 1, "at": "2030-01-01T00:00:00Z"}]},
            "/tasks/1/at",
        ),
        ({"tasks": [{"kind": "k"}, {"kind": "k", "at": "1969-12-31T23:00:00Z"}]}, "/tasks/1/at"),
        ({"tasks": [{"kind": "k"}, {"kind": "k", "max_attempts": True}]}, "/tasks/1/max_attempts"),
        ({"tasks": [{"kind": "k"}, {"kind": "k", "max_attempts": 1.5}]}, "/tasks/1/max_attempts"),
        ({"tasks": [{"kind": "k"}, {"kind": "k", "headers": {"a": 1}}]}, "/tasks/1/headers"),
        ({"tasks": [{"kind": "k"}, {"payload": 1}]}, "/tasks/1/kind"),
        ({"tasks": [{"kind": "k", "delay": "15m"}, {"kind": "k", "at": "15m"}]}, "/tasks/1/at"),
        (
            {"tasks": [{"kind": "k", "delay": "15m"}, {"kind": "k", "delay": "15q"}]},
            "/tasks/1/delay",
        ),
    ],
)
async def test_batch_refuses_each_bad_field_as_a_single_task_would(
    client: httpx.AsyncClient, qname: str, sq: Queue, body: dict[str, Any] | str, pointer: str
) -> None:
    """A well-formed batch is checked once per task on its way to Redis; whatever that
    refuses is named field by field, as for a single task, and nothing is written. (A
    text body: JSON that escapes a lone surrogate, which httpx cannot encode.)"""
    url = f"/v1/queues/{qname}/tasks/batch"
    if isinstance(body, str):
        r = await client.post(url, content=body, headers={"content-type": "application/json"})
    else:
        r = await client.post(url, json=body)
    assert pointer in pointers(problem(r, 422, "invalid"))
    assert sq.stats().scheduled == 0


async def test_batch_writes_what_schedule_many_writes(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    """Every field, and values the field checks read rather than refuse (3.0 attempts),
    land as the Python API writes them."""
    at = "2030-01-02T03:04:05.250+02:00"
    tasks: list[dict[str, Any]] = [
        {
            "kind": "k",
            "id": "a",
            "payload": {"n": 1},
            "delay": 60,
            "max_attempts": 3,
            "headers": {"tenant": "t1"},
        },
        {"kind": "k2", "id": "b", "payload": [1, "é"], "at": at},
        {"kind": "k", "id": "c", "max_attempts": 3.0},
        {"kind": "k", "id": 'é "\u2028/x', "delay": 60},
    ]
    r = await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": tasks})
    assert r.status_code == 200, r.text
    results = r.json()["tasks"]
    assert [x["id"] for x in results] == ["a", "b", "c", 'é "\u2028/x']
    assert results[0]["due_at"] == results[3]["due_at"]  # (the same delay)
    assert results[1]["due_at"] == "2030-01-02T01:04:05.250000+00:00"
    assert all(x["created"] is True and x["status"] == "created" for x in results)
    again = await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": tasks[1:2]})
    assert again.json() == {
        "tasks": [
            {"id": "b", "due_at": results[1]["due_at"], "created": False, "status": "unchanged"}
        ]
    }
    a, b, c = (sq.get(i) for i in "abc")
    assert a is not None and b is not None and c is not None
    assert (a.kind, a.payload, a.max_attempts, a.headers) == ("k", {"n": 1}, 3, {"tenant": "t1"})
    assert (b.kind, b.payload, b.due_at) == ("k2", [1, "é"], datetime.fromisoformat(at))
    assert (c.kind, c.payload, c.max_attempts, c.headers) == ("k", None, 3, {})


# -- GET / DELETE / PATCH /v1/queues/{queue}/tasks/{id} ----------------------------------------


async def test_get_a_task_and_404_for_an_unknown_one(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    sq.schedule("k", {"a": [1, 2]}, task_id="a/b c", delay=60, headers={"h": "v"})
    r = await client.get(f"/v1/queues/{qname}/tasks/a%2Fb%20c")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["id"] == "a/b c" and out["state"] == "scheduled" and out["payload"] == {"a": [1, 2]}
    assert out["headers"] == {"h": "v"} and out["queue"] == qname and out["attempts"] == 0
    doc = problem(await client.get(f"/v1/queues/{qname}/tasks/nope"), 404, "not-found")
    assert "'nope'" in doc["detail"]


async def test_a_msgpack_payload_json_cannot_hold_is_shown_as_text(
    client: httpx.AsyncClient, server: EmbeddedServer, qname: str
) -> None:
    with Queue(qname, url=server.url, codec="msgpack") as mq:
        mq.schedule("k", {"raw": b"\x00\x01", "x": float("nan")}, task_id="mp", delay=60)
    r = await client.get(f"/v1/queues/{qname}/tasks/mp")
    assert r.status_code == 200, r.text
    assert r.json()["payload"] == {"raw": repr(b"\x00\x01"), "x": "nan"}


async def test_cancel_204_then_shown_cancelled_then_409(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    sq.schedule("k", task_id="c1", delay=60)
    before = sq.stats().now
    r = await client.delete(f"/v1/queues/{qname}/tasks/c1")
    assert r.status_code == 204 and r.content == b""
    # Remembered for the dedupe window (issue 32 item 7): GET shows when it was cancelled.
    r = await client.get(f"/v1/queues/{qname}/tasks/c1")
    assert r.status_code == 200, r.text
    doc = r.json()
    assert (doc["state"], doc["kind"], doc["payload"]) == ("cancelled", "", None)
    at = datetime.fromisoformat(doc["finished_at"])
    assert before <= at <= sq.stats().now
    doc = problem(await client.delete(f"/v1/queues/{qname}/tasks/c1"), 409, "conflict")
    assert doc["state"] == "cancelled" and "its id is free" in doc["detail"]
    problem(await client.delete(f"/v1/queues/{qname}/tasks/c0"), 404, "not-found")


async def test_cancel_and_reschedule_409_when_running_or_finished(
    client: httpx.AsyncClient,
    qname: str,
    sq: Queue,
    run_worker: Callable[[Worker], Any],
) -> None:
    started, release = threading.Event(), threading.Event()
    worker = Worker(sq, concurrency=2)

    @worker.handler("block")
    def block(task: Any) -> None:
        started.set()
        release.wait(30)

    @worker.handler("quick")
    def quick(task: Any) -> None:
        pass

    sq.schedule("quick", task_id="fin")
    sq.schedule("block", task_id="run")
    with run_worker(worker):
        assert started.wait(30)
        deadline = time.monotonic() + 30
        while (info := sq.get("fin")) is None or info.state != "done":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for tid, state in (("run", "active"), ("fin", "done")):
            r = await client.delete(f"/v1/queues/{qname}/tasks/{tid}")
            doc = problem(r, 409, "conflict")
            assert doc["state"] == state and "only a waiting task" in doc["detail"]
            r = await client.patch(f"/v1/queues/{qname}/tasks/{tid}", json={"delay": 5})
            assert problem(r, 409, "conflict")["state"] == state
        release.set()


async def test_reschedule_moves_a_waiting_task(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    sq.schedule("k", task_id="r1", delay=3600)
    r = await client.patch(f"/v1/queues/{qname}/tasks/r1", json={"at": "2032-01-01T00:00:00Z"})
    assert r.status_code == 200, r.text
    assert r.json() == {"id": "r1", "due_at": "2032-01-01T00:00:00+00:00"}
    info = sq.get("r1")
    assert info is not None and info.due_at == datetime(2032, 1, 1, tzinfo=UTC)
    r = await client.patch(f"/v1/queues/{qname}/tasks/r1", json={"delay": 0})
    assert r.status_code == 200 and sq.stats().due == 1


def _stored(sq: Queue, tid: str) -> str:
    """A waiting task's due time as the scheduled set holds it, in the API's form."""
    score = sq.client.zscore(sq.core.keys.scheduled, tid)
    assert score is not None, tid
    return ms_to_datetime(score).isoformat()


async def test_the_answered_due_at_is_the_stored_one_for_single_batch_and_patch(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    """Issue 31 item 2: the due_at answered on create and on PATCH is the one the script
    stored (server clock), exactly as GET gives it, not one computed in the API process. A
    delay is added to the server's now, in whole ms; the API's clock carries microseconds,
    so an answer computed there (as before) is not the stored one."""
    url = f"/v1/queues/{qname}/tasks"
    answered: dict[str, str] = {}
    for i, body in enumerate(
        [
            {"kind": "k", "delay": 900},
            {"kind": "k", "id": "given", "delay": 30},
            {"kind": "k", "delay": "15m"},
            {"kind": "k", "at": "2031-05-06T09:10:11.123456+02:00"},
        ]
    ):
        r = await client.post(url, json=body)
        assert r.status_code == 201, (i, r.text)
        answered[r.json()["id"]] = r.json()["due_at"]
    r = await client.post(
        f"{url}/batch",
        json={"tasks": [{"kind": "k", "delay": d} for d in (0, 1, 60, 3600, 0.25)]},
    )
    assert r.status_code == 200, r.text
    answered |= {t["id"]: t["due_at"] for t in r.json()["tasks"]}
    r = await client.post(url, json={"kind": "k", "id": "given", "delay": 5, "replace": True})
    assert r.status_code == 200 and r.json()["status"] == "replaced", r.text
    answered["given"] = r.json()["due_at"]
    for tid in ("given", next(iter(answered))):
        r = await client.patch(f"{url}/{tid}", json={"delay": 120})
        assert r.status_code == 200, r.text
        answered[tid] = r.json()["due_at"]
    assert len(answered) == 9
    for tid, due in answered.items():
        got = await client.get(f"{url}/{tid}")
        assert got.status_code == 200, got.text
        assert due == got.json()["due_at"] == _stored(sq, tid), tid
    delayed = [d for tid, d in answered.items() if not d.startswith("2031")]
    assert all(datetime.fromisoformat(d).microsecond % 1000 == 0 for d in delayed), delayed


async def test_reschedule_refusals(client: httpx.AsyncClient, qname: str, sq: Queue) -> None:
    sq.schedule("k", task_id="r2", delay=3600)
    url = f"/v1/queues/{qname}/tasks/r2"
    doc = problem(await client.patch(url, json={}), 422, "invalid")
    assert "send delay" in doc["detail"]
    doc = problem(
        await client.patch(url, json={"delay": 1, "at": "2032-01-01T00:00:00Z"}), 422, "invalid"
    )
    assert "not both" in doc["detail"]
    doc = problem(await client.patch(url, json={"delay": 1, "kind": "x"}), 422, "invalid")
    assert pointers(doc) == ["/kind"]
    problem(
        await client.patch(f"/v1/queues/{qname}/tasks/none", json={"delay": 1}), 404, "not-found"
    )
    info = sq.get("r2")
    assert info is not None and info.due_at is not None
    assert info.due_at > datetime.now(UTC) + timedelta(seconds=3000)


# -- GET /v1/queues/{queue} --------------------------------------------------------------------


async def test_queue_stats_as_delayq_info_shows_them(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    sq.schedule("k", delay=60)
    sq.schedule("k")
    r = await client.get(f"/v1/queues/{qname}")
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["queue"] == qname and out["scheduled"] == 2 and out["due"] == 1
    assert out["workers_alive"] == 0 and out["workers"] == [] and out["active"] == 0
    assert out["paused"] is False
    sq.pause()
    assert (await client.get(f"/v1/queues/{qname}")).json()["paused"] is True


async def test_a_sharded_queue_is_opened_with_its_stored_count(
    client: httpx.AsyncClient, server: EmbeddedServer, qname: str
) -> None:
    with Queue(qname, url=server.url, shards=4) as q4:
        ids = q4.schedule_many([{"kind": "k", "task_id": f"t{i}", "delay": 60} for i in range(20)])
        r = await client.get(f"/v1/queues/{qname}/tasks/t7")
        assert r.status_code == 200, r.text
        r = await client.post(
            f"/v1/queues/{qname}/tasks/batch",
            json={"tasks": [{"kind": "k", "id": f"u{i}"} for i in range(20)]},
        )
        assert r.status_code == 200, r.text
        assert q4.stats().scheduled == 40 and len(ids) == 20
        assert (await client.get(f"/v1/queues/{qname}")).json()["scheduled"] == 40
        assert (await client.delete(f"/v1/queues/{qname}/tasks/u3")).status_code == 204
        assert (gone := q4.get("u3")) is not None and gone.state == "cancelled"


# -- expiring keys -----------------------------------------------------------------------------


async def test_expiring_set_touch_delete(
    client: httpx.AsyncClient, qname: str, server: EmbeddedServer
) -> None:
    import redis

    key = f"{qname}:session/1"
    path = f"/v1/queues/{qname}/expiring/{key.replace('/', '%2F')}"
    r = await client.put(path, json={"value": {"user": 7}, "ttl": 60})
    assert r.status_code == 200, r.text
    assert r.json()["key"] == key and datetime.fromisoformat(r.json()["deadline"]) > datetime.now(
        UTC
    )
    raw = redis.Redis.from_url(server.url)
    try:
        assert json.loads(raw.get(key) or b"") == {"user": 7}
        assert 55_000 < raw.pttl(key) <= 60_000
        r = await client.post(f"{path}/touch", json={"ttl": 600})
        assert r.status_code == 200 and r.json() == {"key": key, "touched": True}
        assert raw.pttl(key) > 500_000
        assert (await client.delete(path)).status_code == 204
        assert raw.exists(key) == 0
    finally:
        raw.close()
    doc = problem(await client.delete(path), 404, "not-found")
    assert "set it again with PUT" in doc["detail"]
    problem(await client.post(f"{path}/touch", json={"ttl": 5}), 404, "not-found")
    doc = problem(await client.put(path, json={"value": 1}), 422, "invalid")
    assert pointers(doc) == ["/ttl"]
    doc = problem(await client.put(path, json={"value": 1, "ttl": 0}), 422, "invalid")
    assert pointers(doc) == ["/ttl"]  # the field at fault, not the value
    doc = problem(await client.put(path, json={"value": 1, "ttl": 0.0004}), 422, "invalid")
    assert pointers(doc) == ["/ttl"]
    # Below the documented minimum (0.001) though it rounds to 1 ms (schemathesis found it).
    doc = problem(
        await client.put(path, json={"value": 1, "ttl": 0.0009999999999999996}), 422, "invalid"
    )
    assert pointers(doc) == ["/ttl"] and "at least 1 ms" in doc["detail"]
    doc = problem(await client.post(f"{path}/touch", json={"ttl": 0}), 422, "invalid")
    assert pointers(doc) == ["/ttl"]


# -- probes and the document -------------------------------------------------------------------


async def test_healthz_and_openapi_are_open_readyz_is_not(client: httpx.AsyncClient) -> None:
    open_ = {"authorization": ""}
    r = await client.get("/healthz", headers=open_)
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    r = await client.get("/openapi.json", headers=open_)
    assert r.status_code == 200 and r.json()["openapi"].startswith("3.1")
    assert r.json()["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    problem(await client.get("/readyz", headers=open_), 401, "unauthorized")


async def test_readyz_pings_and_names_the_queue(client: httpx.AsyncClient, qname: str) -> None:
    r = await client.get("/readyz")
    assert r.status_code == 200 and r.json() == {"status": "ready"}
    r = await client.get("/readyz", params={"queue": qname})
    assert r.status_code == 200 and r.json() == {
        "status": "ready",
        "queue": qname,
        "protocol_version": "",  # nothing written yet
    }
    assert (await client.post(f"/v1/queues/{qname}/tasks", json={"kind": "k"})).status_code == 201
    r = await client.get("/readyz", params={"queue": qname})
    assert r.json()["protocol_version"].startswith("1.")
    problem(await client.get("/readyz", params={"queue": "no{pe}"}), 422, "invalid")
    problem(await client.get("/readyz?queue="), 422, "invalid")


# -- bad input ---------------------------------------------------------------------------------


async def test_tokens(client: httpx.AsyncClient, qname: str, sq: Queue) -> None:
    url = f"/v1/queues/{qname}/tasks"
    for headers, word in (
        ({"authorization": ""}, "no token"),
        ({"authorization": "Bearer wrong-token-wrong-token"}, "wrong token"),
        ({"authorization": f"Basic {TOKEN}"}, "wrong token"),
        ({"authorization": f"Bearer {TOKEN}x"}, "wrong token"),
    ):
        c_headers = dict(headers)
        if not c_headers["authorization"]:
            c_headers = {}
        async with httpx.AsyncClient(transport=client._transport, base_url="http://api") as bare:
            r = await bare.post(url, json={"kind": "k"}, headers=c_headers)
        doc = problem(r, 401, "unauthorized")
        assert word in doc["detail"] and "Authorization: Bearer TOKEN" in doc["detail"]
        assert r.headers["www-authenticate"].startswith("Bearer")
        async with httpx.AsyncClient(transport=client._transport, base_url="http://api") as bare:
            problem(await bare.get("/v1/queues/x/tasks/y", headers=c_headers), 401, "unauthorized")
    assert sq.stats().scheduled == 0
    r = await client.post(url, json={"kind": "k"}, headers={"authorization": f"bearer {TOKEN}"})
    assert r.status_code == 201


@pytest.mark.parametrize(
    ("body", "pointer", "words"),
    [
        (b'{"kind": "k",', "", "not valid JSON"),
        (b"", "", "empty"),
        (b'{"kind": "k", "delay": NaN}', "", "NaN is not a JSON value"),
        (b"[" * 100_000 + b"]" * 100_000, "", "nested too deeply"),
        (b"\xff\xfe", "", "not valid JSON"),
        (b'["kind"]', "", "expected a JSON object"),
        (b'{"payload": 1}', "/kind", "kind is required"),
        (b'{"kind": 5}', "/kind", "kind must be a string, got a number"),
        (b'{"kind": ""}', "/kind", "non-empty string"),
        (b'{"kind": "a\\u0001"}', "/kind", "control characters"),
        (b'{"kind": "k", "delay": "soon"}', "/delay", "cannot read duration 'soon'"),
        (b'{"kind": "k", "delay": "-5m"}', "/delay", "cannot read duration '-5m'"),
        (b'{"kind": "k", "delay": "4000d"}', "/delay", "over ten years"),
        (b'{"kind": "k", "delay": true}', "/delay", "must be a number or a string, got a boolean"),
        (b'{"kind": "k", "delay": []}', "/delay", "got an array"),
        (b'{"kind": "k", "delay": -1}', "/delay", "must not be negative"),
        (b'{"kind": "k", "delay": 1e12}', "/delay", "over ten years"),
        (b'{"kind": "k", "at": "2030-01-01"}', "/at", "RFC 3339"),
        (b'{"kind": "k", "at": "2030-01-01T00:00:00"}', "/at", "RFC 3339"),
        (b'{"kind": "k", "at": "2030-02-30T00:00:00Z"}', "/at", "not a real date"),
        (b'{"kind": "k", "at": 1900000000}', "/at", "must be a string"),
        (b'{"kind": "k", "at": "1969-12-31T23:59:59Z"}', "/at", "outside the years 1970"),
        (b'{"kind": "k", "delay": 5, "at": "2030-01-01T00:00:00Z"}', "/at", "not both"),
        (b'{"kind": "k", "id": ""}', "/id", "non-empty string"),
        (b'{"kind": "k", "id": 7}', "/id", "must be a string"),
        (b'{"kind": "k", "max_attempts": 2.5}', "/max_attempts", "the fraction 2.5"),
        (b'{"kind": "k", "max_attempts": -1}', "/max_attempts", "from 0"),
        (b'{"kind": "k", "max_attempts": 1e7}', "/max_attempts", "from 0"),
        (b'{"kind": "k", "replace": "yes"}', "/replace", "must be a boolean"),
        (b'{"kind": "k", "headers": {"a": 1}}', "/headers", "must be strings"),
        (b'{"kind": "k", "headers": []}', "/headers", "must be an object"),
        (b'{"kind": "k", "task_id": "x"}', "/task_id", "unknown field 'task_id'"),
        (b'{"kind": "k", "payload": "\\ud800"}', "/payload", "lone surrogate"),
    ],
)
async def test_bad_task_bodies_are_422_naming_the_field(
    client: httpx.AsyncClient, qname: str, sq: Queue, body: bytes, pointer: str, words: str
) -> None:
    r = await client.post(
        f"/v1/queues/{qname}/tasks", content=body, headers={"content-type": "application/json"}
    )
    doc = problem(r, 422, "invalid")
    assert pointer in pointers(doc), doc
    assert words in doc["detail"], doc["detail"]
    assert sq.stats().scheduled == 0


async def test_a_2mb_body_is_413_before_it_is_read(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    big = json.dumps({"kind": "k", "payload": "x" * 2_000_000}).encode()
    doc = problem(await client.post(f"/v1/queues/{qname}/tasks", content=big), 413, "too-large")
    assert "1,048,576 bytes" in doc["detail"] and "reference" in doc["detail"]

    sent = 0

    async def chunks(n: int) -> AsyncIterator[bytes]:  # no Content-Length: refused while read
        nonlocal sent
        for _ in range(n):
            sent += 1
            yield b" " * 65536

    r = await client.post(f"/v1/queues/{qname}/tasks", content=chunks(32))
    assert "connection" not in problem(r, 413, "too-large") and "connection" not in r.headers
    sent = 0
    r = await client.post(f"/v1/queues/{qname}/tasks", content=chunks(160))  # 10 MiB
    problem(r, 413, "too-large")
    assert sent < 100 and r.headers["connection"] == "close"  # read no further
    assert sq.stats().scheduled == 0


async def test_a_payload_over_max_payload_is_413(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    r = await client.post(f"/v1/queues/{qname}/tasks", json={"kind": "k", "payload": "x" * 70_000})
    doc = problem(r, 413, "too-large")
    assert "max_payload" in doc["detail"] and pointers(doc) == ["/payload"]
    assert sq.stats().scheduled == 0


async def test_routes_methods_media_types_and_names(client: httpx.AsyncClient, qname: str) -> None:
    doc = problem(await client.get("/v2/nothing"), 404, "not-found")
    assert "/v1/queues/{queue}" in doc["detail"]
    problem(await client.get(f"/v1/queues/{qname}/nothing/here"), 404, "not-found")
    r = await client.put(f"/v1/queues/{qname}/tasks", json={})
    doc = problem(r, 405, "method-not-allowed")
    assert r.headers["allow"] == "POST" and "use POST" in doc["detail"]
    r = await client.post(
        f"/v1/queues/{qname}/tasks", content=b"kind=k", headers={"content-type": "text/plain"}
    )
    assert "application/json" in problem(r, 415, "unsupported-media-type")["detail"]
    doc = problem(await client.get("/v1/queues/bad{name}"), 422, "invalid")
    assert "invalid queue name" in doc["detail"]
    doc = problem(await client.get(f"/v1/queues/{qname}/tasks/{'x' * 300}"), 422, "invalid")
    assert "shorter" in doc["detail"]


async def test_a_body_without_a_content_type_is_415_naming_the_header(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    """Issue 31 item 4: a body with no Content-Type was taken as JSON, though the error
    table says 415 for a body that is not application/json."""
    url = f"/v1/queues/{qname}/tasks"
    body = b'{"kind": "k"}'
    doc = problem(await client.post(url, content=body), 415, "unsupported-media-type")
    assert "no Content-Type" in doc["detail"]
    assert "'Content-Type: application/json'" in doc["detail"]

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length either
        yield body

    problem(await client.post(url, content=chunks()), 415, "unsupported-media-type")
    r = await client.patch(f"{url}/x", content=b'{"delay": 1}')
    problem(r, 415, "unsupported-media-type")
    assert sq.stats().scheduled == 0
    # No body needs no Content-Type: a GET, a DELETE; an empty POST is refused as empty.
    assert (await client.get(f"{url}/x")).status_code == 404
    assert (await client.delete(f"{url}/x")).status_code == 404
    assert "empty" in problem(await client.post(url), 422, "invalid")["detail"]
    assert (await client.post(url, content=body, headers=JSON_TYPE)).status_code == 201


JSON_TYPE = {"content-type": "application/json"}


@pytest.mark.parametrize(
    ("delay", "seconds"),
    [
        ("15m", 900),
        ("90s", 90),
        ("250ms", 0.25),
        ("2h", 7200),
        ("1d", 86400),
        (" 1.5h ", 5400),
        ("60", 60),
        (900, 900),
        (0.5, 0.5),
    ],
)
async def test_delay_as_the_cli_writes_durations(
    client: httpx.AsyncClient, qname: str, sq: Queue, delay: Any, seconds: float
) -> None:
    """Issue 31 item 8: "delay": "15m" was refused ("delay must be a number"), though
    delayq schedule --delay 15m takes it. Both read it with timing.parse_duration."""
    before = datetime.now(UTC)
    r = await client.post(
        f"/v1/queues/{qname}/tasks", json={"kind": "k", "id": "d", "delay": delay}
    )
    assert r.status_code == 201, r.text
    info = sq.get("d")
    assert info is not None and info.due_at is not None
    late = (info.due_at - before).total_seconds() - seconds
    assert -0.01 < late < 5, late
    r = await client.post(
        f"/v1/queues/{qname}/tasks/batch",
        json={"tasks": [{"kind": "k", "id": f"b{i}", "delay": delay} for i in range(3)]},
    )
    assert r.status_code == 200, r.text
    due = [sq.get(f"b{i}") for i in range(3)]
    assert all(i is not None and i.due_at is not None for i in due)


async def test_duration_strings_in_reschedule_a_batch_and_a_ttl(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    url = f"/v1/queues/{qname}"
    sq.schedule("k", task_id="r", delay=5)
    r = await client.patch(f"{url}/tasks/r", json={"delay": "1h"})
    assert r.status_code == 200, r.text
    info = sq.get("r")
    assert info is not None and info.due_at is not None
    assert 3590 < (info.due_at - datetime.now(UTC)).total_seconds() <= 3600
    batch = {"tasks": [{"kind": "k", "delay": "15m"}, {"kind": "k", "delay": 60}, {"kind": "k"}]}
    assert (await client.post(f"{url}/tasks/batch", json=batch)).status_code == 200
    batch["tasks"][1]["delay"] = "15 minutes"
    doc = problem(await client.post(f"{url}/tasks/batch", json=batch), 422, "invalid")
    assert pointers(doc) == ["/tasks/1/delay"] and "cannot read duration" in doc["detail"]
    r = await client.put(f"{url}/expiring/session:1", json={"value": 1, "ttl": "30m"})
    assert r.status_code == 200, r.text
    left = datetime.fromisoformat(r.json()["deadline"]) - datetime.now(UTC)
    assert 1790 < left.total_seconds() <= 1800
    doc = problem(
        await client.put(f"{url}/expiring/session:1", json={"ttl": "0ms"}), 422, "invalid"
    )
    assert pointers(doc) == ["/ttl"]


@pytest.mark.parametrize("delay", ["15x", "-5m", "4000d", "1e3s"])
async def test_a_bad_duration_is_refused_in_the_cli_s_words(
    client: httpx.AsyncClient, qname: str, server: EmbeddedServer, delay: str
) -> None:
    """One parser, one error: what the API says of a delay is what delayq schedule says."""
    from click.testing import CliRunner

    from delayq.cli.main import main as cli

    r = await client.post(f"/v1/queues/{qname}/tasks", json={"kind": "k", "delay": delay})
    detail = problem(r, 422, "invalid")["errors"][0]["detail"]
    out = CliRunner().invoke(
        cli, ["schedule", "k", "-q", qname, "--url", server.url, "--delay", delay]
    )
    assert out.exit_code != 0 and detail in out.output, (detail, out.output)


async def test_head_on_the_probes_answers_as_get_without_the_body(
    client: httpx.AsyncClient,
) -> None:
    """Finding 12 of issue 28: HEAD /healthz answered 405 (probes and balancers send it)."""
    for path in ("/healthz", "/readyz"):
        got = await client.get(path)
        r = await client.head(path)
        assert r.status_code == 200 and r.content == b""
        assert r.headers["content-length"] == got.headers["content-length"] != "0"
    assert (await client.head("/readyz", headers={"authorization": ""})).status_code == 401
    r = await client.put("/healthz")
    assert r.status_code == 405 and r.headers["allow"] == "GET, HEAD"


async def test_only_the_queues_given_are_served(server: EmbeddedServer, qname: str) -> None:
    app = create_app(server.url, token=TOKEN, queues=[qname])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api", headers=AUTH
    ) as c:
        assert (await c.get(f"/v1/queues/{qname}")).status_code == 200
        problem(await c.get("/v1/queues/other"), 404, "not-found")
    await app.state.api.aclose()


async def test_a_queue_not_served_is_a_404_on_every_route_and_documented(
    server: EmbeddedServer, qname: str
) -> None:
    """With queues=, every route naming another queue answers 404: so says the document."""
    from delayq.http import document

    app = create_app(server.url, token=TOKEN, queues=[qname])
    bodies = {"post": {"kind": "k", "ttl": 5}, "patch": {"delay": 5}, "put": {"ttl": 5}}
    paths = document()["paths"]
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api", headers=AUTH
    ) as c:
        for path, item in paths.items():
            if "{queue}" not in path and path != "/readyz":
                continue
            url = path.replace("{queue}", "other").replace("{id}", "t").replace("{key}", "k")
            if path == "/readyz":
                url += "?queue=other"
            for method, op in item.items():
                body = bodies.get(method)
                if path.endswith("/batch"):
                    body = {"tasks": [{"kind": "k"}]}
                elif method == "post" and not path.endswith("/touch"):
                    body = {"kind": "k"}
                elif method == "post":
                    body = {"ttl": 5}
                r = await c.request(method.upper(), url, json=body)
                if method == "head":
                    assert r.status_code == 404 and r.content == b""
                else:
                    problem(r, 404, "not-found")
                assert "404" in op["responses"], (method, path)
    await app.state.api.aclose()


def test_a_short_token_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="at least 16 characters"):
        create_app("redis://127.0.0.1:1/0", token="short")


@pytest.mark.parametrize(
    ("token", "words"),
    [
        (" " * 20, "only whitespace"),
        ("\t\n" * 10, "only whitespace"),
        ("", "only whitespace"),
        ("   short   " + " " * 10, "at least 16 characters (it has 5)"),
        ("a-token-of-20\nchars", "control character"),
        ("a-t\u00f6ken-of-20-chars", "outside ASCII ('\u00f6')"),
        ("a-token\u00a0of-20-chars", "outside ASCII"),
        ("a-token-of-20-chars-\u20ac", "outside ASCII"),
        ("a-token-of-20-chars\u0085x", "outside ASCII"),
        (None, "must be a string"),
    ],
)
def test_a_blank_or_unsendable_token_is_refused_naming_the_fix(token: Any, words: str) -> None:
    """Issue 28: an all-whitespace token was accepted (20 spaces passed the length check)."""
    with pytest.raises(ConfigurationError, match=re.escape(words)) as e:
        create_app("redis://127.0.0.1:1/0", token=token)
    assert "secrets.token_urlsafe" in str(e.value)


async def test_spaces_around_the_token_are_dropped(server: EmbeddedServer) -> None:
    """A token with spaces around it could never match: a header's value loses them."""
    app = create_app(server.url, token=f"  {TOKEN}\t ")
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api"
    ) as c:
        assert (await c.get("/readyz", headers=AUTH)).status_code == 200
        problem(
            await c.get("/readyz", headers={"authorization": f"Bearer  {TOKEN} x"}),
            401,
            "unauthorized",
        )
    await app.state.api.aclose()


# -- Redis unreachable -------------------------------------------------------------------------


async def test_503_while_redis_is_down_and_nothing_half_written(
    make_server: Callable[..., EmbeddedServer], qname: str
) -> None:
    srv = make_server(appendonly=True)
    app = create_app(srv.url, token=TOKEN)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://api", headers=AUTH
    ) as c:
        ok = await c.post(f"/v1/queues/{qname}/tasks", json={"kind": "k", "id": "before"})
        assert ok.status_code == 201
        srv.kill()
        r = await c.post(f"/v1/queues/{qname}/tasks", json={"kind": "k", "id": "during"})
        doc = problem(r, 503, "unavailable")
        assert doc["id"] == "during" and "same id" in doc["detail"]
        assert r.headers["retry-after"] == "1"
        batch = {"tasks": [{"kind": "k", "id": f"b{i}"} for i in range(10)]}
        doc = problem(
            await c.post(f"/v1/queues/{qname}/tasks/batch", json=batch), 503, "unavailable"
        )
        assert [u["index"] for u in doc["unconfirmed"]] == list(range(10))
        problem(await c.get(f"/v1/queues/{qname}/tasks/before"), 503, "unavailable")
        problem(await c.get(f"/v1/queues/{qname}"), 503, "unavailable")
        problem(await c.get("/readyz"), 503, "unavailable")
        problem(await c.get("/readyz", params={"queue": "never-opened"}), 503, "unavailable")
        assert (await c.get("/healthz")).status_code == 200

        srv.restart()
        with Queue(qname, url=srv.url) as q:
            assert q.stats().scheduled == 1 and q.get("before") is not None
            assert q.get("during") is None and q.get("b0") is None
        assert (await c.get(f"/v1/queues/{qname}/tasks/before")).status_code == 200
        assert (await c.post(f"/v1/queues/{qname}/tasks/batch", json=batch)).status_code == 200
    await app.state.api.aclose()


# -- mounted in an application -----------------------------------------------------------------


async def test_mounted_under_a_prefix_in_fastapi(server: EmbeddedServer, qname: str) -> None:
    from fastapi import FastAPI

    outer = FastAPI()
    api = create_app(server.url, token=TOKEN)
    outer.mount("/delayq", api)

    @outer.get("/hello")
    def hello() -> dict[str, str]:
        return {"hello": "world"}

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=outer), base_url="http://app", headers=AUTH
    ) as c:
        assert (await c.get("/hello")).json() == {"hello": "world"}
        r = await c.post(f"/delayq/v1/queues/{qname}/tasks", json={"kind": "k", "id": "m/1"})
        assert r.status_code == 201, r.text
        r = await c.get(f"/delayq/v1/queues/{qname}/tasks/m%2F1")
        assert r.status_code == 200 and r.json()["id"] == "m/1"
        assert (await c.get("/delayq/healthz")).status_code == 200
    await api.state.api.aclose()


# -- delayq api, the command -------------------------------------------------------------------


def _cli(
    *args: str, env: dict[str, str] | None = None, blocked: str = ""
) -> subprocess.CompletedProcess[str]:
    block = f"import sys; sys.modules[{blocked!r}] = None; " if blocked else ""
    return subprocess.run(
        [sys.executable, "-c", f"{block}from delayq.cli import main; main()", "api", *args],
        cwd=ROOT,
        env={"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT), **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_delayq_api_refuses_to_start_without_a_token() -> None:
    proc = _cli("--url", "redis://127.0.0.1:1/0", "--port", "0")
    assert proc.returncode == 2
    assert "a token is required" in proc.stderr and "--token-file" in proc.stderr
    proc = _cli("--token", "short", "--port", "0")
    assert proc.returncode == 2 and "at least 16 characters" in proc.stderr
    proc = _cli("--token", " " * 20, "--port", "0")
    assert proc.returncode == 2 and "only whitespace" in proc.stderr
    assert "secrets.token_urlsafe" in proc.stderr and "--token" in proc.stderr


def test_delayq_api_refuses_a_token_file_of_whitespace(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("   \n" + TOKEN)  # (its first line is the token)
    proc = _cli("--token-file", str(token_file), "--port", "0")
    assert proc.returncode == 2 and "only whitespace" in proc.stderr
    assert "--token-file" in proc.stderr


def test_delayq_api_without_its_extra_names_the_pip_command() -> None:
    proc = _cli("--token", TOKEN, blocked="starlette")
    assert proc.returncode == 1
    assert proc.stderr.strip() == (
        "Error: the HTTP API needs the http extra: pip install 'delayq[http]'"
    )


def test_delayq_api_serves_over_http(server: EmbeddedServer, qname: str, tmp_path: Path) -> None:
    port = free_port()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "delayq",
            "api",
            "--port",
            str(port),
            "--token-file",
            str(token_file),
            "--log-level",
            "warning",
        ],
        cwd=ROOT,
        env={
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "DELAYQ_REDIS_URL": server.url,
            "DELAYQ_QUEUE": f"{qname},another-one",
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "delayq api did not start"
            time.sleep(0.1)
        with httpx.Client(base_url=base, headers=AUTH, timeout=10) as c:  # one keep-alive link
            r = c.post(f"/v1/queues/{qname}/tasks", json={"kind": "k", "id": "cli-1", "delay": 60})
            assert r.status_code == 201, r.text
            r = c.get(f"/v1/queues/{qname}/tasks/cli-1")
            assert r.status_code == 200 and r.json()["state"] == "scheduled"
            r = c.post(f"/v1/queues/{qname}/tasks", content=b"x" * 2_000_000)
            assert r.status_code == 413 and r.headers["content-type"] == PROBLEM
            problem(httpx.get(f"{base}/readyz"), 401, "unauthorized")
            doc = problem(c.get("/v1/queues/another"), 404, "not-found")
            assert "not served" in doc["detail"]
            assert c.get("/v1/queues/another-one").status_code == 200
        with Queue(qname, url=server.url) as q:
            assert q.get("cli-1") is not None
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        err = proc.stderr.read().decode() if proc.stderr else ""
        for f in (proc.stdout, proc.stderr):
            if f:
                f.close()
    assert f"delayq HTTP API on http://127.0.0.1:{port}" in err
    assert TOKEN not in err


@pytest.mark.parametrize("batch", [False, True])
async def test_an_at_past_the_last_second_of_9999_is_refused_not_clamped(
    client: httpx.AsyncClient, qname: str, batch: bool
) -> None:
    """schemas._at: a time of the year 9999 that its offset puts after 9999 in UTC was an
    OverflowError (a 500), then clamped to the last second of 9999; so was one in that last
    second (.900: stored 0.9 s early, review of issue 31). Both are a 422 naming the latest
    time stored; that time itself is stored as sent."""
    for at in ("9999-12-31T23:59:59-01:00", "9999-12-31T23:59:59.900Z"):
        task = {"kind": "k", "at": at}
        if batch:
            r = await client.post(f"/v1/queues/{qname}/tasks/batch", json={"tasks": [task]})
        else:
            r = await client.post(f"/v1/queues/{qname}/tasks", json=task)
        doc = problem(r, 422, "invalid")
        assert "9999-12-31T23:59:59Z" in doc["detail"] and pointers(doc)[0].endswith("/at")
    r = await client.post(
        f"/v1/queues/{qname}/tasks", json={"kind": "k", "at": "9999-12-31T23:59:59Z"}
    )
    assert r.status_code == 201, r.text
    assert r.json()["due_at"] == "9999-12-31T23:59:59+00:00"


async def test_the_document_s_request_examples_succeed_as_sent(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    """Review of issue 31, item 2: Swagger UI's "Try it out" fills in each body from the
    document; with no example, from the schema (delay and at both, a random kind): every
    one was refused. Each example, POSTed as it is, succeeds."""
    doc = (await client.get("/openapi.json")).json()

    def example(path: str, method: str) -> Any:
        return doc["paths"][path][method]["requestBody"]["content"]["application/json"]["example"]

    base = f"/v1/queues/{qname}"
    r = await client.post(f"{base}/tasks", json=example("/v1/queues/{queue}/tasks", "post"))
    assert r.status_code == 201, r.text
    tid = r.json()["id"]
    r = await client.post(
        f"{base}/tasks/batch", json=example("/v1/queues/{queue}/tasks/batch", "post")
    )
    assert r.status_code == 200, r.text
    assert all(t["status"] == "created" for t in r.json()["tasks"])
    path = "/v1/queues/{queue}/tasks/{id}"
    r = await client.patch(f"{base}/tasks/{tid}", json=example(path, "patch"))
    assert r.status_code == 200, r.text
    path = "/v1/queues/{queue}/expiring/{key}"
    r = await client.put(f"{base}/expiring/session:7", json=example(path, "put"))
    assert r.status_code == 200, r.text
    r = await client.post(f"{base}/expiring/session:7/touch", json=example(path + "/touch", "post"))
    assert r.status_code == 200, r.text
    assert sq.stats().scheduled >= 3


async def test_a_path_that_is_not_utf8_is_refused_naming_its_parameter(
    client: httpx.AsyncClient, qname: str, sq: Queue
) -> None:
    """Review of issue 31, item 7: ``/tasks/%FF`` was decoded with U+FFFD and acted on the
    task whose id is "\\ufffd"."""
    r = await client.post(
        f"/v1/queues/{qname}/tasks", json={"kind": "k", "id": "\ufffd", "delay": 3600}
    )
    assert r.status_code == 201, r.text
    for method, path, what in [
        ("GET", f"/v1/queues/{qname}/tasks/%FF", "the task id"),
        ("DELETE", f"/v1/queues/{qname}/tasks/%FE", "the task id"),
        ("PATCH", f"/v1/queues/{qname}/tasks/a%C3", "the task id"),
        ("DELETE", f"/v1/queues/{qname}/expiring/%FF", "the key"),
        ("GET", "/v1/queues/q%FF", "the queue name"),
    ]:
        doc = problem(await client.request(method, path, json={}), 422, "invalid")
        assert doc["detail"].startswith(what) and "not UTF-8" in doc["detail"], doc
        assert "%C3%A9" in doc["detail"]
    r = await client.get(f"/v1/queues/{qname}/tasks/%FF", headers={"authorization": ""})
    assert r.status_code == 401  # the token first
    assert sq.get("\ufffd") is not None  # left alone
    r = await client.get(f"/v1/queues/{qname}/tasks/%EF%BF%BD")  # U+FFFD itself, in UTF-8
    assert r.status_code == 200 and r.json()["id"] == "\ufffd"
