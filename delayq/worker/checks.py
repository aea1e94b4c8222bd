"""Start-up checks of the server's settings that can silently lose tasks."""

from __future__ import annotations

import logging
from typing import Any

from redis.exceptions import RedisError

log = logging.getLogger("delayq.worker")


async def check_eviction(client: Any) -> str | None:
    """Warn unless ``maxmemory-policy`` is ``noeviction``: under memory pressure any other
    policy may evict a waiting task's record, and an evicted task is a lost task. Returns
    the policy, or None when the server does not let us read it."""
    try:
        reply = await client.config_get("maxmemory-policy")
    except RedisError as e:
        log.debug("cannot read maxmemory-policy (%s); not checked", e)
        return None
    value = next(iter(reply.values()), b"")
    policy = value.decode() if isinstance(value, bytes) else str(value)
    if policy and policy != "noeviction":
        log.warning(
            "the server's maxmemory-policy is %r: under memory pressure it may evict delayq's "
            "tasks, which are then lost. Set 'maxmemory-policy noeviction' (writes fail "
            "loudly instead) or give delayq a server of its own.",
            policy,
        )
    return policy
