"""The close of an unpaid order, found by ``manage.py delayq_worker`` (this app's tasks.py).

The handler is the gate: it closes the order and gives its stock back in one transaction,
only while the order is pending. Run twice (a worker killed after the commit, before the
task was recorded done), after a payment, or for an order whose transaction rolled back
(the gate-first view), it finds nothing pending and discards itself.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import F
from django.utils import timezone

import delayq.contrib.django as dq
from delayq import Discard, Task
from orders.models import Order, Product


@dq.handler("order.close", queue="orders", max_attempts=10)
def close_order(task: Task) -> None:
    with transaction.atomic():
        order = (
            Order.objects.select_for_update()
            .filter(pk=task.payload["order_id"], status=Order.PENDING)
            .first()
        )
        if order is None:
            raise Discard("paid, already closed, or never placed")
        order.status, order.closed_at = Order.CLOSED, timezone.now()
        order.save(update_fields=["status", "closed_at"])
        Product.objects.filter(pk=order.product_id).update(stock=F("stock") + order.qty)
