"""The example in real time: the views through Django's test client, the close run by
``manage.py delayq_worker`` as a real process, on PostgreSQL and a real delayq server."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from conftest import Workers, raw_connection, wait_for
from django.db import connection, transaction
from django.test import Client
from orders.models import Order, Product, close_task_id

import delayq.contrib.django as dq

pytestmark = pytest.mark.django_db(transaction=True)


def place(client: Client, product: Product, qty: int, path: str = "/orders") -> dict[str, Any]:
    r = client.post(path, {"product_id": product.pk, "qty": qty}, content_type="application/json")
    assert r.status_code == 201, r.content
    body: dict[str, Any] = r.json()
    return body


def status(order_id: str) -> str:
    return Order.objects.get(pk=order_id).status


def stock(product: Product) -> int:
    product.refresh_from_db()
    return product.stock


def task_state(order_id: str) -> str | None:
    info = dq.queue("orders").get(close_task_id(order_id))
    return info.state if info else None


@pytest.fixture
def apple() -> Product:
    return Product.objects.create(name="apple", stock=10)


def test_an_order_placed_and_rolled_back_schedules_nothing(
    client: Client, apple: Product, workers: Workers
) -> None:
    r = client.post("/orders", {"product_id": apple.pk, "qty": 11}, content_type="application/json")
    assert r.status_code == 409  # more than the stock: the transaction rolled back
    assert Order.objects.count() == 0 and stock(apple) == 10
    queue = dq.queue("orders")
    assert queue.stats().scheduled == 0 and queue.stats().counters.get("scheduled", 0) == 0
    # The same, rolled back by hand around the call: nothing is sent to Redis.
    with transaction.atomic():
        task_id = dq.schedule_on_commit("orders", "order.close", {"order_id": "x"}, delay=1)
        transaction.set_rollback(True)
    assert queue.get(task_id) is None and queue.stats().scheduled == 0
    # Gate first, by contrast, has scheduled a close for the order that never was; the
    # worker runs it, finds nothing pending and discards it.
    r = client.post(
        "/orders/gate-first", {"product_id": apple.pk, "qty": 11}, content_type="application/json"
    )
    assert r.status_code == 409 and Order.objects.count() == 0
    assert queue.stats().scheduled == 1
    workers.start()
    wait_for(lambda: queue.stats().counters.get("discarded") == 1, what="the close discarded")
    assert stock(apple) == 10 and Order.objects.count() == 0


def test_an_order_paid_in_time_is_not_closed(
    client: Client, apple: Product, workers: Workers
) -> None:
    paid = place(client, apple, 3)
    r = client.post(f"/orders/{paid['id']}/pay")
    assert r.status_code == 200 and r.json()["close_task_cancelled"] is True
    unpaid = place(client, apple, 2)  # closed by the same worker: it was running
    workers.start()
    wait_for(lambda: status(unpaid["id"]) == "closed", what="the unpaid order closed")
    time.sleep(0.5)
    assert status(paid["id"]) == "paid" and task_state(paid["id"]) == "cancelled"
    assert stock(apple) == 10 - 3
    # Paying after the close is refused, and changes nothing.
    assert client.post(f"/orders/{unpaid['id']}/pay").status_code == 409
    assert stock(apple) == 10 - 3


def test_an_unpaid_order_is_closed_once_with_its_stock_back(
    client: Client, apple: Product, workers: Workers
) -> None:
    for path in ("/orders", "/orders/gate-first"):
        order = place(client, apple, 4, path)
        assert stock(apple) == 6 and task_state(order["id"]) == "scheduled"
        proc = workers.start()
        wait_for(lambda o=order: task_state(o["id"]) == "done", what="the close done")  # type: ignore[misc]
        assert status(order["id"]) == "closed" and stock(apple) == 10
        assert workers.stop(proc) == 0, workers.output()
    counters = dq.queue("orders").stats().counters
    assert counters.get("succeeded") == 2 and not counters.get("discarded")


def _wait_for_lock(workers: Workers) -> None:
    """Until a worker's connection waits for a row lock."""

    def waiting() -> bool:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
                "AND wait_event_type = 'Lock'",
                [workers.app_name],
            )
            return bool(cursor.fetchone()[0])

    wait_for(waiting, what="the close waiting for the order's row")


@pytest.mark.parametrize("when", ["inside its transaction", "after its commit, before its ack"])
def test_a_worker_killed_mid_close_and_restarted_closes_the_order_once(
    client: Client, apple: Product, workers: Workers, delayq_url: str, when: str
) -> None:
    order = place(client, apple, 4)
    # The test holds the order's row: the close, once due, waits for it mid-transaction.
    lock = raw_connection()
    lock.execute("BEGIN")
    lock.execute("SELECT id FROM orders_order WHERE id = %s FOR UPDATE", [order["id"]])
    first = workers.start()
    _wait_for_lock(workers)
    server = redis.Redis.from_url(delayq_url)
    try:
        if when == "inside its transaction":
            workers.kill(first)  # the close's transaction dies uncommitted
            lock.execute("COMMIT")
        else:
            # No write reaches the server (the ack, the heartbeat); the close commits, then
            # the worker is killed before it can record the task done.
            server.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
            lock.execute("COMMIT")
            wait_for(lambda: status(order["id"]) == "closed", what="the close committed")
            workers.kill(first)
            server.execute_command("CLIENT", "UNPAUSE")
        assert task_state(order["id"]) == "active"  # leased to the dead worker
        workers.start()  # the lease (2 s) runs out, and the task runs again
        wait_for(lambda: task_state(order["id"]) == "done", what="the close done")
    finally:
        server.execute_command("CLIENT", "UNPAUSE")
        server.close()
        lock.close()
    assert status(order["id"]) == "closed"
    assert stock(apple) == 10  # given back once
    info = dq.queue("orders").get(close_task_id(order["id"]))
    assert info is not None and info.attempts == 2
    counters = dq.queue("orders").stats().counters
    if when == "inside its transaction":
        assert counters.get("succeeded") == 1 and not counters.get("discarded")
    else:  # the second run found the order closed: the gate
        assert counters.get("discarded") == 1 and not counters.get("succeeded")


def test_a_connection_dropped_between_tasks_is_replaced_for_the_next(
    client: Client, apple: Product, workers: Workers
) -> None:
    first = place(client, apple, 1)
    workers.start("--concurrency", "1")  # one handler thread: the next task is its too
    wait_for(lambda: task_state(first["id"]) == "done", what="the first close")
    # The worker keeps its connection (CONN_MAX_AGE = 60): the database drops it.
    [backend] = workers.backends()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_terminate_backend(%s)", [backend])
    wait_for(lambda: not workers.backends(), what="the connection gone")
    second = place(client, apple, 2)
    wait_for(lambda: task_state(second["id"]) == "done", what="the second close")
    info = dq.queue("orders").get(close_task_id(second["id"]))
    assert info is not None and info.attempts == 1 and info.last_error is None
    assert status(second["id"]) == "closed" and stock(apple) == 10
    [fresh] = workers.backends()
    assert fresh != backend
