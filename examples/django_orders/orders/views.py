"""The API: place an order (two ways), pay it, look at it.

``POST /orders`` writes the order and schedules its close **on commit**: nothing is
scheduled for an order whose transaction rolls back (here: one refused for want of stock).
``POST /orders/gate-first`` schedules the close **first**, then writes the order: a process
that dies between the two leaves a close that finds nothing pending and discards itself,
never a pending order that nothing closes. docs/django.md compares the two.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.http import HttpRequest, JsonResponse
from django.shortcuts import get_object_or_404
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

import delayq.contrib.django as dq
from orders.models import Order, Product, close_task_id


class OutOfStock(Exception):
    pass


def _order_request(request: HttpRequest) -> tuple[int, int] | JsonResponse:
    try:
        body = json.loads(request.body)
        product_id, qty = int(body["product_id"]), int(body["qty"])
    except (ValueError, KeyError, TypeError):
        return JsonResponse({"error": 'send {"product_id": int, "qty": int}'}, status=422)
    if qty < 1:
        return JsonResponse({"error": "qty must be at least 1"}, status=422)
    return product_id, qty


def _reserve(order: Order) -> None:
    """Take the order's stock, or raise OutOfStock (its transaction then rolls back)."""
    taken = Product.objects.filter(pk=order.product_id, stock__gte=order.qty).update(
        stock=F("stock") - order.qty
    )
    if not taken:
        raise OutOfStock


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> JsonResponse:
    parsed = _order_request(request)
    if isinstance(parsed, JsonResponse):
        return parsed
    product_id, qty = parsed
    try:
        with transaction.atomic():
            order = Order.objects.create(product_id=product_id, qty=qty)
            # Registered now, sent when the transaction commits; the id is made here.
            dq.schedule_on_commit(
                "orders",
                "order.close",
                {"order_id": str(order.id)},
                delay=settings.ORDERS_CLOSE_AFTER,
                task_id=close_task_id(order.id),
            )
            _reserve(order)  # may raise: the order and its close are both undone
    except OutOfStock:
        return JsonResponse({"error": "not enough stock"}, status=409)
    return JsonResponse(order.as_dict(), status=201)


@csrf_exempt
@require_POST
def place_order_gate_first(request: HttpRequest) -> JsonResponse:
    parsed = _order_request(request)
    if isinstance(parsed, JsonResponse):
        return parsed
    product_id, qty = parsed
    order = Order(id=uuid.uuid4(), product_id=product_id, qty=qty)
    # First the close, then the order: the close's handler is the gate (tasks.py).
    dq.queue("orders").schedule(
        "order.close",
        {"order_id": str(order.id)},
        delay=settings.ORDERS_CLOSE_AFTER,
        task_id=close_task_id(order.id),
    )
    try:
        with transaction.atomic():
            order.save(force_insert=True)
            _reserve(order)
    except OutOfStock:
        return JsonResponse({"error": "not enough stock"}, status=409)
    return JsonResponse(order.as_dict(), status=201)


@csrf_exempt
@require_POST
def pay_order(request: HttpRequest, order_id: uuid.UUID) -> JsonResponse:
    order = get_object_or_404(Order, pk=order_id)
    with transaction.atomic():
        paid = Order.objects.filter(pk=order_id, status=Order.PENDING).update(status=Order.PAID)
    order.refresh_from_db()
    if order.status == Order.CLOSED:
        return JsonResponse({"error": "too late: the order was closed"}, status=409)
    # The close is cancelled after the commit; if it is already running, or the cancel is
    # lost, the close's gate finds the order paid and changes nothing.
    cancelled = dq.queue("orders").cancel(close_task_id(order_id)) if paid else False
    body: dict[str, Any] = {**order.as_dict(), "close_task_cancelled": cancelled}
    return JsonResponse(body)


@require_GET
def show_order(request: HttpRequest, order_id: uuid.UUID) -> JsonResponse:
    return JsonResponse(get_object_or_404(Order, pk=order_id).as_dict())


@require_GET
def show_product(request: HttpRequest, product_id: int) -> JsonResponse:
    product = get_object_or_404(Product, pk=product_id)
    return JsonResponse({"id": product.id, "name": product.name, "stock": product.stock})
