"""Fixtures of delayq.contrib.django's tests: the private server, PostgreSQL (or a skip)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import shop.tasks

pytest_plugins = ["delayq.contrib.django.testing"]  # delayq_url, delayq_virtual

PG = (os.environ.get("ORDERS_DB_HOST", "127.0.0.1"), int(os.environ.get("ORDERS_DB_PORT", "5432")))


def postgres_up() -> bool:
    try:
        with socket.create_connection(PG, timeout=0.5):
            return True
    except OSError:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not postgres_up():
        skip = pytest.mark.skip(reason=f"no PostgreSQL on {PG[0]}:{PG[1]}: start one")
        for item in items:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def delayq_server(delayq_url: str, settings: Any) -> Iterator[str]:
    """Each test's queues on the session's private server, emptied first."""
    with redis.Redis.from_url(delayq_url) as r:
        r.flushdb()
    settings.DELAYQ = {**settings.DELAYQ, "URL": delayq_url}
    shop.tasks.seen.clear()
    yield delayq_url
