"""Configuration shared by the API and the worker, read from the environment."""

from __future__ import annotations

import os
from dataclasses import dataclass

from delayq.timing import Clock

CLOSE_KIND = "order.close"  # the task kind the API schedules and the worker handles


@dataclass(frozen=True)
class Settings:
    """Where things are.

    Args:
        redis_url: the Redis/Valkey URL; None lets delayq read ``DELAYQ_REDIS_URL``, else
            ``REDIS_URL``, else ``redis://127.0.0.1:6379/0``.
        database: path of the SQLite file holding orders and stock.
        queue: the delayq queue name (its keys live under ``dq:{<queue>}:``).
        close_after: seconds an order may stay unpaid before it is closed.
        clock: for tests, a ``delayq.testing.VirtualClock`` shared by the API's queue and
            the worker's (docs/testing.md); None, the server's clock, everywhere else.
    """

    redis_url: str | None = None
    database: str = "orders.db"
    queue: str = "orders"
    close_after: float = 15 * 60.0
    clock: Clock | None = None

    @classmethod
    def from_env(cls) -> Settings:
        return cls(
            database=os.environ.get("ORDERS_DATABASE", cls.database),
            queue=os.environ.get("ORDERS_QUEUE", cls.queue),
            close_after=float(os.environ.get("ORDERS_CLOSE_AFTER", cls.close_after)),
        )


def close_task_id(order_id: str) -> str:
    """One close task per order: the business key is the task id, so scheduling it twice
    (a retried request) changes nothing, and paying can cancel it by name."""
    return f"order-close:{order_id}"
