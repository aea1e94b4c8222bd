# ruff: noqa: F811 (the fixtures of test_http_protocol, imported by name)
"""``Idempotency-Key`` on the HTTP API's POSTs (``delayq/http/idempotency.py``), each rule
against a real ``delayq api`` process: the same key and body answer the first result again
(``Idempotent-Replayed: true``), one task scheduled; another body is a 422; a second request
while the first runs is a 409 (the API's Redis behind a proxy that delays every chunk, so the
first is surely still running); a request whose connection dropped is answered again; a
refused request frees its key; ids derive from the key (a batch's by index); the record is
bounded by the dedupe window; a request without the header is as before."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redis

from delayq import Queue
from delayq.embedded import EmbeddedServer
from delayq.http.idempotency import PENDING_MS, task_id

from .support.proxy import FaultProxy
from .test_http_protocol import TOKEN, ApiProcess, api_process, request, server  # noqa: F401

AUTH = {"Authorization": f"Bearer {TOKEN}"}
BODY = {"kind": "order.close", "payload": {"order_id": 7}, "delay": 3600}


@pytest.fixture
def api(api_process: Any) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_process().base, headers=AUTH, timeout=30) as client:
        yield client


def post(api: httpx.Client, path: str, body: Any, key: str | None) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key is not None else {}
    return api.post(path, json=body, headers=headers)


def ids_in(server: EmbeddedServer, qname: str) -> set[str]:
    client = redis.Redis(port=server.port)
    try:
        return {
            k.decode() if isinstance(k, bytes) else k for k in client.hkeys(f"dq:{{{qname}}}:tasks")
        }
    finally:
        client.close()


def test_the_same_key_and_body_answer_the_first_result_once_scheduled(
    api: httpx.Client, server: EmbeddedServer, qname: str
) -> None:
    path = f"/v1/queues/{qname}/tasks"
    first = post(api, path, BODY, "order-7-close")
    assert first.status_code == 201, first.text
    assert "idempotent-replayed" not in first.headers
    assert first.json()["id"] == task_id(qname, "order-7-close")  # derived from the key
    # the same body with its keys in another order (a Java Map's) is the same request
    again = post(api, path, dict(reversed(list(BODY.items()))), "order-7-close")
    assert again.status_code == 201 and again.headers["idempotent-replayed"] == "true"
    assert again.content == first.content  # the first answer, due_at and all
    assert ids_in(server, qname) == {first.json()["id"]}
    # without the header, a resend schedules again: what the key is for
    assert post(api, path, BODY, None).status_code == 201
    assert post(api, path, BODY, None).status_code == 201
    assert len(ids_in(server, qname)) == 3
    # a body id is kept; the quoted form of the IETF draft is the same key
    body = {**BODY, "id": "order-close:8"}
    assert post(api, path, body, '"k-8"').json()["id"] == "order-close:8"
    assert post(api, path, body, "k-8").headers["idempotent-replayed"] == "true"


def test_the_same_key_with_another_body_is_422_naming_the_key(
    api: httpx.Client, server: EmbeddedServer, qname: str
) -> None:
    path = f"/v1/queues/{qname}/tasks"
    assert post(api, path, BODY, "k-1").status_code == 201
    r = post(api, path, {**BODY, "delay": 60}, "k-1")
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    doc = r.json()
    assert doc["type"] == "urn:delayq:problem:invalid" and doc["idempotency_key"] == "k-1"
    assert "'k-1'" in doc["detail"] and "new key" in doc["detail"]
    # the batch route with that key is another request too
    r = post(api, f"/v1/queues/{qname}/tasks/batch", {"tasks": [BODY]}, "k-1")
    assert r.status_code == 422 and r.json()["idempotency_key"] == "k-1"
    assert len(ids_in(server, qname)) == 1


def test_a_batch_replays_and_derives_each_id_from_the_key_and_index(
    api: httpx.Client, server: EmbeddedServer, qname: str
) -> None:
    path = f"/v1/queues/{qname}/tasks/batch"
    batch = {"tasks": [BODY, {**BODY, "id": "mine"}, {**BODY, "payload": {"order_id": 9}}]}
    first = post(api, path, batch, "batch-1")
    assert first.status_code == 200, first.text
    ids = [t["id"] for t in first.json()["tasks"]]
    assert ids == [task_id(qname, "batch-1", 0), "mine", task_id(qname, "batch-1", 2)]
    again = post(api, path, batch, "batch-1")
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    assert ids_in(server, qname) == set(ids)
    r = post(api, path, {"tasks": batch["tasks"][:2]}, "batch-1")
    assert r.status_code == 422 and "'batch-1'" in r.json()["detail"]


def test_a_refused_request_frees_its_key_and_a_bad_key_is_422(
    api: httpx.Client, server: EmbeddedServer, qname: str
) -> None:
    path = f"/v1/queues/{qname}/tasks"
    bad = post(api, path, {**BODY, "colour": "red"}, "k-2")
    assert bad.status_code == 422 and "colour" in bad.json()["detail"]
    fixed = post(api, path, BODY, "k-2")  # not "used with another body": nothing was kept
    assert fixed.status_code == 201 and "idempotent-replayed" not in fixed.headers
    for key in (b"", b"x" * 256, "caf\u00e9".encode(), b"a b"):
        r = api.post(path, json=BODY, headers={b"Idempotency-Key": key})
        assert r.status_code == 422, (key, r.text)
        assert "Idempotency-Key" in r.json()["detail"] and "UUID" in r.json()["detail"]
    assert len(ids_in(server, qname)) == 1


def test_two_key_headers_are_422_and_numbers_compare_by_value(
    api: httpx.Client, server: EmbeddedServer, qname: str
) -> None:
    """Review of issue 31 (cosmetic): two Idempotency-Key headers took the first silently;
    ``"delay": 60.0`` resent as ``60`` was "another body" (422)."""
    path = f"/v1/queues/{qname}/tasks"
    headers = [("Idempotency-Key", "k-a"), ("Idempotency-Key", "k-b")]
    r = api.post(path, json=BODY, headers=httpx.Headers(headers))
    assert r.status_code == 422, r.text
    assert "sent 2 times" in r.json()["detail"] and "'k-b'" in r.json()["detail"]
    assert ids_in(server, qname) == set()
    body = '{"kind": "order.close", "payload": {"order_id": 7}, "delay": %s}'
    sent = {"content-type": "application/json", "Idempotency-Key": "k-num"}
    first = api.post(path, content=body % "60.0", headers=sent)
    assert first.status_code == 201, first.text
    again = api.post(path, content=body % "60", headers=sent)
    assert again.status_code == 201, again.text
    assert again.headers["idempotent-replayed"] == "true" and again.content == first.content
    other = api.post(path, content=body % "60.5", headers=sent)
    assert other.status_code == 422  # another number is another body


def test_the_key_record_lives_under_the_queue_tag_for_the_dedupe_window(
    api: httpx.Client, server: EmbeddedServer, qname: str
) -> None:
    assert post(api, f"/v1/queues/{qname}/tasks", BODY, "k-3").status_code == 201
    with Queue(qname, url=server.url) as q:
        record = q.core.keys.idempotency(hashlib.sha256(b"k-3").hexdigest())
    assert record.startswith(f"dq:{{{qname}}}:idem:")
    client = redis.Redis(port=server.port)
    try:
        ttl = client.pttl(record)
        value = client.get(record)
    finally:
        client.close()
    assert 86_000_000 < ttl <= 86_400_000  # the queue's dedupe window (24 h)
    assert value is not None and value[:1] == b"d" and b'"order_id"' not in value  # no payload
    assert value[65:68] == b"201"


def test_a_second_request_while_the_first_runs_is_409(
    server: EmbeddedServer,
    qname: str,
) -> None:
    """Every chunk to and from Redis waits 0.3 s: the first request takes its key, schedules
    and keeps its answer (3 round trips, at least 1.8 s); the second, sent 0.9 s later,
    finds the key taken and not answered."""
    with FaultProxy(server.port) as proxy:
        api = ApiProcess(proxy.url)
        warm = ""
        try:
            with httpx.Client(base_url=api.base, headers=AUTH, timeout=60) as client:
                path = f"/v1/queues/{qname}/tasks"
                # the queue opened and checked, so that each request is 3 round trips alone
                warm = post(client, path, {"kind": "warm"}, None).json()["id"]
                proxy.latency = 0.3  # (and its pool holds several connections: a new one
                with concurrent.futures.ThreadPoolExecutor(4) as pool:  # costs round trips)
                    stats = [pool.submit(client.get, f"/v1/queues/{qname}") for _ in range(4)]
                    assert [f.result().status_code for f in stats] == [200] * 4
                with concurrent.futures.ThreadPoolExecutor(2) as pool:
                    one = pool.submit(post, client, path, BODY, "k-4")
                    time.sleep(0.9)
                    two = pool.submit(post, client, path, BODY, "k-4")
                    first, second = one.result(), two.result()
                proxy.latency = 0
                assert first.status_code == 201, first.text
                assert second.status_code == 409, (first.elapsed, second.elapsed)
                doc = second.json()
                assert doc["type"] == "urn:delayq:problem:in-flight"  # (it was conflict: review 31)
                assert doc["title"] == "Idempotency-Key still being answered"
                assert doc["idempotency_key"] == "k-4" and second.headers["retry-after"] == "1"
                assert "still being answered" in doc["detail"]
                third = post(client, path, BODY, "k-4")  # now: the first one's answer
                assert third.headers["idempotent-replayed"] == "true"
                assert third.content == first.content
        finally:
            api.stop()
    assert ids_in(server, qname) == {warm, task_id(qname, "k-4")}
    assert PENDING_MS <= 60_000  # a request that never answers frees its key within a minute


def test_a_request_whose_connection_dropped_is_answered_again(
    api_process: Any,
    server: EmbeddedServer,
    qname: str,
) -> None:
    """The client sends, and its connection drops before the answer: the resend with the
    same key gets the first request's answer, and one task was scheduled."""
    proc = api_process()
    body = json.dumps(BODY).encode()
    with proc.connect() as sock:
        sock.sendall(
            request("POST", f"/v1/queues/{qname}/tasks", body, headers="Idempotency-Key: k-5\r\n")
        )
    # (closed without reading a byte of the answer)
    tid = task_id(qname, "k-5")
    with httpx.Client(base_url=proc.base, headers=AUTH, timeout=30) as client:
        deadline = time.monotonic() + 20
        while True:  # 409 while the first is still being answered, if it is
            r = post(client, f"/v1/queues/{qname}/tasks", BODY, "k-5")
            if r.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    assert r.status_code == 201 and r.headers["idempotent-replayed"] == "true", r.text
    assert r.json()["id"] == tid and r.json()["created"] is True
    assert ids_in(server, qname) == {tid}
