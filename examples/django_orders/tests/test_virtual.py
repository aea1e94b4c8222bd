"""The example in virtual time: its real 15 minutes, in milliseconds (``delayq_virtual``).

The tests run in pytest-django's transaction (``db``), which never commits: the callbacks
``schedule_on_commit`` registered run when ``django_capture_on_commit_callbacks(execute=True)``
ends, as they would at a commit, and a rolled-back savepoint drops its own. ``drain`` then
runs the close in the test's thread, on the test's connection.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from orders.models import Order, Product, close_task_id

from delayq.contrib.django.testing import VirtualTime

pytestmark = pytest.mark.django_db

MS = timedelta(milliseconds=1)
Capture = Callable[..., Any]


@pytest.fixture(autouse=True)
def fifteen_minutes(settings: Any) -> None:
    settings.ORDERS_CLOSE_AFTER = 15 * 60


@pytest.fixture
def apple() -> Product:
    return Product.objects.create(name="apple", stock=10)


def place(client: Client, capture: Capture, product: Product, qty: int) -> tuple[int, str]:
    """POST /orders as a request that commits: (status code, order id or '')."""
    with capture(execute=True):
        r = client.post(
            "/orders", {"product_id": product.pk, "qty": qty}, content_type="application/json"
        )
    return r.status_code, r.json().get("id", "")


def test_an_unpaid_order_closes_at_15_minutes_not_before(
    client: Client,
    django_capture_on_commit_callbacks: Capture,
    delayq_virtual: VirtualTime,
    apple: Product,
) -> None:
    code, order_id = place(client, django_capture_on_commit_callbacks, apple, 4)
    assert code == 201
    assert delayq_virtual.drain(until=timedelta(minutes=15) - MS).ran == []
    assert Order.objects.get(pk=order_id).status == "pending"
    out = delayq_virtual.drain(until=MS)
    assert [(r.task_id, r.outcome) for r in out.ran] == [(close_task_id(order_id), "done")]
    apple.refresh_from_db()
    assert Order.objects.get(pk=order_id).status == "closed" and apple.stock == 10


def test_an_order_paid_at_minute_14_stays_paid(
    client: Client,
    django_capture_on_commit_callbacks: Capture,
    delayq_virtual: VirtualTime,
    apple: Product,
) -> None:
    _, order_id = place(client, django_capture_on_commit_callbacks, apple, 4)
    delayq_virtual.drain(until=timedelta(minutes=14))
    r = client.post(f"/orders/{order_id}/pay")
    assert r.status_code == 200 and r.json()["close_task_cancelled"] is True
    assert delayq_virtual.drain(until=timedelta(hours=1)).ran == []
    apple.refresh_from_db()
    assert Order.objects.get(pk=order_id).status == "paid" and apple.stock == 6


def test_a_rolled_back_order_registers_no_callback(
    client: Client,
    django_capture_on_commit_callbacks: Capture,
    delayq_virtual: VirtualTime,
    apple: Product,
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        r = client.post(
            "/orders", {"product_id": apple.pk, "qty": 11}, content_type="application/json"
        )
    assert r.status_code == 409 and callbacks == []
    assert delayq_virtual.queue("orders").stats().scheduled == 0
    assert delayq_virtual.drain(until=timedelta(days=1)).ran == []
