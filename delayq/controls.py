"""Admission controls, enforced inside the claim script: a queue-wide rate limit, pause and
resume, and the per-kind room a worker's claim carries. Pure: validation and script calls.

The controls live in each shard's ``control`` hash (``QueueKeys.control``), which claim reads
with one HMGET per call. A queue split over N shards cannot share one bucket (one script
touches one shard), so each shard's bucket gets ``rate / N`` and ``burst / N`` (rounded up,
at least one token): the queue-wide rate holds when the waiting tasks spread over the
shards, as their ids' hashes make them do; a shard with nothing waiting leaves its share
unused, so the queue then runs below the limit, never above it (but for the rounding up
of a small burst).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from delayq import check
from delayq.core import Op, QueueCore
from delayq.errors import ConfigurationError
from delayq.info import as_str
from delayq.scripts import SCRIPTS, Arg

_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*/\s*([smh])\s*$")
_PER = {"s": 1.0, "m": 60.0, "h": 3600.0}
MAX_PER_SECOND = 10_000_000
MAX_BURST = 10_000_000
RATE_FORMS = '"N/s", "N/m" or "N/h" (N tasks per second, minute or hour, e.g. "100/s")'

_CONTROL = SCRIPTS["control"].reply
_CONTROL.require_head("paused", "limit", "limit_burst", "tokens")


@dataclass(frozen=True)
class RateLimit:
    """A queue-wide rate limit: ``rate`` as given ("100/s"), the same in tasks a second, and
    the bucket's size (tasks that may start at once after a quiet spell)."""

    rate: str
    per_second: float
    burst: int


@dataclass(frozen=True)
class Controls:
    """A queue's admission controls as stored: paused (on any shard), the rate limit, and
    the whole tokens its buckets hold now (-1 without a limit)."""

    paused: bool
    limit: RateLimit | None
    tokens: int


def default_burst(per_second: float) -> int:
    """One second's worth of tasks, at least one."""
    return max(1, math.ceil(per_second))


def rate_limit(rate: Any, burst: Any = None) -> RateLimit:
    """Validate a rate ("100/s", "30/m", "2/h") and burst (None: :func:`default_burst`).

    Raises:
        ConfigurationError: naming the accepted forms or the bound broken.
    """
    m = _RATE_RE.match(rate) if isinstance(rate, str) else None
    if m is None:
        raise ConfigurationError(f"rate must be {RATE_FORMS}, got {rate!r}")
    count, unit = m.groups()
    per_second = float(count) / _PER[unit]
    if not 0 < per_second <= MAX_PER_SECOND:
        raise ConfigurationError(
            f"rate {rate!r} must be above 0 and at most {MAX_PER_SECOND:,}/s; to stop "
            "claiming altogether, pause the queue"
        )
    if burst is None:
        burst = default_burst(per_second)
    else:
        check.whole(burst, "burst", 1, MAX_BURST, hint=" (tasks that may start at once)")
    text = f"{count}/{unit}"
    return RateLimit(rate=text, per_second=per_second, burst=burst)


def set_limit(
    core: QueueCore, limit: RateLimit | None, shards: int, now_ms: int | None = None
) -> Op[int]:
    """Store one shard's share of ``limit`` (None: clear it); see the module's docstring.
    The bucket starts full, as of ``now_ms`` (default: the queue's clock)."""
    if limit is None:
        args: dict[str, Arg] = {"rate": "", "burst": "", "limit": "", "limit_burst": ""}
    else:
        args = {
            "rate": repr(limit.per_second / 1000 / shards),
            "burst": max(1, math.ceil(limit.burst / shards)),
            "limit": limit.rate,
            "limit_burst": limit.burst,
        }
    return core.op("limit", {"now": core.now_arg(now_ms), **args}, [], int)


def read(core: QueueCore, now_ms: int | None = None) -> Op[Controls]:
    """One shard's controls."""

    def parse(r: Any) -> Controls:
        paused, rate, burst, tokens = r[: _CONTROL.head]
        limit = None
        if rate is not None:
            limit = rate_limit(as_str(rate), int(burst))
        return Controls(paused=paused is not None, limit=limit, tokens=int(tokens))

    return core.op("control", {"now": core.now_arg(now_ms)}, [], parse)


def merged(parts: Sequence[Controls]) -> Controls:
    """A sharded queue's controls: paused if any shard is, its tokens summed."""
    tokens = [p.tokens for p in parts if p.tokens >= 0]
    return Controls(
        paused=any(p.paused for p in parts),
        limit=parts[0].limit,
        tokens=sum(tokens) if tokens else -1,
    )


def pause(core: QueueCore, paused: bool) -> Op[bool]:
    """Pause (or resume, announcing the head on the wake channel) one shard."""
    return core.op(
        "pause",
        {"paused": "1" if paused else "0", "channel": core.keys.wake_channel},
        [],
        lambda r: int(r) == 1,
    )


def checked_concurrency(kind: str, concurrency: Any, most: int) -> int:
    """A handler's ``concurrency``: an int from 1 to the worker's own."""
    hint = f" (the worker's concurrency), for {kind!r}"
    return check.whole(concurrency, "concurrency", 1, most, hint=hint)


def kind_rooms(caps: Mapping[str, int], held: Mapping[str, int]) -> list[Arg]:
    """Claim's ``rooms``: for each kind with a cap, how many more of it may be held."""
    return [x for kind, cap in caps.items() for x in (kind, max(0, cap - held.get(kind, 0)))]


def backlog_s(due: int, limit: RateLimit | None) -> float | None:
    """How long the rate limit needs for the tasks already due: due / rate (None: no limit)."""
    if limit is None:
        return None
    return due / limit.per_second
