"""A Worker's own options, checked where they enter: ``Worker(...)``, ``configure``,
``serve`` and the registrations (``on_startup``, ``on_dead``, ``add_listener``). Small
functions over :mod:`delayq.check`, so ``worker.py`` only calls them; a handler's options
are checked by ``registry.make_handler``, a schedule's by ``cron/schedules.py``."""

from __future__ import annotations

from datetime import timedelta
from typing import Any, TypeVar

import redis.asyncio as aredis

from delayq import check
from delayq.connection import check_client
from delayq.errors import ConfigurationError
from delayq.timing import config_seconds

F = TypeVar("F")

# One handler thread per slot is started up front: beyond this, more processes serve better.
MAX_CONCURRENCY = 10_000


def checked_concurrency(concurrency: Any) -> int:
    return check.whole(
        concurrency,
        "concurrency",
        1,
        MAX_CONCURRENCY,
        hint=" (it is also the number of handler threads)",
    )


def checked_lease(lease: float | timedelta) -> float:
    lease_s = config_seconds(lease, "lease")
    if lease_s < 1:
        raise ConfigurationError(f"lease must be at least 1 second, got {lease_s}")
    return lease_s


def checked_client(client: Any) -> Any:
    """``Worker(client=)``: None, or a ``redis.asyncio`` client that does not decode."""
    if client is not None:
        check_client(client, (aredis.Redis, aredis.RedisCluster))
    return client


def checked_hook(fn: F, call: str, called_with: str) -> F:
    """A function given to a registration (``on_startup(fn)``, ...), named in the message by
    the call: ``on_startup(fn)``."""
    return check.function(fn, call, hint=f" ({called_with})")


def configured(
    now: tuple[int, float, float], given: tuple[Any, Any, Any], caps: list[tuple[str, int]]
) -> tuple[int, float, float]:
    """``Worker.configure``: the (concurrency, lease, unknown_kind_grace) it takes, from
    those it has (``now``) and those ``given`` (None: unchanged), each checked as the
    constructor checks it, the kinds' ``caps`` against the new concurrency."""
    from delayq import controls

    concurrency, lease, grace = given
    most = now[0] if concurrency is None else checked_concurrency(concurrency)
    for kind, cap in caps:
        controls.checked_concurrency(kind, cap, most)
    lease_s = now[1] if lease is None else checked_lease(lease)
    grace_s = now[2] if grace is None else config_seconds(grace, "unknown_kind_grace")
    return most, lease_s, grace_s
