"""The queues one worker serves, and the sources its claim loop claims from.

A worker serves one queue or several on one server. Each (queue, shard) pair is a
*source*; the claim loop rotates over the sources and splits its free room between those it
visits, so a busy queue cannot starve a quiet one. A queue's index in the worker's list is
its *lane*: the handlers, the Finisher and the leases held are per lane (Runs.add_lane).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from delayq.connection import redact
from delayq.core import QueueCore
from delayq.errors import ConfigurationError
from delayq.leasing import Claimed
from delayq.queue import AsyncQueue, Queue

REGISTER_EVERY_S = 5.0
# An unchanged registration is sent as "" (one ZADD); the whole of it at least this often.
REREGISTER_EVERY_S = 60.0


def interleave(batches: list[list[Claimed]]) -> list[Claimed]:
    """One from each batch in turn: [a1, b1, a2, b2, a3]."""
    return [c for row in itertools.zip_longest(*batches) for c in row if c is not None]


def interleave_lanes(batches: list[tuple[int, list[Claimed]]]) -> tuple[list[Claimed], list[int]]:
    """:func:`interleave` of batches from several lanes, and each task's lane."""
    rows = itertools.zip_longest(*([(lane, c) for c in got] for lane, got in batches))
    pairs = [p for row in rows for p in row if p is not None]
    return [c for _, c in pairs], [lane for lane, _ in pairs]


QueueLike = Queue | AsyncQueue


def checked_queues(queue: QueueLike | Sequence[QueueLike]) -> tuple[QueueLike, ...]:
    """The worker's queues: one, or several on the same server, each named once."""
    listed = isinstance(queue, Sequence) and not isinstance(queue, str | bytes)
    queues = (queue,) if isinstance(queue, (Queue, AsyncQueue)) else tuple(queue) if listed else ()
    if not queues or not all(isinstance(q, (Queue, AsyncQueue)) for q in queues):
        raise ConfigurationError(
            f"Worker(queue=) takes a Queue (or AsyncQueue), or a list of them, got {queue!r:.200}"
        )
    first = queues[0]
    names = [q.name for q in queues]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(f"queue {twice[0]!r} is given twice: list each queue once")
    for q in queues[1:]:
        if q.url != first.url or q.core.keys.prefix != first.core.keys.prefix:
            raise ConfigurationError(
                f"the queues of one worker share a server and a key prefix: {q.name!r} is on "
                f"{redact(q.url)} (prefix {q.core.keys.prefix!r}), {first.name!r} on "
                f"{redact(first.url)} (prefix {first.core.keys.prefix!r}); run a worker per "
                "server"
            )
        if q.core.clock is not first.core.clock:
            raise ConfigurationError(
                f"the queues of one worker share one clock: {q.name!r} and {first.name!r} were "
                "given different clock= (give them the same VirtualClock)"
            )
    return queues


class Source(NamedTuple):
    """What the claim loop claims from: one shard of one of the worker's queues."""

    lane: int  # the queue's index in Worker.queues
    shard: int
    core: QueueCore


@dataclass
class Registration:
    """When this worker last registered on one queue, and what it sent."""

    at: float = -REGISTER_EVERY_S
    info: str = ""  # the last whole registration sent, and when
    full_at: float = -REREGISTER_EVERY_S
