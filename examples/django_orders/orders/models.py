"""Products and orders. Every change of an order's status is a conditional UPDATE (``WHERE
status = 'pending'``): the close and the payment cannot both win."""

from __future__ import annotations

import uuid

from django.db import models


class Product(models.Model):
    name = models.CharField(max_length=100)
    stock = models.IntegerField()


class Order(models.Model):
    PENDING, PAID, CLOSED = "pending", "paid", "closed"

    # Made by Python, not the database: the close task's id (order-close:<id>) is known
    # before the row is written, which the gate-first order of writes needs.
    id = models.UUIDField(primary_key=True, default=uuid.uuid4)
    product = models.ForeignKey(Product, on_delete=models.PROTECT)
    qty = models.PositiveIntegerField()
    status = models.CharField(max_length=10, default=PENDING)
    created_at = models.DateTimeField(auto_now_add=True)
    closed_at = models.DateTimeField(null=True)

    def as_dict(self) -> dict[str, object]:
        return {
            "id": str(self.id),
            "product_id": self.product_id,
            "qty": self.qty,
            "status": self.status,
            "closed_at": self.closed_at.isoformat() if self.closed_at else None,
        }


def close_task_id(order_id: object) -> str:
    return f"order-close:{order_id}"
